"""``distlaunch train``'s core: validate the training config in the launcher, turn it into launch
options for ``python -m distlaunch.engine``, and plan every rank's memory. Torch-free: only the
engine's pydantic config, its layout checks and the planner are imported.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

from distlaunch.contract.env import parse_env
from distlaunch.contract.layout import DEGREES, LAYOUT_KEYS, Layout, LayoutSpec, parse_layout
from distlaunch.contract.options import LaunchOptions, Nproc
from distlaunch.errors import UsageError
from distlaunch.launcher.planning.decisions import PENDING_HOST_MEMORY, local_gpu_count, local_nproc
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.planning.spec import size_in_bytes
from distlaunch.readable import plural
from distlaunch.training.argv import ENGINE_MODULE, engine_args, engine_job
from distlaunch.training.config import (
    TrainingConfig,
    check_file_layout,
    check_parallel_conflict,
    load_config,
    ranks_path,
)
from distlaunch.training.dims import fitted_batch, resolve_parallel_dims
from distlaunch.training.faults import check_fault, restart_count
from distlaunch.training.places import METRICS_FILE, check_place, metrics_path
from distlaunch.training.planner import MemoryPlan, plan_memory
from distlaunch.training.planner.search import LayoutAdvice
from distlaunch.training.presets import model_config
from distlaunch.training.resume import check_before_launch
from distlaunch.training.tracking import check_event_folder, check_packages

EMBEDDED_CONFIG = Path(__file__).resolve().parents[2] / "templates" / "train-tiny-cpu.toml"
HOST_MEMORY = "no GPU: host memory"  # the device of a plan's CPU ranks


class TrainPlan(LaunchPlan):
    """The launch plan of a training job, plus its config file and per-rank memory estimate."""

    config: str
    memory: MemoryPlan
    batch: str | None = None  # the batch distlaunch chose (the user wrote none), in words
    layouts: LayoutAdvice | None = None  # the layout's predicted step and the fastest that fit (dry run, auto)


def train_config(
    config: Path | None, sets: list[str], parallel: str | None, shape_given: bool, auto: bool = False
) -> tuple[TrainingConfig, list[str]]:
    """The config every rank will see, and the ``--set`` list each rank is started with.

    The embedded config's layout (dp=2 x pp=2 on 4 processes) is what ``distlaunch train`` runs with no
    options. Once the user says how many ranks there are (``shape_given``: -n or a hostfile; or dp, tp, pp in
    --parallel or --set), the embedded dp, tp and pp are dropped and only what the user wrote counts, so
    ``train -n 1`` or ``train --parallel dp=2,tp=2`` just work. A conflict is reported only between two
    things the user wrote: their own config file (or --set) and --parallel.

    The layout is resolved here, once; it reaches the ranks by one channel, DISTLAUNCH_PARALLEL (from
    ``parallel_spec``), which outranks the config file there. So the ranks' ``--set`` list carries no
    layout key. ``auto`` (``--parallel auto``): the planner chooses every layout key and the micro-batches, so
    none may be set, and the embedded config's are dropped.
    """
    if auto:
        check_no_layout_sets(sets)
        shape_given = True
    layout = parse_layout(parallel)  # the user's words, checked as --parallel before anything else reads them
    if config is not None:
        with contextlib.suppress(OSError):  # a path that is not there: load_config says so
            if stat.S_ISFIFO(os.stat(config).st_mode):  # bash's <(...): read here, it would be empty for the ranks
                raise UsageError(
                    f"config file {config} is a pipe: every rank reads the config itself, and a pipe is read once",
                    "save it to a file (where every host sees it) and pass that",
                )
        check_file_layout(config, parallel)
        return load_config(config, sets, parallel), _without_layout(sets)
    written = {assignment.partition("=")[0].strip() for assignment in sets} | {f"parallel.{k}" for k in layout}
    dropped = []
    if shape_given or written & {f"parallel.{key}" for key in DEGREES}:
        unset = LayoutSpec()  # dp=auto, every other degree 1
        dropped += [f"parallel.{key}={getattr(unset, key) or 'auto'}" for key in DEGREES]
        if "train.global_batch_size" not in written:  # the embedded batch, made to fit the ranks given
            dropped.append("train.global_batch_size=auto")
    if ("parallel.microbatches" in written or auto) and "train.micro_batch_size" not in written:
        dropped.append("train.micro_batch_size=auto")  # derived from the micro-batch count instead
    check_parallel_conflict(sets, parallel)
    rank_sets = [*dropped, *sets]
    layout_sets = [f"parallel.{key}={'auto' if value is None else value}" for key, value in layout.items()]
    return load_config(EMBEDDED_CONFIG, [*rank_sets, *layout_sets]), _without_layout(rank_sets)


def check_no_layout_sets(sets: list[str]) -> None:
    """``--parallel auto`` beside a ``--set parallel.KEY``: two answers to one question (exit 2)."""
    layout = {f"parallel.{key}" for key in LAYOUT_KEYS}
    given = [assignment for assignment in sets if assignment.partition("=")[0].strip() in layout]
    if given:
        raise UsageError(
            f"--parallel auto chooses every parallel key, but --set {given[0]} gives one",
            "drop that --set, or give the whole layout with --parallel instead of auto",
        )


def _without_layout(sets: list[str]) -> list[str]:
    """``--set`` assignments less the layout's keys, which DISTLAUNCH_PARALLEL carries."""
    layout = {f"parallel.{key}" for key in LAYOUT_KEYS}
    return [assignment for assignment in sets if assignment.partition("=")[0].strip() not in layout]


def check_training_files(
    cfg: TrainingConfig, hostfile: Path | None, workdir: str | None, metrics_file: Path | None = None
) -> None:
    """Refuse a ``data.path`` that is not there, a ``checkpoint.dir`` or ``metrics_file`` that cannot
    be created or written, or a ``checkpoint.resume`` that cannot work (another model or data, past
    ``train.steps``), before any rank starts (UsageError, exit 2). Nothing is created (``--dry-run``).

    Only where the ranks see this machine's files: no hostfile (ranks here, or this is one Slurm
    task) and a first try. On several hosts the ranks decide alone, as they always do too.
    ``metrics_file`` is the launcher's (relative to its own folder, as ``engine_program`` resolves it).
    """
    if hostfile is None and restart_count() == 0:
        ckpt = cfg.checkpoint
        check_before_launch(ckpt.resume, ckpt.dir, cfg.model.preset, cfg.data.path, workdir, cfg.train.steps)
        if metrics_file is not None:
            check_place(METRICS_FILE, metrics_file.expanduser(), folder=False)


def check_tracking(
    cfg: TrainingConfig, hostfile: Path | None, metrics_file: Path | None, env: list[str] | None
) -> None:
    """``train.report_to`` before any rank starts (UsageError, exit 2): TensorBoard needs a folder for its event
    files, the one of metrics.jsonl as rank 0 will find it (``--metrics-file``, else the environment the ranks
    get); where the ranks run on this machine, each tracker's package must be there (found, not imported:
    rank 0 imports it, and says so in the same words if it cannot)."""
    if not cfg.train.report_to:
        return
    rank_env = {**os.environ, **parse_env(env or [])}
    check_event_folder(cfg.train.report_to, metrics_path(metrics_file, rank_env))
    if hostfile is None:
        check_packages(cfg.train.report_to, load=False)


def default_nproc(cfg: TrainingConfig, hostfile: Path | None, nproc_per_node: Nproc) -> Nproc:
    """Processes on this machine when neither -n nor a hostfile says: the config's dp*tp*pp; with dp=auto,
    as many whole tp*pp groups as there are GPUs here (at least one group). Without a hostfile this machine is
    the host, so its own GPUs count for -n auto|gpu; a hostfile's hosts count theirs at start."""
    if hostfile is not None:
        return nproc_per_node
    if nproc_per_node is not None:
        return local_nproc(nproc_per_node)
    p = cfg.parallel
    dp = p.dp if p.dp is not None else max(1, local_gpu_count() // p.model_parallel)
    return dp * p.model_parallel


def train_backend(backend: str, hostfile: Path | None, nproc: Nproc, gpus: int) -> tuple[str, str | None]:
    """``--backend`` for a training job, and a line saying why when it is not the launcher's usual choice.

    ``auto`` on this machine alone, where GPUs exist but fewer than the ranks (the embedded 4-rank
    default on a 1-GPU workstation), is gloo on the CPU: nccl would stop every rank past the last GPU.
    Everything else is ``run``'s rule (nccl where GPUs exist, else gloo).
    """
    if backend != "auto" or hostfile is not None or not isinstance(nproc, int) or not 0 < gpus < nproc:
        return backend, None
    return "gloo", (
        f"{plural(nproc, 'rank')} but {plural(gpus, 'GPU')} here: training on the CPU with gloo "
        f"(for the GPUs: -n {gpus} with a layout of {plural(gpus, 'rank')}, e.g. --parallel dp={gpus})"
    )


def parallel_spec(cfg: TrainingConfig) -> str:
    """The config's layout in --parallel spelling (what DISTLAUNCH_PARALLEL will carry): the pipeline's
    schedule where there is a pipeline, its virtual stages where the schedule has them."""
    p = cfg.parallel
    pipeline = p.pp > 1
    engine = {
        "schedule": p.schedule if pipeline else None,
        "virtual_stages": p.virtual_stages if pipeline and p.schedule == "interleaved" else None,
    }
    return str(LayoutSpec(**{**p.model_dump(), **engine}))


def engine_program(config: Path | None, overrides: list[str], metrics_file: Path | None) -> list[str]:
    """``-m distlaunch.engine CONFIG [--set ...] [--metrics-file ...]`` (config path made absolute);
    ``overrides`` are the rank's --set list from ``train_config``."""
    program = [ENGINE_MODULE, str((config or EMBEDDED_CONFIG).resolve())]
    for assignment in overrides:
        program += ["--set", assignment]
    if metrics_file is not None:
        program += ["--metrics-file", str(metrics_file.resolve())]
    return program


def engine_layout_problem(opts: LaunchOptions) -> Callable[[Layout], str | None]:
    """Why a layout cannot train the bundled engine's config, for a job that shrinks (launcher/elastic/healing.py):
    the global batch must still split over dp, and so on. Any layout suits another program."""
    args = engine_args(opts.module, opts.program)
    if args is None:
        return lambda layout: None

    def problem(layout: Layout) -> str | None:
        try:
            engine_job(args, str(layout), layout.world_size)
        except UsageError as exc:
            return exc.message
        return None

    return problem


def parse_size(text: str) -> int:
    """``80GiB``, ``80GB``, ``81920MiB`` or plain bytes as an integer number of bytes."""
    size = size_in_bytes(text)
    if size is None:
        raise UsageError(f"--gpu-memory {text!r} is not a size", "write e.g. 80GiB, 40GB or 24576MiB")
    return size


def device_capacity(plan: LaunchPlan, gpu_memory: str | None) -> tuple[str, int | None, str]:
    """(device, bytes per rank, where that number came from): --gpu-memory, else the smallest GPU the hosts
    reported (``Decisions``); without GPUs the smallest share of a host's memory among its ranks. Never the
    memory of the machine that plans, unless it runs ranks itself."""
    if gpu_memory is not None:
        return "gpu", parse_size(gpu_memory), "--gpu-memory"
    decided = plan.decisions
    if plan.backend == "auto":
        return "decided by the hosts at start", None, "unknown before the hosts are read (--probe, or --gpu-memory)"
    if plan.backend == "nccl":
        if decided is None or decided.gpu_memory_mib is None:
            return "gpu", None, "unknown (pass --gpu-memory)"
        return "gpu", decided.gpu_memory_mib * 2**20, f"the smallest GPU of the hosts: {decided.gpu_memory_host}"
    if decided is None:
        return HOST_MEMORY, None, PENDING_HOST_MEMORY
    share, source = decided.host_memory_per_rank({node.host: len(node.ranks) for node in plan.nodes})
    return HOST_MEMORY, share, source


def train_plan(plan: LaunchPlan, cfg: TrainingConfig, config: Path | None, gpu_memory: str | None) -> TrainPlan:
    """The launch plan with the layout checked against the model and every rank's memory planned."""
    data = ranks_path(cfg.data.path, plan.nodes[0].workdir or None) if cfg.data.path else None
    model = model_config(cfg.model.preset, data)  # a prepared dataset sets the vocabulary
    chosen = cfg.train.global_batch_size is None  # "auto": resolving the layout decides it
    dims = resolve_parallel_dims(cfg, model, plan.world_size)
    batch = fitted_batch(cfg.train.global_batch_size, dims) if chosen else None
    check_fault(cfg.fault, plan.world_size, cfg.train.step_timeout)
    device, capacity, source = device_capacity(plan, gpu_memory)
    memory = plan_memory(model, dims, cfg.train, plan.backend, device, capacity, source)
    config_path = str((config or EMBEDDED_CONFIG).resolve())
    return TrainPlan(**plan.model_dump(), config=config_path, memory=memory, batch=batch)
