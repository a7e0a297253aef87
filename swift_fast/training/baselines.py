"""What a head is measured against: the selectors that need no training, and a verdict.

A head that ranks candidates no better than their length, or than the model's own mean log-prob
of the response, was not worth training. So after training, ``free_baselines`` sets the head's
validation scores beside those two on the same candidates: the response length (in the direction
the validation data favours) and the mean log-prob, with random and oracle picks as the bounds.
Each row has the pooled AUC, the within-problem AUC and Best-of-N over all of a problem's
candidates (``swift_fast.training.metrics``).

The verdict is on the within-problem AUC, what Best-of-N uses (the pooled AUC also credits a
score for telling easy problems from hard ones, which picks no better candidate): the difference
between the head and the better free baseline, with a paired percentile bootstrap over
validation problems (``swift_fast.selection.bootstrap``; problems without both kinds of
candidate have no within-problem AUC and count for nothing), and one sentence for people.
"""

from __future__ import annotations

import math

import torch

from ..selection.bootstrap import bootstrap_interval
from .losses import problem_indices
from .metrics import auc, bon_outcomes, oracle_and_random, problem_aucs, within_problem_auc
from .splits import plural

#: fewer validation problems than this make a bootstrap over problems a rough guide only
FEW_PROBLEMS = 10


def paired_within_auc_interval(
    a: torch.Tensor, b: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor, reps: int, seed: int, level: float
) -> tuple[float, float]:
    """Percentile interval of ``within_problem_auc(a) - within_problem_auc(b)`` over ``reps``
    resamples of the problems (with replacement; a problem drawn twice counts twice, a problem
    without both kinds of candidate counts for nothing, as in ``within_problem_auc``)."""
    d = problem_aucs(a, labels, groups) - problem_aucs(b, labels, groups)
    # NOTE: summed by counts, as the verdicts recorded in head files were (``resample_means``)
    return bootstrap_interval(d, reps, level, seed, sum_by="counts")


def _row(score: torch.Tensor, y: torch.Tensor, gr: torch.Tensor) -> dict:
    return {"auc": auc(score, y), "within_auc": within_problem_auc(score, y, gr),
            "bon": float(bon_outcomes(score, y, gr).mean())}


def _flat(scores, labels, groups, lengths) -> tuple[torch.Tensor, ...]:
    s = torch.as_tensor(scores).detach().double().flatten()
    y = torch.as_tensor(labels).bool().flatten()
    gr = torch.as_tensor(groups).flatten()
    length = torch.as_tensor(lengths).double().flatten()
    if not (len(s) == len(y) == len(gr) == len(length)):
        raise ValueError(
            f"scores, labels, groups and lengths must have one entry per candidate, got "
            f"{len(s)}, {len(y)}, {len(gr)}, {len(length)}"
        )
    return s, y, gr, length


def _length_row(length: torch.Tensor, y: torch.Tensor, gr: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """The length baseline's row and its signed score (higher: the favoured direction)."""
    # NOTE: the direction is chosen on the very candidates it is measured on, which flatters the
    # length baseline: the conservative side when the question is whether the head beat it
    longer = auc(length, y)
    shorter = auc(-length, y)
    direction, signed = ("shorter", -length) if shorter > longer else ("longer", length)
    row = {"direction": direction, "auc": max(shorter, longer), "within_auc": within_problem_auc(signed, y, gr),
           "bon": float(bon_outcomes(signed, y, gr).mean())}
    return row, signed


def _logprobs(mean_logprobs, n: int) -> torch.Tensor | None:
    """The mean log-probs as float64 ``[n]``, or None where any is unknown: a missing log-prob is
    no evidence either way."""
    if mean_logprobs is None:
        return None
    lp = torch.as_tensor(mean_logprobs).double().flatten()
    if len(lp) != n:
        raise ValueError(f"mean_logprobs has {len(lp)} entries for {n} candidates")
    return None if torch.isnan(lp).any() else lp


def _outcome(diff: float, lo: float) -> str | None:
    if math.isnan(diff) or math.isnan(lo):
        return None
    if lo > 0:
        return "beats"
    return "barely beats" if diff > 0 else "does not beat"


def _verdict(out: dict, s: torch.Tensor, free: dict, y, gr, reps: int, seed: int, level: float) -> dict:
    """The head against the free baseline with the higher within-problem AUC (on equal AUCs
    length, cheaper still, stands)."""
    # NOTE: judged on the within-problem AUC, what Best-of-N uses: the pooled AUC also credits a
    # score for telling easy problems from hard ones, which picks no better candidate
    against = max(free, key=lambda k: (out[k]["within_auc"] if not math.isnan(out[k]["within_auc"]) else -1.0,
                                       k == "length"))
    head_auc, base_auc = out["head"]["within_auc"], out[against]["within_auc"]
    lo, hi = paired_within_auc_interval(s, free[against], y, gr, reps, seed, level)
    diff = head_auc - base_auc
    outcome = _outcome(diff, lo)
    return {
        "against": against,
        "head_auc": head_auc,
        "baseline_auc": base_auc,
        "difference": diff,
        "interval": [lo, hi],
        "level": level,
        "reps": reps,
        "seed": seed,
        "outcome": outcome,
        "text": verdict_text(outcome, baseline_name(out, against), head_auc, base_auc, diff, lo, hi, level,
                             out["problems"]),
    }


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
    s, y, gr, length = _flat(scores, labels, groups, lengths)
    sizes = [len(i) for i in problem_indices(gr)]
    out: dict = {"problems": len(sizes), "candidates": len(s), "n": sizes[0] if len(set(sizes)) == 1 else None}
    out["head"] = _row(s, y, gr)
    out["length"], signed = _length_row(length, y, gr)
    free = {"length": signed}
    lp = _logprobs(mean_logprobs, len(s))
    out["mean_logprob"] = None if lp is None else _row(lp, y, gr)
    if lp is not None:
        free["mean_logprob"] = lp
    oracle, rand = oracle_and_random(y, gr)
    out["oracle"] = {"bon": oracle}
    out["random"] = {"bon": rand}
    out["verdict"] = _verdict(out, s, free, y, gr, reps, seed, level)
    return out


def baseline_name(b: dict, key: str) -> str:
    """How a row of ``free_baselines`` is named for people."""
    if key == "length":
        return f"length ({b['length']['direction']} better)"
    return {"mean_logprob": "mean log-prob"}.get(key, key)


def verdict_text(outcome, name, head_auc, base_auc, diff, lo, hi, level, problems) -> str:
    """The verdict of ``free_baselines`` in one sentence, with its figures and how far to trust them."""
    pct = f"{100 * level:.0f}%"
    if outcome is None:
        return (
            f"no verdict against {name}: no validation problem has both a correct and an incorrect candidate "
            f"(head within-problem AUC {head_auc}, {name} {base_auc})"
        )
    figures = (
        f"within-problem AUC {head_auc:.3f} vs {base_auc:.3f}, difference {diff:+.3f} "
        f"({pct} interval {lo:+.3f} to {hi:+.3f}, "
        f"paired bootstrap over {plural(problems, 'validation problem')})"
    )
    text = f"the head {outcome} {name}: {figures}"
    if outcome == "barely beats":
        text += f"; the interval includes 0: on this data the head is not shown to do better than {name}"
    elif outcome == "does not beat" and hi < 0:
        text += f"; {name} does better"
    if problems < FEW_PROBLEMS:
        text += f"; with {plural(problems, 'validation problem')} the interval is rough: validate on more"
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
        f"validation: {plural(b['problems'], 'problem')}, {plural(b['candidates'], 'candidate')}",
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
