"""DeepConf's confidence signals ("Deep Think with Confidence", Fu et al. 2025), the baseline that
SWIFT's Best-of-N selection and pruning are measured against.

Token confidence at generated position ``t`` (the distribution the token was sampled from, the
model's own: no temperature, penalties or processors)::

    C_t = -(1/k) * sum_{j <= k} log P_t(j)        over the k most probable tokens (k = TOP_K)

A peaked distribution has a few tokens near log 1 = 0 and the rest far below, so C_t is high
when the model is sure. Group confidence is the mean of ``C`` over a sliding window of ``W``
consecutive tokens; a candidate's *lowest group* confidence is the minimum over its windows (a
sequence shorter than ``W`` is one group), its *tail* confidence the mean over its last ``W``
tokens, its *bottom-10%* confidence the mean of the lowest 10% of its window means (at least
one window). Higher is better for all of them. A candidate with no token has no confidence: NaN.

The paper uses k = 20 and W = 2048 on reasoning traces of thousands of tokens (the default
here, :data:`DEFAULT_WINDOW`); callers may choose ``W`` for their answer lengths (the demo's
answers are tens of tokens). An answer of at most ``W`` tokens is one group: all three
confidences are then its mean token confidence.

The same definitions as the ``deepconf`` package's ``utils`` (``compute_confidence``,
``compute_least_grouped``, ``calculate_tail_confidence``, ``calculate_bottom_window_confidence``),
without its rounding to 3 decimals; ``tests/test_confidence_peer.py`` holds them to it.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

import torch

#: tokens whose log-probs a token confidence averages (the paper's k)
TOP_K = 20
#: tokens per group (the paper's sliding window)
DEFAULT_WINDOW = 2048
#: share of the lowest window means that ``bottom`` averages (the paper's bottom 10%)
BOTTOM_FRACTION = 0.1


def token_confidence(logits: torch.Tensor, k: int = TOP_K, lse: torch.Tensor | None = None) -> torch.Tensor:
    """``C_t`` of every row: float32 ``[T]`` from logits ``[T, V]`` (any float dtype; reduced in
    float32). ``k`` is capped at the vocabulary size. ``lse``: the rows' ``logsumexp`` when the
    caller has it already (float32 ``[T]``)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [T, V], got shape {tuple(logits.shape)}")
    x = logits.float()
    k = min(int(k), x.shape[-1])
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    top = torch.topk(x, k, dim=-1).values
    if lse is None:
        lse = torch.logsumexp(x, dim=-1)
    return lse.float() - top.mean(dim=-1)


def lowest_group(conf: Sequence[float], window: int) -> float:
    """Minimum over sliding windows of ``window`` tokens of the window mean (NaN when empty)."""
    _check_window(window)
    c = [float(x) for x in conf]
    if not c:
        return math.nan
    if len(c) <= window:
        return sum(c) / len(c)
    run = sum(c[:window])
    best = run
    for i in range(window, len(c)):
        run += c[i] - c[i - window]
        best = min(best, run)
    return best / window


def tail(conf: Sequence[float], window: int) -> float:
    """Mean of the last ``window`` token confidences (NaN when empty)."""
    _check_window(window)
    c = [float(x) for x in conf][-window:]
    return sum(c) / len(c) if c else math.nan


def window_means(conf: Sequence[float], window: int) -> list[float]:
    """Mean of every window of ``window`` consecutive tokens (float64, as differences of prefix
    sums: exact to ~1e-12 for confidences, which lie in [0, log V]); one group, the mean of all
    (``math.fsum``), when there are at most ``window`` tokens."""
    _check_window(window)
    c = [float(x) for x in conf]
    if not c:
        return []
    if len(c) <= window:
        return [math.fsum(c) / len(c)]
    import numpy as np

    s = np.concatenate([[0.0], np.cumsum(np.asarray(c, dtype=np.float64))])
    return ((s[window:] - s[:-window]) / window).tolist()


def bottom(conf: Sequence[float], window: int, fraction: float = BOTTOM_FRACTION) -> float:
    """Mean of the lowest ``fraction`` of the window means (at least one; NaN when empty)."""
    means = window_means(conf, window)
    if not means:
        return math.nan
    k = max(1, int(len(means) * fraction))
    return math.fsum(sorted(means)[:k]) / k


def summary(conf: Sequence[float], window: int) -> dict[str, float]:
    """A candidate's three group confidences from its token confidences ``conf``:
    ``{"confidence_lowest_group", "confidence_tail", "confidence_bottom10"}`` (NaN when empty)."""
    return {"confidence_lowest_group": lowest_group(conf, window), "confidence_tail": tail(conf, window),
            "confidence_bottom10": bottom(conf, window)}


def _check_window(window: int) -> None:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"the confidence window must be a positive number of tokens, got {window!r}")


class RunningConfidence:
    """:func:`lowest_group` of a growing sequence, one token at a time in O(1): what a generation
    engine can keep per candidate while it generates. The window sum is kept in float64 and
    re-summed from the window every ``window`` tokens, so it does not drift on long sequences."""

    __slots__ = ("window", "values", "total", "n", "lowest")

    def __init__(self, window: int):
        _check_window(window)
        self.window = window
        self.values: deque = deque(maxlen=window)
        self.total = 0.0
        self.n = 0
        self.lowest = math.inf  # lowest full-window sum

    def push(self, c: float) -> None:
        if len(self.values) == self.window:
            self.total -= self.values[0]
        self.values.append(float(c))
        self.total += float(c)
        self.n += 1
        if self.n % self.window == 0:
            self.total = math.fsum(self.values)
        if self.n >= self.window:
            self.lowest = min(self.lowest, self.total)

    def value(self) -> float:
        """The lowest group confidence so far (NaN before the first token)."""
        if self.n == 0:
            return math.nan
        if self.n < self.window:
            return self.total / self.n
        return self.lowest / self.window
