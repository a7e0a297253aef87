"""Options that several commands share, written once so that their names, defaults and help read
the same in each, and the conversions of parsed options into the jobs' settings.

=========================  =======================================================================
:class:`CommandParser`     every command's parser: a command may read its raw command line first
:func:`read_words`         a command line grouped as argparse groups it (an option and its values)
:func:`command`            a command's parser: its description and examples printed as written
:func:`add_model`          ``--model`` of the commands that generate (``collect``, ``bon``)
:func:`add_data`           ``--data``, the problems they generate for
:func:`add_generation_args`  prompts, sampling, grading, vLLM's parallelism, ``--verbose``
:func:`add_layers`         ``--layers`` in either spelling, ``8 16 24`` or ``8,16,24`` (``train``, ``import-head``)
:func:`add_engine_args`    the engine: ``--engine``, ``--dtype``, ``--device``, vLLM's memory, eager mode, ``--vllm``
:func:`add_dtype`          ``--dtype`` of the commands that load the model
:func:`add_no_progress`    ``--no-progress``
:func:`add_overwrite`      ``--overwrite`` of the resumable commands (``collect``, ``bon``)
:func:`add_select`         ``--select``, the Best-of-N selector of the plugin's commands (``bon``, ``serve``)
:func:`add_confidence_window`  ``--confidence-window``, DeepConf's group size in the plugin (``bon``, ``serve``)
:func:`collect_config`     the ``CollectConfig`` of :func:`add_generation_args`' options
:func:`engine_config`      the ``EngineConfig`` of a command's engine options
=========================  =======================================================================

One spelling per option: an option that two commands share is spelled, shaped (a switch or a value)
and written the same in both (``tests/test_cli_conventions.py`` reads every parser and checks it);
a spelling that shipped and was since renamed stays as a hidden alias with the same destination,
so old command lines keep working.

Nothing heavy is imported here at module level: ``swift-fast COMMAND --help`` stays instant.
"""

from __future__ import annotations

import argparse
import re
from typing import Callable, NamedTuple


class CommandParser(argparse.ArgumentParser):
    """Every command's parser (``swift-fast``'s subparsers are made of this class). A command that
    must read its command line before argparse does sets ``prepare``: ``prepare(parser, args)``
    returns the arguments argparse then parses and a dict of values set beside them. ``serve`` needs
    it: its own options may stand anywhere, before or after MODEL, and every other word is vLLM's,
    which no argparse declaration can say. What ``prepare`` returns still goes through argparse, so
    errors, ``--help`` and required options read as every other command's."""

    prepare: Callable[[CommandParser, list], tuple[list, dict]] | None = None

    def parse_known_args(self, args=None, namespace=None):
        if self.prepare is None or args is None:
            return super().parse_known_args(args, namespace)
        args, values = self.prepare(self, list(args))
        namespace, extras = super().parse_known_args(args, namespace)
        for key, value in values.items():
            setattr(namespace, key, value)
        return namespace, extras

    def option_table(self) -> dict[str, argparse.Action]:
        """Each option string of this parser -> its action (``-h`` and ``--help`` included)."""
        return dict(self._option_string_actions)


class Word(NamedTuple):
    """One item of a command line as :func:`read_words` groups it. ``kind``: "option" (a known
    option, ``flag`` its option string, ``tokens`` the words as typed, values included), "unknown"
    (a word that reads as an option this parser does not have), "word" (a bare word no option took)
    or "rest" (``--`` and every word after it)."""

    kind: str
    flag: str | None
    tokens: list


#: argparse's test for a negative number, which it reads as a value, not an option
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


def looks_like_option(word: str) -> bool:
    """Whether argparse reads ``word`` as an option (known or not) rather than as a value."""
    return word.startswith("-") and word != "-" and not _NEGATIVE.match(word) and " " not in word


def read_words(args: list, table: dict[str, argparse.Action], abbrev: bool = False) -> list[Word]:
    """``args`` grouped the way argparse groups them for a parser whose options are ``table``
    (:meth:`CommandParser.option_table`): each known option with the values it takes (``nargs``:
    none, one, an optional one, one or more), ``--flag=value`` and ``-nVALUE`` forms included;
    ``abbrev``: a unique prefix of a long option names it, as argparse's ``allow_abbrev``. Words
    of unknown options stay single words: what they take is another program's business."""
    out: list[Word] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            out.append(Word("rest", None, list(args[i:])))
            break
        flag, attached = _option_of(a, table, abbrev)
        if flag is None:
            out.append(Word("unknown" if looks_like_option(a) else "word", None, [a]))
            i += 1
            continue
        nargs = table[flag].nargs
        j = i + 1
        if not attached and nargs != 0:
            most = 1 if nargs in (None, "?") else nargs if isinstance(nargs, int) else len(args)
            while j < len(args) and j - i <= most and args[j] != "--" and not looks_like_option(args[j]):
                j += 1
        out.append(Word("option", flag, list(args[i:j])))
        i = j
    return out


def _option_of(word: str, table: dict, abbrev: bool) -> tuple[str | None, bool]:
    """The option string ``word`` names in ``table`` and whether it carries its value (``--x=v``,
    ``-nV``); ``(None, False)`` for a value or an unknown option."""
    if word in table:
        return word, False
    if not looks_like_option(word):
        return None, False
    if word.startswith("--"):
        key, eq, _ = word.partition("=")
        if key in table:
            return key, bool(eq)
        if abbrev:
            named = [f for f in table if f.startswith("--") and f.startswith(key)]
            if len(named) == 1:
                return named[0], bool(eq)
        return None, False
    short = word[:2]
    return (short, True) if short in table and table[short].nargs != 0 else (None, False)


def command(sub, name: str, help_: str, description: str, epilog: str) -> argparse.ArgumentParser:
    """The parser of command ``name`` (``sub``: the subparsers), its description and examples kept
    as written."""
    return sub.add_parser(name, help=help_, description=description, epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def add_model(p) -> None:
    p.add_argument("--model", required=True,
                   help="Hugging Face model name or path, or a .gguf file (converted once: import-model)")


def add_data(p) -> None:
    p.add_argument("--data", required=True,
                   help="the problems: a JSONL file (GSM8K, MATH-500, AQuA or generic rows) or a folder holding "
                        "test.jsonl; a name (gsm8k, math500, aqua, aqua:dev for another split) only when "
                        "SWIFT_FAST_DATA names a folder of benchmark files, read as $SWIFT_FAST_DATA/<name>/"
                        "<split>.jsonl (docs/data.md: writing them once from the Hugging Face Hub)")


def add_no_progress(p) -> None:
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_overwrite(p) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="start again: remove the rollouts at --out and their run record (by default a rerun resumes "
                        "them, and only when they were generated with the same model, data and settings)")


#: the selectors of :mod:`swift_fast.selection.by_value`, as ``--select``'s help lists them
#: (``tests/test_cli_conventions.py`` holds the list to ``by_value.VALUES``)
SELECTORS_HELP = (
    "a value, the highest wins: swift (the SWIFT score, needs --head), sar (needs --sar), mean_logprob, "
    "confidence_lowest_group, confidence_tail, confidence_bottom10 (DeepConf's confidences); rank or scaled "
    "(SWIFT combined with SAR, needs both); vote (majority vote over the answers); vote:<value> (each answer "
    "weighted by a value, e.g. DeepConf's vote:confidence_tail); vote:<value>@<T> (weighted by exp(value/T), "
    "e.g. vote:swift@0.5, what train often recommends)"
)


def selector(text: str) -> str:
    """``--select``'s type: a selector name (:mod:`swift_fast.selection.by_value`), else an
    argparse error listing them. Imports torch, only when the option is given."""
    from ..selection.by_value import SelectorError, parse

    try:
        parse(text)
    except SelectorError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a selector; the selectors: {SELECTORS_HELP}") from None
    return text.strip()


def add_select(p, default: str) -> None:
    """``--select``: how Best-of-N chooses a candidate (``default`` says the default in words)."""
    p.add_argument("--select", type=selector, metavar="SELECTOR",
                   help=f"how Best-of-N chooses a candidate (default {default}): {SELECTORS_HELP}")


def add_confidence_window(p) -> None:
    p.add_argument("--confidence-window", type=int, metavar="TOKENS",
                   help="tokens per group of DeepConf's group confidences (default 2048, DeepConf's; "
                        "an answer of at most that many tokens is one group)")


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


def add_dtype(p) -> None:
    p.add_argument("--dtype", default="auto",
                   help="model dtype: auto (vLLM's choice; with transformers the checkpoint's on a GPU, float32 on "
                        "the CPU), bfloat16, float16 or float32 (default auto)")


def add_engine_args(p, choose_engine: bool) -> None:
    """The engine's options, one set for every command that generates (`collect`, `bon`), spelled as
    vLLM spells them; ``choose_engine``: the command may run transformers instead of vLLM
    (``--engine``, ``--device``)."""
    if choose_engine:
        p.add_argument("--engine", choices=("auto", "vllm", "transformers"), default="auto",
                       help="generation engine: vllm, transformers, or auto (vLLM when it is installed; default)")
    add_dtype(p)
    if choose_engine:
        p.add_argument("--device", default="auto", help="transformers engine: auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--gpu-memory-utilization", type=float, metavar="FRACTION",
                   help="vLLM memory share (default 0.9 on a GPU, 0.3 on the CPU where it means host memory)")
    # a switch, as vLLM's own --enforce-eager; "no" forces compilation where auto would not
    p.add_argument("--enforce-eager", nargs="?", const="yes", choices=("auto", "yes", "no"), default="auto",
                   help="vLLM without torch.compile/CUDA graphs (--enforce-eager alone: yes; auto, the default: no "
                        "on a GPU or with pipeline stages, yes otherwise on the CPU)")
    p.add_argument("--vllm", action="append", default=[], metavar="KEY=VALUE",
                   help="vLLM: any other vllm.LLM argument, e.g. max_model_len=4096 (value parsed as JSON when it "
                        "can be), repeatable")


class _Layers(argparse.Action):
    """``--layers`` in either spelling as one text: ``8 16 24``, ``8,16,24`` or a mix give
    ``8,16,24``; ``all``, ``lastN`` or ``-1`` as typed (``swift_fast.rewards.head.resolve_layers``
    reads it)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if len(values) > 1:
            words = [w for v in values for w in v.split(",") if w.strip()]
            if not all(re.fullmatch(r"-?\d+", w.strip()) for w in words):
                positional = [a.metavar or a.dest for a in parser._get_positional_actions()]
                hint = f"; put {positional[0]} before --layers, which takes every word after it" if positional else ""
                raise argparse.ArgumentError(
                    self, f"{' '.join(values)}: expected indices (8 16 24 or 8,16,24), lastN or all{hint}")
            values = [",".join(w.strip() for w in words)]
        setattr(namespace, self.dest, values[0])


def add_layers(p, help: str, default: str | None = None, flag: str = "--layers") -> None:
    """``--layers`` (one or more words): the hidden states a head reads, the same syntax wherever it
    is given (``train``, ``import-head``): ``all``, ``lastN`` or indices ``8 16 24`` / ``8,16,24``."""
    p.add_argument(flag, dest="layers", nargs="+", action=_Layers, default=default, metavar="L", help=help)


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
    :func:`add_generation_args` and :func:`add_engine_args`' options (``--engine`` where the command
    has it, else ``engine``)."""
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
