"""What a head's scores are worth on labelled candidates: AUC, the within-problem AUC, Best-of-N.

Every function takes flat per-candidate tensors: ``scores`` ``[N]`` (any float dtype; computed in
float64), ``labels`` ``[N]`` (0/1 or bool) and ``groups`` ``[N]`` (a problem id per candidate,
ints; a problem's candidates in generation order).

Two views of a score. The pooled ``auc`` asks whether correct candidates score above incorrect
ones anywhere, which also credits a score for telling easy problems from hard ones. Best-of-N
only ever compares the candidates of one problem, so the figure that predicts it is the
``within_problem_auc``: the AUC among each problem's candidates, averaged over the problems that
have both kinds. The Best-of-N pick, pass@N (oracle) and the random pick are the rules of
``swift_fast.selection.bon`` (ties to the lowest index, NaN never wins), applied to the flat data
laid out by problem (``bon.by_problem``).
"""

from __future__ import annotations

import math

import torch

from ..selection import bon
from .losses import problem_indices


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (ties count one half); NaN without both classes."""
    s = torch.as_tensor(scores, dtype=torch.float64).flatten()
    y = torch.as_tensor(labels).bool().flatten()
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = torch.argsort(s)
    ss = s[order]
    ranks = torch.empty_like(s)
    # average rank within ties
    uniq, inverse, counts = torch.unique_consecutive(ss, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    avg = ends - (counts.double() - 1) / 2
    ranks[order] = avg[inverse]
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def problem_aucs(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """The AUC among each problem's candidates, float64 ``[P]`` (problems in sorted order of
    ``groups``), NaN for a problem without both a correct and an incorrect candidate."""
    s = torch.as_tensor(scores).detach().double()
    y = torch.as_tensor(labels).bool()
    return torch.tensor([auc(s[idx], y[idx]) for idx in problem_indices(groups)], dtype=torch.float64)


def within_problem_auc(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> float:
    """Mean over the problems (``groups``) that have both a correct and an incorrect candidate of
    the AUC among that problem's candidates: how well a score ranks candidates of the same
    problem, which is all Best-of-N uses, blind to how hard each problem is. NaN when no
    problem has both."""
    vals = [a for a in problem_aucs(scores, labels, groups).tolist() if not math.isnan(a)]
    # NOTE: a Python sum, left to right: the order this figure was always summed in
    return sum(vals) / len(vals) if vals else float("nan")


def bon_outcomes(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Per problem (in sorted order of ``groups``), float64 ``[P]``: 1.0 when the candidate with the
    highest score is correct (``bon.bon_select``: ties go to the lowest index, NaN scores never win;
    a problem whose scores are all NaN picks its first candidate)."""
    (s, y), padding = bon.by_problem(groups, torch.as_tensor(scores).detach().double(), torch.as_tensor(labels).bool())
    if s.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float64)
    picked = bon.bon_select(s, s.shape[1], pruned=padding)
    return y.gather(1, picked[:, None]).squeeze(1).double()


def oracle_and_random(labels: torch.Tensor, groups: torch.Tensor) -> tuple[float, float]:
    """Over problems: pass@N (``bon.oracle``) and the expected correctness of a random pick
    (``bon.random_pick``, a problem's mean correctness); 0.0 each without a problem."""
    (y,), padding = bon.by_problem(groups, torch.as_tensor(labels).bool())
    if y.shape[0] == 0:
        return 0.0, 0.0
    oracle, rand = bon.oracle(y, pruned=padding).tolist(), bon.random_pick(y, pruned=padding).tolist()
    # NOTE: Python sums, left to right: the order these figures were always summed in
    return sum(oracle) / len(oracle), sum(rand) / len(rand)


def _ratio(num: int, den: int) -> float:
    return num / den if den else float("nan")


def selection_metrics(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> dict:
    """Per candidate, with ``R > 0`` predicting "correct": ``balanced_accuracy`` (mean of the true
    positive and true negative rates), ``precision`` and ``recall`` of "correct", ``accuracy``
    beside ``majority_class_share`` (the accuracy of always predicting the commoner label, which
    plain accuracy must beat to mean anything); ``auc``. Per problem: Best-of-N accuracy (highest
    score, ties to the lowest index), pass@N (oracle) and the mean correctness (what a random pick
    gets). A figure without the candidates it needs (a class absent, no positive prediction) is NaN."""
    s = torch.as_tensor(scores).detach().double()
    y = torch.as_tensor(labels).bool()
    picks = bon_outcomes(s, y, groups)
    oracle, rand = oracle_and_random(y, groups)
    pred = s > 0
    tp, fp = int((pred & y).sum()), int((pred & ~y).sum())
    fn, tn = int((~pred & y).sum()), int((~pred & ~y).sum())
    n_pos, n_neg = tp + fn, fp + tn
    return {
        "balanced_accuracy": (_ratio(tp, n_pos) + _ratio(tn, n_neg)) / 2,
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, n_pos),
        "accuracy": _ratio(tp + tn, len(s)),
        "majority_class_share": _ratio(max(n_pos, n_neg), len(s)),
        "auc": auc(s, y),
        "within_problem_auc": within_problem_auc(s, y, groups),
        "bon": float(picks.mean()) if len(picks) else 0.0,
        "oracle": oracle,
        "random": rand,
        "problems": len(picks),
        "candidates": int(len(s)),
    }
