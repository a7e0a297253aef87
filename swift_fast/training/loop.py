"""The epoch loop: a SWIFT head trained by AdamW with early stopping that keeps the best epoch.

Model-independent: features come from a ``FeatureSource`` (the Hugging Face one is
``swift_fast.hf.train.HFFeatureSource``), and the loss is on the score ``R`` exactly as DESIGN 2
defines it (``swift_reduce_reference``: per-layer projection, sigmoid gate, gated average), so
the head trained here scores the same in every path.

The paper's recipe (appendix D.3; ``TrainSettings.paper()``, ``train_head``'s defaults): AdamW
lr 1e-4, weight decay 1e-5, batches of 16 sequences, binary cross-entropy with logits on ``R``,
early stopping with patience 3 on the validation loss, keeping the best epoch's weights (the
paper's public code keeps the last ones by mistake). Two changes measured on a real model are
settings: ``select="pairs"`` keeps the epoch with the best within-problem AUC on validation
(what Best-of-N uses), and ``standardize`` trains on standardised states and folds the scaling
back into the head (``swift_fast.training.scaling``).

``train_head`` runs in named steps: validate the data and settings, choose the figure that keeps
an epoch, warn about data that teaches little, standardise, initialise, run the epochs with
early stopping, restore the kept epoch and fold the scaling into it, and measure the result
beside the free baselines (``swift_fast.training.baselines``). Pointwise losses batch shuffled
candidates; the problem-wise ones batch whole problems, up to ``batch_size`` candidates (one
problem at least).
"""

from __future__ import annotations

import copy
import math
import sys
import warnings
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from ..kernels.swift_reduce import swift_reduce_reference
from ..rewards.head import HeadError, SwiftHead
from ..support.progress import phase
from .baselines import free_baselines
from .losses import DEFAULT_ALPHA, GROUP_LOSSES, compute_loss
from .metrics import selection_metrics
from .scaling import FeatureScale, ScaledSource, feature_scale, fold
from .settings import LOOP_FIELDS, TrainSettings, with_overrides
from .splits import (
    Example,
    LabelShareWarning,
    check_label_balance,
    describe_balance,
    label_share_warning,
    whole_balance,
)


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
    #: scores of candidates whose problem the head's fit never saw, for choosing the head's selector
    #: (``swift_fast.training.recommend``): ``{"keys": [...], "scores": float64 [len(keys)], "how": words}``
    evidence: dict = field(default_factory=dict)


# -- scoring ---------------------------------------------------------------------------------
def head_scores(head: SwiftHead, states: Sequence[torch.Tensor], cu: torch.Tensor) -> torch.Tensor:
    """``R`` per sequence, differentiable in the head's parameters (DESIGN 2 reference math,
    with the head's state norm when it has one: evaluating such a head is scoring, not training)."""
    dev = head.weight.device
    states = [s.to(dev) for s in states]
    return swift_reduce_reference(states, head.weight, head.bias, cu.to(dev), head.norm_eps)[0]


def _tensors(examples: list[Example], idx: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels float32 ``[B]`` and problem ids int64 ``[B]`` (numbered in order of appearance)."""
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


# -- the steps of train_head -------------------------------------------------------------------
def _validate(head: SwiftHead, train: list[Example], val: list[Example], s: TrainSettings) -> dict:
    """Refuse what cannot train; the label balance of both splits (``check_label_balance``)."""
    if head.norm_eps is not None:
        # NOTE: such a head stores g * w (the norm's gain folded in), so weight decay and the
        # initialisation would act on the folded weight: refused rather than trained differently
        raise HeadError(
            f"train_head does not train heads with a state norm (this head has norm_eps={head.norm_eps}): "
            "train a head with norm_eps=None"
        )
    if not train:
        raise ValueError("no training examples")
    if not val:
        raise ValueError("no validation examples: early stopping needs a validation set")
    if s.batch_size < 1 or s.max_epochs < 1 or s.patience < 1:
        raise ValueError("batch_size, max_epochs and patience must be >= 1")
    return check_label_balance(train, val, s.loss)


def _selection_figure(val: list[Example], select: str) -> str:
    """``select`` resolved: "pairs" (the within-problem AUC) needs a validation problem with both
    kinds of candidate; "auto" takes it when there is one, else "loss" with a warning."""
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
                LabelShareWarning, stacklevel=3)  # train_head's caller
    if select == "pairs" and not pairs_possible:
        raise ValueError(
            f"select='pairs' keeps the epoch with the best within-problem AUC on validation, but none of the "
            f"{len(kinds)} validation problems has both a correct and an incorrect candidate: select by 'loss' "
            "(--select loss), or use more problems or more candidates per problem"
        )
    return select


def _initialise(head: SwiftHead, g: torch.Generator) -> None:
    """Weights ``N(0, 1 / fan_in)`` from ``g``, bias 0."""
    with torch.no_grad():
        std = 1.0 / math.sqrt(head.weight.shape[1])
        head.weight.copy_(torch.randn(head.weight.shape, generator=g) * std)
        head.bias.zero_()


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


def _progress_bar(balance: dict, source: FeatureSource, max_epochs: int):
    """The splits' counts and the source's note above a bar of epochs."""
    from tqdm.auto import tqdm

    tqdm.write(f"training split:   {describe_balance(balance['train'])}", file=sys.stderr)
    tqdm.write(f"validation split: {describe_balance(balance['val'])}", file=sys.stderr)
    note = getattr(source, "progress_note", None)
    if note:
        tqdm.write(note, file=sys.stderr)
    desc = "train (features recomputed every epoch)" if getattr(source, "recomputes", False) else "train"
    return phase(desc, total=max_epochs, unit="epoch", tenths=False)


def _train_epoch(head, source, train, s: TrainSettings, g, opt, epoch: int, shown: bool) -> float:
    """One pass over ``train`` in ``_batches`` order; the mean training loss per candidate."""
    head.train()
    total, count = 0.0, 0
    batches = _batches(train, s.loss, s.batch_size, g)
    # off a terminal: a line every heartbeat while an epoch runs, none per batch
    inner = phase(f"epoch {epoch}", total=len(batches), unit="batch", tenths=False, leave=False) if shown else None
    for idx in batches:
        states, cu = source.features([train[i].key for i in idx])
        labels, groups = _tensors(train, idx)
        scores = head_scores(head, states, cu)
        value = compute_loss(s.loss, scores, labels.to(scores.device), groups, s.alpha)
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
    return total / max(1, count)


@dataclass
class _Kept:
    """The epoch kept so far, by the figure ``select`` names: the validation loss (lower is better)
    or the within-problem AUC on validation (higher is better); ties keep the earlier epoch."""

    select: str
    epoch: int = 0
    #: the kept epoch's figure (a validation loss or a within-problem AUC), +-inf before the first
    figure: float = field(init=False)
    lower_is_better: bool = field(init=False)
    state: dict | None = None
    scores: torch.Tensor | None = None
    tokens: torch.Tensor | None = None

    def __post_init__(self):
        self.lower_is_better = self.select == "loss"
        self.figure = math.inf if self.lower_is_better else -math.inf

    def improves(self, vm: dict) -> bool:
        # NaN (no problem with both kinds, a loss that overflowed) never improves
        if self.lower_is_better:
            return vm["loss"] < self.figure
        return vm["within_problem_auc"] > self.figure

    def keep(self, epoch: int, vm: dict, head: SwiftHead, scores, tokens) -> None:
        self.figure = vm["loss"] if self.lower_is_better else vm["within_problem_auc"]
        self.epoch = epoch
        self.state = copy.deepcopy({k: v.detach().clone() for k, v in head.state_dict().items()})
        self.scores, self.tokens = scores, tokens


def _run_epochs(head, source, train, val, s: TrainSettings, select: str, g, balance: dict, progress: bool,
                on_epoch) -> tuple[_Kept, list[dict], bool]:
    """Epochs until ``patience`` of them bring no better figure: ``(kept, history, stopped_early)``."""
    opt = torch.optim.AdamW(head.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    kept, history, stopped, bad = _Kept(select), [], False, 0
    bar = _progress_bar(balance, source, s.max_epochs) if progress else None
    for epoch in range(1, s.max_epochs + 1):
        train_loss = _train_epoch(head, source, train, s, g, opt, epoch, bar is not None)
        head.eval()
        vm, val_scores, val_tokens = _evaluate(head, source, val, s.loss, s.alpha, s.batch_size)
        record = {"epoch": epoch, "train_loss": train_loss, **{f"val_{k}": v for k, v in vm.items()}}
        history.append(record)
        if kept.improves(vm):
            kept.keep(epoch, vm, head, val_scores, val_tokens)
            bad = 0
        else:
            bad += 1
        if bar is not None:
            bar.set_postfix(train_loss=f"{train_loss:.4f}", val_loss=f"{vm['loss']:.4f}", best=kept.epoch)
            bar.update(1)
        if on_epoch is not None:
            on_epoch(epoch, head, record)
        if bad >= s.patience:
            stopped = epoch < s.max_epochs
            break
    if bar is not None:
        bar.close()
    return kept, history, stopped


def _restore(head: SwiftHead, kept: _Kept, history: list[dict], scale: FeatureScale | None) -> None:
    """The kept epoch's weights, with the standardisation folded in: a head over raw states."""
    if kept.state is None:
        raise FloatingPointError(
            f"the validation loss was never finite ({history[-1]['val_loss']}): check the features "
            "(NaN/inf states) and lower the learning rate"
        )
    head.load_state_dict(kept.state)
    if scale is not None:
        with torch.no_grad():
            w, b = fold(head.weight, head.bias, scale)
            head.weight.copy_(w.to(head.weight.device))
            head.bias.copy_(b.to(head.bias.device))
    head.eval()


def train_head(
    head: SwiftHead,
    source: FeatureSource,
    train: list[Example],
    val: list[Example],
    settings: TrainSettings | None = None,
    *,
    progress: bool = True,
    init: bool = True,
    on_epoch: Callable[[int, SwiftHead, dict], None] | None = None,
    **overrides,
) -> TrainResult:
    """Train ``head`` in place by the epoch loop; on return it holds the weights of the best epoch
    (epochs count from 1).

    ``settings``: the epoch loop's fields of ``TrainSettings`` (``LOOP_FIELDS``: loss, alpha, lr,
    weight_decay, batch_size, max_epochs, patience, select, standardize, seed); without it
    ``TrainSettings.paper()``, the paper's recipe. ``overrides``: any of those fields by keyword
    on top (``train_head(head, source, train, val, loss="dpo", lr=1e-3)``).

    ``select`` picks the kept epoch: ``"loss"``, the lowest validation loss; ``"pairs"``, the
    highest within-problem AUC on validation (``within_problem_auc``: how well the head ranks the
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
    An unknown keyword is a ``TypeError`` naming it.

    ``result.baselines`` sets the best epoch's validation scores beside length and mean log-prob
    (``free_baselines``, bootstrap seeded with ``seed``).
    """
    s = with_overrides(settings, overrides, TrainSettings.paper(), "train_head", LOOP_FIELDS)
    balance = _validate(head, train, val, s)
    select = _selection_figure(val, s.select)
    little = label_share_warning(whole_balance(balance))
    if little:
        warnings.warn(little, LabelShareWarning, stacklevel=2)
    scale = None
    if s.standardize:
        scale = feature_scale(source, [e.key for e in train])
        source = ScaledSource(source, scale)
    # NOTE: one generator for the initial weights, then every epoch's batch order: a run is
    # reproducible only while these draws come in this order
    g = torch.Generator().manual_seed(s.seed)
    if init:
        _initialise(head, g)
    kept, history, stopped = _run_epochs(head, source, train, val, s, select, g, balance, progress, on_epoch)
    _restore(head, kept, history, scale)
    best = history[kept.epoch - 1]
    return TrainResult(
        best_epoch=kept.epoch,
        epochs_run=len(history),
        stopped_early=stopped,
        history=history,
        val_metrics={k[4:]: v for k, v in best.items() if k.startswith("val_")},
        train_metrics={"loss": best["train_loss"]},
        labels=balance,
        baselines=baselines_of(source, val, kept.scores, kept.tokens, s.seed),
        select=select,
        evidence={"keys": [e.key for e in val], "scores": torch.as_tensor(kept.scores).double().flatten(),
                  "how": "validation"},
    )
