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
