"""``distlaunch data verify DIR``: every shard of a prepared folder against the size and SHA-256 that
prepare recorded in index.json (the real CLI, real files damaged as a bad copy or an edit in place
leaves them). Exit 0 intact, 1 damaged (every problem one line), 2 not a dataset."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.data.conftest import refused
from tests.data.test_damaged_folder import edit_index, good, shard, swap_offsets  # noqa: F401 (a fixture)
from tests.helpers import invoke


def verify(folder, *flags: str):
    return invoke(["data", "verify", str(folder), *flags])


def within_vocabulary(path, at: int = 10) -> None:
    """One token changed to another id the vocabulary holds: only the checksum can tell."""
    data = bytearray(path.read_bytes())
    data[at : at + 2] = ((int.from_bytes(data[at : at + 2], "little") + 1) % 256).to_bytes(2, "little")
    path.write_bytes(data)


@pytest.fixture
def copy(good, tmp_path):  # noqa: F811 (the fixture imported above)
    folder = tmp_path / "d"
    shutil.copytree(good, folder)
    return folder


def test_an_intact_folder_is_ok_with_every_shard_checked_by_its_own_checksum(copy):
    index = json.loads((copy / "index.json").read_text())
    assert len(index["shards"]) > 1 and all(len(s["sha256"]) == 64 for s in index["shards"])
    r = verify(copy)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith(f"ok {copy} ({len(index['shards'])} shards, {index['tokens']:,} tokens")
    report = json.loads(verify(copy, "--json").stdout)
    assert report["ok"] is True and report["problems"] == [] and report["verified"] == len(index["shards"])
    assert report["bytes"] == sum(f.stat().st_size for f in copy.glob("shard_*.bin"))


DAMAGE = {
    "a token changed within the vocabulary": (
        lambda d: within_vocabulary(d / "shard_00001.bin"),
        "{d}/shard_00001.bin does not match its SHA-256 in index.json (its bytes changed after prepare)",
    ),
    "a shard truncated": (lambda d: os.truncate(shard(d), 1000), "{d}/shard_00000.bin has 1000 bytes"),
    "a shard missing": (lambda d: shard(d).unlink(), "dataset file missing: {d}/shard_00000.bin"),
    "document starts out of order": (
        lambda d: swap_offsets(d / "shard_00000.docs"),
        "{d}/shard_00000.docs does not hold the document starts of shard_00000.bin: document 2 starts",
    ),
    "counts that do not add up": (
        lambda d: edit_index(d, lambda i: i.update(documents=1)),
        "says 1 document, but its shards add up to",
    ),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_damage_is_one_line_per_problem_and_exit_1(copy, case):
    damage, expected = DAMAGE[case]
    damage(copy)
    r = verify(copy)
    assert r.exit_code == 1, r.stdout + r.stderr
    assert r.stdout.startswith("damaged ") and expected.format(d=copy) in r.stdout, r.stdout
    assert "ok " not in r.stdout and "Traceback" not in r.stdout + r.stderr
    report = json.loads(verify(copy, "--json").stdout)
    assert report["ok"] is False and any(expected.format(d=copy) in p for p in report["problems"])


def test_every_changed_shard_is_named(copy):
    within_vocabulary(copy / "shard_00000.bin")
    within_vocabulary(copy / "shard_00002.bin", at=100)
    damaged = verify(copy).stdout.splitlines()
    assert [line.split()[1] for line in damaged] == [str(copy / "shard_00000.bin"), str(copy / "shard_00002.bin")]


def test_a_folder_prepared_before_per_shard_checksums_is_checked_as_a_whole(copy):
    edit_index(copy, lambda i: [s.pop("sha256") for s in i["shards"]])
    r = verify(copy)
    assert r.exit_code == 0 and "checked as a whole" in r.stdout, r.stdout
    within_vocabulary(copy / "shard_00001.bin")
    r = verify(copy)
    assert r.exit_code == 1
    assert f"damaged the shards do not match the fingerprint in {copy}/index.json" in r.stdout, r.stdout


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda d: (d / "index.json").unlink(), "no index.json in {d}"),
        (lambda d: ((d / "index.json").unlink(), os.mkfifo(d / "index.json")), "is not a regular file"),
    ],
)
def test_a_folder_that_is_no_dataset_is_exit_2(copy, make, expected):
    make(copy)
    refused(verify(copy), expected.format(d=copy))


def test_an_empty_dir_argument_is_one_line():
    refused(invoke(["data", "verify", ""]), "DIR is empty", "give a folder written by distlaunch data prepare")
