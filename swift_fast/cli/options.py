"""Options that several commands share, written once so that their names, defaults and help read
the same in each, and the conversions of parsed options into the jobs' settings.

=========================  =======================================================================
:func:`command`            a command's parser: its description and examples printed as written
:func:`add_model`          ``--model`` of the commands that generate (``collect``, ``bon``)
:func:`add_data`           ``--data``, the problems they generate for
:func:`add_generation_args`  prompts, sampling, grading, vLLM's parallelism, ``--verbose``
:func:`add_no_progress`    ``--no-progress``
:func:`collect_config`     the ``CollectConfig`` of :func:`add_generation_args`' options
:func:`engine_config`      the ``EngineConfig`` of a command's engine options
=========================  =======================================================================

Nothing heavy is imported here at module level: ``swift-fast COMMAND --help`` stays instant.
"""

from __future__ import annotations

import argparse


def command(sub, name: str, help_: str, description: str, epilog: str) -> argparse.ArgumentParser:
    """The parser of command ``name`` (``sub``: the subparsers), its description and examples kept
    as written."""
    return sub.add_parser(name, help=help_, description=description, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def add_model(p) -> None:
    p.add_argument("--model", required=True,
                   help="Hugging Face model name or path, or a .gguf file (converted once: import-model)")


def add_data(p) -> None:
    p.add_argument("--data", required=True, help="dataset file or name (GSM8K, MATH-500, AQuA or generic JSONL)")


def add_no_progress(p) -> None:
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


#: what vLLM's pipeline stages on the CPU mean for eager mode, as a command with or without
#: --enforce-eager can say it
_PIPELINE_EAGER = {True: "so --enforce-eager auto means no", False: "so a pipelined run is compiled there"}


def add_generation_args(p, n: int, enforce_eager: bool) -> None:
    """Options shared by the commands that sample and grade candidates (`collect`, `bon`);
    ``enforce_eager``: whether the command has --enforce-eager (its help refers to it)."""
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
                        f"vLLM runs stages only with torch.compile, {_PIPELINE_EAGER[enforce_eager]})")
    p.add_argument("--verbose", action="store_true",
                   help="vLLM: show its logs, start-up warnings and loading bars here (default: only this "
                        "command's own output; vLLM's errors still show, and the engine processes' output goes "
                        "to <out>.vllm.log)")


def collect_config(args):
    """The ``CollectConfig`` of the options :func:`add_generation_args` added."""
    from ..jobs.collect import CollectConfig

    return CollectConfig(
        n=args.n, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed,
        template=args.template, system=args.system, chunk=max(1, args.chunk), grade_timeout=args.grade_timeout,
        truncation="lenient" if getattr(args, "lenient_truncation", False) else "strict",
    )


def engine_config(args, engine: str = "vllm"):
    """The ``EngineConfig`` of a command's engine options: the parallelism of
    :func:`add_generation_args` and ``--dtype``; where the command has them, ``--engine`` (else
    ``engine``), ``--device``, ``--gpu-memory-utilization``, ``--enforce-eager`` and ``--vllm``."""
    from ..jobs.engine import EngineConfig, parse_vllm_kwargs

    eager = getattr(args, "enforce_eager", "auto")
    return EngineConfig(
        engine=getattr(args, "engine", engine), dtype=args.dtype, device=getattr(args, "device", "auto"),
        data_parallel_size=args.data_parallel_size, tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        gpu_memory_utilization=getattr(args, "gpu_memory_utilization", None),
        enforce_eager=None if eager == "auto" else eager == "yes",
        vllm_kwargs=parse_vllm_kwargs(getattr(args, "vllm", [])),
    )
