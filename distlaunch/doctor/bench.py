"""``doctor --bench``: all-reduce bandwidth across the hosts, measured by real ranks started through the
launcher's own machinery (``distlaunch.launcher.running.launch``) running ``distlaunch.doctor.allreduce_bench``."""

from __future__ import annotations

import json

from distlaunch.contract.options import ExecOptions, LaunchOptions
from distlaunch.doctor.gather import HostResult
from distlaunch.doctor.model import LOCAL, BenchResult, BenchRow, Check, DoctorOptions, check
from distlaunch.errors import DistlaunchError, UsageError
from distlaunch.launcher.running.launch import launch, plan_for
from distlaunch.readable import plural

RESULT_PREFIX = "distlaunch-bench "  # as allreduce_bench prints it (that module imports torch, so not imported here)
GPU_MAX_BYTES = 256 << 20
CPU_MAX_BYTES = 16 << 20  # gloo on a CPU moves ~1 GB/s: 256 MiB messages would take minutes for no new insight
MIN_BYTES = 1 << 10


def parse_size(text: str | None) -> int | None:
    """``256M``, ``16MiB``, ``1G``, ``4096`` → bytes (binary units); None stays None."""
    if text is None:
        return None
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        value = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except ValueError:
        raise UsageError(f"--bench-max {text!r} is not a size", "write e.g. 16M, 256M or 1G") from None
    if value < MIN_BYTES:
        raise UsageError(f"--bench-max {text!r} is below {MIN_BYTES} bytes", "write e.g. 16M")
    return value


class _Collector:
    """A launcher sink that keeps rank 0's result lines and the last lines of every rank."""

    def __init__(self):
        self.rows: list[BenchRow] = []
        self.meta: dict = {}
        self.tail: list[str] = []

    def rank_line(self, host: str, rank: int, fd: int, line: str) -> None:
        if rank == 0 and line.startswith(RESULT_PREFIX):
            data = json.loads(line[len(RESULT_PREFIX) :])
            self.meta = {"backend": data["backend"], "world_size": data["world_size"]}
            self.rows.append(BenchRow(**{k: data[k] for k in BenchRow.model_fields}))
        else:
            self.tail = ([*self.tail, f"[{host} rank {rank}] {line}"])[-5:]

    def notice(self, text: str) -> None:
        self.tail = ([*self.tail, text])[-5:]

    def status(self, state: object) -> None:
        """The sweep draws no status line: doctor shows its own result."""


def run_bench(results: list[HostResult], opts: DoctorOptions, master_addr: str) -> BenchResult | Check:
    """Run the sweep on every slot of every host; a Check when it cannot run or fails."""
    gpus = all(r.facts is not None and r.facts.gpu_count > 0 for r in results)
    max_bytes = opts.bench_max_bytes or (GPU_MAX_BYTES if gpus else CPU_MAX_BYTES)
    launch_opts = LaunchOptions(
        program=["distlaunch.doctor.allreduce_bench", "--min-bytes", str(MIN_BYTES), "--max-bytes", str(max_bytes)],
        module=True,
        hostfile=opts.hostfile,
        nproc_per_node=opts.nproc_per_node,
        include=opts.include,
        exclude=opts.exclude,
        master_addr=master_addr,
        master_port=str(opts.master_port),
        env=opts.env,
        python=opts.remote_python,
        remote_python=opts.remote_python,
        ssh_config=opts.ssh_config,
    )
    plan = plan_for(launch_opts)
    if plan.world_size < 2:
        return check("bench", LOCAL, "skip", "one rank: nothing to all-reduce with (pass -n 2, or a hostfile)")
    sink = _Collector()
    try:
        report = launch(plan, launch_opts, ExecOptions(grace_period=3.0), sink)
    except DistlaunchError as exc:
        return check("bench", LOCAL, "fail", f"the benchmark job could not start: {exc.message}", exc.hint)
    if report.exit_code != 0 or not sink.rows:
        return check(
            "bench",
            LOCAL,
            "fail",
            f"the benchmark job failed (exit {report.exit_code}): " + " | ".join(sink.tail),
            "run it alone to see everything: distlaunch run [same hosts] -m distlaunch.doctor.allreduce_bench",
        )
    note = (
        ""
        if gpus or opts.bench_max_bytes
        else f"CPU (gloo): sizes up to {max_bytes >> 20} MiB by default; --bench-max 256M for the full range"
    )
    return BenchResult(
        backend=sink.meta["backend"],
        world_size=sink.meta["world_size"],
        hosts=plan.nnodes,
        max_bytes=max_bytes,
        note=note,
        rows=sink.rows,
    )


def bench_check(result: BenchResult) -> Check:
    """The sweep summed up in one finding: the peak bus bandwidth."""
    best = max(result.rows, key=lambda r: r.busbw_gbs)
    return check(
        "bench",
        LOCAL,
        "pass",
        f"all-reduce peak busbw {best.busbw_gbs:.2f} GB/s (algbw {best.algbw_gbs:.2f}) at "
        f"{best.bytes >> 10} KiB; {result.backend}, {plural(result.world_size, 'rank')} on {plural(result.hosts, 'host')}"
        + (f"; {result.note}" if result.note else ""),
    )
