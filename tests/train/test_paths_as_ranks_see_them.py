"""Paths a training job reads or writes, checked by ``distlaunch train`` where the ranks will open them:
from ``--workdir``, with ``~`` expanded (the real CLI, in-process, and one real run)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from distlaunch.data.source import DataIdentity
from distlaunch.training.checkpoint.manifest import CheckpointMeta, Layout, write_meta
from distlaunch.training.presets import PRESETS
from tests.checkpoint.conftest import REPO, cli_env
from tests.helpers import invoke, run_cli

TINY = ["-n", "1", "--parallel", "dp=1", "--set", "model.preset='tiny'"]


def prepare(out: Path) -> None:
    corpus = REPO / "distlaunch" / "data" / "corpus.txt"
    assert invoke(["data", "prepare", str(corpus), "--out", str(out), "--tokenizer", "bpe:384"]).exit_code == 0


def test_a_relative_data_path_is_the_one_in_the_workdir(tmp_path, monkeypatch):
    work = tmp_path / "wd"
    prepare(work / "prep")
    (tmp_path / "prep").mkdir()  # a folder of the same name where the launcher runs: not the ranks' data
    monkeypatch.chdir(tmp_path)
    r = invoke(["train", *TINY, "--dry-run", "--json", "--workdir", str(work), "--set", "data.path='prep'"])
    assert r.exit_code == 0, r.stderr  # before: "data.path is a directory without an index.json: prep"
    params = json.loads(r.stdout)["memory"]["ranks"][0]["params"]
    plain = json.loads(invoke(["train", *TINY, "--dry-run", "--json"]).stdout)["memory"]["ranks"][0]["params"]
    assert params - plain == 4 * 2 * (384 - 256) * PRESETS["tiny"].d_model  # planned with the dataset's vocabulary


def test_a_checkpoint_of_the_first_fingerprint_is_checked_against_the_data_in_the_workdir(tmp_path, monkeypatch):
    work, text = tmp_path / "wd", b"the ranks' text " * 4000
    (work / "ck" / "step_000002").mkdir(parents=True)
    (work / "my.txt").write_bytes(text)
    (tmp_path / "my.txt").write_bytes(b"another text where the launcher runs")
    first = f"file:{len(text)}:{hashlib.sha256(text[: 1 << 20]).hexdigest()}"  # as checkpoints of the first version
    meta = CheckpointMeta(
        step=2, preset="tiny", layout=Layout(dp=1, tp=1, pp=1, zero=0, world_size=1), components={},
        files_bytes=0, extras=[], job="dl-000000000000", saved_at="2026-11-24T00:00:00+00:00",
        torch_version="2.13.0", save_seconds=0.1, data=DataIdentity(fingerprint=first, path="my.txt", vocab_size=256),
    )  # fmt: skip
    write_meta(work / "ck" / "step_000002", meta)
    (work / "ck" / "latest").write_text("step_000002\n")
    monkeypatch.chdir(tmp_path)
    args = ["train", *TINY, "--dry-run", "--workdir", str(work), "--set", "checkpoint.dir='ck'"]
    r = invoke([*args, "--set", "data.path='my.txt'", "--set", "train.steps=3"])
    assert r.exit_code == 0, r.stderr  # before: the launcher's own my.txt was read, and refused
    (work / "my.txt").write_bytes(text[::-1])
    r = invoke([*args, "--set", "data.path='my.txt'", "--set", "train.steps=3"])
    assert r.exit_code == 2 and "was trained on other data" in r.stderr, r.stderr


def test_a_tilde_in_metrics_file_is_where_the_rank_writes(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    r = invoke(["train", *TINY, "--dry-run", "--json", "--metrics-file=~/m.jsonl"], env={"HOME": str(home)})
    assert r.exit_code == 0, r.stderr
    argv = json.loads(r.stdout)["nodes"][0]["ranks"][0]["argv"]
    assert argv[argv.index("--metrics-file") + 1] == str(home / "m.jsonl")  # before: ./~/m.jsonl


def test_an_empty_path_option_is_refused_not_read_as_the_current_folder(tmp_path):
    for flag in ("--metrics-file", "--log-dir"):
        r = invoke(["train", *TINY, "--dry-run", flag, ""])
        assert r.exit_code == 2 and f"{flag} is empty" in r.stderr, r.stderr  # before: '.', the current folder
    for flag in ("--log-dir", "--workdir", "-H", "--ssh-config"):  # an unset variable: --workdir "$WORKDIR"
        r = invoke(["run", "--dry-run", "-n", "1", flag, " ", "--", "python", "-c", "1"])
        assert r.exit_code == 2 and f"{flag} is empty" in r.stderr, r.stderr
    r = invoke(["train", "", "--dry-run"])
    assert r.exit_code == 2 and "CONFIG is empty" in r.stderr, r.stderr


def test_a_metrics_file_that_fills_up_is_one_warning_and_the_training_goes_on(tmp_path):
    sets = ["train.steps=2", "train.global_batch_size=2", "train.seq_len=16", "train.eval_every=0"]
    args = [arg for s in sets for arg in ("--set", s)]
    r = run_cli("train", *TINY, *args, "--metrics-file", "/dev/full", env=cli_env(), cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]  # before: three chained tracebacks, exit 1
    out = r.stdout + r.stderr
    assert "warning: metrics file /dev/full cannot be written (no space left on device)" in out
    assert "Traceback" not in out and not Path("/dev/loss_curve.png").exists()
