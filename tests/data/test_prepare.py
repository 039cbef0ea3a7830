"""``distlaunch data prepare`` through the CLI: shards, index, tokenizer and round trips, and every bad input."""

from __future__ import annotations

import base64
import json
from array import array

import pytest

from distlaunch.data.index import padded_vocab_size, read_index, token_dtype
from distlaunch.data.prepare import read_documents
from distlaunch.data.tokenizer import R50K_URL, load_saved_tokenizer
from tests.data.conftest import prepare


def decoded(folder) -> list[str]:
    """Every document of a prepared folder, decoded with the tokenizer saved in it (end-of-text dropped)."""
    index = read_index(folder)
    tok = load_saved_tokenizer(folder, index.tokenizer)
    out = []
    for ids in read_documents(folder):
        assert ids[-1] == index.tokenizer.eos_id  # every document ends with end-of-text
        out.append(tok.decode(ids[:-1]))
    return out


def test_bpe_trained_on_the_corpus_writes_shards_index_and_tokenizer_that_round_trip(corpus, tmp_path):
    text, jsonl, docs = corpus
    out = tmp_path / "out"
    r = prepare(str(text), str(jsonl), "--out", str(out), "--tokenizer", "bpe:600", "--shard-tokens", "4000")
    assert r.exit_code == 0, r.stderr
    assert f"data.path={out}" in r.stdout
    index = read_index(out)
    assert index.dtype == "uint16" and index.vocab_size == 600 and index.tokenizer.kind == "bpe"
    assert (out / "tokenizer.json").is_file()
    assert len(index.shards) > 1  # --shard-tokens split it; documents are never split
    assert index.documents == len(docs) == sum(s.documents for s in index.shards)
    for shard in index.shards:
        assert (out / shard.file).stat().st_size == 2 * shard.tokens
        assert (out / shard.docs_file).stat().st_size == 8 * shard.documents
    assert index.tokens == sum(s.tokens for s in index.shards)
    assert decoded(out) == docs
    # BPE compresses: fewer tokens than bytes
    assert index.tokens < sum(len(d.encode()) for d in docs)


def test_a_given_tokenizer_json_is_used_as_is_and_a_large_vocabulary_gets_uint32_shards(corpus, tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    text, _, docs = corpus
    words = sorted({w for w in text.read_text().split()})
    # 70,000 entries: ids past 65,535 need uint32 tokens
    vocab = {"[UNK]": 0, "</s>": 1, **{f"filler{i}": 2 + i for i in range(70_000 - 2 - len(words))}}
    for w in words:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with single spaces
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    out = tmp_path / "out"
    r = prepare(str(text), "--out", str(out), "--tokenizer", str(path), "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["index"]["dtype"] == "uint32" == token_dtype(70_000)
    assert report["index"]["vocab_size"] == 70_000 and report["padded_vocab_size"] == 70_016
    assert report["index"]["tokenizer"]["eos_id"] == 1  # </s>
    ids = next(read_documents(out))
    assert max(ids) >= 1 << 16  # really past uint16
    assert decoded(out) == [" ".join(docs[0].split())]


def tiny_tiktoken_file(path) -> None:
    """A tiktoken rank file: the 256 bytes, then a few merges."""
    merges = [b"th", b"he", b"the", b" the", b"an", b"and", b" and"]
    ranks = [bytes([b]) for b in range(256)] + merges
    path.write_bytes(b"".join(base64.b64encode(t) + b" " + str(i).encode() + b"\n" for i, t in enumerate(ranks)))


def test_a_tiktoken_rank_file_tokenizes_offline_and_round_trips(corpus, tmp_path):
    text, _, docs = corpus
    ranks = tmp_path / "tiny.tiktoken"
    tiny_tiktoken_file(ranks)
    out = tmp_path / "out"
    r = prepare(str(text), "--out", str(out), "--tokenizer", str(ranks))
    assert r.exit_code == 0, r.stderr
    index = read_index(out)
    assert index.tokenizer.kind == "tiktoken" and index.vocab_size == 264 and index.tokenizer.eos_id == 263
    assert (out / "tokenizer.tiktoken").read_bytes() == ranks.read_bytes()
    assert decoded(out) == docs[:1]
    assert 259 in next(read_documents(out))  # "the" merged into one token


def test_gpt2_without_its_file_in_tiktokens_cache_says_where_to_put_it(corpus, tmp_path):
    text, _, _ = corpus
    cache = tmp_path / "cache"
    r = prepare(
        str(text), "--out", str(tmp_path / "out"), "--tokenizer", "gpt2", env={"TIKTOKEN_CACHE_DIR": str(cache)}
    )
    assert r.exit_code == 2
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in r.stderr
    assert f"not in {cache}" in line and "never downloads" in line
    assert R50K_URL in line and str(cache / "r50k_base.tiktoken") in line and "TIKTOKEN_CACHE_DIR" in line
    assert not (tmp_path / "out").exists()


def test_gpt2_with_a_wrong_file_in_the_cache_is_refused_not_downloaded(corpus, tmp_path):
    text, _, _ = corpus
    cache = tmp_path / "cache"
    cache.mkdir()
    tiny_tiktoken_file(cache / "r50k_base.tiktoken")
    r = prepare(
        str(text), "--out", str(tmp_path / "out"), "--tokenizer", "gpt2", env={"TIKTOKEN_CACHE_DIR": str(cache)}
    )
    assert r.exit_code == 2
    assert "is not tiktoken's r50k_base.tiktoken" in r.stderr and "Traceback" not in r.stderr
    assert (cache / "r50k_base.tiktoken").exists()  # left alone


def test_field_picks_the_jsonl_field_that_holds_the_text(tmp_path):
    src = tmp_path / "d.jsonl"
    src.write_text(json.dumps({"body": "hello world"}) + "\n\n" + json.dumps({"body": "second doc"}) + "\n")
    out = tmp_path / "out"
    assert prepare(str(src), "--out", str(out), "--tokenizer", "bpe:300").exit_code == 2  # no "text" field
    r = prepare(str(src), "--out", str(out), "--tokenizer", "bpe:300", "--field", "body")
    assert r.exit_code == 0, r.stderr
    assert decoded(out) == ["hello world", "second doc"]


@pytest.mark.parametrize(
    ("files", "tokenizer", "expected"),
    [
        ({}, "bpe:300", "input not found"),
        ({"empty.txt": ""}, "bpe:300", "the corpus is empty"),
        ({"a.txt": "some text"}, "bpe:abc", "bad --tokenizer bpe:abc"),
        ({"a.txt": "some text"}, "bpe:100", "from 257 to"),
        ({"a.txt": "some text"}, "words", "unknown --tokenizer 'words'"),
        ({"a.txt": "some text"}, "missing/tokenizer.json", "tokenizer file not found"),
        ({"d.jsonl": '{"text": "fine"}\n{"text": oops}\n'}, "bpe:300", "d.jsonl:2: not valid JSON"),
        ({"d.jsonl": '{"text": "fine"}\n["a list"]\n'}, "bpe:300", "d.jsonl:2: not a JSON object but an array"),
        ({"bad.txt": b"\xff\xfe not utf-8"}, "bpe:300", "is not UTF-8 text"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, files, tokenizer, expected):
    inputs = []
    for name, content in files.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        inputs.append(str(path))
    r = prepare(*(inputs or [str(tmp_path / "nope.txt")]), "--out", str(tmp_path / "out"), "--tokenizer", tokenizer)
    assert r.exit_code == 2, r.stdout
    assert expected in r.stderr and "hint:" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_bad_line_late_in_a_jsonl_file_leaves_an_earlier_prepared_folder_untouched(corpus, tmp_path):
    text, _, _ = corpus
    out = tmp_path / "out"
    assert prepare(str(text), "--out", str(out), "--tokenizer", "bpe:300").exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(500)) + "{oops\n")
    tok = out / "tokenizer.json"
    r = prepare(str(bad), "--out", str(out), "--tokenizer", str(tok.rename(tmp_path / "tokenizer.json")))
    assert r.exit_code == 2 and "bad.jsonl:501: not valid JSON" in r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {k: v for k, v in before.items() if k != "tokenizer.json"}


def test_preparing_again_replaces_the_old_shards(corpus, tmp_path):
    text, jsonl, _ = corpus
    out = tmp_path / "out"
    assert (
        prepare(str(text), str(jsonl), "--out", str(out), "--tokenizer", "bpe:400", "--shard-tokens", "2000").exit_code
        == 0
    )
    assert prepare(str(text), "--out", str(out), "--tokenizer", "bpe:400").exit_code == 0
    index = read_index(out)
    assert len(index.shards) == 1 and sorted(p.name for p in out.glob("shard_*")) == [
        "shard_00000.bin",
        "shard_00000.docs",
    ]


def test_padded_vocabulary_is_a_multiple_of_128():
    assert padded_vocab_size(50_257) == 50_304
    assert padded_vocab_size(256) == 256 and padded_vocab_size(257) == 384
    assert token_dtype(65_536) == "uint16" and token_dtype(65_537) == "uint32"
    assert array("Q").itemsize == 8  # the .docs offsets
