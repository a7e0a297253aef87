"""SWIFT reduction: multi-layer 2-column projection, sigmoid gate and per-segment gated average.

Reference (pure torch) here; fast paths are added beside it and checked against it.

Math (SWIFT paper Eq. 2-4, DESIGN 2): for scored token t, ``z_t = sum_l W_l h^l_t + b``;
with gate ``g_t = sigmoid(z_t[0])``, ``r_t = z_t[1]``; without gate ``g_t = 1``, ``r_t = z_t[0]``.
Per segment ``R = sum g r / max(sum g, 1e-8)``; an empty segment scores 0.
"""

from __future__ import annotations

from typing import Sequence, Tuple, Union

import torch

Layer = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]

GATE_EPS = 1e-8


def _stream(layer: Layer) -> torch.Tensor:
    """The residual stream of one layer: ``hidden`` or ``hidden + residual`` (vLLM's pair form)."""
    if isinstance(layer, (tuple, list)):
        hidden, residual = layer
        return hidden.float() + residual.float()
    return layer.float()


def project_reference(layers: Sequence[Layer], weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``z = sum_l h_l @ W_l^T + b`` without concatenating the layers.

    Args:
        layers: ``k`` tensors ``[T, d]`` (any float dtype) or ``(hidden, residual)`` pairs.
        weight: ``[rows, k*d]`` (rows 2 with gate, 1 without).
        bias: ``[rows]``.
    Returns:
        ``[T, rows]`` float32.
    """
    k = len(layers)
    if k == 0:
        raise ValueError("swift projection needs at least one layer")
    d = weight.shape[1] // k
    if d * k != weight.shape[1]:
        raise ValueError(f"weight has {weight.shape[1]} columns, not a multiple of {k} layers")
    w = weight.float()
    z = None
    for i, layer in enumerate(layers):
        h = _stream(layer)
        if h.shape[-1] != d:
            raise ValueError(f"layer {i} has width {h.shape[-1]}, the head expects {d}")
        part = h @ w[:, i * d : (i + 1) * d].T
        z = part if z is None else z + part
    return z + bias.float()


def gate_and_reward(z: torch.Tensor, gate: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """``[T, rows]`` projections -> ``(g[T], r[T])`` float32 (``g = 1`` without gate)."""
    if gate:
        return torch.sigmoid(z[:, 0]), z[:, 1]
    return torch.ones_like(z[:, 0]), z[:, 0]


def segment_sums(values: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Per-segment sums of ``values[T]`` over ``[cu[b], cu[b+1])``: ``[B]`` float32."""
    cu = cu_seqlens.to(device=values.device, dtype=torch.long)
    lengths = cu[1:] - cu[:-1]
    if (lengths < 0).any():
        raise ValueError("cu_seqlens must be non-decreasing")
    b = lengths.numel()
    seg = torch.repeat_interleave(torch.arange(b, device=values.device), lengths)
    start = int(cu[0]) if cu.numel() else 0
    vals = values[start : start + seg.numel()].float()
    return torch.zeros(b, dtype=torch.float32, device=values.device).index_add_(0, seg, vals)


def swift_reduce_reference(
    layers: Sequence[Layer],
    weight: torch.Tensor,
    bias: torch.Tensor,
    cu_seqlens: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference SWIFT reduction.

    Args:
        layers: ``k`` tensors ``[T, d]`` or ``(hidden, residual)`` pairs; bf16/fp16/fp32.
        weight: ``[2, k*d]`` (gate) or ``[1, k*d]`` (no gate), any float dtype.
        bias: ``[2]`` or ``[1]``.
        cu_seqlens: int ``[B+1]``, segment ``b`` is tokens ``cu[b]:cu[b+1]``.
    Returns:
        ``(score[B], gate_sum[B], weighted_sum[B])`` float32; without gate ``gate_sum`` counts tokens.
    """
    gate = weight.shape[0] == 2
    z = project_reference(layers, weight, bias)
    g, r = gate_and_reward(z, gate)
    gsum = segment_sums(g, cu_seqlens)
    wsum = segment_sums(g * r, cu_seqlens)
    return finish_scores(wsum, gsum), gsum, wsum


def finish_scores(weighted_sum: torch.Tensor, gate_sum: torch.Tensor) -> torch.Tensor:
    """``R = sum g r / max(sum g, 1e-8)``; 0 where nothing was scored (both sums 0)."""
    return weighted_sum / torch.clamp(gate_sum, min=GATE_EPS)


def swift_reduce(
    layers: Sequence[Layer],
    weight: torch.Tensor,
    bias: torch.Tensor,
    cu_seqlens: torch.Tensor,
    backend: str = "auto",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SWIFT reduction; see :func:`swift_reduce_reference` for shapes and dtypes."""
    if backend not in ("auto", "torch"):
        raise ValueError(f"backend {backend!r} is not available for swift_reduce")
    return swift_reduce_reference(layers, weight, bias, cu_seqlens)
