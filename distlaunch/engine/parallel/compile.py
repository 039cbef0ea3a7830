"""``train.compile``: ``torch.compile`` each transformer block's forward.

Per block, not the whole model: every block has the same shapes, so one compiled graph serves
all of them (one compilation, not n_layer), and the hooks other pieces put around a block (ZeRO-3's
all-gather and reshard, pipeline stages' boundaries) stay outside the compiled region. The
block's ``forward`` is replaced, not the module wrapped (as activation checkpointing does), so
parameter names (checkpoints, the tp plan) stay those of the plain model.

Compiled before activation checkpointing, which then wraps the compiled forward: compiling a
checkpointed block whose weights are tensor-parallel DTensors fails at the first step on torch
2.13 (AOT autograd finds the DeviceMesh among the tensors checkpoint saves; 2.11 accepts it).
Backward's recomputation reruns the compiled forward.

Default: on for CUDA, off elsewhere (on a CPU the compile time outweighs the gain for the
presets one trains there).
"""

from __future__ import annotations

import functools

import torch

from distlaunch.engine.model import GPT


def compile_enabled(setting: bool | None, device: torch.device) -> bool:
    """``train.compile`` resolved: ``None`` (auto) means on for CUDA only."""
    return device.type == "cuda" if setting is None else setting


def apply_compile(chunks: list[GPT]) -> None:
    """Compile every block's forward (after tensor parallel, so the graph computes on the shards;
    before activation checkpointing)."""
    for chunk in chunks:
        for block in chunk.blocks.values():
            block.forward = torch.compile(block.forward)


def is_compiled(block: torch.nn.Module) -> bool:
    """Whether ``block``'s forward is a compiled function, or checkpointing wraps one."""
    forward = block.forward
    while isinstance(forward, functools.partial):  # activation checkpointing's wrapper
        forward = forward.args[0]
    return hasattr(forward, "_torchdynamo_orig_callable")
