"""The cost model's rates for a job: one device's sustained compute and each link's bandwidth, from what the
user measured or said (``--compute``, ``--link``), else from a table per GPU model and documented defaults per
device kind, each figure with where it came from (the plan says which are defaults).

A measured rate (a matmul probe on each host, the doctor's all-reduce benchmark) is one more source for the
same fields: ``job_rates`` takes plain numbers, nothing here imports torch.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from distlaunch.errors import UsageError
from distlaunch.training.planner.cost import Rates

# Sustained dense matmul FLOP/s of one device in training, (16-bit, fp32): about half of the data sheet's peak,
# what large GPT layers reach. Looked up by the name nvidia-smi gives (the first key it contains).
GPU_RATES: dict[str, tuple[float, float]] = {
    "H200": (450e12, 30e12),
    "H100": (400e12, 25e12),
    "A100": (150e12, 10e12),
    "L40S": (180e12, 45e12),
    "A10": (60e12, 15e12),
    "L4": (60e12, 15e12),
    "V100": (60e12, 7e12),
    "T4": (25e12, 4e12),
}
CPU_RATE = 30e9  # one rank on one core (OMP_NUM_THREADS=1), fp32 or autocast: what a few GPT layers sustain
UNKNOWN_GPU = "A100"  # a GPU nvidia-smi does not name here (another host's): its figures, said to be a default
GBIT = 1e9 / 8
# (intra bytes/s, inter bytes/s, intra latency s, inter latency s) per backend: NVLink-class links and a 100 Gbit/s
# network for NCCL; for gloo, TCP over loopback inside a host and 10 Gbit/s Ethernet between hosts
LINK_DEFAULTS: dict[str, tuple[float, float, float, float]] = {
    "nccl": (150e9, 100 * GBIT, 10e-6, 30e-6),
    "gloo": (2e9, 10 * GBIT, 50e-6, 100e-6),
}
BANDWIDTH_UNITS = {
    "tbit": 1e12 / 8,
    "gbit": GBIT,
    "mbit": 1e6 / 8,
    "tb/s": 1e12,
    "gb/s": 1e9,
    "mb/s": 1e6,
    "gib/s": 2.0**30,
    "mib/s": 2.0**20,
}
LINK_HINT = "write e.g. --link intra=150GB/s,inter=10Gbit (units: Tbit, Gbit, Mbit, TB/s, GB/s, MB/s, GiB/s, MiB/s)"
FLOPS_UNITS = {"pflops": 1e15, "tflops": 1e12, "gflops": 1e9}
COMPUTE_HINT = f"write a GPU model ({', '.join(GPU_RATES)}) or a rate, e.g. --compute 150TFLOPS"


class JobRates(BaseModel):
    """The rates and where each came from: ``sources`` has compute, intra and inter."""

    rates: Rates
    sources: dict[str, str]


def parse_bandwidth(text: str, key: str) -> float:
    """``10Gbit``, ``10Gbit/s``, ``150GB/s``, ``900MiB/s`` → bytes per second."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z/]+)\s*", text)
    unit = match.group(2).lower().removesuffix("ps") if match else ""
    unit = unit[:-2] if unit.endswith("bit/s") else unit
    if not match or unit not in BANDWIDTH_UNITS or float(match.group(1)) <= 0:
        raise UsageError(f"--link {key}={text!r} is not a bandwidth with a unit it knows", LINK_HINT)
    return float(match.group(1)) * BANDWIDTH_UNITS[unit]


def parse_link(text: str | None) -> dict[str, float]:
    """``--link intra=150GB/s,inter=10Gbit`` (either or both) → {"intra"|"inter": bytes/s}."""
    out: dict[str, float] = {}
    for part in (text or "").replace(" ", "").split(","):
        key, eq, value = part.partition("=")
        if not part:
            continue
        if key not in ("intra", "inter") or not eq:
            raise UsageError(f"--link {text!r}: unknown entry {part!r}", LINK_HINT)
        out[key] = parse_bandwidth(value, key)
    return out


def parse_compute(text: str) -> tuple[float | None, str | None]:
    """``--compute``: (a rate in FLOP/s, None) for ``150TFLOPS``, (None, model) for a GPU model of the table."""
    model = next((name for name in GPU_RATES if name.lower() == text.strip().lower()), None)
    if model is not None:
        return None, model
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)(?:/s)?\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or (unit and unit not in FLOPS_UNITS) or float(match.group(1)) <= 0:
        raise UsageError(f"--compute {text!r} is neither a GPU model nor a rate", COMPUTE_HINT)
    return float(match.group(1)) * FLOPS_UNITS.get(unit, 1.0), None


def compute_rate(backend: str, precision: str, compute: str | None, gpu_name: str | None) -> tuple[float, str]:
    """One device's sustained FLOP/s and its source: ``--compute``, the table for the GPU's name, or a default."""
    rate, model = parse_compute(compute) if compute else (None, None)
    if rate is not None:
        return rate, "--compute"
    if backend != "nccl" and model is None:
        return CPU_RATE, "default for a CPU rank"
    found = model or next((name for name in GPU_RATES if gpu_name and name in gpu_name.upper()), None)
    sixteen, fp32 = GPU_RATES[found or UNKNOWN_GPU]
    source = "--compute" if model else f"table: {found}" if found else f"default: {UNKNOWN_GPU}'s"
    return (fp32 if precision == "fp32" else sixteen), source


def job_rates(
    backend: str, precision: str, link: str | None, compute: str | None, gpu_name: str | None = None
) -> JobRates:
    """The rates of a job on ``backend``: what the user gave, else the table and the defaults."""
    given = parse_link(link)
    intra, inter, intra_latency, inter_latency = LINK_DEFAULTS["nccl" if backend == "nccl" else "gloo"]
    flops, compute_source = compute_rate(backend, precision, compute, gpu_name)
    default = f"default for {backend}"
    rates = Rates(
        flops=flops,
        intra_bytes_s=given.get("intra", intra),
        inter_bytes_s=given.get("inter", inter),
        intra_latency_s=intra_latency,
        inter_latency_s=inter_latency,
    )
    sources = {key: "--link" if key in given else default for key in ("intra", "inter")}
    return JobRates(rates=rates, sources={"compute": compute_source, **sources})
