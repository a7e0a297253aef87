"""Best-of-N over a dataset with vLLM, scored by SWIFT (and SAR) while the tokens are generated:
the job behind ``swift-fast bon`` (:func:`run_bon`).

One vLLM engine with the swift-fast plugin attached (``additional_config["swift_fast"] =
{"head": path, "sar": bool}``) samples N candidates per problem with the prompts, sampling and
per-problem seeds of :mod:`.collect`, and grades them. :class:`ScoredVLLMEngine` keeps the
plugin's values on each candidate: ``swift_score``, ``swift_tokens``, ``swift_pruned``, with SAR
``sar`` and ``sar_context``. Every run is traced (``plugin_args["trace"]``), so each candidate
also gets the trivial selectors' columns from its per-token values (``num_tokens``, DeepConf's
``conf_lowest`` and ``conf_tail``, with SAR ``mean_logprob``:
``swift_fast.reports.best_of_n.trace_signals``), and ``swift-fast eval`` on the rollouts shows
the rows this job reports.

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
=======================  =========================================================================

Pruning (``BonConfig.prune``): a second run with the weakest candidates stopped while they are
generated. Both runs are traced, so their vLLM wall times differ by the pruning alone; the full
run keeps its per-token values (``swift_trace``) for the sweep, which replays a grid of settings
on them (``swift_fast.reports.pruning``).

A run resumes a rollout file only when the file is of the same run: the same model, head, data,
prompts, sampling, grading, engine settings and plugin settings (the pruned run's include the
pruning), as its record says (:mod:`.run_record`); else it is refused before the engine starts,
naming the first difference, and ``overwrite=True`` starts again. The summary carries the
records. A rerun with nothing left to generate starts no engine.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from ..reports import best_of_n as report
from ..selection.pruning import PruneConfig
from .collect import CollectConfig, collect, pending
from .engine import EngineConfig, VLLMEngine, make_engine, parallel_kwargs
from .run_record import RunRecord, build, prepare


def default_out(data: str, n: int) -> str:
    """``bon-<data file or name>-n<N>.jsonl``: where the rollouts go when no path is given."""
    stem = os.path.splitext(os.path.basename(str(data).rstrip("/")))[0] or "data"
    return f"bon-{stem}-n{n}.jsonl"


class ScoredVLLMEngine(VLLMEngine):
    """:class:`.engine.VLLMEngine` with the plugin's scores kept on each candidate, and the wall
    time spent inside vLLM's ``generate`` counted."""

    name = "vllm+swift"

    seconds = 0.0  # wall time inside vLLM's generate
    #: DeepConf's group size for the confidence columns; whether the per-token values stay on
    #: each candidate (a pruning sweep replays them) or only the columns the report reads
    window = PruneConfig().window
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
        c["swift_score"] = out.swift_score
        c["swift_tokens"] = out.swift_tokens
        c["swift_pruned"] = bool(getattr(out, "swift_pruned", False))
        if hasattr(out, "sar"):
            c["sar"] = out.sar
            c["sar_context"] = out.sar_context
        if getattr(out, "swift_trace", None) is not None:
            # the trivial selectors' columns are written on every traced run, so `eval` on this
            # file shows the rows `bon` shows
            c["swift_trace"] = out.swift_trace
            report.trace_signals(c, self.window)
            if not self.keep_trace:
                del c["swift_trace"]


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
    #: also run Best-of-N with this pruning during generation, and compare (None: no pruned run)
    prune: PruneConfig | None = None
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


def run_bon(model: str, head: str, data: str, out: str | os.PathLike | None = None, config: BonConfig | None = None,
            on_table: Callable[[BonResult], None] | None = None, overwrite: bool = False) -> BonResult:
    """Best-of-N of ``model`` on ``data`` (a dataset file or name), scored in vLLM by the SWIFT head
    ``head`` (a file, or a Hub repository id ``org/name[@revision][:file]``: ``swift_fast.hf.hub``);
    rollouts into ``out`` (None: :func:`default_out` in the current folder).

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
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    out = default_out(data, n) if out is None else os.fspath(out)
    base = os.path.splitext(out)[0]
    head = resolve_head(head)  # a Hub repository id becomes its file in the Hugging Face cache
    alignment = SwiftHead.load(head).alignment  # a bad head file fails before any work
    examples = load_dataset(data, kind=config.kind, limit=config.limit)
    if config.engine.engine not in ("auto", "vllm"):
        raise ValueError(f"Best-of-N scores in vLLM (the plugin): engine {config.engine.engine!r} cannot run it")
    engine = replace(config.engine, engine="vllm")
    parallel_kwargs(engine, "vllm")  # checked here: a bad setting fails before the engine starts
    if config.prune is not None and n < 2:
        raise ValueError("--prune stops the weakest of each problem's candidates: it needs --n 2 or more")
    result = BonResult(out=out, pruned_out=base + ".pruned.jsonl" if config.prune is not None else None)
    # the plugin's per-request settings are part of each run's record, and read back from it
    full = {"trace": True, "prune": False} if config.prune is not None else {"trace": True}
    result.run = build(model, data, replace(config.collect, plugin_args=full), engine, kind=config.kind, head=head,
                       sar=config.sar)
    runs = [(out, result.run, "the full run")]
    if config.prune is not None:
        result.pruned_run = result.run.with_request({"trace": True, "prune": config.prune.to_dict()})
        runs.append((result.pruned_out, result.pruned_run, "the pruned run"))
    prepare(runs, overwrite)  # before the engine starts: a refusal costs nothing
    _generate(model, head, examples, engine, config, result)
    ids = {str(ex.id) for ex in examples}
    problems = [p for p in read_rollouts(out) if p.id in ids]
    result.table, result.summary = _table(problems, out, config)
    if config.plot:
        result.plot = report.plot(result.table, config.plot_path or base + ".bon.png",
                                  title=f"{os.path.basename(model)} on {os.path.basename(str(data))}")
    if on_table is not None:
        on_table(result)
    if config.prune is not None:
        result.prune = _prune_comparison(problems, ids, result, config, alignment)
        result.prune["run"] = result.pruned_run.sidecar()
    result.summary_path = report.save_json(
        result.table, config.summary_path or base + ".summary.json", summary=result.summary, model=model,
        head=os.path.abspath(head), data=str(data), n=n, rollouts=os.path.abspath(out),
        generated=result.stats["written"], resumed=result.stats["skipped_done"], run=result.run.sidecar(),
        **({"prune": result.prune} if result.prune is not None else {}),
    )
    return result


def _generate(model: str, head: str, examples, engine_cfg: EngineConfig, config: BonConfig, result: BonResult) -> None:
    """The full run into ``result.out`` and, with pruning, the pruned run into ``result.pruned_out``,
    on one engine (none when both are complete); their counts and vLLM wall times into ``result``."""
    from ..support.engine_logs import quiet_engine

    prune = config.prune
    runs = [(result.out, result.run)] + ([(result.pruned_out, result.pruned_run)] if prune is not None else [])
    needed = any(pending(examples, out) for out, _ in runs)
    log = os.path.splitext(result.out)[0] + ".vllm.log"
    with quiet_engine(log, verbose=config.verbose) if needed else contextlib.nullcontext():
        engine = None
        if needed:
            engine = make_engine(model, engine_cfg, seed=config.collect.seed, vllm_engine=ScoredVLLMEngine,
                                 plugin={"head": head, "sar": bool(config.sar)})
        try:
            for pruned, (out, run) in enumerate(runs):
                if engine is not None:
                    # traced: each candidate's confidence (and with SAR its mean log-prob) come free, for
                    # the trivial selectors; with pruning both runs are traced, so their times differ by
                    # the pruning alone, and the full run keeps its per-token values for the sweep
                    engine.seconds, engine.keep_trace = 0.0, prune is not None and not pruned
                    if prune is not None:
                        engine.window = prune.window
                cfg = replace(config.collect, plugin_args=run.record["plugin"]["request"])
                stats = collect(engine, getattr(engine, "tokenizer", None), examples, out, cfg,
                                progress=config.progress, model_name=model,
                                desc="generate, pruned" if pruned else "generate", run=run)
                seconds = engine.seconds if engine is not None else 0.0
                if pruned:
                    result.pruned_stats, result.pruned_seconds = stats, seconds
                else:
                    result.stats, result.seconds = stats, seconds
        finally:
            if engine is not None:
                engine.close()


def _table(problems, out: str, config: BonConfig) -> tuple[report.Table, dict]:
    """The Best-of-N table of every selector the candidates allow (SWIFT, with SAR SAR and the
    combinations, the trivial selectors, votes, oracle) and the summary under it."""
    sar_key = "sar" if config.sar else None
    keys = ["swift_score"] + ([sar_key] if sar_key else [])
    cands = report.gather(problems, keys, n=config.collect.n, where=out, signals=True)
    rows = report.standard_selectors("swift_score", sar=sar_key, trivial=report.trivial_selectors(cands))
    table = report.bon_table(cands, rows, config.ks, reps=config.bootstrap)
    summary = report.selection_summary(cands, table, report.selector_name("swift_score"), reps=config.bootstrap)
    return table, summary


def _prune_comparison(problems, ids: set[str], result: BonResult, config: BonConfig, alignment: str) -> dict:
    """The pruned run against the full one (measured), the policy replayed on the full run's
    per-token values (predicted), the sweep of settings and its plot."""
    from ..data.rollouts import read_rollouts
    from ..reports import pruning as pr

    n, prune, reps = config.collect.n, config.prune, config.bootstrap
    pruned = {p.id: p for p in read_rollouts(result.pruned_out) if p.id in ids}
    pruned_problems = [pruned[p.id] for p in problems if p.id in pruned]
    if len(pruned_problems) != len(problems):
        raise ValueError(
            f"{result.pruned_out}: {len(problems) - len(pruned_problems)} problems of the full run are missing")
    full = pr.outcome(problems, n, where=os.path.abspath(result.out))
    measured = pr.compare(full, pr.outcome(pruned_problems, n, where=result.pruned_out), reps=reps)
    # an emitted head's decisions come a token later than a predicting head's
    predicted = pr.compare(full, pr.replayed(problems, prune, n, alignment=alignment), reps=reps)
    rows = pr.sweep(problems, n, base=prune, reps=min(reps, 500), alignment=alignment)
    # a resumed run's time covers only the problems it generated
    timed = result.stats["written"] == len(problems) and result.pruned_stats["written"] == len(problems)
    path = None
    if config.plot:
        path = pr.plot_sweep(rows, os.path.splitext(result.out)[0] + ".prune.png", measured=[
            ("pruned run (measured)", measured["token_fraction"], measured["accuracy"])])
    return {"settings": prune.to_dict(), "measured": measured, "replayed": predicted,
            "seconds": {"full": result.seconds, "pruned": result.pruned_seconds} if timed else None,
            "rollouts": os.path.abspath(result.pruned_out), "sweep": rows, "plot": path}
