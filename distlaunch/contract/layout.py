"""The parallel layout: one grammar, one resolution rule, one rank grid, for every backend and the engine.

``--parallel dp=2,tp=2,pp=2,zero=1,schedule=1f1b,microbatches=8`` is read here and nowhere else; the same
text travels to every rank as DISTLAUNCH_PARALLEL. Ranks are laid out tp fastest, then dp, then pp:
``rank = pp_i*(dp*tp) + dp_i*tp + tp_i``. Tensor parallelism talks on every layer, so its groups are
consecutive ranks, kept inside one host (fast intra-node links); the engine builds its DeviceMesh in the
same order, so the groups a plan prints are the groups training uses.

The degrees are named once, in ``GRID``. The fields of the layout, the keys of ``--parallel`` and of the
config's ``[parallel]``, the spelling, the process groups and the engine's mesh all follow from it: a new
degree is its name at its place in ``GRID``, and the engine's use of its mesh dimension.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from pydantic import Field, create_model, model_serializer

from distlaunch.errors import UsageError

Schedule = Literal["gpipe", "1f1b", "interleaved"]
SCHEDULES: tuple[str, ...] = Schedule.__args__
ZeroStage = Literal[0, 1, 2, 3]
GRID = ("tp", "dp", "pp")  # the rank grid's axes, the fastest-varying first: a tp group is consecutive ranks
MODEL_DEGREES = tuple(axis for axis in GRID if axis != "dp")  # how one copy of the model is split over ranks
# the keys that fix how many ranks a job has, in the spelling's order: the copies (dp, which dp=auto leaves to the
# world size), then the degrees that split each copy, the innermost first
DEGREES = ("dp", *MODEL_DEGREES)
PIPELINE_KEYS = ("schedule", "microbatches", "virtual_stages")  # how the engine runs pp, not the rank count
LAYOUT_KEYS = (*DEGREES, "zero", *PIPELINE_KEYS)
EXAMPLE = "dp=2,tp=2,pp=2,zero=1,schedule=1f1b,microbatches=8"

# One field per degree, made from DEGREES so that no degree is written twice: dp None is dp=auto, and every
# other degree is 1 (that axis not split) unless given.
Degrees = create_model(
    "Degrees",
    __doc__="The degrees of a layout, in the spelling's order.",
    dp=(int | None, Field(None, ge=1)),
    **{axis: (int, Field(1, ge=1)) for axis in MODEL_DEGREES},
)


class LayoutSpec(Degrees):
    """What the user asked for; ``dp`` None is ``dp=auto`` (the world size divided by tp·pp).
    The pipeline keys are None where the user left them to the engine's defaults."""

    zero: ZeroStage = 0
    schedule: Schedule | None = None
    microbatches: int | None = Field(None, ge=1)
    virtual_stages: int | None = Field(None, ge=1)

    @property
    def model_parallel(self) -> int:
        """The ranks that hold one copy of the model (tp·pp)."""
        return math.prod(getattr(self, axis) for axis in MODEL_DEGREES)

    def __str__(self) -> str:
        """The ``--parallel`` spelling, ``dp=auto`` included (what DISTLAUNCH_PARALLEL carries)."""
        return spelling(self)


class Layout(LayoutSpec):
    """A spec resolved against a world size: dp·tp·pp == world_size."""

    dp: int = Field(ge=1)

    @property
    def world_size(self) -> int:
        return self.dp * self.model_parallel

    @model_serializer(mode="wrap")
    def _drop_unset_pipeline_keys(self, handler) -> dict:
        """Plans (``--dry-run --json``) show the pipeline keys only where the user gave them."""
        return {k: v for k, v in handler(self).items() if v is not None or k not in PIPELINE_KEYS}


def spelling(layout: LayoutSpec, pipeline: bool = True) -> str:
    """A layout in ``--parallel`` spelling: the one writer of it. The pipeline keys only where set, and none with
    ``pipeline`` False (the degrees and the ZeRO stage alone, as the engine's records name a layout)."""
    words = [f"{key}={'auto' if getattr(layout, key) is None else getattr(layout, key)}" for key in (*DEGREES, "zero")]
    if pipeline:
        words += [f"{key}={getattr(layout, key)}" for key in PIPELINE_KEYS if getattr(layout, key) is not None]
    return ",".join(words)


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
    if (text or "").strip().lower() == "auto":  # distlaunch train resolves it before any layout is read
        raise UsageError(
            f"{what} auto: only distlaunch train chooses a layout (it knows the model and predicts each one)",
            f"give the layout, e.g. {what} {EXAMPLE}",
        )
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
    model_parallel = spec.model_parallel
    split = "*".join(f"{axis}({getattr(spec, axis)})" for axis in MODEL_DEGREES)  # tp(2)*pp(2)
    if spec.dp is None:
        if world_size % model_parallel:
            near = model_parallel * max(1, world_size // model_parallel)
            raise UsageError(
                f"dp=auto: world size {world_size} is not divisible by {split}={model_parallel}",
                f"start a multiple of {model_parallel} ranks, e.g. {ranks(near)}, or change {'/'.join(MODEL_DEGREES)}",
            )
        dp = world_size // model_parallel
    else:
        dp = spec.dp
    if dp * model_parallel != world_size:
        raise UsageError(
            f"dp({dp})*{split} = {dp * model_parallel} != world size {world_size}",
            f"use dp=auto, or start {ranks(dp * model_parallel)}",
        )
    return Layout(**{**spec.model_dump(), "dp": dp})


def _strides(layout: Layout) -> dict[str, int]:
    """How many ranks apart two neighbours on each axis are: 1 on the fastest, then the faster axes' product."""
    strides, step = {}, 1
    for axis in GRID:
        strides[axis], step = step, step * getattr(layout, axis)
    return strides


def rank_of(layout: Layout, **place: int) -> int:
    """The global rank at a place in the grid, e.g. ``rank_of(layout, pp=1, dp=0, tp=1)``; an axis left out is 0."""
    strides = _strides(layout)
    return sum(index * strides[axis] for axis, index in place.items())


def place_of(layout: Layout, rank: int) -> dict[str, int]:
    """A global rank's index on every axis of the grid (the inverse of ``rank_of``)."""
    return {axis: rank // stride % getattr(layout, axis) for axis, stride in _strides(layout).items()}


def groups(layout: Layout) -> dict[str, list[list[int]]]:
    """Every axis's process groups as lists of global ranks, tp's first: a group is the ranks that differ only on
    that axis, and groups come in the order of their first ranks."""
    strides = _strides(layout)
    return {
        axis: [
            [first + i * strides[axis] for i in range(getattr(layout, axis))]
            for first in range(layout.world_size)
            if place_of(layout, first)[axis] == 0
        ]
        for axis in GRID
    }


def mesh_shape(layout: Layout) -> dict[str, int]:
    """The grid as DeviceMesh takes it, the slowest axis first (a mesh's last dimension varies fastest):
    ``{"pp": 2, "dp": 2, "tp": 2}``, so that ``mesh["tp"]`` is the tp group of ``groups``."""
    return {axis: getattr(layout, axis) for axis in reversed(GRID)}


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
