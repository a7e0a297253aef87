"""`swift-fast eval`: Best-of-N table and plot from a rollout file of scored candidates."""

from __future__ import annotations

import argparse
import os
import sys

DESCRIPTION = """\
Best-of-N accuracy at k = 1, 2, 4, ... N from a rollout file (JSONL, one problem per line, as
written by `swift-fast collect`, `score` or `bon`). Rows: random choice (expected), majority
vote, the trivial (head-free) selectors whose columns the candidates have (longest and shortest
by `num_tokens`, else the length of `token_ids`; highest `mean_logprob`; DeepConf's
`confidence_lowest_group`, `confidence_tail` and `confidence_bottom10`, as `bon` and `score`
without --head write them, else the older `conf_lowest` and `conf_tail` that `swift-fast demo`
records; and DeepConf's votes weighted by each confidence), best-of-k by each score column, the
score-weighted vote, rank and scaled combinations with --external and with SAR, and oracle
pass@k. Each cell carries a 95% bootstrap confidence interval over problems.

--score defaults to `swift_score`; rollouts without it (generated without a head) are headed by
DeepConf's lowest-group confidence, the plugin's own default without a head (then the first
head-free value the candidates have). The headline row is the selector the head recommends
(`swift-fast train` records it in the head file: often a SWIFT-weighted vote, vote:swift@T) when
the head is known: --head FILE, else the head the rollouts' run record names (`bon` and `collect`
write `<rollouts stem>.run.json`) while that file is unchanged. --select names another headline
selector (any of `bon`'s); --score alone heads the table with that column's highest value.

SAR's rows (SAR alone, and its rank and scaled combinations with --score) are shown whenever the
candidates have the SAR column (`sar`, as `bon --sar` and `score --sar` write it; --sar-column
names another): --sar means what it means in `bon`, `score` and `serve`, SAR on, and here makes
a file without the column an error; --no-sar leaves the rows out.

BoN@k uses the first k candidates of each problem in generation order; ties go to the lowest
index; a missing score (null) never wins. Candidates need a boolean `correct` (or use --grade)
and, for voting, an `answer`.

Under the table: the single-sample accuracy (the mean correctness over all N candidates of each
problem; the k=1 column is the first candidate alone), the paired differences with 95% intervals
of --score minus a single sample and minus the best trivial selector, and how many candidates
stopped at the length limit. Rows are named as in `bon` and the demo (swift_score: SWIFT, sar: SAR).
"""

EXAMPLES = """\
examples:
  swift-fast eval scored.jsonl
  swift-fast eval scored.jsonl --score swift_score --external rm_score --plot bon.png
  swift-fast eval rollouts.jsonl --grade --score mean_logprob --ks 1,4,16
  swift-fast eval bon.jsonl --n 8 --no-sar     # the first 8 candidates of each problem, no SAR rows
"""


def add_parser(sub, name, help_):
    from . import options

    p = options.command(sub, name, help_, DESCRIPTION, EXAMPLES)
    p.add_argument("rollouts", metavar="ROLLOUTS", help="rollout JSONL with scored candidates")
    p.add_argument("--score", help="candidate field to select by (default: swift_score; without it, the first "
                   "head-free value the candidates have: confidence_lowest_group, confidence_tail, "
                   "confidence_bottom10, mean_logprob)")
    p.add_argument("--select", type=options.selector, metavar="SELECTOR",
                   help="the headline selector (default: the head's recommended one, see --head; else --score's "
                        f"column): {options.SELECTORS_HELP}")
    p.add_argument("--head", metavar="FILE",
                   help="the head whose recommended selector heads the report (default: the head named in the "
                        "rollouts' run record, while that file is unchanged)")
    p.add_argument("--external",
                   help="a second score column (e.g. a reward model's) to combine with --score by rank and scaled")
    p.add_argument("--sar", action=argparse.BooleanOptionalAction, default=None,
                   help="SAR's rows: --sar requires the SAR column, --no-sar leaves the rows out (default: shown "
                        "when the candidates have the column)")
    p.add_argument("--sar-column", default="sar", metavar="COLUMN",
                   help="candidate field of SAR, as `score --sar-column` writes it (default: sar)")
    p.add_argument("--ks", help="comma-separated k values (default: 1, 2, 4, ... N)")
    p.add_argument("--n", type=int,
                   help="candidates per problem to use, the first N (default: the fewest any problem has)")
    p.add_argument("-n", dest="n", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # 0.1's spelling
    p.add_argument("--grade", action="store_true",
                   help="(re)grade candidates from their text and the problem's reference")
    p.add_argument("--lenient-truncation", action="store_true",
                   help="with --grade: grade a candidate cut off at the length limit on whatever it says (default: "
                        "wrong unless it completed a final answer statement before the limit)")
    p.add_argument("--plot", help="PNG path (default: next to the input, <name>.bon.png); 'none' to skip")
    p.add_argument("--json", help="write the summary as JSON here")
    p.add_argument("--csv", metavar="PATH",
                   help="write the table as CSV here: one line per selector and k (selector key, name, k, accuracy, "
                        "95%% CI low, high; fractions)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip malformed lines (counted) instead of stopping at the first")
    p.add_argument("--bootstrap", type=int, default=2000,
                   help="bootstrap resamples for the confidence intervals (default 2000)")
    p.add_argument("--no-ci", action="store_true", help="print accuracies without intervals")
    p.add_argument("--no-trivial", action="store_true",
                   help="leave out the trivial selectors (longest, shortest, mean logprob, confidence)")
    p.prepare = old_sar_column
    return p


def old_sar_column(parser, args: list) -> tuple[list, dict]:
    """``--sar COLUMN``, this command's spelling in 0.1 (the SAR column's name), read as ``--sar
    --sar-column COLUMN`` so that old command lines keep working: when a bare word follows --sar
    and another bare word is left to be ROLLOUTS (``eval --sar scored.jsonl`` is the switch and
    the file). ``--sar=COLUMN`` likewise. (:class:`~swift_fast.cli.options.CommandParser`)"""
    from .options import read_words

    words = read_words(args, parser.option_table(), abbrev=parser.allow_abbrev)
    bare = sum(len(w.tokens) - (w.kind == "rest") for w in words if w.kind in ("word", "rest"))
    out: list = []
    for i, w in enumerate(words):
        if w.kind == "option" and w.flag == "--sar":
            if "=" in w.tokens[0]:
                out += ["--sar", "--sar-column", w.tokens[0].partition("=")[2]]
                continue
            if bare >= 2 and i + 1 < len(words) and words[i + 1].kind == "word":
                out += ["--sar", "--sar-column"]  # the next word is its value
                continue
        out += w.tokens
    return out, {}


def regrade(problems, truncation: str = "strict") -> dict:
    """Fill each candidate's ``answer`` and ``correct`` from its text and the problem's reference,
    in one batch (math answers are parsed once, in worker processes with a deadline each).

    Each candidate's ``finish_reason`` goes to the truncation rule (swift_fast.grading):
    "strict" counts a candidate cut off without a complete final answer statement as wrong with
    no answer; "lenient" grades every text as it is. Returns the grading counts, among them
    "truncated" (candidates judged wrong by the strict rule)."""
    from ..grading import judge_many

    cands = [(p, c) for p in problems for c in p.candidates]
    stats: dict = {}
    verdicts = judge_many(
        [c.get("text", "") for _, c in cands],
        [p.reference for p, _ in cands],
        [p.kind for p, _ in cands],
        stats=stats,
        finish_reasons=[c.get("finish_reason") for _, c in cands],
        truncation=truncation,
    )
    for (_, c), j in zip(cands, verdicts):
        c["answer"], c["correct"] = j.answer, bool(j.correct)
    return stats


def trace_columns(problems) -> int:
    """The trivial selectors' columns of candidates that carry the plugin's per-token values but
    not the columns (rollouts written before ``bon`` recorded them), with the confidence window
    the run was pruned with, else the pruning default. Returns how many were filled."""
    from ..reports.best_of_n import trace_signals
    from ..selection.pruning import PruneConfig

    done = 0
    for p in problems:
        prune = (p.extra.get("plugin_args") or {}).get("prune")
        window = prune.get("window", PruneConfig().window) if isinstance(prune, dict) else PruneConfig().window
        for c in p.candidates:
            if "conf_lowest" not in c and isinstance(c.get("swift_trace"), dict):
                trace_signals(c, window)
                done += 1
    return done


def score_key(args, problems) -> str:
    """The column the report is headed by: --score, else ``swift_score`` when some candidate has a
    number there, else the first head-free value some candidate has (DeepConf's lowest group
    first: the plugin's default without a head). Raises ``DataError`` when there is none."""
    from ..data.datasets import DataError
    from ..reports.candidates import field_of
    from ..selection.by_value import DEFAULT_HEAD_FREE, HEAD_FREE

    if args.score:
        return args.score

    def present(key):
        for p in problems:
            for c in p.candidates:
                v = c.get(field_of(c, key))
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    return True
        return False

    order = ["swift_score", DEFAULT_HEAD_FREE, *[v for v in HEAD_FREE if v != DEFAULT_HEAD_FREE]]
    for key in order:
        if present(key):
            return key
    raise DataError(f"{args.rollouts}: no candidate has a score column: neither swift_score nor a head-free value "
                    f"({', '.join(HEAD_FREE)}); name the column to select by with --score")


def headline(args) -> tuple[str | None, str | None]:
    """``(selector, why)`` heading the report: --select; else, unless --score was given, the
    recommended selector of --head or of the head the rollouts' run record names; else
    ``(None, None)`` (the --score column heads it). ``HeadError`` for an unreadable --head."""
    from ..jobs.run_record import head_of
    from ..rewards.head import read_selector

    if args.select:
        return args.select, "--select"
    if args.score and not args.head:
        return None, None
    head = args.head or head_of(args.rollouts)
    rec = read_selector(head) if head else None
    if rec is None:
        return None, None
    return rec["select"], f"recommended by {os.path.basename(head)}"


def _reads(select: str) -> list[str]:
    """The columns a selector reads (``swift_score``, ``sar``, a head-free value)."""
    from ..selection.by_value import FIELD, parse

    kind, value = parse(select)
    return ["swift_score", "sar"] if kind in ("rank", "scaled") else [FIELD[value]] if value else []


def sar_key(args, problems) -> str | None:
    """The SAR column the report shows: --sar-column with --sar, none with --no-sar, and by default
    the column when some candidate has a number there (``bon --sar`` writes it; a model without a
    BOS token leaves it null). Never a second row for a column that is --score or --external."""
    key = args.sar_column
    if args.sar is False or key in (args.score, args.external):
        return None
    if args.sar:
        return key
    present = any(isinstance(c.get(key), (int, float)) and not isinstance(c.get(key), bool)
                  for p in problems for c in p.candidates)
    return key if present else None


def run(args) -> int:
    from ..data.datasets import DataError
    from ..data.rollouts import read_rollouts
    from ..reports import best_of_n as report

    stats: dict = {}
    try:
        problems = read_rollouts(args.rollouts, skip_bad=args.skip_bad, stats=stats)
        if stats.get("skipped"):
            print(f"skipped {stats['skipped']} malformed lines (first: {stats['errors'][0]})", file=sys.stderr)
        if args.grade:
            regrade(problems, "lenient" if args.lenient_truncation else "strict")
        select, by = headline(args)  # before --score's default: a column asked for by name heads the table
        args.score = score_key(args, problems)
        sar = sar_key(args, problems)
        keys = [k for k in (args.score, sar, args.external) if k]
        if not args.no_trivial:
            trace_columns(problems)
        if select is not None:
            keys += [k for k in _reads(select) if k not in keys]
        cands = report.gather(problems, keys, n=args.n, where=args.rollouts, signals=not args.no_trivial)
        ks = [int(x) for x in args.ks.split(",")] if args.ks else None
        trivial = None if args.no_trivial else report.trivial_selectors(cands)
        rows = report.standard_selectors(args.score, args.external, sar, trivial)
        name = report.selector_name(args.score)
        if select is not None:
            rows, name = report.with_selector(rows, select), report.selector_row(select)
        table = report.bon_table(cands, rows, ks, reps=args.bootstrap)
        summary = report.selection_summary(cands, table, name, reps=args.bootstrap)
        if select is not None:
            summary["select"] = {"selector": select, "by": by}
    except (DataError, ValueError) as e:  # HeadError and SelectorError are ValueErrors
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report.format_table(table, ci=not args.no_ci))
    print(report.summary_text(summary))
    if args.plot != "none":
        path = args.plot or os.path.splitext(args.rollouts)[0] + ".bon.png"
        where = os.path.join(os.path.basename(os.path.dirname(os.path.abspath(args.rollouts))),
                             os.path.basename(args.rollouts))
        report.plot(table, path, title=f"Best-of-N on {where}", highlight=[summary["score"]["name"]])
        print(f"plot: {path}")
    if args.json:
        report.save_json(table, args.json, summary=summary, source=os.path.abspath(args.rollouts))
        print(f"summary: {args.json}")
    if args.csv:
        report.save_csv(table, args.csv)
        print(f"table: {args.csv}")
    return 0
