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
``swift-fast train``, ``swift-fast demo build``) goes through it.
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch
import torch.nn.functional as F

from .head import HeadError, SwiftHead
from .kernels.swift_reduce import swift_reduce_reference

LOSSES = ("bce", "hinge", "dpo", "infonca", "nca")
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


def selection_metrics(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> dict:
    """Per-candidate accuracy (``R > 0`` as the prediction), AUC, and per problem: Best-of-N
    accuracy (highest score, ties to the lowest index), pass@N (oracle) and the mean correctness
    (what a random pick gets)."""
    s = torch.as_tensor(scores).detach().double()
    y = torch.as_tensor(labels).bool()
    bon, oracle, mean = [], [], []
    for idx in _group_ids(groups):
        best = int(torch.argmax(torch.nan_to_num(s[idx], nan=-math.inf)))
        bon.append(float(y[idx][best]))
        oracle.append(float(y[idx].any()))
        mean.append(float(y[idx].double().mean()))
    return {
        "accuracy": float(((s > 0) == y).double().mean()) if len(s) else float("nan"),
        "auc": auc(s, y),
        "bon": sum(bon) / max(1, len(bon)),
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
    ``progress_note`` (a sentence shown once above the progress bar, or None).
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


def score_examples(
    head: SwiftHead, source: FeatureSource, examples: list[Example], batch_size: int = 16
) -> torch.Tensor:
    """``R`` of every example (no gradient), float32 ``[len(examples)]`` on the CPU."""
    out = []
    with torch.no_grad():
        for a in range(0, len(examples), batch_size):
            states, cu = source.features([e.key for e in examples[a : a + batch_size]])
            out.append(head_scores(head, states, cu).float().cpu())
    return torch.cat(out) if out else torch.zeros(0)


def evaluate(head, source, examples, loss: str = "bce", alpha: float = DEFAULT_ALPHA, batch_size: int = 16) -> dict:
    """Loss (over the whole set: every pair / problem at once) and selection metrics."""
    s = score_examples(head, source, examples, batch_size)
    labels, groups = _tensors(examples, range(len(examples)))
    m = selection_metrics(s, labels, groups)
    m["loss"] = float(compute_loss(loss, s.double(), labels.double(), groups, alpha))
    return m


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
) -> TrainResult:
    """Train ``head`` in place; on return it holds the weights of the epoch with the lowest
    validation loss (epochs count from 1).

    Seeded: ``seed`` fixes the initial weights (when ``init``) and the batch order, so a run is
    reproducible on the same machine. ``on_epoch(epoch, head, record)`` is called after each
    epoch's validation.

    Raises ``LabelBalanceError`` before the first epoch when a split cannot teach or measure the
    loss (``check_label_balance``); the counts it checked are ``result.labels``. Raises
    ``HeadError`` for a head with a state norm (``norm_eps``): training does not support those.
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
    if not train:
        raise ValueError("no training examples")
    if not val:
        raise ValueError("no validation examples: early stopping needs a validation set")
    if batch_size < 1 or max_epochs < 1 or patience < 1:
        raise ValueError("batch_size, max_epochs and patience must be >= 1")
    balance = check_label_balance(train, val, loss)
    g = torch.Generator().manual_seed(seed)
    if init:
        with torch.no_grad():
            std = 1.0 / math.sqrt(head.weight.shape[1])
            head.weight.copy_(torch.randn(head.weight.shape, generator=g) * std)
            head.bias.zero_()
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    best_loss, best_epoch, best_state, bad = math.inf, 0, None, 0
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
        bar = tqdm(total=max_epochs, desc=desc, unit="epoch", dynamic_ncols=True)
    for epoch in range(1, max_epochs + 1):
        head.train()
        total, count = 0.0, 0
        batches = _batches(train, loss, batch_size, g)
        inner = None
        if bar is not None:
            from tqdm.auto import tqdm

            inner = tqdm(total=len(batches), desc=f"epoch {epoch}", unit="batch", leave=False, dynamic_ncols=True)
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
        vm = evaluate(head, source, val, loss, alpha, batch_size)
        record = {"epoch": epoch, "train_loss": total / max(1, count), **{f"val_{k}": v for k, v in vm.items()}}
        history.append(record)
        improved = vm["loss"] < best_loss
        if improved:
            best_loss, best_epoch, bad = vm["loss"], epoch, 0
            best_state = copy.deepcopy({k: v.detach().clone() for k, v in head.state_dict().items()})
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
    )
