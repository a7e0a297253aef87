"""Small Triton helpers shared by the kernels (defined only when Triton is installed)."""

from __future__ import annotations

from ._dispatch import HAVE_TRITON, tl, triton

#: ``ROUND`` codes: how a (hidden + residual) sum is rounded before projection, so that it
#: equals the residual stream the engine stores (an add in the input dtype).
ROUND_NONE, ROUND_BF16, ROUND_FP16 = 0, 1, 2


def round_code(dtype) -> int:
    import torch

    return {torch.bfloat16: ROUND_BF16, torch.float16: ROUND_FP16}.get(dtype, ROUND_NONE)


if HAVE_TRITON:

    @triton.jit
    def round_to(x, ROUND: tl.constexpr):
        """Round float32 ``x`` to bf16/fp16 precision (nearest even) and return it as float32.

        NOTE: bf16 rounding is done on the bits: the interpreter truncates on ``.to(tl.bfloat16)``
        while GPUs round to nearest even, and the two must agree with torch's bf16 add.
        """
        if ROUND == 1:
            xs = tl.where(x != x, 0.0, x)  # NaN would carry into the sign bit below
            bits = xs.to(tl.uint32, bitcast=True)
            bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
            return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
        elif ROUND == 2:
            return x.to(tl.float16).to(tl.float32)
        else:
            return x

    @triton.jit
    def not_below(x, lo):
        """``max(x, lo)`` that keeps NaN (``tl.maximum`` may drop it)."""
        return tl.where(x < lo, lo, x)

    @triton.jit
    def not_above(x, hi):
        """``min(x, hi)`` that keeps NaN."""
        return tl.where(x > hi, hi, x)
