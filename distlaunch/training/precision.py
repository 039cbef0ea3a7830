"""The precision rules by name, without torch: which dtype the model's parameters, its hidden states and the
gradients' reductions have for ``train.precision``, ``train.reduce_dtype`` and the ZeRO stage. The engine
(``distlaunch.engine.precision``) turns the names into torch dtypes; the memory planner counts their bytes.

- bf16 with ZeRO-0/1/2: the model holds bf16 parameters (fp32 master weights beside them in the optimizer).
- bf16/fp16 with ZeRO-3: the sharded fp32 parameters are the master weights; FSDP2 all-gathers 16-bit copies.
- fp16 with ZeRO-0/1/2 and fp32 everywhere: fp32 parameters, which are their own master weights.
"""

from __future__ import annotations

ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def model_dtype_name(precision: str, zero: int) -> str:
    """The dtype of the model's parameters for ``train.precision`` and ZeRO stage ``zero``
    (ZeRO-3's are the sharded fp32 masters; FSDP2 casts its all-gathers)."""
    return "bf16" if precision == "bf16" and zero in (0, 1, 2) else "fp32"


def reduce_dtype_name(precision: str, reduce_dtype: str | None) -> str:
    """What the gradients are reduced in: ``train.reduce_dtype`` when set, else bf16 for bf16
    training and fp32 otherwise (fp16's loss-scaled gradients keep fp32's range and digits)."""
    if reduce_dtype is not None:
        return reduce_dtype
    return "bf16" if precision == "bf16" else "fp32"


def hidden_dtype_name(precision: str, zero: int) -> str:
    """The dtype of the hidden states between and around the blocks (the residual stream, and
    the layer norms' inputs): that of the weights the blocks compute with. 16-bit parameters
    make 16-bit hidden states, and so does ZeRO-3 in 16 bits (FSDP2 casts its all-gathered
    weights and each unit's inputs); fp32 parameters under autocast (fp16 with ZeRO-0/1/2) keep
    them fp32, and only the matmuls' inputs and outputs are 16-bit."""
    if precision != "fp32" and zero == 3:
        return precision
    return model_dtype_name(precision, zero)
