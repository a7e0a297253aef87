"""Generation backends for the demo: N sampled candidates per prompt, each with its SWIFT score
and SAR, as rollout-file candidate dicts (``token_ids``, ``text``, ``finish_reason``,
``swift_score``, ``sar``).

``VLLMBackend`` runs the vLLM plugin (the product's path); ``HFBackend`` runs transformers
``generate`` and scores the same token ids with ``swift_fast.hf`` (offline SWIFT scores and SAR's
two passes). Both sample at the same settings; draws differ between them (different samplers),
the scores of a given candidate agree.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class Sampling:
    """Sampling settings. ``seed`` seeds torch's generator for transformers, and each prompt's
    own seed in vLLM."""

    n: int = 16
    temperature: float = 1.0
    top_p: float = 0.9
    max_new_tokens: int = 160
    seed: int = 0


class Backend(Protocol):
    name: str

    def generate(
        self, prompts: list[list[int]], sampling: Sampling, progress: bool = True, contexts=None,
        desc: str = "generate",
    ) -> list[list[dict]]:
        """``prompts``: token ids; ``contexts``: each prompt's question-removed prompt ids (SAR);
        ``desc``: the progress phase's name.
        Returns per prompt ``sampling.n`` candidate dicts."""

    def close(self) -> None: ...


def _candidate(tokenizer, ids: list[int], eos: int, swift: float | None, sar: float | None) -> dict:
    return {
        "token_ids": [int(t) for t in ids],
        "text": tokenizer.decode(ids, skip_special_tokens=True),
        "finish_reason": "stop" if ids and ids[-1] == eos else "length",
        "swift_score": None if swift is None or not math.isfinite(swift) else float(swift),
        "sar": None if sar is None or not math.isfinite(sar) else float(sar),
    }


@torch.no_grad()
def hf_sample(model, tokenizer, prompts: list[list[int]], sampling: Sampling) -> list[list[list[int]]]:
    """``sampling.n`` responses per prompt with transformers ``generate`` (prompts left-padded
    into one batch); each response ends at its first end-of-turn token, which it keeps. Draws
    follow torch's global generator: seed it before a sequence of calls."""
    from ..hf.generate import response_lengths

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=0,
        max_new_tokens=sampling.max_new_tokens,
        num_return_sequences=sampling.n,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    gen = out[:, width:]
    lengths = response_lengths(gen, [eos]).tolist()
    rows = [r[:m] for r, m in zip(gen.tolist(), lengths)]
    return [rows[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]


class HFBackend:
    """transformers ``generate`` (batched over prompts, left-padded), then exact offline scores."""

    name = "transformers"

    def __init__(self, model_dir: str, head_path: str, batch_prompts: int = 16):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from ..rewards.head import SwiftHead
        from ..support.engine_logs import engine_starting

        with engine_starting():
            self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.head = SwiftHead.load(head_path)
        self.batch_prompts = batch_prompts

    def close(self) -> None:
        pass

    def generate(
        self, prompts: list[list[int]], sampling: Sampling, progress: bool = True, contexts=None,
        desc: str = "generate",
    ) -> list[list[dict]]:
        from ..hf.sar import sar_rewards
        from ..hf.scoring import swift_scores
        from ..support.progress import phase

        torch.manual_seed(sampling.seed)
        out = []
        bar = phase(f"{desc} (transformers)", total=len(prompts) * sampling.n, unit="candidate", enabled=progress)
        for s in range(0, len(prompts), self.batch_prompts):
            chunk = prompts[s : s + self.batch_prompts]
            q0 = contexts[s : s + self.batch_prompts] if contexts is not None else [None] * len(chunk)
            responses = hf_sample(self.model, self.tokenizer, chunk, sampling)
            flat_p = [p for p, rs in zip(chunk, responses) for _ in rs]
            flat_q0 = [q for q, rs in zip(q0, responses) for _ in rs]
            flat_r = [r for rs in responses for r in rs]
            swift = swift_scores(
                self.model, self.head, [p + r for p, r in zip(flat_p, flat_r)], [len(p) for p in flat_p], batch_size=64
            )
            sar = sar_rewards(self.model, self.tokenizer, flat_p, flat_r, contexts=flat_q0, batch_size=64)
            eos = self.tokenizer.eos_token_id
            it = iter(zip(flat_r, swift.tolist(), sar.tolist()))
            for rs in responses:
                out.append([_candidate(self.tokenizer, r, eos, sw, sa) for r, sw, sa in (next(it) for _ in rs)])
            bar.update(len(chunk) * sampling.n)
        bar.close()
        return out


class VLLMBackend:
    """The vLLM plugin on the CPU: ``LLM(additional_config={"swift_fast": {...}})``; every
    ``CompletionOutput`` carries ``swift_score`` and ``sar``.

    Each prompt is sampled with its own seed (``Sampling.seed`` and the prompt's index), so a run
    draws the same tokens whatever else the engine runs beside it: a pruned run samples what the
    full run sampled up to each pruning point. ``seconds`` accumulates the wall time inside
    ``LLM.generate``."""

    name = "vllm"

    def __init__(self, model_dir: str, head_path: str, seed: int = 0, **engine_kwargs):
        from transformers import AutoTokenizer
        from vllm import LLM

        from ..support.engine_logs import engine_starting

        kwargs = dict(
            dtype="float32",
            gpu_memory_utilization=0.3,  # on the CPU this is a fraction of host memory
            max_model_len=512,
            enforce_eager=True,
            seed=seed,
            # NOTE: vLLM 0.32 on the CPU fails a seeded request whose prefill is split across steps
            # ("CPU Generator does not use offset"): prompts are prefilled whole.
            enable_chunked_prefill=False,
            # a whole wave of candidates prefilled in one step, and more of them per step: the
            # candidates of a problem start together, and the tiny model's steps cost less overall
            max_num_batched_tokens=16384,
            max_num_seqs=512,
        )
        kwargs.update(engine_kwargs)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        with _engine_core_in_process(), engine_starting():
            self.llm = LLM(
                model=model_dir,
                additional_config={"swift_fast": {"head": head_path, "sar": True}},
                **kwargs,
            )
        self.seconds = 0.0

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()
            self.llm = None

    def generate(
        self, prompts: list[list[int]], sampling: Sampling, progress: bool = True, contexts=None,
        plugin_args: dict | None = None, desc: str = "generate",
    ) -> list[list[dict]]:
        """``plugin_args``: per-request plugin settings (``prune``, ``trace``); candidates then also
        carry ``swift_pruned`` and, traced, ``swift_trace``. Progress: one phase (``desc``) counting
        candidates as vLLM finishes them."""
        import time

        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from ..support.progress import phase, vllm_progress

        def own(i):
            d = dict(plugin_args or {})
            if contexts is not None:
                d["sar_context"] = list(contexts[i])
            return {"swift_fast": d} if d else None

        params = [
            SamplingParams(
                n=sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
                max_tokens=sampling.max_new_tokens, seed=(sampling.seed * 1_000_003 + 7919 * i) & 0x7FFFFFFF,
                extra_args=own(i),
            )
            for i in range(len(prompts))
        ]
        bar = phase(f"{desc} (vLLM)", total=len(prompts) * sampling.n, unit="candidate", enabled=progress)
        t0 = time.perf_counter()
        try:
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                     use_tqdm=vllm_progress(bar))
            self.seconds += time.perf_counter() - t0
            bar.set_postfix(tokens=f"{sum(len(c.token_ids) for o in outs for c in o.outputs):,}")
        finally:
            bar.close()
        eos = self.tokenizer.eos_token_id
        result = []
        for o in outs:
            cands = []
            for c in sorted(o.outputs, key=lambda c: c.index):
                d = _candidate(self.tokenizer, list(c.token_ids), eos, getattr(c, "swift_score", None),
                               getattr(c, "sar", None))
                if getattr(c, "swift_pruned", False):
                    d["swift_pruned"], d["finish_reason"] = True, "pruned"
                if getattr(c, "swift_trace", None) is not None:
                    d["swift_trace"] = c.swift_trace
                cands.append(d)
            result.append(cands)
        return result


@contextlib.contextmanager
def _engine_core_in_process():
    """vLLM's engine core in this process while the engine is built: for the demo's tiny models
    a separate engine process costs more than it saves (about 7 s a start here: a second
    import of torch and vLLM), and nothing else runs beside the demo's generation.

    NOTE: vLLM caches its environment once an engine has started in a process
    (``envs.enable_envs_cache``): the cache is cleared around the change, or a second engine
    would read the first one's value."""
    from vllm import envs

    key = "VLLM_ENABLE_V1_MULTIPROCESSING"
    before = os.environ.get(key)
    clear = getattr(envs.__getattr__, "cache_clear", lambda: None)
    os.environ[key] = "0"
    clear()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
        clear()


def make_backend(kind: str, model_dir: str, head_path: str, seed: int = 0) -> Backend:
    """``kind``: ``"vllm"``, ``"transformers"`` or ``"auto"`` (vLLM when it imports)."""
    if kind == "auto":
        try:
            import vllm  # noqa: F401 - imported only to see whether vLLM is installed

            kind = "vllm"
        except Exception:
            kind = "transformers"
    if kind == "vllm":
        return VLLMBackend(model_dir, head_path, seed=seed)
    if kind in ("transformers", "hf"):
        return HFBackend(model_dir, head_path)
    raise ValueError(f"backend {kind!r}: expected 'vllm', 'transformers' or 'auto'")
