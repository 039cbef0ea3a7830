"""Every layout reproduces the single-process run: loss and gradient norm per step, step-1 gradients.

Real processes and real gloo collectives. To stay inside the suite's time budget, the layouts
of one world size run one after the other inside one job (one set of processes); each layout is
still its own test result. fp32, the tiny GPT, 10 steps, the same global batch everywhere.
"""

from __future__ import annotations

import pytest
import torch

from distlaunch.engine.model import PRESETS
from tests.engine.harness import run_layouts

BASE = [
    "model.preset='tiny'",
    "train.steps=10",
    "train.global_batch_size=8",
    "train.seq_len=32",
    "train.lr=1e-3",
    "train.seed=7",
    # the plain-PyTorch reference below: constant lr, no warmup, no clipping, no weight decay, AdamW's default
    # betas, all data
    "train.lr_schedule='constant'",
    "train.warmup_steps=0",
    "train.weight_decay=0",
    "train.grad_clip=0",
    "train.beta2=0.999",
    "data.val_fraction=0",
    # ~20 gradient buckets for the tiny GPT (the 25 MiB default would make one): every ZeRO-0/1/2
    # layout below reduces bucket by bucket, from backward hooks (tests/engine/test_buckets.py)
    "train.bucket_mb=0.25",
]
LOSS_RTOL = 1e-5  # the parity bar: relative difference per step
NORM_RTOL = 1e-4  # gradient norm per step (measured: <= 3e-6; headroom for other CPUs' kernels)
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6  # one step's gradients: summation order differs per layout

LAYOUTS: dict[int, dict[str, list[str]]] = {
    2: {
        "dp2": [],
        "dp2-zero1": ["parallel.zero=1"],
        "dp2-zero2": ["parallel.zero=2"],
        "dp2-zero3": ["parallel.zero=3"],
        "tp2": ["parallel.tp=2"],
        "pp2-gpipe": ["parallel.pp=2", "parallel.schedule='gpipe'"],
        "pp2-interleaved": ["parallel.pp=2", "parallel.schedule='interleaved'"],
        "dp2-zero3-ac": ["parallel.zero=3", "train.activation_checkpointing=true"],
        # DTensor shards inside the compiled blocks (~30 s of inductor on this CPU, once)
        "tp2-compiled": ["parallel.tp=2", "train.compile=true"],
        # checkpointing around them, as the 1.3b template runs on a GPU (the same compiled graph)
        "tp2-ac-compiled": ["parallel.tp=2", "train.compile=true", "train.activation_checkpointing=true"],
    },
    4: {
        "dp4": [],
        "dp4-zero1": ["parallel.zero=1"],
        "dp4-zero2": ["parallel.zero=2"],
        "dp4-zero3": ["parallel.zero=3"],
        "tp4": ["parallel.tp=4"],
        "pp4-1f1b": ["parallel.pp=4", "parallel.schedule='1f1b'"],
        "dp2-tp2": ["parallel.tp=2"],
        "dp2-pp2": ["parallel.pp=2"],
        "tp2-pp2": ["parallel.tp=2", "parallel.pp=2"],
        "tp2-pp2-ac": ["parallel.tp=2", "parallel.pp=2", "train.activation_checkpointing=true"],
        "dp2-tp2-zero2": ["parallel.tp=2", "parallel.zero=2"],
        "dp2-pp2-zero3-interleaved": ["parallel.pp=2", "parallel.zero=3", "parallel.schedule='interleaved'"],
    },
    8: {
        "dp2-tp2-pp2": ["parallel.tp=2", "parallel.pp=2"],
        "dp2-tp2-pp2-zero1": ["parallel.tp=2", "parallel.pp=2", "parallel.zero=1"],
        "dp2-tp2-pp2-zero2": ["parallel.tp=2", "parallel.pp=2", "parallel.zero=2"],
        "dp2-tp2-pp2-zero3": ["parallel.tp=2", "parallel.pp=2", "parallel.zero=3"],
    },
}
CASES = [(world, name) for world, layouts in LAYOUTS.items() for name in layouts]


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> dict:
    """The engine in one plain process (no launch environment)."""
    out = tmp_path_factory.mktemp("single")
    return run_layouts(out, 0, BASE, {"single": []})["single"][0]


@pytest.fixture(scope="session")
def layout_results(tmp_path_factory):
    """world size -> layout -> per-rank results; each world size's job starts on first use."""
    cache: dict[int, dict] = {}

    def get(world_size: int) -> dict:
        if world_size not in cache:
            out = tmp_path_factory.mktemp(f"world{world_size}")
            cache[world_size] = run_layouts(out, world_size, BASE, LAYOUTS[world_size])
        return cache[world_size]

    return get


def _relative(a: list[float], b: list[float]) -> list[float]:
    return [abs(x - y) / abs(y) for x, y in zip(a, b, strict=False)]


@pytest.mark.parametrize("world_size,name", CASES, ids=[n for _, n in CASES])
def test_loss_curve_matches_single_process(world_size, name, reference, layout_results):
    ranks = layout_results(world_size)[name]
    losses = ranks[0]["losses"]
    assert len(losses) == len(reference["losses"]) == 10
    assert all(r["losses"] == losses for r in ranks), "every rank must report the same loss"
    assert max(_relative(losses, reference["losses"])) <= LOSS_RTOL, (losses, reference["losses"])
    assert max(_relative(ranks[0]["grad_norms"], reference["grad_norms"])) <= NORM_RTOL


ZERO3 = [(world, name) for world, name in CASES if "zero3" in name]


@pytest.mark.parametrize("world_size,name", ZERO3, ids=[n for _, n in ZERO3])
def test_zero3_shards_the_vocabulary_tables_over_dp_where_tp_does_not(world_size, name, layout_results):
    """The layouts above hold the parity of ``parallel/vocab.py`` only if they run it: every ZeRO-3 layout
    here without tp shards both tables over dp (the tiny model's 256 rows take one micro-batch's tokens
    of every dp rank), and the one with tp keeps FSDP's units (tp makes them vocabulary-parallel)."""
    for rank in layout_results(world_size)[name]:
        tables = set(rank["vocab_tables"])
        sharded = {t for t in tables if t.startswith("Sharded")}
        assert tables and sharded == (tables if "tp2" not in name else set()), (name, tables)


@pytest.mark.parametrize("world_size,name", CASES, ids=[n for _, n in CASES])
def test_step1_gradients_match_single_process(world_size, name, reference, layout_results):
    ranks = layout_results(world_size)[name]
    seen = set()
    for rank, result in enumerate(ranks):
        for param, grad in result["grads"].items():
            expected = reference["grads"][param]
            torch.testing.assert_close(
                grad,
                expected,
                rtol=GRAD_RTOL,
                atol=GRAD_ATOL,
                msg=lambda m, rank=rank, param=param: f"rank {rank} {param}: {m}",
            )
            seen.add(param)
    assert seen == set(reference["grads"]), "some parameters are held by no rank"


@pytest.mark.parametrize("name", ["tp2-compiled", "tp2-ac-compiled"])
def test_compiled_blocks_train_like_eager(layout_results, name):
    """Every block compiled; the loss curve and gradients are the parity tests' above."""
    ranks = layout_results(2)[name]
    assert all(r["compiled_blocks"] == PRESETS["tiny"].n_layer for r in ranks)
    assert all(r["compiled_blocks"] == 0 for r in layout_results(2)["tp2"])  # auto is off on CPU


@pytest.mark.parametrize("world_size", sorted(LAYOUTS))
def test_mesh_groups_are_the_launchers_plan(world_size, layout_results):
    """The process groups the engine communicates in are the ones ``--dry-run`` prints."""
    from distlaunch.contract.layout import groups, layout_spec, resolve_layout

    for name, ranks in layout_results(world_size).items():
        plan = groups(resolve_layout(layout_spec(ranks[0]["dims"]), world_size))
        for rank, result in enumerate(ranks):
            for dim, members in result["groups"].items():
                assert rank in members and members in plan[dim], (name, rank, dim, members)


def test_single_process_engine_is_plain_pytorch(reference):
    """The engine's single process equals a hand-written loop: model, AdamW, the same batches."""
    from distlaunch.engine.data import BatchSampler, load_tokens
    from distlaunch.engine.model import GPT, PRESETS, init_weights

    torch.manual_seed(0)
    model = GPT(PRESETS["tiny"])
    init_weights(model, seed=7)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, foreach=False)
    sampler = BatchSampler(load_tokens(None), seq_len=32, global_batch_size=8, seed=7)
    losses = []
    for step in range(1, 11):
        x, y = sampler.global_batch(step)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        if step == 1:
            for name, p in model.named_parameters():
                torch.testing.assert_close(reference["grads"][name], p.grad, rtol=1e-6, atol=1e-8)
        opt.step()
        losses.append(loss.item())
    assert max(_relative(reference["losses"], losses)) <= 1e-6
    assert losses[-1] < losses[0] - 1.0, "the tiny model must visibly learn in 20 steps"
