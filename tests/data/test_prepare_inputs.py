"""``distlaunch data prepare`` on inputs it must refuse, or read right: one line and
exit 2, nothing written; byte-order marks; long documents encoded in bounded pieces (the real CLI)."""

from __future__ import annotations

import json

import pytest

from distlaunch.data import prepare as prepare_module
from distlaunch.data.index import read_index
from distlaunch.data.prepare import read_documents
from distlaunch.data.tokenizer import Tokenizer, load_saved_tokenizer, train_bpe
from tests.data.conftest import assert_refused_case, paragraphs, prepare, word_level
from tests.data.test_prepare import decoded, tiny_tiktoken_file

# name -> (files to write, --tokenizer, what the one line says); "{tmp}" is the test's folder
CASES = {
    "jsonl not utf-8": (
        {"d.jsonl": b'{"text": "ok"}\n{"text": "\xff"}\n'},
        "bpe:300",
        "d.jsonl:2 is not UTF-8 text (byte 0xff",
    ),
    "lone surrogate, bpe": (
        {"d.jsonl": '{"text": "bad \\ud800 x"}\n'},
        "bpe:300",
        "d.jsonl:1: the text holds a lone surrogate \\ud800",
    ),
    "lone surrogate, tokenizer.json": (
        {"d.jsonl": '{"text": "bad \\udfff x"}\n'},
        "{tmp}/wl.json",
        "d.jsonl:1: the text holds a lone surrogate \\udfff",
    ),
    "nested too deeply": ({"d.jsonl": "[" * 100_000 + "\n"}, "bpe:300", "d.jsonl:1: JSON nested too deeply"),
    "json array": ({"d.jsonl": '["a", "b"]\n'}, "bpe:300", "d.jsonl:1: not a JSON object but an array"),
    "one input twice": ({"twice": None}, "bpe:300", "input given twice: {tmp}/a.txt"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, case):
    assert_refused_case(tmp_path, *CASES[case])


def test_a_byte_order_mark_at_the_start_of_a_file_is_not_part_of_the_text(tmp_path):
    jsonl, text = tmp_path / "d.jsonl", tmp_path / "a.txt"
    jsonl.write_bytes(b"\xef\xbb\xbf" + b'{"text": "first"}\n{"text": "second"}\n')
    text.write_bytes(b"\xef\xbb\xbfplain text")
    r = prepare(str(jsonl), str(text), "--out", str(tmp_path / "out"), "--tokenizer", "bpe:300")
    assert r.exit_code == 0, r.stderr
    assert decoded(tmp_path / "out") == ["first", "second", "plain text"]


def spy_on_encoding(monkeypatch) -> list[int]:
    """The number of characters each encode_batch call gets."""
    sizes: list[int] = []
    real = Tokenizer.encode_batch

    def encode_batch(self, texts):
        sizes.append(sum(map(len, texts)))
        return real(self, texts)

    monkeypatch.setattr(Tokenizer, "encode_batch", encode_batch)
    return sizes


def long_document() -> str:
    """One line of about 100,000 characters, with runs of spaces, tabs, numbers and contractions."""
    words = " ".join(paragraphs(0, 200)).split(" ")
    extras = [" ", "  ", "\t", " 123 ", "'s ", " ", "\n "]
    return "".join(w + extras[i % len(extras)] for i, w in enumerate(words))[:100_000]


@pytest.mark.parametrize("kind", ["bpe", "tiktoken", "gpt2-style tokenizer.json", "whitespace tokenizer.json"])
def test_a_long_document_is_encoded_in_bounded_pieces_to_exactly_the_same_ids(tmp_path, monkeypatch, kind):
    from tokenizers import pre_tokenizers

    doc = long_document()
    src = tmp_path / "one.jsonl"
    src.write_text(json.dumps({"text": doc}) + "\n" + json.dumps({"text": "a short one"}) + "\n")
    if kind == "bpe":
        spec = "bpe:500"
    elif kind == "tiktoken":
        spec = str(tmp_path / "t.tiktoken")
        tiny_tiktoken_file(tmp_path / "t.tiktoken")
    elif kind == "gpt2-style tokenizer.json":
        hf = train_bpe(400, [doc]).backend
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        spec = str(tmp_path / "tokenizer.json")
        hf.save(spec)
    else:
        spec = str(tmp_path / "tokenizer.json")
        word_level(spec, {"[UNK]": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(sorted(set(doc.split()))[:500])}})
    monkeypatch.setattr(prepare_module, "PIECE_CHARS", 1000, raising=False)
    monkeypatch.setattr(prepare_module, "BATCH_CHARS", 4000, raising=False)
    sizes = spy_on_encoding(monkeypatch)
    out = tmp_path / "out"
    r = prepare(str(src), "--out", str(out), "--tokenizer", spec)
    assert r.exit_code == 0, r.stderr
    assert max(sizes) < 5000 < len(doc)  # never the whole document at once
    index = read_index(out)
    tok = load_saved_tokenizer(out, index.tokenizer)
    whole = [[*ids, index.tokenizer.eos_id] for ids in Tokenizer.encode_batch(tok, [doc, "a short one"])]
    assert list(read_documents(out)) == whole
    if kind == "bpe":  # trained on the pieces, the very BPE that the whole document trains
        assert (out / "tokenizer.json").read_text() == train_bpe(500, [doc, "a short one"]).backend.to_str(pretty=True)


def test_a_tokenizer_that_pieces_could_change_gets_each_document_whole(tmp_path, monkeypatch):
    from tokenizers import normalizers

    doc = long_document()
    src = tmp_path / "one.txt"
    src.write_text(doc)
    hf = train_bpe(400, [doc]).backend
    hf.normalizer = normalizers.Lowercase()  # a normalizer: pieces are not known to be safe
    spec = str(tmp_path / "tokenizer.json")
    hf.save(spec)
    monkeypatch.setattr(prepare_module, "PIECE_CHARS", 1000, raising=False)
    sizes = spy_on_encoding(monkeypatch)
    r = prepare(str(src), "--out", str(tmp_path / "out"), "--tokenizer", spec)
    assert r.exit_code == 0, r.stderr
    assert sizes == [len(doc)]
