"""Fused ops, one file each, with their pure-torch references beside them.

``backend``: ``"auto"`` (Triton on CUDA tensors, otherwise the CPU path), ``"torch"`` (the
reference), ``"triton"`` or ``"native"`` (C++ on the CPU, where built).
"""

from .swift_reduce import swift_reduce, swift_reduce_reference

__all__ = ["swift_reduce", "swift_reduce_reference"]
