"""The split of candidates by problem, and whether a split's labels can teach a head.

Training splits problems, never candidates: ``split_by_problem`` holds out a seeded
``val_fraction`` of the distinct problem ids (paper D.3: 80/20), so the candidates of one problem
are all on one side and the validation figures are measured on problems the head never saw.

Before the first epoch ``check_label_balance`` refuses splits whose labels cannot teach the loss
(``LabelBalanceError``, with the counts and what to change): every entry point
(``train_head``, ``swift_fast.hf.train_from_rollouts``, ``swift-fast train``, ``swift-fast demo
build``) goes through it. Rollouts where every candidate is wrong would otherwise train to a loss
near 0 and write a head that learned nothing. Data that can teach, but little (under
:data:`LOW_SHARE` correct or over ``1 - LOW_SHARE``, or fewer than :data:`MIN_OF_A_KIND` of a
kind), gets a ``LabelShareWarning`` with its counts (``label_share_warning``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .losses import GROUP_LOSSES, check_loss


@dataclass
class Example:
    """One candidate: ``key`` for the feature source, its problem, its label."""

    key: int
    problem: str
    label: bool


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


def plural(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def describe_balance(b: dict) -> str:
    """One line of ``label_balance`` counts, for people."""
    return (
        f"{plural(b['problems'], 'problem')}, {plural(b['candidates'], 'candidate')} ({b['correct']} correct, "
        f"{b['incorrect']} incorrect); {plural(b['problems_with_both'], 'problem')} with both, "
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
    check_loss(loss)
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
