"""Where ``distlaunch data prepare`` writes: the dataset is built beside --out and renamed into place,
so a failed or interrupted run leaves the old dataset (or nothing), and a folder prepare did not
write is never emptied (the real CLI; failures mid-run are injected)."""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

import pytest

from distlaunch.data import prepare as prepare_module
from distlaunch.data.index import read_index
from distlaunch.data.tokenizer import Tokenizer
from tests.data.conftest import prepare, refused
from tests.data.test_prepare import decoded, tiny_tiktoken_file


def snapshot(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def fail_on_call(monkeypatch, call: int, action) -> None:
    """Run ``action`` on the ``call``-th encode_batch (the earlier ones encode as usual)."""
    real = Tokenizer.encode_batch
    calls = []

    def encode_batch(self, texts):
        calls.append(1)
        if len(calls) == call:
            action()
        return real(self, texts)

    monkeypatch.setattr(Tokenizer, "encode_batch", encode_batch)


def disk_full():
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.fixture
def dataset(corpus, tmp_path):
    """(a prepared folder, the corpus's text file, its JSONL file)."""
    text, jsonl, _ = corpus
    out = tmp_path / "ds"
    r = prepare(str(text), str(jsonl), "--out", str(out), "--tokenizer", "bpe:400", "--shard-tokens", "2000")
    assert r.exit_code == 0, r.stderr
    return out, text, jsonl


def test_a_failure_part_way_leaves_the_old_dataset_whole_and_nothing_beside_it(dataset, tmp_path, monkeypatch):
    out, _, jsonl = dataset
    before = snapshot(out)
    around = sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.setattr(prepare_module, "ENCODE_BATCH", 4)  # many calls: fail after some shards exist
    fail_on_call(monkeypatch, 5, disk_full)
    r = prepare(str(jsonl), "--out", str(out), "--tokenizer", "bpe:300", "--shard-tokens", "500")
    refused(r, "No space left on device", f"{out} unchanged")
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == around  # no half-built folder left beside it
    assert len(decoded(out)) == 121


def test_ctrl_c_part_way_says_so_exits_130_and_leaves_the_old_dataset(dataset, tmp_path, monkeypatch):
    out, _, jsonl = dataset
    before = snapshot(out)
    monkeypatch.setattr(prepare_module, "ENCODE_BATCH", 4)
    fail_on_call(monkeypatch, 3, lambda: os.kill(os.getpid(), signal.SIGINT))  # a real SIGINT
    r = prepare(str(jsonl), "--out", str(out), "--tokenizer", "bpe:300")
    refused(r, f"interrupted by SIGINT; {out} unchanged", code=130)
    assert snapshot(out) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_fresh_out_that_fails_leaves_no_folder_at_all(corpus, tmp_path, monkeypatch):
    text, _, _ = corpus
    fail_on_call(monkeypatch, 1, disk_full)
    r = prepare(str(text), "--out", str(tmp_path / "new" / "deeper" / "ds"), "--tokenizer", "bpe:300")
    refused(r, "No space left on device")
    assert not (tmp_path / "new").exists()  # not even the parents it made


def test_files_prepare_did_not_write_are_never_deleted(dataset, tmp_path):
    out, text, _ = dataset
    (out / "shard_99999.bin").write_bytes(b"mine")
    before = snapshot(out)
    refused(
        prepare(str(text), "--out", str(out), "--tokenizer", "bpe:300"),
        f"--out {out} holds files that are not part of its dataset: shard_99999.bin",
        "move them out",
    )
    assert snapshot(out) == before
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    refused(
        prepare(str(text), "--out", str(other), "--tokenizer", "bpe:300"),
        f"--out {other} is not empty and holds no prepared dataset (todo.txt)",
    )
    assert (other / "todo.txt").read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert prepare(str(text), "--out", str(empty), "--tokenizer", "bpe:300").exit_code == 0
    assert read_index(empty).documents == 1


def test_switching_tokenizer_kind_leaves_only_the_new_tokenizer_file(dataset, tmp_path):
    out, text, _ = dataset
    assert (out / "tokenizer.json").is_file()
    ranks = tmp_path / "tiny.tiktoken"
    tiny_tiktoken_file(ranks)
    r = prepare(str(text), "--out", str(out), "--tokenizer", str(ranks))
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "index.json",
        "shard_00000.bin",
        "shard_00000.docs",
        "tokenizer.tiktoken",
    ]


@pytest.mark.parametrize(
    ("out", "expected"),
    [
        ("", "--out is empty"),
        (".", "--out . is the current folder"),
        ("afile/sub", "--out afile/sub cannot be made: {tmp}/afile is a file, not a folder"),
        ("/proc/distlaunch-test/ds", "cannot write --out /proc/distlaunch-test/ds: cannot make a folder in /proc"),
    ],
)
def test_an_out_prepare_cannot_use_is_one_line_and_writes_nothing(corpus, tmp_path, monkeypatch, out, expected):
    text, _, _ = corpus
    work = tmp_path / "work"
    work.mkdir()
    (work / "afile").write_text("a file")
    monkeypatch.chdir(work)
    refused(prepare(str(text), "--out", out, "--tokenizer", "bpe:300"), expected.format(tmp=work))
    assert sorted(p.name for p in work.iterdir()) == ["afile"]


@pytest.mark.timeout(60)  # once, prepare waited on the pipe for a writer
def test_an_out_whose_index_is_a_pipe_is_a_damaged_dataset_not_a_wait(dataset):
    out, text, _ = dataset
    (out / "index.json").unlink()
    os.mkfifo(out / "index.json")
    refused(
        prepare(str(text), "--out", str(out), "--tokenizer", "bpe:300"),
        f"--out {out} holds a damaged dataset: {out}/index.json is not a regular file",
        "remove it first",
    )


def test_a_ctrl_c_between_the_two_renames_waits_for_them_and_is_never_lost(tmp_path, monkeypatch):
    """As a library call: the SIGINT that lands inside publish is raised once both renames are done, and the
    handler afterwards is the one before it (an ignored SIGINT left behind would outlive the call)."""
    from distlaunch.data import outdir

    out, staged_folder = tmp_path / "ds", tmp_path / ".ds.new"
    out.mkdir()
    staged_folder.mkdir()
    (staged_folder / "index.json").write_text("{}")
    renames = []
    real_rename = os.rename

    def rename(src, dst):
        real_rename(src, dst)
        renames.append(Path(dst).name)
        if len(renames) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT, between the two renames

    monkeypatch.setattr(outdir.os, "rename", rename)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        outdir.publish(staged_folder, out)
    assert len(renames) == 2 and (out / "index.json").exists()
    assert signal.getsignal(signal.SIGINT) is before
