"""``--parallel auto``: every layout the engine accepts for a model on a set of ranks, each predicted by the
cost model (``cost``) and fitted by the memory planner, the fastest that fit first.

A candidate is a config like a user's: its layout keys and ``train.activation_checkpointing`` set, then
``resolve_parallel_dims`` judges it exactly as it judges a typed layout (heads by tp, layers by stages, the
batch by dp and micro-batches); what it refuses is no candidate. Pure arithmetic, no torch.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel

from distlaunch.contract.layout import rank_of, spelling, tp_group_across_nodes
from distlaunch.errors import UsageError
from distlaunch.training.config import ParallelSection, TrainingConfig
from distlaunch.training.dims import ParallelDims, resolve_parallel_dims
from distlaunch.training.planner import HEADROOM, rank_memory
from distlaunch.training.planner.cost import Link, Rates, StepCost, layout_links, step_cost
from distlaunch.training.presets import GPTConfig

SHOWN = 5  # the layouts --parallel auto prints
FASTER = 1.2  # how much faster another layout must be predicted for a dry run of a given layout to name it


class LayoutCost(BaseModel):
    """One layout, as predicted: its ``--parallel`` spelling, activation checkpointing, step and memory."""

    parallel: str
    activation_checkpointing: bool
    micro_batch_size: int
    cost: StepCost
    peak_bytes: int | None = None  # the largest step peak of any rank; None: not planned (slower than needed)
    missing_bytes: int | None = None  # above the memory the plan may use (None: fits, or capacity unknown)


class LayoutSearch(BaseModel):
    """Every valid layout considered, the fastest that fit (fastest first), and, when none fits, the one that
    misses by the least memory."""

    considered: int
    best: list[LayoutCost]
    nearest: LayoutCost | None = None


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def pipelines(model: GPTConfig, pp: int) -> list[tuple[str, int]]:
    """(schedule, virtual stages) worth trying for ``pp`` stages: one plain schedule without a pipeline; 1F1B,
    and interleaving with every chunk count that splits the layers evenly. GPipe is left out: its bubble is
    1F1B's and it holds every micro-batch's activations at once, so it is never the better choice."""
    if pp == 1:
        return [("1f1b", 1)]
    chunks = [v for v in range(2, model.n_layer // pp + 1) if model.n_layer % (pp * v) == 0]
    return [("1f1b", 1), *(("interleaved", v) for v in chunks)]


def candidates(model: GPTConfig, cfg: TrainingConfig, world_size: int, ranks_per_host: int) -> Iterator[TrainingConfig]:
    """Configs of every layout to try: tp inside a host, stages splitting the layers evenly, ZeRO stages where
    there are replicas, and every micro-batch count of the per-replica batch, with and without checkpointing."""
    batch = cfg.train.global_batch_size
    for tp in (t for t in divisors(world_size) if ranks_per_host % t == 0 and model.n_head % t == 0):
        for pp in (p for p in divisors(world_size // tp) if model.n_layer % p == 0):
            dp = world_size // (tp * pp)
            if batch % dp:
                continue
            local = batch // dp // cfg.train.grad_accum_steps or 1
            for zero in range(4) if dp > 1 else (0,):
                for schedule, v in pipelines(model, pp):
                    for m in (m for m in divisors(local) if m >= pp):
                        parallel = ParallelSection(
                            dp=dp, tp=tp, pp=pp, zero=zero, schedule=schedule, virtual_stages=v, microbatches=m
                        )
                        for checkpointing in (False, True):
                            train = cfg.train.model_copy(update={"activation_checkpointing": checkpointing})
                            yield cfg.model_copy(update={"parallel": parallel, "train": train})


def valid_dims(cfg: TrainingConfig, model: GPTConfig, world_size: int) -> ParallelDims | None:
    """The engine's own verdict on a candidate (None: it refuses it)."""
    try:
        return resolve_parallel_dims(cfg, model, world_size)
    except UsageError:
        return None


def peak_bytes(model: GPTConfig, dims: ParallelDims, cfg: TrainingConfig, backend: str) -> int:
    """The largest step peak of any rank: each stage's first dp rank holds the largest ZeRO slices, and the
    tp ranks of a stage hold the same."""
    return max(rank_memory(model, dims, rank_of(dims, pp=i), cfg.train, backend, None).peak for i in range(dims.pp))


def layout_cost(
    model: GPTConfig,
    dims: ParallelDims,
    cfg: TrainingConfig,
    backend: str,
    host_of_rank: list,
    rates: Rates,
    links: dict[str, Link] | None = None,
) -> LayoutCost:
    """A layout's prediction, its memory not planned yet."""
    return LayoutCost(
        parallel=spelling(dims),
        activation_checkpointing=cfg.train.activation_checkpointing,
        micro_batch_size=dims.micro_batch_size,
        cost=step_cost(model, dims, cfg.train, backend, host_of_rank, rates, links),
    )


def fitted(entry: LayoutCost, peak: int, capacity: int | None) -> LayoutCost:
    missing = None if capacity is None or peak <= capacity * HEADROOM else peak - int(capacity * HEADROOM)
    return entry.model_copy(update={"peak_bytes": peak, "missing_bytes": missing})


def search_layouts(
    model: GPTConfig,
    cfg: TrainingConfig,
    host_of_rank: list,
    backend: str,
    capacity: int | None,
    rates: Rates,
    keep: tuple[int, int, int, int] | None = None,
    count: int = SHOWN,
) -> LayoutSearch:
    """The ``count`` fastest layouts that fit ``capacity`` bytes per rank (None: unknown, every one counts as
    fitting), from the cost model; ``keep``: only layouts of these (dp, tp, pp, zero) (a resumed job's)."""
    world_size = len(host_of_rank)
    ranks_per_host = min(host_of_rank.count(h) for h in set(host_of_rank))
    found: list[tuple[LayoutCost, ParallelDims, TrainingConfig]] = []
    links: dict[tuple[int, int, int], dict[str, Link] | None] = {}  # per degrees: the groups' links
    for candidate in candidates(model, cfg, world_size, ranks_per_host):
        p = candidate.parallel
        if keep is not None and (p.dp, p.tp, p.pp, p.zero) != keep:
            continue
        dims = valid_dims(candidate, model, world_size)
        if dims is None:
            continue
        degrees = (dims.dp, dims.tp, dims.pp)
        if degrees not in links:  # a tp group across hosts is no candidate (the launcher refuses it)
            spans = tp_group_across_nodes(dims, host_of_rank.__getitem__)
            links[degrees] = None if spans else layout_links(dims, host_of_rank, rates)
        if links[degrees] is not None:
            entry = layout_cost(model, dims, candidate, backend, host_of_rank, rates, links[degrees])
            found.append((entry, dims, candidate))
    found.sort(key=lambda item: item[0].cost.step_s)
    best, nearest = [], None
    for entry, dims, candidate in found:  # fastest first: plan memory only until enough fit
        entry = fitted(entry, peak_bytes(model, dims, candidate, backend), capacity)
        if entry.missing_bytes is None:
            best.append(entry)
            if len(best) == count:
                break
        elif nearest is None or entry.missing_bytes < nearest.missing_bytes:
            nearest = entry
    return LayoutSearch(considered=len(found), best=best, nearest=None if best else nearest)


class LayoutAdvice(BaseModel):
    """What a training plan says of its layout: the rates the prediction used (and where each came from), the
    layout's own predicted step, and the fastest layouts that fit. ``auto``: the planner chose the layout (the
    first of ``best``, or with ``--tune`` the measured best of their trials); else ``faster`` names another
    layout predicted at least ``FASTER`` times as fast."""

    auto: bool
    rates: Rates
    sources: dict[str, str]
    layout: LayoutCost
    considered: int
    best: list[LayoutCost]
    faster: LayoutCost | None = None
    kept: str | None = None  # a resumed job's degrees, kept: why


def faster_layout(layout: LayoutCost, search: LayoutSearch) -> LayoutCost | None:
    """The fastest layout that fits, where it is predicted at least ``FASTER`` times as fast as ``layout``."""
    if not search.best or search.best[0].cost.step_s * FASTER > layout.cost.step_s:
        return None
    return search.best[0]
