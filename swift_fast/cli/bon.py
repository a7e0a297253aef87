"""`swift-fast bon`: offline Best-of-N with vLLM, scored by SWIFT (and SAR) during generation."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .collect import add_generation_args, collect_config, parallel_kwargs

DESCRIPTION = """\
Generate N candidates per problem in one vLLM run with a SWIFT head attached (the scores are
computed while the tokens are generated: no second pass, no reward model), grade them, and
report Best-of-N: accuracy at k = 1, 2, 4, ... N of selecting by SWIFT (and by SAR and the
rank/scaled combinations with --sar), the SWIFT-weighted vote, majority vote and oracle
pass@k, with 95% bootstrap intervals; a PNG plot and a JSON summary beside the rollouts.

Prompts and sampling are those of `swift-fast collect` (the dataset's template, temperature
1.0, top-p 0.9). The rollout JSONL has one problem per line with every candidate's token ids,
text, answer, correctness, `swift_score`, `swift_tokens`, `sar` and the trivial selectors'
columns (`num_tokens`, DeepConf's `conf_lowest` and `conf_tail`, with --sar `mean_logprob`), so
`swift-fast eval` on it shows the same rows. Resumable: problems are written as they finish and a
rerun skips those already in --out.

Under the table: the single-sample accuracy (the mean over all N candidates; the k=1 column is the
first candidate alone), SWIFT@N minus a single sample and minus the best trivial selector with
paired 95% intervals, and how many candidates stopped at the length limit. A candidate cut off
there is graded wrong unless it completed a final answer statement first (--lenient-truncation:
graded on its text). Progress counts candidates as they finish; vLLM's own output goes to
<out>.vllm.log (--verbose shows it).

--prune [SETTINGS] also runs Best-of-N with the weakest candidates stopped while they are
generated (the plugin's pruning; settings as JSON or key=value pairs: signal
swift|confidence|combined, warmup, every, keep, min_keep, window; defaults in
`swift_fast.selection.pruning.PruneConfig`), on the same problems with the same per-problem seeds, into
<out>.pruned.jsonl. It reports both runs' generated tokens and vLLM wall time (both runs traced),
BoN@N with the paired 95% interval of the difference, and <out>.prune.png: accuracy against
tokens for a sweep of settings of every signal (SWIFT's running score, DeepConf's confidence,
both), replayed on the full run's per-token values. A rerun resumes a run only when it was
written with the same settings.
"""

EXAMPLES = """\
examples:
  swift-fast bon --model Qwen/Qwen2.5-7B-Instruct --head head.safetensors --data gsm8k --n 16
  swift-fast bon --model M --head H --data math500 --n 16 --sar --out runs/math500.jsonl
  swift-fast bon --model M --head H --data test.jsonl --n 8 --vllm max_model_len=4096 --vllm enable_prefix_caching=true
  swift-fast bon --model M --head H --data gsm8k --n 16 --prune
  swift-fast bon --model M --head H --data gsm8k --n 16 --data-parallel-size 2   # two engines
  swift-fast bon --model M --head H --data gsm8k --n 16 --pipeline-parallel-size 2   # layers over two workers
  swift-fast bon --model M --head H --data gsm8k --n 16 --prune signal=swift,warmup=64,every=64,keep=0.5
"""


def add_parser(sub, name, help_):
    p = sub.add_parser(
        name, help=help_, description=DESCRIPTION, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True,
                   help="Hugging Face model name or path, or a .gguf file (converted once: import-model)")
    p.add_argument("--head", required=True, help="SWIFT head file trained for this model")
    p.add_argument("--data", required=True, help="dataset file or name (GSM8K, MATH-500, AQuA or generic JSONL)")
    p.add_argument("--out", help="rollout JSONL (default: bon-<data>-n<N>.jsonl in the current folder)")
    p.add_argument("--sar", action="store_true", help="also compute SAR and report SAR and its combinations with SWIFT")
    add_generation_args(p, n=16)
    p.add_argument("--dtype", default="auto", help="model dtype (default auto)")
    p.add_argument("--ks", help="comma-separated k values (default: 1, 2, 4, ... N)")
    p.add_argument("--plot", help="PNG path (default: <out>.bon.png); 'none' to skip")
    p.add_argument("--json", help="summary JSON path (default: <out>.summary.json)")
    p.add_argument("--vllm", action="append", default=[], metavar="KEY=VALUE",
                   help="extra vllm.LLM argument (value parsed as JSON when it can be), repeatable")
    p.add_argument("--prune", nargs="?", const="{}", metavar="SETTINGS",
                   help="also run Best-of-N with pruning during generation and compare (see above); SETTINGS as "
                        'JSON (\'{"keep": 0.5}\') or key=value,key=value (default: the defaults)')
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the intervals (default 2000)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def vllm_kwargs(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--vllm {pair!r}: expected KEY=VALUE, e.g. --vllm max_model_len=4096")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = value
    return out


def _engine_class():
    from ..jobs.collect import VLLMEngine
    from ..reports.best_of_n import trace_signals
    from ..selection.pruning import PruneConfig

    class ScoredVLLMEngine(VLLMEngine):
        """``swift_fast.jobs.collect``'s vLLM engine with the plugin's scores kept on each candidate."""

        name = "vllm+swift"

        seconds = 0.0  # wall time inside vLLM's generate
        #: DeepConf's group size for the confidence columns; whether the per-token values stay on
        #: each candidate (a pruning sweep replays them) or only the columns the report reads
        window = PruneConfig().window
        keep_trace = False

        def generate(self, prompts, seeds, cfg, contexts=None, bar=None):
            seen = []
            orig = self.llm.generate

            def generate_and_keep(*a, **k):
                t0 = time.perf_counter()
                outs = orig(*a, **k)
                self.seconds += time.perf_counter() - t0
                seen.extend(outs)
                return outs

            self.llm.generate = generate_and_keep
            try:
                result = super().generate(prompts, seeds, cfg, contexts=contexts, bar=bar)
            finally:
                del self.llm.generate
            for cands, res in zip(result, seen):
                for c, out in zip(cands, sorted(res.outputs, key=lambda o: o.index)):
                    c["swift_score"] = out.swift_score
                    c["swift_tokens"] = out.swift_tokens
                    c["swift_pruned"] = bool(getattr(out, "swift_pruned", False))
                    if hasattr(out, "sar"):
                        c["sar"] = out.sar
                        c["sar_context"] = out.sar_context
                    if getattr(out, "swift_trace", None) is not None:
                        # the trivial selectors' columns are written on every traced run, so
                        # `eval` on this file shows the rows `bon` shows
                        c["swift_trace"] = out.swift_trace
                        trace_signals(c, self.window)
                        if not self.keep_trace:
                            del c["swift_trace"]
            return result

    return ScoredVLLMEngine


def default_out(data: str, n: int) -> str:
    stem = os.path.splitext(os.path.basename(str(data).rstrip("/")))[0] or "data"
    return f"bon-{stem}-n{n}.jsonl"


def run(args) -> int:
    from ..data.datasets import DataError, load_dataset
    from ..data.rollouts import read_rollouts
    from ..jobs.collect import collect
    from ..reports import best_of_n as report
    from ..rewards.head import HeadError, SwiftHead
    from ..selection.pruning import parse_text
    from ..support.engine_logs import quiet_engine
    from ..vllm_plugin.surface import VllmSurfaceError

    if args.n < 1:
        print("error: --n must be at least 1", file=sys.stderr)
        return 2
    out = args.out or default_out(args.data, args.n)
    try:
        SwiftHead.load(args.head)
        examples = load_dataset(args.data, kind=args.kind, limit=args.limit)
        extra = vllm_kwargs(args.vllm)
        extra.update(parallel_kwargs(args, "vllm"))
        section = {"head": args.head, "sar": bool(args.sar)}
        extra.setdefault("additional_config", {})["swift_fast"] = section
        cfg = collect_config(args)
        prune = parse_text(args.prune, "--prune") if args.prune is not None else None
        if prune is not None and args.n < 2:
            raise ValueError("--prune stops the weakest of each problem's candidates: it needs --n 2 or more")
        pruned_out = os.path.splitext(out)[0] + ".pruned.jsonl"
        with quiet_engine(os.path.splitext(out)[0] + ".vllm.log", verbose=args.verbose):
            engine = _engine_class()(args.model, dtype=args.dtype, seed=args.seed, **extra)
            try:
                # traced: each candidate's confidence (and with SAR its mean log-prob) come free,
                # for the trivial selectors; with --prune both runs are traced, so their times
                # differ by the pruning alone, and the full run keeps its per-token values for
                # the sweep
                if prune is not None:
                    engine.window, engine.keep_trace = prune.window, True
                cfg.plugin_args = {"trace": True, "prune": False} if prune is not None else {"trace": True}
                _check_resumed(out, cfg.plugin_args, "the full run")
                stats = collect(engine, engine.tokenizer, examples, out, cfg, progress=not args.no_progress,
                                model_name=args.model, desc="generate")
                seconds = engine.seconds
                if prune is not None:
                    cfg.plugin_args = {"trace": True, "prune": prune.to_dict()}
                    _check_resumed(pruned_out, cfg.plugin_args, "the pruned run")
                    engine.seconds, engine.keep_trace = 0.0, False
                    pstats = collect(engine, engine.tokenizer, examples, pruned_out, cfg,
                                     progress=not args.no_progress, model_name=args.model, desc="generate, pruned")
                    pseconds = engine.seconds
            finally:
                engine.close()
        ids = {str(ex.id) for ex in examples}
        problems = [p for p in read_rollouts(out) if p.id in ids]
        sar_key = "sar" if args.sar else None
        keys = ["swift_score"] + ([sar_key] if sar_key else [])
        cands = report.gather(problems, keys, n=args.n, where=out, signals=True)
        ks = [int(x) for x in args.ks.split(",")] if args.ks else None
        rows = report.standard_selectors("swift_score", sar=sar_key, trivial=report.trivial_selectors(cands))
        table = report.bon_table(cands, rows, ks, reps=args.bootstrap)
        summary = report.selection_summary(cands, table, report.selector_name("swift_score"), reps=args.bootstrap)
    except (DataError, HeadError, VllmSurfaceError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report.format_table(table))
    print(report.summary_text(summary))
    base = os.path.splitext(out)[0]
    if args.plot != "none":
        path = report.plot(
            table,
            args.plot or base + ".bon.png",
            title=f"{os.path.basename(args.model)} on {os.path.basename(str(args.data))}",
        )
        print(f"plot: {path}")
    extra_summary = {}
    if prune is not None:
        try:
            extra_summary["prune"] = _prune_report(args, problems, pruned_out, ids, prune, seconds, pseconds, stats,
                                                   pstats, base)
        except (DataError, ValueError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    summary_path = report.save_json(
        table, args.json or base + ".summary.json", summary=summary, model=args.model, head=os.path.abspath(args.head),
        data=str(args.data), n=args.n, rollouts=os.path.abspath(out), generated=stats["written"],
        resumed=stats["skipped_done"], **extra_summary,
    )
    print(f"rollouts: {out} ({stats['written']} problems generated, {stats['skipped_done']} already there)")
    print(f"summary: {summary_path}")
    return 0


def _check_resumed(path: str, plugin_args: dict, what: str) -> None:
    """Refuse to resume a rollout file written with other per-request plugin settings (another
    pruning, or untraced): its problems would be mixed with, or reported as, this run's."""
    import json as _json

    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                had = _json.loads(line).get("plugin_args") or {}
            except ValueError:
                continue  # a torn last line: the writer truncates it when it resumes
            if had != plugin_args:
                raise ValueError(
                    f"{path}:{i}: {what} resumes from rollouts generated with plugin settings {had or 'none'}, not "
                    f"{plugin_args}: use another --out, or remove the file to regenerate"
                )
            return


def _prune_report(args, problems, pruned_out, ids, prune, seconds, pseconds, stats, pstats, base) -> dict:
    """Print and return the comparison of the pruned run with the full one, and plot the sweep."""
    from ..data.rollouts import read_rollouts
    from ..reports import pruning as pr

    pruned = {p.id: p for p in read_rollouts(pruned_out) if p.id in ids}
    pruned_problems = [pruned[p.id] for p in problems if p.id in pruned]
    if len(pruned_problems) != len(problems):
        raise ValueError(f"{pruned_out}: {len(problems) - len(pruned_problems)} problems of the full run are missing")
    full = pr.outcome(problems, args.n, where=os.path.abspath(args.out or "rollouts"))
    measured = pr.compare(full, pr.outcome(pruned_problems, args.n, where=pruned_out), reps=args.bootstrap)
    from ..rewards.head import SwiftHead

    alignment = SwiftHead.load(args.head).alignment  # an emitted head's decisions come a token later
    predicted = pr.compare(full, pr.replayed(problems, prune, args.n, alignment=alignment), reps=args.bootstrap)
    rows = pr.sweep(problems, args.n, base=prune, reps=min(args.bootstrap, 500), alignment=alignment)
    timed = stats["written"] == len(problems) and pstats["written"] == len(problems)
    print(f"\npruning ({', '.join(f'{k}={v}' for k, v in prune.to_dict().items())}), BoN@{args.n}:")
    print("  " + pr.summary_text(measured, "pruned run"))
    print("  " + pr.summary_text(predicted, "replayed on the full run"))
    if timed:
        print(f"  vLLM wall time: full {seconds:.1f} s, pruned {pseconds:.1f} s ({seconds / max(pseconds, 1e-9):.2f}x)")
    else:
        print("  vLLM wall time: not compared (a run resumed from earlier output)")
    frac = measured["token_fraction"]  # the pruned run's budget: each signal at equal cost
    for signal, r in pr.at_budget(rows, frac).items():
        what = "no swept setting" if r is None else pr.summary_text(
            r, f"best {signal} setting ({', '.join(f'{k}={v}' for k, v in r['settings'].items())})")
        print(f"  at <= {100 * frac:.0f}% of the tokens, {signal}: {what}")
    path = None
    if args.plot != "none":
        path = pr.plot_sweep(rows, base + ".prune.png", measured=[
            ("pruned run (measured)", measured["token_fraction"], measured["accuracy"])])
        print(f"  plot: {path}")
    return {"settings": prune.to_dict(), "measured": measured, "replayed": predicted,
            "seconds": {"full": seconds, "pruned": pseconds} if timed else None,
            "rollouts": os.path.abspath(pruned_out), "sweep": rows, "plot": path}
