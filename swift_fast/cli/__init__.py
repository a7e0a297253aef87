"""``swift-fast``: the command line. One module per subcommand, each with
``add_parser(subparsers)`` and ``run(args) -> int``; imported lazily so ``--help`` is instant."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS = {
    "demo": ("demo", "Best-of-N on the two embedded tasks (models and heads): the main job, nothing to download"),
    "bon": ("bon", "generate N candidates per problem with vLLM, select by SWIFT/SAR or head-free values, grade, "
                   "report BoN@k"),
    "collect": ("collect", "generate and grade rollouts (candidates with token ids) for training a head"),
    "train": ("train", "train a SWIFT head on graded rollouts, features recomputed from the model"),
    "score": ("score", "score the candidates of a rollout file with a head, or their head-free values (Hugging "
                       "Face, no states stored)"),
    "eval": ("eval", "BoN@k table and plot from a rollout file of scored, graded candidates"),
    "import-head": ("import_head", "convert a SWIFT paper reference checkpoint (.pt) into a swift-fast head"),
    "import-model": ("import_model", "convert a GGUF checkpoint (llama.cpp, Ollama) into a checked, cached model"),
    "serve": ("serve", "OpenAI-compatible server (vLLM) whose responses carry SWIFT scores or head-free values"),
    "head": ("head", "what a head holds and was trained on (info); publish it on the Hugging Face Hub (push)"),
}

EPILOG = """\
typical flow:
  swift-fast demo                                   # everything on the embedded model
  swift-fast collect --model M --data gsm8k.jsonl --n 8 --out rollouts.jsonl
  swift-fast train   --model M --rollouts rollouts.jsonl --out head.safetensors
  swift-fast bon     --model M --head head.safetensors --data test.jsonl --n 16
  swift-fast bon     --model M --data test.jsonl --n 16  # no head yet: mean log-prob, DeepConf's confidences
  swift-fast eval    scored.jsonl --score swift_score --external rm_score
  swift-fast import-head reward_model.pt --model M  # a head trained with the SWIFT paper's code
  swift-fast head info head.safetensors             # what a head holds; `head push` publishes it
  swift-fast bon     --model M --head org/name ...  # a head from the Hugging Face Hub
  swift-fast collect --model model.Q4_K_M.gguf ...  # a GGUF file works wherever a model does

`swift-fast COMMAND --help` explains each command.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swift-fast",
        description="Intrinsic rewards from a model's own hidden states: SWIFT heads and the "
        "self-aligned reward (SAR), computed during generation.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from swift_fast import __version__

    parser.add_argument("--version", action="version", version=f"swift-fast {__version__}")
    from .options import CommandParser

    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    for name, (mod, help_) in COMMANDS.items():
        if _wants(name):
            importlib.import_module(f".{mod}", __name__).add_parser(sub, name, help_)
        else:
            sub.add_parser(name, help=help_, add_help=False)
    return parser


_ARGV: list[str] = []


def _wants(name: str) -> bool:
    # Only the chosen subcommand's module is imported (some pull in torch or vLLM).
    return name in _ARGV


def main(argv: list[str] | None = None) -> int:
    global _ARGV
    _ARGV = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(_ARGV)
    if not args.command:
        parser.print_help()
        return 0
    mod = importlib.import_module(f".{COMMANDS[args.command][0]}", __name__)
    try:
        _resolve_gguf(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return int(mod.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _resolve_gguf(args) -> None:
    """A ``.gguf`` file given as a command's model becomes its converted folder (converted and
    checked on first use, then reused: ``swift_fast.hf.gguf``), so every command takes one."""
    if args.command == "import-model":
        return
    model = getattr(args, "model", None)
    if isinstance(model, str) and model.lower().endswith(".gguf"):
        from ..hf.gguf import resolve_model

        args.model = resolve_model(model)


if __name__ == "__main__":
    sys.exit(main())
