"""What lives only inside a step, moment by moment: activations, gradients being produced and
the buffers around them (gradient buckets in flight, ZeRO-3's unsharded units and collective
buffers, 16-bit weight copies).

Activations and buffers peak at different moments (with ZeRO-0/1/2 the buckets are all in flight
at the end of backward, when the activations are gone), so each moment is summed on its own and
the step's peak is the largest one. Each moment follows the engine and torch's FSDP2 and pipeline
schedules; tests/train measures the peak on every rank of the parity layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import ceil

from distlaunch.training.bucketing import ALL_REDUCE_BACKENDS, GATHERS_IN_FLIGHT, cut_buckets
from distlaunch.training.config import TrainSection
from distlaunch.training.dims import ParallelDims, shards_vocab_over_dp
from distlaunch.training.planner.activations import activation_bytes, chunks_take_turns, later_in_flight
from distlaunch.training.planner.shapes import (
    FP32,
    TENSORS_PER_BLOCK,
    Tensor,
    block_numel,
    gathered_numel,
    head_unit_numel,
    rank_layers,
    rank_stages,
    rank_tensors,
    stage_tensors,
    state_bytes,
    unsharded_numel,
    vocab_tables_numel,
)
from distlaunch.training.precision import ELEMENT_BYTES, model_dtype_name, reduce_dtype_name
from distlaunch.training.presets import GPTConfig

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
class GradBucket:
    """One gradient bucket of a rank: its tensors, and whether it is still filling when the
    first block's backward peaks (see ``rank_buckets``)."""

    tensors: list[Tensor]
    late: bool

    def flat_bytes(self, element: int = FP32) -> int:
        """ZeRO-0's flat copy of the bucket's gradients, ``element`` bytes each (the reduce dtype)."""
        return element * sum(t.numel for t in self.tensors)

    def send_bytes(self, dp: int, element: int = FP32) -> int:
        """ZeRO-1/2's (dp, slots) send buffer: every tensor padded to dp equal slots."""
        return element * sum(dp * ceil(t.numel / dp) for t in self.tensors)


def rank_buckets(model: GPTConfig, dims: ParallelDims, pp_rank: int, bucket_mb: float) -> list[GradBucket]:
    """The buckets the engine's reducer cuts (``bucketing.cut_buckets``), one model chunk at a
    time. Backward produces the gradients of the rank's first chunk's first block and of the
    embeddings (stage 0) last; that block's backward peaks in its MLP, once only its
    down-projection's gradient is there: buckets holding any of the others are still filling."""
    out = []
    for k, stage in enumerate(rank_stages(dims, pp_rank)):
        tensors = stage_tensors(model, stage, dims.n_stages, dims.tp)
        # in definition order: the embeddings, then the block's norms, attention, fc, proj
        late = (2 if stage == 0 else 0) + TENSORS_PER_BLOCK - 1 if k == 0 else 0
        for bucket in cut_buckets([FP32 * t.numel for t in tensors], int(bucket_mb * 2**20)):
            out.append(GradBucket([tensors[i] for i in bucket], late=min(bucket) < late))
    return out


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

    @cached_property
    def vocab_over_dp(self) -> bool:
        """ZeRO-3 shards the vocabulary tables over dp (``dims.shards_vocab_over_dp``): never gathered."""
        return shards_vocab_over_dp(self.dims, self.train.seq_len, self.model.vocab_size)

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

    @property
    def all_reduces(self) -> bool:
        """Whether ZeRO-1 all-reduces each bucket in place instead of reduce-scattering it (gloo)."""
        return self.dims.zero == 1 and self.backend in ALL_REDUCE_BACKENDS

    @property
    def reduce_element(self) -> int:
        """Bytes of one gradient element on the wire (``train.reduce_dtype``: bf16 halves them)."""
        return ELEMENT_BYTES[reduce_dtype_name(self.train.precision, self.train.reduce_dtype)]

    @cached_property
    def buckets(self) -> list[GradBucket]:
        return rank_buckets(self.model, self.dims, self.pp_rank, self.train.bucket_mb)

    def gathers(self) -> int:
        """ZeRO-1/2's parameter all-gathers, ``GATHERS_IN_FLIGHT`` buckets at a time: each sends
        this rank's slots and receives every rank's, in the parameters' dtype."""
        dims = self.dims
        if dims.zero not in (1, 2):
            return 0
        element = ELEMENT_BYTES[model_dtype_name(self.train.precision, dims.zero)]
        largest = sorted((b.send_bytes(dims.dp) for b in self.buckets), reverse=True)[:GATHERS_IN_FLIGHT]
        return sum(largest) // FP32 * element * (dims.dp + 1) // dims.dp


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
    - optimizer step: gradients beside the kept state (the fused AdamW update makes no temporaries)
      and, ZeRO-1/2, the buffers of the parameter all-gathers that follow it.
    """
    step = RankStep(model, dims, pp_rank, dp_rank, train, backend)
    moments = zero3_moments(step) if dims.zero == 3 else bucket_moments(step)
    moments["optimizer step"] = step.kept | {"gradients": step.state[1], "parameter all-gathers": step.gathers()}
    return moments


def unsharded_grad_numel(model: GPTConfig, dims: ParallelDims, pp_rank: int, vocab_over_dp: bool = False) -> int:
    """Gradients ZeRO-3 with pp holds unsharded at once: each chunk accumulates its micro-batches'
    gradients unsharded until its last backward. One chunk per rank: the whole stage. Interleaved
    chunks are reduce-scattered one by one, right after their own last backward (torch's runtime
    schedule inserts a REDUCE_GRAD there); with one round of pp micro-batches a chunk's backwards
    all come before the next chunk's first, so only one chunk's are unsharded at a time. Vocabulary
    tables sharded over dp have only their shard's gradient, counted with the kept state."""
    chunks = [
        sum(t.numel for t in stage_tensors(model, s, dims.n_stages, dims.tp))
        - vocab_tables_numel(model, s, dims.n_stages, vocab_over_dp)
        for s in rank_stages(dims, pp_rank)
    ]
    if dims.virtual_stages > 1 and chunks_take_turns(dims):
        return max(chunks)
    return sum(chunks)


def bucket_moments(step: RankStep) -> dict[str, dict[str, int]]:
    """ZeRO-0/1/2: every bucket launches its collective from backward and keeps its buffers
    until the sync (or, stage 2, its next launch) waits for it: at the end of backward, all do.
    Stage 0 all-reduces a flat copy of a bucket's gradients (a bucket of one tensor, in place:
    no copy), and so does stage 1 on gloo (``RankStep.all_reduces``); stages 1/2 reduce-scatter a
    (dp, slots) send buffer into slots (gloo copies the send buffer, so one bucket is there twice
    while it launches).
    """
    dims, grads, element = step.dims, step.state[1], step.reduce_element
    earlier = dims.microbatches * dims.accum_steps > 1  # backwards before the last one
    sends = element * sum(dims.dp * ceil(t.numel / dims.dp) for t in step.tensors)
    bucket = bucket_bytes(step.tensors, step.train.bucket_mb)  # its fp32 gradients
    weights16 = unsharded_16bit_weights(step.model, dims, step.pp_rank, step.train.precision)
    backward = step.kept | {"activations": step.activations(), "autocast weights": weights16}
    # stage 2's kept gradients are the slots its reduce-scatters write, there from the first one on
    sync = step.kept | {"gradients": grads if dims.zero < 2 or earlier else 0}
    # the first block's backward: the buckets that do not wait for it are in flight (stage 2 after
    # earlier backwards: all of them, the waiting ones still from the previous backward)
    early = [b for b in step.buckets if not b.late or (dims.zero == 2 and earlier)]
    sync["buckets in flight"] = in_flight_bytes(step, step.buckets)
    in_flight_early = in_flight_bytes(step, early)
    if earlier and dims.zero < 2:
        # the full gradients exist; each new one is added into them from a temporary
        backward |= {"gradients": grads, "gradient temporary": step.largest_tensor()}
    elif earlier:
        # stage 2 reduces after every backward: the previous one's buckets are in flight, and the
        # one launching holds its full-size gradients besides its send buffer
        send = bucket // FP32 * element
        backward |= {"gradients": grads, "buckets in flight": sends + bucket + send * step.copies}
    # the backward of the first block: one block's activations (checkpointing: recomputed) are
    # alive again beside the gradients of all the others, most buckets already in flight
    first_block = rank_layers(step.model, dims, step.pp_rank) - 1
    end = sync | {"buckets in flight": in_flight_early, "activations": step.activations(done=first_block, in_flight=1)}
    return {"backward": backward, "first block's backward": end, "gradient sync": sync}


def in_flight_bytes(step: RankStep, buckets: list[GradBucket]) -> int:
    """The buffers of ``buckets``' collectives while they are in flight."""
    dims, element = step.dims, step.reduce_element
    if dims.zero == 0 or step.all_reduces:
        # the flat copy of a bucket of several tensors (all-reduced in place); none with dp=1.
        # With plain data parallelism the loss rides in the last bucket, which then copies too. A
        # 16-bit reduction casts every bucket into a copy of its own.
        carries_loss = dims.tp == 1 and dims.pp == 1 and element == FP32
        cast = element != FP32
        copied = [b for b in buckets if cast or len(b.tensors) > 1 or (carries_loss and b is step.buckets[-1])]
        return sum(b.flat_bytes(element) for b in copied) if dims.dp > 1 else 0
    if not buckets:
        return 0
    # send buffers and the slots each rank receives, in the reduce dtype
    sends = sum(b.send_bytes(dims.dp, element) for b in buckets)
    gloo_copy = max(b.send_bytes(dims.dp, element) for b in buckets) if step.copies else 0
    return sends + sends // dims.dp + gloo_copy


def zero3_moments(step: RankStep) -> dict[str, dict[str, int]]:
    """ZeRO-3: FSDP2 all-gathers units (16-bit with bf16/fp16) and reduce-scatters their fp32
    gradients; the sharded gradients of earlier accumulation rounds are kept."""
    dims, model = step.dims, step.model
    elem = FP32 if step.train.precision == "fp32" else 2
    block = block_numel(model, dims.tp)
    unsharded = unsharded_numel(model, dims, step.pp_rank, step.vocab_over_dp)
    carried = step.state[1] if dims.accum_steps > 1 else 0
    copy = elem * block if step.copies else 0  # gloo's copy of the block it all-gathers
    backward = step.kept | {"gradients": carried, "activations": step.activations()}
    if dims.pp == 1:
        # the head's gradient is computed first and reduced with the root unit at the very end.
        # One block later, that block's activations and the logits are gone, but its gradients
        # are in their reduce-scatter.
        head = head_unit_numel(model, dims, step.pp_rank, step.vocab_over_dp)
        backward |= {"unsharded params": elem * unsharded, "unsharded grads": FP32 * head, "gloo copy": copy}
        # the head unit is resharded after its backward; its gradients wait in their reduce-scatter input
        later = backward | {"activations": step.activations(done=1), "unsharded grads": FP32 * (head + block)}
        later["unsharded params"] = elem * (unsharded - head)
        later["reduce-scatter"] = FP32 * block // dims.dp
        return {"backward": backward, "next block's backward": later}
    # pp: the first backward holds the most activations while FSDP gathers unit by unit as
    # above. Each backward leaves its units unsharded and accumulates into the stage's unsharded
    # gradients (fp32: FSDP2 accumulates in the reduce dtype), so a later backward has the whole
    # stage unsharded besides the activations still in flight; a forward in between reshards.
    gathered = gathered_numel(model, dims, step.pp_rank, step.vocab_over_dp)
    backward |= {"unsharded params": elem * gathered, "gloo copy": copy}
    in_flight, regathers = later_in_flight(dims, step.pp_rank)
    grads = unsharded_grad_numel(model, dims, step.pp_rank, step.vocab_over_dp)
    later = step.kept | {"gradients": carried, "activations": step.activations(in_flight=in_flight)}
    later |= {"unsharded params": elem * unsharded, "unsharded grads": FP32 * grads}
    later |= {"gradient temporary": step.largest_tensor(), "gloo copy": copy if regathers else 0}
    # after the last backward each unit is resharded, then its gradients move into the
    # reduce-scatter input (same bytes), which gloo copies once more
    sync = step.kept | {"gradients": carried, "unsharded params": elem * (unsharded - block)}
    sync |= {"unsharded grads": FP32 * grads, "reduce-scatter": FP32 * block // dims.dp}
    sync["gloo copy"] = FP32 * block if step.copies else 0
    return {"backward": backward, "later backward": later, "gradient sync": sync}
