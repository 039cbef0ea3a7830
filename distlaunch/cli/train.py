"""``distlaunch train``: the bundled GPT trainer on every rank, config checked before anything starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from distlaunch.cli import groups as g
from distlaunch.cli import options as o
from distlaunch.cli import panels as h
from distlaunch.cli.auto_layout import auto_config, tuned_report
from distlaunch.cli.layouts_render import render_layouts
from distlaunch.cli.lines import print_indented
from distlaunch.cli.run import start
from distlaunch.cli.train_job import TrainJob
from distlaunch.contract.plan import Plan
from distlaunch.errors import ExitCode, UsageError
from distlaunch.launcher.planning.decisions import local_gpu_count
from distlaunch.launcher.planning.layouts import advise, is_auto, rates_for
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.planning.rates import job_rates
from distlaunch.launcher.planning.train import (
    HOST_MEMORY,
    TrainPlan,
    check_tracking,
    check_training_files,
    default_nproc,
    parallel_spec,
    parse_size,
    train_backend,
    train_config,
    train_plan,
)
from distlaunch.launcher.planning.tune import check_tune
from distlaunch.readable import ranges
from distlaunch.training.planner import MemoryPlan

Config = Annotated[
    Path | None,
    typer.Argument(
        parser=o.user_path("CONFIG", "a TOML file"),
        help="TOML training config (default: the embedded one: the tiny GPT on the bundled corpus, 4 CPU processes,"
        " dp=2 x pp=2).",
        show_default=False,
    ),
]
Set = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override one config key, e.g. --set train.steps=50 (repeatable).",
        rich_help_panel=h.RUN,
    ),
]
GpuMemory = Annotated[
    str | None,
    typer.Option(
        "--gpu-memory",
        metavar="SIZE",
        help="Memory of one GPU for the planner, e.g. 80GiB (default: the smallest GPU the hosts report).",
        rich_help_panel=h.PLANNER,
    ),
]
Resume = Annotated[
    str | None,
    typer.Option(
        "--resume",
        metavar="latest|auto|never|PATH",
        help="Resume from a checkpoint: 'latest' in checkpoint.dir, a checkpoint.dir or step_N directory (any"
        " layout), 'never' (a fresh run, in a checkpoint.dir without checkpoints); the same as --set"
        " checkpoint.resume (default auto: the latest one if there is one, docs/checkpointing.md).",
        rich_help_panel=h.FAULTS,
    ),
]
Link = Annotated[
    str | None,
    typer.Option(
        "--link",
        metavar="intra=BW,inter=BW",
        help="Link bandwidths for the layout cost model, e.g. --link inter=10Gbit or intra=150GB/s (units: Gbit, Mbit, GB/s, MB/s, GiB/s, MiB/s; default: per backend, docs/choosing-a-layout.md).",
        rich_help_panel=h.PLANNER,
    ),
]
Compute = Annotated[
    str | None,
    typer.Option(
        "--compute",
        metavar="GPU|RATE",
        help="One device's sustained compute for the layout cost model: a GPU model (A100, H100, ...) or a rate, e.g. 150TFLOPS (default: the GPU the hosts report, else a table default).",
        rich_help_panel=h.PLANNER,
    ),
]
Tune = Annotated[
    int | None,
    typer.Option(
        "--tune",
        metavar="K",
        help="With --parallel auto: train each of the K fastest predicted layouts for 10 steps, print predicted"
        " against measured step time, then train the measured best (docs/choosing-a-layout.md).",
        rich_help_panel=h.PLANNER,
        show_default=False,
    ),
]
MetricsFile = Annotated[
    Path | None,
    typer.Option(
        "--metrics-file",
        metavar="FILE",
        help="Rank 0's metrics.jsonl (default: DIR/metrics.jsonl with --log-dir DIR).",
        rich_help_panel=h.OUTPUT,
        parser=o.user_path("--metrics-file", "a file, e.g. --metrics-file metrics.jsonl"),
    ),
]


# train has no per-node mode: --nnodes is only a hostfile's spares
NNODES = (
    "Run on up to MAX hosts of the hostfile (-H), in order; the rest are spares that replace a failed host, and the"
    " job shrinks while MIN remain (N is N:N; --max-restarts defaults to 3)."
)


PARALLEL = (
    "Parallel layout, e.g. 'dp=2,tp=2,pp=2,zero=1' (dp may be 'auto'), or 'auto': the fastest one predicted "
    "for the model and the hosts (docs/choosing-a-layout.md)."
)


@g.launch_options(
    g.retold(g.LAUNCH_OPTIONS, parallel=PARALLEL),
    g.retold(g.pick(g.NODE_OPTIONS, "nnodes"), nnodes=NNODES),
    hang_timeout=600.0,
)
def train(
    config: Config = None,
    set_: Set = None,
    gpu_memory: GpuMemory = None,
    metrics_file: MetricsFile = None,
    resume: Resume = None,
    link: Link = None,
    compute: Compute = None,
    tune: Tune = None,
    *,
    launch: g.LaunchArgs,
) -> int:
    """Train the bundled GPT on every rank: config checked first, then run's launch.

    With --dry-run: the plan and every rank's memory estimate (parameters, gradients, optimizer state kept between steps; a step's activations, buffers and peak) against the GPU's memory; exit 2 when a rank's step peak does not fit; and the layout's predicted step, term by term, naming a layout predicted at least 1.2x faster.

    --parallel auto: every valid layout is predicted (docs/choosing-a-layout.md); the five fastest that fit are shown and the first one trains. With --tune K, the K fastest each train 10 steps first, in a folder of their own, and the measured best trains.

    Exit code: 0 on success (also when a resumed checkpoint already reaches train.steps), 1 for an internal error, 2 for a bad config or option (before any process starts), 3 when a host cannot be reached, 124 when the job hung, the first failing rank's code otherwise, 130/143/129 after Ctrl-C / SIGTERM / a closed terminal (SIGHUP).
    """
    if gpu_memory is not None and parse_size(gpu_memory) <= 0:  # 0 would make every plan "does not fit"
        raise UsageError(f"--gpu-memory {gpu_memory!r} is not a positive size", "give one GPU's memory, e.g. 80GiB")
    overrides = list(set_ or [])
    if resume is not None:  # a JSON string is a valid TOML basic string, whatever the path holds
        overrides.append(f"checkpoint.resume={json.dumps(resume)}")
    auto = is_auto(launch.parallel)
    check_tune(tune, auto, launch.dry_run, launch.detach)
    job_rates(launch.backend, "fp32", link, compute)  # a bad --link or --compute: one line, before anything else
    cfg, rank_sets = train_config(
        config,
        overrides,
        None if auto else launch.parallel,
        launch.nproc_per_node is not None or launch.hostfile is not None,
        auto=auto,
    )
    metrics = metrics_file or (launch.log_dir / "metrics.jsonl" if launch.log_dir else None)
    check_training_files(cfg, launch.hostfile, launch.workdir, metrics)
    check_tracking(cfg, launch.hostfile, metrics, launch.env)
    nproc = default_nproc(cfg, launch.hostfile, launch.nproc_per_node)
    backend, why = train_backend(launch.backend, launch.hostfile, nproc, local_gpu_count())
    if why:
        sys.stderr.write(f"distlaunch: {why}\n")
    job = TrainJob(launch, config, nproc, backend, gpu_memory)
    tuned = None
    if auto:  # chosen on a plan of the hosts, then planned and checked as if the user had typed it
        cfg, rank_sets, tuned = auto_config(job, cfg, rank_sets, metrics, link, compute, tune)
    request = job.request(rank_sets, metrics, parallel_spec(cfg))

    def with_memory(plan: Plan) -> Plan:  # every rank's memory, where the plan knows the hosts
        if not isinstance(plan, LaunchPlan):
            return plan
        planned = train_plan(plan, cfg, config, gpu_memory)
        if planned.batch and not launch.dry_run:
            sys.stderr.write(f"distlaunch: {planned.batch}\n")
        if auto or launch.dry_run:
            planned.layouts = advise(planned, cfg, gpu_memory, rates_for(planned, cfg, link, compute), auto)
        if auto and not launch.dry_run and not launch.json_output:
            render_layouts(planned.layouts, Console(stderr=True))
        return planned

    def show_memory(plan: Plan, console: Console) -> None:
        if isinstance(plan, TrainPlan):
            if plan.batch:
                print_indented(console, plan.batch)
            render_memory(plan.memory, console)
            if plan.layouts is not None:
                render_layouts(plan.layouts, console)

    return start(
        request,
        dry_run=launch.dry_run,
        json_output=launch.json_output,
        detach=launch.detach,
        refine=with_memory,
        describe=show_memory,
        verdict=dry_run_verdict,
        amend=lambda report: report if tuned is None else tuned_report(report, tuned),
    )


def dry_run_verdict(plan: Plan) -> int:
    """A training plan that does not fit its devices is a dry run that failed: one line, exit 2."""
    if not isinstance(plan, TrainPlan) or plan.memory.fits is not False:
        return 0
    worst, memory = max(plan.memory.ranks, key=lambda r: r.peak), plan.memory
    sys.stderr.write(
        f"error: the plan does not fit: rank {worst.rank}'s step peak of {_gib(worst.peak)} is over 90% of "
        f"{_gib(memory.capacity_bytes or 0)} per rank ({memory.capacity_source}) (hint: shard more (parallel.zero, "
        "tp, pp), turn on train.activation_checkpointing, or lower train.micro_batch_size)\n"
    )
    return ExitCode.USAGE


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def render_memory(memory: MemoryPlan, console: Console) -> None:
    """Per-rank memory estimate; ranks with identical numbers share one row. The numbers are in one unit, named
    in the title, and the moment of each peak is said under the table: so the table fits 80 columns."""
    rows: dict[tuple, list[int]] = {}
    for r in memory.ranks:
        key = (r.params, r.grads, r.optimizer, r.activations, r.buffers, r.peak, r.peak_at, r.fits)
        rows.setdefault(key, []).append(r.rank)
    unit, size = ("GiB", 2**30) if max((r.peak for r in memory.ranks), default=0) >= 2**28 else ("MiB", 2**20)
    table = Table(
        title=f"memory per rank in {unit} ({memory.precision}, zero={memory.zero}, micro-batch "
        f"{memory.micro_batch_size}{', activation checkpointing' if memory.activation_checkpointing else ''})",
        title_justify="left",
        caption="params, grads, optimizer: kept between steps; activations, buffers: the most each takes in a step; "
        "step peak: the most alive at once, at the moment said below",
        caption_justify="left",
    )
    table.add_column("ranks", overflow="fold")
    # two-line headers where a header is wider than its numbers: the table stays inside 80 columns
    for col in ("params", "grads", "optimizer", "activations\n(est.)", "buffers", "step\npeak", "fits"):
        table.add_column(col, justify="right", no_wrap=True)
    digits = 2 if unit == "GiB" else 1
    moments: dict[str, list[int]] = {}
    for (params, grads, opt, act, buffers, peak, peak_at, fits), ranks in rows.items():
        verdict = "?" if fits is None else ("yes" if fits else "[red]no[/red]")
        sizes = (f"{n / size:.{digits}f}" for n in (params, grads, opt, act, buffers, peak))
        table.add_row(ranges(ranks), *sizes, verdict)
        moments.setdefault(peak_at, []).extend(ranks)
    console.print(table)
    at = [f"{moment} (ranks {ranges(ranks)})" for moment, ranks in moments.items()] if len(moments) > 1 else moments
    print_indented(console, f"step peak at: {', '.join(at)}")
    if memory.capacity_bytes is None:
        known = (
            memory.capacity_source
            if memory.device == HOST_MEMORY
            else "unknown (pass --gpu-memory, e.g. --gpu-memory 80GiB)"
        )
        print_indented(
            console, f"device: {memory.device}, memory per rank {known}; cannot tell whether the step peak fits"
        )
        return
    verdict = "[green]fits[/green]" if memory.fits else "[red]does not fit[/red]"
    print_indented(
        console,
        Text.from_markup(
            f"device: {escape(memory.device)}, {_gib(memory.capacity_bytes)} per rank "
            f"({escape(memory.capacity_source)}); the step peak {verdict} within 90% of it"
        ),
    )
