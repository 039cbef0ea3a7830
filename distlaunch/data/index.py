"""The ``index.json`` of a prepared dataset folder, torch-free so the launcher and the planner can read it.

::

    DIR/
      index.json          this file: dtype, vocabulary, tokenizer, shards, fingerprint
      tokenizer.json      the tokenizer (HF tokenizers), or tokenizer.tiktoken (a tiktoken rank file)
      shard_00000.bin     flat little-endian token ids (uint16 or uint32), no header: memory-mapped
      shard_00000.docs    little-endian uint64: the offset of each document's first token in the shard

Every document ends with the tokenizer's end-of-text token (``eos_id``; folders written before
prepare required one may have none). ``check_dataset`` refuses a damaged folder torch-free, so the
launcher checks it before any rank starts and every rank checks it again when it loads the shards.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, ValidationError

from distlaunch.errors import UsageError, validation_problem
from distlaunch.files import open_regular
from distlaunch.readable import plural

INDEX_FILE = "index.json"
FORMAT_VERSION = 1
VOCAB_MULTIPLE = 128  # the model's vocabulary is padded to this, so every power-of-two tp up to 128 divides it
TokenDtype = Literal["uint16", "uint32"]
ITEMSIZE = {"uint16": 2, "uint32": 4}
DOC_OFFSET_SIZE = 8  # a .docs file holds one uint64 per document
REPREPARE = "prepare the folder again with distlaunch data prepare"


def _plain_name(name: str) -> str:
    # the folder's own files only: an index naming /etc/passwd or ../x must not make train read it
    if name in ("", ".", "..") or Path(name).name != name or "\\" in name:
        raise ValueError("must be a file name inside the folder")
    return name


FileName = Annotated[str, AfterValidator(_plain_name)]
Count = Annotated[int, Field(ge=0)]


class TokenizerInfo(BaseModel):
    """Which tokenizer made the tokens, and the file in the folder that holds it."""

    kind: Literal["bpe", "tokenizer.json", "tiktoken"]
    name: str  # bpe:VOCAB, the source tokenizer.json path, or gpt2
    file: FileName  # in the folder
    vocab_size: int = Field(ge=1)
    eos_id: Count | None
    pat_str: str | None = None  # tiktoken only: the pre-tokenizer pattern
    special_tokens: dict[str, int] = {}  # tiktoken only


class Shard(BaseModel):
    """One token file: its name, token count and document count (its ``.docs`` file has the offsets)."""

    file: FileName
    docs_file: FileName
    tokens: Count
    documents: Count
    sha256: str | None = None  # of the .bin file; None in folders prepared before it was recorded


class DatasetIndex(BaseModel):
    """``index.json``: enough to memory-map the shards and size the model's vocabulary."""

    format: int = FORMAT_VERSION
    dtype: TokenDtype
    vocab_size: int = Field(ge=1)  # the tokenizer's; the model pads it (``padded_vocab_size``)
    tokenizer: TokenizerInfo
    shards: list[Shard]
    tokens: Count
    documents: Count
    fingerprint: str  # sha256 over every shard's bytes: a checkpoint resumes only on the same data
    sources: list[str]


def token_dtype(vocab_size: int) -> TokenDtype:
    """uint16 while every id fits in it, else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def padded_vocab_size(vocab_size: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """The model's vocabulary: ``vocab_size`` rounded up to ``multiple`` (GPT-2's 50,257 -> 50,304)."""
    return -(-vocab_size // multiple) * multiple


def is_dataset_dir(path: str | Path | None) -> bool:
    """Whether ``path`` is a folder written by ``distlaunch data prepare``: it holds an ``index.json``
    (of whatever kind: one that is not a readable file is then refused by ``read_index``, by name)."""
    return path is not None and os.path.lexists(Path(path).expanduser() / INDEX_FILE)


def read_index(folder: str | Path) -> DatasetIndex:
    """The folder's index, or a UsageError naming what is wrong."""
    path = Path(folder).expanduser() / INDEX_FILE
    try:
        with open(open_regular(path), "rb") as f:  # a pipe in its place is what it is, not a wait
            raw = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise UsageError(
            f"no {INDEX_FILE} in {path.parent}", "prepare the folder with distlaunch data prepare"
        ) from None
    except OSError as err:
        if err.errno in (errno.EISDIR, errno.EINVAL):  # a folder, a pipe, a device
            raise UsageError(f"{path} is not a regular file, so not a dataset index", REPREPARE) from None
        raise UsageError(f"cannot read {path}: {err.strerror}", "check the file and its permissions") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        why = f"not UTF-8 (byte {err.start})" if isinstance(err, UnicodeDecodeError) else "not valid JSON"
        raise UsageError(f"{path} is not a dataset index: {why}", REPREPARE) from None
    if isinstance(raw, dict) and isinstance(raw.get("format"), int) and raw["format"] != FORMAT_VERSION:
        raise UsageError(
            f"{path} has format {raw['format']}; this distlaunch reads format {FORMAT_VERSION}",
            f"{REPREPARE} (or use the distlaunch that wrote it)",
        )
    try:
        return DatasetIndex.model_validate(raw)
    except ValidationError as err:
        raise UsageError(f"{path} is not a valid dataset index: {validation_problem(err)}", REPREPARE) from None


def _file_problem(root: Path, name: str, size: int, what: str) -> str | None:
    """What keeps ``root/name`` from being a regular file (a symlink to one is fine) of ``size`` bytes."""
    path = root / name
    try:
        st = path.stat()
    except FileNotFoundError:
        return f"dataset file missing: {path} (listed in {INDEX_FILE})"
    except OSError as err:
        return f"cannot read dataset file {path}: {err.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"dataset file {path} is not a regular file"
    if st.st_size != size:
        return f"{path} has {st.st_size} bytes, but {INDEX_FILE} says {what} ({size} bytes)"
    return None


def dataset_problems(root: Path, index: DatasetIndex) -> list[str]:
    """What does not add up between ``index`` and the folder's files (no shard is read): a truncated,
    missing or foreign shard, counts that differ from the shards', ids the dtype cannot hold."""
    where = root / INDEX_FILE
    problems = []
    if index.tokens != sum(s.tokens for s in index.shards):
        problems.append(
            f"{where} says {plural(index.tokens, 'token')}, but its shards add up to {sum(s.tokens for s in index.shards)}"
        )
    if index.documents != sum(s.documents for s in index.shards):
        problems.append(
            f"{where} says {plural(index.documents, 'document')}, but its shards add up to {sum(s.documents for s in index.shards)}"
        )
    if index.dtype != token_dtype(index.vocab_size) and index.dtype == "uint16":
        problems.append(f"{where}: dtype uint16 cannot hold the ids of vocab_size {index.vocab_size}")
    eos = index.tokenizer.eos_id
    if eos is not None and eos >= index.vocab_size:
        problems.append(f"{where}: the end-of-text id {eos} is outside vocab_size {index.vocab_size}")
    itemsize = ITEMSIZE[index.dtype]
    for shard in index.shards:
        problems += filter(
            None,
            (
                _file_problem(root, shard.file, shard.tokens * itemsize, plural(shard.tokens, f"{index.dtype} token")),
                _file_problem(
                    root, shard.docs_file, shard.documents * DOC_OFFSET_SIZE, plural(shard.documents, "document")
                ),
            ),
        )
    return problems


def check_dataset(folder: str | Path) -> DatasetIndex:
    """The folder's index, checked against its shards (torch-free, no shard is read): the first of
    ``dataset_problems`` is a UsageError naming the file."""
    root = Path(folder).expanduser()
    index = read_index(root)
    problems = dataset_problems(root, index)
    if problems:
        raise UsageError(problems[0], REPREPARE)
    return index


def write_index(folder: Path, index: DatasetIndex) -> Path:
    """Write ``index.json`` (last, so a folder with an index is complete)."""
    path = folder / INDEX_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(index.model_dump_json(indent=2) + "\n")
    tmp.replace(path)
    return path
