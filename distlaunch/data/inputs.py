"""The documents in ``distlaunch data prepare``'s inputs, and long documents cut into pieces.

A text file (any suffix but .jsonl/.ndjson) is one document; a JSONL file holds one per line, the
string in its ``text`` field (``field`` picks another). Files are UTF-8; a byte-order mark at the
start is dropped. Every problem is a UsageError naming FILE or FILE:LINE.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from distlaunch.errors import UsageError

JSONL_SUFFIXES = (".jsonl", ".ndjson")
# a decoder with errors="surrogateescape" turns each byte that is not UTF-8 into one of these
_UNDECODABLE = re.compile("[\udc80-\udcff]")
# a space between two non-space characters: where a piece may end (see Tokenizer.splits_at_spaces)
_CUT = re.compile(r"(?<=\S) (?=\S)")
_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


class Document(NamedTuple):
    where: str  # FILE, or FILE:LINE of a JSONL line
    text: str


def check_inputs(inputs: list[Path]) -> None:
    """Every input exists, is a file, and is given once."""
    if not inputs:
        raise UsageError("no input files", "pass one or more text or JSONL files")
    seen: dict[tuple[int, int], Path] = {}
    for path in inputs:
        if not path.exists():
            raise UsageError(f"input not found: {path}", "pass existing text or JSONL files")
        if not path.is_file():
            raise UsageError(f"input is not a file: {path}", "pass text or JSONL files, not folders")
        st = path.stat()
        first = seen.setdefault((st.st_dev, st.st_ino), path)
        if first is not path:
            # most likely an overlapping glob: its documents would be in the data twice
            raise UsageError(
                f"input given twice: {path}" + (f" (as {first})" if str(first) != str(path) else ""),
                "pass each file once",
            )


def _decode_error(where: str, match: re.Match) -> UsageError:
    byte = ord(match.group()) - 0xDC00
    return UsageError(
        f"{where} is not UTF-8 text (byte 0x{byte:02x} at character {match.start() + 1})",
        "convert the file to UTF-8",
    )


def _jsonl_documents(path: Path, field: str) -> Iterator[Document]:
    with path.open(encoding="utf-8-sig", errors="surrogateescape") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            bad = _UNDECODABLE.search(line)
            if bad:
                raise _decode_error(where, bad)
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UsageError(
                    f"{where}: not valid JSON ({err.msg})", "each line of a JSONL file is one JSON object"
                ) from None
            except RecursionError:
                raise UsageError(f"{where}: JSON nested too deeply", "each line is one flat JSON object") from None
            if not isinstance(record, dict):
                kind = "null" if record is None else _JSON_TYPES.get(type(record), type(record).__name__)
                raise UsageError(
                    f"{where}: not a JSON object but {kind}",
                    f'each line is one object with the text in a field: {{"{field}": "..."}}',
                )
            text = record.get(field)
            if not isinstance(text, str):
                raise UsageError(
                    f"{where}: no string field {field!r} in this line",
                    "pick the field that holds the text with --field NAME",
                )
            if "\\u" in line:  # only a \uXXXX escape can put a lone surrogate into the text
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as err:
                    raise UsageError(
                        f"{where}: the text holds a lone surrogate \\u{ord(text[err.start]):04x} (not a character)",
                        "escape a character past U+FFFF as a surrogate pair (\\ud83d\\ude00), or write it as UTF-8",
                    ) from None
            yield Document(where, text)


def _text_document(path: Path) -> Document:
    try:
        return Document(str(path), path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as err:
        raise UsageError(f"{path} is not UTF-8 text (byte {err.start})", "convert it to UTF-8, or pass JSONL") from None


def documents(inputs: list[Path], field: str) -> Iterator[Document]:
    """Every non-empty document of every input, in order."""
    for path in inputs:
        try:
            docs = _jsonl_documents(path, field) if path.suffix in JSONL_SUFFIXES else iter([_text_document(path)])
            yield from (doc for doc in docs if doc.text)
        except OSError as err:
            raise UsageError(f"cannot read {path}: {os.strerror(err.errno or 0)}", "check the file") from None


def pieces(text: str, limit: int) -> Iterator[str]:
    """``text`` in pieces of about ``limit`` characters, each cut just before a space between two
    non-space characters; a text with no such space past ``limit`` stays whole from there on."""
    start = 0
    while len(text) - start > limit:
        cut = _CUT.search(text, start + limit)
        if cut is None:
            break
        yield text[start : cut.start()]
        start = cut.start()
    yield text[start:] if start else text
