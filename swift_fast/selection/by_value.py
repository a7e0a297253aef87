"""Best-of-N by a named value: what a selector is called, what it needs, and the one pick.

A *selector* names how one candidate is chosen among a request's (or a problem's) candidates:

``<value>``
    the highest value wins (ties: the lowest index; a missing value never wins over a number,
    :func:`swift_fast.selection.bon.bon_select`). The values (:data:`VALUES`): ``swift`` (the
    SWIFT score, needs a head), ``sar`` (needs SAR on), and the head-free ones every candidate of
    the vLLM plugin carries: ``mean_logprob`` and DeepConf's ``confidence_lowest_group``,
    ``confidence_tail``, ``confidence_bottom10`` (:mod:`swift_fast.rewards.confidence`).
``rank`` / ``scaled``
    the SWIFT paper's two combinations of SWIFT and SAR (needs both).
``vote``
    majority vote over the candidates' final answers (needs an answer extractor).
``vote:<value>``
    each candidate adds a weight of its value to its answer (DeepConf's confidence-weighted vote
    is ``vote:confidence_lowest_group``, ``vote:confidence_tail`` or ``vote:confidence_bottom10``).
    The weight (:data:`VOTE_WEIGHTS`): the confidence itself (DeepConf's rule: confidences are
    positive), ``sigmoid(swift)`` (the SWIFT paper's weighted vote), ``exp(mean_logprob)`` (the
    geometric-mean token probability) and ``(1 + sar) / 2`` (SAR mapped from [-1, 1] to [0, 1]).
``vote:<value>@<T>``
    each candidate adds ``exp(value / T)`` to its answer (``T > 0``, a temperature): a large ``T``
    is majority vote, a small one the answer of the highest value. Between the two, a score
    that is right more often than not about *which* candidate is better, but not sure enough to
    overrule a clear majority, adds what it knows to the vote. ``swift-fast train`` chooses
    ``T`` for its head by cross-validation and records ``vote:swift@T`` when the evidence picks
    it (:mod:`swift_fast.training.recommend`).

A selector that needs what an engine or a file does not have is refused by name
(:func:`check_selector`), never answered with a pick among missing values. The same holds for a
pruning signal (:func:`check_prune`): ``swift`` and ``combined`` need a head.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Hashable, NamedTuple, Sequence

import torch

from . import bon

#: values a candidate may carry, by the names the plugin's outputs and rollout files use
HEAD_FREE = ("mean_logprob", "confidence_lowest_group", "confidence_tail", "confidence_bottom10")
VALUES = ("swift", "sar") + HEAD_FREE
COMBINATIONS = ("rank", "scaled")
#: the engine's default selector without a head: DeepConf's lowest group confidence, the best
#: head-free selector of the real-model recipe (docs/real-model.md)
DEFAULT_HEAD_FREE = "confidence_lowest_group"

#: weight of a candidate's value in a ``vote:<value>`` (module docstring)
VOTE_WEIGHTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "swift": torch.sigmoid,
    "sar": lambda x: (1.0 + x) / 2.0,
    "mean_logprob": torch.exp,
    "confidence_lowest_group": lambda x: x,
    "confidence_tail": lambda x: x,
    "confidence_bottom10": lambda x: x,
}

#: the attribute of a vLLM ``CompletionOutput`` (and the field of a response choice) holding each value
FIELD = {"swift": "swift_score", **{v: v for v in VALUES if v != "swift"}}


class SelectorError(ValueError):
    """A selector that is not known, or that needs what is not there; the message names both."""


class Available(NamedTuple):
    """What an engine (or a rollout file) has: a SWIFT head, SAR, an answer extractor."""

    head: bool
    sar: bool
    answers: bool


def all_selectors() -> list[str]:
    return list(VALUES) + list(COMBINATIONS) + ["vote"] + [f"vote:{v}" for v in VALUES]


def temperature(selector: Any) -> float | None:
    """The ``T`` of a ``vote:<value>@<T>`` selector, None for any other selector (its weight is
    ``VOTE_WEIGHTS``'); a :class:`SelectorError` for a ``T`` that is not a positive finite number."""
    if not isinstance(selector, str) or "@" not in selector or not selector.strip().startswith("vote:"):
        return None
    text = selector.strip().rsplit("@", 1)[1]
    try:
        t = float(text)
    except ValueError:
        t = math.nan
    if not (math.isfinite(t) and t > 0):
        raise SelectorError(f"{selector!r}: the temperature after @ must be a positive number (vote:swift@0.5), "
                            f"got {text!r}")
    return t


def vote_weight(selector: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The weight a vote ``selector`` gives each candidate, on values ``[..., k]`` (one row per
    group; a missing value is NaN): ``VOTE_WEIGHTS[value]``, or for ``vote:<value>@<T>``
    ``exp((value - max) / T)`` with the row's largest value as ``max`` (the same vote as
    ``exp(value / T)``, without overflow). A missing value weighs 0 either way."""
    kind, value = parse(selector)
    if kind != "vote" or value is None:
        raise SelectorError(f"{selector!r} is not a weighted vote")
    t = temperature(selector)
    if t is None:
        fn = VOTE_WEIGHTS[value]
    else:
        def fn(x: torch.Tensor) -> torch.Tensor:
            top = torch.nan_to_num(x, nan=-math.inf).amax(-1, keepdim=True)
            return torch.exp((x - torch.where(torch.isfinite(top), top, 0.0)) / t)
    return lambda x: torch.nan_to_num(fn(x), nan=0.0)


def parse(selector: Any, where: str = "select") -> tuple[str, str | None]:
    """``(kind, value)``: kind ``"value"`` (value named), ``"rank"``, ``"scaled"``, ``"vote"``
    (value None: majority, else the weight; ``vote:<value>@<T>``'s ``T``: :func:`temperature`).
    Raises :class:`SelectorError` for an unknown name."""
    if isinstance(selector, str):
        s = selector.strip()
        if s.startswith("vote:") and "@" in s:
            base = s.rsplit("@", 1)[0]
            if base[5:] in VALUES:
                try:
                    temperature(s)
                except SelectorError as e:
                    raise SelectorError(f"{where}: {e}") from None
                return "vote", base[5:]
        if s in VALUES:
            return "value", s
        if s in COMBINATIONS:
            return s, None
        if s == "vote":
            return "vote", None
        if s.startswith("vote:") and s[5:] in VALUES:
            return "vote", s[5:]
        if s == "swift_score":
            return "value", "swift"
    raise SelectorError(f"{where} = {selector!r} is not a selector; the selectors are {all_selectors()}, and "
                        "vote:<value>@<T> (a vote weighted by exp(value / T), T > 0)")


def needs(selector: str) -> Available:
    """What ``selector`` needs (True where it needs it)."""
    kind, value = parse(selector)
    head = value == "swift" or kind in COMBINATIONS
    sar = value == "sar" or kind in COMBINATIONS
    return Available(head=head, sar=sar, answers=kind == "vote")


def check_selector(selector: Any, have: Available, where: str = "select") -> None:
    """Raise :class:`SelectorError` when ``selector`` is unknown or needs what ``have`` lacks."""
    parse(selector, where)  # an unknown name is an error naming ``where``
    need = needs(selector)
    missing = []
    if need.head and not have.head:
        missing.append("a SWIFT head (\"head\"; the head-free selectors are "
                       f"{list(HEAD_FREE) + ['vote'] + [f'vote:{v}' for v in HEAD_FREE]})")
    if need.sar and not have.sar:
        missing.append('SAR ("sar": true)')
    if need.answers and not have.answers:
        missing.append('an answer extractor ("answer": "math", "choice", "boolean" or "literal")')
    if missing:
        raise SelectorError(f"{where} = {selector!r} needs {' and '.join(missing)}, which this engine does not have")


def check_prune(cfg, have: Available, where: str = "prune") -> None:
    """Raise :class:`SelectorError` when a pruning signal needs a head that is not there."""
    if cfg.signal in ("swift", "combined") and not have.head:
        raise SelectorError(
            f'{where}: signal {cfg.signal!r} ranks candidates by their running SWIFT score, which needs a SWIFT head; '
            'without one use {"signal": "confidence"} (DeepConf\'s confidence, rank-based), or DeepConf online '
            '("deepconf" instead of "prune")'
        )


def choose(values: dict[str, Sequence[float | None]], selector: str,
           answers: Sequence[Hashable | None] | None = None, eligible: Sequence[bool] | None = None) -> int:
    """Index of the candidate ``selector`` picks among one group.

    ``values[field]``: one entry per candidate (None or NaN where missing) for the values the
    selector reads, keyed by the outputs' field names (:data:`FIELD`: ``swift_score``, ``sar``,
    ``mean_logprob``, ...); ``answers``: each candidate's final answer (None: none extracted) for a vote;
    ``eligible``: False for a candidate that may not win (stopped during generation) -- used only
    while another candidate is eligible, as :func:`swift_fast.selection.bon.eligible` rules.
    """
    kind, value = parse(selector)
    reads = [FIELD[v] for v in ((value,) if kind in ("value", "vote") and value else ("swift", "sar"))
             if kind != "vote" or value]
    lengths = {len(values[f]) for f in reads if f in values} | ({len(answers)} if answers is not None else set())
    if len(lengths) > 1:
        raise ValueError(f"choose: the candidates' values and answers have different lengths {sorted(lengths)}")
    missing = [f for f in reads if f not in values]
    if missing:
        raise SelectorError(f"{selector!r} reads {missing}, and no such values were given")
    n = lengths.pop() if lengths else 0
    if eligible is not None and any(eligible) and not all(eligible):
        keep = [i for i, ok in enumerate(eligible) if ok]
        sub = {k: [v[i] for i in keep] for k, v in values.items()}
        return keep[choose(sub, selector, None if answers is None else [answers[i] for i in keep])]

    def row(name):
        return [[math.nan if x is None else float(x) for x in values[FIELD[name]]]]

    if kind == "value":
        return int(bon.bon_select(row(value), n)[0])
    if kind == "rank":
        return int(bon.combine_rank(row("swift"), row("sar"), n)[0])
    if kind == "scaled":
        return int(bon.combine_scaled(row("swift"), row("sar"), n)[0])
    if answers is None:
        raise SelectorError(f"{selector!r} votes over the candidates' answers, and none were given")
    if value is None:
        return int(bon.majority_vote([list(answers)], n)[0])
    # a missing weight adds nothing (NaN would poison the tally)
    w = vote_weight(selector)(torch.tensor(row(value), dtype=torch.float64))
    return int(bon.weighted_vote([list(answers)], w, n, weight=lambda x: x)[0])
