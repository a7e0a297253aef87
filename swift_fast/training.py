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
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch
import torch.nn.functional as F

from .head import SwiftHead
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


# -- the loop --------------------------------------------------------------------------------
class FeatureSource(Protocol):
    """Gives a head's input for sequences named by keys."""

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


def head_scores(head: SwiftHead, states: Sequence[torch.Tensor], cu: torch.Tensor) -> torch.Tensor:
    """``R`` per sequence, differentiable in the head's parameters (DESIGN 2 reference math)."""
    dev = head.weight.device
    states = [s.to(dev) for s in states]
    return swift_reduce_reference(states, head.weight, head.bias, cu.to(dev))[0]


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
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; expected one of {', '.join(LOSSES)}")
    if not train:
        raise ValueError("no training examples")
    if not val:
        raise ValueError("no validation examples: early stopping needs a validation set")
    if batch_size < 1 or max_epochs < 1 or patience < 1:
        raise ValueError("batch_size, max_epochs and patience must be >= 1")
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

        bar = tqdm(total=max_epochs, desc="train", unit="epoch", dynamic_ncols=True)
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
    )
