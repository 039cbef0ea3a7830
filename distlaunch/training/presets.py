"""GPT shapes and presets, torch-free so the launcher's memory planner can read them.

``distlaunch.engine.model`` builds the modules from these shapes; the planner and the config
checks use them without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

GPT2_VOCAB = 50_304  # GPT-2's 50,257 tokens padded to a multiple of 128, so every tp up to 128 divides it


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT; presets below."""

    n_layer: int
    n_head: int
    d_model: int
    vocab_size: int = 256  # byte-level tokens; a prepared dataset's tokenizer replaces it (model_config)
    max_seq_len: int = 256
    mlp_ratio: int = 4

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


# GPT-3 paper shapes for 125m/350m/1.3b, with GPT-2's vocabulary (padded). tiny and small keep the
# 256 byte tokens of the bundled corpus. data.path at a prepared folder sets the vocabulary of any
# preset to its tokenizer's (``model_config``).
PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(n_layer=4, n_head=4, d_model=128, max_seq_len=256),  # ~0.9M, CPU tests
    "small": GPTConfig(n_layer=10, n_head=8, d_model=512, max_seq_len=512),  # ~32M
    "125m": GPTConfig(n_layer=12, n_head=12, d_model=768, vocab_size=GPT2_VOCAB, max_seq_len=2048),
    "350m": GPTConfig(n_layer=24, n_head=16, d_model=1024, vocab_size=GPT2_VOCAB, max_seq_len=2048),
    "1.3b": GPTConfig(n_layer=24, n_head=16, d_model=2048, vocab_size=GPT2_VOCAB, max_seq_len=2048),
}


def model_config(preset: str, data_path: str | None = None) -> GPTConfig:
    """The preset's shape; with ``data_path`` at a prepared folder, its tokenizer's vocabulary, padded."""
    from distlaunch.data.index import check_dataset, is_dataset_dir, padded_vocab_size
    from distlaunch.errors import UsageError

    model = PRESETS[preset]
    if not is_dataset_dir(data_path):
        if data_path is not None and Path(data_path).expanduser().is_dir():
            raise UsageError(
                f"data.path is a directory without an index.json: {Path(data_path).expanduser()}",
                "point data.path at a text file, or at a folder made by distlaunch data prepare",
            )
        return model
    # checked here, torch-free: the launcher refuses a damaged folder before any rank starts
    return replace(model, vocab_size=padded_vocab_size(check_dataset(data_path).vocab_size))
