"""Backend choice shared by the ops: Triton on CUDA, the CPU path (torch or native C++) elsewhere.

``backend``:
    ``"auto"``   Triton for CUDA tensors; on the CPU the native kernel where it is built and
                 measurably beats the torch reference for that op and dtype (``NATIVE_PAYS``),
                 else torch.
    ``"torch"``  the pure-torch reference.
    ``"triton"`` the Triton kernel; on CPU tensors it needs ``TRITON_INTERPRET=1`` set before
                 ``triton`` is first imported (tests do this).
    ``"native"`` the C++ kernel (CPU tensors only; built by ``setup.py`` when a compiler is there).
"""

from __future__ import annotations

import contextlib
import os

import torch

BACKENDS = ("auto", "torch", "triton", "native")

try:  # Triton is optional on the CPU; every op has a torch path.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    triton = None
    tl = None
    HAVE_TRITON = False

try:
    from . import _native  # type: ignore[attr-defined]
except ImportError:  # not built: pure torch on the CPU
    _native = None

_F32, _BF16, _F16 = torch.float32, torch.bfloat16, torch.float16
#: Where the native CPU kernel beat the torch reference by 1.1x or more on the 2-core CI machine
#: (single thread, min of 15 runs; ``bench/RESULTS.md``): ``auto`` uses native only there.
#: ``finish_`` has no native kernel (a few hundred flops a step: nothing to gain).
NATIVE_PAYS = {
    "swift_reduce": {_BF16, _F16},  # float32: 1.0-1.2x, within noise: torch
    "project_layer": {_F32, _BF16, _F16},  # except float16 (hidden, residual) pairs: 0.8x
    "token_logprobs": {_F32, _BF16, _F16},
    "sar_from_logits": {_F32, _BF16, _F16},
}


def native_pays(op: str, dtype: torch.dtype, paired: bool = False) -> bool:
    """Whether ``auto`` should take the native kernel for ``op`` on inputs of ``dtype``."""
    if op == "project_layer" and dtype == _F16 and paired:
        return False
    return dtype in NATIVE_PAYS.get(op, ())


def interpreting() -> bool:
    """True when Triton kernels run through the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def native_module():
    """The compiled extension module, or ``None`` when it was not built."""
    return _native


def resolve(backend: str, device: torch.device, op: str, dtype: torch.dtype = None, paired: bool = False) -> str:
    """The backend that runs ``op`` for tensors on ``device``: ``"torch"``, ``"triton"`` or ``"native"``.

    ``dtype``/``paired`` (inputs' dtype, (hidden, residual) pairs) refine ``auto`` on the CPU.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    if backend == "auto":
        if device.type == "cuda":
            return "triton" if HAVE_TRITON else "torch"
        if device.type == "cpu" and _native is not None and native_pays(op, dtype, paired):
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


def row_major(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when its last dimension has unit stride (the kernels take a row stride and
    need unit stride along a row), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def same_device(op: str, **tensors) -> torch.device:
    """The one device of ``tensors`` (``None`` values are skipped).

    Raises ``ValueError`` naming every input and its device when they differ: a kernel given
    another device's pointers would read the wrong memory (or fault) instead of failing clearly.
    """
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        listing = ", ".join(f"{name} on {d}" for name, d in devices.items())
        raise ValueError(f"{op}: all inputs must be on one device, got {listing}; move them with .to(device)")
    return first


def device_guard(device: torch.device):
    """Context that makes ``device`` current for a Triton launch.

    NOTE: Triton launches on the *current* CUDA device, whatever device the pointers belong to:
    inputs on ``cuda:1`` launched while ``cuda:0`` is current read the wrong memory. Every
    launcher enters this with its inputs' device.
    """
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()
