"""Standardised features for training a head, folded back into the head when training ends.

A pretrained model's hidden states are far from unit scale: the residual stream grows with depth
and a few "massive" dimensions are hundreds of times larger than the rest (SmolLM2-135M's final
layers, for one). A linear head trained on raw states with AdamW, whose steps are about ``lr``
per weight whatever the gradient's scale, then moves the score mostly through those few large
dimensions, and weight decay shrinks weights in units of the raw states. Training on
standardised states -- each (state, dimension) centred and divided by its standard deviation
over the training tokens -- puts every dimension on one footing (the usual preconditioning of a
linear probe).

Nothing of this reaches the head file or the kernels: since every token's projection is linear,
``w . ((h - mu) / sigma) + b == (w / sigma) . h + (b - w . (mu / sigma))``, so the trained head is
folded once into an ordinary head over raw states (``fold``), computed in float64. The head
format, the plugin and the fused kernels see a plain head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

#: floor of a standard deviation, relative to the largest of its state: a dimension that never
#: varies is centred and left at that scale rather than divided by zero
STD_FLOOR = 1e-6


@dataclass
class FeatureScale:
    """Per (state, dimension) statistics over training tokens, float64 ``[k, d]`` each."""

    mean: torch.Tensor
    std: torch.Tensor
    tokens: int


def feature_scale(source, keys: Sequence[int], batch_size: int = 64) -> FeatureScale:
    """Mean and standard deviation of every state's dimensions over the tokens of ``keys`` (one
    pass over ``source.features``; sums in float64, centred on the first batch's mean so large
    offsets do not cancel digits)."""
    shift = s1 = s2 = None
    n = 0
    for a in range(0, len(keys), batch_size):
        states, _ = source.features(list(keys[a : a + batch_size]))
        x = torch.stack([s.detach().double().cpu() for s in states], 0)  # [k, N, d]
        if x.shape[1] == 0:
            continue
        if shift is None:
            shift = x.mean(1, keepdim=True)
            s1 = torch.zeros_like(shift[:, 0])
            s2 = torch.zeros_like(shift[:, 0])
        x = x - shift
        s1 += x.sum(1)
        s2 += (x * x).sum(1)
        n += x.shape[1]
    if n == 0:
        raise ValueError("no scored token in the training candidates: nothing to standardise")
    m = s1 / n
    var = (s2 / n - m * m).clamp_min(0.0)
    std = var.sqrt()
    floor = STD_FLOOR * std.amax(1, keepdim=True).clamp_min(1e-30)
    return FeatureScale(mean=m + shift[:, 0], std=torch.maximum(std, floor), tokens=n)


class ScaledSource:
    """``source`` with every state standardised by ``scale`` (same keys, same ``cu``), float32."""

    def __init__(self, source, scale: FeatureScale):
        self.source = source
        self._mean = scale.mean.float()
        self._inv = (1.0 / scale.std).float()
        self.recomputes = getattr(source, "recomputes", False)
        self.progress_note = getattr(source, "progress_note", None)
        if callable(getattr(source, "mean_logprobs", None)):
            self.mean_logprobs = source.mean_logprobs

    def features(self, keys):
        states, cu = self.source.features(keys)
        out = []
        for i, s in enumerate(states):
            dev = s.device
            out.append((s.float() - self._mean[i].to(dev)) * self._inv[i].to(dev))
        return out, cu


def fold(weight: torch.Tensor, bias: torch.Tensor, scale: FeatureScale) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights over raw states of a head trained on ``ScaledSource`` states: ``weight``
    ``[rows, k*d]`` and ``bias`` ``[rows]`` in, the same shapes out, computed in float64 and
    returned in ``weight``'s dtype."""
    k, d = scale.mean.shape
    w = weight.detach().double().cpu().reshape(weight.shape[0], k, d)
    w_raw = w / scale.std.unsqueeze(0)
    b_raw = bias.detach().double().cpu() - (w_raw * scale.mean.unsqueeze(0)).sum((1, 2))
    return w_raw.reshape(weight.shape).to(weight.dtype), b_raw.to(bias.dtype)
