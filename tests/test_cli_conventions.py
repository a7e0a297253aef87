"""The command line as one vocabulary: every parser of `swift-fast` read as it is built, so that an
option two commands share has one spelling and one shape, old spellings stay hidden aliases, every
`--help` example parses (and the cheap ones run), and `serve` reads its command line the way
`vllm serve` users write it."""

from __future__ import annotations

import argparse
import json
import re
import shlex

import pytest

import swift_fast.cli as cli
from swift_fast.cli import COMMANDS, EPILOG, build_parser, main
from swift_fast.data.rollouts import Problem, write_rollouts

# -- every parser -----------------------------------------------------------------------------------


def _parser(monkeypatch=None) -> argparse.ArgumentParser:
    """The real `swift-fast` parser with every command's module loaded (``main`` loads only the
    command it runs)."""
    if monkeypatch is not None:
        monkeypatch.setattr(cli, "_ARGV", list(COMMANDS))
        return build_parser()
    saved = cli._ARGV
    cli._ARGV = list(COMMANDS)
    try:
        return build_parser()
    finally:
        cli._ARGV = saved


def _subparsers(parser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser by name; a command with subcommands (``head info``) adds each of them."""
    out = {}
    for name, p in _subparsers(_parser()).items():
        out[name] = p
        for inner, q in _subparsers(p).items():
            out[f"{name} {inner}"] = q
    return out


def _options(p):
    """(action, visible) for each of ``p``'s own arguments (help and subcommand choosers left out)."""
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction, argparse._VersionAction)):
            continue
        yield a, a.help is not argparse.SUPPRESS


def _spelling(a) -> tuple[str, ...]:
    """An argument's visible spelling: its option strings (a --no-X negation is the same option), or
    POSITIONAL."""
    if not a.option_strings:
        return ("POSITIONAL",)
    negations = isinstance(a, argparse.BooleanOptionalAction)
    return tuple(sorted(s for s in a.option_strings if not (negations and s.startswith("--no-"))))


#: dests given as a positional by one command and as an option by others, and why that is the one
#: spelling each command should have
SUBJECT_POSITIONALS = {
    "model": "`serve MODEL` is `vllm serve MODEL`; every other command takes --model",
    "rollouts": "`eval ROLLOUTS`: the file is eval's one subject; score and train read it beside --model",
    "head": "`head info HEAD`, `head push HEAD REPO`: the head is the subcommand's subject",
}

#: options that mean one thing under two names; a command uses one name of each group
SYNONYMS = [
    {"engine", "backend"},
    {"overwrite", "no_resume"},
    {"out", "output", "output_dir"},
    {"n", "num_candidates", "num_samples"},
    {"no_progress", "quiet"},
    {"sar", "with_sar"},
]

#: two visible spellings kept on purpose, with the reason
KEPT = {
    # import-head's options mirror, one to one, the options of the reference code whose checkpoint
    # it converts (--layers, --apply_norm, --logits_mode), and its errors name them that way
    frozenset({"feature", "logits"}): "import-head --logits is the reference's --logits_mode",
}

#: a flag that is a switch in one command and takes a value in another, kept for now, with why
SHAPES_KEPT = {
    "--json": "`head info --json` prints JSON; `eval`/`bon --json PATH` write the summary to PATH",
}


def test_every_option_has_one_visible_spelling_across_commands():
    spellings: dict[str, dict[tuple, list[str]]] = {}
    for name, p in _commands().items():
        for a, visible in _options(p):
            if visible:
                spellings.setdefault(a.dest, {}).setdefault(_spelling(a), []).append(name)
    bad = {}
    for dest, seen in spellings.items():
        named = {s: c for s, c in seen.items() if s != ("POSITIONAL",) or dest not in SUBJECT_POSITIONALS}
        if len(named) > 1:
            bad[dest] = named
    assert not bad, f"one option, several visible spellings (dest: spelling -> commands): {bad}"
    dests = {d for d in spellings}
    for group in SYNONYMS:
        used = group & dests
        assert len(used) <= 1 or frozenset(used) in KEPT, f"synonyms in use: {sorted(used)}"
    for pair in KEPT:
        assert pair <= dests, f"KEPT lists {sorted(pair)}, which are no longer both in use: drop it"


def test_every_visible_option_has_one_long_spelling():
    """Two visible long spellings on one option (``--temperature``/``--temp``) are two spellings even
    when every command has both; the short ``-x`` forms and ``--no-X`` negations are not counted."""
    bad = {}
    for name, p in _commands().items():
        for a, visible in _options(p):
            longs = [s for s in _spelling(a) if s.startswith("--")]
            if visible and len(longs) > 1:
                bad[f"{name} {a.dest}"] = longs
    assert not bad, f"options with several visible long spellings: {bad}"


def test_the_long_spelling_check_sees_a_second_spelling():
    p = argparse.ArgumentParser()
    p.add_argument("--temperature", "--temp", type=float)
    p.add_argument("--standardize", action=argparse.BooleanOptionalAction)
    (t, _), (z, _) = list(_options(p))
    assert _spelling(t) == ("--temp", "--temperature") and _spelling(z) == ("--standardize",)


def test_every_flag_has_one_shape_across_commands():
    """A flag is a switch everywhere or takes a value everywhere (eval's --sar was a column's name
    while `bon --sar` is a switch)."""
    shapes: dict[str, dict[str, list[str]]] = {}
    for name, p in _commands().items():
        for a, visible in _options(p):
            for flag in a.option_strings if visible else ():
                shapes.setdefault(flag, {}).setdefault("switch" if a.nargs == 0 else "value", []).append(name)
    bad = {f: s for f, s in shapes.items() if len(s) > 1 and f not in SHAPES_KEPT}
    assert not bad, f"flags that are a switch in one command and take a value in another: {bad}"


def test_hidden_spellings_are_aliases_of_a_visible_option():
    """A hidden option is an old spelling kept working: same destination as a visible one."""
    hidden_seen = set()
    for name, p in _commands().items():
        opts = list(_options(p))
        visible = {a.dest for a, v in opts if v}
        for a, v in opts:
            if not v:
                assert a.dest in visible, f"{name}: hidden {a.option_strings} is nobody's alias"
                assert a.default is argparse.SUPPRESS or a.default == next(
                    b.default for b, vb in opts if vb and b.dest == a.dest), f"{name}: {a.option_strings}' default"
                hidden_seen.update(f"{name} {s}" for s in a.option_strings)
    assert {"eval -n", "demo --backend", "score --no-resume"} <= hidden_seen


@pytest.mark.parametrize("argv, dest, value", [
    (["eval", "r.jsonl", "-n", "3"], "n", 3),
    (["eval", "r.jsonl", "--n", "3"], "n", 3),
    (["demo", "--backend", "transformers"], "engine", "transformers"),
    (["demo"], "engine", "auto"),
    (["score", "--model", "M", "--head", "H", "--rollouts", "R", "--out", "S", "--no-resume"], "overwrite", True),
    (["eval", "r.jsonl", "--sar", "sar"], "sar_column", "sar"),
    (["eval", "--sar", "col", "r.jsonl"], "sar_column", "col"),
    (["eval", "--sar=col", "r.jsonl"], "sar_column", "col"),
    (["eval", "--sar", "r.jsonl"], "rollouts", "r.jsonl"),
    (["train", "--model", "M", "--rollouts", "R", "--out", "H", "--layers", "0", "8", "16"], "layers", "0,8,16"),
    (["train", "--model", "M", "--rollouts", "R", "--out", "H", "--layers", "0,8,16"], "layers", "0,8,16"),
    (["import-head", "c.pt", "--model", "M", "--layers", "8", "16"], "layers", "8,16"),
    (["import-head", "c.pt", "--model", "M", "--layers", "8,16"], "layers", "8,16"),
    (["collect", "--model", "M", "--data", "d", "--out", "o", "--enforce-eager"], "enforce_eager", "yes"),
    (["bon", "--model", "M", "--head", "H", "--data", "d", "--enforce-eager", "no"], "enforce_eager", "no"),
])
def test_old_and_new_spellings_parse_to_the_same_option(monkeypatch, argv, dest, value):
    assert getattr(_parser(monkeypatch).parse_args(argv), dest) == value


def test_eval_n_is_not_ambiguous(monkeypatch, capsys):
    # 0.1: `eval --n 8` was "ambiguous option: --n could match --no-ci, --no-trivial"
    assert _parser(monkeypatch).parse_args(["eval", "r.jsonl", "--n", "8"]).n == 8


def test_layers_refuse_a_word_that_is_not_an_index(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        _parser(monkeypatch).parse_args(["import-head", "--layers", "8", "16", "c.pt", "--model", "M"])
    assert "put CKPT before --layers" in capsys.readouterr().err


def test_data_help_says_names_need_swift_fast_data(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        _parser(monkeypatch).parse_args(["bon", "--help"])
    assert "SWIFT_FAST_DATA" in capsys.readouterr().out


# -- --help examples ------------------------------------------------------------------------------


def _examples(text: str) -> list[list[str]]:
    """The `swift-fast ...` lines of a help text, continuations joined, comments and the program name
    dropped; a line that elides its options (`...`) is not a command line."""
    lines, out = [], []
    for raw in text.splitlines():
        line = raw.strip()
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + line
        else:
            lines.append(line)
    for line in lines:
        if line.startswith("swift-fast "):
            words = shlex.split(line, comments=True)[1:]
            if "..." not in words:
                out.append(words)
    return out


def _all_examples() -> list[list[str]]:
    found = _examples(EPILOG)
    for name, p in _subparsers(_parser()).items():
        assert p.epilog and _examples(p.epilog), f"`swift-fast {name} --help` shows no example"
        found += _examples(p.epilog)
    return found


@pytest.mark.parametrize("argv", _all_examples(), ids=" ".join)
def test_every_help_example_parses(monkeypatch, argv):
    try:
        _parser(monkeypatch).parse_args(argv)
    except SystemExit as e:  # argparse's error went to stderr; say which example
        pytest.fail(f"`swift-fast {shlex.join(argv)}` does not parse (exit {e.code})")


def _candidates(k: int, seed: int, with_sar: bool = True) -> list[dict]:
    out = []
    for i in range(k):
        right = (i * 7 + seed) % 3 == 0
        c = {"token_ids": list(range(1 + (i + seed) % 5)), "text": f"The answer is ({'B' if right else 'C'}).",
             "answer": "B" if right else "C", "correct": right, "swift_score": ((i * 13 + seed) % 11) / 10,
             "rm_score": ((i * 5 + seed) % 7) / 7, "mean_logprob": -((i + 2 * seed) % 9) / 4, "finish_reason": "stop"}
        if with_sar:
            c["sar"] = ((i * 3 + seed) % 5) / 5 - 0.4
        out.append(c)
    return out


def _rollouts(path, k: int = 16, problems: int = 3, with_sar: bool = True) -> None:
    write_rollouts(path, [Problem(id=f"p{j}", candidates=_candidates(k, j, with_sar), reference="B", kind="choice")
                          for j in range(problems)])


def test_eval_help_examples_run_on_rollout_files(monkeypatch, tmp_path, capsys):
    """`eval --help`'s examples as written (fewer bootstrap resamples) on files with the columns they
    name: bon --sar's, a reward model's and the trivial selectors'."""
    monkeypatch.chdir(tmp_path)
    for name in ("scored.jsonl", "rollouts.jsonl", "bon.jsonl"):
        _rollouts(tmp_path / name)
    examples = [a for a in _examples(_subparsers(_parser())["eval"].epilog)]
    assert len(examples) >= 4
    for argv in examples:
        assert main([*argv, "--bootstrap", "50"]) == 0, argv
        out = capsys.readouterr().out
        sar_rows = re.search(r"^SAR ", out, re.M) is not None
        assert sar_rows == ("--no-sar" not in argv), (argv, out)  # shown because the file has `sar`
        if "--external" in argv:
            assert "SWIFT+rm_score rank" in out
    assert (tmp_path / "bon.png").exists() and (tmp_path / "scored.bon.png").exists()


def _reference_model(folder, layers: int = 28, hidden: int = 64, vocab: int = 96) -> str:
    """What import-head reads of a model: its config and, for --apply-norm, the final norm's weight."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                intermediate_size=hidden, vocab_size=vocab).save_pretrained(folder)
    save_file({"model.norm.weight": torch.rand(hidden) + 0.5}, str(folder / "model.safetensors"))
    return str(folder)


def test_import_head_help_examples_run_on_a_checkpoint(monkeypatch, tmp_path, capsys):
    """The examples with model M, M a local folder (config and final norm) with enough layers for
    `--layers 8 16 24 28`, each checkpoint shaped as its example's options say."""
    pytest.importorskip("transformers")
    import torch

    monkeypatch.chdir(tmp_path)
    model = _reference_model(tmp_path / "M")
    parser = _parser(monkeypatch)
    ran = 0
    for argv in _examples(_subparsers(parser)["import-head"].epilog):
        if argv[argv.index("--model") + 1] != "M":
            continue  # a Hub model: not offline
        args = parser.parse_args(argv)
        D = 96 if args.logits else 64 * (len(args.layers.split(",")) if args.layers else 29)
        torch.save({"fused_layer.weight": torch.randn(2, D), "fused_layer.bias": torch.randn(2)}, args.checkpoint)
        argv[argv.index("--model") + 1] = model
        assert main(argv) == 0, (argv, capsys.readouterr().err)
        assert "wrote " in capsys.readouterr().out
        ran += 1
    assert ran >= 3


# -- serve: this command's options anywhere, the rest vLLM's -------------------------------------------

#: each of serve's own options with a value, and what it parses to
SERVE_OWN = [
    (["--head", "h.safetensors"], "head", "h.safetensors"),
    (["--sar"], "sar", True),
    (["--sar-context", "Answer:"], "sar_context", "Answer:"),
    (["--max-best-of-n", "8"], "max_best_of_n", 8),
    (["--select", "rank"], "select", "rank"),
    (["--select", "vote:confidence_tail"], "select", "vote:confidence_tail"),
    (["--answer", "math"], "answer", "math"),
    (["--confidence-window", "64"], "confidence_window", 64),
    (["--prune", "keep=0.5"], "prune", "keep=0.5"),
    (["--prune"], "prune", "{}"),
    (["--verbose"], "verbose", True),
    (["--startup-log", "s.log"], "startup_log", "s.log"),
]
VLLM = ["--port", "8001", "--max-model-len", "4096", "-tp", "2", "--enable-prefix-caching"]


def _serve(monkeypatch, *argv):
    return _parser(monkeypatch).parse_args(["serve", *argv])


def _head(own):
    return [] if own[0] == "--head" else ["--head", "h.safetensors"]


@pytest.mark.parametrize("own, dest, value", SERVE_OWN, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
@pytest.mark.parametrize("where", ["before", "after", "between", "last"])
def test_serve_own_options_anywhere(monkeypatch, own, dest, value, where):
    argv = {"before": [*own, *_head(own), "M", *VLLM],
            "after": ["M", *own, *_head(own), *VLLM],
            "between": ["M", *VLLM[:2], *own, *VLLM[2:], *_head(own)],
            "last": ["M", *_head(own), *VLLM, *own]}[where]
    args = _serve(monkeypatch, *argv)
    assert args.model == "M" and getattr(args, dest) == value and args.head == "h.safetensors"
    assert args.vllm_args == VLLM  # in order, nothing of this command's


@pytest.mark.parametrize("own, dest, value", [x for x in SERVE_OWN if len(x[0]) == 2],
                         ids=lambda x: x[0] if isinstance(x, list) else None)
def test_serve_own_options_with_equals(monkeypatch, own, dest, value):
    args = _serve(monkeypatch, "M", "--port", "8001", f"{own[0]}={own[1]}", *_head(own))
    assert getattr(args, dest) == value and args.vllm_args == ["--port", "8001"]


def test_serve_words_that_look_like_own_options_stay_vllms(monkeypatch):
    # a vLLM value spelled like this command's option: argparse (vLLM's) needs the = form for it
    args = _serve(monkeypatch, "M", "--head", "h", "--served-model-name=--sar", "--chat-template", "t.jinja")
    assert args.sar is False and args.vllm_args == ["--served-model-name=--sar", "--chat-template", "t.jinja"]
    # after `--`, every word is vLLM's as written
    args = _serve(monkeypatch, "M", "--head", "h", "--port", "8001", "--", "--sar", "--select", "x")
    assert args.sar is False and args.select is None  # the plugin's default: swift with a head
    assert args.vllm_args == ["--port", "8001", "--sar", "--select", "x"]
    args = _serve(monkeypatch, "--head", "h", "--", "M", "--sar")
    assert args.model == "M" and args.sar is False and args.vllm_args == ["--sar"]
    # an unknown option is vLLM's, and so is a prefix of one of this command's (no abbreviations)
    args = _serve(monkeypatch, "M", "--head", "h", "--no-such-flag", "--sa", "--max-best", "3")
    assert args.vllm_args == ["--no-such-flag", "--sa", "--max-best", "3"] and args.max_best_of_n is None
    # --prune takes SETTINGS only when the next word is some: MODEL after it stays MODEL
    args = _serve(monkeypatch, "--head", "h", "--prune", "M", "--port", "1")
    assert args.model == "M" and args.prune == "{}" and args.vllm_args == ["--port", "1"]
    args = _serve(monkeypatch, "M", "--head", "h", "--prune", '{"keep": 0.5}')
    assert args.prune == '{"keep": 0.5}' and args.vllm_args == []


@pytest.mark.parametrize("argv, message", [
    (["--port", "8001", "M", "--head", "h"], "--port before MODEL: vLLM's options go after the model"),
    (["M", "--port", "1", "--head"], "argument --head: expected one argument"),
    (["M", "--head", "h", "--select", "best"], "argument --select: 'best' is not a selector; the selectors: a value"),
    (["M", "--answer", "number"], "argument --answer: invalid choice"),
    (["M", "--head", "h", "--sar=yes"], "argument --sar: ignored explicit argument"),
])
def test_serve_command_line_errors_are_argparse_errors(monkeypatch, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        _serve(monkeypatch, *argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_serve_help_after_the_model_is_this_commands(monkeypatch, capsys):
    with pytest.raises(SystemExit) as e:
        _serve(monkeypatch, "M", "--port", "1", "--help")
    assert e.value.code == 0 and "swift-fast serve MODEL" in capsys.readouterr().out


def test_serve_sar_after_the_model_reaches_the_plugin_config(monkeypatch):
    from swift_fast.cli.serve import vllm_argv

    args = _serve(monkeypatch, "M", "--port", "9", "--head", "h.safetensors", "--sar", "--select=rank",
                  "--additional-config", '{"other": 1}')
    argv = vllm_argv(args)
    assert argv[:4] == ["serve", "M", "--port", "9"] and argv[4] == "--additional-config"
    assert json.loads(argv[5]) == {"other": 1, "swift_fast": {"head": "h.safetensors", "sar": True, "select": "rank"}}


@pytest.mark.parametrize("spelling", [["--additional_config", '{"other": 1}'], ['--additional_config={"other": 1}']])
def test_serve_merges_the_underscore_spelling_of_additional_config(monkeypatch, spelling):
    from swift_fast.cli.serve import vllm_argv

    argv = vllm_argv(_serve(monkeypatch, "M", "--head", "h.safetensors", *spelling))
    assert argv[:2] == ["serve", "M"] and argv.count("--additional-config") == 1 and "--additional_config" not in argv
    assert json.loads(argv[argv.index("--additional-config") + 1])["other"] == 1


def test_serve_refuses_the_dotted_additional_config_that_would_drop_the_head(monkeypatch):
    from swift_fast.cli.serve import vllm_argv

    with pytest.raises(ValueError, match="as one JSON object"):
        vllm_argv(_serve(monkeypatch, "M", "--head", "h.safetensors", "--additional-config.foo", "1"))


@pytest.mark.parametrize("pair, says", [("dtype=float16", "--dtype"), ("seed=3", "--seed"), ("model=x", "--model")])
def test_vllm_keywords_that_have_their_own_option_are_refused(pair, says):
    from swift_fast.jobs.engine import parse_vllm_kwargs

    with pytest.raises(ValueError, match=says):
        parse_vllm_kwargs([pair])


def test_select_help_names_every_selector_of_by_value(monkeypatch):
    """`--select` lists the selectors in words (its parser must not import torch for `--help`);
    the list is held here to swift_fast.selection.by_value's, and every name it lists parses."""
    from swift_fast.cli.options import SELECTORS_HELP, selector
    from swift_fast.selection.by_value import COMBINATIONS, VALUES

    for name in (*VALUES, *COMBINATIONS, "vote", "vote:<value>"):
        assert re.search(rf"(^|[\s(]){re.escape(name)}(?![\w:])", SELECTORS_HELP), name
    for name in (*VALUES, *COMBINATIONS, "vote", *(f"vote:{v}" for v in VALUES)):
        assert selector(name) == name
    for command in ("bon", "serve"):
        action = next(a for a in _commands()[command]._actions if a.dest == "select")
        assert SELECTORS_HELP in action.help and action.default is None


def test_serve_without_a_head_starts_the_plugin_with_its_head_free_values(monkeypatch):
    """No --head: the plugin's section has no head (the head-free values), --select / --answer /
    --confidence-window reach it, and a selector that needs what is not given is refused by option."""
    from swift_fast.cli.serve import vllm_argv

    argv = vllm_argv(_serve(monkeypatch, "M", "--port", "9"))
    assert argv == ["serve", "M", "--port", "9", "--additional-config", '{"swift_fast": {"sar": false}}']
    argv = vllm_argv(_serve(monkeypatch, "M", "--select", "vote:confidence_tail", "--answer", "math",
                            "--confidence-window", "64", "--sar"))
    assert json.loads(argv[-1]) == {"swift_fast": {"sar": True, "select": "vote:confidence_tail", "answer": "math",
                                                   "confidence_window": 64}}
    for args, message in [(["--select", "swift"], "--select swift needs --head (the head-free selectors: "),
                          (["--select", "rank"], "--select rank needs --head and --sar"),
                          (["--select", "vote"], "--select vote needs --answer"),
                          (["--prune", "keep=0.5"], "--prune: signal 'swift' ranks candidates by their running SWIFT "
                                                    "score, which needs a SWIFT head")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            vllm_argv(_serve(monkeypatch, "M", *args))
    prune = json.loads(vllm_argv(_serve(monkeypatch, "M", "--prune", "signal=confidence"))[-1])["swift_fast"]["prune"]
    assert prune["signal"] == "confidence"
