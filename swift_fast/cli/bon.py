"""`swift-fast bon`: offline Best-of-N with vLLM, scored by SWIFT (and SAR) during generation."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .collect import add_generation_args, collect_config

DESCRIPTION = """\
Generate N candidates per problem in one vLLM run with a SWIFT head attached (the scores are
computed while the tokens are generated: no second pass, no reward model), grade them, and
report Best-of-N: accuracy at k = 1, 2, 4, ... N of selecting by SWIFT (and by SAR and the
rank/scaled combinations with --sar), the SWIFT-weighted vote, majority vote and oracle
pass@k, with 95% bootstrap intervals; a PNG plot and a JSON summary beside the rollouts.

Prompts and sampling are those of `swift-fast collect` (the dataset's template, temperature
1.0, top-p 0.9). The rollout JSONL has one problem per line with every candidate's token ids,
text, answer, correctness, `swift_score`, `swift_tokens` and `sar`. Resumable: problems are
written as they finish and a rerun skips those already in --out.
"""

EXAMPLES = """\
examples:
  swift-fast bon --model Qwen/Qwen2.5-7B-Instruct --head head.safetensors --data gsm8k --n 16
  swift-fast bon --model M --head H --data math500 --n 16 --sar --out runs/math500.jsonl
  swift-fast bon --model M --head H --data test.jsonl --n 8 --vllm max_model_len=4096 --vllm enable_prefix_caching=true
"""


def add_parser(sub, name, help_):
    p = sub.add_parser(
        name, help=help_, description=DESCRIPTION, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, help="Hugging Face model name or path")
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
    from ..hf.collect import VLLMEngine

    class ScoredVLLMEngine(VLLMEngine):
        """``swift_fast.hf.collect``'s vLLM engine with the plugin's scores kept on each candidate."""

        name = "vllm+swift"

        def generate(self, prompts, seeds, cfg, contexts=None):
            seen = []
            orig = self.llm.generate

            def generate_and_keep(*a, **k):
                outs = orig(*a, **k)
                seen.extend(outs)
                return outs

            self.llm.generate = generate_and_keep
            try:
                result = super().generate(prompts, seeds, cfg, contexts=contexts)
            finally:
                del self.llm.generate
            for cands, res in zip(result, seen):
                for c, out in zip(cands, sorted(res.outputs, key=lambda o: o.index)):
                    c["swift_score"] = out.swift_score
                    c["swift_tokens"] = out.swift_tokens
                    if hasattr(out, "sar"):
                        c["sar"] = out.sar
                        c["sar_context"] = out.sar_context
            return result

    return ScoredVLLMEngine


def default_out(data: str, n: int) -> str:
    stem = os.path.splitext(os.path.basename(str(data).rstrip("/")))[0] or "data"
    return f"bon-{stem}-n{n}.jsonl"


def run(args) -> int:
    from .. import report
    from ..datasets import DataError, load_dataset
    from ..head import HeadError, SwiftHead
    from ..hf.collect import collect
    from ..rollouts import read_rollouts

    if args.n < 1:
        print("error: --n must be at least 1", file=sys.stderr)
        return 2
    out = args.out or default_out(args.data, args.n)
    try:
        SwiftHead.load(args.head)
        examples = load_dataset(args.data, kind=args.kind, limit=args.limit)
        extra = vllm_kwargs(args.vllm)
        section = {"head": args.head, "sar": bool(args.sar)}
        extra.setdefault("additional_config", {})["swift_fast"] = section
        cfg = collect_config(args)
        engine = _engine_class()(args.model, dtype=args.dtype, seed=args.seed, **extra)
        try:
            stats = collect(
                engine, engine.tokenizer, examples, out, cfg, progress=not args.no_progress, model_name=args.model
            )
        finally:
            engine.close()
        ids = {str(ex.id) for ex in examples}
        problems = [p for p in read_rollouts(out) if p.id in ids]
        sar_key = "sar" if args.sar else None
        keys = ["swift_score"] + ([sar_key] if sar_key else [])
        cands = report.gather(problems, keys, n=args.n, where=out)
        ks = [int(x) for x in args.ks.split(",")] if args.ks else None
        table = report.bon_table(cands, report.standard_selectors("swift_score", sar=sar_key), ks, reps=args.bootstrap)
    except (DataError, HeadError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report.format_table(table))
    base = os.path.splitext(out)[0]
    if args.plot != "none":
        path = report.plot(
            table,
            args.plot or base + ".bon.png",
            title=f"{os.path.basename(args.model)} on {os.path.basename(str(args.data))}",
        )
        print(f"plot: {path}")
    summary = report.save_json(
        table, args.json or base + ".summary.json", model=args.model, head=os.path.abspath(args.head),
        data=str(args.data), n=args.n, rollouts=os.path.abspath(out), generated=stats["written"],
        resumed=stats["skipped_done"],
    )
    print(f"rollouts: {out} ({stats['written']} problems generated, {stats['skipped_done']} already there)")
    print(f"summary: {summary}")
    return 0
