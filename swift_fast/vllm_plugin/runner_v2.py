"""The adapter for vLLM's Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``, the GPU
default, and ``vllm/v1/worker/cpu/model_runner.py``): where the core (:mod:`.runner`) finds
each step's facts.

MRv2 keeps no per-request table the plugin could read (no ``requests`` dict, no discard mask,
no persistent input batch): each step builds an ``InputBatch`` whose rows are re-sorted every
step, and hands it, with the step's hidden states, to ``sample(hidden_states, input_batch,
grammar_output)``, which computes the logits, applies the grammar mask and samples. That method
is the seam. Its instance method is wrapped, with three more:

- ``execute_model(scheduler_output, intermediate_tensors, dummy_run=False, ...)``:
  :meth:`.StepScoring.begin` before a real step's forward (warm-up and CUDA-graph capture call it
  with ``dummy_run=True`` and other arguments, passed through untouched);
- ``sample(hidden_states, input_batch, grammar_output)``: the rows come from ``input_batch``
  (``req_ids``, ``query_start_loc_np``, ``num_computed_tokens_np``, and ``prefill_len_np``: a row
  whose prefill is still incomplete after this step, ``computed + scheduled < prefill_len``,
  samples a token MRv2 discards, ``num_sampled = 0``); the sampled tokens are the returned
  ``SamplerOutput.sampled_token_ids``;
- the model's ``compute_logits``, wrapped on the model instance: its first call inside ``sample``
  returns the step's logits before the grammar mask and the sampler, which is when the core's
  :meth:`.StepScoring.before_sampling` runs (later calls -- SAR's passes, prompt log-probs --
  pass through);
- ``sample_tokens(grammar_output)``: the step's ``AsyncOutput``, whose ``model_runner_output`` is
  the object ``get_output()`` returns, gets the values (with async scheduling the engine core
  reads it a step later; the values' copy to the host is already under way).

``profile_run()``, the same on both runners, is wrapped where the adapter is chosen: the
model-runner adapters' entry, :mod:`.runner_adapters`.

Pipeline stages: MRv2 copies the upstream sums into ``acc`` itself once ``acc`` is an entry of
its persistent intermediate tensors (:mod:`.pipeline`).

What MRv2 can do that the plugin cannot follow is refused at start-up
(:func:`.config.check_engine`): batch-sharded sampling (each tensor-parallel rank computes only
its own requests' logits, through ``compute_logits_local``, while SAR, confidence and logit-feature
heads read every row), prefill context parallelism (the hidden states of a prompt are split
across ranks and re-assembled for sampling, so the accumulator's rows no longer line up with
them), and, as on V1, speculative decoding and micro-batching.

NOTE: warm-up (``warmup_kernels``) runs real requests (``_warmup_*``) through
``execute_model``/``sample_tokens``; they are scored like any request and their output, values
included, is dropped by vLLM; their records go with the ``finished_req_ids`` of the clean-up step.
"""

from __future__ import annotations

import types

import numpy as np

from . import pipeline
from .runner import StepBatch, StepScoring


class V2Adapter:
    def __init__(self, runner, core: StepScoring):
        self.runner = runner
        self.core = core
        self._pending = None  # (hidden_states, input_batch) of the sample() call under way
        self._step = None
        self._wrap()
        core.pipeline = pipeline.install_v2(runner, core.acc, core.head is not None and core.head.feature == "hidden")

    def _wrap(self) -> None:
        r, core, adapter = self.runner, self.core, self
        orig_execute, orig_sample, orig_sample_tokens = r.execute_model, r.sample, r.sample_tokens
        model = r.model
        orig_logits = model.compute_logits

        def execute_model(self_, scheduler_output, intermediate_tensors=None, dummy_run=False, *args, **kwargs):
            if not dummy_run:
                core.begin(scheduler_output)
                adapter._step = None
            return orig_execute(scheduler_output, intermediate_tensors, dummy_run, *args, **kwargs)

        def sample(self_, hidden_states, input_batch, grammar_output, *args, **kwargs):
            adapter._pending = (hidden_states, input_batch)
            try:
                out = orig_sample(hidden_states, input_batch, grammar_output, *args, **kwargs)
            finally:
                adapter._pending = None
            core.after_sampling(adapter._step, out[0].sampled_token_ids)
            return out

        def compute_logits(hidden_states, *args, **kwargs):
            logits = orig_logits(hidden_states, *args, **kwargs)
            pending, adapter._pending = adapter._pending, None
            if pending is not None:
                adapter._step = core.before_sampling(adapter.batch(pending[1]), pending[0], logits)
            return logits

        def sample_tokens(self_, grammar_output, *args, **kwargs):
            out = orig_sample_tokens(grammar_output, *args, **kwargs)
            step, adapter._step = adapter._step, None
            core.attach(step, getattr(out, "model_runner_output", out))
            return out

        r.execute_model = types.MethodType(execute_model, r)
        r.sample = types.MethodType(sample, r)
        r.sample_tokens = types.MethodType(sample_tokens, r)
        model.compute_logits = compute_logits

    @staticmethod
    def batch(input_batch) -> StepBatch:
        n = input_batch.num_reqs
        qsl = input_batch.query_start_loc_np[: n + 1].astype(np.int64)
        computed = input_batch.num_computed_tokens_np[:n].astype(np.int64)
        return StepBatch(
            req_ids=input_batch.req_ids[:n],
            query_start_loc=qsl,
            computed=computed,
            keeps_token=computed + np.diff(qsl) >= input_batch.prefill_len_np[:n],
        )
