"""Parameter hooks that do not keep their owner alive.

A post-accumulate-grad hook is stored on the parameter's C++ side, where Python's cycle
collector cannot see it. A hook that is a bound method of the object holding the parameters
(a gradient reducer, the fp32 gradient accumulator) closes a cycle the collector cannot break:
after ``del engine`` the strategy, its buffers and its parameters would stay alive for the life
of the process. The hook holds its owner weakly instead, so the owner goes with the engine.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch


def register_weak_hook(param: torch.Tensor, method: Callable[[torch.Tensor], None]) -> None:
    """Call the bound ``method`` after each accumulation into ``param``'s gradient, for as long
    as its object lives."""
    ref = weakref.WeakMethod(method)

    def hook(tensor: torch.Tensor) -> None:
        bound = ref()
        if bound is not None:
            bound(tensor)

    param.register_post_accumulate_grad_hook(hook)
