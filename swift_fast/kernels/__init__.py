"""Fused ops, one file each: Triton kernel, launcher and pure-torch reference side by side.

``backend``: ``"auto"`` (Triton on CUDA tensors, otherwise the CPU path: the native C++ kernel
where it is built and beats the torch reference, else torch), ``"torch"`` (the reference),
``"triton"`` or ``"native"``. See :mod:`swift_fast.kernels._dispatch`.

Ops:
    swift_reduce                 multi-layer SWIFT projection, gate, per-segment gated average
    project_layer_, finish_      the streaming form (``torch.ops.swift_fast.*`` custom ops)
    token_logprobs               log P(target) per row without a [T, V] log-softmax
    sar_from_logits              both SAR passes and the SAR combination in one launch
    token_logprobs_from_hidden   chunked LM head + log-probs, never the whole [T, V] logits
"""

from .sar_from_logits import sar_from_logits, sar_from_logits_reference
from .streaming import finish_, project_layer_
from .swift_reduce import swift_reduce, swift_reduce_reference
from .token_logprobs import token_logprobs, token_logprobs_reference
from .token_logprobs_from_hidden import token_logprobs_from_hidden, token_logprobs_from_hidden_reference

__all__ = [
    "finish_",
    "project_layer_",
    "sar_from_logits",
    "sar_from_logits_reference",
    "swift_reduce",
    "swift_reduce_reference",
    "token_logprobs",
    "token_logprobs_from_hidden",
    "token_logprobs_from_hidden_reference",
    "token_logprobs_reference",
]
