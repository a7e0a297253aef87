"""Best-of-N reports: accuracy of each selector at each k, with bootstrap confidence intervals,
as a text table, a JSON summary and a PNG plot. Shared by ``eval``, ``bon`` and the demo.

Beside the scores under test, a report carries the head-free selectors a reader needs to judge
them (the *trivial* ones: they need no head and no reward model): majority vote, longest and
shortest candidate, highest mean token log-prob, DeepConf's lowest-group, tail and bottom-10%
confidence (:data:`TRIVIAL`, from the candidates' :data:`SIGNAL_FIELDS`) and DeepConf's
confidence-weighted majority votes (:data:`WEIGHTED_VOTES`: each candidate adds its confidence to
its answer, as ``vote:<value>`` of :mod:`swift_fast.selection.by_value`). Without a head the
rollouts have no SWIFT column and the report has no SWIFT rows: its headline is then one of the
head-free rows (:func:`selector_row` names the row of any selector).

The candidates themselves (:class:`Candidates`, :func:`gather`, the signal columns) come from
:mod:`swift_fast.reports.candidates`, re-exported here so that every report reads one module."""

from __future__ import annotations

import csv
import json
import re
import textwrap
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import torch

from ..selection import bon, by_value
from ..selection.bootstrap import bootstrap_interval

# the candidates' names, re-exported (``X as X``): eval, bon, the demo and the tests read them here
from .candidates import FALLBACK as FALLBACK
from .candidates import SIGNAL_FIELDS as SIGNAL_FIELDS
from .candidates import TRACE_FIELDS as TRACE_FIELDS
from .candidates import Candidates
from .candidates import gather as gather
from .candidates import record_trace_signals as record_trace_signals
from .candidates import signal_columns as signal_columns
from .candidates import trace_signals as trace_signals

#: The trivial selectors' rows: name -> (column, sign); the highest ``sign * value`` wins.
TRIVIAL = {
    "longest": ("num_tokens", 1.0),
    "shortest": ("num_tokens", -1.0),
    "mean logprob": ("mean_logprob", 1.0),
    "confidence (lowest group)": ("confidence_lowest_group", 1.0),
    "confidence (tail)": ("confidence_tail", 1.0),
    "confidence (bottom 10%)": ("confidence_bottom10", 1.0),
}

#: DeepConf's confidence-weighted majority votes: name -> column; the weight of a candidate's
#: answer is ``by_value.VOTE_WEIGHTS`` of the column (the confidence itself).
WEIGHTED_VOTES = {
    "confidence (lowest group) weighted vote": "confidence_lowest_group",
    "confidence (tail) weighted vote": "confidence_tail",
    "confidence (bottom 10%) weighted vote": "confidence_bottom10",
}


# A selector maps (candidates, k) to per-problem outcomes in [0, 1] (1 = correct pick); an
# expectation such as random choice gives fractions.
Selector = Callable[[Candidates, int], torch.Tensor]


def _picked(c: Candidates, idx: torch.Tensor) -> torch.Tensor:
    return c.correct.gather(1, idx.view(-1, 1)).squeeze(1).double()


def random_choice(c: Candidates, k: int) -> torch.Tensor:
    """Expected accuracy of a uniformly random pick among the first k (the unpruned ones): :func:`bon.random_pick`."""
    return bon.random_pick(c.correct, k, c.pruned)


def _answers(c: Candidates, k: int) -> list[list[Hashable | None]]:
    """Answers that may vote: a pruned candidate's (an unfinished text) does not, unless every one was."""
    if c.pruned is None:
        return c.answers
    ok = bon.eligible(c.pruned, k).tolist()
    return [[a if okp[i] else None for i, a in enumerate(row[:k])] for row, okp in zip(c.answers, ok)]


def _col(c: Candidates, key: str, k: int) -> torch.Tensor:
    return c.scores[key] if c.pruned is None else bon.exclude_pruned(c.scores[key], c.pruned, k)


#: Picks the candidate a selector chooses: (candidates, k) -> index ``[P]`` among the first k.
#: Every row that chooses one candidate is a chooser's outcome (:func:`outcome_of`), so the
#: outcomes in a table and the picks the demo's page shows are the same selection.
Chooser = Callable[[Candidates, int], torch.Tensor]


def outcome_of(choose: Chooser) -> Selector:
    """The selector whose outcome is the correctness of ``choose``'s pick."""
    return lambda c, k: _picked(c, choose(c, k))


def choose_majority(c: Candidates, k: int) -> torch.Tensor:
    return bon.majority_vote(_answers(c, k), k)


majority: Selector = outcome_of(choose_majority)


def oracle(c: Candidates, k: int) -> torch.Tensor:
    """pass@k over the unpruned candidates (all, where all were pruned): :func:`bon.oracle`."""
    return bon.oracle(c.correct, k, c.pruned)


def choose_best(key: str) -> Chooser:
    return lambda c, k: bon.bon_select(c.scores[key], k, pruned=c.pruned)


def best_of(key: str) -> Selector:
    return outcome_of(choose_best(key))


#: a column's value in :mod:`swift_fast.selection.by_value` (``swift_score`` is ``swift``)
_VALUE_OF = {field: value for value, field in by_value.FIELD.items()}


def vote_weight(key: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The weight a column's value gives its candidate's answer in a weighted vote: the value's
    ``by_value.VOTE_WEIGHTS`` (the confidences themselves, ``sigmoid`` of SWIFT), ``sigmoid`` for
    any other column; a missing value (NaN, which reaches the weight as ``-inf``) adds nothing."""
    fn = by_value.VOTE_WEIGHTS.get(_VALUE_OF.get(key, ""), torch.sigmoid)
    return lambda x: torch.where(x == float("-inf"), 0.0, fn(x))


def choose_weighted(key: str, weight: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Chooser:
    """A vote weighted by column ``key``: ``weight`` of its values (default :func:`vote_weight`)."""
    fn = weight or vote_weight(key)
    return lambda c, k: bon.weighted_vote(_answers(c, k), c.scores[key], k, weight=fn)


def weighted(key: str) -> Selector:
    return outcome_of(choose_weighted(key))


def _among_eligible(c: Candidates, k: int, idx: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """``idx`` unless it is a pruned candidate; then the eligible one with the highest ``key``
    (ties: lowest index). ``key``: ``[P, k]``, higher is better."""
    if c.pruned is None:
        return idx
    ok = bon.eligible(c.pruned, k)
    fallback = bon.bon_select(torch.where(ok, key, float("nan")), k, pruned=~ok)
    return torch.where(ok.gather(1, idx.view(-1, 1)).squeeze(1), idx, fallback)


def choose_ranked(a: str, b: str) -> Chooser:
    def choose(c, k):
        sa, sb = _col(c, a, k), _col(c, b, k)
        idx = bon.combine_rank(sa, sb, k)
        return _among_eligible(c, k, idx, -torch.maximum(bon.ranks(sa, k), bon.ranks(sb, k)).double())

    return choose


def ranked(a: str, b: str) -> Selector:
    return outcome_of(choose_ranked(a, b))


def choose_scaled(a: str, b: str) -> Chooser:
    def choose(c, k):
        sa, sb = _col(c, a, k), _col(c, b, k)
        idx = bon.combine_scaled(sa, sb, k)
        return _among_eligible(c, k, idx, (bon.minmax(sa, k) + bon.minmax(sb, k)) / 2)

    return choose


def scaled(a: str, b: str) -> Selector:
    return outcome_of(choose_scaled(a, b))


def choose_signed(key: str, sign: float) -> Chooser:
    """Best-of-k by ``sign * scores[key]`` (ties: lowest index; NaN never wins)."""
    return lambda c, k: bon.bon_select(sign * c.scores[key], k, pruned=c.pruned)


def signed(key: str, sign: float) -> Selector:
    """The outcome of :func:`choose_signed`."""
    return outcome_of(choose_signed(key, sign))


def trivial_choosers(c: Candidates) -> dict[str, Chooser]:
    """The trivial intrinsic selectors whose column ``c`` has (``gather(..., signals=True)``), as
    choosers: :data:`TRIVIAL` (longest, shortest, mean logprob, the three confidences), then
    :data:`WEIGHTED_VOTES`. Majority vote, the other trivial selector, is a standard row."""
    rows = {name: choose_signed(key, sign) for name, (key, sign) in TRIVIAL.items() if key in c.scores}
    rows.update({name: choose_weighted(key) for name, key in WEIGHTED_VOTES.items() if key in c.scores})
    return rows


def trivial_selectors(c: Candidates) -> dict[str, Selector]:
    """:func:`trivial_choosers` as selectors (the correctness of each pick)."""
    return {name: outcome_of(choose) for name, choose in trivial_choosers(c).items()}


#: A score column's row name in every report (README, demo, ``bon``, ``eval``): the product's
#: scores by their papers' names, the head-free values by their :data:`TRIVIAL` rows' names, any
#: other column by its own.
SELECTOR_NAMES = {"swift_score": "SWIFT", "sar": "SAR",
                  **{key: name for name, (key, sign) in TRIVIAL.items() if key != "num_tokens"}}

#: Rows that are not a score under test: the baselines and the bound.
BASELINE_ROWS = ("random", "majority", "oracle pass@k")


def selector_name(key: str) -> str:
    return SELECTOR_NAMES.get(key, key)


def selector_key(name: str) -> str:
    """A row's key in the JSON and CSV reports: its display name in snake_case, stable across
    runs and safe in any tool ("confidence (lowest group)" -> ``confidence_lowest_group``,
    "SWIFT+SAR rank" -> ``swift_sar_rank``, "oracle pass@k" -> ``oracle_pass_at_k``). The display
    name goes beside it (``name``). "bottom 10%" is spelled as its value is
    (``confidence_bottom10``), so a row's key and the plugin's value name agree."""
    words = re.findall(r"[a-z0-9]+", name.lower().replace("@", " at ").replace("bottom 10%", "bottom10"))
    return "_".join(words) or "selector"


def selector_row(selector: str) -> str:
    """The row of a :mod:`swift_fast.selection.by_value` selector (``swift-fast bon --select``,
    the plugin's ``select``) in a report: ``"confidence_tail"`` -> "confidence (tail)",
    ``"vote"`` -> "majority", ``"vote:confidence_tail"`` -> "confidence (tail) weighted vote",
    ``"rank"`` -> "SWIFT+SAR rank". Raises ``by_value.SelectorError`` for an unknown name."""
    kind, value = by_value.parse(selector)
    if kind in by_value.COMBINATIONS:
        return f"{selector_name('swift_score')}+{selector_name('sar')} {kind}"
    if kind == "vote":
        if value is None:
            return "majority"
        t = by_value.temperature(selector)
        return f"{selector_name(by_value.FIELD[value])} weighted vote" + ("" if t is None else f" (T={t:g})")
    return selector_name(by_value.FIELD[value])


def selector_chooser(selector: str) -> Chooser:
    """The chooser of a :mod:`swift_fast.selection.by_value` selector over a report's columns
    (named as the rollouts name them: ``swift_score``, ``sar``, the head-free values)."""
    kind, value = by_value.parse(selector)
    if kind == "rank":
        return choose_ranked("swift_score", "sar")
    if kind == "scaled":
        return choose_scaled("swift_score", "sar")
    if kind == "vote":
        if value is None:
            return choose_majority
        if by_value.temperature(selector) is None:
            return choose_weighted(by_value.FIELD[value])
        # a missing value reaches the weight as -inf (``bon._scores``), which weighs exp(-inf) = 0
        return choose_weighted(by_value.FIELD[value], by_value.vote_weight(selector))
    return choose_best(by_value.FIELD[value])


def with_selector(rows: dict[str, Selector], selector: str) -> dict[str, Selector]:
    """``rows`` with the row of ``selector`` (:func:`selector_row`), added before the oracle when
    the standard rows lack it (a vote weighted by SAR or by the mean log-prob)."""
    name = selector_row(selector)
    if name in rows:
        return rows
    out = {k: v for k, v in rows.items() if k != "oracle pass@k"}
    out[name] = outcome_of(selector_chooser(selector))
    if "oracle pass@k" in rows:
        out["oracle pass@k"] = rows["oracle pass@k"]
    return out


def selector_keys(names: Sequence[str]) -> dict[str, str]:
    """Display name -> :func:`selector_key` for a table's rows; two names with the same key (a
    score column named like another row) get ``_2``, ``_3``, ... in row order."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        key, i = selector_key(name), 1
        while key in taken:
            i += 1
            key = f"{selector_key(name)}_{i}"
        out[name] = key
        taken.add(key)
    return out


def standard_choosers(
    score: str | None,
    external: str | None = None,
    sar: str | None = None,
    trivial: dict[str, Chooser] | None = None,
) -> dict[str, Chooser]:
    """The report's rows that choose one candidate, in table order: majority, the ``trivial``
    choosers (see :func:`trivial_choosers`), then selection by each score column (named by
    :func:`selector_name`) and their combinations."""
    rows: dict[str, Chooser] = {"majority": choose_majority}
    rows.update(trivial or {})
    for key in (score, sar, external):
        if key:
            rows[selector_name(key)] = choose_best(key)
    if score:
        rows[f"{selector_name(score)} weighted vote"] = choose_weighted(score)
    for other in (sar, external):
        if score and other:
            rows[f"{selector_name(score)}+{selector_name(other)} rank"] = choose_ranked(score, other)
            rows[f"{selector_name(score)}+{selector_name(other)} scaled"] = choose_scaled(score, other)
    return rows


def standard_selectors(
    score: str | None,
    external: str | None = None,
    sar: str | None = None,
    trivial: dict[str, Selector] | None = None,
) -> dict[str, Selector]:
    """The report's rows: random, majority, the ``trivial`` selectors (see
    :func:`trivial_selectors`), then selection by each score column (named by
    :func:`selector_name`) and their combinations (:func:`standard_choosers`), oracle last."""
    chosen = {name: outcome_of(choose) for name, choose in standard_choosers(score, external, sar).items()}
    rows: dict[str, Selector] = {"random": random_choice, "majority": chosen.pop("majority")}
    rows.update(trivial or {})
    rows.update(chosen)
    rows["oracle pass@k"] = oracle
    return rows


#: Percentile bootstrap interval of the mean of per-problem outcomes, resampling problems
#: (``bootstrap_ci(outcomes, reps=2000, level=0.95, seed=0)``; a paired difference: pass the
#: per-problem differences). The one bootstrap over problems, under the name reports use.
bootstrap_ci = bootstrap_interval


@dataclass
class Table:
    ks: list[int]
    rows: dict[str, dict[int, float]]
    ci: dict[str, dict[int, tuple[float, float]]]
    outcomes: dict[str, dict[int, torch.Tensor]]
    num_problems: int

    def row_keys(self) -> dict[str, str]:
        """Row (display name) -> its stable key in the JSON and CSV reports (:func:`selector_keys`)."""
        return selector_keys(list(self.rows))

    def to_json(self) -> dict:
        """``{"num_problems", "ks", "selectors": {key: {"name", "accuracy": {k: acc}, "ci95": {k: [lo, hi]}}}}``,
        rows in table order under their snake_case keys (:func:`selector_key`), ``k`` as a string."""
        return {
            "num_problems": self.num_problems,
            "ks": self.ks,
            "selectors": {
                key: {
                    "name": name,
                    "accuracy": {str(k): v for k, v in self.rows[name].items()},
                    "ci95": {str(k): list(v) for k, v in self.ci[name].items()},
                }
                for name, key in self.row_keys().items()
            },
        }

    def difference_ci(self, a: str, b: str, k: int, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
        """Paired bootstrap of ``acc(a) - acc(b)`` at ``k``: (difference, low, high)."""
        d = self.outcomes[a][k] - self.outcomes[b][k]
        lo, hi = bootstrap_ci(d, reps=reps, seed=seed)
        return d.mean().item(), lo, hi


def bon_table(
    c: Candidates, selectors: dict[str, Selector], ks: Sequence[int] | None = None, reps: int = 2000, seed: int = 0
) -> Table:
    ks = list(ks or bon.default_ks(c.n))
    bad = [k for k in ks if not 1 <= k <= c.n]
    if bad:
        raise ValueError(f"k values {bad} are outside 1..{c.n} (candidates per problem)")
    rows, ci, outs = {}, {}, {}
    for name, sel in selectors.items():
        rows[name], ci[name], outs[name] = {}, {}, {}
        for k in ks:
            o = sel(c, k)
            outs[name][k] = o
            rows[name][k] = o.mean().item()
            ci[name][k] = bootstrap_ci(o, reps=reps, seed=seed)
    return Table(ks=ks, rows=rows, ci=ci, outcomes=outs, num_problems=len(c.ids))


def format_table(t: Table, ci: bool = True) -> str:
    """Accuracy in percent, one row per selector and one column per k; ``[lo, hi]`` 95% bootstrap CI."""
    def cell(name, k):
        v = 100 * t.rows[name][k]
        if not ci:
            return f"{v:5.1f}"
        lo, hi = (100 * x for x in t.ci[name][k])
        return f"{v:5.1f} [{lo:4.1f},{hi:5.1f}]"

    width = max(len(n) for n in t.rows) + 2
    cells = {n: [cell(n, k) for k in t.ks] for n in t.rows}
    cw = max(len(x) for row in cells.values() for x in row) + 2
    head = "selector".ljust(width) + "".join(f"k={k}".rjust(cw) for k in t.ks)
    lines = [head, "-" * len(head)]
    for n, row in cells.items():
        lines.append(n.ljust(width) + "".join(x.rjust(cw) for x in row))
    lines.append(f"accuracy % over {t.num_problems} problems" + (", 95% bootstrap CI over problems" if ci else ""))
    return "\n".join(lines)


#: How :func:`plot` draws each kind of row: the score under test (the first of ``highlight``) on
#: top, the best trivial selector and the oracle prominent, every other row muted (thin, grey).
PLOT_STYLES = {
    "score": dict(lw=2.8, color="tab:blue", zorder=6, marker="o", ms=4),
    "score2": dict(lw=2.0, color="tab:purple", zorder=5, marker="o", ms=3.5),  # further rows of ``highlight``
    # hollow markers larger than the score's line: where a line runs under the score's, its
    # points still show around the score's
    "best trivial": dict(lw=2.0, color="tab:orange", zorder=4, marker="D", ms=6.5, mfc="none", mew=1.4),
    "oracle": dict(lw=1.6, ls="--", color="black", zorder=3, marker="s", ms=8.5, mfc="none", mew=1.2),
    "muted": dict(lw=0.9, color="#9a9a9a", alpha=0.8, zorder=1, marker="o", ms=2),
}


def plot_roles(t: Table, highlight: Sequence[str] = ("SWIFT",)) -> dict[str, str]:
    """Row -> its role in :func:`plot` (a key of :data:`PLOT_STYLES`): the first ``highlight`` row
    present is "score", further ones "score2"; the best trivial selector at the largest k
    (:func:`best_trivial_row`, the score itself left out: a head-free headline is a trivial row)
    "best trivial"; oracle pass@k "oracle"; every other row "muted"."""
    shown = [r for r in highlight if r in t.rows]
    best = best_trivial_row(t, exclude=shown[0] if shown else None)
    roles = {}
    for name in t.rows:
        roles[name] = ("score" if shown[:1] == [name] else "score2" if name in shown else
                       "oracle" if name == "oracle pass@k" else "best trivial" if name == best else "muted")
    return roles


def plot(t: Table, path: str, title: str = "Best-of-N accuracy", highlight: Sequence[str] = ("SWIFT",)) -> str:
    """Accuracy against k (log2 axis), one line per selector; PNG at ``path``. Three lines carry the
    figure (:func:`plot_roles`, :data:`PLOT_STYLES`): the score under test (the first of
    ``highlight``, bold blue, with its 95% CI band, drawn on top so that the oracle cannot hide it
    where the two coincide), the best trivial selector at the largest k (orange) and the oracle
    (black, dashed); every other row is thin and grey, under one legend entry that names them:
    a dozen coloured lines tangle, and the table beside the plot has their numbers."""
    from .plotting import figure, pyplot, save, titles

    plt = pyplot()
    fig, ax = figure(9.0, 4.8)
    roles = plot_roles(t, highlight)
    banded = [r for r, role in roles.items() if role in ("score", "score2")]
    muted = [r for r, role in roles.items() if role == "muted"]
    handles = {}
    for name, role in roles.items():
        ys = [100 * t.rows[name][k] for k in t.ks]
        style = PLOT_STYLES[role]
        (line,) = ax.plot(t.ks, ys, label=name, **style)
        if role != "muted":
            handles[name] = line
        if name in banded:
            lo = [100 * t.ci[name][k][0] for k in t.ks]
            hi = [100 * t.ci[name][k][1] for k in t.ks]
            ax.fill_between(t.ks, lo, hi, alpha=0.15, color=line.get_color(), zorder=style["zorder"] - 0.5, lw=0)
    order = [r for r in roles if roles[r] in ("score", "score2")] + [
        r for r in roles if roles[r] == "best trivial"] + [r for r in roles if roles[r] == "oracle"]
    top = max(t.ks)
    labels = {r: f"{r}{' (best trivial selector)' if roles[r] == 'best trivial' else ''}: "
                 f"{100 * t.rows[r][top]:.1f}% at k={top}" for r in order}
    legend_handles = [handles[r] for r in order]
    legend_labels = [labels[r] for r in order]
    if muted:
        legend_handles.append(plt.Line2D([], [], **{k: v for k, v in PLOT_STYLES["muted"].items() if k != "zorder"}))
        legend_labels.append("other selectors:\n" + textwrap.fill(", ".join(muted), 28))
    ax.set_xscale("log", base=2)
    ax.set_xticks(t.ks)
    ax.set_xticklabels([str(k) for k in t.ks])
    ax.set_xlabel("k: candidates per problem the selector chooses among (the first k generated)")
    ax.set_ylabel("accuracy of the chosen candidate (%)")
    band = f"; band: 95% bootstrap CI of {', '.join(banded)}" if banded else ""
    titles(fig, ax, title, f"Best-of-N over {t.num_problems} problems: each line is one way to choose a candidate"
           f"{band}; oracle: any of the k is correct; grey: the other selectors (numbers in the table)",
           legend_width=2.2)
    ax.grid(alpha=0.3)
    ax.legend(legend_handles, legend_labels, fontsize=7.5, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save(fig, path)


def save_json(t: Table, path: str, **extra) -> str:
    """:meth:`Table.to_json` and ``extra`` (such as ``summary=``, :func:`selection_summary`) as JSON at ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**t.to_json(), **extra}, f, indent=2)
    return path


#: The columns of :func:`save_csv`: one line per selector and k, accuracy and its 95% interval as fractions.
CSV_COLUMNS = ("selector", "name", "k", "accuracy", "ci95_low", "ci95_high")


def save_csv(t: Table, path: str) -> str:
    """The table as CSV at ``path``: :data:`CSV_COLUMNS`, one line per selector (its stable key and
    display name, as in :meth:`Table.to_json`) and k, in table order; accuracies as fractions."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for name, key in t.row_keys().items():
            for k in t.ks:
                lo, hi = t.ci[name][k]
                w.writerow([key, name, k, t.rows[name][k], lo, hi])
    return path


BOOTSTRAP_METHOD = "paired percentile bootstrap over problems, {reps} resamples"


def selection_summary(c: Candidates, t: Table, score: str = "SWIFT", reps: int = 2000) -> dict:
    """What a reader of a Best-of-N table needs at ``k = max(t.ks)``, for the row ``score`` (the
    headline: SWIFT with a head, else the selector the run chose, :func:`selector_row`):

    - the single-sample accuracy: per problem the mean correctness of its first k candidates
      (the expectation of one sample; the k=1 column is the first candidate alone), and the
      paired difference ``score@k`` minus it;
    - the best trivial selector other than ``score`` itself (:func:`trivial_rows`; the first of
      the best on a tie) and the paired difference ``score@k`` minus it (None where the table
      has no other);
    - the best score row (every row that is neither a baseline nor trivial; ``score`` when there
      is none, as in a report without a head) against majority;
    - how many candidates stopped at the length limit, and how many of those were graded
      correct (under the strict rule of ``swift_fast.grading``, those that completed a final
      answer statement before the limit).

    Differences carry a 95% paired percentile bootstrap interval over problems (``reps``
    resamples, :func:`bootstrap_ci`). The JSON keys keep their names whatever ``score`` is
    (``swift_minus_single``: the headline minus a single sample)."""
    k = max(t.ks)
    if score not in t.rows:
        raise ValueError(f"no row {score!r} in the table (rows: {', '.join(t.rows)})")
    method = BOOTSTRAP_METHOD.format(reps=reps)
    # NOTE: over all k candidates, pruned ones included, as this figure always was; the random row
    # picks among the unpruned only
    single = bon.random_pick(c.correct, k)
    d = t.outcomes[score][k] - single
    lo, hi = bootstrap_ci(d, reps=reps)
    trivial = trivial_rows(t)
    internal = [r for r in t.rows if r not in BASELINE_ROWS and r not in trivial] or [score]
    best_internal = max(internal, key=lambda r: t.rows[r][k])
    keys = t.row_keys()

    def row(name: str, **more) -> dict:  # a row as every summary names one: its key, its display name
        return {"selector": keys[name], "name": name, **more}

    out = {
        "problems": t.num_problems,
        "k": k,
        "score": row(score),
        "single_sample_accuracy": single.mean().item(),
        "swift_minus_single": {"difference": d.mean().item(), "ci95": [lo, hi], "method": method},
        "best_internal": row(best_internal, accuracy=t.rows[best_internal][k]),
        "majority": t.rows["majority"][k],
        "trivial": {keys[r]: {"name": r, "accuracy": t.rows[r][k]} for r in trivial},
    }
    truncated = c.truncated[:, :k] if c.truncated is not None else torch.zeros_like(c.correct[:, :k])
    out["candidates"] = int(c.correct[:, :k].numel())
    out["truncated"] = {"candidates": int(truncated.sum()), "graded_correct": int((truncated & c.correct[:, :k]).sum())}
    best_trivial = best_trivial_row(t, k, exclude=score)
    above = False
    if best_trivial is None:
        out["best_trivial"] = out["swift_minus_best_trivial"] = None
    else:
        dt, dt_lo, dt_hi = t.difference_ci(score, best_trivial, k, reps=reps)
        out["best_trivial"] = row(best_trivial, accuracy=t.rows[best_trivial][k])
        out["swift_minus_best_trivial"] = row(best_trivial, difference=dt, ci95=[dt_lo, dt_hi], method=method)
        above = dt_lo > 0
    out["bar"] = {
        "swift_10_points_over_single": d.mean().item() >= 0.10 and lo > 0,
        "best_internal_at_least_majority": t.rows[best_internal][k] >= t.rows["majority"][k],
        "swift_above_best_trivial": above,
    }
    return out


def trivial_rows(t: Table) -> list[str]:
    """The table's trivial selectors: the :data:`TRIVIAL` rows present, the
    :data:`WEIGHTED_VOTES` present, then majority vote."""
    return [r for r in (*TRIVIAL, *WEIGHTED_VOTES, "majority") if r in t.rows]


def best_trivial_row(t: Table, k: int | None = None, exclude: str | None = None) -> str | None:
    """The trivial selector (:func:`trivial_rows`, but ``exclude``) with the highest accuracy at
    ``k`` (default the largest), the first of the best on a tie; None when the table has none."""
    k = max(t.ks) if k is None else k
    rows = [r for r in trivial_rows(t) if r != exclude]
    return max(rows, key=lambda r: t.rows[r][k]) if rows else None


def _points(d: dict) -> str:
    return (f"{100 * d['difference']:+.1f} points, 95% CI "
            f"[{100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}]")


def summary_text(s: dict) -> str:
    """The lines under a table: the score against a single sample and against the best trivial
    selector, the best score row against majority, and the truncated candidates."""
    d = s["swift_minus_single"]
    k, name = s["k"], s["score"]["name"]
    lines = [f"selected by {s['select']['selector']} ({s['select']['by']}; --select chooses another)"] if s.get(
        "select") else []
    lines += [
        f"single-sample accuracy {100 * s['single_sample_accuracy']:.1f}% (mean over all {k} candidates of each "
        f"problem); {name}@{k} minus single sample {_points(d)} ({d['method']})",
    ]
    if s.get("best_trivial") is not None:
        trivial = s["best_trivial"]["name"]
        lines.append(f"best trivial selector at k={k}: {trivial} {100 * s['best_trivial']['accuracy']:.1f}%; "
                     f"{name}@{k} minus {trivial} {_points(s['swift_minus_best_trivial'])} (paired, same bootstrap)")
    lines.append(f"best score at k={k}: {s['best_internal']['name']} {100 * s['best_internal']['accuracy']:.1f}% vs "
                 f"majority {100 * s['majority']:.1f}%")
    tr = s.get("truncated")
    if tr is not None:
        lines.append(
            f"truncated: {tr['candidates']:,} of {s['candidates']:,} candidates stopped at the length limit"
            + (f" ({tr['graded_correct']:,} of them graded correct)" if tr["candidates"] else "")
        )
    return "\n".join(lines)
