"""GPT shapes and presets, torch-free so the launcher's memory planner can read them.

``distlaunch.engine.model`` builds the modules from these shapes; the planner and the config
checks use them without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT; presets below."""

    n_layer: int
    n_head: int
    d_model: int
    vocab_size: int = 256  # byte-level tokens; divisible by every power-of-two tp up to 256
    max_seq_len: int = 256
    mlp_ratio: int = 4

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


# GPT-3 paper shapes for 125m/350m/1.3b. With a 256-token byte vocabulary the embeddings are tiny,
# so the real counts are ~85M, ~302M and ~1.2B (see ``num_params``).
PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(n_layer=4, n_head=4, d_model=128, max_seq_len=256),  # ~0.9M, CPU tests
    "small": GPTConfig(n_layer=10, n_head=8, d_model=512, max_seq_len=512),  # ~32M
    "125m": GPTConfig(n_layer=12, n_head=12, d_model=768, max_seq_len=2048),
    "350m": GPTConfig(n_layer=24, n_head=16, d_model=1024, max_seq_len=2048),
    "1.3b": GPTConfig(n_layer=24, n_head=16, d_model=2048, max_seq_len=2048),
}
