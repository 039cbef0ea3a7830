"""Step-time cost model: how long one training step of a layout takes, term by term, from the preset's
shapes, the layout's rank placement and a few measured (or tabled) rates. Pure arithmetic, no torch.

The inputs are plain numbers (``Rates``): one device's sustained matmul rate, and the bandwidth and latency
of a link inside a host and between hosts. A preflight probe, the doctor's all-reduce benchmark or a bench
can fill them in; nothing here reads a global. A step is the slowest pipeline stage's:

- compute: the stage's FLOPs (forward, backward, and the recomputed forward with activation checkpointing)
  over tp ranks, at the sustained rate;
- the pipeline bubble: (pp-1)/virtual_stages micro-batch times per accumulation round (GPipe and 1F1B idle
  alike; interleaving divides the bubble by the chunks per rank);
- every collective of the step: its bytes over the bandwidth of the link it crosses, plus a latency per
  message. A group whose ranks sit on several hosts crosses the network, and shares each host's link with
  the other groups of its axis that cross from that host at the same moment;
- overlap where the engine overlaps: ZeRO-0/1/2's bucketed gradient reduction runs beside the backward that
  produces the buckets (all but the last bucket can hide behind it). Everything else (tp all-reduces, pp
  sends, ZeRO-3's gathers and reduce-scatters, ZeRO-1/2's parameter all-gathers) blocks the step.

docs/choosing-a-layout.md says where the model is wrong.
"""

from __future__ import annotations

from math import ceil

from pydantic import BaseModel, computed_field

from distlaunch.contract.layout import groups
from distlaunch.training.bucketing import ALL_REDUCE_BACKENDS
from distlaunch.training.config import TrainSection
from distlaunch.training.dims import ParallelDims
from distlaunch.training.planner.shapes import FP32, block_numel, holds_last_stage, rank_layers, rank_stages
from distlaunch.training.precision import ELEMENT_BYTES, hidden_dtype_name, model_dtype_name, reduce_dtype_name
from distlaunch.training.presets import GPTConfig

BACKWARD_SHARE = 2 / 3  # of a block's compute without checkpointing: backward costs twice the forward


class Rates(BaseModel):
    """What the hardware does: one device's sustained FLOP/s, and each link's bytes/s and seconds per message.
    ``inter_bytes_s`` is one host's network link, shared by its ranks that cross it at the same moment."""

    flops: float
    intra_bytes_s: float
    inter_bytes_s: float
    intra_latency_s: float
    inter_latency_s: float


class CostTerm(BaseModel):
    """One term of a step: what it is, the seconds it adds to the step, and the link it crosses (if any)."""

    name: str
    seconds: float
    link: str | None = None  # "inside a host", "between hosts"


class StepCost(BaseModel):
    """A layout's predicted step: its terms, their sum and the tokens per second it trains."""

    terms: list[CostTerm]
    tokens: int  # per step, over every replica

    @computed_field
    @property
    def step_s(self) -> float:
        return sum(t.seconds for t in self.terms)

    @computed_field
    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s if self.step_s > 0 else 0.0

    @computed_field
    @property
    def dominant(self) -> str:
        """The largest term in words: ``62% of the step: ZeRO-3 all-gathers between hosts``."""
        top = max(self.terms, key=lambda t: t.seconds)
        where = f" {top.link}" if top.link else ""
        return f"{top.seconds / self.step_s:.0%} of the step: {top.name}{where}"


# ---- collectives: ring algorithms, the bytes each rank sends (NCCL's bus bandwidth convention)


def all_reduce_s(nbytes: float, n: int, bytes_s: float, latency_s: float) -> float:
    """A ring all-reduce of ``nbytes`` over ``n`` ranks: 2(n-1)/n of the bytes, 2(n-1) messages."""
    return 0.0 if n == 1 else 2 * (n - 1) / n * nbytes / bytes_s + 2 * (n - 1) * latency_s


def shard_collective_s(nbytes: float, n: int, bytes_s: float, latency_s: float) -> float:
    """A ring all-gather or reduce-scatter whose full (unsharded) buffer is ``nbytes``: (n-1)/n of them."""
    return 0.0 if n == 1 else (n - 1) / n * nbytes / bytes_s + (n - 1) * latency_s


def reduce_scatter_s(nbytes: float, n: int, backend: str, bytes_s: float, latency_s: float) -> float:
    """A reduce-scatter whose full buffer is ``nbytes``. A backend without one of its own (gloo,
    ``ALL_REDUCE_BACKENDS``) gets the buffer all-reduced instead (``parallel/wire.py``, ``parallel/units.py``):
    twice the bytes and the messages."""
    if backend in ALL_REDUCE_BACKENDS:
        return all_reduce_s(nbytes, n, bytes_s, latency_s)
    return shard_collective_s(nbytes, n, bytes_s, latency_s)


class Link(BaseModel):
    """The link one axis's groups use: its bandwidth per group, its latency, and what it is in words."""

    bytes_s: float
    latency_s: float
    where: str


def axis_link(dims: ParallelDims, axis: str, host_of_rank: list, rates: Rates) -> Link:
    """The link a collective over ``axis`` crosses. A group inside a host uses the intra-host link; one that
    spans hosts uses the network, each host's link shared by the groups of the axis that cross from it (a
    host-ordered ring leaves each host once)."""
    crossing: dict = {}
    for group in groups(dims)[axis]:
        hosts = {host_of_rank[r] for r in group}
        if len(hosts) > 1:
            for host in hosts:
                crossing[host] = crossing.get(host, 0) + 1
    if not crossing:
        return Link(bytes_s=rates.intra_bytes_s, latency_s=rates.intra_latency_s, where="inside a host")
    share = rates.inter_bytes_s / max(crossing.values())
    return Link(bytes_s=min(share, rates.intra_bytes_s), latency_s=rates.inter_latency_s, where="between hosts")


def pp_link(dims: ParallelDims, host_of_rank: list, rates: Rates) -> Link:
    """The slowest link between two neighbouring stages: a boundary between hosts is shared by every rank of
    the stage that sends across it at once (dp·tp of them, as many as sit on the host)."""
    if dims.pp == 1:
        return Link(bytes_s=rates.intra_bytes_s, latency_s=rates.intra_latency_s, where="inside a host")
    senders: dict = {}
    for group in groups(dims)["pp"]:
        for stage, rank in enumerate(group):
            after = group[(stage + 1) % dims.pp]  # interleaving wraps from the last stage to the first
            if host_of_rank[rank] != host_of_rank[after] and (stage + 1 < dims.pp or dims.virtual_stages > 1):
                senders[host_of_rank[rank]] = senders.get(host_of_rank[rank], 0) + 1
    if not senders:
        return Link(bytes_s=rates.intra_bytes_s, latency_s=rates.intra_latency_s, where="inside a host")
    share = rates.inter_bytes_s / max(senders.values())
    return Link(bytes_s=min(share, rates.intra_bytes_s), latency_s=rates.inter_latency_s, where="between hosts")


# ---- compute


def forward_flops(model: GPTConfig, layers: int, last: bool, tokens: int, seq_len: int) -> float:
    """Forward FLOPs of ``layers`` blocks (and the LM head on the last stage) for ``tokens`` tokens: 2 per
    multiply-add of each weight matrix, plus attention's scores and weighted sum (4·seq·d per token)."""
    d = model.d_model
    per_block = 2 * (4 + 2 * model.mlp_ratio) * d * d + 4 * seq_len * d
    head = 2 * d * model.vocab_size if last else 0
    return tokens * (layers * per_block + head)


def stage_compute_s(model: GPTConfig, dims: ParallelDims, pp_rank: int, train: TrainSection, rates: Rates) -> float:
    """One pp rank's compute in a step: forward, backward (twice the forward) and, with activation
    checkpointing, the blocks' forward once more; split over the tp ranks."""
    tokens = dims.micro_batch_size * train.seq_len * dims.microbatches * dims.accum_steps
    layers, last = rank_layers(model, dims, pp_rank), holds_last_stage(dims, pp_rank)
    flops = 3 * forward_flops(model, layers, last, tokens, train.seq_len)
    if train.activation_checkpointing:
        flops += forward_flops(model, layers, False, tokens, train.seq_len)
    return flops / dims.tp / rates.flops


# ---- the terms


def rank_numel(model: GPTConfig, dims: ParallelDims, pp_rank: int) -> int:
    """Parameters a rank holds after tp and pp (``shapes.rank_tensors``' sum, counted by shape)."""
    d, v = model.d_model, model.vocab_size // dims.tp
    stages = rank_stages(dims, pp_rank)
    first = (v + model.max_seq_len) * d if 0 in stages else 0  # token and position embeddings
    last = (2 + v) * d if dims.n_stages - 1 in stages else 0  # the final norm and the head
    return rank_layers(model, dims, pp_rank) * block_numel(model, dims.tp) + first + last


def tp_term(model: GPTConfig, dims: ParallelDims, pp_rank: int, train: TrainSection, link: Link) -> float:
    """Tensor parallel's all-reduces per micro-batch, of one hidden state each: two per block forward (attention's
    and the MLP's outputs), two in its backward, two more in a recomputed forward; one for the
    vocabulary-parallel embedding on the first stage, and on the last one for the head's input gradient. There
    the vocabulary-parallel cross-entropy adds three of one figure a token (the logits' max, the sum of their
    exponentials, the target's logit: DTensor's ``loss_parallel``)."""
    if dims.tp == 1:
        return 0.0
    per_block = 6 if train.activation_checkpointing else 4
    last = holds_last_stage(dims, pp_rank)
    count = per_block * rank_layers(model, dims, pp_rank) + (1 if pp_rank == 0 else 0) + (1 if last else 0)
    tokens = dims.micro_batch_size * train.seq_len
    hidden = tokens * model.d_model * ELEMENT_BYTES[train.precision]
    one = count * all_reduce_s(hidden, dims.tp, link.bytes_s, link.latency_s)
    loss = 3 * all_reduce_s(tokens * FP32, dims.tp, link.bytes_s, link.latency_s) if last else 0.0
    return dims.microbatches * dims.accum_steps * (one + loss)


def pp_term(model: GPTConfig, dims: ParallelDims, train: TrainSection, link: Link) -> float:
    """Pipeline sends on a rank's path: per micro-batch and chunk, the activation forward and its gradient
    backward, one hidden state each (blocking sends: nothing overlaps them)."""
    if dims.pp == 1:
        return 0.0
    element = ELEMENT_BYTES[hidden_dtype_name(train.precision, dims.zero)]
    hidden = dims.micro_batch_size * train.seq_len * model.d_model * element
    sends = 2 * dims.microbatches * dims.accum_steps * dims.virtual_stages
    return sends * (hidden / link.bytes_s + link.latency_s)


def bubble_term(dims: ParallelDims, busy_s: float) -> float:
    """The pipeline's idle time: (pp-1) micro-batch times per accumulation round, divided by the chunks
    each rank runs (interleaved); ``busy_s`` is the stage's whole step of compute and tp all-reduces."""
    if dims.pp == 1:
        return 0.0
    per_micro = busy_s / (dims.microbatches * dims.accum_steps)
    return dims.accum_steps * (dims.pp - 1) * per_micro / dims.virtual_stages


def exposed(comm_s: float, last_bucket_s: float, window_s: float) -> float:
    """What a reduction launched bucket by bucket from backward adds to the step: what the backward's
    ``window_s`` cannot hide, and at least the last bucket, which launches when backward is over."""
    return max(last_bucket_s, comm_s - window_s) if comm_s > 0 else 0.0


def dp_terms(
    model: GPTConfig, dims: ParallelDims, pp_rank: int, train: TrainSection, backend: str, link: Link, compute_s: float
) -> list[tuple[str, float]]:
    """The data-parallel collectives of one pp rank's step, by ZeRO stage (``parallel/zero.py``, ``data.py``)."""
    if dims.dp == 1:
        return []
    numel = rank_numel(model, dims, pp_rank)
    grads = numel * ELEMENT_BYTES[reduce_dtype_name(train.precision, train.reduce_dtype)]
    params = numel * ELEMENT_BYTES[model_dtype_name(train.precision, dims.zero)]
    n, rounds = dims.dp, dims.microbatches * dims.accum_steps
    bucket = min(grads, int(train.bucket_mb * 2**20) * grads // (FP32 * numel))  # one bucket, on the wire
    buckets = max(1, ceil(grads / max(bucket, 1)))
    backward = compute_s * (1 - 1 / 4 if train.activation_checkpointing else BACKWARD_SHARE)
    if dims.zero == 3:
        gathered = ELEMENT_BYTES[train.precision]  # FSDP2 gathers in the autocast dtype
        units = rank_layers(model, dims, pp_rank) + 2  # a unit per block, the embeddings, the head
        gather = shard_collective_s(numel * gathered, n, link.bytes_s, link.latency_s * units)
        scatters = rounds if dims.pp == 1 else dims.accum_steps  # with pp: once per round, after its last backward
        scatter = reduce_scatter_s(numel * FP32, n, backend, link.bytes_s, link.latency_s * units)
        return [("ZeRO-3 all-gathers", 2 * rounds * gather), ("ZeRO-3 reduce-scatters", scatters * scatter)]

    def reduce(nbytes: float, latency_s: float) -> float:  # ZeRO-0 all-reduces; ZeRO-1/2 reduce-scatter
        if dims.zero == 0:
            return all_reduce_s(nbytes, n, link.bytes_s, latency_s)
        return reduce_scatter_s(nbytes, n, backend, link.bytes_s, latency_s)

    one = reduce(grads, link.latency_s * buckets)
    last = reduce(bucket, link.latency_s)
    if dims.zero == 2:  # every round's backward launches its buckets
        reduction = rounds * exposed(one, last, backward / rounds)
    else:  # once per step, beside the last round's backward
        reduction = exposed(one, last, backward / rounds)
    terms = [("gradient reduction", reduction)]
    if dims.zero in (1, 2):
        gather = shard_collective_s(params, n, link.bytes_s, link.latency_s * buckets)
        terms.append(("parameter all-gathers", gather))
    return terms


def norm_term(dims: ParallelDims, train: TrainSection, hosts: int, rates: Rates) -> CostTerm:
    """The gradient norm for clipping: one scalar all-reduced over every rank, latency alone."""
    latency, where = (rates.inter_latency_s, "between hosts") if hosts > 1 else (rates.intra_latency_s, "inside a host")
    seconds = 0.0 if train.grad_clip == 0 else all_reduce_s(FP32, dims.world_size, rates.intra_bytes_s, latency)
    return CostTerm(name="gradient norm", seconds=seconds, link=where)


def stage_terms(
    model: GPTConfig, dims: ParallelDims, pp_rank: int, train: TrainSection, backend: str, rates: Rates, links: dict
) -> list[CostTerm]:
    """One pp rank's step, term by term (``links``: each axis's ``Link``, from ``axis_link`` and ``pp_link``)."""
    compute = stage_compute_s(model, dims, pp_rank, train, rates)
    tp = tp_term(model, dims, pp_rank, train, links["tp"])
    terms = [
        CostTerm(name="compute", seconds=compute),
        CostTerm(name="tp all-reduces", seconds=tp, link=links["tp"].where),
        CostTerm(name="pipeline bubble", seconds=bubble_term(dims, compute + tp)),
        CostTerm(name="pp sends", seconds=pp_term(model, dims, train, links["pp"]), link=links["pp"].where),
    ]
    for name, seconds in dp_terms(model, dims, pp_rank, train, backend, links["dp"], compute):
        terms.append(CostTerm(name=name, seconds=seconds, link=links["dp"].where))
    return terms


def layout_links(dims: ParallelDims, host_of_rank: list, rates: Rates) -> dict[str, Link]:
    """The link each axis's collectives cross, for the layout's degrees (the same for every pipeline choice)."""
    links = {axis: axis_link(dims, axis, host_of_rank, rates) for axis in ("tp", "dp")}
    return links | {"pp": pp_link(dims, host_of_rank, rates)}


def step_cost(
    model: GPTConfig,
    dims: ParallelDims,
    train: TrainSection,
    backend: str,
    host_of_rank: list,
    rates: Rates,
    links: dict[str, Link] | None = None,
) -> StepCost:
    """The predicted step of a layout: the slowest pp rank's terms, and the gradient norm. ``host_of_rank``:
    each global rank's host (any key), as the plan places them; ``links``: ``layout_links``, if known."""
    links = links or layout_links(dims, host_of_rank, rates)
    stages = [stage_terms(model, dims, i, train, backend, rates, links) for i in range(dims.pp)]
    slowest = max(stages, key=lambda terms: sum(t.seconds for t in terms))
    norm = norm_term(dims, train, len(set(host_of_rank)), rates)
    tokens = dims.dp * dims.micro_batch_size * dims.microbatches * dims.accum_steps * train.seq_len
    return StepCost(terms=[t for t in [*slowest, norm] if t.seconds > 0], tokens=tokens)
