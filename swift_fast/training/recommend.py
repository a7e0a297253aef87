"""Which selector a trained head should be used with, chosen on the training run's own evidence.

A head trained on little data may rank candidates worse than a majority vote, and a head trained
on plenty may still gain most by weighting a vote rather than overruling it (docs/training.md).
So ``train`` does not assume that the highest score is the best use of its head: it measures, on
problems whose candidates the head's fit never saw, every selector a user could run with it,
and records the best in the head file (``SwiftHead.selector``); ``bon``, ``eval``, the reports
and the plugin use it by default, always print it, and take ``--select`` / ``"select"`` over it.

The candidates measured (each a selector of :mod:`swift_fast.selection.by_value`):

- ``swift``: the highest head score;
- ``vote:swift@T``: a vote over the final answers where each candidate adds ``exp(score / T)``.
  ``T`` comes from :data:`TEMPERATURES` and is chosen by cross-validation over the problems
  (:func:`cv_temperature`): each fold's outcome is the vote at the ``T`` that did best on the
  other folds, so the figure reported for this selector is not a best-of-seven on the same
  problems. The ``T`` recorded is the one best over all of them;
- ``vote``: majority vote, the head-free bound every head has to clear;
- every head-free value the evidence carries (``mean_logprob`` and DeepConf's confidences,
  computed in the forward that gives the head's states).

The figure is Best-of-N over all of a problem's candidates (ties to the lowest index, as
:func:`swift_fast.selection.bon.bon_select`); the recommendation is the highest, ties to the
selectors that need no head (majority first, then the values), then ``swift``, then the vote: a
head that only matches a selector it does not need has not shown what it adds.
Candidate answers are the rollouts' graded ones (``None``: nothing extracted, no vote).
The recommendation carries the figures behind it and a paired bootstrap interval, over the
problems, of the chosen selector minus the best head-free one.

Where the answers are unknown (no candidate has one) only the score selectors compete, and the
head-free values join only where every candidate has one (a missing value is no evidence).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch

from ..selection import bon
from ..selection.bootstrap import bootstrap_interval
from ..selection.by_value import HEAD_FREE, vote_weight

#: the vote temperatures tried for ``vote:swift@T``, on the head's score (the probe's score is a
#: log-odds: T = 1 weighs a candidate by its odds of being correct)
TEMPERATURES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
#: folds of the cross-validation that chooses T
FOLDS = 5
#: the order ties go in
ORDER = ("vote", *HEAD_FREE, "swift", "vote:swift")


def by_problem_id(groups: Sequence[Hashable], *columns):
    """``selection.bon.by_problem`` for problem ids of any hashable kind: rows in sorted order of the
    ids as strings (the order :func:`answer_rows` uses)."""
    ids = {g: i for i, g in enumerate(sorted(set(groups), key=str))}
    g = torch.tensor([ids[x] for x in groups], dtype=torch.long)
    return bon.by_problem(g, *columns)


def answer_rows(groups: Sequence[Hashable], answers: Sequence[Hashable | None]) -> list[list]:
    """Per problem (sorted as ``by_problem_id``), its answers in generation order, padded with None."""
    order = sorted(set(groups), key=str)
    rows: dict = {p: [] for p in order}
    for p, a in zip(groups, answers):
        rows[p].append(a)
    n = max((len(r) for r in rows.values()), default=0)
    return [rows[p] + [None] * (n - len(rows[p])) for p in order]


def vote_outcomes(answers: list[list], scores: torch.Tensor, correct: torch.Tensor,
                   selector: str | None) -> torch.Tensor:
    """Per problem, 1.0 when the vote ``selector`` (None: majority) picks a correct candidate."""
    n = scores.shape[1]
    w = None if selector is None else vote_weight(selector)(scores)
    picked = bon.weighted_vote(answers, w, n, weight=lambda x: torch.nan_to_num(x, nan=0.0, neginf=0.0))
    return correct.gather(1, picked[:, None]).squeeze(1).double()


def best_outcomes(scores: torch.Tensor, correct: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    picked = bon.bon_select(scores, scores.shape[1], pruned=padding)
    return correct.gather(1, picked[:, None]).squeeze(1).double()


def _folds(problems: int, folds: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(problems, generator=g)
    return [order[f::folds] for f in range(min(folds, problems))]


def _pick_t(outcomes: dict[float, torch.Tensor], rows: torch.Tensor) -> float:
    # ties to the larger T: the closer to the majority vote, the less the choice leans on the score
    return max(outcomes, key=lambda t: (float(outcomes[t][rows].mean()), t))


def cv_temperature(answers: list[list], scores: torch.Tensor, correct: torch.Tensor,
                   temperatures: Sequence[float] = TEMPERATURES, folds: int = FOLDS, seed: int = 0
                   ) -> tuple[float, torch.Tensor, dict[float, float]]:
    """``(T, outcomes [P], accuracy per T)``: the vote temperature best on all problems, the
    cross-validated outcome of each problem (the vote at the ``T`` best on the other folds) and
    each ``T``'s accuracy on all problems. ``scores``/``correct`` ``[P, n]`` (NaN scores weigh 0)."""
    per_t = {t: vote_outcomes(answers, scores, correct, f"vote:swift@{t}") for t in temperatures}
    p = scores.shape[0]
    out = torch.zeros(p, dtype=torch.float64)
    parts = _folds(p, folds, seed)
    for held in parts:
        rest = torch.ones(p, dtype=torch.bool)
        rest[held] = False
        t = _pick_t(per_t, rest) if len(parts) > 1 else _pick_t(per_t, ~rest)
        out[held] = per_t[t][held]
    best = _pick_t(per_t, torch.ones(p, dtype=torch.bool))
    return best, out, {t: float(v.mean()) for t, v in per_t.items()}


def recommend(scores: torch.Tensor, labels: torch.Tensor, groups: Sequence[Hashable],
              answers: Sequence[Hashable | None] | None = None, values: dict[str, torch.Tensor] | None = None,
              evidence: str = "validation", seed: int = 0, reps: int = 2000, level: float = 0.95) -> dict:
    """The selector to use the head with, and the figures behind it (JSON-ready).

    Args:
        scores: the head's score of each candidate ``[N]``, from a fit that did not see its problem.
        labels: correctness ``[N]``; ``groups``: problem id per candidate, candidates of a problem
            in generation order.
        answers: each candidate's graded final answer (None where none was extracted); None: unknown.
        values: head-free values by selector name (``mean_logprob``, ``confidence_lowest_group``,
            ...), each ``[N]`` (NaN where missing: the value then stays out).
        evidence: how the scores were obtained, in words (recorded).
    Returns:
        ``{"select", "evidence", "problems", "candidates", "accuracy": {selector: BoN@all},
        "temperature": {"chosen", "accuracy": {T: ...}, "folds"}, "against", "difference",
        "interval", "level"}``; ``select`` is a selector string (``vote:swift@0.5``).
    """
    s = torch.as_tensor(scores).detach().double().flatten()
    y = torch.as_tensor(labels).bool().flatten()
    if not (len(s) == len(y) == len(groups)):
        raise ValueError(f"scores, labels and groups must have one entry per candidate, got {len(s)}, {len(y)}, "
                         f"{len(groups)}")
    (sm, ym), padding = by_problem_id(list(groups), s, y)
    outcomes: dict[str, torch.Tensor] = {"swift": best_outcomes(sm, ym, padding)}
    temperature = None
    has_answers = answers is not None and any(a is not None for a in answers)
    if has_answers:
        rows = answer_rows(list(groups), list(answers))
        t, cv, per_t = cv_temperature(rows, sm, ym, seed=seed)
        outcomes["vote:swift"] = cv
        outcomes["vote"] = vote_outcomes(rows, sm, ym, None)
        temperature = {"chosen": t, "accuracy": {str(k): v for k, v in per_t.items()}, "folds": FOLDS,
                       "grid": list(TEMPERATURES)}
    for name, v in (values or {}).items():
        v = torch.as_tensor(v).double().flatten()
        if len(v) != len(s):
            raise ValueError(f"values[{name!r}] has {len(v)} entries for {len(s)} candidates")
        if name in HEAD_FREE and not torch.isnan(v).any():
            outcomes[name] = best_outcomes(by_problem_id(list(groups), v)[0][0], ym, padding)
    accuracy = {k: float(v.mean()) for k, v in outcomes.items()}
    ranked = sorted(outcomes, key=lambda k: (-accuracy[k], ORDER.index(k)))
    best = ranked[0]
    free = [k for k in ranked if k not in ("swift", "vote:swift")]
    against = free[0] if free and best in ("swift", "vote:swift") else (ranked[1] if len(ranked) > 1 else None)
    select = f"vote:swift@{temperature['chosen']:g}" if best == "vote:swift" else best
    out = {
        "select": select,
        "evidence": evidence,
        "problems": int(sm.shape[0]),
        "candidates": int(len(s)),
        "accuracy": {("vote:swift@cv" if k == "vote:swift" else k): v for k, v in accuracy.items()},
        "temperature": temperature,
        "against": against,
        "difference": None,
        "interval": None,
        "level": level,
    }
    if against is not None:
        d = outcomes[best] - outcomes[against]
        lo, hi = bootstrap_interval(d, reps, level, seed)
        out["difference"], out["interval"] = float(d.mean()), [lo, hi]
    return out


def describe(rec: dict) -> str:
    """One paragraph for people: what is recommended, on what evidence, beside what."""
    names = {"swift": "SWIFT (highest score)", "vote:swift@cv": "SWIFT-weighted vote",
             "vote:swift": "the SWIFT-weighted vote", "vote": "majority vote",
             "mean_logprob": "mean log-prob", "confidence_lowest_group": "confidence (lowest group)",
             "confidence_tail": "confidence (tail)", "confidence_bottom10": "confidence (bottom 10%)"}
    acc = rec["accuracy"]
    figures = ", ".join(f"{names.get(k, k)} {100 * v:.1f}%" for k, v in sorted(acc.items(), key=lambda kv: -kv[1]))
    text = (f"recommended selector: {rec['select']} (Best-of-N over each problem's candidates on "
            f"{rec['problems']} {rec['evidence']} problems: {figures})")
    t = rec.get("temperature")
    if t:
        text += f"; the vote's temperature T={t['chosen']:g} was chosen by {t['folds']}-fold cross-validation"
    if rec.get("interval") is not None and rec.get("against"):
        lo, hi = rec["interval"]
        text += (f"; {rec['select']} minus {names.get(rec['against'], rec['against'])}: "
                 f"{100 * rec['difference']:+.1f} points ({100 * rec['level']:.0f}% interval {100 * lo:+.1f} to "
                 f"{100 * hi:+.1f}, paired bootstrap over problems)")
    if rec["select"] in ("swift",) or rec["select"].startswith("vote:swift"):
        return text
    return text + "; on this evidence the head does not pick better than a selector that needs no head"

