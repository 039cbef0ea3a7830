"""``distlaunch data prepare``: text or JSONL files -> memory-mapped token shards, an index, the tokenizer.

A text file (any suffix but .jsonl/.ndjson) is one document; a JSONL file holds one document per
line, the string in its ``text`` field (``field`` picks another). Every document is encoded and
followed by the tokenizer's end-of-text token; a new shard starts once a shard holds
``shard_tokens`` tokens (documents are never split across shards). See ``distlaunch.data.index``
for the folder's layout.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel

from distlaunch.data.index import INDEX_FILE, DatasetIndex, Shard, token_dtype, write_index
from distlaunch.data.tokenizer import make_tokenizer, parse_spec
from distlaunch.errors import UsageError

JSONL_SUFFIXES = (".jsonl", ".ndjson")
ENCODE_BATCH = 256  # documents per encode_batch call
DEFAULT_SHARD_TOKENS = 100_000_000


class PrepareSpec(BaseModel):
    """What ``distlaunch data prepare`` was asked to do."""

    inputs: list[Path]
    out: Path
    tokenizer: str
    field: str = "text"
    shard_tokens: int = DEFAULT_SHARD_TOKENS


class PrepareReport(BaseModel):
    """What prepare wrote."""

    out: str
    index: DatasetIndex
    padded_vocab_size: int


def check_inputs(spec: PrepareSpec) -> None:
    """Every input exists and is a file; the output is not a file; options are sane."""
    if not spec.inputs:
        raise UsageError("no input files", "pass one or more text or JSONL files")
    for path in spec.inputs:
        if not path.exists():
            raise UsageError(f"input not found: {path}", "pass existing text or JSONL files")
        if not path.is_file():
            raise UsageError(f"input is not a file: {path}", "pass text or JSONL files, not folders")
    if spec.out.exists() and not spec.out.is_dir():
        raise UsageError(f"--out {spec.out} is a file", "pass a folder (it is created if missing)")
    if spec.shard_tokens < 1:
        raise UsageError(f"bad --shard-tokens {spec.shard_tokens}", "use a positive number of tokens")


def _jsonl_documents(path: Path, field: str) -> Iterator[str]:
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UsageError(
                    f"{path}:{number}: not valid JSON ({err.msg})", "each line of a JSONL file is one JSON object"
                ) from None
            text = record.get(field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise UsageError(
                    f"{path}:{number}: no string field {field!r} in this line",
                    "pick the field that holds the text with --field NAME",
                )
            yield text


def documents(spec: PrepareSpec) -> Iterator[str]:
    """Every document of every input, in order; empty documents are skipped."""
    for path in spec.inputs:
        if path.suffix in JSONL_SUFFIXES:
            docs: Iterator[str] = _jsonl_documents(path, spec.field)
        else:
            try:
                docs = iter([path.read_text(encoding="utf-8")])
            except UnicodeDecodeError as err:
                raise UsageError(
                    f"{path} is not UTF-8 text (byte {err.start})", "convert it to UTF-8, or pass JSONL"
                ) from None
        yield from (doc for doc in docs if doc)


def _batches(items: Iterator[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class ShardWriter:
    """Appends documents to ``shard_NNNNN.bin`` files, starting a new one past ``limit`` tokens."""

    def __init__(self, folder: Path, dtype: str, limit: int):
        self.folder, self.limit = folder, limit
        self.typecode = {"uint16": "H", "uint32": "I"}[dtype]
        self.shards: list[Shard] = []
        self.digest = hashlib.sha256()
        self.tokens = array(self.typecode)
        self.offsets = array("Q")

    def add(self, ids: list[int]) -> None:
        if len(self.tokens) >= self.limit:
            self.flush()
        self.offsets.append(len(self.tokens))
        self.tokens.extend(ids)

    def flush(self) -> None:
        if not self.offsets:
            return
        name = f"shard_{len(self.shards):05d}"
        for values, suffix in ((self.tokens, ".bin"), (self.offsets, ".docs")):
            if sys.byteorder == "big":
                values.byteswap()
            data = values.tobytes()
            (self.folder / (name + suffix)).write_bytes(data)
            if suffix == ".bin":
                self.digest.update(data)
        self.shards.append(
            Shard(file=name + ".bin", docs_file=name + ".docs", tokens=len(self.tokens), documents=len(self.offsets))
        )
        self.tokens, self.offsets = array(self.typecode), array("Q")


def prepare(spec: PrepareSpec) -> PrepareReport:
    """Tokenize the inputs into ``spec.out``; returns the index it wrote."""
    from distlaunch.data.index import padded_vocab_size

    check_inputs(spec)
    kind, _ = parse_spec(spec.tokenizer)
    tokenizer = make_tokenizer(spec.tokenizer, documents(spec) if kind == "bpe" else None)
    # one full pass before anything is written: a bad line anywhere leaves DIR untouched
    if not sum(1 for _ in documents(spec)):
        raise UsageError(
            f"the corpus is empty: no text in {', '.join(map(str, spec.inputs))}", "pass files that hold text"
        )
    dtype = token_dtype(tokenizer.vocab_size)
    spec.out.mkdir(parents=True, exist_ok=True)
    (spec.out / INDEX_FILE).unlink(missing_ok=True)  # a folder without its index is never read
    for old in [*spec.out.glob("shard_*.bin"), *spec.out.glob("shard_*.docs")]:
        old.unlink()
    writer = ShardWriter(spec.out, dtype, spec.shard_tokens)
    eos = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
    for batch in _batches(documents(spec), ENCODE_BATCH):
        for ids in tokenizer.encode_batch(batch):
            writer.add(ids + eos)
    writer.flush()
    index = DatasetIndex(
        dtype=dtype,
        vocab_size=tokenizer.vocab_size,
        tokenizer=tokenizer.save(spec.out),
        shards=writer.shards,
        tokens=sum(s.tokens for s in writer.shards),
        documents=sum(s.documents for s in writer.shards),
        fingerprint=writer.digest.hexdigest(),
        sources=[str(p) for p in spec.inputs],
    )
    write_index(spec.out, index)
    return PrepareReport(out=str(spec.out), index=index, padded_vocab_size=padded_vocab_size(index.vocab_size))


def read_documents(folder: str | Path) -> Iterator[list[int]]:
    """Every document's token ids back from a prepared folder (with its end-of-text token)."""
    from distlaunch.data.index import read_index

    root = Path(folder).expanduser()
    index = read_index(root)
    typecode = {"uint16": "H", "uint32": "I"}[index.dtype]
    for shard in index.shards:
        tokens, offsets = array(typecode), array("Q")
        tokens.frombytes((root / shard.file).read_bytes())
        offsets.frombytes((root / shard.docs_file).read_bytes())
        if sys.byteorder == "big":
            tokens.byteswap()
            offsets.byteswap()
        bounds = [*offsets, len(tokens)]
        for start, end in itertools.pairwise(bounds):
            yield tokens[start:end].tolist()
