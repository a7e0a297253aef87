"""What pruning buys: Best-of-N with candidates stopped during generation beside full Best-of-N on
the same problems, and a sweep of settings replayed on full runs' per-token values.

Accuracy is BoN@N by a selector (DESIGN 2; ``select``, a :mod:`swift_fast.selection.by_value`
selector: SWIFT by default, a head-free one for a run without a head) over the candidates that
were not pruned (a pruned one is picked only when every candidate of its problem was); the
difference to full BoN@N is paired over problems with a percentile bootstrap interval
(``report.bootstrap_ci``). Cost is generated tokens, summed over all candidates, pruned ones up
to where they stopped.

The sweep replays :func:`swift_fast.selection.pruning.replay` on the candidates of a full run that carry
their per-token values (``swift_trace``: a run with ``trace`` on). With per-request seeds, a
pruned run samples the same tokens as the full run up to each pruning point (on the CPU; on a
GPU another batch make-up can change the logits' last bits, and with them a draw now and then),
so the replay predicts its tokens and its picks; measured runs check that prediction. Cost
counts the tokens the candidates kept; with a separate engine-core process a pruned candidate
may compute a step or two more before its abort lands, which is not counted.

Text for people: :func:`summary_text`, one comparison on a line; :func:`comparison_text`, the
lines ``swift-fast bon --prune`` prints under its table.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence

import torch

from ..data.datasets import DataError
from ..data.rollouts import Problem
from ..selection import bon, by_value
from ..selection.pruning import SIGNALS, PruneConfig, replay, running_confidence, running_swift, signal_lag
from .best_of_n import bootstrap_ci, selector_row
from .candidates import field_of

#: the signals that rank candidates by their running SWIFT score, which a run without a head lacks
SWIFT_SIGNALS = ("swift", "combined")

#: The sweep's baseline rows: the same policy ranking on a fresh random draw at every decision (the
#: mean over :data:`RANDOM_DRAWS` draws): what any signal has to beat at its token budget.
RANDOM = "random"
RANDOM_DRAWS = 5

#: Settings the sweep replays for each signal (``every`` follows ``warmup``): enough points to draw
#: accuracy against tokens, few enough to replay thousands of candidates in seconds.
SWEEP_WARMUPS = (4, 8, 16, 32, 64)
SWEEP_KEEPS = (0.75, 0.5, 0.25)


def signal_series(candidate: dict, cfg: PruneConfig, where: str = "") -> list:
    """A candidate's signal after each of its tokens, from its ``swift_trace`` (``combined``:
    ``(swift, confidence)`` pairs)."""
    tr = candidate.get("swift_trace")
    if not isinstance(tr, dict):
        raise DataError(
            f"{where}: a candidate has no per-token values (swift_trace): replaying a pruning policy needs a full run "
            "generated with trace on (`swift-fast bon --prune` records them)"
        )
    if cfg.signal == "confidence":
        return running_confidence(tr["confidence"], cfg.window)
    swift = running_swift(tr["gate_reward"], tr["gate"])
    if cfg.signal == "combined":
        return list(zip(swift, running_confidence(tr["confidence"], cfg.window)))
    return swift


@dataclass
class Outcome:
    """One way of running Best-of-N over ``P`` problems (first ``n`` candidates each)."""

    correct: torch.Tensor  # float64 [P]: 1 when the pick is correct
    tokens: torch.Tensor  # float64 [P]: tokens generated for the problem
    pruned: torch.Tensor  # bool [P, n]

    @property
    def accuracy(self) -> float:
        return self.correct.mean().item()

    @property
    def total_tokens(self) -> int:
        return int(self.tokens.sum().item())


def _matrix(problems: Sequence[Problem], key: str, n: int) -> torch.Tensor:
    return torch.tensor([[math.nan if c.get(key) is None else float(c[key]) for c in p.candidates[:n]]
                         for p in problems], dtype=torch.float64)


def _check(problems: Sequence[Problem], n: int, where: str) -> None:
    if not problems:
        raise DataError(f"{where}: no problems")
    short = [p.id for p in problems if len(p.candidates) < n]
    if short:
        raise DataError(f"{where}: {len(short)} problems have fewer than {n} candidates (first: {short[0]!r})")


def picks(problems: Sequence[Problem], n: int, pruned: torch.Tensor, select: str = "swift") -> torch.Tensor:
    """The candidate ``select`` picks in each problem (``[P]``), a pruned one only where all were:
    a value's highest (:func:`swift_fast.selection.bon.bon_select`, all problems at once), any
    other selector by :func:`swift_fast.selection.by_value.choose`, a vote on the graded answers."""
    kind, value = by_value.parse(select)
    if kind == "value":
        return bon.bon_select(_matrix(problems, by_value.FIELD[value], n), n, pruned=pruned)
    out = []
    for p, row in zip(problems, pruned.tolist()):
        cands = p.candidates[:n]
        values = {f: [c.get(field_of(c, f)) for c in cands] for f in by_value.FIELD.values()}
        answers = [None if c.get("answer") in (None, "") else str(c["answer"]) for c in cands]
        out.append(by_value.choose(values, select, answers, eligible=[not x for x in row]))
    return torch.tensor(out, dtype=torch.long)


def outcome(problems: Sequence[Problem], n: int, pruned: torch.Tensor | None = None,
            tokens: torch.Tensor | None = None, where: str = "rollouts", select: str = "swift") -> Outcome:
    """BoN@n by ``select`` (:func:`picks`) of rollouts as they are (``pruned`` and ``tokens``
    default to each candidate's ``swift_pruned`` and ``len(token_ids)``), or as a replay says
    they would be."""
    _check(problems, n, where)
    if pruned is None:
        pruned = torch.tensor([[bool(c.get("swift_pruned")) for c in p.candidates[:n]] for p in problems])
    if tokens is None:
        tokens = torch.tensor([[len(c["token_ids"]) for c in p.candidates[:n]] for p in problems], dtype=torch.float64)
    correct = torch.tensor([[bool(c.get("correct")) for c in p.candidates[:n]] for p in problems])
    pick = picks(problems, n, pruned, select)
    return Outcome(correct.gather(1, pick.view(-1, 1)).squeeze(1).double(), tokens.sum(1), pruned)


def replayed(problems: Sequence[Problem], cfg: PruneConfig, n: int, where: str = "rollouts",
             alignment: str = "predicting", select: str = "swift") -> Outcome:
    """The outcome by ``select`` the policy ``cfg`` would give on full-run rollouts (with
    ``swift_trace``) scored by a head of ``alignment``."""
    _check(problems, n, where)
    lag = signal_lag(cfg, alignment)
    pruned, tokens = [], []
    for p in problems:
        r = replay([signal_series(c, cfg, where) for c in p.candidates[:n]], cfg, lag)
        pruned.append(r.pruned)
        tokens.append(r.tokens)
    return outcome(problems, n, torch.tensor(pruned), torch.tensor(tokens, dtype=torch.float64), where, select)


def replayed_random(problems: Sequence[Problem], cfg: PruneConfig, n: int, draws: int = RANDOM_DRAWS,
                    alignment: str = "predicting", select: str = "swift") -> Outcome:
    """The policy's timing and keep fractions with random ranks: the expected outcome by ``select``
    over ``draws`` seeded draws (``correct`` and ``tokens`` are means; ``pruned`` is the first
    draw's), on the timing of the SWIFT signal of a head of ``alignment``."""
    _check(problems, n, "rollouts")
    cfg = PruneConfig(**{**cfg.to_dict(), "signal": "swift"})  # ranks one number per candidate
    lag = signal_lag(cfg, alignment)
    runs = []
    for d in range(draws):
        rng = random.Random(d)
        pruned, tokens = [], []
        for p in problems:
            r = replay([[rng.random() for _ in c["token_ids"]] for c in p.candidates[:n]], cfg, lag)
            pruned.append(r.pruned)
            tokens.append(r.tokens)
        runs.append(outcome(problems, n, torch.tensor(pruned), torch.tensor(tokens, dtype=torch.float64),
                            select=select))
    return Outcome(torch.stack([o.correct for o in runs]).mean(0), torch.stack([o.tokens for o in runs]).mean(0),
                   runs[0].pruned)


def compare(full: Outcome, other: Outcome, reps: int = 2000, select: str = "swift") -> dict:
    """``other`` against ``full`` on the same problems (both by ``select``): accuracy and its paired
    difference with a 95% interval, tokens and their ratio."""
    d = other.correct - full.correct
    lo, hi = bootstrap_ci(d, reps=reps)
    return {
        "accuracy": other.accuracy,
        "full_accuracy": full.accuracy,
        "difference": d.mean().item(),
        "ci95": [lo, hi],
        "tokens": other.total_tokens,
        "full_tokens": full.total_tokens,
        "token_fraction": other.total_tokens / max(full.total_tokens, 1),
        "pruned_candidates": int(other.pruned.sum().item()),
        "method": f"BoN@N by {selector_row(select)} over unpruned candidates; paired percentile bootstrap over "
                  f"problems, {reps} resamples",
    }


def sweep(problems: Sequence[Problem], n: int, base: PruneConfig | None = None, reps: int = 500,
          warmups: Sequence[int] = SWEEP_WARMUPS, keeps: Sequence[float] = SWEEP_KEEPS,
          alignment: str = "predicting", select: str = "swift", head: bool = True) -> list[dict]:
    """Replay a grid of settings (every signal, and the :data:`RANDOM` baseline; ``every = warmup``;
    ``min_keep`` and ``window`` from ``base``) on full-run rollouts scored by a head of
    ``alignment``, Best-of-N by ``select``; one row per setting with :func:`compare`'s fields.
    ``head`` False: rollouts without a head, no SWIFT signal (:data:`SWIFT_SIGNALS`)."""
    base = base or PruneConfig()
    full = outcome(problems, n, select=select)
    rows = []
    for signal in (*[s for s in SIGNALS if head or s not in SWIFT_SIGNALS], RANDOM):
        for w in warmups:
            for keep in keeps:
                cfg = PruneConfig(signal="swift" if signal == RANDOM else signal, warmup=w, every=w, keep=keep,
                                  min_keep=base.min_keep, window=base.window)
                run = (replayed_random(problems, cfg, n, alignment=alignment, select=select) if signal == RANDOM
                       else replayed(problems, cfg, n, alignment=alignment, select=select))
                rows.append({"settings": {**cfg.to_dict(), "signal": signal},
                             **compare(full, run, reps=reps, select=select)})
    return rows


def at_budget(rows: Sequence[dict], fraction: float) -> dict[str, dict | None]:
    """Per signal (and the random baseline), the most accurate swept setting that generates at most
    ``fraction`` of the full run's tokens (None when none does): the equal-budget comparison."""
    out: dict[str, dict | None] = {}
    for signal in (*SIGNALS, RANDOM):
        ok = [r for r in rows if r["settings"]["signal"] == signal and r["token_fraction"] <= fraction]
        out[signal] = max(ok, key=lambda r: (r["accuracy"], -r["token_fraction"])) if ok else None
    return out


def recommend(rows: Sequence[dict], max_drop: float = 0.01, signal: str = "swift") -> dict | None:
    """The swept ``signal`` setting that generates the fewest tokens while its accuracy stays within
    ``max_drop`` of full Best-of-N (ties: the more accurate); None when none does. Run it on
    problems other than those it is reported on (the demo uses its training problems)."""
    ok = [r for r in rows if r["settings"]["signal"] == signal and r["accuracy"] >= r["full_accuracy"] - max_drop]
    return min(ok, key=lambda r: (r["token_fraction"], -r["accuracy"])) if ok else None


def plot_sweep(rows: Sequence[dict], path: str, title: str = "Pruning during Best-of-N",
               measured: Sequence[tuple[str, float, float]] = (), by: str = "SWIFT") -> str:
    """Accuracy against generated tokens (fraction of full Best-of-N) for each swept setting, one
    colour per signal, full Best-of-N at (1, its accuracy); ``measured``: ``(label, fraction,
    accuracy)`` of engine runs, drawn as stars; ``by``: the row Best-of-N chooses by."""
    from .plotting import figure, save, titles

    fig, ax = figure(8.0, 5.0)
    colours = {"swift": "tab:blue", "confidence": "tab:orange", "combined": "tab:green", RANDOM: "tab:gray"}
    labels = {"swift": "running SWIFT score", "confidence": "DeepConf lowest-group confidence",
              "combined": "both (rank combination)", RANDOM: "random ranks (baseline)"}
    for signal, colour in colours.items():
        pts = sorted((r["token_fraction"], 100 * r["accuracy"]) for r in rows if r["settings"]["signal"] == signal)
        if pts:
            ax.scatter(*zip(*pts), color=colour, alpha=0.6, s=18, label=f"pruned by {labels[signal]} (replayed)")
            frontier, best = [], -1.0
            for x, y in pts:
                if y > best:
                    frontier.append((x, y))
                    best = y
            ax.plot(*zip(*frontier), color=colour, lw=1.2)
    if rows:
        ax.scatter([1.0], [100 * rows[0]["full_accuracy"]], color="black", marker="s", s=40, label="full Best-of-N",
                   zorder=3)
    for label, x, y in measured:
        ax.scatter([x], [100 * y], marker="*", s=140, zorder=4, label=label, edgecolor="black")
    ax.set_xlabel("tokens generated, as a fraction of full Best-of-N")
    ax.set_ylabel(f"Best-of-N accuracy, choosing by {by} (%)")
    ax.set_xlim(0, 1.05)
    titles(fig, ax, title, "each dot: one pruning setting (warm-up, interval, share kept) replayed on the full "
           "run's per-token values; line: the best accuracy reached at each token budget; upper left is better")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save(fig, path)


def summary_text(c: dict, label: str = "pruned") -> str:
    """One line: tokens, accuracy and the paired difference of a :func:`compare` result."""
    lo, hi = c["ci95"]
    return (
        f"{label}: {c['tokens']:,} tokens ({100 * c['token_fraction']:.1f}% of full Best-of-N's {c['full_tokens']:,}), "
        f"BoN accuracy {100 * c['accuracy']:.1f}% vs {100 * c['full_accuracy']:.1f}% "
        f"(difference {100 * c['difference']:+.1f} points, 95% CI [{100 * lo:+.1f}, {100 * hi:+.1f}])"
    )


def _settings_text(settings: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def comparison_text(c: dict, n: int) -> str:
    """Lines for people of a pruned run beside the full one (``swift_fast.jobs.bon``'s comparison, the
    summary JSON's ``prune``: ``settings``, ``measured`` and ``replayed`` :func:`compare` results,
    ``seconds`` or None, ``sweep`` rows, ``plot`` path or None), with each signal's best swept
    setting at the pruned run's token budget (:func:`at_budget`)."""
    lines = [
        f"pruning ({_settings_text(c['settings'])}), BoN@{n}"
        f"{' by ' + selector_row(c['select']) if c.get('select') else ''}:",
        "  " + summary_text(c["measured"], "pruned run"),
        "  " + summary_text(c["replayed"], "replayed on the full run"),
    ]
    lines.append(_wall_time(c["seconds"], "pruned"))
    frac = c["measured"]["token_fraction"]  # the pruned run's budget: each signal at equal cost
    swept = {r["settings"]["signal"] for r in c["sweep"]}  # without a head, no SWIFT signal was
    for signal, r in at_budget(c["sweep"], frac).items():
        if signal not in swept:
            continue
        what = "no swept setting" if r is None else summary_text(
            r, f"best {signal} setting ({_settings_text(r['settings'])})")
        lines.append(f"  at <= {100 * frac:.0f}% of the tokens, {signal}: {what}")
    if c["plot"] is not None:
        lines.append(f"  plot: {c['plot']}")
    return "\n".join(lines)


def deepconf_text(c: dict, n: int) -> str:
    """Lines for people of a DeepConf online run beside the full one (``swift_fast.jobs.bon``'s
    comparison, the summary JSON's ``deepconf``)."""
    lines = [f"DeepConf online ({_settings_text(c['settings'])}), BoN@{n}:",
             "  " + summary_text(c["measured"], f"by {selector_row(c['select'])}"),
             "  " + summary_text(c["by_vote"], "by DeepConf's confidence-weighted vote"),
             f"  stopped: {c['stopped']['threshold']} candidates below the threshold, {c['stopped']['consensus']} "
             f"by consensus{'' if c.get('answer') else ' (no answer kind: no consensus stop)'}; the replay on the "
             f"full run reproduces {100 * c['replay_agreement']:.1f}% of {c['replayed_candidates']} decisions"]
    lines.append(_wall_time(c["seconds"], "deepconf", "DeepConf"))
    return "\n".join(lines)


def _wall_time(seconds: dict | None, key: str, label: str | None = None) -> str:
    """The line comparing a run's vLLM wall time (``seconds[key]``) with the full run's."""
    if seconds is None:
        return "  vLLM wall time: not compared (a run resumed from earlier output)"
    full, other = seconds["full"], seconds[key]
    return (f"  vLLM wall time: full {full:.1f} s, {label or key} {other:.1f} s "
            f"({100 * other / max(full, 1e-9):.0f}% of the full run's)")
