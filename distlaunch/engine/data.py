"""Byte-level tokens and deterministic global batches.

The tokenizer is the identity on UTF-8 bytes (vocabulary 256), so no download is ever needed.
A batch depends only on (seed, step): every layout sees the same global batch at every step,
and dp rank i takes rows [i*B/dp, (i+1)*B/dp) of it. Because the sampler has no state beyond
the step number, resuming from a checkpoint needs only the step.
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

    def __init__(self, tokens: torch.Tensor, seq_len: int, global_batch_size: int, seed: int):
        if tokens.numel() < seq_len + 2:
            raise UsageError(
                f"the training text has {tokens.numel()} tokens, fewer than seq_len+2={seq_len + 2}",
                "use a longer text file or a smaller train.seq_len",
            )
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
        return windows[:, :-1], windows[:, 1:]

    def local_batch(self, step: int, dp_rank: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This dp rank's contiguous slice of the global batch for ``step``."""
        x, y = self.global_batch(step)
        rows = self.global_batch_size // dp
        return x[dp_rank * rows : (dp_rank + 1) * rows], y[dp_rank * rows : (dp_rank + 1) * rows]
