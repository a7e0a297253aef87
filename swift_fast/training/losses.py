"""The training losses on a head's score ``R`` (SWIFT paper appendix E.1; DESIGN 2).

With ``y`` the correctness label and ``R`` the head's score of a candidate:

==========  ===================================================================================
``bce``     mean over candidates of ``BCEWithLogits(R, y)`` (the paper's default)
``hinge``   mean over candidates of ``max(0, 1 - s R)``, ``s = +1`` correct, ``-1`` incorrect
``dpo``     mean over all (correct, incorrect) pairs of one problem of ``-log sigmoid(R+ - R-)``;
            problems without both kinds add no pair
``infonca`` per problem ``-sum_i p_i log softmax(R)_i`` with ``p = softmax(y / alpha)``; mean
            over problems
``nca``     per problem ``-sum_i p_i log sigmoid(R_i) - mean_i log sigmoid(-R_i)``, same ``p``;
            mean over problems
==========  ===================================================================================

``alpha`` is 0.01 by default, so ``p`` is uniform over a problem's correct candidates (uniform
over all of them when none is correct). The pointwise losses (bce, hinge) see candidates alone;
the problem-wise ones (:data:`GROUP_LOSSES`) compare the candidates of one problem, so they need
each candidate's problem id. Every loss is differentiable in ``R`` and computed in ``R``'s dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOSSES = ("bce", "hinge", "dpo", "infonca", "nca")
#: the losses that compare the candidates of one problem (they need problem ids)
GROUP_LOSSES = ("dpo", "infonca", "nca")
#: temperature of the InfoNCA and NCA targets ``softmax(y / alpha)`` (paper E.1)
DEFAULT_ALPHA = 0.01


def problem_indices(groups) -> list[torch.Tensor]:
    """The candidates of each problem: one int64 index tensor per distinct id of ``groups`` ``[N]``,
    problems in sorted order of their ids, candidates in index order."""
    g = torch.as_tensor(groups)
    return [torch.nonzero(g == u).flatten() for u in torch.unique(g, sorted=True)]


def _labels(labels: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return labels.to(device=like.device, dtype=like.dtype)


def bce_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy with logits on ``R``, mean over candidates."""
    return F.binary_cross_entropy_with_logits(scores, _labels(labels, scores))


def hinge_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``mean max(0, 1 - s R)`` with ``s`` in {-1, +1}."""
    s = 2 * _labels(labels, scores) - 1
    return torch.clamp(1 - s * scores, min=0).mean()


def dpo_loss(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``-log sigmoid(R+ - R-)``, mean over every (correct, incorrect) pair within a problem."""
    y = torch.as_tensor(labels).bool()
    diffs = []
    for idx in problem_indices(groups):
        pos, neg = idx[y[idx]], idx[~y[idx]]
        if len(pos) and len(neg):
            diffs.append((scores[pos][:, None] - scores[neg][None, :]).flatten())
    if not diffs:
        return scores.sum() * 0.0  # no pair: a zero that still carries a graph
    return -F.logsigmoid(torch.cat(diffs)).mean()


def _target(labels_g: torch.Tensor, alpha: float, like: torch.Tensor) -> torch.Tensor:
    return torch.softmax(_labels(labels_g, like) / alpha, dim=0)


def _mean_over_problems(scores, labels, groups, alpha: float, term) -> torch.Tensor:
    """Mean over problems of ``term(R, p)``: a problem's scores and its target ``softmax(y / alpha)``."""
    y = torch.as_tensor(labels)
    return torch.stack([term(scores[idx], _target(y[idx], alpha, scores)) for idx in problem_indices(groups)]).mean()


def infonca_loss(
    scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, alpha: float = DEFAULT_ALPHA
) -> torch.Tensor:
    """InfoNCA: cross-entropy between ``softmax(y / alpha)`` and ``softmax(R)`` within each problem."""
    return _mean_over_problems(scores, labels, groups, alpha, lambda r, p: -(p * torch.log_softmax(r, dim=0)).sum())


def nca_loss(
    scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, alpha: float = DEFAULT_ALPHA
) -> torch.Tensor:
    """NCA: ``-sum p log sigmoid(R) - mean log sigmoid(-R)`` within each problem."""
    return _mean_over_problems(scores, labels, groups, alpha,
                               lambda r, p: -(p * F.logsigmoid(r)).sum() - F.logsigmoid(-r).mean())


def check_loss(name: str) -> None:
    """A ``ValueError`` naming the losses when ``name`` is not one of them."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {', '.join(LOSSES)}")


def compute_loss(
    name: str,
    scores: torch.Tensor,
    labels: torch.Tensor,
    groups: torch.Tensor | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> torch.Tensor:
    """The loss ``name`` (one of ``LOSSES``) of scores ``[B]`` with labels ``[B]`` (0/1) and
    problem ids ``[B]`` (needed by the problem-wise losses)."""
    if name == "bce":
        return bce_loss(scores, labels)
    if name == "hinge":
        return hinge_loss(scores, labels)
    check_loss(name)
    if groups is None:
        raise ValueError(f"the {name} loss compares the candidates of a problem: pass their problem ids")
    if name == "dpo":
        return dpo_loss(scores, labels, groups)
    if name == "infonca":
        return infonca_loss(scores, labels, groups, alpha)
    return nca_loss(scores, labels, groups, alpha)
