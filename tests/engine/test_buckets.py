"""Bucketed gradient reduction (ZeRO-0/1/2): one collective per bucket, launched from backward.

Real gloo ranks. Step 2 of each layout runs under CommDebugMode (dp-only layouts, where every
collective of a forward/backward is a gradient reduction) or is counted by the reducer (tp and
pp layouts, whose activations also travel in collectives). Small buckets (0.25 MiB) cut the
tiny GPT into ~20 buckets, so "one collective for everything" or "one per parameter" both fail.
The results equal the single-process run: test_parity.py and tests/train run every layout with
the same bucket size.
"""

from __future__ import annotations

import pytest
import torch

from distlaunch.engine.model import GPT, PRESETS
from distlaunch.engine.parallel.buckets import plan_buckets
from distlaunch.training.config import load_config
from distlaunch.training.dims import resolve_parallel_dims
from distlaunch.training.planner.step import rank_buckets
from tests.engine.harness import run_layouts
from tests.engine.test_parity import BASE, LOSS_RTOL

BASE_2 = [*BASE, "train.steps=3"]
ACCUM = ["train.grad_accum_steps=2"]
DP_ONLY = {  # 2 ranks: every collective is counted
    "zero0-accum2": ["parallel.zero=0", *ACCUM],
    "zero1-accum2": ["parallel.zero=1", *ACCUM],
    "zero2": ["parallel.zero=2"],
    "zero2-accum2": ["parallel.zero=2", *ACCUM],
}
MIXED = {  # 4 ranks: the reducer's own count (tp all-reduces and pp sends are not gradients)
    "dp2-tp2-zero0-accum2": ["parallel.tp=2", *ACCUM],
    "dp2-pp2-zero1-accum2": ["parallel.pp=2", "parallel.zero=1", *ACCUM],
    "dp2-pp2-interleaved-zero2": ["parallel.pp=2", "parallel.schedule='interleaved'", "parallel.zero=2"],
}


@pytest.fixture(scope="module")
def dp_only(tmp_path_factory):
    return run_layouts(tmp_path_factory.mktemp("buckets2"), 2, BASE_2, DP_ONLY, count_comms=True)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return run_layouts(tmp_path_factory.mktemp("buckets4"), 4, BASE_2, MIXED)


def _launches_allowed(stats: dict) -> int:
    """One per bucket and step; ZeRO-2 reduces (and frees) after every backward of the step."""
    return stats["buckets"] * (stats["backwards"] if stats["per_round"] else 1)


@pytest.mark.parametrize("name", list(DP_ONLY))
def test_one_collective_per_bucket_launched_during_backward(dp_only, name):
    for rank in dp_only[name]:
        stats = rank["reduction"]
        assert stats["buckets"] >= 10, stats
        assert stats["per_round"] == ("zero=2" in DP_ONLY[name][0]), stats
        # every collective of the step (counted at dispatch) is the reducer's, one per bucket
        assert stats["comms"] == stats["collectives"] <= _launches_allowed(stats), stats
        # all but the held last bucket (zero=0 carries the loss in it) left from a backward hook
        assert stats["in_backward"] >= stats["collectives"] - 1, stats


@pytest.mark.parametrize("name", list(DP_ONLY))
def test_the_optimizer_step_gathers_the_parameters_one_bucket_at_a_time(dp_only, name):
    """ZeRO-1/2 all-gather the updated slices with one collective per gradient bucket (not one
    per parameter: ~45 on this GPT); ZeRO-0's step needs none."""
    for rank in dp_only[name]:
        stats = rank["reduction"]
        want = stats["buckets"] if "zero=0" not in DP_ONLY[name][0] else 0
        assert stats["step_comms"] == want, stats


@pytest.mark.parametrize("name", list(MIXED))
def test_buckets_with_tensor_and_pipeline_parallel(mixed, name):
    for rank in mixed[name]:
        stats = rank["reduction"]
        assert stats["buckets"] >= 4, stats
        assert 0 < stats["collectives"] <= _launches_allowed(stats), stats
        assert stats["in_backward"] == stats["collectives"], stats  # nothing waited for the sync


def test_fp32_layouts_hold_fp32_parameters_updated_in_place(dp_only, mixed):
    """fp32: the parameters are their own master weights (the optimizer updates them, or views
    into them for ZeRO-1/2); bf16's separate masters are tests/engine/test_precision.py's."""
    for results in (dp_only, mixed):
        for name, ranks in results.items():
            for rank in ranks:
                assert rank["param_dtypes"] == rank["optimizer_dtypes"] == ["torch.float32"], name


def test_bucketed_layouts_agree_with_each_other(dp_only, mixed):
    """Same global batch, same steps: every layout reports the same losses (the single-process
    comparison for each layout is test_parity.py's)."""
    ref = dp_only["zero0-accum2"][0]["losses"]
    for results in (dp_only, mixed):
        for name, ranks in results.items():
            for a, b in zip(ranks[0]["losses"], ref, strict=True):
                assert abs(a - b) <= LOSS_RTOL * abs(b), (name, ranks[0]["losses"], ref)


@pytest.mark.parametrize("bucket_mb", [0.25, 1.0, 25.0])
def test_the_memory_planner_cuts_the_buckets_the_reducer_cuts(bucket_mb):
    """The planner counts bucket buffers from the preset's shapes (no torch); its buckets must be the
    reducer's, tensor for tensor, or its in-flight bytes describe another job."""
    model = PRESETS["small"]
    with torch.device("meta"):
        params = list(GPT(model).parameters())
    dims = resolve_parallel_dims(load_config(None, ["model.preset='small'"]), model, 1)
    reducer = [[p.numel() for p in bucket] for bucket in plan_buckets([params], int(bucket_mb * 2**20))]
    planned = [[t.numel for t in bucket.tensors] for bucket in rank_buckets(model, dims, 0, bucket_mb)]
    assert planned == reducer
    assert len(reducer) > 1
