"""The parallel layout: one grammar, one resolution rule, one rank grid, for every backend and the engine.

``--parallel dp=2,tp=2,pp=2,zero=1,schedule=1f1b,microbatches=8`` is read here and nowhere else; the same
text travels to every rank as DISTLAUNCH_PARALLEL. Ranks are laid out tp fastest, then dp, then pp:
``rank = pp_i*(dp*tp) + dp_i*tp + tp_i``. Tensor parallelism talks on every layer, so its groups are
consecutive ranks, kept inside one host (fast intra-node links); the engine builds its DeviceMesh in the
same order, so the groups a plan prints are the groups training uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, model_serializer

from distlaunch.errors import UsageError

Schedule = Literal["gpipe", "1f1b", "interleaved"]
SCHEDULES: tuple[str, ...] = Schedule.__args__
ZeroStage = Literal[0, 1, 2, 3]
SHAPE_KEYS = ("dp", "tp", "pp")  # the keys that fix how many ranks a job has
PIPELINE_KEYS = ("schedule", "microbatches", "virtual_stages")  # how the engine runs pp, not the rank count
LAYOUT_KEYS = (*SHAPE_KEYS, "zero", *PIPELINE_KEYS)
EXAMPLE = "dp=2,tp=2,pp=2,zero=1,schedule=1f1b,microbatches=8"


class LayoutSpec(BaseModel):
    """What the user asked for; ``dp`` None is ``dp=auto`` (the world size divided by tp·pp).
    The pipeline keys are None where the user left them to the engine's defaults."""

    dp: int | None = None
    tp: int = 1
    pp: int = 1
    zero: ZeroStage = 0
    schedule: Schedule | None = None
    microbatches: int | None = None
    virtual_stages: int | None = None

    def given(self) -> dict[str, object]:
        """The keys set explicitly, as ``parse_layout`` would return them."""
        return {k: getattr(self, k) for k in self.model_fields_set}

    def __str__(self) -> str:
        """The ``--parallel`` spelling, ``dp=auto`` included (what DISTLAUNCH_PARALLEL carries)."""
        return spelling(self)


class Layout(BaseModel):
    """A spec resolved against a world size: dp·tp·pp == world_size."""

    dp: int
    tp: int
    pp: int
    zero: ZeroStage = 0
    schedule: Schedule | None = None
    microbatches: int | None = None
    virtual_stages: int | None = None

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @model_serializer(mode="wrap")
    def _drop_unset_pipeline_keys(self, handler) -> dict:
        """Plans (``--dry-run --json``) show the pipeline keys only where the user gave them."""
        return {k: v for k, v in handler(self).items() if v is not None or k not in PIPELINE_KEYS}

    def __str__(self) -> str:
        """The ``--parallel`` spelling (what DISTLAUNCH_PARALLEL carries); pipeline keys only when given."""
        return spelling(self)


def spelling(layout: LayoutSpec | Layout) -> str:
    """A layout in ``--parallel`` spelling: the one writer of it. Pipeline keys only where set."""
    dp = "auto" if layout.dp is None else layout.dp
    extra = "".join(f",{k}={getattr(layout, k)}" for k in PIPELINE_KEYS if getattr(layout, k) is not None)
    return f"dp={dp},tp={layout.tp},pp={layout.pp},zero={layout.zero}{extra}"


def _value(text: str, key: str, value: str) -> object:
    if key == "dp" and value.lower() == "auto":
        return None
    if key == "schedule":
        if value not in SCHEDULES:
            raise UsageError(f"{text!r}: schedule={value!r} is not a schedule", f"use one of {', '.join(SCHEDULES)}")
        return value
    try:
        number = int(value)
    except ValueError:
        raise UsageError(
            f"{text!r}: {key}={value!r} is not an integer", f"write {key}=N" + (" or dp=auto" if key == "dp" else "")
        ) from None
    if key == "zero" and number not in (0, 1, 2, 3):
        raise UsageError(f"{text!r}: zero={number} is not a ZeRO stage", "zero must be 0, 1, 2 or 3")
    if key != "zero" and number < 1:
        raise UsageError(f"{text!r}: {key}={number} must be at least 1", f"set {key} to a positive integer")
    return number


def parse_layout(text: str | None, what: str = "--parallel") -> dict[str, object]:
    """The keys written in ``dp=2,tp=2,pp=2,zero=1,...`` (any subset; ``dp=auto`` is None), checked one by one;
    ``what`` names where the text came from in messages."""
    values: dict[str, object] = {}
    for part in (text or "").replace(" ", "").split(","):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.lower()
        if key not in LAYOUT_KEYS or not eq:
            raise UsageError(
                f"{what} {text!r}: unknown entry {part!r}", f"use keys {', '.join(LAYOUT_KEYS)}, e.g. {EXAMPLE}"
            )
        if key in values:
            raise UsageError(f"{what} {text!r}: {key} is given twice", f"give {key} once")
        values[key] = _value(f"{what} {text}", key, value)
    return values


def layout_spec(text: str | None, what: str = "--parallel") -> LayoutSpec:
    return LayoutSpec(**parse_layout(text, what))


def resolve_layout(spec: LayoutSpec, world_size: int, ranks: Callable[[int], str] = lambda n: f"{n} ranks") -> Layout:
    """Fill in dp=auto and check dp·tp·pp == world_size. ``ranks(n)`` says, in the backend's own options,
    how to start n ranks (``-n 4``, ``srun -N 2 --ntasks-per-node 4``): the fix in every message."""
    model_parallel = spec.tp * spec.pp
    if spec.dp is None:
        if world_size % model_parallel:
            near = model_parallel * max(1, world_size // model_parallel)
            raise UsageError(
                f"dp=auto: world size {world_size} is not divisible by tp({spec.tp})*pp({spec.pp})={model_parallel}",
                f"start a multiple of {model_parallel} ranks, e.g. {ranks(near)}, or change tp/pp",
            )
        dp = world_size // model_parallel
    else:
        dp = spec.dp
    if dp * model_parallel != world_size:
        raise UsageError(
            f"dp({dp})*tp({spec.tp})*pp({spec.pp}) = {dp * model_parallel} != world size {world_size}",
            f"use dp=auto, or start {ranks(dp * model_parallel)}",
        )
    return Layout(dp=dp, **spec.model_dump(exclude={"dp"}))


def rank_of(layout: Layout, pp_i: int, dp_i: int, tp_i: int) -> int:
    """Global rank of a grid coordinate (tp fastest, then dp, then pp)."""
    return pp_i * (layout.dp * layout.tp) + dp_i * layout.tp + tp_i


def groups(layout: Layout) -> dict[str, list[list[int]]]:
    """The tp, dp and pp process groups as lists of global ranks."""
    p, r = layout, rank_of
    return {
        "tp": [[r(p, k, d, t) for t in range(p.tp)] for k in range(p.pp) for d in range(p.dp)],
        "dp": [[r(p, k, d, t) for d in range(p.dp)] for k in range(p.pp) for t in range(p.tp)],
        "pp": [[r(p, k, d, t) for k in range(p.pp)] for d in range(p.dp) for t in range(p.tp)],
    }


def tp_group_across_nodes(layout: Layout, node_of_rank: Callable[[int], object]) -> list[int] | None:
    """The first tensor-parallel group whose ranks sit on more than one node, or None. ``node_of_rank``
    returns a node key (None: unknown, which counts as elsewhere when any rank of the group is known)."""
    if layout.tp == 1:
        return None
    for group in groups(layout)["tp"]:
        nodes = [node_of_rank(r) for r in group]
        known = {n for n in nodes if n is not None}
        if len(known) > 1 or (known and None in nodes):
            return group
    return None
