"""What a training job reads, named torch-free: its data source, the data's identity, and the refusals
of a checkpoint trained on other data.

The ranks use it when they load data and resume (``engine/data.py``, ``engine/checkpoint/store.py``);
``distlaunch train`` uses the same checks before any rank starts (``training/resume.py``,
``launcher/planning/train.py``), so a job that cannot run on its data is one line and exit 2 there, not an
error on every rank after they have started.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel, Field

from distlaunch.data.index import is_dataset_dir, read_index
from distlaunch.errors import UsageError

BUNDLED_CORPUS = Path(__file__).resolve().parent / "corpus.txt"
FRESH_START = "or start fresh in a new checkpoint.dir"


class DataIdentity(BaseModel):
    """The data a checkpoint was trained on, as its ``meta.json`` records it."""

    fingerprint: str = Field(min_length=1)  # data_fingerprint: what the data is, wherever it lies
    path: str | None  # data.path as the job gave it (None: the bundled corpus)
    vocab_size: int = Field(ge=1)  # the model's (padded) vocabulary, which the data's tokenizer sets


def data_file(path: str | None) -> Path:
    """The file or folder ``data.path`` names (the bundled corpus when None); a UsageError when it
    does not exist."""
    source = Path(path).expanduser() if path else BUNDLED_CORPUS
    if not source.exists():
        raise UsageError(
            f"data.path not found: {source}",
            "point data.path at a text file, a token file or a folder made by distlaunch data prepare",
        )
    return source


SAMPLES, SAMPLE_BYTES = 64, 1 << 16  # a file's fingerprint reads at most 4 MiB of it, wherever it lies


def data_fingerprint(path: str | None) -> str:
    """What the data is, independent of where it lies: a checkpoint resumes only on the same data.

    A prepared folder: the sha256 of all its tokens (``index.json``, written at prepare) and where its
    shards end (a window never crosses a shard, so the boundaries shape every batch). A text or token file:
    its size and a sha256 over all of it up to 4 MiB, else over 64 slices of 64 KiB spread evenly from its
    first byte to its last; every rank computes it at start, so it must stay cheap for files of many GB.
    """
    if is_dataset_dir(path):
        index = read_index(path)
        bounds = hashlib.sha256(",".join(str(shard.tokens) for shard in index.shards).encode()).hexdigest()
        return f"prepared2:{index.fingerprint}:{bounds[:16]}"
    source = data_file(path)
    size = source.stat().st_size
    digest = hashlib.sha256()
    with source.open("rb") as f:
        if size <= SAMPLES * SAMPLE_BYTES:
            digest.update(f.read())
        else:
            for i in range(SAMPLES):
                f.seek(i * (size - SAMPLE_BYTES) // (SAMPLES - 1))
                digest.update(f.read(SAMPLE_BYTES))
    return f"file2:{size}:{digest.hexdigest()}"


def _first_fingerprint(path: str | None) -> str:
    """The fingerprint of checkpoints written before ``data_fingerprint`` read the whole data (its tokens'
    sha256 for a folder, the first MiB of a file): such checkpoints still resume on their data."""
    if is_dataset_dir(path):
        return "prepared:" + read_index(path).fingerprint
    source = data_file(path)
    with source.open("rb") as f:
        head = hashlib.sha256(f.read(1 << 20)).hexdigest()
    return f"file:{source.stat().st_size}:{head}"


def same_data(saved: str, current: str, path: str | None) -> bool:
    """Whether a checkpoint that recorded the fingerprint ``saved`` (of any version) was trained on the data at
    ``path``, whose fingerprint is ``current``."""
    if saved.split(":", 1)[0] in ("file", "prepared"):
        return saved == _first_fingerprint(path)
    return saved == current


def describe_data(path: str | None) -> str:
    return f"data.path={path!r}" if path else "the bundled corpus"


def other_data(saved_path: str | None, path: str | None, checkpoint: Path | None = None) -> UsageError:
    """The refusal of a checkpoint whose data (same vocabulary) is not this job's."""
    which = f"checkpoint {checkpoint}" if checkpoint else "the checkpoint"
    return UsageError(
        f"{which} was trained on other data ({describe_data(saved_path)}) than {describe_data(path)}",
        f"resume with the same data.path, {FRESH_START}",
    )


def check_same_data(checkpoint: Path, saved: DataIdentity, here: DataIdentity) -> None:
    """Refuse (UsageError, exit 2) a checkpoint trained on data other than ``here``: another
    vocabulary first (its tensors have other shapes), then other tokens."""
    if saved.vocab_size != here.vocab_size:
        raise UsageError(
            f"checkpoint {checkpoint} was trained on other data: its vocabulary has {saved.vocab_size} tokens, "
            f"this model's has {here.vocab_size} (the vocabulary comes from {describe_data(here.path)})",
            f"resume on the data it was trained on ({describe_data(saved.path)}), {FRESH_START}",
        )
    if not same_data(saved.fingerprint, here.fingerprint, here.path):
        raise other_data(saved.path, here.path, checkpoint)
