"""Worker side: the per-step scoring core, one for both of vLLM's model runners.

The worker keeps no per-request score state. Each step it reports, for every request row that
sampled a token this step, the contribution of that one token (:class:`.transport.Values`:
``g * r``, ``g``, one token, the token's log-prob and confidence), and for a SAR
question-removed pass, on the step that completes its prefill, the sum and count of the
answer's log-probs over all its prefill chunks (:mod:`.sar_worker`). The front end adds a
token's values when, and only when, it appends that token to the request's output, so the
score always covers exactly ``CompletionOutput.token_ids``: preempted and recomputed requests,
tokens generated past a stop string before the abort lands, outputs the scheduler drops, and
requests that finish or are aborted mid-step cannot be counted twice or counted at all.

One core, thin adapters. Everything here -- which rows score, the kernels, SAR, confidence,
what is reported -- is the same on the V1 runner (:mod:`.runner_v1`) and on Model Runner V2
(:mod:`.runner_v2`). An adapter only tells the core four things, each once a step, through the
seam its runner offers:

1. which rows sample for which request: a :class:`StepBatch` (the row's request id, where its
   tokens lie in the step's hidden states, how many of its tokens were computed before, and
   whether its sampled token is kept);
2. the logits before the sampler (and the step's hidden states) -> :meth:`StepScoring.before_sampling`;
3. the sampled tokens -> :meth:`StepScoring.after_sampling`;
4. where to attach the step's values: the ``ModelRunnerOutput`` -> :meth:`StepScoring.attach`.

Per-request facts (the plugin's request kind, the prompt length, the prompt of a SAR pass)
come from the scheduler's ``SchedulerOutput`` (:meth:`StepScoring.begin`), which both runners
receive unchanged: ``scheduled_new_reqs`` add a :class:`RequestInfo`, ``finished_req_ids``
drop it. A preempted request keeps its record until it finishes (both runners resume it, V1 as
a cached request, V2 as a new one whose record replaces the old).

Which row scores which token. A request row samples from the state of its last scheduled
token, ``query_start_loc[i + 1] - 1``; the token it samples is kept unless the row is a partial
prefill chunk, which is also vLLM's rule. That state is always computed by the forward,
whatever prefix caching skipped (vLLM recomputes at least the last prompt token to sample).
``predicting``: it is the state whose logits produced the sampled token, which it scores.
``emitted``: it is the state of the request's last token so far as an input (the token sampled
one step earlier, or after a preemption the last token recomputed), which it scores when that
token is a response token (position >= the prompt length): each response token exactly once,
all but the last, whose states come from a last-state pass (:mod:`.last_state`) that reports
its one row the same way. ``slots[t] = i`` for the scored state, ``-1`` for every other token
of the batch; ``finish_`` gates and sums into ``state[i]``, which is read and cleared every step.

For every scored request the step also reports the sampled token's log-prob and its DeepConf
token confidence (a top-20 and a logsumexp over the sampling row's logits, taken before the
sampler and its structured-output mask touch them; the logsumexp is the log-probs' own): the
head-free values, with or without a head. Without a head (``head`` None) nothing is hooked into
the forward and those two are the step's only values.

The step never waits for the device: index arrays go up through persistent buffers
(:mod:`.staging`), values stay on the device until the step's one asynchronous copy to the
host (:class:`.transport.StepScores`).

NOTE (CUDA graphs): the forward's projections add into ``acc``, a buffer registered on the
model's modules (:mod:`.model_hooks`), so a captured graph -- V1's piecewise graphs, MRv2's FULL
graphs around the whole model -- replays into the same address. ``acc`` is zeroed by
:meth:`StepScoring.begin`, on the stream, before the step's forward is launched or replayed,
and read by ``finish_`` after it, in stream order; padded tokens a graph computes write rows no
slot selects. Nothing the graph captured is reallocated while the engine lives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np
import torch

from ..kernels.streaming import finish_, project_layer_
from ..rewards.confidence import token_confidence
from ..rewards.head import ALIGNMENT, SwiftHead
from . import model_hooks, pipeline
from .config import LAST_STATE, SAR_PASS, SCORE, SKIP, PluginConfig, request_kind
from .sar_worker import SarWorker
from .staging import Staging
from .transport import COL, NCOLS, StepScores


class StepBatch(NamedTuple):
    """The request rows of one step, as the runner laid them out (row i of the logits is row i here)."""

    req_ids: Sequence[str]  # [n] request of each row
    query_start_loc: np.ndarray  # [n + 1] int64: row i's tokens are hidden_states[qsl[i]:qsl[i + 1]]
    computed: np.ndarray  # [n] int64: the request's tokens computed before this step
    keeps_token: np.ndarray  # [n] bool: the row's sampled token is kept (not a partial prefill chunk)


@dataclass
class RequestInfo:
    """What the core needs of one request, from the ``NewRequestData`` that scheduled it."""

    kind: int  # SCORE, SKIP, SAR_PASS or LAST_STATE (:func:`.config.request_kind`)
    q0_len: int  # a SAR pass: tokens of the question-removed prompt before the answer
    prompt_len: int
    prompt_token_ids: Sequence[int] | None
    sar_pass: Any = None  # a SAR pass's running sums (:class:`.sar_worker.PassState`)


def request_info(new_req) -> RequestInfo:
    """The record of one ``NewRequestData`` (``sampling_params`` None: a pooling request, unscored)."""
    p = new_req.sampling_params
    kind, q0_len = request_kind(p)
    return RequestInfo(kind, q0_len, int(new_req.prompt_len), new_req.prompt_token_ids)


@dataclass
class _Step:
    req_ids: Sequence[str]
    values: torch.Tensor  # [n, NCOLS] on the model's device
    report: list[int]  # rows reported this step
    sar: Any = None  # sar_worker.SampledRows: what the sampled tokens' log-probs need


class StepScoring:
    """The scoring core of one model runner, installed after its model is loaded (by an adapter)."""

    def __init__(self, runner, cfg: PluginConfig, head: SwiftHead | None):
        self.runner = runner
        self.cfg = cfg
        self.head = head  # None: the head-free values only, nothing hooked into the model
        self.device = runner.device
        self.max_reqs = int(runner.max_num_reqs)
        max_tokens = int(runner.max_num_tokens)
        # logits (a logit-feature head's input, the log-probs, the confidences) exist in the last
        # pipeline stage only
        self.last = pipeline.is_last_stage(runner.vllm_config)
        self.forward = self.acc = self.slots = None
        self.logit_weight = None
        if head is not None:
            #: a response token at position q is scored by the state at q + offset (-1 or 0)
            self.state_offset = ALIGNMENT[head.alignment].state_offset
            arch = (getattr(runner.model_config.hf_config, "architectures", None) or [""])[0]
            self.forward = model_hooks.install(runner.model, head, max_tokens, self.device, arch)
            self.acc = self.forward.acc
            self.bias = self.forward.bias
            self.state = torch.zeros(self.max_reqs, 3, dtype=torch.float32, device=self.device)
            if head.feature == "logits" and self.last:
                self.logit_weight = head.weight.detach().to(self.device, torch.float32).contiguous()
                # the logits rows of a step (one per request) go through the same accumulator
                if self.acc.shape[0] < self.max_reqs:
                    self.acc = torch.zeros(self.max_reqs, 2, dtype=torch.float32, device=self.device)
            self.slots = Staging(self.acc.shape[0], torch.int32, self.device)
        else:
            self.state_offset = ALIGNMENT["predicting"].state_offset
        # every scored token's log-prob and confidence (the head-free values), and SAR's passes
        self.logprobs = SarWorker(runner, max_tokens, self.max_reqs) if self.last else None
        self.conf_rows = Staging(self.max_reqs, torch.int64, self.device)
        self.requests: dict[str, RequestInfo] = {}
        self.pipeline = None  # set by the adapter when the engine is pipelined
        self.adapter = None

    # -- per request -------------------------------------------------------------------------
    def begin(self, scheduler_output) -> None:
        """Start a step: zero the accumulator (dummy, profiling and warm-up forwards between steps
        leave projections behind) and bring the request records up to date."""
        if self.acc is not None:
            self.acc.zero_()
        for rid in scheduler_output.finished_req_ids:
            self.requests.pop(rid, None)
        for new in scheduler_output.scheduled_new_reqs:
            self.requests[new.req_id] = request_info(new)

    def _info(self, req_id: str) -> RequestInfo | None:
        return self.requests.get(req_id)

    # -- one step ----------------------------------------------------------------------------
    def before_sampling(self, batch: StepBatch, hidden_states: torch.Tensor | None,
                        logits: torch.Tensor | None) -> _Step | None:
        """The step's work that needs the forward's outputs, before the sampler touches the logits.

        ``hidden_states``: ``[T, d]`` final states of every token the forward computed (padded
        rows included); ``logits``: ``[n, V]``, row i sampling for ``batch.req_ids[i]``.
        """
        n = len(batch.req_ids)
        if n == 0:
            return None
        infos = [self._info(rid) for rid in batch.req_ids]
        kinds = [SKIP if f is None else f.kind for f in infos]
        keep = batch.keeps_token
        score_rows = [i for i in range(n) if kinds[i] == SCORE and keep[i]]
        last_rows = [i for i in range(n) if kinds[i] == LAST_STATE and keep[i]]
        pass_rows = [i for i in range(n) if kinds[i] == SAR_PASS]
        if not score_rows and not pass_rows and not last_rows:
            return None
        qsl = batch.query_start_loc
        values = torch.zeros(n, NCOLS, dtype=torch.float32, device=self.device)
        step = _Step(req_ids=list(batch.req_ids), values=values, report=score_rows + last_rows)
        swift_rows = self._credited(score_rows, batch, infos) + last_rows if self.head is not None else []
        if swift_rows:
            self._swift(hidden_states, logits, qsl, swift_rows, values)
        if score_rows and self.logprobs is not None:
            # both before the sampler, which may edit float32 logits in place
            step.sar = self.logprobs.keep_rows(logits, score_rows)
            self._confidence(logits, score_rows, values, step.sar)
        if pass_rows:
            self.logprobs.passes(hidden_states, values, [
                (i, infos[i], int(qsl[i]), int(qsl[i + 1]), int(batch.computed[i])) for i in pass_rows
            ])
            # a pass reports once its prefill is complete (its last chunk is kept)
            step.report += [i for i in pass_rows if keep[i]]
        return step

    def after_sampling(self, step: _Step | None, sampled: torch.Tensor | None) -> None:
        """``sampled``: ``[n, >= 1]`` token ids the sampler drew, row i for ``step.req_ids[i]``."""
        if step is not None and step.sar is not None and sampled is not None:
            self.logprobs.sampled_logprobs(step.values, step.sar, sampled)

    def attach(self, step: _Step | None, model_runner_output) -> None:
        """Put the step's values on the ``ModelRunnerOutput`` the scheduler will read."""
        if step is None or not step.report or model_runner_output is None:
            return
        if not hasattr(model_runner_output, "req_id_to_index"):
            return
        model_runner_output.swift_fast = StepScores(step.req_ids, step.values, step.report)

    def _credited(self, rows: list[int], batch: StepBatch, infos: list[RequestInfo]) -> list[int]:
        """The sampling rows whose state scores a response token: all of them for ``predicting``;
        for ``emitted``, those whose last scheduled position (the state's own token) is past the prompt."""
        if self.state_offset < 0:
            return rows
        qsl, computed = batch.query_start_loc, batch.computed
        return [i for i in rows
                if computed[i] + (qsl[i + 1] - qsl[i]) - 1 >= infos[i].prompt_len + self.state_offset]

    def _confidence(self, logits: torch.Tensor, rows: list[int], values: torch.Tensor, kept) -> None:
        """DeepConf's token confidence of each scored row's raw distribution (the logits before the
        sampler's temperature, penalties, bias and masks, as the log-probs: ``docs/definitions.md``):
        a top-k over the row, and its logsumexp (the one the log-probs computed, where they did).
        ``kept``: the rows' :class:`.sar_worker.SampledRows`."""
        if kept.copy is not None:  # float32 logits: the rows' copy, taken before the sampler
            values[kept.rows, COL.conf] = token_confidence(kept.copy)
        elif len(rows) == logits.shape[0]:
            values[: len(rows), COL.conf] = token_confidence(logits, lse=kept.lse)  # every row: no gather copy
        else:
            values[kept.rows, COL.conf] = token_confidence(logits.index_select(0, kept.rows),
                                                           lse=kept.lse.index_select(0, kept.rows))

    def _swift(self, hidden_states, logits, qsl: np.ndarray, rows: list[int], values: torch.Tensor) -> None:
        n = len(qsl) - 1
        slots = self.slots.host()
        if self.logit_weight is not None:
            t = logits.shape[0]
            project_layer_(self.acc, logits, None, self.logit_weight)
            slots[:t] = -1
            slots[rows] = rows
        else:
            t = hidden_states.shape[0]  # padded token count: every row the forward wrote
            slots[:t] = -1
            rows_np = np.asarray(rows, dtype=np.int64)
            slots[qsl[rows_np + 1] - 1] = rows_np
        finish_(self.acc, self.bias, self.slots.upload(t), self.state)
        values[:, COL.weighted : COL.tokens + 1] = self.state[:n]
        self.state[:n].zero_()

    def profile(self) -> None:
        """During vLLM's memory profiling (the runner's ``profile_run``): SAR's largest transient
        work, so its peak is measured before the KV cache is sized."""
        if self.logprobs is not None:
            mc = self.runner.model_config
            self.logprobs.profile(torch.empty(self.max_reqs, mc.get_hidden_size(), dtype=mc.dtype, device=self.device))

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer the plugin allocated in this worker (for memory accounting)."""
        out = self.conf_rows.tensors()
        if self.head is not None:
            out += [self.acc, self.state] + self.slots.tensors()
            out += [b for m in self.forward.modules for name, b in m.named_buffers(recurse=False)
                    if name.startswith("_swift_fast") and b is not None]
        if self.logprobs is not None:
            out += self.logprobs.tensors()
        return out
