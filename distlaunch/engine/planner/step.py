"""What lives only inside a step, moment by moment: activations, gradients being produced and
the buffers around them (gradient buckets in flight, ZeRO-3's unsharded units and collective
buffers, 16-bit weight copies, AdamW's temporaries).

Activations and buffers peak at different moments (with ZeRO-0/1/2 the buckets are all in flight
at the end of backward, when the activations are gone), so each moment is summed on its own and
the step's peak is the largest one. Each moment follows the engine and torch's FSDP2 and pipeline
schedules; tests/train measures the peak on every rank of the parity layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import ceil

from distlaunch.engine.config import TrainSection
from distlaunch.engine.parallel.dims import ParallelDims
from distlaunch.engine.planner.activations import activation_bytes, later_in_flight
from distlaunch.engine.planner.shapes import (
    FP32,
    Tensor,
    block_numel,
    gathered_numel,
    holds_last_stage,
    rank_layers,
    rank_tensors,
    state_bytes,
    unsharded_numel,
    zero3_owned,
    zero12_owned,
)
from distlaunch.engine.precision import model_dtype_name
from distlaunch.engine.presets import GPTConfig

COPYING_BACKENDS = ("gloo",)  # copy the buffer of every all-gather and reduce-scatter they run


def unsharded_16bit_weights(model: GPTConfig, dims: ParallelDims, pp_rank: int, precision: str) -> int:
    """Bytes of 16-bit weight copies a 16-bit step holds besides the kept state.

    bf16 with ZeRO-0/1/2: none, the parameters themselves are bf16 (counted as state).
    fp16 with ZeRO-0/1/2: autocast caches a 16-bit copy of every fp32 weight matrix it used, for
    the forward.
    ZeRO-3 (FSDP2 ``MixedPrecisionPolicy``): the units are all-gathered in 16 bits, so only the
    unsharded units exist (``unsharded_numel``).
    """
    if precision == "fp32":
        return 0
    if dims.zero != 3:
        if model_dtype_name(precision, dims.zero) != "fp32":
            return 0
        return 2 * sum(x.numel for x in rank_tensors(model, dims, pp_rank) if x.rows > 1)
    return 2 * unsharded_numel(model, dims, pp_rank)


def bucket_bytes(tensors: list[Tensor], bucket_mb: float) -> int:
    """The largest gradient bucket: ``train.bucket_mb``, or one tensor larger than that."""
    return min(FP32 * sum(t.numel for t in tensors), max(int(bucket_mb * 2**20), *(FP32 * t.numel for t in tensors)))


@dataclass(frozen=True)
class RankStep:
    """One rank's step: its tensors, kept state and activations, and what its backend copies."""

    model: GPTConfig
    dims: ParallelDims
    pp_rank: int
    dp_rank: int
    train: TrainSection
    backend: str

    @cached_property
    def tensors(self) -> list[Tensor]:
        return rank_tensors(self.model, self.dims, self.pp_rank)

    @cached_property
    def state(self) -> tuple[int, int, int]:
        return state_bytes(self.tensors, self.dims.zero, self.dims.dp, self.dp_rank, self.train.precision)

    @property
    def kept(self) -> dict[str, int]:
        """The state no step frees: parameters and optimizer state (gradients come and go)."""
        return {"params": self.state[0], "optimizer": self.state[2]}

    def activations(self, done: int = 0, in_flight: float | None = None) -> int:
        train = self.train
        return activation_bytes(
            self.model,
            self.dims,
            self.pp_rank,
            train.seq_len,
            train.precision,
            train.activation_checkpointing,
            done,
            in_flight,
        )

    def largest_tensor(self) -> int:
        return FP32 * max(t.numel for t in self.tensors)

    @property
    def copies(self) -> bool:
        return self.backend in COPYING_BACKENDS

    def adam_temporaries(self) -> int:
        """One fp32 temporary the size of the weight matrices this rank updates (the largest
        foreach group; norms form another, smaller one)."""
        dims, rank = self.dims, self.dp_rank
        if dims.zero == 3:
            return FP32 * sum(zero3_owned(t, dims.dp, rank) for t in self.tensors if t.rows > 1)
        if dims.zero:
            return FP32 * sum(zero12_owned(t.numel, dims.dp, rank) for t in self.tensors if t.rows > 1)
        return FP32 * sum(t.numel for t in self.tensors if t.rows > 1)


def step_moments(
    model: GPTConfig, dims: ParallelDims, pp_rank: int, dp_rank: int, train: TrainSection, backend: str
) -> dict[str, dict[str, int]]:
    """The moments of a step where memory peaks, each as {part: bytes} of everything alive then.

    - backward: a backward starts with the most activations in flight, and the gradients of
      earlier backwards (micro-batches, accumulation rounds) already exist;
    - first block's backward (ZeRO-0/1/2): one block's activations beside nearly all gradients;
    - next block's backward (ZeRO-3 without pp), later backward (ZeRO-3 with pp): see
      ``zero3_moments``;
    - gradient sync: backward is over and the gradients are being reduced;
    - optimizer step: AdamW's foreach update makes a temporary the size of what it updates.
    """
    step = RankStep(model, dims, pp_rank, dp_rank, train, backend)
    moments = zero3_moments(step) if dims.zero == 3 else bucket_moments(step)
    moments["optimizer step"] = step.kept | {"gradients": step.state[1], "adam temporaries": step.adam_temporaries()}
    return moments


def bucket_moments(step: RankStep) -> dict[str, dict[str, int]]:
    """ZeRO-0/1/2: every bucket launches its collective from backward and keeps its buffers
    until the sync (or, stage 2, its next launch) waits for it: at the end of backward, all do.
    Stage 0 all-reduces a flat copy of the gradients; stages 1/2 reduce-scatter a (dp, slots) send
    buffer into slots (gloo copies the send buffer, so one bucket is there twice while it launches).
    """
    dims, grads = step.dims, step.state[1]
    earlier = dims.microbatches * dims.accum_steps > 1  # backwards before the last one
    sends = FP32 * sum(dims.dp * ceil(t.numel / dims.dp) for t in step.tensors)
    bucket = bucket_bytes(step.tensors, step.train.bucket_mb)
    weights16 = unsharded_16bit_weights(step.model, dims, step.pp_rank, step.train.precision)
    backward = step.kept | {"activations": step.activations(), "autocast weights": weights16}
    # stage 2's kept gradients are the slots its reduce-scatters write, there from the first one on
    sync = step.kept | {"gradients": grads if dims.zero < 2 or earlier else 0}
    if dims.zero == 0:
        sync["buckets in flight"] = grads if dims.dp > 1 else 0  # gloo all-reduces in place
    else:
        sync["buckets in flight"] = sends + sends // dims.dp + (bucket if step.copies else 0)
    if earlier and dims.zero < 2:
        # the full gradients exist; each new one is added into them from a temporary
        backward |= {"gradients": grads, "gradient temporary": step.largest_tensor()}
    elif earlier:
        # stage 2 reduces after every backward: the previous one's buckets are in flight, and the
        # one launching holds its full-size gradients besides its send buffer
        backward |= {"gradients": grads, "buckets in flight": sends + bucket * (1 + step.copies)}
    # the backward of the first block: one block's activations (checkpointing: recomputed) are
    # alive again beside the gradients of all the others, most buckets already in flight
    first_block = rank_layers(step.model, dims, step.pp_rank) - 1
    end = sync | {"activations": step.activations(done=first_block, in_flight=1)}
    return {"backward": backward, "first block's backward": end, "gradient sync": sync}


def zero3_moments(step: RankStep) -> dict[str, dict[str, int]]:
    """ZeRO-3: FSDP2 all-gathers units (16-bit with bf16/fp16) and reduce-scatters their fp32
    gradients; the sharded gradients of earlier accumulation rounds are kept."""
    dims, model = step.dims, step.model
    elem = FP32 if step.train.precision == "fp32" else 2
    block = block_numel(model, dims.tp)
    unsharded = unsharded_numel(model, dims, step.pp_rank)
    carried = step.state[1] if dims.accum_steps > 1 else 0
    copy = elem * block if step.copies else 0  # gloo's copy of the block it all-gathers
    backward = step.kept | {"gradients": carried, "activations": step.activations()}
    if dims.pp == 1:
        # the head's gradient is computed first and reduced with the root unit at the very end.
        # One block later, that block's activations and the logits are gone, but its gradients
        # are in their reduce-scatter.
        has_head = holds_last_stage(dims, step.pp_rank)
        head = model.vocab_size // dims.tp * model.d_model + 2 * model.d_model if has_head else 0
        backward |= {"unsharded params": elem * unsharded, "unsharded grads": FP32 * head, "gloo copy": copy}
        later = backward | {"activations": step.activations(done=1), "unsharded grads": FP32 * (head + block)}
        later["reduce-scatter"] = FP32 * block // dims.dp
        return {"backward": backward, "next block's backward": later}
    # pp: the first backward holds the most activations while FSDP gathers unit by unit as
    # above. Each backward leaves its units unsharded and accumulates into the stage's unsharded
    # gradients (fp32: FSDP2 accumulates in the reduce dtype), so a later backward has the whole
    # stage unsharded besides the activations still in flight; a forward in between reshards.
    gathered = gathered_numel(model, dims, step.pp_rank)
    backward |= {"unsharded params": elem * gathered, "gloo copy": copy}
    in_flight, regathers = later_in_flight(dims, step.pp_rank)
    later = step.kept | {"gradients": carried, "activations": step.activations(in_flight=in_flight)}
    later |= {"unsharded params": elem * unsharded, "unsharded grads": FP32 * unsharded}
    later |= {"gradient temporary": step.largest_tensor(), "gloo copy": copy if regathers else 0}
    # after the last backward each unit is resharded, then its gradients move into the
    # reduce-scatter input (same bytes), which gloo copies once more
    sync = step.kept | {"gradients": carried, "unsharded params": elem * (unsharded - block)}
    sync |= {"unsharded grads": FP32 * unsharded, "reduce-scatter": FP32 * block // dims.dp}
    sync["gloo copy"] = FP32 * block if step.copies else 0
    return {"backward": backward, "later backward": later, "gradient sync": sync}
