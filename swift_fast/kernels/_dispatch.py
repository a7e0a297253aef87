"""Backend choice shared by the ops: Triton on CUDA, the CPU path (torch or native C++) elsewhere.

``backend``:
    ``"auto"``   Triton for CUDA tensors; on the CPU the native kernel where it is built and
                 measurably beats the torch reference for that op (``NATIVE_OPS``), else torch.
    ``"torch"``  the pure-torch reference.
    ``"triton"`` the Triton kernel; on CPU tensors it needs ``TRITON_INTERPRET=1`` set before
                 ``triton`` is first imported (tests do this).
    ``"native"`` the C++ kernel (CPU tensors only; built by ``setup.py`` when a compiler is there).
"""

from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "torch", "triton", "native")

try:  # Triton is optional on the CPU; every op has a torch path.
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    triton = None
    tl = None
    HAVE_TRITON = False

try:
    from . import _native  # type: ignore[attr-defined]
except ImportError:  # not built: pure torch on the CPU
    _native = None

#: Ops whose native CPU kernel beat the torch reference on the 2-core CI machine (see
#: ``bench/RESULTS.md``); ``auto`` uses native only for these.
NATIVE_OPS = frozenset()


def interpreting() -> bool:
    """True when Triton kernels run through the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def native_module():
    """The compiled extension module, or ``None`` when it was not built."""
    return _native


def resolve(backend: str, device: torch.device, op: str) -> str:
    """The backend that runs ``op`` for tensors on ``device``: ``"torch"``, ``"triton"`` or ``"native"``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    if backend == "auto":
        if device.type == "cuda":
            return "triton" if HAVE_TRITON else "torch"
        if device.type == "cpu" and _native is not None and op in NATIVE_OPS:
            return "native"
        return "torch"
    if backend == "triton":
        if not HAVE_TRITON:
            raise RuntimeError(f"{op}: backend='triton' needs the 'triton' package (pip install triton)")
        if device.type != "cuda" and not interpreting():
            raise RuntimeError(
                f"{op}: backend='triton' on {device.type} tensors runs only through the Triton interpreter; "
                "set TRITON_INTERPRET=1 before importing triton, or use backend='torch'"
            )
    if backend == "native":
        if device.type != "cpu":
            raise RuntimeError(f"{op}: backend='native' is a CPU kernel; got {device.type} tensors")
        if _native is None:
            raise RuntimeError(
                f"{op}: the native CPU extension is not built; reinstall with a C++ compiler "
                "(pip install --no-build-isolation -e .) or use backend='torch'"
            )
    return backend


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()
