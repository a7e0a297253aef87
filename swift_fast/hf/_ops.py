"""The fused ops this package uses, with the torch reference where a kernel is not there."""

from __future__ import annotations

import torch

try:
    from ..kernels.streaming import finish_ as _finish_op
    from ..kernels.streaming import project_layer_ as _project_op
except ImportError:  # pragma: no cover - depends on the kernels shipped
    _project_op = None
    _finish_op = None


def project_(acc: torch.Tensor, x: torch.Tensor, weight_l: torch.Tensor) -> None:
    """``acc[:n, :rows] += x @ weight_l^T`` in float32, in place.

    ``acc``: float32 ``[>= n, 2]``; ``x``: ``[n, d]`` any float dtype and row stride;
    ``weight_l``: ``[rows, d]`` (the head's columns for one state).
    """
    if _project_op is not None:
        _project_op(acc, x, None, weight_l)
    else:
        acc[: x.shape[0], : weight_l.shape[0]] += x.float() @ weight_l.float().T


def finish_(acc: torch.Tensor, bias: torch.Tensor, slots: torch.Tensor, state: torch.Tensor) -> None:
    """Gate ``acc[:T] + bias`` and add ``(g r, g, 1)`` into ``state[slots[t]]``; then zero ``acc[:T]``.

    ``slots``: int64 ``[T]`` (``-1`` skips a row); ``state``: float32 ``[S, 3]``.
    """
    if _finish_op is not None:
        _finish_op(acc, bias.float(), slots, state)
        return
    t, rows = slots.shape[0], bias.numel()
    z = acc[:t, :rows] + bias.float()
    g, r = (torch.sigmoid(z[:, 0]), z[:, 1]) if rows == 2 else (torch.ones_like(z[:, 0]), z[:, 0])
    vals = torch.stack([g * r, g, torch.ones_like(g)], 1)
    ok = slots >= 0
    state.index_add_(0, slots[ok], vals[ok])
    acc[:t].zero_()


def scores_from_state(state: torch.Tensor) -> torch.Tensor:
    """``[S]`` float32: ``sum g r / max(sum g, 1e-8)`` (0 where nothing was scored)."""
    from ..kernels.swift_reduce import finish_scores

    return finish_scores(state[:, 0], state[:, 1])


def gated_scores(z: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scores from per-step projections: ``z [S, B, >= rows]`` (without bias; ``rows`` is the
    head's, ``bias.numel()``), ``mask [S, B]`` (True where the step's token belongs to the
    response) -> ``[B]`` float32."""
    from ..kernels.swift_reduce import finish_scores, gate_and_reward

    s, b, rows = z.shape[0], z.shape[1], bias.numel()
    g, r = gate_and_reward((z[..., :rows].reshape(s * b, rows).float() + bias.float()), rows == 2)
    m = mask.reshape(s * b).to(torch.float32)
    # where() rather than a product: a NaN on a masked-out step must not leak into the sum.
    g = torch.where(m > 0, g, torch.zeros_like(g)).reshape(s, b)
    gr = torch.where(m > 0, g.reshape(-1) * r, torch.zeros_like(r)).reshape(s, b)
    return finish_scores(gr.sum(0), g.sum(0))
