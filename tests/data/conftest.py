"""Small corpora for the data tests: slices of the bundled corpus as text and JSONL files."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from distlaunch.data.source import BUNDLED_CORPUS
from tests.helpers import invoke


def paragraphs(start: int, count: int) -> list[str]:
    """``count`` paragraphs of the bundled corpus from ``start`` on."""
    paras = [p for p in BUNDLED_CORPUS.read_text().split("\n\n") if p.strip()]
    return paras[start : start + count]


@pytest.fixture
def corpus(tmp_path) -> tuple[Path, Path, list[str]]:
    """(a text file, a JSONL file, every document in order): 1 + 120 documents."""
    text = tmp_path / "book.txt"
    text.write_text("\n\n".join(paragraphs(0, 40)))
    records = paragraphs(40, 120)
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(records)))
    return text, jsonl, [text.read_text(), *records]


def refused(result, *expected: str, code: int = 2) -> str:
    """``result`` is exit ``code`` with one error line on stderr that holds every ``expected``: no
    traceback, no "internal error". Returns the line."""
    assert result.exit_code == code, result.stdout[-2000:] + result.stderr[-2000:]
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1, result.stderr
    assert line.startswith("error: ") and "internal error" not in line and "Traceback" not in result.stderr
    for text in expected:
        assert text in line, line
    return line


def prepare(*args: str, env: dict[str, str] | None = None):
    """``distlaunch data prepare ARGS`` through the real CLI, in-process."""
    return invoke(["data", "prepare", *args], env=env)


def word_level(path, vocab: dict[str, int]) -> None:
    """A WordLevel tokenizer.json with ``vocab``, split at whitespace."""
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers

    tok = HF(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))


def ranks_file(path, tokens: list[bytes], ranks: list[int] | None = None) -> None:
    """A tiktoken rank file: one ``base64(token) rank`` line per token."""
    ranks = list(range(len(tokens))) if ranks is None else ranks
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in zip(tokens, ranks, strict=True)))


def assert_refused_case(tmp_path, files: dict, tokenizer: str, expected: str) -> None:
    """Write ``files`` (a .json name: a WordLevel vocabulary; a list or (tokens, ranks): a tiktoken rank
    file; None: the input a.txt once more; else the bytes or text, a .jsonl also given as input), run
    prepare on a.txt and them with ``--tokenizer``: one line holding ``expected`` ("{tmp}": the test's
    folder), exit 2, and nothing written, neither --out nor anything beside it."""
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
    assert sorted(p.name for p in tmp_path.iterdir()) == before
