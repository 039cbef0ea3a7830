"""Byte-level tokens and deterministic global batches.

The tokenizer is the identity on UTF-8 bytes (vocabulary 256), so no download is ever needed.
A batch depends only on (seed, step): every layout sees the same global batch at every step,
and dp rank i takes rows [i*B/dp, (i+1)*B/dp) of it. Because the sampler has no state beyond
the step number, resuming from a checkpoint needs only the step.

Data comes as UTF-8 text (its bytes are the tokens) or as a pre-tokenized token file: a flat
array of little-endian ``uint16`` (or ``uint8``) token ids with no header, the nanoGPT
``.bin`` layout, memory-mapped so a file larger than RAM costs only the pages a batch touches.
The last ``data.val_fraction`` of the tokens is held out for evaluation.
"""

from __future__ import annotations

from pathlib import Path

import torch

from distlaunch.errors import UsageError

BUNDLED_CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.txt"
VOCAB_SIZE = 256


def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as a uint8 token tensor."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)


def decode(tokens: torch.Tensor) -> str:
    """Tokens back to text (invalid UTF-8 sequences become U+FFFD)."""
    return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


TOKEN_DTYPES = {"uint16": torch.uint16, "uint8": torch.uint8}


def is_token_file(path: str | None, data_format: str) -> bool:
    """``data.format``: tokens, text, or auto (a ``.bin`` file holds tokens)."""
    if data_format != "auto":
        return data_format == "tokens"
    return path is not None and Path(path).suffix == ".bin"


def map_token_file(path: str, token_dtype: str) -> torch.Tensor:
    """A token file as a read-only memory map (pages are read when a batch touches them)."""
    source = Path(path).expanduser()
    dtype = TOKEN_DTYPES[token_dtype]
    try:
        nbytes = source.stat().st_size
    except FileNotFoundError:
        raise UsageError(f"data.path not found: {source}", "point data.path at a token file") from None
    itemsize = dtype.itemsize
    if nbytes % itemsize:
        raise UsageError(
            f"token file {source} has {nbytes} bytes, not a whole number of {token_dtype} tokens",
            "write the tokens as a flat little-endian array, or set data.token_dtype",
        )
    # shared=False maps the file copy-on-write: nothing is written back, nothing read up front
    return torch.from_file(str(source), shared=False, size=nbytes // itemsize, dtype=dtype)


def load_split(path: str | None, data_format: str, token_dtype: str, val_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(training tokens, held-out tokens): the held-out part is the last ``val_fraction``."""
    if is_token_file(path, data_format):
        if path is None:
            raise UsageError("data.format='tokens' needs data.path", "point data.path at a token file")
        tokens = map_token_file(path, token_dtype)
    else:
        tokens = load_tokens(path)
    split = tokens.numel() - int(tokens.numel() * val_fraction)
    return tokens[:split], tokens[split:]


def load_tokens(path: str | None) -> torch.Tensor:
    """The bytes of a text file (``data.path``), or of the bundled corpus when ``path`` is None."""
    source = Path(path).expanduser() if path else BUNDLED_CORPUS
    try:
        raw = source.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"data.path not found: {source}", "point data.path at a text file") from None
    except IsADirectoryError:
        raise UsageError(f"data.path is a directory: {source}", "point data.path at a text file") from None
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


class BatchSampler:
    """Random windows of ``seq_len + 1`` tokens, drawn from a generator seeded by (seed, step)."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, global_batch_size: int, seed: int,
                 split: str = "training", vocab_size: int = VOCAB_SIZE):
        if tokens.numel() < seq_len + 2:
            raise UsageError(
                f"the {split} data has {tokens.numel()} tokens, fewer than seq_len+2={seq_len + 2}",
                "use a longer file, a smaller train.seq_len or another data.val_fraction",
            )
        self.vocab_size = vocab_size
        self.tokens = tokens
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.seed = seed

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (B, T) int64, for ``step``."""
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + step) % (1 << 63))
        high = self.tokens.numel() - self.seq_len - 1
        starts = torch.randint(0, high, (self.global_batch_size,), generator=gen)  # (B,)
        offsets = torch.arange(self.seq_len + 1)  # (T+1,)
        windows = self.tokens[starts[:, None] + offsets].long()  # (B, T+1)
        if int(windows.max()) >= self.vocab_size:
            raise UsageError(
                f"token id {int(windows.max())} in data.path is outside the model's vocabulary of {self.vocab_size}",
                "the byte tokenizer has ids 0-255: re-tokenize, or check data.token_dtype",
            )
        return windows[:, :-1], windows[:, 1:]

    def local_batch(self, step: int, dp_rank: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This dp rank's contiguous slice of the global batch for ``step``."""
        x, y = self.global_batch(step)
        rows = self.global_batch_size // dp
        return x[dp_rank * rows : (dp_rank + 1) * rows], y[dp_rank * rows : (dp_rank + 1) * rows]
