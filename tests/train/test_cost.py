"""The layout cost model, term by term against hand arithmetic, and the search it feeds (pure, no torch)."""

from __future__ import annotations

import pytest

from distlaunch.training.config import TrainSection, load_config
from distlaunch.training.dims import ParallelDims
from distlaunch.training.planner.cost import (
    Link,
    Rates,
    all_reduce_s,
    axis_link,
    bubble_term,
    dp_terms,
    exposed,
    forward_flops,
    pp_link,
    pp_term,
    reduce_scatter_s,
    shard_collective_s,
    stage_compute_s,
    step_cost,
    tp_term,
)
from distlaunch.training.planner.search import LayoutCost, LayoutSearch, faster_layout, search_layouts
from distlaunch.training.presets import PRESETS, GPTConfig

# small enough to count by hand: d=4, 4x MLP, 8 tokens of vocabulary
MODEL = GPTConfig(n_layer=2, n_head=2, d_model=4, vocab_size=8, max_seq_len=8)
RATES = Rates(flops=1e3, intra_bytes_s=100.0, inter_bytes_s=10.0, intra_latency_s=1.0, inter_latency_s=2.0)
TRAIN = TrainSection(seq_len=8, grad_clip=1.0)


def dims(dp=1, tp=1, pp=1, zero=0, m=1, mbs=1, schedule="1f1b", v=1, accum=1) -> ParallelDims:
    return ParallelDims(
        dp=dp, tp=tp, pp=pp, zero=zero, schedule=schedule, virtual_stages=v, microbatches=m,
        micro_batch_size=mbs, accum_steps=accum,
    )  # fmt: skip


def test_forward_flops_count_every_matmul_and_attention():
    # a block per token: 2 x (4 + 2*4) x d^2 = 384 for its weights, 4 x seq x d = 128 for attention's
    # scores and weighted sum; the head: 2 x d x vocab = 64
    assert forward_flops(MODEL, layers=2, last=True, tokens=16, seq_len=8) == 16 * (2 * 512 + 64)
    assert forward_flops(MODEL, layers=1, last=False, tokens=1, seq_len=8) == 512


def test_compute_is_three_forwards_over_tp_and_a_fourth_with_checkpointing():
    d = dims(tp=2, m=2)  # 2 micro-batches of 1 sequence of 8 tokens
    tokens = 2 * 8
    forward = tokens * (2 * 512 + 64)
    assert stage_compute_s(MODEL, d, 0, TRAIN, RATES) == pytest.approx(3 * forward / 2 / 1e3)
    ckpt = TRAIN.model_copy(update={"activation_checkpointing": True})
    assert stage_compute_s(MODEL, d, 0, ckpt, RATES) == pytest.approx((3 * forward + tokens * 2 * 512) / 2 / 1e3)


def test_ring_collectives_send_their_share_of_the_bytes():
    assert all_reduce_s(100, 4, 10, 1) == pytest.approx(2 * 3 / 4 * 100 / 10 + 2 * 3 * 1)
    assert shard_collective_s(100, 4, 10, 1) == pytest.approx(3 / 4 * 100 / 10 + 3 * 1)
    assert all_reduce_s(100, 1, 10, 1) == shard_collective_s(100, 1, 10, 1) == 0


def test_a_group_across_hosts_shares_each_hosts_link_with_the_other_groups_crossing_it():
    d = dims(dp=2, tp=2)  # ranks 0,1 | 2,3 on two hosts: tp inside a host, both dp groups cross
    hosts = [0, 0, 1, 1]
    assert axis_link(d, "tp", hosts, RATES) == Link(bytes_s=100, latency_s=1, where="inside a host")
    assert axis_link(d, "dp", hosts, RATES) == Link(bytes_s=10 / 2, latency_s=2, where="between hosts")
    assert axis_link(d, "dp", [0, 0, 0, 0], RATES).where == "inside a host"


def test_pipeline_neighbours_on_two_hosts_share_the_link_of_the_stage_that_sends():
    d = dims(dp=2, pp=2, m=2)  # stage 0: ranks 0,1 on host 0; stage 1: ranks 2,3 on host 1
    assert pp_link(d, [0, 0, 1, 1], RATES) == Link(bytes_s=5, latency_s=2, where="between hosts")
    assert pp_link(d, [0, 1, 0, 1], RATES).where == "inside a host"  # each pipeline inside one host


def test_tp_all_reduces_four_per_block_one_for_the_embedding_and_the_heads_gradient_and_the_losss_three():
    d = dims(tp=2, m=2)
    hidden = 1 * 8 * 4 * 4  # micro-batch x seq x d x fp32
    one, loss = all_reduce_s(hidden, 2, 100, 1), all_reduce_s(8 * 4, 2, 100, 1)  # the loss's: a figure a token
    link = Link(bytes_s=100, latency_s=1, where="inside a host")
    assert tp_term(MODEL, d, 0, TRAIN, link) == pytest.approx(2 * ((4 * 2 + 1 + 1) * one + 3 * loss))
    staged = dims(tp=2, pp=2, m=2)  # a block a stage: the embedding on the first, the head and loss on the last
    assert tp_term(MODEL, staged, 0, TRAIN, link) == pytest.approx(2 * (4 + 1) * one)
    assert tp_term(MODEL, staged, 1, TRAIN, link) == pytest.approx(2 * ((4 + 1) * one + 3 * loss))


def test_pp_sends_one_hidden_state_each_way_per_micro_batch_and_chunk():
    d = dims(pp=2, m=4, schedule="interleaved", v=2, mbs=2)
    link = Link(bytes_s=10, latency_s=2, where="between hosts")
    hidden = 2 * 8 * 4 * 4
    assert pp_term(MODEL, d, TRAIN, link) == pytest.approx(2 * 4 * 2 * (hidden / 10 + 2))


def test_the_bubble_is_pp_minus_one_micro_batches_per_round_over_the_chunks():
    assert bubble_term(dims(pp=4, m=8), busy_s=8.0) == pytest.approx(3.0)  # 1 s a micro-batch
    assert bubble_term(dims(pp=4, m=8, schedule="interleaved", v=3), busy_s=8.0) == pytest.approx(1.0)
    assert bubble_term(dims(pp=4, m=4, accum=2), busy_s=8.0) == pytest.approx(2 * 3 * 1.0)
    assert bubble_term(dims(), busy_s=8.0) == 0


def test_the_bucketed_reduction_hides_behind_backward_but_for_its_last_bucket():
    assert exposed(10.0, last_bucket_s=1.0, window_s=4.0) == 6.0
    assert exposed(3.0, last_bucket_s=1.0, window_s=4.0) == 1.0
    assert exposed(0.0, last_bucket_s=0.0, window_s=4.0) == 0.0


def test_zero_stages_reduce_and_gather_what_the_engine_does():
    link = Link(bytes_s=10, latency_s=0, where="between hosts")
    numel = sum([8 * 4, 8 * 4, 2 * (4 * 4 + 3 * 16 + 16 + 2 * 64), 2 * 4, 8 * 4])  # embeddings, blocks, head
    grads = 4 * numel
    zero0 = dict(dp_terms(MODEL, dims(dp=2), 0, TRAIN, "nccl", link, compute_s=0.0))
    assert zero0 == {"gradient reduction": pytest.approx(all_reduce_s(grads, 2, 10, 0))}
    zero2 = dict(dp_terms(MODEL, dims(dp=2, zero=2, m=2), 0, TRAIN, "nccl", link, compute_s=0.0))
    assert zero2["gradient reduction"] == pytest.approx(2 * shard_collective_s(grads, 2, 10, 0))  # every round
    assert zero2["parameter all-gathers"] == pytest.approx(shard_collective_s(grads, 2, 10, 0))
    zero3 = dict(dp_terms(MODEL, dims(dp=2, zero=3, m=2), 0, TRAIN, "nccl", link, compute_s=0.0))
    assert zero3["ZeRO-3 all-gathers"] == pytest.approx(2 * 2 * shard_collective_s(grads, 2, 10, 0))
    assert zero3["ZeRO-3 reduce-scatters"] == pytest.approx(2 * shard_collective_s(grads, 2, 10, 0))
    assert dp_terms(MODEL, dims(), 0, TRAIN, "nccl", link, compute_s=1.0) == []


def test_on_gloo_every_reduce_scatter_is_an_all_reduce_as_the_engine_runs_it():
    """gloo has no reduce-scatter of its own: ZeRO-1/2's buckets and ZeRO-3's units are all-reduced whole."""
    link = Link(bytes_s=10, latency_s=1, where="between hosts")
    grads = 4 * sum([8 * 4, 8 * 4, 2 * (4 * 4 + 3 * 16 + 16 + 2 * 64), 2 * 4, 8 * 4])
    assert reduce_scatter_s(100, 4, "gloo", 10, 1) == all_reduce_s(100, 4, 10, 1)
    assert reduce_scatter_s(100, 4, "nccl", 10, 1) == shard_collective_s(100, 4, 10, 1)
    for zero in (1, 2):
        terms = dict(dp_terms(MODEL, dims(dp=2, zero=zero), 0, TRAIN, "gloo", link, compute_s=0.0))
        assert terms["gradient reduction"] == pytest.approx(all_reduce_s(grads, 2, 10, 1))  # one bucket
    zero3 = dict(dp_terms(MODEL, dims(dp=2, zero=3, m=2), 0, TRAIN, "gloo", link, compute_s=0.0))
    units = 2 + 2  # the blocks, the embeddings, the head: one message each
    assert zero3["ZeRO-3 reduce-scatters"] == pytest.approx(2 * all_reduce_s(grads, 2, 10, 1 * units))


def test_a_step_is_its_slowest_stage_and_says_its_dominant_term():
    cost = step_cost(MODEL, dims(dp=2, zero=3), TRAIN, "nccl", [0, 1], RATES)
    names = [t.name for t in cost.terms]
    assert names[0] == "compute" and "ZeRO-3 all-gathers" in names and names[-1] == "gradient norm"
    assert cost.step_s == pytest.approx(sum(t.seconds for t in cost.terms))
    assert cost.tokens == 2 * 8 and cost.tokens_per_s == pytest.approx(16 / cost.step_s)
    top = max(cost.terms, key=lambda t: t.seconds)
    assert cost.dominant == f"{top.seconds / cost.step_s:.0%} of the step: {top.name}" + (
        f" {top.link}" if top.link else ""
    )


def _tiny(world: int):
    cfg = load_config(None, ["train.global_batch_size=16", "train.micro_batch_size=auto"])
    return search_layouts(PRESETS["tiny"], cfg, [0] * world, "gloo", 2**30, RATES)


def test_the_search_orders_layouts_by_predicted_step_and_plans_their_memory():
    search = _tiny(4)
    steps = [b.cost.step_s for b in search.best]
    assert len(search.best) == 5 and steps == sorted(steps)
    assert all(b.peak_bytes and b.missing_bytes is None for b in search.best)
    assert search.considered > len(search.best) and search.nearest is None


def test_the_search_keeps_a_resumed_jobs_degrees_and_names_the_nearest_fit_when_none_fits():
    cfg = load_config(None, ["train.global_batch_size=16", "train.micro_batch_size=auto"])
    kept = search_layouts(PRESETS["tiny"], cfg, [0] * 4, "gloo", 2**30, RATES, keep=(2, 1, 2, 1))
    assert kept.best and all(b.parallel.startswith("dp=2,tp=1,pp=2,zero=1,") for b in kept.best)
    none = search_layouts(PRESETS["tiny"], cfg, [0] * 4, "gloo", 2**20, RATES)
    assert none.best == [] and none.nearest is not None and none.nearest.missing_bytes > 0


def test_a_layout_is_named_faster_only_at_1_2_times_or_more():
    def entry(step: float) -> LayoutCost:
        cost = step_cost(MODEL, dims(), TRAIN, "gloo", [0], RATES.model_copy(update={"flops": 1e3 / step}))
        return LayoutCost(parallel="dp=1", activation_checkpointing=False, micro_batch_size=1, cost=cost)

    search = LayoutSearch(considered=2, best=[entry(1.0)])
    assert faster_layout(entry(1.3), search) is not None
    assert faster_layout(entry(1.1), search) is None
