"""Training a SWIFT head: losses, the split by problem, the loop with early stopping.

Model-independent: features come from a ``FeatureSource`` (the Hugging Face one lives in
``swift_fast.hf.train``), and the loss is on the score ``R`` exactly as DESIGN 2 defines it
(``swift_reduce_reference``: per-layer projection, sigmoid gate, gated average).

Defaults are the SWIFT paper's (appendix D.3): AdamW lr 1e-4, weight decay 1e-5, batches of
16 sequences, binary cross-entropy with logits on ``R``, 80/20 train/validation split by
problem, early stopping with patience 3 on the validation loss keeping the best epoch's weights.

Losses (paper appendix E.1), with ``y`` the correctness label and ``R`` the head's score:

==========  ===================================================================================
``bce``     mean over candidates of ``BCEWithLogits(R, y)``
``hinge``   mean over candidates of ``max(0, 1 - s R)``, ``s = +1`` correct, ``-1`` incorrect
``dpo``     mean over all (correct, incorrect) pairs of one problem of ``-log sigmoid(R+ - R-)``;
            problems without both kinds add no pair
``infonca`` per problem ``-sum_i p_i log softmax(R)_i`` with ``p = softmax(y / alpha)``; mean
            over problems
``nca``     per problem ``-sum_i p_i log sigmoid(R_i) - mean_i log sigmoid(-R_i)``, same ``p``;
            mean over problems
==========  ===================================================================================

``alpha`` is 0.01 by default, so ``p`` is uniform over a problem's correct candidates (uniform
over all of them when none is correct). Pointwise losses batch shuffled candidates; the
problem-wise ones batch whole problems, up to ``batch_size`` candidates (one problem at least).

Before the first epoch ``check_label_balance`` refuses splits whose labels cannot teach the loss
(``LabelBalanceError``): every entry point (``train_head``, ``swift_fast.hf.train_from_rollouts``,
``swift-fast train``, ``swift-fast demo build``) goes through it. Data that can teach, but little
(under 10% correct or over 90%, or fewer than 10 of a kind), gets a ``LabelShareWarning`` with its
counts (``label_share_warning``).

After training, ``free_baselines`` sets the head beside what needs no training, on the same
validation candidates: the response length (in the direction the validation data favours) and
the model's mean log-prob of the response, with a paired bootstrap over problems of the
within-problem AUC difference between the head and the better of the two (the AUC among one
problem's candidates, what Best-of-N uses; the pooled AUC is reported beside it).
"""

from __future__ import annotations

import copy
import math
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch
import torch.nn.functional as F

from ..kernels.swift_reduce import swift_reduce_reference
from ..rewards.head import HeadError, SwiftHead
from ..support.progress import phase

LOSSES = ("bce", "hinge", "dpo", "infonca", "nca")
#: what picks the kept epoch (``train_head(select=...)``)
SELECT = ("auto", "pairs", "loss")
GROUP_LOSSES = ("dpo", "infonca", "nca")
DEFAULT_ALPHA = 0.01


# -- losses ----------------------------------------------------------------------------------
def _labels(labels: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return labels.to(device=like.device, dtype=like.dtype)


def bce_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy with logits on ``R``, mean over candidates."""
    return F.binary_cross_entropy_with_logits(scores, _labels(labels, scores))


def hinge_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``mean max(0, 1 - s R)`` with ``s`` in {-1, +1}."""
    s = 2 * _labels(labels, scores) - 1
    return torch.clamp(1 - s * scores, min=0).mean()


def _group_ids(groups: torch.Tensor) -> list[torch.Tensor]:
    g = torch.as_tensor(groups)
    return [torch.nonzero(g == u).flatten() for u in torch.unique(g, sorted=True)]


def dpo_loss(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``-log sigmoid(R+ - R-)``, mean over every (correct, incorrect) pair within a problem."""
    y = torch.as_tensor(labels).bool()
    diffs = []
    for idx in _group_ids(groups):
        pos, neg = idx[y[idx]], idx[~y[idx]]
        if len(pos) and len(neg):
            diffs.append((scores[pos][:, None] - scores[neg][None, :]).flatten())
    if not diffs:
        return scores.sum() * 0.0  # no pair: a zero that still carries a graph
    return -F.logsigmoid(torch.cat(diffs)).mean()


def _target(labels_g: torch.Tensor, alpha: float, like: torch.Tensor) -> torch.Tensor:
    return torch.softmax(_labels(labels_g, like) / alpha, dim=0)


def infonca_loss(
    scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, alpha: float = DEFAULT_ALPHA
) -> torch.Tensor:
    """InfoNCA: cross-entropy between ``softmax(y / alpha)`` and ``softmax(R)`` within each problem."""
    y = torch.as_tensor(labels)
    terms = []
    for idx in _group_ids(groups):
        p = _target(y[idx], alpha, scores)
        terms.append(-(p * torch.log_softmax(scores[idx], dim=0)).sum())
    return torch.stack(terms).mean()


def nca_loss(
    scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, alpha: float = DEFAULT_ALPHA
) -> torch.Tensor:
    """NCA: ``-sum p log sigmoid(R) - mean log sigmoid(-R)`` within each problem."""
    y = torch.as_tensor(labels)
    terms = []
    for idx in _group_ids(groups):
        r = scores[idx]
        p = _target(y[idx], alpha, scores)
        terms.append(-(p * F.logsigmoid(r)).sum() - F.logsigmoid(-r).mean())
    return torch.stack(terms).mean()


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
    if name not in GROUP_LOSSES:
        raise ValueError(f"unknown loss {name!r}; expected one of {', '.join(LOSSES)}")
    if groups is None:
        raise ValueError(f"the {name} loss compares the candidates of a problem: pass their problem ids")
    if name == "dpo":
        return dpo_loss(scores, labels, groups)
    if name == "infonca":
        return infonca_loss(scores, labels, groups, alpha)
    return nca_loss(scores, labels, groups, alpha)


# -- split -----------------------------------------------------------------------------------
def split_by_problem(
    problem_ids: Sequence[str], val_fraction: float = 0.2, seed: int = 0
) -> tuple[list[str], list[str]]:
    """``(train_ids, val_ids)``: a seeded shuffle of the distinct problem ids, ``val_fraction``
    of them (at least one) held out. The candidates of one problem never straddle the split."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    uniq = list(dict.fromkeys(str(p) for p in problem_ids))
    if len(uniq) < 2:
        raise ValueError(f"the split by problem needs at least 2 problems, got {len(uniq)}")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(uniq), generator=g).tolist()
    n_val = min(len(uniq) - 1, max(1, round(val_fraction * len(uniq))))
    val = [uniq[i] for i in sorted(order[:n_val])]
    train = [uniq[i] for i in sorted(order[n_val:])]
    return train, val


# -- metrics ---------------------------------------------------------------------------------
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


def within_problem_auc(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> float:
    """Mean over the problems (``groups``) that have both a correct and an incorrect candidate of
    the AUC among that problem's candidates: how well a score ranks candidates of the same
    problem, which is all Best-of-N uses, blind to how hard each problem is. NaN when no
    problem has both."""
    s = torch.as_tensor(scores).detach().double()
    y = torch.as_tensor(labels).bool()
    vals = [a for a in (auc(s[idx], y[idx]) for idx in _group_ids(groups)) if not math.isnan(a)]
    return sum(vals) / len(vals) if vals else float("nan")


def bon_outcomes(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Per problem (in sorted order of ``groups``), float64 ``[P]``: 1.0 when the candidate with the
    highest score is correct. Ties go to the lowest index, NaN scores never win."""
    s = torch.as_tensor(scores).detach().double()
    y = torch.as_tensor(labels).bool()
    out = []
    for idx in _group_ids(groups):
        best = int(torch.argmax(torch.nan_to_num(s[idx], nan=-math.inf)))  # first of the maxima
        out.append(float(y[idx][best]))
    return torch.tensor(out, dtype=torch.float64)


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
    oracle, mean = [], []
    for idx in _group_ids(groups):
        oracle.append(float(y[idx].any()))
        mean.append(float(y[idx].double().mean()))
    bon = bon_outcomes(s, y, groups)
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
        "bon": float(bon.mean()) if len(bon) else 0.0,
        "oracle": sum(oracle) / max(1, len(oracle)),
        "random": sum(mean) / max(1, len(mean)),
        "problems": len(bon),
        "candidates": int(len(s)),
    }


# -- data ------------------------------------------------------------------------------------
class FeatureSource(Protocol):
    """Gives a head's input for sequences named by keys.

    Optional attributes read for the progress output: ``recomputes`` (True when every call
    computes its features afresh, so every epoch costs as much as the first) and
    ``progress_note`` (a sentence shown once above the progress bar, or None). Optional method
    ``mean_logprobs(keys)``: float64 ``[len(keys)]``, the model's mean log-prob of each response
    (NaN where unknown), the baseline ``free_baselines`` sets beside the head.
    """

    def features(self, keys: Sequence[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """``(states, cu_seqlens)``: ``k`` tensors ``[N, d]`` (the head's layers, in order,
        aligned: row t scores token t) packed over the sequences ``keys``, and int ``[B+1]``."""
        ...


@dataclass
class Example:
    """One candidate: ``key`` for the feature source, its problem, its label."""

    key: int
    problem: str
    label: bool


@dataclass
class TrainResult:
    best_epoch: int
    epochs_run: int
    stopped_early: bool
    history: list[dict] = field(default_factory=list)
    val_metrics: dict = field(default_factory=dict)
    train_metrics: dict = field(default_factory=dict)
    #: ``check_label_balance`` of the splits: ``{"train": counts, "val": counts}``
    labels: dict = field(default_factory=dict)
    #: ``free_baselines`` of the best epoch's validation scores: the head beside length and log-prob
    baselines: dict = field(default_factory=dict)
    #: what picked the kept epoch ("loss" or "pairs"; ``select="auto"`` resolved)
    select: str = "loss"
    #: the probe's fit (``swift_fast.training.probe.train_probe``): strengths, the chosen one, refit; empty
    #: for the epoch loop
    fit: dict = field(default_factory=dict)


# -- label balance ---------------------------------------------------------------------------
class LabelBalanceError(ValueError):
    """A split whose labels cannot teach (training) or measure (validation) the chosen loss.

    ``balance`` holds the counts of ``label_balance`` per split (``"train"``, ``"val"``)."""

    def __init__(self, message: str, balance: dict):
        super().__init__(message)
        self.balance = balance


def label_balance(examples: Sequence[Example]) -> dict:
    """Counts of a set of candidates: ``problems``, ``candidates``, ``correct``, ``incorrect``,
    ``problems_with_both`` (a correct and an incorrect candidate), ``problems_all_correct``,
    ``problems_all_incorrect``."""
    per: dict[str, list[int]] = {}
    for e in examples:
        per.setdefault(e.problem, [0, 0])[0 if e.label else 1] += 1
    return {
        "problems": len(per),
        "candidates": len(examples),
        "correct": sum(c for c, _ in per.values()),
        "incorrect": sum(i for _, i in per.values()),
        "problems_with_both": sum(1 for c, i in per.values() if c and i),
        "problems_all_correct": sum(1 for c, i in per.values() if c and not i),
        "problems_all_incorrect": sum(1 for c, i in per.values() if i and not c),
    }


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def describe_balance(b: dict) -> str:
    """One line of ``label_balance`` counts, for people."""
    return (
        f"{_count(b['problems'], 'problem')}, {_count(b['candidates'], 'candidate')} ({b['correct']} correct, "
        f"{b['incorrect']} incorrect); {_count(b['problems_with_both'], 'problem')} with both, "
        f"{b['problems_all_correct']} all correct, {b['problems_all_incorrect']} all incorrect"
    )


_SPLIT_NAMES = {"train": "training", "val": "validation"}


def _split_problem(b: dict, loss: str) -> str | None:
    """Why a split with counts ``b`` cannot serve ``loss``; None when it can."""
    if loss in GROUP_LOSSES:
        if b["problems_with_both"]:
            return None
        return "no problem with both a correct and an incorrect candidate"
    if b["correct"] and b["incorrect"]:
        return None
    if not b["candidates"]:
        return "no candidate"
    return "no incorrect candidate" if b["correct"] else "no correct candidate"


def _consequence(split: str, loss: str) -> str:
    if split == "val":
        # a validation loss that cannot see correctness makes early stopping pick an arbitrary epoch
        return (
            "so its loss cannot tell a head that separates correct from incorrect candidates from one that "
            "does not, and early stopping would pick the epoch blindly"
        )
    if loss == "dpo":
        return "and dpo learns only from (correct, incorrect) pairs within a problem: it has no pair at all"
    if loss in GROUP_LOSSES:
        return (
            f"and {loss} compares the candidates within a problem: with one kind per problem its target is "
            "uniform and it learns nothing about correctness"
        )
    return "so the loss falls towards 0 by predicting one label everywhere and the head learns nothing"


def _fixes(whole: dict, loss: str) -> str:
    if not whole["correct"]:
        return (
            "every candidate is incorrect: the model never solves these problems. Collect rollouts on "
            "problems it solves some of the time (an easier dataset, or a stronger model), sample more "
            "candidates per problem, and check the grading (answer extraction, references)."
        )
    if not whole["incorrect"]:
        return (
            "every candidate is correct: collect rollouts on harder problems, or sample more candidates "
            "per problem at a higher temperature."
        )
    if loss in GROUP_LOSSES and not whole["problems_with_both"]:
        return (
            "no problem has both kinds: sample more candidates per problem (or at a higher temperature) so "
            "that some do, or train with a pointwise loss (bce, hinge), which learns from problems of one kind."
        )
    kinds = "problems with both kinds" if loss in GROUP_LOSSES else "correct and incorrect candidates"
    return (
        f"the data as a whole has {kinds}, but this split does not: change the split (its seed or validation "
        "fraction: --seed, --val-fraction on the command line) or add problems"
        + (", or train with a pointwise loss (bce, hinge)." if loss in GROUP_LOSSES else ".")
    )


def check_label_balance(train: Sequence[Example], val: Sequence[Example], loss: str = "bce") -> dict:
    """The label balance of both splits, ``{"train": label_balance(train), "val": label_balance(val)}``,
    or ``LabelBalanceError`` when a split cannot serve ``loss``.

    Pointwise losses (bce, hinge) need both classes in each split. The problem-wise ones (dpo,
    infonca, nca) need, in each split, a problem with both a correct and an incorrect candidate:
    without one, dpo has no pair and infonca/nca have a uniform target. Rollouts where every
    candidate is wrong would otherwise train to a loss near 0 and write a head that learned nothing.

    The validation split is held to the same rule, and refused rather than warned about: its loss
    chooses the epoch whose weights are kept, and a loss blind to correctness makes that choice
    arbitrary while the run still looks successful.
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; expected one of {', '.join(LOSSES)}")
    balance = {"train": label_balance(train), "val": label_balance(val)}
    for split in ("train", "val"):
        why = _split_problem(balance[split], loss)
        if why is None:
            continue
        whole = label_balance(list(train) + list(val))
        raise LabelBalanceError(
            f"cannot train a head with the {loss} loss: the {_SPLIT_NAMES[split]} split has {why}, "
            f"{_consequence(split, loss)}.\n"
            f"  all data:         {describe_balance(whole)}\n"
            f"  training split:   {describe_balance(balance['train'])}\n"
            f"  validation split: {describe_balance(balance['val'])}\n"
            f"To fix: {_fixes(whole, loss)}",
            balance,
        )
    return balance


# -- little data -----------------------------------------------------------------------------
class LabelShareWarning(UserWarning):
    """Data that can teach a head, but little: few correct (or few incorrect) candidates."""


#: below this share of correct candidates (or above one minus it) the data teaches little
LOW_SHARE = 0.10
#: fewer candidates than this of one kind teach little, whatever their share
MIN_OF_A_KIND = 10


def whole_balance(balance: dict) -> dict:
    """The counts of all data from ``check_label_balance``'s ``{"train": ..., "val": ...}`` (no
    problem straddles the split, so every count adds up)."""
    return {k: balance["train"][k] + balance["val"][k] for k in balance["train"]}


def label_share_warning(b: dict) -> str | None:
    """A sentence with the counts when the data ``b`` (``label_balance`` counts) has under 10% (or
    over 90%) correct candidates, or fewer than 10 of a kind; None when it has enough of both."""
    n, pos, neg = b["candidates"], b["correct"], b["incorrect"]
    if not n:
        return None
    share = pos / n
    with_pos = b["problems_with_both"] + b["problems_all_correct"]
    with_neg = b["problems_with_both"] + b["problems_all_incorrect"]
    problems = b["problems"]
    counts = f"{pos} of {n} candidates are correct ({100 * share:.1f}%)"
    if share < LOW_SHARE:
        return (
            f"{counts}, in {with_pos} of {problems} problems: the head has little to learn from; collect at a "
            "lower temperature, with easier problems or more candidates"
        )
    if share > 1 - LOW_SHARE:
        return (
            f"{counts}; {neg} incorrect, in {with_neg} of {problems} problems: the head has little to learn "
            "from; collect at a higher temperature, with harder problems or more candidates"
        )
    if min(pos, neg) < MIN_OF_A_KIND:
        return (
            f"{counts}, in {with_pos} of {problems} problems; {neg} incorrect, in {with_neg}: too few of a kind, "
            "the head has little to learn from; collect more problems or more candidates"
        )
    return None


# -- what needs no training ------------------------------------------------------------------
#: fewer validation problems than this make a bootstrap over problems a rough guide only
FEW_PROBLEMS = 10


def _paired_within_auc_difference(
    a: torch.Tensor, b: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, reps: int, seed: int, level: float
) -> tuple[float, float]:
    """Percentile interval of ``within_problem_auc(a) - within_problem_auc(b)`` over ``reps``
    resamples of the problems (with replacement; a problem drawn twice counts twice, a problem
    without both kinds of candidate counts for nothing, as in ``within_problem_auc``)."""
    a = torch.as_tensor(a).detach().double()
    b = torch.as_tensor(b).detach().double()
    y = torch.as_tensor(labels).bool()
    ids = _group_ids(groups)
    d = torch.tensor([auc(a[i], y[i]) - auc(b[i], y[i]) for i in ids], dtype=torch.float64)
    both = ~torch.isnan(d)
    if not both.any():
        return float("nan"), float("nan")
    g = torch.Generator().manual_seed(seed)
    diffs = []
    for start in range(0, reps, 256):  # bounds the [reps, problems] counts in memory
        m = min(256, reps - start)
        draws = torch.randint(0, len(ids), (m, len(ids)), generator=g)
        counts = torch.zeros(m, len(ids), dtype=torch.float64).scatter_add_(
            1, draws, torch.ones(m, len(ids), dtype=torch.float64)
        )[:, both]
        n = counts.sum(1)
        diffs.append(torch.where(n > 0, counts @ d[both] / n.clamp(min=1), torch.full_like(n, float("nan"))))
    dd = torch.cat(diffs)
    dd = dd[~torch.isnan(dd)]  # a resample without a problem of both kinds has no within-problem AUC
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(dd, q).tolist()
    return lo, hi


def free_baselines(
    scores: torch.Tensor,
    labels: torch.Tensor,
    groups: torch.Tensor,
    lengths: torch.Tensor,
    mean_logprobs: torch.Tensor | None = None,
    reps: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """The head's scores ``[N]`` beside selectors that need no training, on the same candidates.

    Args:
        scores: the head's ``R`` per candidate.
        labels: 0/1 correctness ``[N]``; ``groups``: problem id per candidate ``[N]`` (ints), the
            candidates of a problem in generation order.
        lengths: response token counts ``[N]``.
        mean_logprobs: mean ``log P(r_j | prefix)`` of each response under the model, or None.
    Returns:
        JSON-ready: ``head``, ``length`` (with its ``direction``, ``shorter`` or ``longer``),
        ``mean_logprob`` (None without log-probs) each with ``auc``, ``within_auc``
        (``within_problem_auc``) and ``bon`` (Best-of-N over all
        candidates of a problem, ties to the lowest index); ``random`` (mean correctness per
        problem) and ``oracle`` (pass@N) with ``bon``; ``verdict``: the head against the free
        baseline with the higher within-problem AUC, the within-problem AUC difference
        (``head_auc`` and ``baseline_auc`` are within-problem AUCs) and its ``level`` interval
        from a paired bootstrap over problems (``reps`` resamples, seeded), ``outcome`` (``beats``, ``barely
        beats``, ``does not beat``) and one sentence, ``text``.
    """
    s = torch.as_tensor(scores).detach().double().flatten()
    y = torch.as_tensor(labels).bool().flatten()
    gr = torch.as_tensor(groups).flatten()
    length = torch.as_tensor(lengths).double().flatten()
    if not (len(s) == len(y) == len(gr) == len(length)):
        raise ValueError(
            f"scores, labels, groups and lengths must have one entry per candidate, got "
            f"{len(s)}, {len(y)}, {len(gr)}, {len(length)}"
        )
    sizes = [len(i) for i in _group_ids(gr)]
    out: dict = {"problems": len(sizes), "candidates": len(s), "n": sizes[0] if len(set(sizes)) == 1 else None}
    out["head"] = {"auc": auc(s, y), "within_auc": within_problem_auc(s, y, gr),
                   "bon": float(bon_outcomes(s, y, gr).mean())}
    # NOTE: the direction is chosen on the very candidates it is measured on, which flatters the
    # length baseline: the conservative side when the question is whether the head beat it
    longer = auc(length, y)
    shorter = auc(-length, y)
    direction, signed = ("shorter", -length) if shorter > longer else ("longer", length)
    out["length"] = {
        "direction": direction,
        "auc": max(shorter, longer),
        "within_auc": within_problem_auc(signed, y, gr),
        "bon": float(bon_outcomes(signed, y, gr).mean()),
    }
    free = {"length": signed}
    if mean_logprobs is not None:
        lp = torch.as_tensor(mean_logprobs).double().flatten()
        if len(lp) != len(s):
            raise ValueError(f"mean_logprobs has {len(lp)} entries for {len(s)} candidates")
        if torch.isnan(lp).any():
            out["mean_logprob"] = None  # a missing log-prob is no evidence either way
        else:
            out["mean_logprob"] = {"auc": auc(lp, y), "within_auc": within_problem_auc(lp, y, gr),
                                   "bon": float(bon_outcomes(lp, y, gr).mean())}
            free["mean_logprob"] = lp
    else:
        out["mean_logprob"] = None
    per_problem = [(float(y[i].any()), float(y[i].double().mean())) for i in _group_ids(gr)]
    out["oracle"] = {"bon": sum(o for o, _ in per_problem) / max(1, len(per_problem))}
    out["random"] = {"bon": sum(m for _, m in per_problem) / max(1, len(per_problem))}
    # NOTE: judged on the within-problem AUC, what Best-of-N uses: the pooled AUC also credits a
    # score for telling easy problems from hard ones, which picks no better candidate
    # the stronger free baseline; on equal AUCs length (cheaper still) stands
    against = max(free, key=lambda k: (out[k]["within_auc"] if not math.isnan(out[k]["within_auc"]) else -1.0,
                                       k == "length"))
    head_auc, base_auc = out["head"]["within_auc"], out[against]["within_auc"]
    lo, hi = _paired_within_auc_difference(s, free[against], y, gr, reps, seed, level)
    diff = head_auc - base_auc
    if math.isnan(diff) or math.isnan(lo):
        outcome = None
    elif lo > 0:
        outcome = "beats"
    elif diff > 0:
        outcome = "barely beats"
    else:
        outcome = "does not beat"
    out["verdict"] = {
        "against": against,
        "head_auc": head_auc,
        "baseline_auc": base_auc,
        "difference": diff,
        "interval": [lo, hi],
        "level": level,
        "reps": reps,
        "seed": seed,
        "outcome": outcome,
        "text": _verdict_text(outcome, baseline_name(out, against), head_auc, base_auc, diff, lo, hi, level,
                              out["problems"]),
    }
    return out


def baseline_name(b: dict, key: str) -> str:
    """How a row of ``free_baselines`` is named for people."""
    if key == "length":
        return f"length ({b['length']['direction']} better)"
    return {"mean_logprob": "mean log-prob"}.get(key, key)


def _verdict_text(outcome, name, head_auc, base_auc, diff, lo, hi, level, problems) -> str:
    pct = f"{100 * level:.0f}%"
    if outcome is None:
        return (
            f"no verdict against {name}: no validation problem has both a correct and an incorrect candidate "
            f"(head within-problem AUC {head_auc}, {name} {base_auc})"
        )
    figures = (
        f"within-problem AUC {head_auc:.3f} vs {base_auc:.3f}, difference {diff:+.3f} "
        f"({pct} interval {lo:+.3f} to {hi:+.3f}, "
        f"paired bootstrap over {_count(problems, 'validation problem')})"
    )
    text = f"the head {outcome} {name}: {figures}"
    if outcome == "barely beats":
        text += f"; the interval includes 0: on this data the head is not shown to do better than {name}"
    elif outcome == "does not beat" and hi < 0:
        text += f"; {name} does better"
    if problems < FEW_PROBLEMS:
        text += f"; with {_count(problems, 'validation problem')} the interval is rough: validate on more"
    return text


def format_baselines(b: dict) -> str:
    """``free_baselines`` as an aligned table (AUC, BoN@N) followed by the verdict sentence."""
    n = f"BoN@{b['n']}" if b.get("n") else "BoN@all"
    rows = [("head", b["head"]), (baseline_name(b, "length"), b["length"])]
    if b.get("mean_logprob"):
        rows.append(("mean log-prob", b["mean_logprob"]))
    rows += [("random", b["random"]), ("oracle", b["oracle"])]
    width = max(len(name) for name, _ in rows) + 2

    def cell(v):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

    lines = [
        f"validation: {_count(b['problems'], 'problem')}, {_count(b['candidates'], 'candidate')}",
        "".ljust(width) + "AUC".rjust(7) + "AUC(within)".rjust(13) + n.rjust(max(9, len(n) + 2)),
    ]
    for name, r in rows:
        lines.append(name.ljust(width) + cell(r.get("auc")).rjust(7) + cell(r.get("within_auc")).rjust(13)
                     + cell(r.get("bon")).rjust(max(9, len(n) + 2)))
    lines.append("AUC(within): the AUC among each problem's candidates, averaged over problems with both kinds "
                 "(what Best-of-N uses; the pooled AUC also credits telling easy problems from hard ones)")
    if not b.get("mean_logprob"):
        lines.append("(no mean log-prob: not known for every validation candidate)")
    lines.append(b["verdict"]["text"])
    return "\n".join(lines)


# -- the loop --------------------------------------------------------------------------------
def head_scores(head: SwiftHead, states: Sequence[torch.Tensor], cu: torch.Tensor) -> torch.Tensor:
    """``R`` per sequence, differentiable in the head's parameters (DESIGN 2 reference math,
    with the head's state norm when it has one: evaluating such a head is scoring, not training)."""
    dev = head.weight.device
    states = [s.to(dev) for s in states]
    return swift_reduce_reference(states, head.weight, head.bias, cu.to(dev), head.norm_eps)[0]


def _batches(examples: list[Example], loss: str, batch_size: int, g: torch.Generator) -> list[list[int]]:
    if loss not in GROUP_LOSSES:
        order = torch.randperm(len(examples), generator=g).tolist()
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    by_problem: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        by_problem.setdefault(e.problem, []).append(i)
    problems = list(by_problem)
    batches, cur = [], []
    for pi in torch.randperm(len(problems), generator=g).tolist():
        members = by_problem[problems[pi]]
        if cur and len(cur) + len(members) > batch_size:
            batches.append(cur)
            cur = []
        cur = cur + members
    if cur:
        batches.append(cur)
    return batches


def _tensors(examples: list[Example], idx: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    problems = {}
    labels = torch.tensor([float(examples[i].label) for i in idx])
    groups = torch.tensor([problems.setdefault(examples[i].problem, len(problems)) for i in idx])
    return labels, groups


def score_and_count(
    head: SwiftHead, source: FeatureSource, examples: list[Example], batch_size: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(R, tokens)`` of every example (no gradient): float32 and int64 ``[len(examples)]`` on the
    CPU, ``tokens`` the number of scored tokens (the response length)."""
    out, counts = [], []
    with torch.no_grad():
        for a in range(0, len(examples), batch_size):
            states, cu = source.features([e.key for e in examples[a : a + batch_size]])
            out.append(head_scores(head, states, cu).float().cpu())
            counts.append(cu.cpu().long().diff())
    if not out:
        return torch.zeros(0), torch.zeros(0, dtype=torch.long)
    return torch.cat(out), torch.cat(counts)


def score_examples(
    head: SwiftHead, source: FeatureSource, examples: list[Example], batch_size: int = 16
) -> torch.Tensor:
    """``R`` of every example (no gradient), float32 ``[len(examples)]`` on the CPU."""
    return score_and_count(head, source, examples, batch_size)[0]


def _evaluate(head, source, examples, loss, alpha, batch_size) -> tuple[dict, torch.Tensor, torch.Tensor]:
    s, tokens = score_and_count(head, source, examples, batch_size)
    labels, groups = _tensors(examples, range(len(examples)))
    m = selection_metrics(s, labels, groups)
    m["loss"] = float(compute_loss(loss, s.double(), labels.double(), groups, alpha))
    return m, s, tokens


def evaluate(head, source, examples, loss: str = "bce", alpha: float = DEFAULT_ALPHA, batch_size: int = 16) -> dict:
    """Loss (over the whole set: every pair / problem at once) and selection metrics."""
    return _evaluate(head, source, examples, loss, alpha, batch_size)[0]


def baselines_of(source: FeatureSource, examples: list[Example], scores: torch.Tensor, tokens: torch.Tensor,
                 seed: int = 0) -> dict:
    """``free_baselines`` of ``scores`` over ``examples``, with the source's mean log-probs when it has them."""
    labels, groups = _tensors(examples, range(len(examples)))
    lp = None
    if callable(getattr(source, "mean_logprobs", None)):
        lp = torch.as_tensor(source.mean_logprobs([e.key for e in examples]), dtype=torch.float64)
    return free_baselines(scores, labels, groups, tokens, lp, seed=seed)


def train_head(
    head: SwiftHead,
    source: FeatureSource,
    train: list[Example],
    val: list[Example],
    loss: str = "bce",
    lr: float = 1e-4,
    weight_decay: float = 1e-5,
    batch_size: int = 16,
    max_epochs: int = 20,
    patience: int = 3,
    seed: int = 0,
    alpha: float = DEFAULT_ALPHA,
    progress: bool = True,
    init: bool = True,
    on_epoch: Callable[[int, SwiftHead, dict], None] | None = None,
    select: str = "loss",
    standardize: bool = False,
) -> TrainResult:
    """Train ``head`` in place; on return it holds the weights of the best epoch (epochs count
    from 1) by ``select``: ``"loss"``, the lowest validation loss; ``"pairs"``, the highest
    within-problem AUC on validation (``within_problem_auc``: how well the head ranks the
    candidates of one problem, which is what Best-of-N uses), ties to the earlier epoch;
    ``"auto"``, pairs when a validation problem has both a correct and an incorrect candidate,
    else loss (with a ``LabelShareWarning`` saying so). Early stopping counts epochs without
    improvement of the same figure; ``result.select`` is the figure used.

    ``standardize``: train on states centred and scaled per (state, dimension) over the training
    tokens (``swift_fast.training.scaling``; one extra pass over the training features), and fold
    that scaling into the returned head, which reads raw states like any other.

    Seeded: ``seed`` fixes the initial weights (when ``init``) and the batch order, so a run is
    reproducible on the same machine. ``on_epoch(epoch, head, record)`` is called after each
    epoch's validation.

    Raises ``LabelBalanceError`` before the first epoch when a split cannot teach or measure the
    loss (``check_label_balance``); the counts it checked are ``result.labels``. Warns
    (``LabelShareWarning``) when the data has few correct or few incorrect candidates. Raises
    ``HeadError`` for a head with a state norm (``norm_eps``): training does not support those.

    ``result.baselines`` sets the best epoch's validation scores beside length and mean log-prob
    (``free_baselines``, bootstrap seeded with ``seed``).
    """
    if head.norm_eps is not None:
        # NOTE: such a head stores g * w (the norm's gain folded in), so weight decay and the
        # initialisation would act on the folded weight: refused rather than trained differently
        raise HeadError(
            f"train_head does not train heads with a state norm (this head has norm_eps={head.norm_eps}): "
            "train a head with norm_eps=None"
        )
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; expected one of {', '.join(LOSSES)}")
    if select not in SELECT:
        raise ValueError(f"unknown select {select!r}; expected one of {', '.join(SELECT)}")
    if not train:
        raise ValueError("no training examples")
    if not val:
        raise ValueError("no validation examples: early stopping needs a validation set")
    if batch_size < 1 or max_epochs < 1 or patience < 1:
        raise ValueError("batch_size, max_epochs and patience must be >= 1")
    balance = check_label_balance(train, val, loss)
    kinds: dict[str, set] = {}
    for e in val:
        kinds.setdefault(e.problem, set()).add(bool(e.label))
    pairs_possible = any(len(k) == 2 for k in kinds.values())
    if select == "auto":
        select = "pairs" if pairs_possible else "loss"
        if not pairs_possible:
            warnings.warn(
                f"none of the {len(kinds)} validation problems has both a correct and an incorrect candidate, so "
                "the kept epoch follows the validation loss instead of the within-problem AUC",
                LabelShareWarning, stacklevel=2)
    if select == "pairs":
        if not pairs_possible:
            raise ValueError(
                f"select='pairs' keeps the epoch with the best within-problem AUC on validation, but none of the "
                f"{len(kinds)} validation problems has both a correct and an incorrect candidate: select by 'loss' "
                "(--select loss), or use more problems or more candidates per problem"
            )
    little = label_share_warning(whole_balance(balance))
    if little:
        warnings.warn(little, LabelShareWarning, stacklevel=2)
    scale = None
    if standardize:
        from .scaling import ScaledSource, feature_scale

        scale = feature_scale(source, [e.key for e in train])
        source = ScaledSource(source, scale)
    g = torch.Generator().manual_seed(seed)
    if init:
        with torch.no_grad():
            std = 1.0 / math.sqrt(head.weight.shape[1])
            head.weight.copy_(torch.randn(head.weight.shape, generator=g) * std)
            head.bias.zero_()
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    best_loss, best_epoch, best_state, bad = math.inf, 0, None, 0
    best_scores = best_tokens = None
    history: list[dict] = []
    stopped = False
    bar = None
    if progress:
        from tqdm.auto import tqdm

        tqdm.write(f"training split:   {describe_balance(balance['train'])}", file=sys.stderr)
        tqdm.write(f"validation split: {describe_balance(balance['val'])}", file=sys.stderr)
        note = getattr(source, "progress_note", None)
        if note:
            tqdm.write(note, file=sys.stderr)
        desc = "train (features recomputed every epoch)" if getattr(source, "recomputes", False) else "train"
        bar = phase(desc, total=max_epochs, unit="epoch", tenths=False)
    for epoch in range(1, max_epochs + 1):
        head.train()
        total, count = 0.0, 0
        batches = _batches(train, loss, batch_size, g)
        inner = None
        if bar is not None:
            # off a terminal: a line every heartbeat while an epoch runs, none per batch
            inner = phase(f"epoch {epoch}", total=len(batches), unit="batch", tenths=False, leave=False)
        for idx in batches:
            states, cu = source.features([train[i].key for i in idx])
            labels, groups = _tensors(train, idx)
            scores = head_scores(head, states, cu)
            value = compute_loss(loss, scores, labels.to(scores.device), groups, alpha)
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
            total += float(value.detach()) * len(idx)
            count += len(idx)
            if inner is not None:
                inner.set_postfix(train_loss=f"{total / count:.4f}", refresh=False)
                inner.update(1)
        if inner is not None:
            inner.close()
        head.eval()
        vm, val_scores, val_tokens = _evaluate(head, source, val, loss, alpha, batch_size)
        record = {"epoch": epoch, "train_loss": total / max(1, count), **{f"val_{k}": v for k, v in vm.items()}}
        history.append(record)
        figure = vm["loss"] if select == "loss" else -vm["within_problem_auc"]
        improved = figure < best_loss  # NaN (no problem with both kinds) never improves
        if improved:
            best_loss, best_epoch, bad = figure, epoch, 0
            best_state = copy.deepcopy({k: v.detach().clone() for k, v in head.state_dict().items()})
            best_scores, best_tokens = val_scores, val_tokens
        else:
            bad += 1
        if bar is not None:
            bar.set_postfix(train_loss=f"{record['train_loss']:.4f}", val_loss=f"{vm['loss']:.4f}", best=best_epoch)
            bar.update(1)
        if on_epoch is not None:
            on_epoch(epoch, head, record)
        if bad >= patience:
            stopped = epoch < max_epochs
            break
    if bar is not None:
        bar.close()
    if best_state is None:
        raise FloatingPointError(
            f"the validation loss was never finite ({history[-1]['val_loss']}): check the features "
            "(NaN/inf states) and lower the learning rate"
        )
    head.load_state_dict(best_state)
    if scale is not None:
        from .scaling import fold

        with torch.no_grad():
            w, b = fold(head.weight, head.bias, scale)
            head.weight.copy_(w.to(head.weight.device))
            head.bias.copy_(b.to(head.bias.device))
    head.eval()
    best = history[best_epoch - 1]
    val_metrics = {k[4:]: v for k, v in best.items() if k.startswith("val_")}
    return TrainResult(
        best_epoch=best_epoch,
        epochs_run=len(history),
        stopped_early=stopped,
        history=history,
        val_metrics=val_metrics,
        train_metrics={"loss": best["train_loss"]},
        labels=balance,
        baselines=baselines_of(source, val, best_scores, best_tokens, seed),
        select=select,
    )
