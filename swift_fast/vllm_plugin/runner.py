"""Worker side: per-step bookkeeping on vLLM's V1 model runner (``GPUModelRunner`` and its
``CPUModelRunner`` subclass).

The worker keeps no per-request score state. Each step it reports, for every request row that
sampled a token this step, the contribution of that one token:

``(g * r, g, 1, log p(token), 1)``  (float32; the last two only when SAR is on)

and for a SAR question-removed pass, on the step that completes its prefill, the sum and count
of the answer's log-probs over all its prefill chunks. The front end adds a token's values
when, and only when, it appends that token to the request's output, so the score always covers
exactly ``CompletionOutput.token_ids``: preempted and recomputed requests, tokens generated past
a stop string before the abort lands, outputs the scheduler drops, and requests that finish or
are aborted mid-step cannot be counted twice or counted at all.

Which row scores which token (``predicting`` alignment): a request row samples from the
state of its last scheduled token, ``query_start_loc[i + 1] - 1``; the token it samples is
kept unless the row is a partial prefill chunk (``discard_request_mask``), which is also
vLLM's rule. That state is always computed by the forward, whatever prefix caching skipped
(vLLM recomputes at least the last prompt token to sample), and it is the state whose logits
produced the token. ``slots[t] = i`` for that token, ``-1`` for every other token of the
batch; ``finish_`` gates and sums into ``state[i]``, which is read and cleared every step.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..head import SwiftHead
from ..kernels.streaming import finish_, project_layer_
from . import model_hooks
from .config import KEY, PluginConfig

# request kinds
SCORE, SKIP, SAR_PASS = 0, 1, 2
NCOLS = 5  # g*r, g, count, sum log p, count log p
#: rows of logits materialised at once for a SAR pass (bounds its memory to ROWS x vocab floats)
SAR_LOGIT_ROWS = 256


def request_kind(sampling_params) -> tuple[int, int]:
    """``(kind, q0_len)`` of a request from its ``SamplingParams.extra_args``."""
    if sampling_params is None:
        return SKIP, 0
    extra = sampling_params.extra_args or {}
    own = extra.get(KEY)
    if isinstance(own, dict):
        if "sar_pass" in own:
            return SAR_PASS, int(own["sar_pass"])
        if own.get("score") is False:
            return SKIP, 0
    if extra.get("swift_fast_score") in (False, "false", "0", 0):
        return SKIP, 0
    return SCORE, 0


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[t, targets[t]]`` as float32 ``[T]``, by the fused kernel (no ``[T, V]``
    log-softmax is materialised)."""
    from ..kernels.token_logprobs import token_logprobs as fused

    return fused(logits, targets.long())


class StepScores:
    """Per-request values of one step, attached to ``ModelRunnerOutput.swift_fast``.

    ``values`` is ``[k, NCOLS]`` float32, row j for ``req_ids[j]``. On a GPU the copy to the host
    is asynchronous; :meth:`as_dict` waits for it (the scheduler reads it after the step's
    sampled tokens, which took the same path)."""

    def __init__(self, req_ids: list[str], values: torch.Tensor):
        self.req_ids = req_ids
        self._event = None
        if values.device.type == "cuda":
            self._values = values.to("cpu", non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._values = values
        self._dict = None

    def as_dict(self) -> dict[str, list[float]]:
        if self._dict is None:
            if self._event is not None:
                self._event.synchronize()
                self._event = None
            self._dict = dict(zip(self.req_ids, self._values.tolist()))
            self._values = None
        return self._dict

    def __getstate__(self):  # a multiprocess executor pickles the runner output
        return {"req_ids": self.req_ids, "_dict": self.as_dict(), "_values": None, "_event": None}


@dataclass
class _Step:
    req_ids: list[str]
    values: torch.Tensor  # [n, NCOLS] on the model's device
    report: list[int]  # rows reported this step
    sar_rows: Any = None  # LongTensor rows whose sampled token's log-prob is wanted
    sar_logits: Any = None  # pristine logits of those rows


class RunnerScoring:
    """Installed on one model runner after its model is loaded."""

    def __init__(self, runner, cfg: PluginConfig, head: SwiftHead):
        self.runner = runner
        self.cfg = cfg
        self.head = head
        self.device = runner.device
        self.max_reqs = int(runner.max_num_reqs)
        arch = (getattr(runner.model_config.hf_config, "architectures", None) or [""])[0]
        self.forward = model_hooks.install(runner.model, head, int(runner.max_num_tokens), self.device, arch)
        self.acc = self.forward.acc
        self.bias = self.forward.bias
        self.state = torch.zeros(self.max_reqs, 3, dtype=torch.float32, device=self.device)
        self.logit_weight = None
        if head.feature == "logits":
            self.logit_weight = head.weight.detach().to(self.device, torch.float32).contiguous()
            # the logits rows of a step (one per request) go through the same accumulator
            if self.acc.shape[0] < self.max_reqs:
                self.acc = torch.zeros(self.max_reqs, 2, dtype=torch.float32, device=self.device)
        self._step: _Step | None = None
        self._sampled = None
        self._wrap()

    # -- wiring ------------------------------------------------------------------------------
    def _wrap(self) -> None:
        r = self.runner
        orig_execute, orig_sample_tokens, orig_sample = r.execute_model, r.sample_tokens, r._sample
        scoring = self

        def execute_model(self_, scheduler_output, intermediate_tensors=None):
            scoring.acc.zero_()  # dummy/profile forwards between steps leave projections behind
            scoring._step = None
            out = orig_execute(scheduler_output, intermediate_tensors)
            if out is None and self_.execute_model_state is not None:
                scoring._step = scoring._after_forward(self_.execute_model_state)
            return out

        def _sample(self_, logits, spec_decode_metadata):
            out = orig_sample(logits, spec_decode_metadata)
            scoring._sampled = out.sampled_token_ids
            return out

        def sample_tokens(self_, grammar_output):
            step = scoring._step
            scoring._step = None
            scoring._sampled = None
            out = orig_sample_tokens(grammar_output)
            if step is not None:
                scoring._attach(step, out)
            return out

        r.execute_model = types.MethodType(execute_model, r)
        r._sample = types.MethodType(_sample, r)
        r.sample_tokens = types.MethodType(sample_tokens, r)

    def _index(self, values) -> torch.Tensor:
        return torch.from_numpy(np.asarray(values, dtype=np.int64)).to(self.device, non_blocking=True)

    def _kind(self, req_id: str) -> tuple[int, int]:
        rs = self.runner.requests.get(req_id)
        if rs is None:
            return SKIP, 0
        k = getattr(rs, "_swift_fast_kind", None)
        if k is None:
            k = request_kind(rs.sampling_params)
            rs._swift_fast_kind = k  # lives and dies with vLLM's per-request state
        return k

    # -- one step ----------------------------------------------------------------------------
    def _after_forward(self, st) -> _Step | None:
        r = self.runner
        ib = r.input_batch
        n = ib.num_reqs
        if n == 0:
            return None
        req_ids = list(ib.req_ids[:n])
        qsl = r.query_start_loc.np[: n + 1].astype(np.int64)
        discard = r.discard_request_mask.np[:n].astype(bool)
        computed = ib.num_computed_tokens_cpu[:n].astype(np.int64)
        kinds = [self._kind(rid) for rid in req_ids]
        score_rows = [i for i in range(n) if kinds[i][0] == SCORE and not discard[i]]
        pass_rows = [i for i in range(n) if kinds[i][0] == SAR_PASS]
        if not score_rows and not pass_rows:
            return None
        values = torch.zeros(n, NCOLS, dtype=torch.float32, device=self.device)
        report = list(score_rows)
        step = _Step(req_ids=req_ids, values=values, report=report)
        if score_rows:
            self._swift(st, qsl, score_rows, values)
            if self.cfg.sar:
                rows = self._index(score_rows)
                step.sar_rows = rows
                step.sar_logits = st.logits.index_select(0, rows)  # a copy: the sampler edits logits in place
        for i in pass_rows:
            if self._sar_pass(st, i, req_ids[i], kinds[i][1], int(qsl[i]), int(qsl[i + 1]), int(computed[i]), values):
                if not discard[i]:
                    report.append(i)
        return step

    def _swift(self, st, qsl: np.ndarray, rows: list[int], values: torch.Tensor) -> None:
        n = len(qsl) - 1
        if self.logit_weight is not None:
            logits = st.logits
            t = logits.shape[0]
            project_layer_(self.acc, logits, None, self.logit_weight)
            slots = np.full(t, -1, dtype=np.int32)
            slots[rows] = rows
        else:
            t = st.hidden_states.shape[0]  # padded token count: every row the forward wrote
            slots = np.full(t, -1, dtype=np.int32)
            rows_np = np.asarray(rows, dtype=np.int64)
            slots[qsl[rows_np + 1] - 1] = rows_np
        finish_(self.acc, self.bias, torch.from_numpy(slots).to(self.device, non_blocking=True), self.state)
        values[:, :3] = self.state[:n]
        self.state[:n].zero_()

    def _sar_pass(self, st, i: int, req_id: str, q0_len: int, start: int, end: int, computed: int, values) -> bool:
        """Add the log-probs of the answer tokens this chunk predicts; True when the pass has a
        result to report (always, once its prefill is complete)."""
        rs = self.runner.requests[req_id]
        acc = getattr(rs, "_swift_fast_pass", None)
        if acc is None:
            acc = rs._swift_fast_pass = [0.0, 0, max(q0_len - 1, 0)]  # sum, count, next position to count
        prompt = rs.prompt_token_ids
        plen = len(prompt)
        # positions p (state predicting token p + 1) this chunk computed and not yet counted
        lo = max(computed, acc[2])
        hi = min(computed + (end - start), plen - 1)  # p + 1 must be a prompt token
        if hi > lo:
            idx = torch.arange(start + lo - computed, start + hi - computed, device=self.device)
            targets = self._index(prompt[lo + 1 : hi + 1])
            total = torch.zeros((), dtype=torch.float32, device=self.device)
            for c in range(0, idx.numel(), SAR_LOGIT_ROWS):
                h = st.hidden_states.index_select(0, idx[c : c + SAR_LOGIT_ROWS])
                logits = self.runner.model.compute_logits(h)
                total = total + token_logprobs(logits, targets[c : c + SAR_LOGIT_ROWS]).sum()
            acc[0] += float(total)
            acc[1] += hi - lo
            acc[2] = hi
        values[i, 3] = acc[0]
        values[i, 4] = acc[1]
        return True

    def _attach(self, step: _Step, out) -> None:
        if step.sar_rows is not None and self._sampled is not None:
            sampled = self._sampled[:, 0].index_select(0, step.sar_rows.to(self._sampled.device))
            lp = token_logprobs(step.sar_logits, sampled)
            step.values[step.sar_rows, 3] = lp
            step.values[step.sar_rows, 4] = 1.0
        target = getattr(out, "_model_runner_output", out)
        if not step.report or target is None or not hasattr(target, "req_id_to_index"):
            return
        rows = self._index(step.report)
        target.swift_fast = StepScores([step.req_ids[i] for i in step.report], step.values.index_select(0, rows))


def install_on_runner(runner, cfg: PluginConfig) -> RunnerScoring:
    """Load the head, check it against the loaded model and hook the runner."""
    from .config import check_engine

    head = cfg.load_head()
    check_engine(runner.vllm_config, head)
    return RunnerScoring(runner, cfg, head)


def plugin_state(worker, trace: bool = False) -> dict:
    """What the plugin holds in one worker (``LLM.collective_rpc(plugin_state)``): request states
    vLLM still keeps, how many carry plugin data, the plugin's buffer sizes in bytes, the
    process's resident memory and CPU time (user + system) and, while ``tracemalloc`` traces (``trace=True`` starts it), the
    bytes currently allocated by swift-fast's own code."""
    import psutil

    runner = getattr(worker, "model_runner", worker)
    scoring = getattr(runner, "_swift_fast", None)
    reqs = getattr(runner, "requests", {})
    tagged = sum(1 for rs in reqs.values() if hasattr(rs, "_swift_fast_pass") or hasattr(rs, "_swift_fast_kind"))
    buffers = 0
    if scoring is not None:
        tensors = [scoring.acc, scoring.state] + [
            b for m in scoring.forward.modules for n, b in m.named_buffers(recurse=False) if n.startswith("_swift_fast")
        ]
        seen = set()
        for t in tensors:
            if t is not None and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                buffers += t.numel() * t.element_size()
    return {
        "installed": scoring is not None,
        "requests": len(reqs),
        "requests_with_plugin_data": tagged,
        "buffer_bytes": buffers,
        "rss_bytes": psutil.Process().memory_info().rss,
        "cpu_seconds": sum(psutil.Process().cpu_times()[:2]),
        "traced_bytes": traced_bytes(start=trace),
    }


def traced_bytes(start: bool = False) -> int | None:
    """Bytes allocated by swift-fast's Python code and still alive (None unless tracemalloc traces)."""
    import os
    import tracemalloc

    if start and not tracemalloc.is_tracing():
        tracemalloc.start()
    if not tracemalloc.is_tracing():
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, os.path.join(root, "*"))])
    return sum(s.size for s in snap.statistics("filename"))
