"""Start real multi-process jobs for the engine tests (gloo on CPU, the torchrun environment)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("_worker.py")
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment of one rank: torchrun's contract, one thread, quiet warnings."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "DISTLAUNCH_PARALLEL")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONWARNINGS="ignore")
    if world_size > 0:
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
    return env


def spawn(
    argv: list[str], world_size: int, timeout: float, extra_env: dict | None = None
) -> list[subprocess.CompletedProcess]:
    """Run ``argv`` as ``world_size`` ranks (0: one process without the launch environment)."""
    port = free_port()
    procs = []
    for rank in range(max(world_size, 1)):
        env = rank_env(rank, world_size, port) | (extra_env or {})
        procs.append(
            subprocess.Popen(
                argv,
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    finally:
        for proc in procs:  # only our own children, by pid
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def run_layouts(
    out_dir: Path,
    world_size: int,
    base: list[str],
    layouts: dict[str, list[str]],
    timeout: float = 600,
    count_comms: bool = False,
) -> dict[str, list[dict]]:
    """Train every layout in one job of ``world_size`` ranks; results per layout, per rank
    (``count_comms``: step 2 runs under CommDebugMode, see ``_worker.reduction_stats``)."""
    spec = json.dumps({"base": base, "layouts": layouts, "count_comms": count_comms})
    results = spawn([sys.executable, str(WORKER), str(out_dir), spec], world_size, timeout)
    failed = [(i, r.stderr[-3000:]) for i, r in enumerate(results) if r.returncode != 0]
    if failed:
        raise RuntimeError(f"{world_size}-rank job failed: rank {failed[0][0]}:\n{failed[0][1]}")
    return {name: [torch.load(out_dir / f"{name}.rank{r}.pt") for r in range(max(world_size, 1))] for name in layouts}
