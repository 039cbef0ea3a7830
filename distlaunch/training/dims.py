"""Parallel degrees resolved against the world size, the model and the batch, checked before start.

Pure Python (no process group, no mesh), so every refusal is unit-tested on its own. Each
message names the values and how to fix them.
"""

from __future__ import annotations

from pydantic import ConfigDict

from distlaunch.contract.layout import DEGREES, Layout, Schedule, resolve_layout
from distlaunch.errors import UsageError
from distlaunch.readable import plural
from distlaunch.training.config import DEFAULT_GLOBAL_BATCH, TrainingConfig
from distlaunch.training.presets import GPTConfig


class ParallelDims(Layout):
    """The layout of one job as the engine runs it: the contract's layout with every pipeline key decided for
    the model and the batch, and the batch's split."""

    model_config = ConfigDict(frozen=True)
    schedule: Schedule  # only used when pp > 1
    virtual_stages: int  # model chunks per pp rank (interleaved), else 1
    microbatches: int  # micro-batches per accumulation round on each dp rank
    micro_batch_size: int  # sequences per micro-batch
    accum_steps: int = 1  # accumulation rounds per step (one pipeline schedule run each)

    @property
    def n_stages(self) -> int:
        return self.pp * self.virtual_stages


def shards_vocab_over_dp(dims: ParallelDims, seq_len: int, vocab_size: int) -> bool:
    """Whether ZeRO-3 keeps the token embedding and the LM head sharded by rows over dp and brings
    every dp rank's tokens to them (``parallel/vocab.py``) instead of gathering each table as an
    FSDP unit: with tp=1 (tp makes both vocabulary-parallel over the tp group instead), a vocabulary
    that dp divides (the head's logits are then even shards), and where one micro-batch's tokens
    of all dp ranks together are no more than the vocabulary's rows, so that the (dp, micro-batch,
    seq, d_model) buffers that travel are no larger than a table FSDP would gather."""
    tokens = dims.dp * dims.micro_batch_size * seq_len
    return dims.zero == 3 and dims.tp == 1 and dims.dp > 1 and vocab_size % dims.dp == 0 and tokens <= vocab_size


def stage_layer_counts(n_layer: int, n_stages: int) -> list[int]:
    """Blocks per stage, differing by at most one; spare blocks go to the middle stages first,
    because the first and last stages also carry the embeddings and the head."""
    counts = [n_layer // n_stages] * n_stages
    middle = list(range(1, n_stages - 1))
    order = middle + [i for i in (n_stages - 1, 0) if i not in middle]
    for i in order[: n_layer % n_stages]:
        counts[i] += 1
    return counts


def _check_model(model: GPTConfig, tp: int, seq_len: int) -> None:
    if model.n_head % tp:
        raise UsageError(
            f"tp={tp} does not divide the model's {model.n_head} attention heads",
            "tensor parallel splits attention by heads: pick tp dividing n_head",
        )
    if model.vocab_size % tp:
        raise UsageError(
            f"tp={tp} does not divide the vocabulary size {model.vocab_size}",
            "the embedding and LM head are split by vocabulary: pick tp dividing it",
        )
    if seq_len > model.max_seq_len:
        raise UsageError(
            f"train.seq_len={seq_len} exceeds the model's max_seq_len={model.max_seq_len}",
            f"use train.seq_len <= {model.max_seq_len}",
        )


def fit_global_batch(cfg: TrainingConfig, dp: int, pp: int) -> None:
    """``train.global_batch_size = "auto"``: the default batch, raised to the smallest multiple of what every
    split of it takes (dp ranks x accumulation rounds x micro-batches x their size), so any world size trains it.
    Decided once, into ``cfg``, before anything reads the batch."""
    if cfg.train.global_batch_size is not None:
        return
    micro = cfg.parallel.microbatches or (pp if pp > 1 else 1)
    unit = dp * cfg.train.grad_accum_steps * micro * (cfg.train.micro_batch_size or 1)
    cfg.train.global_batch_size = unit * -(-DEFAULT_GLOBAL_BATCH // unit)


def fitted_batch(global_batch: int, dims: ParallelDims) -> str:
    """The plan's line for a batch ``fit_global_batch`` chose: what it is and why."""
    rounds = f" in {plural(dims.accum_steps, 'accumulation round')}" if dims.accum_steps > 1 else ""
    micro = plural(dims.microbatches, "micro-batch", "micro-batches")
    split = f"{global_batch // dims.dp} per dp rank{rounds} as {micro} of {dims.micro_batch_size}"
    why = (
        "the default, for"
        if global_batch == DEFAULT_GLOBAL_BATCH
        else f"the default {DEFAULT_GLOBAL_BATCH}, raised to fit"
    )
    return f"batch: {global_batch} sequences per step, {split} ({why} {plural(dims.dp, 'dp rank')})"


def _resolve_microbatches(cfg: TrainingConfig, dp: int, pp: int) -> tuple[int, int]:
    global_batch = cfg.train.global_batch_size
    if global_batch % dp:
        raise UsageError(
            f"train.global_batch_size={global_batch} is not divisible by dp={dp}",
            f"use a multiple of {dp}",
        )
    accum = cfg.train.grad_accum_steps
    if (global_batch // dp) % accum:
        raise UsageError(
            f"the per-dp-rank batch of {plural(global_batch // dp, 'sequence')} (global_batch_size/dp) cannot be "
            f"split into train.grad_accum_steps={accum} equal rounds",
            f"use a grad_accum_steps that divides {global_batch // dp}",
        )
    local = global_batch // dp // accum  # sequences per accumulation round
    per = "global_batch_size/dp" if accum == 1 else "global_batch_size/dp/grad_accum_steps"
    mbs, n_micro = cfg.train.micro_batch_size, cfg.parallel.microbatches
    if mbs is not None and n_micro is not None and mbs * n_micro != local:
        raise UsageError(
            f"train.micro_batch_size({mbs})*parallel.microbatches({n_micro}) != {per} = {local}",
            "set only one of them, the other is derived",
        )
    if mbs is not None and local % mbs:
        raise UsageError(
            f"the per-dp-rank batch of {plural(local, 'sequence')} ({per}) cannot be split "
            f"into micro-batches of train.micro_batch_size={mbs}",
            f"use a micro_batch_size that divides {local}",
        )
    if n_micro is None:
        n_micro = local // mbs if mbs is not None else pp
    if n_micro > local or local % n_micro:
        raise UsageError(
            f"the per-dp-rank batch of {plural(local, 'sequence')} cannot be split into {n_micro} equal micro-batches",
            "make global_batch_size/dp a multiple of the micro-batch count "
            "(train.micro_batch_size or parallel.microbatches)",
        )
    return n_micro, local // n_micro


def _check_pipeline(model: GPTConfig, pp: int, schedule: str, v: int, n_micro: int) -> None:
    if pp * v > model.n_layer:
        raise UsageError(
            f"{pp * v} pipeline stages (pp={pp} x virtual_stages={v}) but the model has only {plural(model.n_layer, 'layer')}",
            "every stage needs at least one layer: lower pp (or virtual_stages)",
        )
    if pp > 1 and n_micro < pp:
        raise UsageError(
            f"{n_micro} micro-batches for {pp} pipeline stages",
            f"use at least {pp} micro-batches (parallel.microbatches) or the pipeline idles",
        )
    if schedule == "interleaved" and n_micro % pp:
        raise UsageError(
            f"interleaved schedule needs the micro-batch count ({n_micro}) to be a multiple of pp={pp}",
            f"set parallel.microbatches to a multiple of {pp}",
        )


def resolve_parallel_dims(cfg: TrainingConfig, model: GPTConfig, world_size: int) -> ParallelDims:
    """Turn the config into checked degrees for ``world_size`` processes, or raise UsageError."""
    fix = f"change parallel.{'/'.join(DEGREES)}"
    layout = resolve_layout(cfg.parallel, world_size, lambda n: f"{n} processes, or {fix}")
    dp, tp, pp = layout.dp, layout.tp, layout.pp
    _check_model(model, tp, cfg.train.seq_len)
    schedule = cfg.parallel.schedule
    if schedule == "interleaved" and cfg.parallel.virtual_stages < 2:
        raise UsageError(
            f"interleaved schedule with parallel.virtual_stages={cfg.parallel.virtual_stages}",
            "interleaving needs at least 2 virtual stages per rank, or use schedule 1f1b",
        )
    v = cfg.parallel.virtual_stages if schedule == "interleaved" and pp > 1 else 1
    fit_global_batch(cfg, dp, pp)
    n_micro, mbs = _resolve_microbatches(cfg, dp, pp)
    _check_pipeline(model, pp, schedule, v, n_micro)
    pipeline = {"schedule": schedule, "virtual_stages": v, "microbatches": n_micro}
    batch = {"micro_batch_size": mbs, "accum_steps": cfg.train.grad_accum_steps}
    return ParallelDims(**{**layout.model_dump(), **pipeline, **batch})
