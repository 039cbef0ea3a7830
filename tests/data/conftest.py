"""Small corpora for the data tests: slices of the bundled corpus as text and JSONL files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distlaunch.engine.data import BUNDLED_CORPUS


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
