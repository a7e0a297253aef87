"""`swift-fast bon`: offline Best-of-N with vLLM, every candidate valued during generation (SWIFT with
a head, the head-free values always, SAR with --sar). The job is ``swift_fast.jobs.bon.run_bon``;
this module parses its options and prints what it returns."""

from __future__ import annotations

import sys

from . import options

DESCRIPTION = """\
Generate N candidates per problem in one vLLM run with the swift-fast plugin attached (the values
are computed while the tokens are generated: no second pass, no reward model), grade them, and
report Best-of-N: accuracy at k = 1, 2, 4, ... N of each selector, with 95% bootstrap intervals; a
PNG plot and a JSON summary beside the rollouts.

Every run reports the head-free selectors: longest and shortest, the highest mean token log-prob,
DeepConf's lowest-group, tail and bottom-10% confidence (over --confidence-window tokens) and
DeepConf's votes weighted by each confidence, beside majority vote and oracle pass@k. With --head,
also selection by SWIFT and the SWIFT-weighted vote; with --sar, SAR and (with --head) its
rank/scaled combinations with SWIFT. --select names the headline selector, the row the summary
under the table and the plot lead with (default: swift with --head, else confidence_lowest_group);
a selector that needs --head or --sar without it is an error.

Prompts and sampling are those of `swift-fast collect` (the dataset's template, temperature
1.0, top-p 0.9). The rollout JSONL has one problem per line with every candidate's token ids,
text, answer, correctness, the head-free values under the plugin's names (`mean_logprob`,
`confidence_lowest_group`, `confidence_tail`, `confidence_bottom10`) and `num_tokens`, with
--head `swift_score` and `swift_tokens`, with --sar `sar`, so `swift-fast eval` on it shows the same
rows. Resumable: problems are written as they finish and a rerun skips those already in --out,
only when they were generated with the same model, head (or none), data and settings (recorded in
<out>.run.json, on every line and in the summary; a rerun with another is refused before the
engine starts, naming the difference: --overwrite starts again).

Under the table: the single-sample accuracy (the mean over all N candidates; the k=1 column is the
first candidate alone), the headline selector at N minus a single sample and minus the best other
trivial selector with paired 95% intervals, and how many candidates stopped at the length limit. A
candidate cut off there is graded wrong unless it completed a final answer statement first
(--lenient-truncation: graded on its text). Progress counts candidates as they finish; vLLM's own
output goes to <out>.vllm.log (--verbose shows it).

--prune [SETTINGS] also runs Best-of-N with the weakest candidates stopped while they are
generated (the plugin's pruning; settings as JSON or key=value pairs: signal
swift|confidence|combined, warmup, every, keep, min_keep, window; defaults in
`swift_fast.selection.pruning.PruneConfig`; without --head the signal must need no head, e.g.
signal=confidence), on the same problems with the same per-problem seeds, into
<out>.pruned.jsonl. It reports both runs' generated tokens and vLLM wall time (both runs traced),
BoN@N by the headline selector with the paired 95% interval of the difference, and <out>.prune.png:
accuracy against tokens for a sweep of settings of every signal the run has (SWIFT's running score
with --head, DeepConf's confidence, both), replayed on the full run's per-token values. The pruned
run's record includes the pruning settings: a rerun resumes it only with the same.

--deepconf [SETTINGS] also runs Best-of-N with DeepConf online (the plugin's: the first `warmup`
candidates of a problem set a threshold at `percentile` of their lowest group confidence, later
ones stop at the first `window` below it, and with a consensus of the finished candidates'
answers the problem stops; settings warmup, percentile, window, consensus, wave, signal, defaults
in `swift_fast.selection.deepconf.DeepConfConfig`), into <out>.deepconf.jsonl, and reports its
tokens, vLLM wall time and BoN@N (by the headline selector and by DeepConf's confidence-weighted
vote) beside the full run's, with how many decisions a replay on the full run reproduces.
"""

EXAMPLES = """\
examples:
  swift-fast bon --model Qwen/Qwen2.5-7B-Instruct --head head.safetensors --data gsm8k --n 16
  swift-fast bon --model Qwen/Qwen2.5-7B-Instruct --data gsm8k --n 16   # no head: the head-free selectors
  swift-fast bon --model M --data gsm8k --n 16 --select vote:confidence_tail   # DeepConf's weighted vote leads
  swift-fast bon --model M --head H --data math500 --n 16 --sar --out runs/math500.jsonl
  swift-fast bon --model M --head H --data test.jsonl --n 8 --vllm max_model_len=4096 --vllm enable_prefix_caching=true
  swift-fast bon --model M --head H --data gsm8k --n 16 --prune
  swift-fast bon --model M --data gsm8k --n 16 --prune signal=confidence   # pruning without a head
  swift-fast bon --model M --head H --data gsm8k --n 16 --data-parallel-size 2   # two engines
  swift-fast bon --model M --head H --data gsm8k --n 16 --pipeline-parallel-size 2   # layers over two workers
  swift-fast bon --model M --head H --data gsm8k --n 16 --prune signal=swift,warmup=64,every=64,keep=0.5
  swift-fast bon --model M --data gsm8k --n 16 --deepconf window=64,wave=4   # DeepConf online, no head
"""


def add_parser(sub, name, help_):
    p = options.command(sub, name, help_, DESCRIPTION, EXAMPLES)
    options.add_model(p)
    p.add_argument("--head", help="SWIFT head trained for this model: a file, or a Hugging Face Hub repository id "
                   "org/name[@revision][:file] (file default head.safetensors); without one, the head-free "
                   "selectors only")
    options.add_data(p)
    p.add_argument("--out", help="rollout JSONL (default: bon-<data>-n<N>.jsonl in the current folder)")
    p.add_argument("--sar", action="store_true", help="also compute SAR and report SAR and its combinations with SWIFT")
    options.add_select(p, "swift with --head, else confidence_lowest_group")
    options.add_confidence_window(p)
    options.add_generation_args(p, n=16)
    options.add_engine_args(p, choose_engine=False)
    p.add_argument("--ks", help="comma-separated k values (default: 1, 2, 4, ... N)")
    p.add_argument("--plot", help="PNG path (default: <out>.bon.png); 'none' to skip")
    p.add_argument("--json", help="summary JSON path (default: <out>.summary.json)")
    p.add_argument("--prune", nargs="?", const="{}", metavar="SETTINGS",
                   help="also run Best-of-N with pruning during generation and compare (see above); SETTINGS as "
                        'JSON (\'{"keep": 0.5}\') or key=value,key=value (default: the defaults)')
    p.add_argument("--deepconf", nargs="?", const="{}", metavar="SETTINGS",
                   help="also run Best-of-N with DeepConf online and compare (see above); SETTINGS as JSON or "
                        "key=value,key=value, e.g. percentile=90,window=64 (default: the defaults)")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the intervals (default 2000)")
    options.add_no_progress(p)
    options.add_overwrite(p)
    return p


def bon_config(args):
    """The ``BonConfig`` of the parsed options."""
    from ..jobs.bon import BonConfig
    from ..rewards.confidence import DEFAULT_WINDOW
    from ..selection.deepconf import parse_text as deepconf_text
    from ..selection.pruning import parse_text

    window = DEFAULT_WINDOW if args.confidence_window is None else args.confidence_window
    return BonConfig(
        collect=options.collect_config(args), engine=options.engine_config(args), sar=bool(args.sar),
        select=args.select, confidence_window=window,
        prune=parse_text(args.prune, "--prune") if args.prune is not None else None, kind=args.kind,
        deepconf=deepconf_text(args.deepconf, "--deepconf") if args.deepconf is not None else None,
        limit=args.limit, ks=[int(x) for x in args.ks.split(",")] if args.ks else None, bootstrap=args.bootstrap,
        plot=args.plot != "none", plot_path=args.plot if args.plot != "none" else None, summary_path=args.json,
        progress=not args.no_progress, verbose=args.verbose,
    )


def show_table(result) -> None:
    """The table, the summary under it and the plot's path, printed as soon as they are ready."""
    from ..reports import best_of_n as report

    print(report.format_table(result.table))
    print(report.summary_text(result.summary))
    if result.plot is not None:
        print(f"plot: {result.plot}")


def run(args) -> int:
    from ..data.datasets import DataError
    from ..jobs.bon import run_bon
    from ..reports.pruning import comparison_text, deepconf_text
    from ..rewards.head import HeadError
    from ..vllm_plugin.surface import VllmSurfaceError

    if args.n < 1:
        print("error: --n must be at least 1", file=sys.stderr)
        return 2
    try:
        result = run_bon(args.model, args.head, args.data, args.out or None, bon_config(args), on_table=show_table,
                         overwrite=args.overwrite)
    except (DataError, HeadError, VllmSurfaceError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result.prune is not None:
        print("\n" + comparison_text(result.prune, args.n))
    if result.deepconf is not None:
        print("\n" + deepconf_text(result.deepconf, args.n))
    stats = result.stats
    print(f"rollouts: {result.out} ({stats['written']} problems generated, {stats['skipped_done']} already there)")
    print(f"summary: {result.summary_path}")
    return 0
