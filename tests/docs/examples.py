"""The docs' examples, read by Sybil: console blocks to run, JSON blocks to check against the real models.

A ```` ```console ```` block is run: each ``$ COMMAND`` line in a shell, in one working folder per page, and
what it prints (stdout and stderr, as a terminal shows them) must be the lines under it. Before comparing,
both sides are normalised where a run legitimately differs (``normalise``), and ``...`` stands for any text
within a line, or alone on a line for any number of lines. A console block that cannot run here says why in
an HTML comment right above it: ``<!-- not run: needs two SSH hosts -->``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from sybil import Document, Region
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, FencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[2]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


@dataclass
class Block:
    """One fenced block of a page: its language, its text, where it starts, and why it is not run (if so)."""

    language: str
    text: str
    line: int
    not_run: str | None = None


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)

    def of(self, language: str) -> list[Block]:
        return [b for b in self.blocks if b.language == language]


def _lexers():
    return [
        FencedCodeBlockLexer(language=r"[\w+-]*", mapping={"language": "language", "source": "source"}),
        DirectiveInHTMLCommentLexer(directive="not run", arguments=".+?"),  # lazy: the comment ends on its line
    ]


def read_page(path: Path) -> Page:
    """Every fenced block of a page in order, each console block with the reason it is not run, if given."""
    document = Document(path.read_text(encoding="utf-8"), str(path))
    regions: list[Region] = sorted(
        (region for lexer in _lexers() for region in lexer(document)), key=lambda region: region.start
    )
    page, reason = Page(path), None
    for region in regions:
        if "directive" in region.lexemes:
            reason = str(region.lexemes["arguments"]).strip()
            continue
        line = document.text.count("\n", 0, region.start) + 1
        page.blocks.append(Block(str(region.lexemes["language"]), str(region.lexemes["source"]), line, reason))
        reason = None
    return page


@dataclass
class Command:
    """``$ COMMAND`` and the lines the page shows under it."""

    command: str
    expected: list[str]


def commands(block: Block) -> list[Command]:
    """The commands of a console block; a command continued with a trailing backslash is one command."""
    out: list[Command] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            out.append(Command(line[2:], []))
        elif out and out[-1].command.endswith("\\") and not out[-1].expected:
            out[-1].command = out[-1].command[:-1] + " " + line.strip()
        elif out:
            out[-1].expected.append(line)
        else:
            raise AssertionError(f"a console block must start with '$ COMMAND', not {line!r}")
    for command in out:
        while command.expected and not command.expected[-1].strip():
            command.expected.pop()
    return out


# What differs from run to run, as both the page and a real run are read: the job's id, durations,
# dates, ports, pids, and the working folder of the run.
_NORMALISE = [
    (re.compile(r"\bdl-[0-9a-f]{12}\b"), "dl-ID"),
    (re.compile(r"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\+00:00)?"), "DATE"),
    (re.compile(r"\b\d+(?:\.\d+)?(?:s|ms)\b"), "Ns"),
    (re.compile(r"\b(\d{1,3}(?:\.\d{1,3}){3}|localhost|node\d+):\d{2,5}\b"), r"\1:PORT"),
    (re.compile(r"\bpid \d+\b"), "pid N"),
]


_PYTHON = re.compile(r"(?<![\w/])/\S*/python3?(?:\.\d+)?\b")  # the interpreter's path: a venv's, the system's
_RULE = re.compile(r"([─━═])\1+")  # a table's rules are as long as its widest cell
_RANK_LINE = re.compile(r"^\[(?:\S+ )?rank (\d+)\]")


def normalise(text: str, workdir: str | None = None) -> list[str]:
    """The lines of ``text`` with what legitimately differs between runs replaced, table cells' padding
    collapsed, and the ranks' interleaved lines in rank order (each rank's own order kept)."""
    if workdir:
        text = text.replace(workdir, "/home/me/proj")  # the reader's folder, as the pages write it
    for pattern, replacement in _NORMALISE:
        text = pattern.sub(replacement, text)
    text = _PYTHON.sub("PYTHON", text)
    lines = [_RULE.sub(r"\1", re.sub(r" {2,}", " ", line)).rstrip() for line in text.rstrip().splitlines()]
    return _ranks_in_order(lines)


def _ranks_in_order(lines: list[str]) -> list[str]:
    out: list[str] = []
    run: list[tuple[int, str]] = []
    for line in [*lines, None]:
        found = _RANK_LINE.match(line) if line is not None else None
        if found:
            run.append((int(found.group(1)), line))
            continue
        out += [text for _, text in sorted(run, key=lambda pair: pair[0])]  # sorted() is stable
        run = []
        if line is not None:
            out.append(line)
    return out


def _line_matches(expected: str, actual: str) -> bool:
    if "..." not in expected and "…" not in expected:
        return expected == actual
    parts = [re.escape(part) for part in re.split(r"\.\.\.|…", expected)]
    return re.fullmatch(".*".join(parts), actual) is not None


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether the page's lines describe the real ones (``...`` alone on a line: any number of lines)."""
    if not expected:
        return not actual
    head, rest = expected[0], expected[1:]
    if head.strip() in ("...", "…"):
        return any(matches(rest, actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and _line_matches(head, actual[0]) and matches(rest, actual[1:])


def json_of(block: Block) -> object:
    """A JSON block as data: ``//`` comments dropped (jsonc), ``...``/``…`` entries taken as "and more"."""
    text = re.sub(r"\s//[^\n]*", "", block.text)
    text = re.sub(r",\s*(?:\.\.\.|…)\s*(?=[\]}])", "", text)
    text = text.replace('"…"', '""').replace("…", "")
    text = text.strip()
    if not text.startswith(("{", "[")):  # a fragment of an object's keys
        text = "{" + text + "}"
    return json.loads(text)
