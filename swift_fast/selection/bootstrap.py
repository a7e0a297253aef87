"""The bootstrap over problems: one percentile interval for every per-problem figure.

A report's figures are means over problems (Best-of-N accuracy, the oracle, a paired difference
of two selectors, the training verdict's within-problem AUC difference), and its problems are a
sample of the problems a user cares about; the candidates of one problem are not independent of
each other. So the unit resampled is the problem: ``reps`` resamples of the ``P`` per-problem
values, each drawn with replacement (a problem drawn twice counts twice), and the interval is the
``level`` percentile interval of the resamples' means (``torch.quantile``'s linear rule). A
paired difference is the bootstrap of the per-problem differences.

A problem whose value is NaN counts for nothing: it is drawn like any other (so the draws do not
depend on which values are NaN), but it adds neither to a resample's sum nor to its count. A
within-problem AUC is NaN for a problem without both a correct and an incorrect candidate, and
this is how such problems stay out of the verdict's interval. A resample that drew only NaN
problems has no mean and is left out; where every value is NaN (or there is none) the interval
is ``(nan, nan)``.

Seeded: ``torch.Generator().manual_seed(seed)``, indices from ``torch.randint``. The draws are
made :data:`CHUNK` resamples at a time, so memory stays at ``CHUNK x P`` values whatever ``reps``
is. NOTE: this changes no number: torch's CPU ``randint`` fills a tensor from the generator's
stream in order, so ``CHUNK``-row draws one after the other are the rows of one ``[reps, P]``
draw, bit for bit (checked for P up to 5000, reps 1 to 2000).
"""

from __future__ import annotations

import torch

#: resamples drawn at a time: bounds memory at ``CHUNK x P`` values
CHUNK = 256

#: how a resample's sum is formed (:func:`resample_means`)
SUMS = ("draws", "counts")


def _draw_means(x: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """Mean of the drawn values in draw order, NaN values left out; float64 ``[m]``."""
    v = x[draws]
    ok = ~torch.isnan(v)
    # with no NaN this is ``v.mean(1)`` to the bit: torch's CPU mean is the same sum divided by P
    return torch.where(ok, v, 0.0).sum(1) / ok.sum(1)


def _count_means(x: torch.Tensor, draws: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Each non-NaN problem's value times how often it was drawn, over that count; float64 ``[m]``."""
    m, p = draws.shape
    counts = torch.zeros(m, p, dtype=torch.float64).scatter_add_(1, draws, torch.ones(m, p, dtype=torch.float64))
    counts = counts[:, keep]
    n = counts.sum(1)
    return torch.where(n > 0, counts @ x[keep] / n.clamp(min=1), torch.full_like(n, float("nan")))


def resample_means(values, reps: int = 2000, seed: int = 0, sum_by: str = "draws") -> torch.Tensor:
    """The means of ``reps`` resamples of the per-problem ``values`` ``[P]``: float64 ``[reps]``,
    NaN for a resample that drew only NaN problems.

    ``sum_by``: ``"draws"`` sums a resample's drawn values in the order drawn; ``"counts"`` sums
    each problem's value times the number of times it was drawn (a matrix-vector product). The
    two are the same mean and differ in the last bits of a float64 sum.
    NOTE: both stay because each caller's published intervals were computed one way and must come
    out bit-identical: the Best-of-N reports (``swift_fast.reports.best_of_n.bootstrap_ci``) sum
    draws, the training verdict (``swift_fast.training.baselines``) sums counts.
    """
    if sum_by not in SUMS:
        raise ValueError(f"unknown sum_by {sum_by!r}; expected one of {', '.join(SUMS)}")
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    x = torch.as_tensor(values, dtype=torch.float64).detach().flatten()
    keep = ~torch.isnan(x)
    g = torch.Generator().manual_seed(seed)
    out = []
    for start in range(0, reps, CHUNK):
        draws = torch.randint(0, len(x), (min(CHUNK, reps - start), len(x)), generator=g)
        out.append(_draw_means(x, draws) if sum_by == "draws" else _count_means(x, draws, keep))
    return torch.cat(out)


def percentile_interval(means: torch.Tensor, level: float = 0.95) -> tuple[float, float]:
    """The ``level`` percentile interval of resample ``means`` (NaN ones left out); ``(nan, nan)``
    when none is a number."""
    means = means[~torch.isnan(means)]
    if means.numel() == 0:
        return float("nan"), float("nan")
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(means, q).tolist()
    return lo, hi


def bootstrap_interval(
    values, reps: int = 2000, level: float = 0.95, seed: int = 0, sum_by: str = "draws"
) -> tuple[float, float]:
    """Percentile bootstrap interval over problems of the mean of per-problem ``values`` ``[P]``
    (NaN: a problem that counts for nothing); ``(nan, nan)`` without a value that is a number.
    For a paired difference, pass the per-problem differences. ``sum_by``: :func:`resample_means`."""
    x = torch.as_tensor(values, dtype=torch.float64).detach().flatten()
    if x.numel() == 0 or bool(torch.isnan(x).all()):
        return float("nan"), float("nan")
    return percentile_interval(resample_means(x, reps, seed, sum_by), level)
