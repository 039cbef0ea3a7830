"""What "the same data" means when a checkpoint resumes: the data's fingerprint (``data/source.py``)."""

from __future__ import annotations

import hashlib
import os

from distlaunch.data.source import SAMPLE_BYTES, SAMPLES, data_fingerprint, same_data
from tests.helpers import invoke

BIG = 3 * SAMPLES * SAMPLE_BYTES  # past the size read whole: sampled


def test_files_of_one_size_that_differ_past_their_first_mib_are_other_data(tmp_path):
    head = os.urandom(2 << 20)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(head + os.urandom(BIG - len(head)))
    b.write_bytes(head + os.urandom(BIG - len(head)))
    assert data_fingerprint(str(a)) != data_fingerprint(str(b))
    tail = bytearray(a.read_bytes())
    tail[-1] ^= 1  # the last byte is always read
    b.write_bytes(bytes(tail))
    assert data_fingerprint(str(a)) != data_fingerprint(str(b))


def test_a_small_file_is_read_whole_and_its_place_does_not_count(tmp_path):
    data = bytearray(os.urandom(SAMPLES * SAMPLE_BYTES))
    a, b = tmp_path / "a.txt", tmp_path / "moved" / "a.txt"
    b.parent.mkdir()
    a.write_bytes(data)
    b.write_bytes(data)
    assert data_fingerprint(str(a)) == data_fingerprint(str(b))
    data[len(data) // 2 + 7] ^= 1
    b.write_bytes(data)
    assert data_fingerprint(str(a)) != data_fingerprint(str(b))


def test_one_corpus_cut_into_other_shards_is_other_data(tmp_path, corpus):
    _, jsonl, _ = corpus  # 120 documents: a shard ends at the first document end past --shard-tokens

    def prepare(name: str, shard_tokens: int) -> str:
        out = tmp_path / name
        args = ["data", "prepare", str(jsonl), "--out", str(out), "--tokenizer", "bpe:300"]
        r = invoke([*args, "--shard-tokens", str(shard_tokens)])
        assert r.exit_code == 0, r.stderr
        return str(out)

    small, large, again = prepare("small", 4_000), prepare("large", 6_000), prepare("again", 4_000)
    assert data_fingerprint(small) != data_fingerprint(large)  # same tokens, other windows: other batches
    assert data_fingerprint(small) == data_fingerprint(again)


def test_a_fingerprint_of_the_first_version_still_matches_its_data(tmp_path):
    """Checkpoints written before the fingerprint read the whole data hold the sha256 of a file's first MiB."""
    a, b, c = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt"
    a.write_bytes(os.urandom(BIG))
    b.write_bytes(a.read_bytes()[: 1 << 20] + os.urandom(BIG - (1 << 20)))  # a's first MiB, then other bytes
    c.write_bytes(os.urandom(BIG))
    first = f"file:{BIG}:{hashlib.sha256(a.read_bytes()[: 1 << 20]).hexdigest()}"
    assert same_data(first, data_fingerprint(str(a)), str(a))
    assert not same_data(first, data_fingerprint(str(c)), str(c))
    # a fingerprint of this version tells what the first one could not
    assert same_data(data_fingerprint(str(a)), data_fingerprint(str(a)), str(a))
    assert not same_data(data_fingerprint(str(a)), data_fingerprint(str(b)), str(b))
