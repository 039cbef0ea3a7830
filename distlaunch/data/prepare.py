"""``distlaunch data prepare``: text or JSONL files -> memory-mapped token shards, an index, the tokenizer.

Every document (``distlaunch.data.inputs``) is encoded and followed by the tokenizer's end-of-text
token; a new shard starts once a shard holds ``shard_tokens`` tokens (documents are never split
across shards). The folder is built beside ``--out`` and renamed into place when complete
(``distlaunch.data.outdir``). See ``distlaunch.data.index`` for its layout.
"""

from __future__ import annotations

import hashlib
import itertools
import sys
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel

from distlaunch import interrupts
from distlaunch.data.index import (
    REPREPARE,
    DatasetIndex,
    Shard,
    check_dataset,
    padded_vocab_size,
    token_dtype,
    write_index,
)
from distlaunch.data.inputs import check_inputs, documents, pieces
from distlaunch.data.outdir import check_out, publish, staged
from distlaunch.data.tokenizer import Tokenizer, bpe_vocab, make_tokenizer, parse_spec, train_bpe
from distlaunch.data.verify import docs_problem, read_offsets
from distlaunch.errors import DistlaunchError, ExitCode, Interrupted, UsageError
from distlaunch.readable import plural

ENCODE_BATCH = 256  # pieces per encode_batch call
# Encoding a text holds a few hundred bytes per token (HF keeps offsets and token strings), so a long
# document is encoded in pieces of about PIECE_CHARS, and one call gets at most BATCH_CHARS.
PIECE_CHARS = 1 << 18
BATCH_CHARS = 1 << 21
DEFAULT_SHARD_TOKENS = 100_000_000
Progress = Callable[[str], None]


class PrepareSpec(BaseModel):
    """What ``distlaunch data prepare`` was asked to do."""

    inputs: list[Path]
    out: str | Path  # a str keeps an empty --out visible (Path("") is ".")
    tokenizer: str
    field: str = "text"
    shard_tokens: int = DEFAULT_SHARD_TOKENS


class PrepareReport(BaseModel):
    """What prepare wrote."""

    out: str
    index: DatasetIndex
    padded_vocab_size: int


class Piece(NamedTuple):
    where: str  # the document's FILE or FILE:LINE
    text: str
    starts: bool  # the document's first piece
    ends: bool  # its last: the end-of-text token follows


def _pieces(docs: Iterator, split: bool) -> Iterator[Piece]:
    for doc in docs:
        parts = pieces(doc.text, PIECE_CHARS) if split else iter([doc.text])
        part = next(parts)
        first = True
        for following in parts:
            yield Piece(doc.where, part, first, False)
            part, first = following, False
        yield Piece(doc.where, part, first, True)


def _batches(items: Iterator[Piece]) -> Iterator[list[Piece]]:
    batch: list[Piece] = []
    chars = 0
    for item in items:
        if batch and (len(batch) == ENCODE_BATCH or chars + len(item.text) > BATCH_CHARS):
            yield batch
            batch, chars = [], 0
        batch.append(item)
        chars += len(item.text)
    if batch:
        yield batch


def _encode(tokenizer: Tokenizer, batch: list[Piece]) -> list[list[int]]:
    """Token ids of each piece; a document the tokenizer fails on is a UsageError naming it."""
    try:
        return tokenizer.encode_batch([p.text for p in batch])
    except (KeyboardInterrupt, SystemExit, Interrupted):
        raise
    except BaseException:  # tokenizers' errors, and a Rust panic (not an Exception)
        for piece in batch:
            try:
                tokenizer.encode_batch([piece.text])
            except (KeyboardInterrupt, SystemExit, Interrupted):
                raise
            except BaseException as err:
                why = (str(err).splitlines() or [type(err).__name__])[0]
                raise UsageError(
                    f"{piece.where}: tokenizer {tokenizer.info.name} cannot encode this document: {why}",
                    "check the tokenizer, or leave the document out",
                ) from None
        raise


class ShardWriter:
    """Appends documents to ``shard_NNNNN.bin`` files, starting a new one past ``limit`` tokens."""

    def __init__(self, folder: Path, dtype: str, limit: int):
        self.folder, self.limit = folder, limit
        self.typecode = {"uint16": "H", "uint32": "I"}[dtype]
        self.shards: list[Shard] = []
        self.digest = hashlib.sha256()
        self.tokens = array(self.typecode)
        self.offsets = array("Q")

    def add(self, ids: list[int], starts: bool = True) -> None:
        """Append ``ids`` to the current document, or start a new one with them."""
        if starts:
            if len(self.tokens) >= self.limit:
                self.flush()
            self.offsets.append(len(self.tokens))
        self.tokens.extend(ids)

    def flush(self) -> None:
        if not self.offsets:
            return
        name = f"shard_{len(self.shards):05d}"
        sha256 = None
        for values, suffix in ((self.tokens, ".bin"), (self.offsets, ".docs")):
            if sys.byteorder == "big":
                values.byteswap()
            data = values.tobytes()
            (self.folder / (name + suffix)).write_bytes(data)
            if suffix == ".bin":
                self.digest.update(data)
                sha256 = hashlib.sha256(data).hexdigest()
        self.shards.append(
            Shard(
                file=name + ".bin",
                docs_file=name + ".docs",
                tokens=len(self.tokens),
                documents=len(self.offsets),
                sha256=sha256,
            )
        )
        self.tokens, self.offsets = array(self.typecode), array("Q")


def _write_dataset(folder: Path, tokenizer: Tokenizer, spec: PrepareSpec, progress: Progress) -> DatasetIndex:
    """Encode every document into ``folder``'s shards, save the tokenizer, write the index last."""
    dtype = token_dtype(tokenizer.vocab_size)
    writer = ShardWriter(folder, dtype, spec.shard_tokens)
    eos = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
    count = 0
    for batch in _batches(_pieces(documents(spec.inputs, spec.field), tokenizer.splits_at_spaces)):
        for piece, ids in zip(batch, _encode(tokenizer, batch), strict=True):
            writer.add(ids + eos if piece.ends else ids, starts=piece.starts)
            count += piece.ends
        interrupts.check()  # a signal the tokenizer's native code swallowed stops the prepare here
        tokens = sum(s.tokens for s in writer.shards) + len(writer.tokens)
        progress(f"encoding: {plural(count, 'document', grouped=True)}, {plural(tokens, 'token', grouped=True)}")
    writer.flush()
    index = DatasetIndex(
        dtype=dtype,
        vocab_size=tokenizer.vocab_size,
        tokenizer=tokenizer.save(folder),
        shards=writer.shards,
        tokens=sum(s.tokens for s in writer.shards),
        documents=sum(s.documents for s in writer.shards),
        fingerprint=writer.digest.hexdigest(),
        sources=[str(p) for p in spec.inputs],
    )
    write_index(folder, index)
    return index


def prepare(spec: PrepareSpec, progress: Progress = lambda message: None) -> PrepareReport:
    """Tokenize the inputs into ``spec.out``, replacing it only when complete; returns the index."""
    if spec.shard_tokens < 1:
        raise UsageError(f"bad --shard-tokens {spec.shard_tokens}", "use a positive number of tokens")
    out = check_out(spec.out)
    check_inputs(spec.inputs)
    kind, arg = parse_spec(spec.tokenizer)
    try:
        tokenizer = None if kind == "bpe" else make_tokenizer(spec.tokenizer)
        vocab = bpe_vocab(arg) if kind == "bpe" else None
        progress("reading the inputs")
        # one full pass before anything is written: a bad line anywhere stops prepare early
        if not sum(1 for _ in documents(spec.inputs, spec.field)):
            raise UsageError(
                f"the corpus is empty: no text in {', '.join(map(str, spec.inputs))}", "pass files that hold text"
            )
        with staged(out, str(spec.out)) as folder:
            if tokenizer is None:
                progress(f"training {spec.tokenizer} on the inputs")
                # in pieces too: cut at spaces, the BPE's pre-tokenizer sees the very same words
                tokenizer = train_bpe(vocab, (p.text for p in _pieces(documents(spec.inputs, spec.field), True)))
                interrupts.check()
            index = _write_dataset(folder, tokenizer, spec, progress)
            with interrupts.held(then_check=False):  # the dataset is out whole: a signal now is told at the end
                publish(folder, out)
    except KeyboardInterrupt:  # a Ctrl-C where distlaunch's handler is not installed (prepare called as a library)
        raise DistlaunchError(f"interrupted by SIGINT; {spec.out} unchanged", exit_code=ExitCode.SIGINT) from None
    return PrepareReport(out=str(spec.out), index=index, padded_vocab_size=padded_vocab_size(index.vocab_size))


def read_documents(folder: str | Path) -> Iterator[list[int]]:
    """Every document's token ids back from a prepared folder (with its end-of-text token)."""
    root = Path(folder).expanduser()
    index = check_dataset(root)
    typecode = {"uint16": "H", "uint32": "I"}[index.dtype]
    for shard in index.shards:
        tokens = array(typecode)
        tokens.frombytes((root / shard.file).read_bytes())
        if sys.byteorder == "big":
            tokens.byteswap()
        offsets = read_offsets(root / shard.docs_file)
        problem = docs_problem(root, shard, offsets, len(tokens))
        if problem is not None:
            raise UsageError(problem, REPREPARE)
        for start, end in itertools.pairwise([*offsets, len(tokens)]):
            yield tokens[start:end].tolist()
