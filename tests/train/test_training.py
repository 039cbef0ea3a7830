"""Accumulation, clipping, precision, token files and the memory planner, against the single process.

Real gloo processes, the tiny GPT, fp32 unless a case says otherwise. The configs of one world
size run one after the other inside one job (one set of processes) to keep the suite fast.
Clipping is active in every step (norms ~3-6 against ``grad_clip=0.5``), so a norm computed on a
shard instead of the whole gradient would show up as a different update.
"""

from __future__ import annotations

import json
import sys
import threading

import pytest
import torch

from distlaunch.data.source import BUNDLED_CORPUS
from distlaunch.engine.model import GPT, PRESETS, init_weights
from distlaunch.training.config import load_config
from distlaunch.training.dims import resolve_parallel_dims
from distlaunch.training.planner import rank_memory
from distlaunch.training.presets import model_config
from tests.engine.harness import spawn_ok
from tests.helpers import invoke
from tests.live_memory import PeakLiveBytes, count_allocations, nearest_peak
from tests.train import _worker

BASE = [
    "model.preset='tiny'",
    "train.steps=3",
    "train.global_batch_size=8",
    "train.seq_len=32",
    "train.lr=1e-3",
    "train.seed=11",
    "train.grad_clip=0.5",
    "train.warmup_steps=1",
    "train.weight_decay=0.1",
    "train.bucket_mb=0.25",  # many gradient buckets, each launched from backward (test_buckets.py)
]
ACCUM = ["train.grad_accum_steps=2"]
PARITY = {  # 4 ranks, each with 2 accumulation rounds; all must equal the single process
    "dp2-tp2": ["parallel.tp=2", *ACCUM],
    "dp2-pp2-zero1": ["parallel.pp=2", "parallel.zero=1", *ACCUM],
    "dp2-tp2-zero2": ["parallel.tp=2", "parallel.zero=2", *ACCUM],
    "dp2-pp2-zero3": ["parallel.pp=2", "parallel.zero=3", *ACCUM],
    "tp2-pp2": ["parallel.tp=2", "parallel.pp=2", *ACCUM],
}
LOW_PRECISION = {
    "bf16-dp2-pp2": ["parallel.pp=2", "train.precision='bf16'", "train.steps=8", "train.lr=3e-3"],
    "fp16-dp2-tp2-zero2": [
        "parallel.tp=2",
        "parallel.zero=2",
        "train.precision='fp16'",
        "train.steps=8",
        "train.lr=3e-3",
    ],
    # FSDP2 all-gathers fp16 units and reduce-scatters fp16 gradients under the loss scale
    "fp16-dp2-tp2-zero3": [
        "parallel.tp=2",
        "parallel.zero=3",
        "train.precision='fp16'",
        "train.steps=8",
        "train.lr=3e-3",
    ],
    # a loss scale no fp16 gradient survives: every rank must skip every step, together
    "fp16-overflow": [
        "parallel.tp=2",
        "parallel.zero=2",
        "train.precision='fp16'",
        "train.loss_scale=1e30",
        "train.steps=2",
    ],
    # ... and with ZeRO-3, where each rank holds a quarter of every gradient
    "fp16-overflow-zero3": ["parallel.zero=3", "train.precision='fp16'", "train.loss_scale=1e30", "train.steps=2"],
}
# shapes where activations, not the training state, make the step's peak (as in real training),
# so the planner's activation terms are held to its bar too (the state is 3-6x smaller here):
# pipeline stages with tp, autocast's fp32 hidden states (fp16 over fp32 weights; half the batch,
# as 16-bit matmuls are slow on CPUs), and checkpointing, whose peak is the first block's
# backward; and bf16 ZeRO-3 pipeline stages. Step 2, after the warm-up step, is the one measured.
HEAVY = ["train.seq_len=256", "train.global_batch_size=16", "train.steps=2"]
ACTIVATION_HEAVY = {
    "heavy-tp2-pp2": ["parallel.tp=2", "parallel.pp=2", *HEAVY],
    "heavy-fp16-dp2-tp2-zero2": [
        "parallel.tp=2",
        "parallel.zero=2",
        "train.precision='fp16'",
        *HEAVY,
        "train.global_batch_size=8",
    ],
    "heavy-ac-zero1": ["parallel.zero=1", "train.activation_checkpointing=true", *HEAVY],
    # without tp the loss's backward and the blocks' working set never meet: the last stage
    # holds the larger of the two (their sum was 10.5% over)
    "heavy-bf16-dp2-pp2-zero3": ["parallel.pp=2", "parallel.zero=3", "train.precision='bf16'", *HEAVY],
}
# a real vocabulary's logits make most of a step's peak (on a GPU: GPT-2's 50k tokens against
# d_model 768 or 2048); a prepared BPE folder of ~1.2k tokens does that to the tiny GPT, so the
# loss's backward is the peak: without tp, with checkpointing, and sharded over tp
VOCAB_DATA = "data.path='{vocab_data}'"
VOCAB_HEAVY = {
    "vocab-bf16-dp4-zero1": ["parallel.zero=1", "train.precision='bf16'", VOCAB_DATA, *HEAVY],
    "vocab-ac-dp4": ["train.activation_checkpointing=true", VOCAB_DATA, *HEAVY],
    "vocab-dp2-tp2": ["parallel.tp=2", VOCAB_DATA, *HEAVY],
}
LOSS_RTOL = 1e-5
# after 3 AdamW steps at lr 1e-3 (~1e-3 per element and step): measured <= 1.6e-5 (tp layouts, in
# mlp.proj, whose small gradients Adam normalises, so summation order shows); 5% of one step
PARAM_ATOL = 5e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-7  # step 1's clipped gradients (a wrong coefficient is off by >1e-2)
STATE_RTOL = 0.05  # the planner's bar: planned vs measured bytes
PEAK_RTOL = 0.10  # planned vs measured peak of a step (activations are an estimate)


def _run(out, world_size: int, configs: dict[str, list[str]], plain: bool = False) -> dict[str, list[dict]]:
    spec = json.dumps({"base": BASE, "configs": configs, "plain": plain})
    spawn_ok([sys.executable, _worker.__file__, str(out), spec], world_size, timeout=270, forked=True)
    return {name: [torch.load(out / f"{name}.rank{r}.pt") for r in range(max(world_size, 1))] for name in configs}


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    """The bundled corpus written as a uint16 token file: the same tokens as the text path."""
    path = tmp_path_factory.mktemp("tokens") / "corpus.bin"
    torch.frombuffer(bytearray(BUNDLED_CORPUS.read_bytes()), dtype=torch.uint8).to(torch.int32).numpy().astype(
        "<u2"
    ).tofile(path)
    return path


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process: no accumulation, 4 accumulation rounds, and the plain-PyTorch reference."""
    out = tmp_path_factory.mktemp("single")
    results = _run(out, 0, {"ref": [], "ref-accum4": ["train.grad_accum_steps=4"]}, plain=True)
    return {name: ranks[0] for name, ranks in results.items()} | {"plain": torch.load(out / "plain.pt")}


@pytest.fixture(scope="module")
def vocab_data(tmp_path_factory):
    """The bundled corpus prepared with a BPE vocabulary of ~1.2k tokens (1280 padded)."""
    out = tmp_path_factory.mktemp("vocab") / "ds"
    assert invoke(["data", "prepare", str(BUNDLED_CORPUS), "--out", str(out), "--tokenizer", "bpe:4096"]).exit_code == 0
    return out


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory, token_file, vocab_data):
    vocab_heavy = {name: [o.format(vocab_data=vocab_data) for o in config] for name, config in VOCAB_HEAVY.items()}
    configs = (
        PARITY
        | LOW_PRECISION
        | ACTIVATION_HEAVY
        | vocab_heavy
        | {"dp4-zero3-tokens": ["parallel.zero=3", f"data.path='{token_file}'"]}
    )
    return _run(tmp_path_factory.mktemp("world4"), 4, configs)


def _merged(ranks: list[dict], key: str = "params") -> dict[str, torch.Tensor]:
    """Whole tensors by name from every rank (pipeline stages hold different names)."""
    return {name: t for r in ranks for name, t in r[key].items()}


def _assert_same_training(
    got: dict, ref: dict, params: dict[str, torch.Tensor], clipped: dict[str, torch.Tensor]
) -> None:
    for a, b in zip(got["losses"], ref["losses"], strict=False):
        assert abs(a - b) <= LOSS_RTOL * abs(b), (got["losses"], ref["losses"])
    for a, b in zip(got["grad_norms"], ref["grad_norms"], strict=False):
        assert abs(a - b) <= 1e-4 * b, (got["grad_norms"], ref["grad_norms"])
    assert set(params) == set(ref["params"]) == set(clipped)
    for name, tensor in clipped.items():
        torch.testing.assert_close(tensor, ref["clipped_grads"][name], rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)
    for name, tensor in params.items():
        torch.testing.assert_close(tensor, ref["params"][name], rtol=0, atol=PARAM_ATOL, msg=name)


def test_single_process_clipping_equals_plain_pytorch(single):
    ref, plain = single["ref"], single["plain"]
    assert all(n > 0.5 for n in ref["grad_norms"])  # clipping was active in every step
    for a, b in zip(ref["grad_norms"], plain["grad_norms"], strict=False):
        assert abs(a - b) <= 1e-5 * b
    _assert_same_training(ref, plain | {"losses": ref["losses"]}, ref["params"], ref["clipped_grads"])


def test_accumulation_in_one_process_equals_the_whole_batch(single):
    got = single["ref-accum4"]
    _assert_same_training(got, single["ref"], got["params"], got["clipped_grads"])


@pytest.mark.parametrize("name", list(PARITY))
def test_accumulation_and_clipping_across_shards_equal_the_single_process(four_ranks, single, name):
    ranks = four_ranks[name]
    for r in ranks:  # every rank reports the same job-wide loss and norm
        assert r["losses"] == ranks[0]["losses"] and r["grad_norms"] == ranks[0]["grad_norms"]
    _assert_same_training(ranks[0], single["ref"], _merged(ranks), _merged(ranks, "clipped_grads"))


def test_memory_mapped_token_file_trains_like_the_text(four_ranks, single):
    ranks = four_ranks["dp4-zero3-tokens"]
    _assert_same_training(ranks[0], single["ref"], _merged(ranks), _merged(ranks, "clipped_grads"))


@pytest.mark.parametrize("name", ["bf16-dp2-pp2", "fp16-dp2-tp2-zero2", "fp16-dp2-tp2-zero3"])
def test_low_precision_trains(four_ranks, name):
    losses = four_ranks[name][0]["losses"]
    assert not any(four_ranks[name][0]["skipped"])
    assert losses[-1] < losses[0] - 0.3, losses


@pytest.mark.parametrize("name", ["fp16-overflow", "fp16-overflow-zero3"])
def test_fp16_overflow_skips_the_step_on_every_rank(four_ranks, name):
    ranks = four_ranks[name]
    assert all(r["skipped"] == [True, True] and r["scales"] == 1e30 / 4 for r in ranks)
    init = GPT(PRESETS["tiny"])
    init_weights(init, seed=11)
    for name, tensor in _merged(ranks).items():  # no update reached any shard
        torch.testing.assert_close(tensor, dict(init.named_parameters())[name].detach(), rtol=0, atol=0)


def _plan(measured: dict):
    """The planner's estimate for the config and rank that ``measured`` ran."""
    cfg = load_config(None, measured["overrides"])
    model = model_config(cfg.model.preset, cfg.data.path)
    return rank_memory(model, resolve_parallel_dims(cfg, model, 4), measured["rank"], cfg.train, "gloo", None)


@pytest.mark.parametrize("name", [*PARITY, "dp4-zero3-tokens"])
def test_planner_matches_measured_state_bytes(four_ranks, name):
    for measured in four_ranks[name]:
        estimate = _plan(measured)
        for part in ("params", "grads", "optimizer"):
            got, want = getattr(estimate, part), measured["mem"][part]
            assert abs(got - want) <= STATE_RTOL * want, (name, measured["rank"], part, got, want)


def test_live_bytes_counts_a_known_allocation_and_a_free_on_another_thread():
    """The peak measurement the planner is held to: exact for a known tensor, and a gloo worker
    thread freeing a buffer is seen too (the allocator's running total covers every thread)."""
    count_allocations()
    try:
        kept = torch.empty(250_000)  # 1 MB
        with PeakLiveBytes() as window:
            transient = torch.empty(3_000_000)  # 12 MB, alive only inside
            del transient
        assert 12_000_000 <= window.peak - window.start < 12_000_000 + 4096
        holder = [kept]
        del kept
        with PeakLiveBytes() as before:
            pass
        thread = threading.Thread(target=holder.clear)
        thread.start()
        thread.join()
        with PeakLiveBytes() as after:
            pass
        assert before.start - after.start == 1_000_000
    finally:
        count_allocations(False)


@pytest.mark.parametrize(
    "name", [*PARITY, "dp4-zero3-tokens", "bf16-dp2-pp2", "fp16-dp2-tp2-zero2", *ACTIVATION_HEAVY, *VOCAB_HEAVY]
)
def test_planner_predicts_the_measured_step_peak(four_ranks, name):
    """Planned step peak against the live tensor bytes measured inside steps 2 and 3 on every rank
    (the nearer of the two: ``nearest_peak``)."""
    for measured in four_ranks[name]:
        planned = _plan(measured).peak
        got = nearest_peak(planned, measured["step_peaks"])
        print(f"{name} rank {measured['rank']}: planned {planned / 2**20:.2f} MiB, measured {got / 2**20:.2f} MiB")
        assert abs(planned - got) <= PEAK_RTOL * got, (name, measured["rank"], planned, measured["step_peaks"])
