"""SWIFT scores from per-layer hidden states (DESIGN 2)."""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from ..kernels.swift_reduce import Layer, gate_and_reward, project_reference, swift_reduce
from .head import SwiftHead


def _check_layers(layers: Sequence[Layer], head: SwiftHead) -> None:
    if len(layers) != len(head.layers):
        raise ValueError(
            f"the head reads {len(head.layers)} states (layers {head.layers}), got {len(layers)} tensors"
        )


def swift_score(
    layers: Sequence[Layer],
    head: SwiftHead,
    cu_seqlens: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """One SWIFT score per candidate.

    Args:
        layers: ``len(head.layers)`` tensors ``[T, d]`` (any float dtype), in the head's layer
            order, already aligned (row t is the state that scores token t); never concatenated.
            A ``(hidden, residual)`` pair stands for their sum.
        head: the SWIFT head (its ``norm_eps``, the state norm, is applied to each state).
        cu_seqlens: int ``[B+1]``; candidate ``b`` is rows ``cu[b]:cu[b+1]``.
    Returns:
        ``[B]`` float32. A candidate with no scored token scores 0.
    """
    _check_layers(layers, head)
    score, _, _ = swift_reduce(layers, head.weight, head.bias, cu_seqlens, backend=backend, norm_eps=head.norm_eps)
    return score


def token_scores(layers: Sequence[Layer], head: SwiftHead) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``(gate[T], reward[T])`` float32 (gate 1 for a head without gate).

    ``layers`` as for :func:`swift_score`; the head's state norm is applied to each state.
    """
    _check_layers(layers, head)
    z = project_reference(layers, head.weight, head.bias, head.norm_eps)
    return gate_and_reward(z, head.gate)
