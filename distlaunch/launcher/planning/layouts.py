"""``--parallel auto`` and the layout advice of a training plan: the search of ``training.planner.search`` fed
with the plan's hosts, its devices' memory and the job's rates (``rates``).

The chosen layout reaches the ranks as a typed one does: its spelling becomes the job's ``--parallel`` (one
channel, DISTLAUNCH_PARALLEL), its checkpointing and batch become ``--set`` assignments, and the config is
loaded from them as every rank will load it, then checked again by the plan like any layout.
"""

from __future__ import annotations

from pathlib import Path

from distlaunch.errors import UsageError
from distlaunch.launcher.planning.plan import LaunchPlan
from distlaunch.launcher.planning.rates import JobRates, job_rates
from distlaunch.launcher.planning.train import EMBEDDED_CONFIG, TrainPlan, device_capacity
from distlaunch.training.checkpoint.manifest import read_manifest
from distlaunch.training.config import TrainingConfig, load_config, ranks_path
from distlaunch.training.dims import fit_global_batch, resolve_parallel_dims
from distlaunch.training.planner.search import (
    SHOWN,
    LayoutAdvice,
    LayoutCost,
    LayoutSearch,
    faster_layout,
    layout_cost,
    search_layouts,
)
from distlaunch.training.presets import GPTConfig, model_config
from distlaunch.training.resume import RESUME_WORDS, resume_source

AUTO = "auto"


def is_auto(parallel: str | None) -> bool:
    """Whether ``--parallel`` asks the planner to choose the layout."""
    return parallel is not None and parallel.strip().lower() == AUTO


def host_of_rank(plan: LaunchPlan) -> list[int]:
    """Each global rank's node, as the plan places them."""
    return [node.node_rank for node in plan.nodes for _ in node.ranks]


def plan_model(plan: LaunchPlan, cfg: TrainingConfig) -> GPTConfig:
    data = ranks_path(cfg.data.path, plan.nodes[0].workdir or None) if cfg.data.path else None
    return model_config(cfg.model.preset, data)


def rates_for(plan: LaunchPlan, cfg: TrainingConfig, link: str | None, compute: str | None) -> JobRates:
    """The cost model's rates for this plan. Where the hosts decide the backend at start (a dry run that read
    none), the figures are a GPU job's, as the hosts of a remote hostfile usually are: the plan says so."""
    # the GPU of the hosts that run the ranks, as they reported it (never this machine's): known once they were read
    decided = plan.decisions
    pending = plan.backend == "auto"
    backend = "nccl" if pending else plan.backend
    gpu = decided.gpu_model if decided is not None and backend == "nccl" and compute is None else None
    rates = job_rates(backend, cfg.train.precision, link, compute, gpu)
    if pending:
        said = {
            key: f"{source}, if the hosts have GPUs" for key, source in rates.sources.items() if "default" in source
        }
        rates = rates.model_copy(update={"sources": {**rates.sources, **said}})
    return rates


def kept_degrees(cfg: TrainingConfig, plan: LaunchPlan) -> tuple[tuple[int, int, int, int] | None, str | None]:
    """A job that resumes a checkpoint of this world size keeps its dp, tp, pp and ZeRO stage (and says so):
    a requeued ``--parallel auto`` job trains on as it did. Only where the ranks see this machine's files."""
    ckpt = cfg.checkpoint
    if not all(node.local for node in plan.nodes) or (ckpt.dir is None and ckpt.resume in RESUME_WORDS):
        return None, None
    workdir = plan.nodes[0].workdir or None
    resume = ckpt.resume if ckpt.resume in RESUME_WORDS else ranks_path(ckpt.resume, workdir)
    source, _ = resume_source(resume, ranks_path(ckpt.dir, workdir) if ckpt.dir else None, tries=0)
    meta = read_manifest(source)[0] if source is not None else None
    if meta is None or meta.layout.world_size != plan.world_size:
        return None, None
    saved = meta.layout
    why = (
        f"resuming {source.name}: keeping its dp={saved.dp},tp={saved.tp},pp={saved.pp},zero={saved.zero} "
        "(give --parallel to change it; any layout resumes)"
    )
    return (saved.dp, saved.tp, saved.pp, saved.zero), why


def no_fit(search: LayoutSearch, capacity: int | None) -> UsageError:
    """The line of a model no layout fits: the nearest fit and the memory it misses."""
    near = search.nearest
    if near is None or near.missing_bytes is None or capacity is None:
        return UsageError(
            f"--parallel auto: none of the layouts is valid for this model on these ranks ({search.considered})",
            "change the number of ranks (-n, the hostfile) or the batch (train.global_batch_size)",
        )
    return UsageError(
        f"--parallel auto: no layout fits {capacity / 2**30:.2f} GiB per rank; the nearest, {near.parallel}"
        f"{' with activation checkpointing' if near.activation_checkpointing else ''}, needs "
        f"{near.missing_bytes / 2**30:.2f} GiB more",
        "add ranks or GPUs with more memory (--gpu-memory), lower train.seq_len or train.micro_batch_size",
    )


def search_plan(
    plan: LaunchPlan, cfg: TrainingConfig, gpu_memory: str | None, rates: JobRates, keep=None, count: int = SHOWN
) -> tuple[LayoutSearch, int | None]:
    """The search for this plan's hosts and devices (``keep``: a resumed job's degrees; ``count``: how many of
    the fastest that fit it keeps)."""
    _, capacity, _ = device_capacity(plan, gpu_memory)
    model = plan_model(plan, cfg)
    search = search_layouts(model, cfg, host_of_rank(plan), plan.backend, capacity, rates.rates, keep, count)
    return search, capacity


def ranked_layouts(
    plan: LaunchPlan, cfg: TrainingConfig, gpu_memory: str | None, rates: JobRates, count: int = SHOWN
) -> tuple[TrainingConfig, list[LayoutCost]]:
    """``--parallel auto`` on a plan of the hosts: the ``count`` fastest layouts that fit (fastest first), and
    the config they all train. With no batch of the user's, every candidate trains the same one: the default,
    fitted to the world size. No layout that fits: the line naming the nearest (exit 2)."""
    cfg = cfg.model_copy(deep=True)
    if cfg.train.global_batch_size is None:
        fit_global_batch(cfg, plan.world_size, 1)
    keep, _ = kept_degrees(cfg, plan)
    search, capacity = search_plan(plan, cfg, gpu_memory, rates, keep, count)
    if not search.best:
        raise no_fit(search, capacity)
    return cfg, search.best


def layout_config(
    layout: LayoutCost, cfg: TrainingConfig, config: Path | None, rank_sets: list[str]
) -> tuple[TrainingConfig, list[str]]:
    """The config every rank will load with ``layout`` (one of ``ranked_layouts``' for ``cfg``), and their
    ``--set`` list: the layout's spelling becomes the job's ``--parallel``, its checkpointing and the batch
    ``--set`` assignments, loaded as every rank will load them."""
    checkpointing = "true" if layout.activation_checkpointing else "false"
    sets = [*rank_sets, f"train.activation_checkpointing={checkpointing}"]
    sets.append(f"train.global_batch_size={cfg.train.global_batch_size}")
    return load_config(config or EMBEDDED_CONFIG, sets, layout.parallel), sets


def advise(plan: TrainPlan, cfg: TrainingConfig, gpu_memory: str | None, rates: JobRates, auto: bool) -> LayoutAdvice:
    """A training plan's layout advice: its own layout's predicted step beside the fastest that fit."""
    model = plan_model(plan, cfg)
    dims = resolve_parallel_dims(cfg.model_copy(deep=True), model, plan.world_size)
    keep, kept = kept_degrees(cfg, plan) if auto else (None, None)
    search, _ = search_plan(plan, cfg, gpu_memory, rates, keep)
    own = layout_cost(model, dims, cfg, plan.backend, host_of_rank(plan), rates.rates)
    own = own.model_copy(update={"peak_bytes": max(r.peak for r in plan.memory.ranks)})
    return LayoutAdvice(
        auto=auto,
        rates=rates.rates,
        sources=rates.sources,
        layout=own,
        considered=search.considered,
        best=search.best,
        faster=None if auto else faster_layout(own, search),
        kept=kept,
    )
