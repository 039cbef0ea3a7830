"""The parallelism spec (``dp=2,tp=2,pp=2,zero=1``) and the rank grid it implies.

Ranks are laid out tp fastest, then dp, then pp: ``rank = pp_i*(dp*tp) + dp_i*tp + tp_i``. Tensor
parallelism talks on every layer, so its groups must be consecutive local ranks on one host (fast
intra-node links); the engine builds its DeviceMesh with the same order, so the groups the plan
prints are the groups training uses.
"""

from __future__ import annotations

from pydantic import BaseModel

from distlaunch.errors import UsageError

_KEYS = ("dp", "tp", "pp", "zero")


class ParallelSpec(BaseModel):
    """What the user asked for; ``dp`` may still be ``None`` (auto)."""

    dp: int | None = None
    tp: int = 1
    pp: int = 1
    zero: int = 0


class Parallel(BaseModel):
    """A spec resolved against a world size: dp·tp·pp == world_size."""

    dp: int
    tp: int
    pp: int
    zero: int

    def __str__(self) -> str:
        return f"dp={self.dp},tp={self.tp},pp={self.pp},zero={self.zero}"


def parse_parallel(text: str | None) -> ParallelSpec:
    """Parse ``dp=2,tp=2,pp=2,zero=1`` (any subset, ``dp=auto`` allowed) into a ParallelSpec."""
    if not text:
        return ParallelSpec()
    values: dict[str, int | None] = {}
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.lower()
        if key not in _KEYS or not eq:
            raise UsageError(
                f"--parallel {text!r}: unknown entry {part!r}", "use keys dp, tp, pp, zero, e.g. dp=2,tp=2,pp=1,zero=1"
            )
        if key in values:
            raise UsageError(f"--parallel {text!r}: {key} is given twice", f"give {key} once")
        if key == "dp" and value.lower() == "auto":
            values[key] = None
            continue
        try:
            number = int(value)
        except ValueError:
            raise UsageError(
                f"--parallel {text!r}: {key}={value!r} is not an integer",
                f"write {key}=N" + (" or dp=auto" if key == "dp" else ""),
            ) from None
        if key == "zero" and number not in (0, 1, 2, 3):
            raise UsageError(f"--parallel {text!r}: zero={number} is not a ZeRO stage", "zero must be 0, 1, 2 or 3")
        if key != "zero" and number < 1:
            raise UsageError(
                f"--parallel {text!r}: {key}={number} must be at least 1", f"set {key} to a positive integer"
            )
        values[key] = number
    return ParallelSpec(**values)


def resolve_parallel(spec: ParallelSpec, world_size: int) -> Parallel:
    """Fill in dp=auto and check dp·tp·pp == world_size, with the fix in the message."""
    model_parallel = spec.tp * spec.pp
    if spec.dp is None:
        if world_size % model_parallel:
            raise UsageError(
                f"dp=auto: world size {world_size} is not divisible by tp({spec.tp})*pp({spec.pp})={model_parallel}",
                f"use a world size that is a multiple of {model_parallel}, or change tp/pp",
            )
        dp = world_size // model_parallel
    else:
        dp = spec.dp
    if dp * model_parallel != world_size:
        raise UsageError(
            f"dp({dp})*tp({spec.tp})*pp({spec.pp}) = {dp * model_parallel} != world size {world_size}",
            f"use dp=auto, or change -n / the hostfile slots so {world_size} becomes {dp * model_parallel}",
        )
    return Parallel(dp=dp, tp=spec.tp, pp=spec.pp, zero=spec.zero)


def rank_of(p: Parallel, pp_i: int, dp_i: int, tp_i: int) -> int:
    """Global rank of a grid coordinate (tp fastest, then dp, then pp)."""
    return pp_i * (p.dp * p.tp) + dp_i * p.tp + tp_i


def groups(p: Parallel) -> dict[str, list[list[int]]]:
    """The tp, dp and pp process groups as lists of global ranks."""
    return {
        "tp": [[rank_of(p, k, d, t) for t in range(p.tp)] for k in range(p.pp) for d in range(p.dp)],
        "dp": [[rank_of(p, k, d, t) for d in range(p.dp)] for k in range(p.pp) for t in range(p.tp)],
        "pp": [[rank_of(p, k, d, t) for k in range(p.pp)] for d in range(p.dp) for t in range(p.tp)],
    }


def check_tp_within_hosts(p: Parallel, host_of_rank: list[str]) -> None:
    """A tensor-parallel group spanning hosts would put per-layer all-reduces on the network: refuse it."""
    for group in groups(p)["tp"]:
        hosts = sorted({host_of_rank[r] for r in group}, key=host_of_rank.index)
        if len(hosts) > 1:
            raise UsageError(
                f"tp={p.tp}: tensor-parallel group of ranks {group[0]}..{group[-1]} spans hosts {', '.join(hosts)}",
                f"give every host a multiple of {p.tp} processes, or lower tp to fit inside one host",
            )
