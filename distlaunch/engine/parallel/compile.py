"""``train.compile``: ``torch.compile`` each transformer block's forward.

Per block, not the whole model: every block has the same shapes, so one compiled graph serves
all of them (one compilation, not n_layer), and the hooks other pieces put around a block (ZeRO-3's
all-gather and reshard, pipeline stages' boundaries) stay outside the compiled region. The
block's ``forward`` is replaced, not the module wrapped (as activation checkpointing does), so
parameter names (checkpoints, the tp plan) stay those of the plain model.

Default: on for CUDA, off elsewhere (on a CPU the compile time outweighs the gain for the
presets one trains there).
"""

from __future__ import annotations

import torch

from distlaunch.engine.model import GPT


def compile_enabled(setting: bool | None, device: torch.device) -> bool:
    """``train.compile`` resolved: ``None`` (auto) means on for CUDA only."""
    return device.type == "cuda" if setting is None else setting


def apply_compile(chunks: list[GPT]) -> None:
    """Compile every block's forward (after tensor parallel and activation checkpointing, so
    the compiled graph includes both)."""
    for chunk in chunks:
        for block in chunk.blocks.values():
            block.forward = torch.compile(block.forward)


def is_compiled(block: torch.nn.Module) -> bool:
    """Whether ``block``'s forward is a compiled function."""
    return hasattr(block.forward, "_torchdynamo_orig_callable")
