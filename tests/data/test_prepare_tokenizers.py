"""``distlaunch data prepare`` on tokenizers it must refuse: one line and exit 2, nothing written (the real CLI)."""

from __future__ import annotations

import base64

import pytest

from tests.data.conftest import refused
from tests.data.test_prepare import prepare


def word_level(path, vocab: dict[str, int]) -> None:
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers

    tok = HF(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))


def ranks_file(path, tokens: list[bytes], ranks: list[int] | None = None) -> None:
    ranks = list(range(len(tokens))) if ranks is None else ranks
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in zip(tokens, ranks, strict=True)))


BYTES = [bytes([b]) for b in range(256)]
# name -> (files to write, --tokenizer, what the one line says); "{tmp}" is the test's folder
CASES = {
    "tiktoken lacking bytes": (
        {"t.tiktoken": "YQ== 0\nYg== 1\n"},
        "{tmp}/t.tiktoken",
        "lacks 254 of the 256 single-byte tokens",
    ),
    "tiktoken repeating a token": (
        {"t.tiktoken": [*BYTES, b"ab", b"ab"]},
        "{tmp}/t.tiktoken",
        "t.tiktoken:258: token repeats line 257",
    ),
    "tiktoken repeating a rank": (
        {"t.tiktoken": ([*BYTES, b"ab"], [*range(256), 3])},
        "{tmp}/t.tiktoken",
        "t.tiktoken:257: rank repeats line 4",
    ),
    "word level without unk": (
        {"nounk.json": {"a": 0, "</s>": 1}},
        "{tmp}/nounk.json",
        "unknown-word token '[UNK]' is not in its vocabulary",
    ),
    "no end-of-text token": (
        {"noeos.json": {"a": 0, "[UNK]": 1}},
        "{tmp}/noeos.json",
        "has no end-of-text token (none of <|endoftext|>, </s>",
    ),
    "a folder as tokenizer": (
        {"tok/tokenizer.json": {"[UNK]": 0, "</s>": 1}},
        "{tmp}/tok",
        "--tokenizer {tmp}/tok is a folder (hint: pass the file: --tokenizer {tmp}/tok/tokenizer.json)",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_bad_input_or_tokenizer_is_one_line_exit_2_and_writes_nothing(tmp_path, case):
    files, tokenizer, expected = CASES[case]
    (tmp_path / "a.txt").write_text("some text to tokenize")
    word_level(tmp_path / "wl.json", {"[UNK]": 0, "</s>": 1, "bad": 2})
    inputs = [str(tmp_path / "a.txt")]
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        if name.endswith(".json"):
            word_level(path, content)
        elif isinstance(content, list | tuple):
            ranks_file(path, *(content if isinstance(content, tuple) else (content,)))
        elif content is None:
            inputs.append(str(tmp_path / "a.txt"))
        else:
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
            inputs += [str(path)] if name.endswith(".jsonl") else []
    before = sorted(p.name for p in tmp_path.iterdir())
    r = prepare(*inputs, "--out", str(tmp_path / "out"), "--tokenizer", tokenizer.format(tmp=tmp_path))
    refused(r, expected.format(tmp=tmp_path), "hint:")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no --out, nothing beside it
