"""``distlaunch checkpoint inspect|export`` on real checkpoints, what a crash inside a save leaves
on disk (one plain process of the engine), and ``distlaunch train --resume`` checked before launch."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from distlaunch.data.source import BUNDLED_CORPUS, data_fingerprint
from distlaunch.engine.data import BatchSampler, load_split
from distlaunch.engine.model import GPT, PRESETS
from distlaunch.training.checkpoint.folder import LEFTOVER, latest_checkpoint
from distlaunch.training.config import load_config
from distlaunch.training.places import CHECKPOINT_LOCK
from tests.checkpoint.conftest import BASE, REPO, cli_env, engine_args, step_losses
from tests.helpers import invoke

EXPORT_RTOL = 1e-6  # one process vs the dp=2 job's loss on the same weights and batch


def test_inspect_shows_step_layout_and_sizes_as_a_table_and_json(reference):
    table = invoke(["checkpoint", "inspect", str(reference.ckpt)])
    assert table.exit_code == 0, table.stderr
    assert "step 20, model tiny, written by dp=2,tp=1,pp=1,zero=0 (2 ranks)" in table.stdout
    assert "trained on the bundled corpus, vocabulary 256" in table.stdout
    assert "model" in table.stdout and "optim" in table.stdout and "15, 20 (latest)" in table.stdout
    report = json.loads(invoke(["checkpoint", "inspect", str(reference.ckpt / "step_000015"), "--json"]).stdout)
    assert report["meta"]["step"] == 15 and report["meta"]["layout"]["world_size"] == 2
    assert report["meta"]["data"] == {"fingerprint": data_fingerprint(None), "path": None, "vocab_size": 256}
    model = report["meta"]["components"]["model"]
    assert model["bytes"] == 4 * model["numel"] and report["meta"]["components"]["optim"]["bytes"] > 2 * model["bytes"]


def assert_torch_free(args: list[str]) -> None:
    """``distlaunch ARGS`` succeeds in a fresh interpreter without ever importing torch."""
    code = (
        "import sys; from distlaunch.cli.app import main; "
        f"code = main({args!r}); "
        "sys.exit(code or ('torch' in sys.modules and 'torch was imported'))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr


def test_inspect_does_not_import_torch(reference):
    assert_torch_free(["checkpoint", "inspect", str(reference.ckpt), "--json"])


def test_export_reloads_into_the_plain_model_with_the_same_loss(reference, tmp_path):
    out = tmp_path / "model.safetensors"
    result = invoke(["checkpoint", "export", str(reference.ckpt / "step_000015"), str(out), "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["format"] == "safetensors"
    cfg = load_config(None, BASE)
    model = GPT(PRESETS[cfg.model.preset])
    model.load_state_dict(load_file(out))  # strict: every name of the single-process model
    tokens, _ = load_split(cfg.data.path, cfg.data.format, cfg.data.token_dtype, cfg.data.val_fraction)
    x, y = BatchSampler(tokens, cfg.train.seq_len, cfg.train.global_batch_size, cfg.train.seed).global_batch(16)
    with torch.no_grad():
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    expected = reference.losses[16]  # step 16's loss is computed with the weights saved after step 15
    assert abs(loss - expected) / expected <= EXPORT_RTOL


def test_crash_inside_a_save_leaves_the_previous_checkpoint_published_and_loadable(tmp_path):
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "metrics.jsonl"
    args = engine_args(ckpt, metrics, "train.steps=10")[1:]  # drop "-m": run the module directly
    crash = ["--set", "fault.rank=0", "--set", "fault.step=10", "--set", "fault.kind='crash-in-save'"]
    r = subprocess.run(
        [sys.executable, "-m", *args, *crash],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **cli_env()},
        cwd=REPO,
    )
    assert r.returncode == 42 and "while saving the step-10 checkpoint" in r.stderr, r.stderr
    unfinished = [p for p in ckpt.iterdir() if LEFTOVER.match(p.name)]
    assert len(unfinished) == 1 and (unfinished[0] / ".metadata").exists()  # shards fully written, unpublished
    assert latest_checkpoint(ckpt) == ckpt / "step_000005" and not (ckpt / "step_000010").exists()
    inspected = invoke(["checkpoint", "inspect", str(ckpt)])
    assert "step 5," in inspected.stdout and "unfinished save" in inspected.stdout
    r = subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **cli_env()},
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert f"resumed from {ckpt / 'step_000005'} (step 5" in r.stdout
    assert sorted(step_losses(metrics)) == list(range(1, 11))
    assert latest_checkpoint(ckpt) == ckpt / "step_000010" and not [p for p in ckpt.iterdir() if LEFTOVER.match(p.name)]


def test_export_refuses_an_output_that_is_part_of_the_checkpoint_or_cannot_be_written(reference, tmp_path):
    ckpt = Path(shutil.copytree(reference.ckpt, tmp_path / "ckpt"))
    pointer = (ckpt / "latest").read_bytes()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cases = {
        ckpt / "latest": f"export output {ckpt / 'latest'} is part of the checkpoint folder {ckpt} (latest)",
        ckpt / "step_000020" / "w.safetensors": f"export output {ckpt / 'step_000020' / 'w.safetensors'} is part of",
        ckpt / "step_000015" / ".." / "latest": f"export output {ckpt / 'step_000015' / '..' / 'latest'} is part of",
        blocker / "w.safetensors": f"cannot write export output {blocker / 'w.safetensors'}: {blocker} is a file",
        Path("/proc/distlaunch-test/w.safetensors"): "cannot write export output /proc/distlaunch-test/w.safetensors",
        Path("/dev/null"): "export output /dev/null is not a regular file",
    }
    for output, expected in cases.items():
        r = invoke(["checkpoint", "export", str(ckpt), str(output)])
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, (output, r.stderr)
        assert r.stderr.startswith(f"error: {expected}") and "internal error" not in r.stderr, r.stderr
    assert (ckpt / "latest").read_bytes() == pointer
    assert sorted(p.name for p in ckpt.iterdir()) == [CHECKPOINT_LOCK, "latest", "step_000015", "step_000020"]
    assert not [p for p in tmp_path.rglob("*.tmp-*")]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_export_writes_either_format_atomically_with_the_mode_the_umask_gives(reference, tmp_path, umask):
    previous = os.umask(umask)
    try:
        for name in ("w.safetensors", "w.pt", "new/folder/w.safetensors"):
            r = invoke(["checkpoint", "export", str(reference.ckpt), str(tmp_path / name)])
            assert r.exit_code == 0, r.stderr
    finally:
        os.umask(previous)
    for name in ("w.safetensors", "w.pt", "new/folder/w.safetensors"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "w.pt", "w.safetensors"]  # no temporary file left


def _resume_cases(reference, tmp_path) -> dict[str, tuple[list[str], str]]:
    empty, a_file, loop = tmp_path / "empty", tmp_path / "a-file", tmp_path / "loop"
    empty.mkdir()
    a_file.write_text("x")
    loop.symlink_to(loop.name)
    newest = reference.ckpt / "step_000020"
    bpe = tmp_path / "bpe384"  # another vocabulary than the bundled corpus' 256 bytes
    if invoke(["data", "prepare", str(BUNDLED_CORPUS), "--out", str(bpe), "--tokenizer", "bpe:384"]).exit_code:
        raise AssertionError("data prepare failed")
    return {
        "missing": (["--resume", str(tmp_path / "missing")], f"checkpoint not found: {tmp_path / 'missing'}"),
        "empty": (["--resume", str(empty)], f"no published checkpoint in {empty}"),
        "file": (["--resume", str(a_file)], f"checkpoint path {a_file} is a file, not a checkpoint directory"),
        "loop": (["--resume", str(loop)], f"checkpoint path {loop} is a symlink loop"),
        "preset": (
            ["--resume", str(reference.ckpt), "--set", "model.preset='small'"],
            f"checkpoint {reference.ckpt / 'step_000020'} holds model.preset='tiny', the config says 'small'",
        ),
        "latest": (
            ["--resume", "latest", "--set", f"checkpoint.dir='{empty}'"],
            f"nothing to resume: no published checkpoint in {empty}",
        ),
        "relative to --workdir": (
            ["--resume", "missing", "--workdir", str(tmp_path)],
            f"checkpoint not found: {tmp_path / 'missing'}",
        ),
        "another vocabulary": (
            ["--resume", str(reference.ckpt), "--set", f"data.path='{bpe}'"],
            f"checkpoint {newest} was trained on other data: its vocabulary has 256 tokens, this model's has 384 "
            f"(the vocabulary comes from data.path='{bpe}') (hint: resume on the data it was trained on "
            "(the bundled corpus), or start fresh",
        ),
        "other data": (
            ["--resume", str(reference.ckpt), "--set", f"data.path='{a_file}'"],
            f"checkpoint {newest} was trained on other data (the bundled corpus) than data.path='{a_file}'",
        ),
        "no data": (
            ["--set", f"data.path='{tmp_path / 'missing.txt'}'"],
            f"data.path not found: {tmp_path / 'missing.txt'}",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing",
        "empty",
        "file",
        "loop",
        "preset",
        "latest",
        "relative to --workdir",
        "another vocabulary",
        "other data",
        "no data",
    ],
)
def test_train_refuses_a_resume_that_cannot_work_before_any_rank_starts(reference, tmp_path, case):
    args, expected = _resume_cases(reference, tmp_path)[case]
    r = invoke(["train", "-n", "2", "--parallel", "dp=2", "--set", "train.steps=4", *args])
    assert r.exit_code == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stderr.startswith(f"error: {expected}") and r.stderr.count("\n") == 1, r.stderr
    assert "[rank" not in r.stdout + r.stderr  # no process was started


def test_the_resume_check_before_launch_does_not_import_torch(reference):
    assert_torch_free(["train", "--dry-run", "-n", "2", "--parallel", "dp=2", "--resume", str(reference.ckpt)])
