"""Streaming SWIFT for generation: project each layer as the model produces it, gate at the end.

Two PyTorch custom ops (``torch.ops.swift_fast.*``), with fake implementations, static shapes and
no host synchronisation, so that ``torch.compile`` traces them and CUDA graphs capture them:

``project_layer_(acc, hidden, residual, weight_l, norm_eps=None)``
    ``acc[:T, :rows] += s * (stream @ weight_l^T)`` in float32, where ``stream`` is ``hidden`` or
    ``hidden + residual`` summed in the input dtype (the residual stream vLLM stores), and ``s``
    is 1 (``norm_eps`` None) or, with a head's state norm, each token's
    ``rsqrt(mean(stream^2) + norm_eps)`` (float32, from the same read of the state).
    ``acc``: float32 ``[N >= T, 2]`` (mutated); ``hidden``/``residual``: ``[T, d]`` any float
    dtype, any row stride; ``weight_l``: ``[rows, d]`` (rows 2 with gate, 1 without), the head's
    columns for this layer (the norm's gain folded in); ``norm_eps``: None or a float >= 0 (a
    constant to ``torch.compile``).

``finish_(acc, bias, slots, state)``
    For every token ``t < T = slots.numel()`` whose ``slots[t]`` is in ``[0, S)``:
    ``z = acc[t, :rows] + bias``; ``(g, r) = (sigmoid(z0), z1)`` with gate, ``(1, z0)`` without;
    ``state[slots[t]] += (g * r, g, 1)``. Tokens with another slot (``-1``: not scored) are
    skipped. Then ``acc[:T, :]`` is zeroed, every column and every row below ``T`` whatever its
    slot, so the next forward starts clean; rows ``>= T`` are not touched (they stay zero when
    each step's ``T`` comes from the same ``acc``).
    ``bias``: float32 ``[rows]``; ``slots``: int32/int64 ``[T]``; ``state``: float32 ``[S, 3]``
    (mutated), per request ``(sum g r, sum g, count)``; score = ``sum g r / max(sum g, 1e-8)``.

Determinism: on the Triton path each slot's sum over the step's tokens is a fixed-order
reduction (a program owns a block of slots and scans every token), so several tokens of one
slot in one step (a prefill chunk) add up bit-identically run to run; no atomics. The CPU
reference uses ``index_add_``, sequential on the CPU; the torch path on CUDA (used only without
Triton) relies on atomics and is not bit-stable.

Counts are float32: exact up to 2**24 tokens per request.

State that compiled code updates must reach the graph as a module buffer or an input (a global
tensor mutated inside a compiled graph is not updated): register ``acc`` and ``state`` as buffers.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._dispatch import HAVE_TRITON, device_guard, native_module, resolve, same_device, tl, triton
from .swift_reduce import check_norm_eps, finish_scores, native_fits, project_triton, rms_scale

__all__ = [
    "project_layer_",
    "finish_",
    "project_layer_reference",
    "finish_reference",
    "new_buffers",
    "scores_from_state",
    "set_cpu_backend",
]


# ----------------------------------------------------------------------------------------------
# checks (shared by the real and the fake implementations, so bad shapes fail at trace time)


def _check_project(acc: torch.Tensor, hidden: torch.Tensor, residual: Optional[torch.Tensor], weight_l: torch.Tensor,
                   norm_eps: Optional[float] = None):
    check_norm_eps(norm_eps)
    dev = acc.device  # compared inline: this runs once per layer per step
    if hidden.device != dev or weight_l.device != dev or (residual is not None and residual.device != dev):
        same_device("project_layer_", acc=acc, hidden=hidden, residual=residual, weight_l=weight_l)
    if acc.dtype != torch.float32 or acc.dim() != 2 or acc.shape[1] < 1:
        raise ValueError(f"acc must be a float32 [N, 2] buffer, got {acc.dtype} {tuple(acc.shape)}")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [T, d], got {tuple(hidden.shape)}")
    if residual is not None and residual.shape != hidden.shape:
        raise ValueError(f"residual {tuple(residual.shape)} does not match hidden {tuple(hidden.shape)}")
    if weight_l.dim() != 2 or weight_l.shape[0] not in (1, 2) or weight_l.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"weight_l must be [rows in (1, 2), d={hidden.shape[1]}], got {tuple(weight_l.shape)}"
        )
    if weight_l.shape[0] > acc.shape[1]:
        raise ValueError(f"acc has {acc.shape[1]} columns, the head {weight_l.shape[0]} rows")
    if hidden.shape[0] > acc.shape[0]:
        raise ValueError(
            f"{hidden.shape[0]} tokens do not fit acc of {acc.shape[0]} rows: size acc for the largest batch"
        )


def _check_finish(acc: torch.Tensor, bias: torch.Tensor, slots: torch.Tensor, state: torch.Tensor):
    dev = acc.device
    if bias.device != dev or slots.device != dev or state.device != dev:
        same_device("finish_", acc=acc, bias=bias, slots=slots, state=state)
    if acc.dtype != torch.float32 or acc.dim() != 2:
        raise ValueError(f"acc must be a float32 [N, 2] buffer, got {acc.dtype} {tuple(acc.shape)}")
    if bias.dim() != 1 or bias.numel() not in (1, 2) or bias.numel() > acc.shape[1]:
        raise ValueError(f"bias must be [rows in (1, 2)] and fit acc, got {tuple(bias.shape)}")
    if slots.dim() != 1 or slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slots must be a 1-D int32/int64 tensor, got {slots.dtype} {tuple(slots.shape)}")
    if slots.shape[0] > acc.shape[0]:
        raise ValueError(f"{slots.shape[0]} slots for acc of {acc.shape[0]} rows")
    if state.dtype != torch.float32 or state.dim() != 2 or state.shape[1] != 3:
        raise ValueError(f"state must be a float32 [S, 3] buffer, got {state.dtype} {tuple(state.shape)}")


# ----------------------------------------------------------------------------------------------
# references


def project_layer_reference(acc, hidden, residual, weight_l, norm_eps: Optional[float] = None) -> None:
    """In-place reference of ``project_layer_`` (see the module docstring)."""
    t, rows = hidden.shape[0], weight_l.shape[0]
    stream = (hidden if residual is None else hidden + residual).float()
    part = stream @ weight_l.float().T
    if norm_eps is not None:
        part = part * rms_scale(stream, norm_eps)
    acc[:t, :rows] += part


def finish_reference(acc, bias, slots, state) -> None:
    """In-place reference of ``finish_`` (see the module docstring); static shapes, no sync."""
    t = slots.shape[0]
    rows = bias.numel()
    z = acc[:t, :rows] + bias.float()
    if rows == 2:
        g, r = torch.sigmoid(z[:, 0]), z[:, 1]
    else:
        g, r = torch.ones_like(z[:, 0]), z[:, 0]
    vals = torch.stack([g * r, g, torch.ones_like(g)], dim=1)
    s = slots.long()
    valid = (s >= 0) & (s < state.shape[0])
    # invalid tokens add an exact 0 to slot 0 (masked with where: a NaN there must not leak)
    vals = torch.where(valid[:, None], vals, torch.zeros((), dtype=vals.dtype, device=vals.device))
    state.index_add_(0, torch.where(valid, s, torch.zeros_like(s)), vals)
    acc[:t].zero_()


# ----------------------------------------------------------------------------------------------
# Triton

if HAVE_TRITON:

    # NOTE: T (the step's token count) is not specialised: no recompile when the batch changes.
    @triton.jit(do_not_specialize=["T"])
    def _finish_kernel(acc_ptr, stride_acc, bias_ptr, slots_ptr, state_ptr, stride_state, T, S,
                       GATE: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr):
        # NOTE: one program owns BLOCK_S slots and scans all T tokens: each slot's sum runs in a
        # fixed order whatever the layout of the batch, with no atomics (O(S*T/BLOCK_S) compares,
        # tiny next to a forward pass).
        sl = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
        b0 = tl.load(bias_ptr)
        if GATE:
            b1 = tl.load(bias_ptr + 1)
        sum_w = tl.zeros([BLOCK_S], dtype=tl.float32)
        sum_g = tl.zeros([BLOCK_S], dtype=tl.float32)
        cnt = tl.zeros([BLOCK_S], dtype=tl.float32)
        for t0 in range(0, T, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            mt = t < T
            slot = tl.load(slots_ptr + t, mask=mt, other=-1).to(tl.int32)
            z0 = tl.load(acc_ptr + t.to(tl.int64) * stride_acc, mask=mt, other=0.0) + b0
            if GATE:
                z1 = tl.load(acc_ptr + t.to(tl.int64) * stride_acc + 1, mask=mt, other=0.0) + b1
                g = tl.sigmoid(z0)
                gr = g * z1
            else:
                g = tl.full([BLOCK_T], 1.0, tl.float32)
                gr = z0
            hit = slot[None, :] == sl[:, None]
            sum_w += tl.sum(tl.where(hit, gr[None, :], 0.0), axis=1)
            sum_g += tl.sum(tl.where(hit, g[None, :], 0.0), axis=1)
            cnt += tl.sum(tl.where(hit, 1.0, 0.0), axis=1)
        ms = (sl < S) & (cnt > 0)  # slots no token hit stay bit-identical
        base = state_ptr + sl.to(tl.int64) * stride_state
        tl.store(base, tl.load(base, mask=ms, other=0.0) + sum_w, mask=ms)
        tl.store(base + 1, tl.load(base + 1, mask=ms, other=0.0) + sum_g, mask=ms)
        tl.store(base + 2, tl.load(base + 2, mask=ms, other=0.0) + cnt, mask=ms)


FINISH_BLOCK_S, FINISH_BLOCK_T = 16, 256
#: (block_t, block_d) of ``project_layer_`` for >= 8192, >= 2048 and fewer tokens.
PROJECT_TILES = ((16, 256), (4, 1024), (1, 4096))


_cpu_backend = "auto"


def set_cpu_backend(backend: str) -> str:
    """Choose what runs the ops on CPU tensors: ``"auto"`` (native where it pays, else torch),
    ``"torch"``, ``"native"`` or ``"triton"`` (the interpreter; tests). Returns the previous choice.
    CUDA tensors always take the Triton kernels (torch when Triton is missing)."""
    global _cpu_backend
    if backend != "auto":
        resolve(backend, torch.device("cpu"), "streaming")  # clear error when unavailable
    prev, _cpu_backend = _cpu_backend, backend
    return prev


def _which(t: torch.Tensor, op: str, dtype=None, paired: bool = False) -> str:
    if t.device.type == "cuda":
        return "triton" if HAVE_TRITON else "torch"
    if _cpu_backend == "auto":
        return resolve("auto", t.device, op, dtype, paired)
    if _cpu_backend == "native" and getattr(native_module(), op, None) is None:
        return "torch"  # finish_ has no native kernel: it is a few hundred flops
    return _cpu_backend


def project_layer_triton(acc, hidden, residual, weight_l, norm_eps: Optional[float] = None,
                         tiles: Optional[tuple] = None) -> None:
    """The Triton path of ``project_layer_``; ``tiles`` = ``(block_t, block_d)`` overrides the
    choice from ``PROJECT_TILES`` (tests)."""
    w = weight_l if weight_l.dtype == torch.float32 and weight_l.stride(-1) == 1 else weight_l.float().contiguous()
    t = hidden.shape[0]
    # few tokens (decode): one token a program, so a step still spreads over the SMs, with
    # tiles as wide as the large-T ones (16-byte loads for every thread)
    block_t, block_d = tiles or PROJECT_TILES[0 if t >= 8192 else (1 if t >= 2048 else 2)]
    project_triton([(hidden, residual)], w, acc, accumulate=True, block_t=block_t, block_d=block_d, norm_eps=norm_eps)


def finish_triton(acc, bias, slots, state, block_s: int = FINISH_BLOCK_S, block_t: int = FINISH_BLOCK_T) -> None:
    """The Triton path of ``finish_``; ``block_s``/``block_t`` are launch settings (tests set them
    small so that the token loop runs several tiles)."""
    t = slots.shape[0]
    s = state.shape[0]
    if t > 0 and s > 0:
        with device_guard(acc.device):
            _finish_kernel[(triton.cdiv(s, block_s),)](
                acc_ptr=acc, stride_acc=acc.stride(0), bias_ptr=bias.to(torch.float32).contiguous(), slots_ptr=slots,
                state_ptr=state, stride_state=state.stride(0), T=t, S=s,
                GATE=bias.numel() == 2, BLOCK_S=block_s, BLOCK_T=block_t,
            )
    acc[:t].zero_()


# ----------------------------------------------------------------------------------------------
# custom ops
#
# NOTE: registered with ``torch.library.Library`` (CPU and CUDA kernels, a fake kernel for
# tracing) rather than ``torch.library.custom_op``: the latter's Python wrapper costs ~40 us a
# call on the CPU, paid once per layer per step; this costs ~5 us. The schemas mark the
# mutated buffers, so torch.compile functionalizes the calls (auto_functionalize).

_lib = torch.library.Library("swift_fast", "FRAGMENT")
_lib.define(
    "project_layer_(Tensor(a!) acc, Tensor hidden, Tensor? residual, Tensor weight_l, float? norm_eps=None) -> ()"
)
_lib.define("finish_(Tensor(a!) acc, Tensor bias, Tensor slots, Tensor(b!) state) -> ()")


def _project_layer_impl(acc, hidden, residual, weight_l, norm_eps=None) -> None:
    _check_project(acc, hidden, residual, weight_l, norm_eps)
    which = _which(acc, "project_layer", hidden.dtype, residual is not None)
    if which == "triton":
        project_layer_triton(acc, hidden, residual, weight_l, norm_eps)
    elif which == "native" and native_fits(hidden, residual):
        # the C++ side reads a negative eps as "no state norm"
        native_module().project_layer(acc, hidden, residual, weight_l, -1.0 if norm_eps is None else norm_eps)
    else:
        project_layer_reference(acc, hidden, residual, weight_l, norm_eps)


def _finish_impl(acc, bias, slots, state) -> None:
    _check_finish(acc, bias, slots, state)
    which = _which(acc, "finish")
    if which == "triton":
        finish_triton(acc, bias, slots, state)
    elif which == "native":
        native_module().finish(acc, bias, slots, state)
    else:
        finish_reference(acc, bias, slots, state)


for _key in ("CPU", "CUDA"):
    _lib.impl("project_layer_", _project_layer_impl, _key)
    _lib.impl("finish_", _finish_impl, _key)


@torch.library.register_fake("swift_fast::project_layer_", lib=_lib)
def _project_layer_fake(acc, hidden, residual, weight_l, norm_eps=None) -> None:
    _check_project(acc, hidden, residual, weight_l, norm_eps)


@torch.library.register_fake("swift_fast::finish_", lib=_lib)
def _finish_fake(acc, bias, slots, state) -> None:
    _check_finish(acc, bias, slots, state)


def project_layer_(
    acc: torch.Tensor,
    hidden: torch.Tensor,
    residual: Optional[torch.Tensor],
    weight_l: torch.Tensor,
    norm_eps: Optional[float] = None,
) -> None:
    """Add one layer's partial SWIFT projection into ``acc`` in place (see the module docstring);
    ``norm_eps``: the head's state norm (None: none)."""
    torch.ops.swift_fast.project_layer_(acc, hidden, residual, weight_l, norm_eps)


def finish_(acc: torch.Tensor, bias: torch.Tensor, slots: torch.Tensor, state: torch.Tensor) -> None:
    """Gate the step's projections and add them into the per-request ``state`` (see the module docstring)."""
    torch.ops.swift_fast.finish_(acc, bias, slots, state)


def new_buffers(max_tokens: int, max_slots: int, device=None):
    """Zeroed ``(acc[max_tokens, 2], state[max_slots, 3])`` float32 buffers."""
    return (
        torch.zeros(max_tokens, 2, dtype=torch.float32, device=device),
        torch.zeros(max_slots, 3, dtype=torch.float32, device=device),
    )


def scores_from_state(state: torch.Tensor) -> torch.Tensor:
    """``[S]`` float32 score per slot: ``sum g r / max(sum g, 1e-8)`` (0 for a slot never scored)."""
    return finish_scores(state[:, 0], state[:, 1])
