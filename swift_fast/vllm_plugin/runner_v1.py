"""The adapter for vLLM's V1 model runner (``vllm/v1/worker/gpu_model_runner.py`` and its
``CPUModelRunner`` subclass): where the core (:mod:`.runner`) finds each step's facts.

V1 splits a step in two calls, ``execute_model`` (forward and logits) and ``sample_tokens``
(grammar mask, sampler, output). Its instance methods are wrapped:

- ``execute_model(scheduler_output, intermediate_tensors)``: :meth:`.StepScoring.begin` before
  the forward; after it, the rows come from the runner's persistent ``input_batch``
  (``req_ids``, ``num_computed_tokens_cpu``), ``query_start_loc`` and ``discard_request_mask``
  (a partial prefill chunk, whose sampled token vLLM discards), and the logits from
  ``execute_model_state.logits``, computed before the grammar mask and the sampler;
- ``_sample(logits, spec_decode_metadata)`` (private: V1 exposes its sampled tokens nowhere
  else before they are copied to lists): the sampled token ids, still on the device;
- ``sample_tokens(grammar_output)``: the output, a ``ModelRunnerOutput`` or, with async
  scheduling, an ``AsyncGPUModelRunnerOutput`` whose ``_model_runner_output`` is what
  ``get_output()`` returns (private too; V1 has no public handle on it).

``profile_run()``, the same on both runners, is wrapped where the adapter is chosen: the
model-runner adapters' entry, :mod:`.runner_adapters`.

Pipeline stages receive the upstream sums in ``sync_and_gather_intermediate_tensors``
(:mod:`.pipeline`).

vLLM has deprecated this runner: Model Runner V2 (:mod:`.runner_v2`) is its default on GPUs.
"""

from __future__ import annotations

import types

import numpy as np

from . import pipeline
from .runner import StepBatch, StepScoring


class V1Adapter:
    def __init__(self, runner, core: StepScoring):
        self.runner = runner
        self.core = core
        self._step = None
        self._sampled = None
        self._wrap()
        # after the runner's own wrappers: a pipeline stage's sums leave after, and enter inside, them
        core.pipeline = pipeline.install_v1(runner, core.acc, core.head is not None and core.head.feature == "hidden")

    def _wrap(self) -> None:
        r, core, adapter = self.runner, self.core, self
        orig_execute, orig_sample_tokens, orig_sample = r.execute_model, r.sample_tokens, r._sample

        def execute_model(self_, scheduler_output, intermediate_tensors=None, *args, **kwargs):
            core.begin(scheduler_output)
            adapter._step = None
            out = orig_execute(scheduler_output, intermediate_tensors, *args, **kwargs)
            st = self_.execute_model_state
            if out is None and st is not None:
                adapter._step = core.before_sampling(adapter.batch(), st.hidden_states, st.logits)
            return out

        def _sample(self_, logits, spec_decode_metadata):
            out = orig_sample(logits, spec_decode_metadata)
            adapter._sampled = out.sampled_token_ids
            return out

        def sample_tokens(self_, grammar_output):
            step, adapter._step, adapter._sampled = adapter._step, None, None
            out = orig_sample_tokens(grammar_output)
            if step is not None:
                core.after_sampling(step, adapter._sampled)
                core.attach(step, getattr(out, "_model_runner_output", out))
            adapter._sampled = None
            return out

        r.execute_model = types.MethodType(execute_model, r)
        r._sample = types.MethodType(_sample, r)
        r.sample_tokens = types.MethodType(sample_tokens, r)

    def batch(self) -> StepBatch:
        r = self.runner
        ib = r.input_batch
        n = ib.num_reqs
        return StepBatch(
            req_ids=ib.req_ids[:n],
            query_start_loc=r.query_start_loc.np[: n + 1].astype(np.int64),
            computed=ib.num_computed_tokens_cpu[:n].astype(np.int64),
            keeps_token=~r.discard_request_mask.np[:n].astype(bool),
        )
