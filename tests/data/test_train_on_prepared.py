"""``distlaunch train`` on a folder from ``distlaunch data prepare``: the vocabulary comes from its
tokenizer, each dp rank reads its own rows of the same global batches, and a restart resumes at the
exact data position (real ranks, real gloo, the real CLI)."""

from __future__ import annotations

import json

import torch

from distlaunch.data.index import read_index
from distlaunch.engine.data import BatchSampler, DataPosition, load_split
from distlaunch.training.presets import PRESETS, model_config
from tests.checkpoint.conftest import SAME_LAYOUT_RTOL, launch_engine, max_relative
from tests.data.conftest import paragraphs
from tests.helpers import invoke

STEPS = 8
DATA_SETS = ("train.steps=8", "checkpoint.every=4", "train.eval_every=8", "train.eval_batches=2")


def prepared(tmp_path, name: str, first: int, vocab: int = 400):
    """A folder prepared with bpe:VOCAB from 150 paragraphs of the bundled corpus, one JSONL
    document each, in shards of about 3,000 tokens."""
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"text": p}) + "\n" for p in paragraphs(first, 150)))
    out = tmp_path / name
    args = ["data", "prepare", str(src), "--out", str(out), "--tokenizer", f"bpe:{vocab}", "--shard-tokens", "3000"]
    r = invoke(args)
    assert r.exit_code == 0, r.stderr
    return out


def test_windows_stay_inside_one_shard_and_dp_ranks_read_disjoint_rows_of_one_global_batch():
    # shard k holds only ids in [100k, 100k+100): a window mixing shards would mix ranges
    shards = [torch.arange(n, dtype=torch.int64) % 100 + 100 * k for k, n in enumerate((50, 7, 300, 40))]
    sampler = BatchSampler(shards, seq_len=16, global_batch_size=12, seed=3, vocab_size=1024)
    for step in range(1, 30):
        x, y = sampler.global_batch(step)
        windows = torch.cat([x, y[:, -1:]], dim=1)
        assert (windows // 100 == windows[:, :1] // 100).all()
        assert not (windows // 100 == 1).any()  # the 7-token shard holds no 17-token window
        for dp in (1, 2, 3, 4):
            parts = [sampler.local_batch(step, r, dp) for r in range(dp)]
            assert torch.equal(torch.cat([p[0] for p in parts]), x) and torch.equal(torch.cat([p[1] for p in parts]), y)


def test_one_token_tensor_samples_exactly_as_before():
    tokens = torch.randint(0, 256, (5000,), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    sampler = BatchSampler(tokens, seq_len=32, global_batch_size=6, seed=11)
    gen = torch.Generator().manual_seed((11 * 1_000_003 + 5) % (1 << 63))
    starts = torch.randint(0, 5000 - 33, (6,), generator=gen)
    windows = tokens[starts[:, None] + torch.arange(33)].long()
    x, y = sampler.global_batch(5)
    assert torch.equal(x, windows[:, :-1]) and torch.equal(y, windows[:, 1:])


def test_batches_are_contiguous_for_the_pipelines_first_stage():
    # torch 2.11's pipeline stage compares its input's strides with the (B, T) it was built for
    shards = [torch.arange(400, dtype=torch.int64) % 256, torch.arange(90, dtype=torch.int64) % 256]
    sampler = BatchSampler(shards, seq_len=16, global_batch_size=8, seed=3)
    for x in (*sampler.global_batch(1), *sampler.local_batch(1, 1, 2)):
        assert x.is_contiguous() and x.stride() == (16, 1)


def test_a_prepared_folder_sets_the_vocabulary_and_holds_out_its_tail(tmp_path):
    out = prepared(tmp_path, "a", 0)
    assert model_config("tiny", str(out)).vocab_size == 512  # bpe:400 padded to a multiple of 128
    assert model_config("tiny", None) == PRESETS["tiny"] and PRESETS["tiny"].vocab_size == 256
    assert PRESETS["125m"].vocab_size == PRESETS["1.3b"].vocab_size == 50_304
    train, held_out = load_split(str(out), "auto", "uint16", 0.25)
    total = read_index(out).tokens
    assert sum(t.numel() for t in train) == total - int(total * 0.25)
    assert sum(t.numel() for t in held_out) == int(total * 0.25)


def test_resuming_on_other_data_is_refused():
    position = DataPosition("prepared2:abc", "/data/a")
    position.batches = 7
    other = DataPosition("prepared2:def", "/data/b")
    try:
        other.load_state_dict(position.state_dict())
    except Exception as err:
        assert "trained on other data (data.path='/data/a')" in str(err) and "data.path='/data/b'" in str(err)
    else:
        raise AssertionError("loading another dataset's position must fail")
    same = DataPosition("prepared2:abc", "/elsewhere/a")
    same.load_state_dict(position.state_dict())
    assert same.batches == 7


def test_dp2_trains_on_a_prepared_folder_and_a_crash_restart_resumes_at_the_exact_data_position(tmp_path):
    data = prepared(tmp_path, "a", 0)
    assert len(read_index(data).shards) > 3
    sets = (*DATA_SETS, f"data.path='{data}'")
    reference = launch_engine(tmp_path / "ref", "-n", "2", overrides=sets)
    losses = reference.losses
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert all(torch.isfinite(torch.tensor(v)) for v in losses.values())
    assert abs(losses[1] - torch.log(torch.tensor(512.0)).item()) < 0.5  # starts near uniform over 512
    assert losses[STEPS] < losses[1] - 0.4  # and learns (the last steps at min_lr: the cosine's end)
    run = launch_engine(
        tmp_path / "crash",
        "-n",
        "2",
        "--max-restarts",
        "1",
        overrides=(*sets, "fault.rank=1", "fault.step=6", "fault.kind='crash'"),
    )
    assert f"resumed from {run.ckpt / 'step_000004'} (step 4" in run.output
    assert sorted(run.losses) == list(range(1, STEPS + 1))
    assert max_relative(losses, run.losses) <= SAME_LAYOUT_RTOL  # steps 5-8 drew the very same batches
    # the checkpoint holds the data position; other data (same vocabulary) cannot resume from it
    other = prepared(tmp_path, "b", 300)
    assert model_config("tiny", str(other)).vocab_size == 512
    r = invoke_engine_resume(tmp_path / "crash", other)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"checkpoint {run.ckpt / 'step_000008'} was trained on other data (data.path='{data}')" in r.stderr
    assert f"than data.path='{other}'" in r.stderr


def invoke_engine_resume(run_dir, data):
    """Continue the run in ``run_dir`` to step 12 on ``data``; returns the finished process."""
    from tests.checkpoint.conftest import REPO, cli_env, engine_args
    from tests.helpers import run_cli

    args = engine_args(run_dir / "ckpt", run_dir / "more.jsonl", *DATA_SETS, "train.steps=12", f"data.path='{data}'")
    return run_cli("run", "--grace-period", "1", "-n", "2", *args, env=cli_env(), timeout=180, cwd=REPO)


def test_the_dry_run_plans_memory_with_the_prepared_vocabulary(tmp_path):
    data = prepared(tmp_path, "a", 0, vocab=1000)  # padded to 1,024: 4x the bytes' embedding and head
    args = ["train", "--dry-run", "--json", "-n", "2", "--set", "parallel.pp=1", "--set", "model.preset='tiny'"]
    plain = invoke(args)
    with_data = invoke([*args, "--set", f"data.path='{data}'"])
    assert plain.exit_code == with_data.exit_code == 0, plain.stderr + with_data.stderr
    params = [json.loads(r.stdout)["memory"]["ranks"][0]["params"] for r in (plain, with_data)]
    d_model = PRESETS["tiny"].d_model
    assert params[1] - params[0] == 4 * 2 * (1024 - 256) * d_model  # fp32 tok_emb + head rows


def test_a_folder_that_was_not_prepared_is_a_one_line_error(tmp_path):
    r = invoke(
        ["train", "-n", "2", "--set", "parallel.pp=1", "--set", f"data.path='{tmp_path}'", "--set", "train.steps=1"]
    )
    assert r.exit_code == 2
    assert f"data.path is a directory without an index.json: {tmp_path}" in r.stderr + r.stdout
