"""The candidates a Best-of-N report selects among, as matrices: their correctness, answers and
score columns read from rollout problems (:func:`gather`), and the head-free selectors'
per-candidate signals (:data:`SIGNAL_FIELDS`), read from the rollouts or derived from the vLLM
plugin's per-token trace.

Two generations of head-free fields: the vLLM plugin gives every candidate ``mean_logprob`` and
DeepConf's ``confidence_lowest_group``, ``confidence_tail`` and ``confidence_bottom10`` over the
engine's ``confidence_window`` (``swift-fast bon`` writes them as they come); older rollouts, the
demo's and ``swift_fast.hf.record_signals``' carry ``conf_lowest`` and ``conf_tail`` over a window
of their own (:data:`TRACE_FIELDS`). A report reads the first and falls back to the second, per
candidate (:data:`FALLBACK`), so that both kinds of file show the same rows.

Apart from :mod:`swift_fast.reports.best_of_n` because reading and checking rollouts is one concern
and choosing among the candidates another; the report re-exports every name here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Hashable, Sequence

import torch

from ..data.datasets import DataError
from ..data.rollouts import Problem


@dataclass
class Candidates:
    """The first ``n`` candidates of ``P`` problems as matrices.

    ``correct`` bool ``[P, n]``; ``answers`` hashable keys (None: no answer); ``scores`` named
    float64 ``[P, n]`` columns (NaN where a candidate has no such score); ``pruned`` bool
    ``[P, n]``, candidates stopped during generation (``swift_pruned``), which no selection picks
    while their problem has another one (None: none was); ``truncated`` bool ``[P, n]``,
    candidates that stopped at the length limit (``finish_reason`` "length"; all False where
    the rollouts do not record it).
    """

    ids: list[str]
    correct: torch.Tensor
    answers: list[list[Hashable | None]]
    scores: dict[str, torch.Tensor] = field(default_factory=dict)
    pruned: torch.Tensor | None = None
    truncated: torch.Tensor | None = None

    @property
    def n(self) -> int:
        return self.correct.shape[1]


def gather(
    problems: Sequence[Problem],
    score_keys: Sequence[str] = (),
    n: int | None = None,
    where: str = "",
    signals: bool = False,
) -> Candidates:
    """Matrices from rollout problems. Every problem must have at least ``n`` candidates (default:
    the fewest any problem has) and each of them a ``correct`` field.

    ``signals``: also gather the trivial selectors' columns (:data:`SIGNAL_FIELDS`) that the
    candidates have, under their field names (see :func:`signal_columns`); absent ones are left
    out, never an error."""
    if not problems:
        raise DataError(f"{where or 'rollouts'}: no problems to evaluate")
    counts = [len(p.candidates) for p in problems]
    n = min(counts) if n is None else n
    if n < 1:
        empty = next(p.id for p in problems if not p.candidates)
        raise DataError(f"{where}: problem {empty!r} has no candidates")
    short = [p.id for p, c in zip(problems, counts) if c < n]
    if short:
        raise DataError(f"{where}: {len(short)} problems have fewer than {n} candidates (first: {short[0]!r})")
    correct, answers = [], []
    cols: dict[str, list[list[float]]] = {k: [] for k in score_keys}
    for p in problems:
        loc = p.where or where  # file:line when the problem was read from a file
        row_c, row_a = [], []
        for i, c in enumerate(p.candidates[:n]):
            if c.get("correct") is None:
                raise DataError(
                    f"{loc}: problem {p.id!r} candidate {i} has no 'correct' field: grade the candidates first "
                    "(`swift-fast eval --grade` grades them from their text and the problem's reference)"
                )
            row_c.append(bool(c["correct"]))
            a = c.get("answer")
            row_a.append(None if a is None or a == "" else str(a))
        correct.append(row_c)
        answers.append(row_a)
        for k in score_keys:
            cols[k].append([_number(c, k, p, i, loc) for i, c in enumerate(p.candidates[:n])])
    for k in score_keys:
        if all(math.isnan(v) for row in cols[k] for v in row):
            raise DataError(f"{where}: no candidate has a score column {k!r}")
    scores = {k: torch.tensor(v, dtype=torch.float64) for k, v in cols.items()}
    if signals:
        for k, v in signal_columns(problems, n, where).items():
            scores.setdefault(k, v)
    pruned = [[bool(c.get("swift_pruned")) for c in p.candidates[:n]] for p in problems]
    truncated = [[c.get("finish_reason") == "length" for c in p.candidates[:n]] for p in problems]
    return Candidates(
        ids=[p.id for p in problems],
        correct=torch.tensor(correct, dtype=torch.bool),
        answers=answers,
        pruned=torch.tensor(pruned, dtype=torch.bool) if any(map(any, pruned)) else None,
        scores=scores,
        truncated=torch.tensor(truncated, dtype=torch.bool),
    )


def field_of(c: dict, key: str) -> str:
    """The field of candidate ``c`` that holds column ``key``: ``key`` itself, or its older name
    (:data:`FALLBACK`) where ``c`` has only that."""
    old = FALLBACK.get(key)
    return old if old is not None and key not in c and old in c else key


def _number(c: dict, key: str, p: Problem, i: int, loc: str) -> float:
    key = field_of(c, key)
    v = c.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise DataError(f"{loc}: problem {p.id!r} candidate {i}: score {key!r} must be a number or null, got {v!r}")
    return float("nan") if v is None else float(v)


#: Per-candidate fields of the head-free selectors, by the names of the vLLM plugin's outputs
#: (``swift_fast.selection.by_value.HEAD_FREE``): generated token count, mean token log-prob
#: under the model's own distribution, DeepConf's lowest-group, tail and bottom-10% confidence
#: (``swift_fast.rewards.confidence``).
SIGNAL_FIELDS = ("num_tokens", "mean_logprob", "confidence_lowest_group", "confidence_tail", "confidence_bottom10")
#: The fields :func:`trace_signals` and ``swift_fast.hf.record_signals`` write: DeepConf's
#: confidences over the caller's window, under names of their own (the engine's are over its
#: ``confidence_window``).
TRACE_FIELDS = ("num_tokens", "mean_logprob", "conf_lowest", "conf_tail")
#: A column's older field, read where a candidate lacks the column's own (module docstring).
FALLBACK = {"confidence_lowest_group": "conf_lowest", "confidence_tail": "conf_tail"}

def record_trace_signals(problems: Sequence[Problem], window: int) -> int:
    """The :data:`TRACE_FIELDS` of every candidate that carries the vLLM plugin's per-token values
    (``swift_trace``), written onto it (:func:`trace_signals`). Returns how many candidates got
    all four."""
    return sum(trace_signals(c, window) for p in problems for c in p.candidates)


def trace_signals(c: dict, window: int) -> bool:
    """Write a candidate's :data:`TRACE_FIELDS` from its ``swift_trace``: the same quantities
    ``swift_fast.hf.record_signals`` computes with a second forward, here free. ``mean_logprob``
    needs the trace's ``logprob`` (older traces carry it with SAR on only). Whether all four were
    written."""
    from ..rewards.confidence import lowest_group, tail

    tr = c.get("swift_trace")
    if not isinstance(tr, dict):
        return False
    c["num_tokens"] = len(c["token_ids"])
    conf = tr.get("confidence") or []
    c["conf_lowest"] = lowest_group(conf, window) if conf else None
    c["conf_tail"] = tail(conf, window) if conf else None
    lp = tr.get("logprob")
    if lp is None:  # an older trace without SAR
        return False
    c["mean_logprob"] = sum(lp) / len(lp) if lp else None
    return True


def signal_columns(problems: Sequence[Problem], n: int, where: str = "") -> dict[str, torch.Tensor]:
    """Float64 ``[P, n]`` columns of the :data:`SIGNAL_FIELDS` that at least one of the first
    ``n`` candidates of a problem has (NaN where a candidate lacks it). ``num_tokens`` falls back
    to ``len(token_ids)`` where a candidate has token ids but no such field; the confidences to
    their older fields (:data:`FALLBACK`)."""
    out = {}
    for k in SIGNAL_FIELDS:
        rows = []
        for p in problems:
            loc = p.where or where
            row = []
            for i, c in enumerate(p.candidates[:n]):
                if k == "num_tokens" and c.get(k) is None and isinstance(c.get("token_ids"), list):
                    row.append(float(len(c["token_ids"])))
                else:
                    row.append(_number(c, k, p, i, loc))
            rows.append(row)
        col = torch.tensor(rows, dtype=torch.float64).reshape(len(problems), n)
        if not torch.isnan(col).all():
            out[k] = col
    return out
