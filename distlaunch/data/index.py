"""The ``index.json`` of a prepared dataset folder, torch-free so the launcher and the planner can read it.

::

    DIR/
      index.json          this file: dtype, vocabulary, tokenizer, shards, fingerprint
      tokenizer.json      the tokenizer (HF tokenizers), or tokenizer.tiktoken (a tiktoken rank file)
      shard_00000.bin     flat little-endian token ids (uint16 or uint32), no header: memory-mapped
      shard_00000.docs    little-endian uint64: the offset of each document's first token in the shard

Every document ends with the tokenizer's end-of-text token when it has one (``eos_id``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from distlaunch.errors import UsageError

INDEX_FILE = "index.json"
FORMAT_VERSION = 1
VOCAB_MULTIPLE = 128  # the model's vocabulary is padded to this, so every power-of-two tp up to 128 divides it
TokenDtype = Literal["uint16", "uint32"]


class TokenizerInfo(BaseModel):
    """Which tokenizer made the tokens, and the file in the folder that holds it."""

    kind: Literal["bpe", "tokenizer.json", "tiktoken"]
    name: str  # bpe:VOCAB, the source tokenizer.json path, or gpt2
    file: str  # relative to the folder
    vocab_size: int
    eos_id: int | None
    pat_str: str | None = None  # tiktoken only: the pre-tokenizer pattern
    special_tokens: dict[str, int] = {}  # tiktoken only


class Shard(BaseModel):
    """One token file: its name, token count and document count (its ``.docs`` file has the offsets)."""

    file: str
    docs_file: str
    tokens: int
    documents: int


class DatasetIndex(BaseModel):
    """``index.json``: enough to memory-map the shards and size the model's vocabulary."""

    format: int = FORMAT_VERSION
    dtype: TokenDtype
    vocab_size: int  # the tokenizer's; the model pads it (``padded_vocab_size``)
    tokenizer: TokenizerInfo
    shards: list[Shard]
    tokens: int
    documents: int
    fingerprint: str  # sha256 over every shard's bytes: a checkpoint resumes only on the same data
    sources: list[str]


def token_dtype(vocab_size: int) -> TokenDtype:
    """uint16 while every id fits in it, else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def padded_vocab_size(vocab_size: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """The model's vocabulary: ``vocab_size`` rounded up to ``multiple`` (GPT-2's 50,257 -> 50,304)."""
    return -(-vocab_size // multiple) * multiple


def is_dataset_dir(path: str | Path | None) -> bool:
    """Whether ``path`` is a folder written by ``distlaunch data prepare``."""
    return path is not None and (Path(path).expanduser() / INDEX_FILE).is_file()


def read_index(folder: str | Path) -> DatasetIndex:
    """The folder's index, or a UsageError naming what is wrong."""
    path = Path(folder).expanduser() / INDEX_FILE
    try:
        return DatasetIndex.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        raise UsageError(
            f"no {INDEX_FILE} in {path.parent}", "prepare the folder with distlaunch data prepare"
        ) from None
    except (json.JSONDecodeError, ValidationError) as err:
        first = str(err).splitlines()[0]
        raise UsageError(
            f"{path} is not a valid dataset index: {first}", "prepare the folder again with distlaunch data prepare"
        ) from None


def write_index(folder: Path, index: DatasetIndex) -> Path:
    """Write ``index.json`` (last, so a folder with an index is complete)."""
    path = folder / INDEX_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(index.model_dump_json(indent=2) + "\n")
    tmp.replace(path)
    return path
