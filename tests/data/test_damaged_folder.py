"""``distlaunch train`` on a damaged prepared folder: refused with one line and exit 2, by the launcher
before any rank starts where the index and the file sizes tell (torch-free), else by the ranks when
they load the shards (token ids), never a traceback or a foreign file read as tokens (the real CLI)."""

from __future__ import annotations

import json
import os
import shutil
from array import array

import pytest

from distlaunch.data.index import read_index
from distlaunch.data.prepare import read_documents
from distlaunch.errors import UsageError
from tests.checkpoint.conftest import cli_env
from tests.data.conftest import refused
from tests.data.test_train_on_prepared import prepared
from tests.helpers import invoke, run_cli

REPREPARE = "hint: prepare the folder again with distlaunch data prepare"


def edit_index(folder, change) -> None:
    path = folder / "index.json"
    index = json.loads(path.read_text())
    change(index)
    path.write_text(json.dumps(index))


def shard(folder):
    return folder / "shard_00000.bin"


def relink(path, target) -> None:
    path.unlink()
    os.symlink(target, path)


def redir(path) -> None:
    path.unlink()
    path.mkdir()


# name -> (damage, what the one line says); "{d}" is the folder
DAMAGE = {
    "shard truncated to an even size": (
        lambda d: os.truncate(shard(d), 1000),
        "{d}/shard_00000.bin has 1000 bytes, but index.json says",
    ),
    "shard truncated to 0 bytes": (
        lambda d: os.truncate(shard(d), 0),
        "{d}/shard_00000.bin has 0 bytes, but index.json says",
    ),
    "shard missing": (lambda d: shard(d).unlink(), "dataset file missing: {d}/shard_00000.bin"),
    "docs file truncated": (lambda d: os.truncate(d / "shard_00000.docs", 8), "{d}/shard_00000.docs has 8 bytes"),
    "unknown format": (
        lambda d: edit_index(d, lambda i: i.update(format=99)),
        "{d}/index.json has format 99; this distlaunch reads format 1",
    ),
    "absolute shard path": (
        lambda d: edit_index(d, lambda i: i["shards"][0].update(file="/etc/passwd")),
        "shards.0.file='/etc/passwd': must be a file name inside the folder",
    ),
    "shard path outside": (
        lambda d: edit_index(d, lambda i: i["shards"][0].update(file="../../../etc/passwd")),
        "shards.0.file='../../../etc/passwd': must be a file name inside the folder",
    ),
    "wrong total tokens": (lambda d: edit_index(d, lambda i: i.update(tokens=i["tokens"] + 5)), "{d}/index.json says"),
    "wrong shard tokens": (
        lambda d: edit_index(
            d, lambda i: (i["shards"][0].update(tokens=7), i.update(tokens=sum(s["tokens"] for s in i["shards"])))
        ),
        "{d}/shard_00000.bin has",
    ),
    "wrong documents": (
        lambda d: edit_index(d, lambda i: i.update(documents=1)),
        "says 1 document, but its shards add up to",
    ),
    "negative vocabulary": (
        lambda d: edit_index(d, lambda i: i.update(vocab_size=-5)),
        "{d}/index.json is not a valid dataset index: vocab_size=-5: input should be greater than or equal to 1",
    ),
    "dtype changed": (lambda d: edit_index(d, lambda i: i.update(dtype="uint32")), "uint32 tokens ("),
    "index not utf-8": (
        lambda d: (d / "index.json").write_bytes(b'{"format": "\xff"}'),
        "{d}/index.json is not a dataset index: not UTF-8",
    ),
    "shard a symlink loop": (
        lambda d: relink(shard(d), shard(d)),
        "cannot read dataset file {d}/shard_00000.bin: Too many levels of symbolic links",
    ),
    "shard a folder": (lambda d: redir(shard(d)), "dataset file {d}/shard_00000.bin is not a regular file"),
    "index a folder": (
        lambda d: redir(d / "index.json"),
        "{d}/index.json is not a regular file, so not a dataset index",
    ),
    "index a pipe": (  # once, train took the folder for one without an index
        lambda d: ((d / "index.json").unlink(), os.mkfifo(d / "index.json")),
        "{d}/index.json is not a regular file, so not a dataset index",
    ),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return prepared(tmp_path_factory.mktemp("good"), "ds", 0, vocab=300)


@pytest.mark.timeout(60)  # a file the launcher waits on fails here, not at the suite's limit
@pytest.mark.parametrize("case", DAMAGE)
def test_the_launcher_refuses_a_damaged_folder_before_any_rank_starts(good, tmp_path, case):
    damage, expected = DAMAGE[case]
    folder = tmp_path / "d"
    shutil.copytree(good, folder)
    damage(folder)
    args = ["train", "-n", "1", "--set", "train.steps=2", "--set", f"data.path='{folder}'"]
    line = refused(invoke(args), expected.format(d=folder), REPREPARE)
    assert "token_dtype" not in line and "byte tokenizer" not in line  # hints for other kinds of data


@pytest.mark.parametrize("case", ["an id past the vocabulary", "a vocabulary shrunk in index.json"])
def test_a_token_id_outside_the_vocabulary_is_refused_when_the_ranks_load_the_data(good, tmp_path, case):
    folder = tmp_path / "d"
    shutil.copytree(good, folder)
    if case == "an id past the vocabulary":
        data = bytearray(shard(folder).read_bytes())
        data[10:12] = (1299).to_bytes(2, "little")  # one token: no batch of two steps need sample it
        shard(folder).write_bytes(data)
        edit_index(folder, lambda i: i["shards"][0].pop("sha256"))  # as an older prepare: no checksum tells
        expected = f"{shard(folder)} holds token id 1299, outside the vocabulary of 300 in its index.json"
    else:
        edit_index(folder, lambda i: (i.update(vocab_size=100), i["tokenizer"].update(vocab_size=100, eos_id=0)))
        expected = "outside the vocabulary of 100 in its index.json"
    r = run_cli(
        "train", "-n", "1", "--set", "train.steps=2", "--set", f"data.path='{folder}'", env=cli_env(), cwd=tmp_path
    )
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert expected in r.stdout + r.stderr and REPREPARE in r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr and "byte tokenizer" not in r.stdout + r.stderr


def swap_offsets(docs) -> None:
    """Document starts of the right size and count, in another order (bytes a bad copy could hold)."""
    starts = array("Q", docs.read_bytes())
    starts[1], starts[2] = starts[2], starts[1]
    docs.write_bytes(starts.tobytes())


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (swap_offsets, "document 2 starts at token {s1}, before document 1 (token {s2})"),
        (lambda docs: docs.write_bytes(b"\x07" + docs.read_bytes()[1:]), "its first document starts at token 7, not 0"),
        (lambda docs: docs.write_bytes(docs.read_bytes()[:-8] + b"\xff" * 8), "past the shard's {tokens} tokens"),
    ],
)
def test_document_starts_that_do_not_fit_their_shard_are_refused_when_read_back(good, tmp_path, damage, expected):
    folder = tmp_path / "d"
    shutil.copytree(good, folder)
    docs = folder / "shard_00000.docs"
    starts = array("Q", docs.read_bytes())
    assert len(starts) > 3 and list(read_documents(good))  # intact, the folder reads back
    damage(docs)
    tokens = read_index(folder).shards[0].tokens
    with pytest.raises(UsageError) as refused_read:
        list(read_documents(folder))
    line = refused_read.value.message
    assert line.startswith(f"{docs} does not hold the document starts of shard_00000.bin: ")
    assert expected.format(s1=starts[1], s2=starts[2], tokens=tokens) in line


def test_a_shard_changed_within_the_vocabulary_is_refused_by_the_rank_that_checks_it(good, tmp_path):
    # ids still below the vocabulary: the id check passes, only the SHA-256 recorded at prepare tells.
    # Two ranks on this host split the shards (rank 1: shards 1, 3, …): rank 1 finds it, and both stop
    # with its line (neither is left in a collective the other never joins: no traceback).
    folder = tmp_path / "d"
    shutil.copytree(good, folder)
    changed = folder / "shard_00001.bin"
    data = bytearray(changed.read_bytes())
    data[10:12] = ((int.from_bytes(data[10:12], "little") + 1) % 256).to_bytes(2, "little")
    changed.write_bytes(data)
    r = run_cli(
        "train", "-n", "2", "--set", "train.steps=2", "--set", f"data.path='{folder}'", env=cli_env(), cwd=tmp_path
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    line = (
        f"error: {changed} does not match its SHA-256 in index.json (its bytes changed after prepare) (found by rank 1"
    )
    assert f"[rank 0] {line}" in out and f"[rank 1] {line}" in out, out[-3000:]
    assert "copy the folder again from where it was prepared" in out
    assert "Traceback" not in out and "Connection closed by peer" not in out
