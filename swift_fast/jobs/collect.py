"""Rollout collection: N sampled candidates per problem, graded, written as a rollout file; and
:func:`run_collect`, the job behind ``swift-fast collect``.

Prompts are the dataset's template (``swift_fast.data.templates``) rendered with the model's chat
template and the generation prompt, as token ids. Sampling follows the SWIFT paper: temperature
1.0, top-p 0.9, at most 1024 new tokens. Each candidate keeps its token ids as generated (end
of turn included when it was generated), its text, extracted answer and correctness.

Engines (:mod:`.engine`): vLLM when it is installed (``LLM.generate`` on prompt token ids; the
engine core runs in a child process, so a script that calls this needs ``if __name__ ==
"__main__":``), else transformers ``generate``. Each problem's sampling is seeded from ``seed``
and its id, so a resumed run draws what an uninterrupted one would have drawn for the remaining
problems (with the same engine and batch layout; vLLM's per-request seeds make its draws
independent of batching).

Each problem also records ``sar_context_token_ids``: SAR's question-removed prompt, the same
messages with the question emptied and rendered the same way (``swift_fast.rewards.sar_context``). The
vLLM engine hands it to the plugin with every request, and ``swift-fast score --sar`` reads it
back, so in-engine and offline SAR condition on the same context by construction.

Resumable: problems are appended to the output as they finish (one flushed line each); a rerun
skips the ids already there, only when the file is of the same run: :func:`run_collect` records
the model, data and every setting that shapes the output (:mod:`.run_record`, ``<base>.run.json``
and a ``run_id`` on every line), and refuses a rerun with another before the engine starts
(``overwrite=True`` starts again). A rerun with nothing left to generate starts no engine.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ..data.rollouts import Problem, RolloutWriter, done_ids

# HFEngine, VLLMEngine and vllm_available lived here: swift-fast 0.1's swift_fast.hf.collect (now
# this module, swift_fast._compat) still names them for one release, so they are re-exported
from .engine import EngineConfig, engine_name, make_engine
from .engine import HFEngine as HFEngine
from .engine import VLLMEngine as VLLMEngine
from .engine import vllm_available as vllm_available
from .run_record import RunRecord, build, check_resume, prepare, write_sidecar

PAPER_SAMPLING = {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 1024}


@dataclass
class CollectConfig:
    n: int = 8
    temperature: float = PAPER_SAMPLING["temperature"]
    top_p: float = PAPER_SAMPLING["top_p"]
    max_new_tokens: int = PAPER_SAMPLING["max_new_tokens"]
    seed: int = 0
    template: str | None = None
    system: str | None = None
    chunk: int = 64  # problems per engine call: the unit of progress that survives an interruption
    grade_timeout: float | None = 5.0
    #: how a candidate cut off at the length limit is graded (swift_fast.grading): "strict", wrong
    #: unless it completed a final answer statement first; "lenient", graded on its text as it is
    truncation: str = "strict"
    vllm_kwargs: dict = field(default_factory=dict)
    #: per-request settings for the swift-fast vLLM plugin (``extra_args["swift_fast"]``, e.g. prune, trace)
    plugin_args: dict = field(default_factory=dict)


def problem_seed(seed: int, problem_id: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(problem_id.encode())) & 0x7FFFFFFF


def render(tokenizer, example, template=None, system=None) -> tuple[str, list[int], list[int]]:
    """``(prompt text, prompt token ids, question-removed prompt token ids)`` of an example:
    template, then the chat template."""
    from ..data.templates import render_prompt
    from ..rewards.sar_context import chat_context_ids, chat_ids

    msgs = render_prompt(example, template=template, system=system)
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return text, chat_ids(tokenizer, msgs), chat_context_ids(tokenizer, msgs)


def grade_candidates(
    problem_cands: list[list[dict]], examples: list[Any], timeout: float | None, truncation: str = "strict"
) -> None:
    """Fill ``answer`` and ``correct`` of every candidate in place (one batch for all). Each
    candidate's ``finish_reason`` goes to the truncation rule (swift_fast.grading): under
    "strict", one cut off without a complete final answer statement is wrong with no answer."""
    from ..grading import judge_many

    texts, refs, kinds, reasons, where = [], [], [], [], []
    for cands, ex in zip(problem_cands, examples):
        for c in cands:
            texts.append(c["text"])
            refs.append(ex.reference)
            kinds.append(ex.kind)
            reasons.append(c.get("finish_reason"))
            where.append(c)
    if not texts:
        return
    verdicts = judge_many(texts, refs, kinds, timeout=timeout, finish_reasons=reasons, truncation=truncation)
    for c, j in zip(where, verdicts):
        c["answer"] = j.answer
        c["correct"] = bool(j.correct)


def collect(
    engine,
    tokenizer,
    examples: Sequence[Any],
    out_path: str | os.PathLike,
    cfg: CollectConfig | None = None,
    progress: bool = True,
    model_name: str = "",
    on_chunk: Callable[[int], None] | None = None,
    desc: str = "collect",
    run: RunRecord | None = None,
) -> dict:
    """Generate, grade and append every example not yet in ``out_path``. Returns counts.

    Progress counts candidates as the engine finishes them (``desc`` names the phase). After
    the first chunk, rollouts with almost no correct candidate (:data:`FEW_CORRECT`) get a
    warning that says what to change, before the rest is generated.

    ``run``: the run's record (:mod:`.run_record`): ``out_path`` must hold lines of this run only
    (else ``ValueError`` before anything is generated), the record is written beside it and its id
    on every line. None (a library call without one) writes lines without a run id and refuses a
    file of a recorded run. ``engine`` may be None when every example is already there."""
    cfg = cfg or CollectConfig()
    writer = _open_writer(out_path, cfg, run)
    todo = [ex for ex in examples if str(ex.id) not in writer.done]
    stats = {
        "problems": len(examples),
        "skipped_done": len(examples) - len(todo),
        "written": 0,
        "candidates": 0,
        "correct": 0,
    }
    from ..support.progress import phase

    bar = phase(f"{desc} ({getattr(engine, 'name', '')})", total=len(todo) * cfg.n, unit="candidate",
                enabled=progress and bool(todo))
    sampling = _sampling(cfg)
    try:
        for a in range(0, len(todo), cfg.chunk):
            chunk = todo[a : a + cfg.chunk]
            rendered, cands = _generate_chunk(engine, tokenizer, chunk, cfg, bar)
            for ex, r, cs in zip(chunk, rendered, cands):
                writer.write(_problem(ex, r, cs, cfg, engine.name, model_name, sampling))
                stats["written"] += 1
                stats["candidates"] += len(cs)
                stats["correct"] += sum(bool(c.get("correct")) for c in cs)
            bar.set_postfix(correct=f"{stats['correct'] / max(1, stats['candidates']):.3f}")
            if a == 0:
                warn_few_correct(stats["correct"], stats["candidates"], stats["written"], cfg)
            if on_chunk is not None:
                on_chunk(stats["written"])
    finally:
        writer.close()
        bar.close()
    return stats


def _open_writer(out_path: str | os.PathLike, cfg: CollectConfig, run: RunRecord | None) -> RolloutWriter:
    """The checks :func:`collect` makes before anything is generated, then the writer that appends
    to ``out_path``: the run's record goes beside the file first, so no recorded line is ever
    without its record."""
    if cfg.n < 1:
        raise ValueError(f"n must be >= 1, got {cfg.n}")
    check_resume(out_path, run)
    if run is not None:
        write_sidecar(out_path, run)
    return RolloutWriter(out_path, resume=True, run_id=None if run is None else run.run_id)


def _sampling(cfg: CollectConfig) -> dict:
    """The sampling settings every line records, so a rollout file says how it was drawn."""
    return {
        "n": cfg.n,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "max_new_tokens": cfg.max_new_tokens,
        "seed": cfg.seed,
    }


def _generate_chunk(engine, tokenizer, chunk: Sequence[Any], cfg: CollectConfig, bar) -> tuple[list, list]:
    """One chunk's prompts rendered, its candidates generated (one seed per problem, so a resumed
    run draws the same ones) and graded: ``(rendered, candidates)``, one of each per example."""
    rendered = [render(tokenizer, ex, cfg.template, cfg.system) for ex in chunk]
    seeds = [problem_seed(cfg.seed, str(ex.id)) for ex in chunk]
    cands = engine.generate([r[1] for r in rendered], seeds, cfg, contexts=[r[2] for r in rendered], bar=bar)
    grade_candidates(cands, chunk, cfg.grade_timeout, cfg.truncation)
    return rendered, cands


def _problem(ex, rendered: tuple[str, list[int], list[int]], cands: list[dict], cfg: CollectConfig,
             engine_name: str, model_name: str, sampling: dict) -> Problem:
    """The line written for one example: its prompt, graded candidates and how they were made."""
    text, ids, q0 = rendered
    return Problem(
        id=str(ex.id),
        question=ex.question,
        reference=ex.reference,
        kind=ex.kind,
        prompt=text,
        prompt_token_ids=ids,
        candidates=cands,
        extra={
            "sar_context_token_ids": q0,
            "dataset": getattr(ex, "dataset", None),
            "model": model_name,
            "engine": engine_name,
            "sampling": sampling,
            "grading": {"truncation": cfg.truncation},
            **({"plugin_args": cfg.plugin_args} if cfg.plugin_args else {}),
        },
    )


def pending(examples: Sequence[Any], out_path: str | os.PathLike) -> list:
    """The examples whose ids are not yet in the rollouts at ``out_path``."""
    done = done_ids(out_path)
    return [ex for ex in examples if str(ex.id) not in done]


#: below this share of correct candidates, rollouts can hardly teach a head (or show a selector
#: at work): ``collect`` says so after its first chunk
FEW_CORRECT = 0.05


def warn_few_correct(correct: int, candidates: int, problems: int, cfg: CollectConfig) -> bool:
    """Log a warning when fewer than :data:`FEW_CORRECT` of the candidates so far are correct;
    whether it did."""
    import logging

    if candidates == 0 or correct >= FEW_CORRECT * candidates:
        return False
    hints = []
    if cfg.temperature > 0.6:
        hints.append(f"a lower temperature (--temperature 0.5; now {cfg.temperature:g})")
    hints += ["easier problems", f"more candidates per problem (--n {max(2 * cfg.n, 16)}; now {cfg.n})",
              "a larger --max-new-tokens if answers are cut off"]
    logging.getLogger("swift_fast.collect").warning(
        "swift-fast: after the first %d problems only %d of %d candidates (%.1f%%) are correct: a head "
        "trained on these has almost nothing to learn from, and Best-of-N has little to select. Try %s.",
        problems, correct, candidates, 100 * correct / candidates, ", ".join(hints),
    )
    return True


def run_collect(
    model: str,
    data: str,
    out: str | os.PathLike,
    cfg: CollectConfig | None = None,
    engine: EngineConfig | None = None,
    kind: str | None = None,
    limit: int | None = None,
    progress: bool = True,
    verbose: bool = False,
    overwrite: bool = False,
) -> dict:
    """``swift-fast collect``: sample, grade and append the problems of ``data`` (a dataset file or
    name, ``kind`` and ``limit`` as ``load_dataset`` reads them) not yet in ``out``, with the
    engine ``engine`` makes for ``model``; :func:`collect`'s counts.

    ``out`` resumes only when its run record (:mod:`.run_record`) is this run's: else
    ``ValueError`` naming the first difference, before any engine starts; ``overwrite``: remove
    ``out`` and its record and start again. With nothing left to generate no engine starts.
    vLLM's own output goes to ``<out>.vllm.log`` unless ``verbose``; the engine is closed when
    the job ends, however it ends."""
    from ..data.datasets import load_dataset
    from ..support.engine_logs import quiet_engine

    cfg, engine = cfg or CollectConfig(), engine or EngineConfig()
    name = engine_name(engine)  # before the dataset loads: a bad setting fails at once
    examples = load_dataset(data, kind=kind, limit=limit)
    run = build(model, data, cfg, engine, kind=kind)
    prepare([(os.fspath(out), run, "")], overwrite)
    if not pending(examples, out):
        return collect(None, None, examples, out, cfg, progress=progress, model_name=model, run=run)
    # transformers' messages are not vLLM's: they show as they come
    with quiet_engine(os.path.splitext(os.fspath(out))[0] + ".vllm.log", verbose=verbose or name != "vllm"):
        gen = make_engine(model, replace(engine, engine=name), seed=cfg.seed)
        try:
            return collect(gen, gen.tokenizer, examples, out, cfg, progress=progress, model_name=model, run=run)
        finally:
            gen.close()
