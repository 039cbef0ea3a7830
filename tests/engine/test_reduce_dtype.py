"""``train.reduce_dtype``: what the gradients travel in, for every ZeRO stage, on real gloo ranks.

Each stage trains bf16 for 20 steps twice on 2 ranks, reducing in bf16 (the default when training
in bf16) and in fp32. Step 2's gradient collectives are counted at dispatch, with the bytes each
rank hands to them (``_worker.CollectiveCounter``): bf16 must send exactly half of fp32's, and the
loss curves must agree within bf16's tolerance.

Two accumulation rounds: one round's gradient of bf16 parameters is a bf16 value, which the cast
keeps exactly; their fp32 sum over rounds is not, so the bf16 reduction rounds before the sum
over ranks does (ZeRO-2 reduces every round, and rounds only there).
"""

from __future__ import annotations

import pytest
import torch

from distlaunch.engine.model import GPT, PRESETS
from distlaunch.training.config import load_config
from distlaunch.training.precision import reduce_dtype_name
from tests.engine.harness import run_layouts
from tests.engine.test_parity import BASE

pytestmark = pytest.mark.timeout(600)  # one job of 8 layouts x 20 steps: ~70 s idle, ~3 min on a busy 2-core machine

STEPS = 20
# the parity tests' base (32-token sequences; measured deviations 1.6e-4 to 3.2e-4, against 1.3e-4 to
# 2.4e-4 with 64)
BASE_20 = [*BASE, f"train.steps={STEPS}", "train.precision='bf16'", "train.grad_accum_steps=2"]
STAGES = (0, 1, 2, 3)
LAYOUTS = {
    f"zero{zero}-reduce-{reduce}": [
        f"parallel.zero={zero}",
        *([] if reduce == "bf16" else ["train.reduce_dtype='fp32'"]),
    ]
    for zero in STAGES
    for reduce in ("bf16", "fp32")  # bf16: left to the default
}
# the most a bf16 gradient reduction may move the loss from the fp32 reduction's, relative, at any of the 20
# steps: about one bf16 rounding (2**-9 ~ 2e-3), what rounding the reduced gradients costs and no more; the run's
# loss falls by >30% meanwhile, so the two curves are worth comparing
REDUCE_LOSS_RTOL = 2e-3
# the collectives that carry gradients
REDUCTIONS = ("allreduce_", "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_")
# the dp-averaged loss of ZeRO-0 and (on gloo, all-reducing) ZeRO-1: in the bucket with fp32, its own fp32
# all-reduce with bf16
LOSS_BYTES = 4


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_layouts(tmp_path_factory.mktemp("reduce_dtype"), 2, BASE_20, LAYOUTS, timeout=540, count_comms=True)


def _numel() -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(PRESETS["tiny"]).parameters())


def _reduced(comm_bytes: dict[str, int]) -> dict[str, int]:
    """Bytes handed to gradient reductions, by dtype."""
    out: dict[str, int] = {}
    for key, n in comm_bytes.items():
        op, dtype = key.split()
        if op in REDUCTIONS:
            out[dtype] = out.get(dtype, 0) + n
    return out


def test_the_default_follows_the_training_precision():
    """One rule, for every stage: bf16 training reduces in bf16, anything else in fp32, unless set."""
    assert reduce_dtype_name("bf16", None) == "bf16"
    assert reduce_dtype_name("fp32", None) == reduce_dtype_name("fp16", None) == "fp32"
    assert reduce_dtype_name("bf16", "fp32") == "fp32"
    assert load_config(None, ["train.reduce_dtype=auto"]).train.reduce_dtype is None


@pytest.mark.parametrize("zero", (0, 1, 2))
def test_bytes_per_step_halve_in_bf16(results, zero):
    """Every gradient element travels once per step (ZeRO-2: once per round), in 2 bytes instead of
    4 (2 ranks: no padding)."""
    numel = _numel()
    loss = {"torch.float32": LOSS_BYTES} if zero in (0, 1) else {}
    for reduce, elem in (("bf16", 2), ("fp32", 4)):
        for rank in results[f"zero{zero}-reduce-{reduce}"]:
            stats = rank["reduction"]
            got = _reduced(stats["comm_bytes"])
            dtype = f"torch.{'bfloat16' if reduce == 'bf16' else 'float32'}"
            want = {dtype: elem * numel * (stats["backwards"] if stats["per_round"] else 1)}
            for key, n in loss.items():
                want[key] = want.get(key, 0) + n
            assert got == want, (reduce, got, want)
    for name in (f"zero{zero}-reduce-bf16", f"zero{zero}-reduce-fp32"):
        if zero:  # the parameter all-gather is bf16 either way: half of each rank's share of 2-byte weights
            assert results[name][0]["reduction"]["step_comm_bytes"] == {"_allgather_base_ torch.bfloat16": numel}


def test_zero3_reduce_scatters_in_the_reduce_dtype(results):
    """FSDP2 takes the same key: its reduce-scatters carry half the bytes in bf16. The vocabulary tables
    are sharded by rows over dp here (``parallel/vocab.py``): their collectives carry activations
    (bf16 embeddings and hidden states, fp32 for the loss's softmax sums) whatever the reduce dtype,
    the same bytes in both runs, and their gradients travel in no reduction. So what the two runs
    differ by is the gradient reductions alone: fp32 bytes in one, half as many bf16 bytes in the other."""
    f32, b16 = "torch.float32", "torch.bfloat16"
    for bf16, fp32 in zip(results["zero3-reduce-bf16"], results["zero3-reduce-fp32"], strict=True):
        got, ref = _reduced(bf16["reduction"]["comm_bytes"]), _reduced(fp32["reduction"]["comm_bytes"])
        gradients_fp32 = ref.get(f32, 0) - got.get(f32, 0)
        gradients_bf16 = got.get(b16, 0) - ref.get(b16, 0)
        assert gradients_fp32 > 0 and 2 * gradients_bf16 == gradients_fp32, (got, ref)


@pytest.mark.parametrize("zero", STAGES)
def test_bf16_reduction_follows_the_fp32_one(results, zero):
    bf16 = results[f"zero{zero}-reduce-bf16"][0]
    fp32 = results[f"zero{zero}-reduce-fp32"][0]
    assert fp32["losses"][-1] < 0.7 * fp32["losses"][0], fp32["losses"]  # it learns: the curves are worth comparing
    deviation = max(abs(a - b) / abs(b) for a, b in zip(bf16["losses"], fp32["losses"], strict=True))
    print(f"zero{zero}: max relative loss deviation, bf16 vs fp32 reduction, over {STEPS} steps: {deviation:.2e}")
    assert deviation <= REDUCE_LOSS_RTOL, (deviation, bf16["losses"], fp32["losses"])
    assert deviation > 0, "the bf16 reduction rounded nothing: is it in bf16?"
    # the reduced gradients land in fp32, a bf16 rounding away from the fp32 reduction's
    for name, grad in bf16["grads"].items():
        ref = fp32["grads"][name]
        assert grad.dtype == torch.float32, (name, grad.dtype)
        assert (grad - ref).norm() <= 1e-2 * ref.norm() + 1e-8, name
