"""Best-of-N over a dataset with vLLM, every candidate valued while its tokens are generated: the
job behind ``swift-fast bon`` (:func:`run_bon`).

One vLLM engine with the swift-fast plugin attached (``additional_config["swift_fast"] =
{"head": path (absent without a head), "sar": bool, "confidence_window": tokens}``) samples N
candidates per problem with the prompts, sampling and per-problem seeds of :mod:`.collect`, and
grades them. :class:`ScoredVLLMEngine` keeps the plugin's values on each candidate, under the
names of the plugin's outputs: the head-free ones always (``mean_logprob``, DeepConf's
``confidence_lowest_group``, ``confidence_tail``, ``confidence_bottom10``) with ``num_tokens``
and ``swift_pruned``; with a head ``swift_score`` and ``swift_tokens``; with SAR ``sar`` and
``sar_context``. ``swift-fast eval`` on the rollouts shows the rows this job reports.

Without a head the report has no SWIFT rows: its headline is the selector ``select`` names (a
:mod:`swift_fast.selection.by_value` selector; default SWIFT with a head, else DeepConf's lowest
group confidence, the plugin's own default). A selector that needs what the run lacks (``swift``
without a head, ``sar`` without SAR) is refused before anything starts.

Files, ``<base>`` being ``out`` without its extension:

=======================  =========================================================================
``out``                  the rollouts, one problem a line (resumable: a rerun skips those there)
``<base>.run.json``      the run's record: what determines the rollouts (:mod:`.run_record`)
``<base>.vllm.log``      vLLM's own output (unless ``verbose``)
``<base>.bon.png``       accuracy against k, a line per selector (``plot``; ``plot_path`` moves it)
``<base>.summary.json``  the table, the summary under it, the run's facts, with pruning its comparison
``<base>.pruned.jsonl``  with pruning: the pruned run, on the same problems with the same seeds
                         (its record ``<base>.pruned.run.json``)
``<base>.prune.png``     with pruning: accuracy against tokens of the sweep, the pruned run a star
``<base>.deepconf.jsonl``  with DeepConf online: its run, on the same problems with the same seeds
=======================  =========================================================================

Every run is traced (``plugin_args["trace"]``): its per-token values come back with each
candidate, kept on it only where a pruning sweep replays them.

Pruning (``BonConfig.prune``): a second run with the weakest candidates stopped while they are
generated. Both runs are traced, so their vLLM wall times differ by the pruning alone; the full
run keeps its per-token values (``swift_trace``) for the sweep, which replays a grid of settings
on them (``swift_fast.reports.pruning``; without a head, the signals that need none). Both runs
are compared by the headline selector.

DeepConf online (``BonConfig.deepconf``): one more run, each problem's candidates stopped by the
plugin's DeepConf online (:mod:`swift_fast.vllm_plugin.deepconf`), compared with the full run as
the pruned run is (tokens, vLLM wall time, BoN@N by the headline selector with the paired
interval, and by DeepConf's own confidence-weighted vote), and its decisions replayed on the full
run's per-token values and graded answers (:func:`swift_fast.selection.deepconf.replay`): the
share of candidates whose fate the replay reproduces. The engine extracts answers for its
consensus stop with the run's grading kind (the plugin's ``answer``), so the replay's answers are
the graded ones.

A run resumes a rollout file only when the file is of the same run: the same model, head (or
none), data, prompts, sampling, grading, engine settings and plugin settings (the pruned run's
include the pruning), as its record says (:mod:`.run_record`); else it is refused before the
engine starts, naming the first difference, and ``overwrite=True`` starts again. The summary
carries the records. A rerun with nothing left to generate starts no engine.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from ..reports import best_of_n as report
from ..rewards.confidence import DEFAULT_WINDOW
from ..selection.by_value import (
    DEFAULT_HEAD_FREE,
    FIELD,
    HEAD_FREE,
    Available,
    SelectorError,
    check_prune,
    needs,
    parse,
)
from ..selection.deepconf import DeepConfConfig
from ..selection.pruning import PruneConfig
from .collect import CollectConfig, collect, pending
from .engine import EngineConfig, VLLMEngine, make_engine, parallel_kwargs
from .run_record import RunRecord, build, prepare


def default_out(data: str, n: int) -> str:
    """``bon-<data file or name>-n<N>.jsonl``: where the rollouts go when no path is given."""
    stem = os.path.splitext(os.path.basename(str(data).rstrip("/")))[0] or "data"
    return f"bon-{stem}-n{n}.jsonl"


class ScoredVLLMEngine(VLLMEngine):
    """:class:`.engine.VLLMEngine` with the plugin's values kept on each candidate, and the wall
    time spent inside vLLM's ``generate`` counted."""

    name = "vllm+swift"

    seconds = 0.0  # wall time inside vLLM's generate
    #: whether the engine has a SWIFT head (its ``swift_score`` is kept); whether the per-token
    #: values stay on each candidate (a pruning sweep replays them)
    has_head = True
    keep_trace = False

    def generate(self, prompts, seeds, cfg, contexts=None, bar=None):
        seen = []
        orig = self.llm.generate

        # vLLM's outputs carry the plugin's values; the parent keeps only token ids and text of
        # them, so they are caught on the way through
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
                self._keep_scores(c, out)
        return result

    def _keep_scores(self, c: dict, out) -> None:
        """Copy one vLLM completion's plugin values onto its candidate ``c``."""
        if self.has_head:
            c["swift_score"] = out.swift_score
            c["swift_tokens"] = out.swift_tokens
        c["swift_pruned"] = bool(getattr(out, "swift_pruned", False))
        if getattr(out, "deepconf", None) is not None:
            c["deepconf"] = dict(out.deepconf)
        c["num_tokens"] = len(c["token_ids"])
        for name in HEAD_FREE:
            c[name] = getattr(out, name, None)
        if hasattr(out, "sar"):
            c["sar"] = out.sar
            c["sar_context"] = out.sar_context
        if self.keep_trace and getattr(out, "swift_trace", None) is not None:
            c["swift_trace"] = out.swift_trace


@dataclass
class BonConfig:
    """Settings of :func:`run_bon`; the defaults are ``swift-fast bon``'s."""

    #: prompts, sampling and grading: candidates per problem (``n``), temperature, top-p, the
    #: most new tokens, seed, template, system prompt, problems per engine call, grading
    collect: CollectConfig = field(default_factory=lambda: CollectConfig(n=16))
    #: the vLLM engine: dtype, parallelism, other ``vllm.LLM`` keywords ("auto" means vLLM here:
    #: the plugin scores inside it)
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(engine="vllm"))
    #: also compute SAR in the engine, and report SAR and its combinations with SWIFT
    sar: bool = False
    #: the headline selector (``swift_fast.selection.by_value``): the row the summary and the plot
    #: lead with, and what the pruned run is compared by (None: ``swift`` with a head, else
    #: DeepConf's ``confidence_lowest_group``)
    select: str | None = None
    #: tokens per group of DeepConf's group confidences in the engine (the plugin's ``confidence_window``)
    confidence_window: int = DEFAULT_WINDOW
    #: also run Best-of-N with this pruning during generation, and compare (None: no pruned run)
    prune: PruneConfig | None = None
    #: also run Best-of-N with DeepConf online, and compare (None: no DeepConf run)
    deepconf: DeepConfConfig | None = None
    #: grading kind for every problem (None: each problem's, from the dataset)
    kind: str | None = None
    #: first ``limit`` problems only (None: all)
    limit: int | None = None
    #: the table's k values (None: 1, 2, 4, ... N)
    ks: list[int] | None = None
    #: bootstrap resamples for the intervals (the pruning sweep uses at most 500)
    bootstrap: int = 2000
    #: draw the plots (``<base>.bon.png``, with pruning ``<base>.prune.png``)
    plot: bool = True
    #: where the Best-of-N plot goes (None: ``<base>.bon.png``)
    plot_path: str | None = None
    #: where the summary JSON goes (None: ``<base>.summary.json``)
    summary_path: str | None = None
    #: progress bars counting candidates as they finish (on stderr)
    progress: bool = True
    #: show vLLM's logs rather than sending its output to ``<base>.vllm.log``
    verbose: bool = False


@dataclass
class BonResult:
    """What :func:`run_bon` made; filled in as it goes (``on_table`` sees it without ``prune`` and
    ``summary_path``)."""

    out: str  # the rollout file (as given, or the default)
    pruned_out: str | None = None  # the pruned run's rollout file (with pruning)
    stats: dict = field(default_factory=dict)  # the full run's counts (``collect``'s: written, skipped_done, ...)
    seconds: float = 0.0  # wall time inside vLLM, full run
    pruned_stats: dict | None = None
    pruned_seconds: float | None = None
    table: report.Table | None = None  # Best-of-N accuracy per selector and k, with intervals
    summary: dict | None = None  # what is printed under the table (``report.selection_summary``)
    plot: str | None = None  # the Best-of-N plot's path (None: not drawn)
    #: the pruned run beside the full one, as the summary JSON has it: settings, measured, replayed,
    #: seconds (None when a run resumed), rollouts, sweep, plot
    prune: dict | None = None
    summary_path: str | None = None
    run: RunRecord | None = None  # the full run's record (:mod:`.run_record`)
    pruned_run: RunRecord | None = None  # the pruned run's (with pruning)
    deepconf_out: str | None = None  # the DeepConf run's rollout file (with DeepConf)
    deepconf_stats: dict | None = None
    deepconf_seconds: float | None = None
    deepconf_run: RunRecord | None = None
    #: the DeepConf run beside the full one: settings, measured, by_vote, replay agreement, seconds
    deepconf: dict | None = None


def headline(head: str | None, config: BonConfig, recommended: str | None = None) -> str:
    """The run's headline selector: ``config.select``, else the head's ``recommended`` selector
    (``SwiftHead.recommended_select``), else ``swift`` with a head and DeepConf's lowest group
    confidence without; ``SelectorError`` (a ``ValueError``) when it needs what the run lacks (a
    head, SAR). The answers a vote reads are the graded ones: always there."""
    select = config.select or recommended or ("swift" if head is not None else DEFAULT_HEAD_FREE)
    parse(select, where="--select")  # an unknown name: SelectorError naming it and the selectors
    need = needs(select)
    missing = [what for what, want, have in (("a SWIFT head (--head)", need.head, head is not None),
                                             ("SAR (--sar)", need.sar, config.sar)) if want and not have]
    if missing:
        free = ", ".join([*HEAD_FREE, "vote", *(f"vote:{v}" for v in HEAD_FREE)])
        raise SelectorError(f"--select {select} needs {' and '.join(missing)}"
                            + (f"; the selectors without a head: {free}" if need.head and head is None else ""))
    return select


def run_bon(model: str, head: str | None, data: str, out: str | os.PathLike | None = None,
            config: BonConfig | None = None, on_table: Callable[[BonResult], None] | None = None,
            overwrite: bool = False) -> BonResult:
    """Best-of-N of ``model`` on ``data`` (a dataset file or name), valued in vLLM by the plugin:
    with the SWIFT head ``head`` (a file, or a Hub repository id ``org/name[@revision][:file]``:
    ``swift_fast.hf.hub``), or, ``head`` None, by the head-free values alone; rollouts into ``out``
    (None: :func:`default_out` in the current folder).

    ``on_table``: called with the result as soon as the table, its summary and plot are ready,
    before the pruning comparison (whose sweep replays every swept setting on every candidate):
    the command line prints the table then. Rollouts of another run (their record differs) are
    refused before the engine starts, naming the first difference; ``overwrite``: remove them
    (and the pruned run's) with their records and start again."""
    from ..data.datasets import load_dataset
    from ..data.rollouts import read_rollouts
    from ..hf.hub import resolve_head
    from ..rewards.head import SwiftHead

    config = config or BonConfig()
    n = config.collect.n
    _check_settings(config, head)
    headline(head, config)  # an impossible --select fails before a head is downloaded
    out = default_out(data, n) if out is None else os.fspath(out)
    base = os.path.splitext(out)[0]
    alignment, recommended = "predicting", None  # without a head, no signal waits for a token's states
    if head is not None:
        head = resolve_head(head)  # a Hub repository id becomes its file in the Hugging Face cache
        loaded = SwiftHead.load(head)  # a bad head file fails before any work
        alignment, recommended = loaded.alignment, loaded.recommended_select
    select = headline(head, config, recommended)
    examples = load_dataset(data, kind=config.kind, limit=config.limit)
    engine = replace(config.engine, engine="vllm")
    parallel_kwargs(engine, "vllm")  # checked here: a bad setting fails before the engine starts
    dc = config.deepconf
    answer = _answer_kind(config, examples) if dc is not None and dc.consensus is not None else None
    result = BonResult(out=out, pruned_out=base + ".pruned.jsonl" if config.prune is not None else None,
                       deepconf_out=base + ".deepconf.jsonl" if dc is not None else None)
    prepare(_records(model, data, engine, config, head, answer, result), overwrite)  # a refusal costs nothing
    _generate(model, head, examples, engine, config, result, answer)
    ids = {str(ex.id) for ex in examples}
    problems = [p for p in read_rollouts(out) if p.id in ids]
    result.table, result.summary = _table(problems, out, config, head is not None, select)
    result.summary["select"] = {"selector": select, "by": "--select" if config.select else
                                "the head's recommendation" if recommended else "default"}
    if config.plot:
        result.plot = report.plot(result.table, config.plot_path or base + ".bon.png",
                                  title=f"{os.path.basename(model)} on {os.path.basename(str(data))}",
                                  highlight=[report.selector_row(select)])
    if on_table is not None:
        on_table(result)
    if config.prune is not None:
        result.prune = _prune_comparison(problems, ids, result, config, alignment, select, head is not None)
        result.prune["run"] = result.pruned_run.sidecar()
    if dc is not None:
        result.deepconf = _deepconf_comparison(problems, ids, result, config, select, answer)
        result.deepconf["run"] = result.deepconf_run.sidecar()
    result.summary_path = report.save_json(
        result.table, config.summary_path or base + ".summary.json", summary=result.summary, model=model,
        head=os.path.abspath(head) if head is not None else None, select=select, data=str(data), n=n,
        rollouts=os.path.abspath(out), generated=result.stats["written"], resumed=result.stats["skipped_done"],
        run=result.run.sidecar(), **({"prune": result.prune} if result.prune is not None else {}),
        **({"deepconf": result.deepconf} if result.deepconf is not None else {}),
    )
    return result


def _check_settings(config: BonConfig, head: str | None) -> None:
    """Refuse, before any work, settings the run cannot use (``ValueError`` naming the option)."""
    n, window, dc = config.collect.n, config.confidence_window, config.deepconf
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"confidence_window (--confidence-window) must be a positive number of tokens, got {window!r}")
    if config.engine.engine not in ("auto", "vllm"):
        raise ValueError(f"Best-of-N scores in vLLM (the plugin): engine {config.engine.engine!r} cannot run it")
    if config.prune is not None and n < 2:
        raise ValueError("--prune stops the weakest of each problem's candidates: it needs --n 2 or more")
    if config.prune is not None:
        check_prune(config.prune, Available(head=head is not None, sar=config.sar, answers=True), where="--prune")
    if dc is not None and n <= dc.warmup:
        raise ValueError(f"--deepconf runs warmup = {dc.warmup} candidates to the end and stops later ones: it needs "
                         f"--n above {dc.warmup}")
    if dc is not None and dc.signal == "swift" and head is None:
        raise ValueError("--deepconf signal=swift thresholds the running SWIFT score: it needs --head")


def _records(model: str, data: str, engine: EngineConfig, config: BonConfig, head: str | None, answer: str | None,
             result: BonResult) -> list:
    """Each run's record into ``result`` (the plugin's settings are part of it, and read back from
    it), as ``(rollouts, record, what)`` for :func:`.run_record.prepare`."""
    stopping = config.prune is not None or config.deepconf is not None
    full = {"trace": True, "prune": False} if stopping else {"trace": True}
    result.run = build(model, data, replace(config.collect, plugin_args=full), engine, kind=config.kind, head=head,
                       sar=bool(config.sar), plugin=plugin_settings(config, answer))
    runs = [(result.out, result.run, "the full run")]
    if config.prune is not None:
        result.pruned_run = result.run.with_request({"trace": True, "prune": config.prune.to_dict()})
        runs.append((result.pruned_out, result.pruned_run, "the pruned run"))
    if config.deepconf is not None:
        result.deepconf_run = result.run.with_request({"trace": True, "deepconf": config.deepconf.to_dict()})
        runs.append((result.deepconf_out, result.deepconf_run, "the DeepConf run"))
    return runs


def plugin_settings(config: BonConfig, answer: str | None = None) -> dict:
    """The plugin's engine settings of a run but the head and SAR: those not at their default, and
    the kind of answer the engine extracts for DeepConf's consensus stop."""
    window = int(config.confidence_window)
    out = {"confidence_window": window} if window != DEFAULT_WINDOW else {}
    if answer is not None:
        out["answer"] = answer
    return out


def _answer_kind(config: BonConfig, examples) -> str | None:
    """The grading kind the engine extracts answers with for DeepConf's consensus: the run's, else
    the problems' own when they share one (else None: no consensus stop, said)."""
    if config.kind is not None:
        return config.kind
    kinds = {getattr(ex, "kind", None) for ex in examples}
    if len(kinds) == 1 and None not in kinds:
        return kinds.pop()
    import logging

    logging.getLogger("swift_fast").warning(
        "--deepconf: the problems are of several answer kinds %s: the engine extracts none, so no group stops on "
        "consensus (give --kind to use one)", sorted(str(k) for k in kinds))
    return None


def _generate(model: str, head: str | None, examples, engine_cfg: EngineConfig, config: BonConfig,
              result: BonResult, answer: str | None = None) -> None:
    """The full run into ``result.out`` and, with pruning, the pruned run into ``result.pruned_out``
    (with DeepConf, its run into ``result.deepconf_out``), on one engine (none when all are complete);
    their counts and vLLM wall times into ``result``."""
    from ..support.engine_logs import quiet_engine

    prune = config.prune
    runs = [(result.out, result.run, "full")]
    if prune is not None:
        runs.append((result.pruned_out, result.pruned_run, "pruned"))
    if config.deepconf is not None:
        runs.append((result.deepconf_out, result.deepconf_run, "deepconf"))
    needed = any(pending(examples, out) for out, _, _ in runs)
    log = os.path.splitext(result.out)[0] + ".vllm.log"
    with quiet_engine(log, verbose=config.verbose) if needed else contextlib.nullcontext():
        engine = None
        if needed:
            plugin = {**({"head": head} if head is not None else {}), "sar": bool(config.sar),
                      **plugin_settings(config, answer)}
            engine = make_engine(model, engine_cfg, seed=config.collect.seed, vllm_engine=ScoredVLLMEngine,
                                 plugin=plugin)
            engine.has_head = head is not None
        try:
            for out, run, which in runs:
                if engine is not None:
                    # every run is traced, so their times differ by the stopping alone, and the full
                    # run keeps its per-token values for the sweep and the replays
                    engine.seconds, engine.keep_trace = 0.0, which == "full" and len(runs) > 1
                cfg = replace(config.collect, plugin_args=run.record["plugin"]["request"])
                desc = {"full": "generate", "pruned": "generate, pruned", "deepconf": "generate, DeepConf"}[which]
                stats = collect(engine, getattr(engine, "tokenizer", None), examples, out, cfg,
                                progress=config.progress, model_name=model, desc=desc, run=run)
                seconds = engine.seconds if engine is not None else 0.0
                if which == "pruned":
                    result.pruned_stats, result.pruned_seconds = stats, seconds
                elif which == "deepconf":
                    result.deepconf_stats, result.deepconf_seconds = stats, seconds
                else:
                    result.stats, result.seconds = stats, seconds
        finally:
            if engine is not None:
                engine.close()


def _table(problems, out: str, config: BonConfig, has_head: bool, select: str) -> tuple[report.Table, dict]:
    """The Best-of-N table of every selector the candidates allow (SWIFT with a head, with SAR SAR
    and the combinations, the head-free selectors and DeepConf's weighted votes, majority,
    oracle; the headline ``select``'s row added where these lack it) and the summary under it."""
    sar_key = "sar" if config.sar else None
    score = "swift_score" if has_head else None
    keys = [k for k in (score, sar_key) if k]
    cands = report.gather(problems, keys, n=config.collect.n, where=out, signals=True)
    rows = report.standard_selectors(score, sar=sar_key, trivial=report.trivial_selectors(cands))
    kind, value = parse(select)
    needed = ["swift_score", "sar"] if kind in ("rank", "scaled") else [FIELD[value]] if value else []
    missing = [k for k in needed if k not in cands.scores]
    if missing:
        raise ValueError(f"{out}: the headline selector {select!r} reads {', '.join(missing)}, which no candidate has")
    table = report.bon_table(cands, report.with_selector(rows, select), config.ks, reps=config.bootstrap)
    summary = report.selection_summary(cands, table, report.selector_row(select), reps=config.bootstrap)
    return table, summary


def _prune_comparison(problems, ids: set[str], result: BonResult, config: BonConfig, alignment: str, select: str,
                      has_head: bool) -> dict:
    """The pruned run against the full one (measured), the policy replayed on the full run's
    per-token values (predicted), the sweep of settings and its plot; Best-of-N by ``select``."""
    from ..data.rollouts import read_rollouts
    from ..reports import pruning as pr

    n, prune, reps = config.collect.n, config.prune, config.bootstrap
    pruned = {p.id: p for p in read_rollouts(result.pruned_out) if p.id in ids}
    pruned_problems = [pruned[p.id] for p in problems if p.id in pruned]
    if len(pruned_problems) != len(problems):
        raise ValueError(
            f"{result.pruned_out}: {len(problems) - len(pruned_problems)} problems of the full run are missing")
    full = pr.outcome(problems, n, where=os.path.abspath(result.out), select=select)
    measured = pr.compare(full, pr.outcome(pruned_problems, n, where=result.pruned_out, select=select), reps=reps,
                          select=select)
    # an emitted head's decisions come a token later than a predicting head's
    predicted = pr.compare(full, pr.replayed(problems, prune, n, alignment=alignment, select=select), reps=reps,
                           select=select)
    rows = pr.sweep(problems, n, base=prune, reps=min(reps, 500), alignment=alignment, select=select,
                    head=has_head)
    # a resumed run's time covers only the problems it generated
    timed = result.stats["written"] == len(problems) and result.pruned_stats["written"] == len(problems)
    path = None
    if config.plot:
        path = pr.plot_sweep(rows, os.path.splitext(result.out)[0] + ".prune.png", measured=[
            ("pruned run (measured)", measured["token_fraction"], measured["accuracy"])],
            by=report.selector_row(select))
    return {"settings": prune.to_dict(), "select": select, "measured": measured, "replayed": predicted,
            "seconds": {"full": result.seconds, "pruned": result.pruned_seconds} if timed else None,
            "rollouts": os.path.abspath(result.pruned_out), "sweep": rows, "plot": path}


#: DeepConf's own final answer: the vote weighted by each candidate's lowest group confidence
DEEPCONF_VOTE = "vote:confidence_lowest_group"


def _deepconf_comparison(problems, ids: set[str], result: BonResult, config: BonConfig, select: str,
                         answer: str | None) -> dict:
    """The DeepConf run against the full one: tokens, BoN@N by ``select`` and by DeepConf's own
    vote (paired intervals), vLLM wall time, and how many candidates' fates the policy replayed on
    the full run's per-token values and graded answers reproduces."""
    from ..data.rollouts import read_rollouts
    from ..reports import pruning as pr
    from ..selection.deepconf import replay

    n, dc, reps = config.collect.n, config.deepconf, config.bootstrap
    runs = {p.id: p for p in read_rollouts(result.deepconf_out) if p.id in ids}
    dc_problems = [runs[p.id] for p in problems if p.id in runs]
    if len(dc_problems) != len(problems):
        raise ValueError(f"{result.deepconf_out}: {len(problems) - len(dc_problems)} problems of the full run are "
                         "missing")
    where = os.path.abspath(result.out)
    measured = {}
    for name, how in (("measured", select), ("by_vote", DEEPCONF_VOTE)):
        measured[name] = pr.compare(pr.outcome(problems, n, where=where, select=how),
                                    pr.outcome(dc_problems, n, where=result.deepconf_out, select=how), reps=reps,
                                    select=how)
    agree = total = 0
    stops = {"threshold": 0, "consensus": 0}
    for full, run in zip(problems, dc_problems):
        cands = full.candidates[:n]
        traces = [c.get("swift_trace") or {} for c in cands]
        if dc.signal == "swift":
            from ..selection.pruning import running_swift

            signals = [running_swift(t.get("gate_reward", []), t.get("gate", [])) for t in traces]
        else:
            signals = [t.get("confidence", []) for t in traces]
        got = [(c.get("deepconf") or {}).get("stop") for c in run.candidates[:n]]
        early = [i for i, c in enumerate(run.candidates[:n]) if (c.get("deepconf") or {}).get("early")]
        want = replay(signals, dc, [c.get("answer") for c in cands] if answer is not None else None, early=early)
        agree += sum(a == b for a, b in zip(got, want.stopped))
        total += len(got)
        for s in got:
            if s in stops:
                stops[s] += 1
    timed = result.stats["written"] == len(problems) and result.deepconf_stats["written"] == len(problems)
    return {"settings": dc.to_dict(), "select": select, "answer": answer, **measured,
            "stopped": stops, "replay_agreement": agree / max(total, 1), "replayed_candidates": total,
            "seconds": {"full": result.seconds, "deepconf": result.deepconf_seconds} if timed else None,
            "rollouts": os.path.abspath(result.deepconf_out)}
