"""Worker side: per-step bookkeeping on vLLM's V1 model runner (``GPUModelRunner`` and its
``CPUModelRunner`` subclass).

The worker keeps no per-request score state. Each step it reports, for every request row that
sampled a token this step, the contribution of that one token (:class:`.transport.Values`:
``g * r``, ``g``, one token and, with SAR, the token's log-prob), and for a SAR
question-removed pass, on the step that completes its prefill, the sum and count of the
answer's log-probs over all its prefill chunks (:mod:`.sar_worker`). The front end adds a
token's values when, and only when, it appends that token to the request's output, so the
score always covers exactly ``CompletionOutput.token_ids``: preempted and recomputed requests,
tokens generated past a stop string before the abort lands, outputs the scheduler drops, and
requests that finish or are aborted mid-step cannot be counted twice or counted at all.

Which row scores which token. A request row samples from the state of its last scheduled
token, ``query_start_loc[i + 1] - 1``; the token it samples is kept unless the row is a partial
prefill chunk (``discard_request_mask``), which is also vLLM's rule. That state is always
computed by the forward, whatever prefix caching skipped (vLLM recomputes at least the last
prompt token to sample). ``predicting``: it is the state whose logits produced the sampled
token, which it scores. ``emitted``: it is the state of the request's last token so far as an
input (the token sampled one step earlier, or after a preemption the last token recomputed),
which it scores when that token is a response token (position >= the prompt length): each
response token exactly once, all but the last, whose states come from a last-state pass
(:mod:`.last_state`) that reports its one row the same way. ``slots[t] = i`` for the scored
state, ``-1`` for every other token of the batch; ``finish_`` gates and sums into
``state[i]``, which is read and cleared every step.

For a request pruned by DeepConf's confidence, or traced (:mod:`.pruning`, ``trace``), the
step also reports the sampled row's token confidence (a top-k and a logsumexp over that row's
logits, taken before the sampler, which edits float32 logits in place).

The step never waits for the device: index arrays go up through persistent buffers
(:mod:`.staging`), values stay on the device until the step's one asynchronous copy to the
host (:class:`.transport.StepScores`).
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..confidence import token_confidence
from ..head import ALIGNMENT, SwiftHead
from ..kernels.streaming import finish_, project_layer_
from . import model_hooks, pipeline
from .config import LAST_STATE, SAR_PASS, SCORE, SKIP, PluginConfig, request_kind, trace_requested
from .pruning import wants_confidence
from .sar_worker import SarWorker
from .staging import Staging
from .transport import COL, NCOLS, StepScores


@dataclass
class _Step:
    req_ids: list[str]
    values: torch.Tensor  # [n, NCOLS] on the model's device
    report: list[int]  # rows reported this step
    sar: Any = None  # sar_worker.SampledRows: what the sampled tokens' log-probs need


class RunnerScoring:
    """Installed on one model runner after its model is loaded."""

    def __init__(self, runner, cfg: PluginConfig, head: SwiftHead):
        self.runner = runner
        self.cfg = cfg
        self.head = head
        #: a response token at position q is scored by the state at q + offset (-1 or 0)
        self.state_offset = ALIGNMENT[head.alignment].state_offset
        self.device = runner.device
        self.max_reqs = int(runner.max_num_reqs)
        max_tokens = int(runner.max_num_tokens)
        arch = (getattr(runner.model_config.hf_config, "architectures", None) or [""])[0]
        self.forward = model_hooks.install(runner.model, head, max_tokens, self.device, arch)
        self.acc = self.forward.acc
        self.bias = self.forward.bias
        self.state = torch.zeros(self.max_reqs, 3, dtype=torch.float32, device=self.device)
        # logits (a logit-feature head's input, SAR's log-probs) exist in the last pipeline stage only
        last = pipeline.is_last_stage(runner.vllm_config)
        self.logit_weight = None
        if head.feature == "logits" and last:
            self.logit_weight = head.weight.detach().to(self.device, torch.float32).contiguous()
            # the logits rows of a step (one per request) go through the same accumulator
            if self.acc.shape[0] < self.max_reqs:
                self.acc = torch.zeros(self.max_reqs, 2, dtype=torch.float32, device=self.device)
        self.slots = Staging(self.acc.shape[0], torch.int32, self.device)
        self.sar = SarWorker(runner, max_tokens, self.max_reqs) if cfg.sar and last else None
        self.conf_rows = Staging(self.max_reqs, torch.int64, self.device)
        self._step: _Step | None = None
        self._sampled = None
        self._wrap()
        # after the runner's own wrappers: a pipeline stage's sums leave after, and enter inside, them
        self.pipeline = pipeline.install(runner, self.acc, head.feature == "hidden")

    # -- wiring ------------------------------------------------------------------------------
    def _wrap(self) -> None:
        r = self.runner
        orig_execute, orig_sample_tokens, orig_sample = r.execute_model, r.sample_tokens, r._sample
        orig_dummy_sampler = r._dummy_sampler_run
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

        def _dummy_sampler_run(self_, hidden_states, *args, **kwargs):
            out = orig_dummy_sampler(hidden_states, *args, **kwargs)
            if scoring.sar is not None:
                scoring.sar.profile(hidden_states)  # memory profiling: SAR's peak is measured too
            return out

        r.execute_model = types.MethodType(execute_model, r)
        r._dummy_sampler_run = types.MethodType(_dummy_sampler_run, r)
        r._sample = types.MethodType(_sample, r)
        r.sample_tokens = types.MethodType(sample_tokens, r)

    def _kind(self, req_id: str) -> tuple[int, int, bool]:
        """``(kind, q0_len, confidence wanted)`` of a request (:func:`.config.request_kind`, and
        whether its pruning signal or trace needs each token's confidence), read once per request."""
        rs = self.runner.requests.get(req_id)
        if rs is None:
            return SKIP, 0, False
        k = getattr(rs, "_swift_fast_kind", None)
        if k is None:
            p = rs.sampling_params
            k = (*request_kind(p), wants_confidence(p) or trace_requested(p))
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
        kinds = [self._kind(rid) for rid in req_ids]
        score_rows = [i for i in range(n) if kinds[i][0] == SCORE and not discard[i]]
        last_rows = [i for i in range(n) if kinds[i][0] == LAST_STATE and not discard[i]]
        pass_rows = [i for i in range(n) if kinds[i][0] == SAR_PASS]
        if not score_rows and not pass_rows and not last_rows:
            return None
        values = torch.zeros(n, NCOLS, dtype=torch.float32, device=self.device)
        step = _Step(req_ids=req_ids, values=values, report=score_rows + last_rows)
        swift_rows = self._credited(score_rows, qsl) + last_rows
        if swift_rows:
            self._swift(st, qsl, swift_rows, values)
        if score_rows:
            if self.sar is not None:
                step.sar = self.sar.keep_rows(st.logits, score_rows)
            conf_rows = [i for i in score_rows if kinds[i][2]]
            if conf_rows:
                # before the sampler, which edits float32 logits in place
                self._confidence(st.logits, conf_rows, values)
        if pass_rows:
            computed = ib.num_computed_tokens_cpu[:n]
            self.sar.passes(st, values, [
                (i, r.requests[req_ids[i]], kinds[i][1], int(qsl[i]), int(qsl[i + 1]), int(computed[i]))
                for i in pass_rows
            ])
            # a pass reports once its prefill is complete (its last chunk is not discarded)
            step.report += [i for i in pass_rows if not discard[i]]
        return step

    def _credited(self, rows: list[int], qsl: np.ndarray) -> list[int]:
        """The sampling rows whose state scores a response token: all of them for ``predicting``;
        for ``emitted``, those whose last scheduled position (the state's own token) is past the prompt."""
        if self.state_offset < 0:
            return rows
        requests, ib = self.runner.requests, self.runner.input_batch
        computed = ib.num_computed_tokens_cpu
        first = [requests[ib.req_ids[i]].num_prompt_tokens + self.state_offset for i in rows]
        return [i for i, f in zip(rows, first) if computed[i] + (qsl[i + 1] - qsl[i]) - 1 >= f]

    def _confidence(self, logits: torch.Tensor, rows: list[int], values: torch.Tensor) -> None:
        """DeepConf's token confidence of each row's distribution (the one its token is sampled
        from): a top-k and a logsumexp over the row, for the requests pruned by that signal or
        traced."""
        host = self.conf_rows.host()
        host[: len(rows)] = rows
        idx = self.conf_rows.upload(len(rows))
        values[idx, COL.conf] = token_confidence(logits.index_select(0, idx))

    def _swift(self, st, qsl: np.ndarray, rows: list[int], values: torch.Tensor) -> None:
        n = len(qsl) - 1
        slots = self.slots.host()
        if self.logit_weight is not None:
            logits = st.logits
            t = logits.shape[0]
            project_layer_(self.acc, logits, None, self.logit_weight)
            slots[:t] = -1
            slots[rows] = rows
        else:
            t = st.hidden_states.shape[0]  # padded token count: every row the forward wrote
            slots[:t] = -1
            rows_np = np.asarray(rows, dtype=np.int64)
            slots[qsl[rows_np + 1] - 1] = rows_np
        finish_(self.acc, self.bias, self.slots.upload(t), self.state)
        values[:, COL.weighted : COL.tokens + 1] = self.state[:n]
        self.state[:n].zero_()

    def _attach(self, step: _Step, out) -> None:
        if step.sar is not None and self._sampled is not None:
            self.sar.sampled_logprobs(step.values, step.sar, self._sampled)
        target = getattr(out, "_model_runner_output", out)
        if not step.report or target is None or not hasattr(target, "req_id_to_index"):
            return
        target.swift_fast = StepScores(step.req_ids, step.values, step.report)

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer the plugin allocated in this worker (for memory accounting)."""
        out = [self.acc, self.state] + self.slots.tensors() + self.conf_rows.tensors()
        out += [b for m in self.forward.modules for name, b in m.named_buffers(recurse=False)
                if name.startswith("_swift_fast") and b is not None]
        if self.sar is not None:
            out += self.sar.tensors()
        return out


def install_on_runner(runner, cfg: PluginConfig) -> RunnerScoring:
    """Load the head, check it against the loaded model and hook the runner."""
    from .config import check_engine, check_same_head

    check_same_head(runner.vllm_config, cfg.head_path)
    head = cfg.load_head()
    check_engine(runner.vllm_config, head)
    return RunnerScoring(runner, cfg, head)
