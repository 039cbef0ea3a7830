"""The engine's command line, ``python -m distlaunch.engine [CONFIG.toml] [--set KEY=VALUE]... [--metrics-file
PATH]``, read in one place: by the engine on every rank, and by the launcher, which recognises a program as the
bundled engine and resolves the config its ranks will read, to check a job before any rank starts (``train``
and a shrinking job's layouts, a Slurm job's warning ahead of its time limit, a pod's grace period)."""

from __future__ import annotations

import argparse
from typing import NamedTuple

from distlaunch.training.config import TrainingConfig, load_config, ranks_path
from distlaunch.training.dims import ParallelDims, resolve_parallel_dims
from distlaunch.training.presets import GPTConfig, model_config

ENGINE_MODULE = "distlaunch.engine"
# what a rank of the engine imports before its first step (torch, torch.distributed, DTensor, the engine's loop,
# its checkpoints' torch.distributed.checkpoint, the summary's rich: ``python -X importtime -m distlaunch.engine``
# lists them): a host's warm start (--preload auto) imports them once for all its ranks
ENGINE_PRELOAD = ("distlaunch.engine.loop", "distlaunch.engine.checkpoint.store", "rich.console")
USAGE = "Train the bundled GPT: python -m distlaunch.engine [CONFIG.toml] [--set KEY=VALUE]..."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The engine's command line (argparse exits 2 on arguments it refuses, as the ranks would)."""
    parser = argparse.ArgumentParser(prog="python -m distlaunch.engine", description=USAGE)
    parser.add_argument("config", nargs="?", help="TOML training config (optional)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config key, e.g. --set train.steps=50 (repeatable)",
    )
    parser.add_argument(
        "--metrics-file",
        default=None,
        help="rank 0's metrics.jsonl (default: $DISTLAUNCH_METRICS_FILE, else $DISTLAUNCH_LOG_DIR/metrics.jsonl)",
    )
    return parser.parse_args(argv)


def is_engine(module: bool, program: list[str]) -> bool:
    """Whether the program is the bundled engine: ``-m distlaunch.engine ARGS``."""
    return module and program[:1] == [ENGINE_MODULE]


def engine_args(module: bool, program: list[str]) -> argparse.Namespace | None:
    """The engine's own arguments when the program is the bundled engine; None for any other program, and for
    arguments the engine would refuse itself (its ranks say why)."""
    if not is_engine(module, program):
        return None
    try:
        return parse_args(program[1:])
    except SystemExit:
        return None


class EngineJob(NamedTuple):
    """What the ranks of ``python -m distlaunch.engine`` will train: their config, its model and its layout."""

    cfg: TrainingConfig
    model: GPTConfig
    dims: ParallelDims


def engine_job(
    args: argparse.Namespace, parallel: str | None, world_size: int, workdir: str | None = None
) -> EngineJob:
    """The config the ranks read (the file, ``--set``, the layout ``parallel`` as DISTLAUNCH_PARALLEL carries it),
    resolved on ``world_size`` ranks; a bad config or layout is the UsageError the ranks would stop with.
    ``workdir``: where the ranks start, for a relative ``data.path`` (None: here)."""
    cfg = load_config(args.config, args.set, parallel)
    data = ranks_path(cfg.data.path, workdir) if cfg.data.path else None
    model = model_config(cfg.model.preset, data)  # a prepared dataset sets the vocabulary
    return EngineJob(cfg, model, resolve_parallel_dims(cfg, model, world_size))
