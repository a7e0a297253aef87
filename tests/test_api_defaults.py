"""The Python API and the command line share their defaults: a job called from Python with its
config's defaults does what the command does with no options.

The real parsers are built (``swift_fast.cli.build_parser``) and given only the required options;
their values, converted by the commands' own conversions, must equal the library's default configs
(``CollectConfig``, ``EngineConfig``, ``BonConfig``, ``TrainSettings``), and each option's raw
default must equal the field it sets. Every field of a config is either set by an option named
here or listed as one no option sets, so a new field or option shows up here.
"""

from __future__ import annotations

import inspect
from dataclasses import fields

import pytest

from swift_fast import cli
from swift_fast.cli import options
from swift_fast.jobs.bon import BonConfig
from swift_fast.jobs.collect import CollectConfig, run_collect
from swift_fast.jobs.engine import EngineConfig
from swift_fast.training import TrainSettings

REQUIRED = {
    "collect": ["--model", "M", "--data", "D", "--out", "O"],
    "bon": ["--model", "M", "--head", "H", "--data", "D"],
    "train": ["--model", "M", "--rollouts", "R", "--out", "O"],
}


def _command(monkeypatch, name: str):
    """``(subparser, parsed args)`` of command ``name`` with its required options only."""
    monkeypatch.setattr(cli, "_ARGV", [name])  # the parser builds only the chosen command's options
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[name]
    return sub, parser.parse_args([name, *REQUIRED[name]])


def _raw_defaults(sub, config, pairs: dict[str, str], unset: set[str]):
    """Each option's default (``pairs``: option dest -> config field) equals the field's value in
    ``config``, the library's default config; ``unset``: its fields no option of this command sets."""
    defaults = {f.name: getattr(config, f.name) for f in fields(config)}
    assert set(pairs.values()) | unset == set(defaults), "a config field is neither an option nor listed as unset"
    for dest, field_name in pairs.items():
        assert sub.get_default(dest) == defaults[field_name], (dest, sub.get_default(dest), defaults[field_name])


# CollectConfig fields no generating command sets: vLLM keywords go through EngineConfig, the
# plugin's per-request settings are bon's own
COLLECT_UNSET = {"vllm_kwargs", "plugin_args", "truncation"}
COLLECT_PAIRS = {o: o for o in ("temperature", "top_p", "max_new_tokens", "seed", "template", "system", "chunk",
                                "grade_timeout")}
ENGINE_PAIRS = {o: o for o in ("dtype", "data_parallel_size", "tensor_parallel_size", "pipeline_parallel_size")}


def test_collect_defaults_are_the_librarys(monkeypatch):
    sub, args = _command(monkeypatch, "collect")
    assert options.collect_config(args) == CollectConfig()
    assert options.engine_config(args) == EngineConfig()
    _raw_defaults(sub, CollectConfig(), {"n": "n", **COLLECT_PAIRS}, COLLECT_UNSET)
    assert sub.get_default("lenient_truncation") is False and CollectConfig().truncation == "strict"
    _raw_defaults(sub, EngineConfig(), {"engine": "engine", "device": "device",
                                      "gpu_memory_utilization": "gpu_memory_utilization", **ENGINE_PAIRS},
                  {"enforce_eager", "vllm_kwargs"})
    assert sub.get_default("enforce_eager") == "auto" and EngineConfig().enforce_eager is None  # auto = None
    # the job's own keywords: the options of the same names (progress is --no-progress)
    params = inspect.signature(run_collect).parameters
    dests = {a.dest for a in sub._actions}
    # (model, data, out are required; engine is the EngineConfig above, not an option's value)
    shared = [name for name in params if name in dests and name not in ("model", "data", "out", "engine")]
    assert {"kind", "limit", "verbose"} <= set(shared)
    for name in shared:
        assert params[name].default == sub.get_default(name), name
    assert params["progress"].default is (not sub.get_default("no_progress"))


def test_bon_defaults_are_the_librarys(monkeypatch):
    from swift_fast.cli.bon import bon_config

    sub, args = _command(monkeypatch, "bon")
    assert bon_config(args) == BonConfig()
    _raw_defaults(sub, BonConfig().collect, {"n": "n", **COLLECT_PAIRS}, COLLECT_UNSET)
    # only n differs from collect's (16, not 8), and BonConfig says so in its own default
    assert BonConfig().collect == CollectConfig(n=16) and sub.get_default("n") == 16 != CollectConfig().n
    bon = {f.name: f.default for f in fields(BonConfig)}
    for dest in ("kind", "limit", "bootstrap"):
        assert sub.get_default(dest) == bon[dest], dest
    assert sub.get_default("sar") is bon["sar"] is False and sub.get_default("prune") is bon["prune"] is None
    assert sub.get_default("no_progress") is (not bon["progress"]) and sub.get_default("verbose") is bon["verbose"]
    assert sub.get_default("plot") is None and bon["plot"] is True and bon["plot_path"] is None  # no --plot: drawn
    assert sub.get_default("json") is bon["summary_path"] is None and sub.get_default("ks") is bon["ks"] is None
    # bon always runs vLLM: its engine default says so, the rest is EngineConfig's
    assert BonConfig().engine == EngineConfig(engine="vllm")
    for dest in ENGINE_PAIRS:
        assert sub.get_default(dest) == getattr(EngineConfig(), dest), dest


def test_train_defaults_are_the_librarys(monkeypatch):
    from swift_fast.cli.train import lambdas_of, settings_of
    from swift_fast.jobs.train import plan_train, run_train

    sub, args = _command(monkeypatch, "train")
    assert settings_of(args) == TrainSettings()
    # each option's default is the field's: the options show it as typed (1e-4), argparse converts it
    for f in fields(TrainSettings):
        value = getattr(args, f.name)
        assert (lambdas_of(value) if f.name == "lambdas" else value) == f.default, (f.name, value, f.default)
        assert type(value) is type(f.default) or f.name == "lambdas", f.name
    # the job's own keywords
    assert inspect.signature(plan_train).parameters["cache_dir"].default is sub.get_default("cache_dir") is None
    run = inspect.signature(run_train).parameters
    assert run["dtype"].default == sub.get_default("dtype") == "auto"
    assert run["device"].default == sub.get_default("device") == "auto"
    assert run["progress"].default is (not sub.get_default("no_progress"))


@pytest.mark.parametrize("command", sorted(REQUIRED))
def test_the_parsers_build_without_the_other_commands(monkeypatch, command):
    """What the tests above rely on: the parser of one command alone, with its full options."""
    sub, _ = _command(monkeypatch, command)
    assert any(a.dest == "model" for a in sub._actions)
