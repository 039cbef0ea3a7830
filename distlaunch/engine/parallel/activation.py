"""Activation checkpointing: keep only each block's input, recompute the rest in backward.

Applied after tensor parallel and ``train.compile`` (around the compiled forward, see
``parallel/compile.py``) and before ZeRO-3, by replacing each block's ``forward`` rather than
wrapping the module, so parameter names (and with them
checkpoints and the tp plan) stay those of the plain model.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint

from distlaunch.engine.model import GPT


def _checkpointed(forward, x: torch.Tensor) -> torch.Tensor:
    # non-reentrant: works with inputs that do not require grad and with FSDP's hooks
    return checkpoint(forward, x, use_reentrant=False)


def apply_activation_checkpointing(chunks: list[GPT]) -> None:
    """Recompute every block's activations in the backward pass instead of storing them."""
    for chunk in chunks:
        for block in chunk.blocks.values():
            block.forward = functools.partial(_checkpointed, block.forward)
