"""`swift-fast collect`: sample N graded candidates per problem into a rollout file."""

from __future__ import annotations

import argparse
import os
import sys

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
written as they finish and a rerun skips the ids already in --out. Sampling is seeded per
problem from --seed and the problem id. Progress counts candidates as they finish; vLLM's own
output goes to <out>.vllm.log (--verbose shows it).
"""

EXAMPLES = """\
examples:
  swift-fast collect --model Qwen/Qwen2.5-7B-Instruct --data gsm8k --n 8 --out rollouts.jsonl
  swift-fast collect --model M --data train.jsonl --n 16 --limit 500 --engine transformers --out r.jsonl
  swift-fast collect --model M --data gsm8k --n 8 --out rollouts.jsonl --data-parallel-size 2
  swift-fast collect --model M --data gsm8k --n 8 --out r.jsonl --tensor-parallel-size 4 --pipeline-parallel-size 2
"""


def add_parser(sub, name, help_):
    p = sub.add_parser(
        name, help=help_, description=DESCRIPTION, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True,
                   help="Hugging Face model name or path, or a .gguf file (converted once: import-model)")
    p.add_argument("--data", required=True, help="dataset file or name (GSM8K, MATH-500, AQuA or generic JSONL)")
    p.add_argument("--out", required=True, help="rollout JSONL to write (resumed when it exists)")
    add_generation_args(p, n=8)
    p.add_argument("--engine", choices=("auto", "vllm", "transformers"), default="auto",
                   help="generation engine (default auto)")
    p.add_argument("--dtype", default="auto", help="model dtype (default auto)")
    p.add_argument("--device", default="auto", help="transformers engine: auto, cpu, cuda, ...")
    p.add_argument("--gpu-memory-utilization", type=float,
                   help="vLLM memory share (default 0.9 on a GPU, 0.3 on the CPU where it means host memory)")
    p.add_argument("--enforce-eager", choices=("auto", "yes", "no"), default="auto",
                   help="vLLM without torch.compile/CUDA graphs (auto: no on a GPU or with pipeline stages, "
                        "yes otherwise on the CPU)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def add_generation_args(p, n: int) -> None:
    """Options shared by the commands that sample and grade candidates (`collect`, `bon`)."""
    p.add_argument("--n", type=int, default=n, help=f"candidates per problem (default {n})")
    p.add_argument("--limit", type=int, help="first LIMIT problems only")
    p.add_argument("--kind", help="grading kind for every problem (math, choice, boolean, literal)")
    p.add_argument("--template", help="prompt template name or text with {question} (default: by dataset)")
    p.add_argument("--system",
                   help="system prompt of the generation prompts (default: the template's; none for the paper's)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling (default 0.9)")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="most new tokens per candidate (default 1024)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--chunk", type=int, default=64, help="problems per engine call, written together (default 64)")
    p.add_argument("--grade-timeout", type=float, default=5.0, help="seconds per math answer before it counts as wrong")
    p.add_argument("--lenient-truncation", action="store_true",
                   help="grade a candidate cut off at --max-new-tokens on whatever it says (default: it is wrong "
                        "unless it completed a final answer statement, a closed \\boxed{} or 'the answer is X.', "
                        "before the limit)")
    p.add_argument("--data-parallel-size", type=int, default=1, metavar="N",
                   help="vLLM: N engines, each problem sent to the least loaded one (vLLM's data parallelism; "
                        "on the CPU each worker gets its share of the cores); same output as one engine")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="vLLM: split each engine's model over N workers, every layer sharded (for a model that "
                        "does not fit one device)")
    p.add_argument("--pipeline-parallel-size", type=int, default=1, metavar="N",
                   help="vLLM: split each engine's model over N workers, consecutive layers each (on the CPU "
                        "vLLM runs stages only with torch.compile, so --enforce-eager auto means no)")
    p.add_argument("--verbose", action="store_true",
                   help="vLLM: show its logs, start-up warnings and loading bars here (default: only this "
                        "command's own output; vLLM's errors still show, and the engine processes' output goes "
                        "to <out>.vllm.log)")


#: ``--<flag>`` -> the ``vllm.LLM`` keyword of each parallelism option
_PARALLEL = {"data-parallel-size": "data_parallel_size", "tensor-parallel-size": "tensor_parallel_size",
             "pipeline-parallel-size": "pipeline_parallel_size"}


def parallel_kwargs(args, engine: str) -> dict:
    """The vLLM keywords of the parallelism options (none at 1); a clear error for a value below 1
    or an engine that runs one worker."""
    out = {}
    for flag, key in _PARALLEL.items():
        n = getattr(args, key)
        if n < 1:
            raise ValueError(f"--{flag} must be at least 1, got {n}")
        if n > 1 and engine != "vllm":
            raise ValueError(f"--{flag} {n} runs several vLLM workers; the {engine} engine runs one process")
        if n > 1:
            out[key] = n
    return out


def collect_config(args):
    """The ``CollectConfig`` of the options ``add_generation_args`` added."""
    from ..jobs.collect import CollectConfig

    return CollectConfig(
        n=args.n, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed,
        template=args.template, system=args.system, chunk=max(1, args.chunk), grade_timeout=args.grade_timeout,
        truncation="lenient" if getattr(args, "lenient_truncation", False) else "strict",
    )


def run(args) -> int:
    from ..data.datasets import DataError, load_dataset
    from ..hf.features import UnsupportedModelError
    from ..jobs.collect import HFEngine, VLLMEngine, collect, vllm_available
    from ..support.engine_logs import quiet_engine

    try:
        engine_name = args.engine
        if engine_name == "auto":
            engine_name = "vllm" if vllm_available() else "transformers"
        parallel = parallel_kwargs(args, engine_name)
        examples = load_dataset(args.data, kind=args.kind, limit=args.limit)
        cfg = collect_config(args)
        with quiet_engine(os.path.splitext(args.out)[0] + ".vllm.log",
                          verbose=args.verbose or engine_name != "vllm"):
            if engine_name == "vllm":
                kw = dict(parallel)
                if args.gpu_memory_utilization is not None:
                    kw["gpu_memory_utilization"] = args.gpu_memory_utilization
                if args.enforce_eager != "auto":
                    kw["enforce_eager"] = args.enforce_eager == "yes"
                engine = VLLMEngine(args.model, dtype=args.dtype, seed=args.seed, **kw)
                tokenizer = engine.tokenizer
            else:
                from ..hf.loading import load_model

                model, tokenizer = load_model(args.model, args.dtype, args.device, check=False)
                engine = HFEngine(model, tokenizer)
            try:
                stats = collect(
                    engine, tokenizer, examples, args.out, cfg, progress=not args.no_progress, model_name=args.model
                )
            finally:
                engine.close()
    except (DataError, UnsupportedModelError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    acc = stats["correct"] / max(1, stats["candidates"])
    print(
        f"wrote {stats['written']} problems ({stats['candidates']} candidates, {acc:.3f} correct) to {args.out}; "
        f"{stats['skipped_done']} were already there"
    )
    return 0
