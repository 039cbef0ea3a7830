"""Tokens and deterministic global batches.

A batch depends only on (seed, step): every layout sees the same global batch at every step,
and dp rank i takes rows [i*B/dp, (i+1)*B/dp) of it, reading only those rows' tokens. The data
position (which data, how many global batches were drawn) is saved in every checkpoint
(``DataPosition``), so a restart continues with the very next batch, on the same data only.

Data comes as:

- UTF-8 text (its bytes are the tokens, vocabulary 256): the bundled corpus by default, so no
  download is ever needed;
- a pre-tokenized token file: a flat array of little-endian ``uint16`` (or ``uint8``) ids with
  no header, the nanoGPT ``.bin`` layout;
- a folder written by ``distlaunch data prepare``: its shards, with the vocabulary of its tokenizer.

Token files and shards are memory-mapped, so data larger than RAM costs only the pages a batch
touches. A window never crosses a shard boundary. The last ``data.val_fraction`` of the tokens
is held out for evaluation.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distlaunch.data.index import REPREPARE, check_dataset, is_dataset_dir
from distlaunch.data.source import data_file, data_fingerprint, other_data, same_data
from distlaunch.data.verify import COPY_AGAIN, changed_shards
from distlaunch.engine.parallel.mesh import read_env
from distlaunch.errors import UsageError
from distlaunch.readable import plural

VOCAB_SIZE = 256


def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as a uint8 token tensor."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)


def decode(tokens: torch.Tensor) -> str:
    """Tokens back to text (invalid UTF-8 sequences become U+FFFD)."""
    return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


# uint32 ids are read as int32: exact for every vocabulary below 2**31
TOKEN_DTYPES = {"uint16": torch.uint16, "uint8": torch.uint8, "uint32": torch.int32}
ID_CHECK_CHUNK = 1 << 24  # tokens widened to int32 at a time (64 MiB): torch has no max over uint16
Tokens = torch.Tensor | list[torch.Tensor]  # one flat token tensor, or one per shard


def is_token_file(path: str | None, data_format: str) -> bool:
    """``data.format``: tokens, text, or auto (a ``.bin`` file holds tokens)."""
    if data_format != "auto":
        return data_format == "tokens"
    return path is not None and Path(path).suffix == ".bin"


def map_token_file(path: str, token_dtype: str) -> torch.Tensor:
    """A token file as a read-only memory map (pages are read when a batch touches them)."""
    source = data_file(path)
    dtype = TOKEN_DTYPES[token_dtype]
    nbytes = source.stat().st_size
    itemsize = dtype.itemsize
    if nbytes % itemsize:
        raise UsageError(
            f"token file {source} has {plural(nbytes, 'byte')}, not a whole number of {token_dtype} tokens",
            "write the tokens as a flat little-endian array, or set data.token_dtype",
        )
    # shared=False maps the file copy-on-write: nothing is written back, nothing read up front
    return torch.from_file(str(source), shared=False, size=nbytes // itemsize, dtype=dtype)


TOKEN_FILE_FIX = (
    "check data.token_dtype and model.preset (tiny and small have 256 ids, 125m, 350m and 1.3b 50,304), "
    "or tokenize with distlaunch data prepare, whose folder sets the vocabulary"
)


def load_split(
    path: str | None, data_format: str, token_dtype: str, val_fraction: float, vocab_size: int | None = None
) -> tuple[Tokens, Tokens]:
    """(training tokens, held-out tokens): the held-out part is the last ``val_fraction``. With
    ``vocab_size`` (the model's), every id of a token file is checked below it, as a prepared
    folder's shards always are against its index (``check_token_ids``); text is bytes, always below."""
    if is_dataset_dir(path):
        return load_dataset_split(path, val_fraction)
    if is_token_file(path, data_format):
        if path is None:
            raise UsageError("data.format='tokens' needs data.path", "point data.path at a token file")
        tokens = map_token_file(path, token_dtype)
        if vocab_size is not None:
            vocabulary = f"the model's vocabulary of {vocab_size}"
            check_token_ids(tokens, Path(path).expanduser(), vocab_size, vocabulary, TOKEN_FILE_FIX)
    else:
        tokens = load_tokens(path)
    split = tokens.numel() - int(tokens.numel() * val_fraction)
    return tokens[:split], tokens[split:]


def load_dataset_split(path: str, val_fraction: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A prepared folder's shards, memory-mapped and checked, cut at the last ``val_fraction`` of all its tokens."""
    root = Path(path).expanduser()
    index = check_dataset(root)  # sizes, names and counts; the bytes and the ids below
    # this host's copy, its shards split between the host's ranks: each reads them next for the ids anyway
    env = read_env()
    changed = all_ranks_problems(changed_shards(root, index, *env.host_share), env.rank)
    if changed:
        raise UsageError(changed[0], COPY_AGAIN)
    shards = []
    for entry in index.shards:
        shard = map_token_file(str(root / entry.file), index.dtype)
        vocabulary = f"the vocabulary of {index.vocab_size} in its index.json"
        check_token_ids(shard, root / entry.file, index.vocab_size, vocabulary, REPREPARE)
        shards.append(shard)
    cut = index.tokens - int(index.tokens * val_fraction)
    train: list[torch.Tensor] = []
    held_out: list[torch.Tensor] = []
    start = 0
    for shard in shards:
        keep = min(max(cut - start, 0), shard.numel())  # this shard's tokens before the cut
        train += [shard[:keep]] if keep else []
        held_out += [shard[keep:]] if keep < shard.numel() else []
        start += shard.numel()
    return train, held_out


def all_ranks_problems(mine: list[str], rank: int) -> list[str]:
    """Every rank's ``mine`` (collective once the process group is up), each naming where it was found:
    all ranks stop together with the same line, and none waits in a collective for a peer that stopped."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, [f"{p} (found by rank {rank} on {socket.gethostname()})" for p in mine])
    return [p for part in gathered for p in part]


def check_token_ids(tokens: torch.Tensor, path: Path, vocab_size: int, vocabulary: str, fix: str) -> None:
    """Every id in ``tokens`` (a shard or a token file) is below ``vocab_size`` (``vocabulary`` names
    it in the error). One pass over the data when it is loaded (about as long as reading it once)
    refuses a bad id before the first step, not whenever a batch happens to sample it."""
    for start in range(0, tokens.numel(), ID_CHECK_CHUNK):
        low, high = torch.aminmax(tokens[start : start + ID_CHECK_CHUNK].to(torch.int32))
        bad = int(low) + (1 << 32) if int(low) < 0 else int(high)  # uint32 ids are read as int32
        if bad >= vocab_size:
            raise UsageError(f"{path} holds token id {bad}, outside {vocabulary}", fix)


def load_tokens(path: str | None) -> torch.Tensor:
    """The bytes of a text file (``data.path``), or of the bundled corpus when ``path`` is None."""
    source = data_file(path)
    try:
        raw = source.read_bytes()
    except IsADirectoryError:
        raise UsageError(
            f"data.path is a directory without an index.json: {source}",
            "point data.path at a text file, or at a folder made by distlaunch data prepare",
        ) from None
    if not raw:  # torch.frombuffer refuses an empty buffer; the sampler says the data is too short
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


class BatchSampler:
    """Random windows of ``seq_len + 1`` tokens, drawn from a generator seeded by (seed, step).

    ``tokens`` is one tensor, or one per shard: a window lies inside one shard, and every window
    start of every shard is equally likely. Its ids are checked once, when the data is loaded
    (``load_split``, ``check_token_ids``), not per batch.
    """

    def __init__(
        self,
        tokens: Tokens,
        seq_len: int,
        global_batch_size: int,
        seed: int,
        split: str = "training",
        vocab_size: int = VOCAB_SIZE,
    ):
        self.segments = [tokens] if isinstance(tokens, torch.Tensor) else list(tokens)
        counts = torch.tensor([max(seg.numel() - seq_len - 1, 0) for seg in self.segments] or [0])
        self.ends = counts.cumsum(0)  # (S,) window starts up to and including each segment
        self.firsts = self.ends - counts  # (S,) the first global start index of each segment
        if int(self.ends[-1]) < 1:
            total = sum(seg.numel() for seg in self.segments)
            raise UsageError(
                f"the {split} data has {plural(total, 'token')}, fewer than seq_len+2={seq_len + 2}"
                + (" in any one shard" if len(self.segments) > 1 else ""),
                "use a longer file, a smaller train.seq_len or another data.val_fraction",
            )
        self.vocab_size = vocab_size  # the model's; the ids were checked against it at load (load_split)
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.seed = seed

    @property
    def tokens(self) -> torch.Tensor:
        """The first (for plain text and token files: the only) token tensor."""
        return self.segments[0]

    def _starts(self, step: int) -> torch.Tensor:
        """Global window starts of ``step``'s batch, (B,): identical on every rank and layout."""
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + step) % (1 << 63))
        return torch.randint(0, int(self.ends[-1]), (self.global_batch_size,), generator=gen)

    def _windows(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, each (len(starts), T) int64, reading only these windows' tokens."""
        offsets = torch.arange(self.seq_len + 1)  # (T+1,)
        if len(self.segments) == 1:
            windows = self.tokens[starts[:, None] + offsets].long()  # (B, T+1)
        else:
            seg = torch.searchsorted(self.ends, starts, right=True)  # (B,) the shard of each start
            local = starts - self.firsts[seg]
            rows = [
                self.segments[s][i : i + self.seq_len + 1].long()
                for s, i in zip(seg.tolist(), local.tolist(), strict=True)
            ]
            windows = torch.stack(rows) if rows else torch.empty(0, self.seq_len + 1, dtype=torch.long)
        # contiguous: the pipeline's first stage checks its input's strides against the (B, T)
        # shape it was built for, and torch 2.11 refuses a (T + 1)-strided view (2.13 accepts it)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (B, T) int64, for ``step``."""
        return self._windows(self._starts(step))

    def local_batch(self, step: int, dp_rank: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This dp rank's contiguous slice of the global batch for ``step`` (only its rows are read)."""
        rows = self.global_batch_size // dp
        return self._windows(self._starts(step)[dp_rank * rows : (dp_rank + 1) * rows])


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``batch`` (made on the CPU) on ``device``. To a GPU through pinned memory without waiting: a
    copy from pageable memory makes the host wait until the device has finished all queued work,
    once per step, so the host could never run ahead and queue the next step's kernels."""
    if device.type == "cuda":
        return batch.pin_memory().to(device, non_blocking=True)
    return batch.to(device)


class DataPosition:
    """The data stream's place, saved in every checkpoint: which data, and how many global batches
    were drawn. A batch is a function of (seed, step), so restoring this continues with the next
    batch; resuming on other data is refused rather than silently training on something else."""

    def __init__(self, fingerprint: str, path: str | None):
        self.fingerprint, self.path = fingerprint, path
        self.batches = 0  # global batches drawn so far (= the last step run)

    def state_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "path": self.path, "batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not same_data(state["fingerprint"], self.fingerprint, self.path):  # meta.json did not say (older)
            raise other_data(state["path"], self.path)
        self.batches = state["batches"]


def build_samplers(cfg, vocab_size: int) -> tuple[BatchSampler, BatchSampler | None, DataPosition]:
    """The training sampler, the held-out one (when ``train.eval_every``) and the data position."""
    train, data = cfg.train, cfg.data
    tokens, held_out = load_split(data.path, data.format, data.token_dtype, data.val_fraction, vocab_size)
    sampler = BatchSampler(tokens, train.seq_len, train.global_batch_size, train.seed, vocab_size=vocab_size)
    position = DataPosition(data_fingerprint(data.path), data.path)
    if not train.eval_every:
        return sampler, None, position
    val = BatchSampler(
        held_out, train.seq_len, train.global_batch_size, train.seed, split="held-out", vocab_size=vocab_size
    )
    return sampler, val, position
