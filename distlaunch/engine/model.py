"""A GPT (pre-norm transformer) in plain PyTorch.

The model knows nothing about distribution. Parallelism is applied from outside
(``distlaunch.engine.parallel``): tensor parallel swaps weights for DTensor shards, which is why
attention reshapes with ``-1`` heads (a rank holds ``n_head / tp`` of them); pipeline parallel
deletes modules (sets them to ``None`` or drops blocks from the ``ModuleDict``), which is why
``forward`` passes its input through every missing part.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from distlaunch.training.presets import PRESETS, GPTConfig  # noqa: F401 - re-exported


class Embedding(nn.Embedding):
    """``nn.Embedding`` that leaves its weight as built: every parameter of the model gets its value
    from ``initial_value`` (``init_weights``, or ``materialize`` shard by shard), so torch's own
    normal_ would be thrown away. On the meta device, where the engine builds the model, that
    normal_ also runs through torch's Python reference ops, whose first call imports torch._dynamo:
    some 2 s of CPU on every rank's start, for nothing."""

    def reset_parameters(self) -> None:
        pass


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused q/k/v projection.

    ``wqkv``'s output rows are laid out head by head (head 0's q, k, v, then head 1's, ...), so a
    column-parallel split of the one linear into tp contiguous pieces gives every rank whole heads
    with their own q, k and v: one projection, and one all-reduce of its input gradient under tp.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wqkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.wo = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape  # (B, T, C)
        # -1 heads: the full n_head in one process, n_head / tp on a tensor-parallel rank
        qkv = self.wqkv(x).view(B, T, -1, 3, self.head_dim)  # (B, T, nh, 3, hs)
        q, k, v = qkv.permute(3, 0, 2, 1, 4).unbind(0)  # 3 x (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, nh*hs)
        return self.wo(y)  # (B, T, C)


class MLP(nn.Module):
    """Position-wise feed-forward: up-projection, GELU, down-projection."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))  # (B, T, 4C) inside, (B, T, C) out


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.mlp_norm = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))  # (B, T, C)
        return x + self.mlp(self.mlp_norm(x))  # (B, T, C)


class GPT(nn.Module):
    """Token + position embedding, blocks, final norm, LM head (not tied: stages may differ).

    Built, its embeddings are uninitialised: ``init_weights`` (or the engine's ``materialize``)
    gives every parameter its value."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb: nn.Embedding | None = Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb: nn.Embedding | None = Embedding(cfg.max_seq_len, cfg.d_model)
        # a ModuleDict keyed "0".."n-1" keeps parameter names stable when a pipeline stage drops
        # blocks, so a stage's state dict is a slice of the full model's
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layer)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(cfg.d_model)
        self.head: nn.Linear | None = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) on the first stage, hidden states (B, T, C) after; logits at the end."""
        if self.tok_emb is not None:
            positions = torch.arange(x.shape[1], device=x.device)  # (T,)
            x = self.tok_emb(x) + self.pos_emb(positions)  # (B, T, C)
        for block in self.blocks.values():
            x = block(x)  # (B, T, C)
        if self.norm is not None:
            x = self.norm(x)
        if self.head is not None:
            x = self.head(x)  # (B, T, vocab)
        return x


def num_params(cfg: GPTConfig) -> int:
    """Parameter count of the full model, from the shapes (no model is built)."""
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(cfg).parameters())


def initial_value(cfg: GPTConfig, name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    """The whole initial fp32 value of parameter ``name``, on the CPU, from (seed, name) alone, so
    any subset or shard of the model (a pipeline stage, a tp or ZeRO-3 shard) gets exactly the
    values the full model would have."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith("norm.bias"):
        return torch.zeros(shape)
    residual_std = 0.02 / math.sqrt(2 * cfg.n_layer)  # GPT-2: scale residual projections
    std = residual_std if name.endswith(("wo.weight", "proj.weight")) else 0.02
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.empty(shape).normal_(0.0, std, generator=gen)


def init_weights(model: GPT, seed: int) -> None:
    """Initialise every parameter of a plain (undistributed) model with ``initial_value``."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(initial_value(model.cfg, name, param.shape, seed).to(param.dtype))
