"""`swift-fast collect`: sample N graded candidates per problem into a rollout file. The job is
``swift_fast.jobs.collect.run_collect``; this module parses its options and prints its counts."""

from __future__ import annotations

import sys

from . import options

DESCRIPTION = """\
Generate N candidates per problem with the SWIFT paper's templates and sampling (temperature
1.0, top-p 0.9, at most 1024 new tokens), grade them, and write a rollout JSONL: problem id,
prompt text and token ids, and per candidate the response token ids as generated (end of turn
included), text, extracted answer, correctness and finish reason.

A candidate cut off at --max-new-tokens is graded wrong unless it completed a final answer
statement first, a closed \\boxed{} or "the answer is X." (--lenient-truncation: graded on its
text). After the first chunk, a warning says so when almost nothing is correct (under 5%), and
what to try: data that cannot teach a head is caught before the long run.

Uses vLLM when it is installed (--engine auto), else transformers. Resumable: problems are
written as they finish and a rerun skips the ids already in --out, only when they were generated
with the same model, data and settings (recorded in <out>.run.json and on every line; a rerun
with another is refused before the engine starts, naming the difference: --overwrite starts
again). Sampling is seeded per problem from --seed and the problem id. Progress counts
candidates as they finish; vLLM's own output goes to <out>.vllm.log (--verbose shows it).
"""

EXAMPLES = """\
examples:
  swift-fast collect --model Qwen/Qwen2.5-7B-Instruct --data gsm8k --n 8 --out rollouts.jsonl
  swift-fast collect --model M --data train.jsonl --n 16 --limit 500 --engine transformers --out r.jsonl
  swift-fast collect --model M --data gsm8k --n 8 --out rollouts.jsonl --data-parallel-size 2
  swift-fast collect --model M --data gsm8k --n 8 --out r.jsonl --tensor-parallel-size 4 --pipeline-parallel-size 2
"""


def add_parser(sub, name, help_):
    p = options.command(sub, name, help_, DESCRIPTION, EXAMPLES)
    options.add_model(p)
    options.add_data(p)
    p.add_argument("--out", required=True, help="rollout JSONL to write (resumed when it exists)")
    options.add_generation_args(p, n=8)
    options.add_engine_args(p, choose_engine=True)
    options.add_no_progress(p)
    options.add_overwrite(p)
    return p


def run(args) -> int:
    from ..data.datasets import DataError
    from ..hf.features import UnsupportedModelError
    from ..jobs.collect import run_collect

    try:
        stats = run_collect(args.model, args.data, args.out, options.collect_config(args), options.engine_config(args),
                            kind=args.kind, limit=args.limit, progress=not args.no_progress, verbose=args.verbose,
                            overwrite=args.overwrite)
    except (DataError, UnsupportedModelError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    acc = stats["correct"] / max(1, stats["candidates"])
    print(
        f"wrote {stats['written']} problems ({stats['candidates']} candidates, {acc:.3f} correct) to {args.out}; "
        f"{stats['skipped_done']} were already there"
    )
    return 0
