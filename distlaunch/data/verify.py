"""Whether a prepared folder still holds the tokens prepare wrote. Sizes and counts say a shard is whole
(``check_dataset``); only its bytes against the SHA-256 that prepare recorded say it is the same: a copy
that flipped a bit, or a shard rewritten in place, keeps its size and trains on other tokens silently.

``distlaunch data verify`` checks every file of a folder. At train start the ranks of each node check
that node's copy together, each local rank every LOCAL_WORLD_SIZE-th shard (``changed_shards``), while
the pages come into the cache that the id check reads next. Torch-free."""

from __future__ import annotations

import hashlib
import sys
from array import array
from pathlib import Path

from pydantic import BaseModel, computed_field

from distlaunch.data.index import INDEX_FILE, DatasetIndex, Shard, dataset_problems, read_index
from distlaunch.readable import plural

HASH_CHUNK = 1 << 24
COPY_AGAIN = "copy the folder again from where it was prepared, or prepare it again with distlaunch data prepare"


class DatasetCheck(BaseModel):
    """What ``distlaunch data verify`` found: ``problems`` is empty when the folder is intact."""

    folder: str
    shards: int
    tokens: int
    bytes: int  # the bytes hashed
    verified: int  # shards compared with their own SHA-256 (the others only through the folder's fingerprint)
    problems: list[str]

    @computed_field
    @property
    def ok(self) -> bool:
        return not self.problems


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def changed_shards(root: Path, index: DatasetIndex, part: int = 0, parts: int = 1) -> list[str]:
    """The shards among ``index``'s every ``parts``-th, from ``part`` on, whose bytes no longer match the
    SHA-256 recorded at prepare (shards without one, from an older prepare, are not read)."""
    return [
        f"{root / shard.file} does not match its SHA-256 in {INDEX_FILE} (its bytes changed after prepare)"
        for shard in index.shards[part::parts]
        if shard.sha256 is not None and file_sha256(root / shard.file) != shard.sha256
    ]


def docs_problem(root: Path, shard: Shard, offsets: array, tokens: int) -> str | None:
    """Whether ``shard``'s ``.docs`` file (read as ``offsets``) holds the document starts of its ``tokens``:
    one of the right size can still hold other bytes, and train never reads it."""
    problem = _offsets_problem(offsets, tokens)
    if problem is None:
        return None
    return f"{root / shard.docs_file} does not hold the document starts of {shard.file}: {problem}"


def _offsets_problem(offsets: array, tokens: int) -> str | None:
    """What is wrong with a shard's document starts (None: they run up from 0 within its ``tokens``)."""
    if offsets and offsets[0] != 0:
        return f"its first document starts at token {offsets[0]}, not 0"
    past = next((i for i, start in enumerate(offsets) if start > tokens), None)
    if past is not None:
        return f"document {past} starts at token {offsets[past]}, past the shard's {plural(tokens, 'token')}"
    back = next((i for i in range(1, len(offsets)) if offsets[i] < offsets[i - 1]), None)
    if back is not None:
        return (
            f"document {back} starts at token {offsets[back]}, before document {back - 1} (token {offsets[back - 1]})"
        )
    return None


def read_offsets(path: Path) -> array:
    """A ``.docs`` file's document starts."""
    offsets = array("Q")
    offsets.frombytes(path.read_bytes())
    if sys.byteorder == "big":
        offsets.byteswap()
    return offsets


def verify_dataset(folder: str | Path) -> DatasetCheck:
    """Every shard's size, bytes and document starts against ``index.json``; a folder without a readable
    index is a UsageError (it is not a dataset), damage is a problem in the report."""
    root = Path(folder).expanduser()
    index = read_index(root)
    problems = dataset_problems(root, index)
    hashed = 0
    if not problems:  # every file is there with its size: their bytes can be compared
        problems = changed_shards(root, index)
        for shard in index.shards:
            problem = docs_problem(root, shard, read_offsets(root / shard.docs_file), shard.tokens)
            problems += [problem] if problem else []
        if any(shard.sha256 is None for shard in index.shards):  # an older prepare: only the whole is recorded
            digest = hashlib.sha256()
            for shard in index.shards:
                with open(root / shard.file, "rb") as f:
                    while chunk := f.read(HASH_CHUNK):
                        digest.update(chunk)
            if digest.hexdigest() != index.fingerprint:
                problems.append(f"the shards do not match the fingerprint in {root / INDEX_FILE} (their bytes changed)")
        hashed = sum((root / shard.file).stat().st_size for shard in index.shards)
    return DatasetCheck(
        folder=str(root),
        shards=len(index.shards),
        tokens=index.tokens,
        bytes=hashed,
        verified=sum(shard.sha256 is not None for shard in index.shards),
        problems=problems,
    )
