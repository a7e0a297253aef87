"""Front-end side (the process that owns ``LLMEngine`` / ``AsyncLLM``): sums each request's
per-token values into its score, attaches the results to every ``CompletionOutput``, and runs
the passes a finished candidate needs (SAR's, an ``emitted`` head's last state).

Scores. ``OutputProcessor.process_outputs`` is wrapped: before vLLM's loop, the values each
``EngineCoreOutput`` carries (see :mod:`.transport`) are popped and added to the request's
accumulator (kept on vLLM's ``RequestState``, so it is freed with it). Each value belongs to the
one token its output carries, and that token is appended to the output, so the sums cover
exactly ``CompletionOutput.token_ids``. ``CompletionOutput`` gets ``swift_score``,
``swift_tokens`` (tokens scored) and, with SAR, ``sar`` and ``sar_context`` (where ``q0`` came
from: ``"chat"``, ``"request"`` or ``"default"``, :mod:`.contexts`).

A missing value is None, never a number: ``swift_score`` is None for a request that opted out
and whenever ``swift_tokens`` differs from the number of tokens in the output (a path that was
never scored: the first such request is logged with the reason); ``sar`` is None when its pass
could not run (no question-removed context, ``q0 + answer`` over ``max_model_len``, an engine
error) or its two passes scored different tokens. An ``emitted`` head's value of a token comes
with the next token (:mod:`.last_state`): a streamed or stopped (pruned, aborted) output's score
covers every token but the last, and a finished one's all of them, its last token's from a
last-state pass (None when that pass cannot run).

Pruning (:mod:`.pruning`). After vLLM's loop has appended a step's tokens, the groups (the
candidates of one request with ``n > 1``) that received values are checked against the pruning
policy; a candidate it stops gets its final output at once (``finish_reason`` ``"pruned"``,
``swift_pruned = True``, its partial score, no SAR) and is aborted in the engine core with the
step's ``reqs_to_abort``.

Passes. When a scored candidate finishes (EOS, stop token, ``max_tokens``, stop string) and SAR
is on or the head is ``emitted``, its final output is held back: vLLM's ``RequestState`` stays
registered (so ``LLM.generate`` keeps stepping and ``AsyncLLM`` keeps the request open) while
its passes run, submitted together through the engine's own input processor beside the other
requests (``passes`` maps each to its candidate and kind); it is released when all are back.
SAR's question-removed pass -- prompt ``q0 + answer``, ``max_tokens=1``, prefix-cache reads off
so that every answer position is computed -- returns the answer's log-probs summed by the
worker (fused log-prob path); the candidate's log-probs with the question were summed during
generation. The last-state pass (:mod:`.last_state`) returns the last token's SWIFT value.
Tokens the engine generates for a held candidate before the abort for its stop string lands are
dropped as vLLM drops them for finished requests. An aborted candidate is released at once,
without its values, and its passes are aborted too. A pass that cannot be submitted counts as
back at once with its value None (and a warning): a held request never waits on a pass that
does not exist.

Pauses. ``AsyncLLM.pause_generation`` in ``"wait"`` mode (an RL weight update, say) lets running
requests finish while new ones wait. vLLM 0.32 queues the passes of candidates that finish
meanwhile and runs them at resume; 0.33's engine core refuses every request added during the
pause (``EngineCore._reject_add_while_paused``: ``finish_reason`` ``"error"``, error code
``"engine_paused"``, retryable). A refused pass is not a failed one: it never ran, so it carries
no values; it is parked, its candidate stays held, and it is submitted again (a new request id)
when the front end resumes the engine (``resume_generation``) or, for a pause resumed from
elsewhere (another API server), on a timer that backs off from 0.5 s to 8 s, refused again
until then. Each pass thus delivers its value exactly once, whenever the engine takes it. What
a pause implies either way: a pass that runs after a weight update computes its half of SAR (or
the last state) with the new weights.

Weight versions. vLLM labels each engine step's outputs with the weight version current when
they were built (``EngineCoreOutputs.weight_version``: ``"default"`` until a trainer sets one
through ``finish_weight_update``/``update_weight_version``; it changes only while generation is
paused), and hands it to ``OutputProcessor.process_outputs``. Each candidate records the labels
of the steps that brought it values -- its generated tokens and each of its passes -- in the
order first seen: ``CompletionOutput.swift_weight_versions``. One label: every value of the
candidate was computed with the same weights. Two or more: its values straddle a weight update
(a pass that ran after it, or a generation kept across it), and its ``sar`` mixes two models'
log-probs (``docs/rl.md`` says how an RL loop treats that). None: vLLM reported no label.
NOTE: the label is the one current when the step's output was built, and a label set without
a pause (``update_weight_version`` alone) is trusted as given; a last-state pass reads KV
blocks cached before an update when the pause kept the cache (``clear_cache=False``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import math
import time
import types
from typing import Any

from ..definitions import GATE_EPS
from ..rewards.head import ALIGNMENT
from ..rewards.sar_context import DEFAULT
from . import last_state, transport
from .config import SCORE, PluginConfig, request_kind, trace_requested
from .contexts import context_of
from .pruning import FINISH_REASON, Pruner
from .transport import Values

logger = logging.getLogger("swift_fast.vllm_plugin")

#: True while vLLM's beam search runs: its one-token step requests are not candidates, so they
#: are left unscored and never get a SAR pass (which would double every beam step).
_IN_BEAM_SEARCH = contextvars.ContextVar("swift_fast_in_beam_search", default=False)


class Accumulator:
    """Per-request sums (float64 on the host)."""

    __slots__ = ("scored", "sar_wanted", "last_wanted", "frontend", "context", "wsum", "gsum", "n", "sampled", "lp",
                 "lpn", "sar", "held", "pending", "released", "last_done", "last_missing", "request", "group",
                 "index", "at", "conf", "pruned", "trace", "versions")

    def __init__(self, scored: bool, sar_wanted: bool, frontend: "FrontEnd", context: dict | None = None,
                 last_wanted: bool = False):
        self.scored = scored
        self.sar_wanted = sar_wanted
        #: an ``emitted`` head: the last token's states come from a last-state pass (.last_state)
        self.last_wanted = last_wanted
        self.frontend = frontend
        self.context = context  # SAR's q0: {"ids", "source", "why"} (.contexts)
        self.wsum = self.gsum = self.lp = 0.0
        self.n = self.lpn = 0  # tokens scored; log-probs summed
        self.sampled = 0  # values received from generation steps: one per token appended
        self.sar: float | None = None
        self.held: tuple | None = None
        self.pending = 0  # passes submitted for the held output and not back yet
        self.released = False
        self.last_done = False
        self.last_missing: str | None = None  # why the last state cannot be computed
        #: what a pass repeats of the candidate's request: cache_salt, priority, arrival_time, engine rank
        self.request: dict = {}
        self.group = None  # pruning.Group when the candidate's request is pruned
        self.index = 0  # its index in the group
        self.at: dict | None = None  # its signal at each decision threshold it reached (pruning)
        self.conf = None  # confidence.RunningConfidence when pruned by confidence
        self.pruned = False
        self.trace: tuple[list, list, list, list] | None = None  # per-token values, when the request asked
        self.versions: list[str] = []  # weight versions of the steps that brought values, first seen first

    def note_version(self, version) -> None:
        if version is not None and version not in self.versions:
            self.versions.append(version)

    def add(self, v: Values) -> None:
        """The values of one generation step: one sampled token's log-prob and confidence, and the
        SWIFT value of the token its state scores (the sampled one; for ``emitted`` heads the one
        before it, or none on the first step)."""
        self._add_swift(v)
        self.lp += v.logp
        self.lpn += int(v.logp_tokens)
        self.sampled += 1
        if self.conf is not None:
            self.conf.push(v.conf)
        if self.trace is not None:
            self.trace[2].append(v.conf)
            if self.sar_wanted:
                self.trace[3].append(v.logp)
        if self.group is not None:
            self.group.record(self, swift=bool(v.tokens))

    def add_last(self, v: Values) -> None:
        """The value of a last-state pass: the last token's SWIFT value (``emitted`` heads)."""
        self._add_swift(v)
        self.last_done = True

    def _add_swift(self, v: Values) -> None:
        self.wsum += v.weighted
        self.gsum += v.gate
        self.n += int(v.tokens)
        if self.trace is not None and v.tokens:
            self.trace[0].append(v.weighted)
            self.trace[1].append(v.gate)

    def score(self, num_tokens: int, partial: bool = False) -> float | None:
        """The candidate's SWIFT score when every one of its ``num_tokens`` tokens was scored, else
        None; ``partial`` (a streamed, pruned or aborted output) also accepts, for an ``emitted`` head
        before its last-state pass, every token but the last."""
        if not self.scored:
            return None
        lag = 1 if partial and self.last_wanted and not self.last_done and num_tokens else 0
        if partial and not self.n:
            return None  # nothing scored yet (an emitted head's first token; aborted before any token)
        if self.n != num_tokens - lag:
            if not (self.last_missing and self.n == num_tokens - 1):  # that reason was logged already
                self.frontend.warn_once(
                    "unscored",
                    "swift-fast: a request's output has %d tokens and %d scored values; its swift_score is None "
                    "(the model runner did not report values for every token: is the plugin loaded in the "
                    "workers?)", num_tokens, self.n,
                )
            return None
        return self.wsum / max(self.gsum, GATE_EPS)

    def attach(self, out, num_tokens: int) -> None:
        final = out.finish_reason is not None
        partial = not final or self.pruned or out.finish_reason == "abort"
        out.swift_score = self.score(num_tokens, partial)
        out.swift_tokens = self.n if self.scored else 0
        out.swift_pruned = self.pruned
        out.swift_weight_versions = list(self.versions) or None
        if self.trace is not None and final:  # on the final output only
            out.swift_trace = {"gate_reward": list(self.trace[0]), "gate": list(self.trace[1]),
                               "confidence": list(self.trace[2])}
            if self.sar_wanted:
                out.swift_trace["logprob"] = list(self.trace[3])
        if self.pruned and final:
            out.finish_reason, out.stop_reason = FINISH_REASON, None
        if self.frontend.cfg.sar:
            out.sar = self.sar
            ran = self.sar_wanted and self.context and not self.pruned  # a pruned candidate gets no pass
            out.sar_context = self.context["source"] if ran else None


class FrontEnd:
    """Installed on one ``LLMEngine`` or ``AsyncLLM``."""

    def __init__(self, engine, cfg: PluginConfig, is_async: bool):
        self.cfg = cfg
        self.is_async = is_async
        self.op = engine.output_processor
        self.engine_core = engine.engine_core
        self.input_processor = engine.input_processor
        self.max_model_len = engine.vllm_config.model_config.max_model_len
        self.last_wanted = ALIGNMENT[cfg.load_head().alignment].extra_forward
        self.contexts = None
        if cfg.sar:
            from .contexts import Contexts

            self.contexts = Contexts(engine, cfg)
        self._warned: set[str] = set()
        self.passes_submitted = 0  # passes sent to the engine (diagnostics)
        self.last_state_passes = 0  # last-state passes back, and the tokens they computed (.last_state)
        self.last_state_tokens = 0
        self.passes: dict[str, tuple[Any, str]] = {}  # pass request id -> (candidate RequestState, "sar" | "last")
        self.pass_of: dict[str, list[str]] = {}  # candidate request id -> its pass request ids
        self.pass_tokens: dict[str, int] = {}  # pass request id -> its prompt tokens (q0 + answer)
        self.pass_inputs: dict[str, tuple] = {}  # pass request id -> (ids, q0_len, refusals so far)
        #: passes the engine refused while paused: (candidate RequestState, kind, ids, q0_len, refusals, due)
        self.parked: list[tuple] = []
        self.passes_refused = 0  # refusals while paused (diagnostics)
        self.to_release: list = []
        self._tasks: set = set()
        self.pruner = Pruner(engine.input_processor, cfg.prune)
        self._wrap_resume(engine)
        # data-parallel engine cores in rank order (None with one engine core)
        engines = getattr(self.engine_core, "core_engines", None)
        self._engines = list(engines) if engines is not None and len(engines) > 1 else None
        self._touched: set = set()  # pruning groups that received values this step
        _patch_request_state()
        self._wrap()

    # -- wiring ------------------------------------------------------------------------------
    def _wrap(self) -> None:
        op = self.op
        fe = self
        orig_add, orig_process = op.add_request, op.process_outputs
        orig_finish, orig_abort = op._finish_request, op.abort_requests

        def add_request(self_, request, *args, **kwargs):
            orig_add(request, *args, **kwargs)
            rs = self_.request_states.get(request.request_id)
            if rs is not None and rs.detokenizer is not None and getattr(rs, "_swift_fast", None) is None:
                scored = request_kind(request.sampling_params)[0] == SCORE and not _IN_BEAM_SEARCH.get()
                if scored and getattr(request, "resumable", False):
                    # a streaming-input session: each input segment ends with a finish reason that
                    # does not end the request, and earlier output becomes prompt; not scored
                    fe.warn_once("resumable", "swift-fast: streaming-input sessions are not scored (request %s)",
                                 request.request_id)
                    scored = False
                context = None
                if scored and fe.contexts is not None:
                    context = context_of(request.sampling_params) or fe.contexts.default
                acc = rs._swift_fast = Accumulator(scored, scored and fe.cfg.sar, fe, context,
                                                   last_wanted=scored and fe.last_wanted)
                if scored:
                    acc.request = {"cache_salt": request.cache_salt, "priority": request.priority,
                                   "arrival_time": request.arrival_time}
                if acc.last_wanted:
                    acc.last_missing = last_state.unavailable(request)
                if scored and trace_requested(request.sampling_params):
                    acc.trace = ([], [], [], [])
                # vLLM's signature: add_request(request, prompt, parent_req=None, request_index=0, queue=None)
                parent = args[1] if len(args) > 1 else kwargs.get("parent_req")
                index = args[2] if len(args) > 2 else kwargs.get("request_index", 0)
                Pruner.join(acc, rs, parent, index, request.sampling_params)

        def process_outputs(self_, engine_core_outputs, *args, **kwargs):
            # vLLM passes the step's weight version by keyword (0.32, 0.33)
            keep = fe._pre(engine_core_outputs, kwargs.get("weight_version"))
            result = orig_process(keep, *args, **kwargs)
            fe._release(result.request_outputs)
            if fe._touched:
                # vLLM's signature: process_outputs(outputs, engine_core_timestamp, iteration_stats, ...)
                stats = kwargs.get("iteration_stats", args[1] if len(args) > 1 else None)
                fe._prune(result, stats)
            return result

        def _finish_request(self_, req_state):
            acc = getattr(req_state, "_swift_fast", None)
            if acc is not None and acc.held is not None and not acc.released:
                return  # stays registered until its SAR pass is back
            orig_finish(req_state)

        def abort_requests(self_, request_ids, internal):
            ids = orig_abort(request_ids, internal)
            extra = []
            for rid in ids:
                for pid in list(fe.pass_of.get(rid, ())):
                    fe._forget_pass(pid)
                    extra.append(pid)
            return list(ids) + extra

        orig_queued = op.get_num_queued_tokens

        def get_num_queued_tokens(self_):
            # vLLM's admission control (max_num_queued_tokens) counts prompt tokens still in
            # prefill; a SAR pass is all prefill. Its request slot is already counted: the held
            # candidate stays registered until the pass is back.
            return orig_queued() + sum(fe.pass_tokens.values())

        op.get_num_queued_tokens = types.MethodType(get_num_queued_tokens, op)
        op.add_request = types.MethodType(add_request, op)
        op.process_outputs = types.MethodType(process_outputs, op)
        op._finish_request = types.MethodType(_finish_request, op)
        op.abort_requests = types.MethodType(abort_requests, op)
        self._orig_finish = orig_finish

    def _wrap_resume(self, engine) -> None:
        """After ``AsyncLLM.resume_generation`` the passes refused during the pause go in again."""
        orig = getattr(engine, "resume_generation", None)
        if orig is None:
            return
        fe = self

        @functools.wraps(orig)
        async def resume_generation(*args, **kwargs):
            out = await orig(*args, **kwargs)
            fe._submit_parked(force=True)
            return out

        engine.resume_generation = resume_generation

    # -- per step ----------------------------------------------------------------------------
    def _pre(self, engine_core_outputs, weight_version=None):
        """``weight_version``: vLLM's label of the weights this step's outputs were computed with."""
        if self.parked:
            self._submit_parked()
        keep = []
        states = self.op.request_states
        for eco in engine_core_outputs:
            v = transport.pop(eco)
            rid = eco.request_id
            entry = self.passes.get(rid)
            if entry is not None:
                if eco.finished:
                    self._pass_done(rid, *entry, v, eco, weight_version)
                continue
            rs = states.get(rid)
            if rs is not None:
                acc = getattr(rs, "_swift_fast", None)
                if acc is not None:
                    if acc.held is not None:
                        continue  # finished candidate: surplus tokens before its abort landed
                    if v is not None:
                        if not acc.sampled and self._engines is not None:
                            self._note_engine(rid, acc)
                        acc.add(v)
                        acc.note_version(weight_version)
                        if acc.group is not None:
                            self._touched.add(acc.group)
            keep.append(eco)
        return keep

    def _note_engine(self, rid: str, acc: Accumulator) -> None:
        """With data-parallel engines, the rank of the engine serving a candidate: its passes go to
        the same engine, whose prefix cache holds the candidate's KV blocks."""
        engine = getattr(self.engine_core, "reqs_in_flight", {}).get(rid)
        if engine is not None and engine in self._engines:
            acc.request["data_parallel_rank"] = self._engines.index(engine)

    def _running(self, rs) -> bool:
        acc = rs._swift_fast
        return self.op.request_states.get(rs.request_id) is rs and acc.held is None and not acc.pruned

    def _prune(self, result, iteration_stats=None) -> None:
        """Stop the candidates the pruning policy drops this step (:mod:`.pruning`): each gets its
        final output now and is aborted in the engine core with the step's ``reqs_to_abort``; the
        engine's statistics count it as a finished (aborted) request, as vLLM's loop would."""
        from vllm.v1.engine import FinishReason

        groups, self._touched = self._touched, set()
        for rs in self.pruner.decide(groups, self._running):
            out = rs.make_request_output([], None, FinishReason.ABORT, None, None, None)
            self._emit(rs, out, result.request_outputs)
            self._orig_finish(rs)
            result.reqs_to_abort.append(rs.request_id)
            self.op._update_stats_from_finished(rs, FinishReason.ABORT, iteration_stats)

    @staticmethod
    def _emit(rs, out, request_outputs: list) -> None:
        if out is not None:
            if rs.queue is not None:
                rs.queue.put(out)
            else:
                request_outputs.append(out)

    def _release(self, request_outputs: list) -> None:
        while self.to_release:
            rs = self.to_release.pop(0)
            acc = rs._swift_fast
            if acc.released or self.op.request_states.get(rs.request_id) is not rs:
                continue  # aborted meanwhile
            acc.released = True
            args, kwargs = acc.held
            self._emit(rs, rs.make_request_output(*args, **kwargs), request_outputs)
            self._orig_finish(rs)

    # -- SAR pass ----------------------------------------------------------------------------
    def warn_once(self, key: str, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(msg, *args)

    def hold(self, rs, call: tuple) -> None:
        """A scored candidate finished: hold its final output (``call``: the arguments of
        ``make_request_output``) and start its passes -- SAR's question-removed pass and, for an
        ``emitted`` head, the last-state pass (:mod:`.last_state`). It is released when all are back."""
        acc = rs._swift_fast
        acc.held = call
        answer = list(rs.detokenizer.output_token_ids)
        if acc.sar_wanted:
            self._start_sar(rs, acc, answer)
        if acc.last_wanted and answer:
            self._start_last_state(rs, acc, answer)
        if not acc.pending:
            self.to_release.append(rs)

    def _start_sar(self, rs, acc: Accumulator, answer: list[int]) -> None:
        if not answer:
            acc.sar = 0.0  # no answer token: no evidence either way (swift_fast.rewards.sar)
            return
        context = acc.context or {"ids": None, "source": DEFAULT, "why": "no question-removed context"}
        q0 = context["ids"]
        if not q0:
            self.warn_once(
                "no-q0:" + context["source"],
                "swift-fast: sar is None for request %s: %s (later requests without a %s context are logged at "
                "debug level)", rs.external_req_id, context["why"], context["source"],
            )
            logger.debug("swift-fast: sar is None for request %s: %s", rs.external_req_id, context["why"])
            return
        if context["source"] == DEFAULT:
            self.warn_once(
                "default",
                "swift-fast: request %s is a raw prompt without a question-removed context of its own: its SAR "
                "conditions the answer on the engine default (%d token(s); sar_context 'default'). For a prompt "
                "rendered from a chat, pass the same chat with the user turn emptied as sar_context.",
                rs.external_req_id, len(q0),
            )
        if len(q0) + len(answer) >= self.max_model_len:  # vLLM takes prompts shorter than max_model_len
            self._pass_failed(rs, "sar", ValueError(
                f"the question-removed pass needs {len(q0)} context + {len(answer)} answer tokens, not below "
                f"max_model_len {self.max_model_len}: give a shorter sar_context or a larger --max-model-len"
            ))
            return
        self._submit(rs, "sar", q0 + answer, q0_len=len(q0))

    def _start_last_state(self, rs, acc: Accumulator, answer: list[int]) -> None:
        why = acc.last_missing or last_state.too_long(len(rs.prompt_token_ids), len(answer), self.max_model_len)
        if why is not None:
            self._pass_failed(rs, "last", ValueError(why))
            return
        self._submit(rs, "last", list(rs.prompt_token_ids) + answer)

    def _submit(self, rs, kind: str, ids: list[int], q0_len: int = 0, refusals: int = 0) -> None:
        """Send one pass of ``kind`` (``"sar"`` or ``"last"``) for held candidate ``rs`` to the engine
        core, with the candidate's priority, arrival time (:mod:`.scheduling`) and engine; a
        last-state pass also with its ``cache_salt``, whose blocks it reads."""
        from vllm.inputs.engine import tokens_input

        own = rs._swift_fast.request
        salt = own.get("cache_salt") if kind == "last" else None
        try:
            req = self.input_processor.process_inputs(
                f"swift-fast-{kind}-{rs.request_id}",
                tokens_input(ids, cache_salt=salt),  # already token ids: nothing to render
                last_state.pass_params(kind, q0_len),
                supported_tasks=("generate",),
                arrival_time=own.get("arrival_time"),
                lora_request=rs.lora_request,
                priority=own.get("priority", 0),
                data_parallel_rank=own.get("data_parallel_rank"),
            )
            self.input_processor.assign_request_id(req)
        except Exception as e:  # a pass the engine refuses
            self._pass_failed(rs, kind, e)
            return
        pid = req.request_id
        self.passes[pid] = (rs, kind)
        self.pass_of.setdefault(rs.request_id, []).append(pid)
        self.pass_tokens[pid] = len(ids)
        self.pass_inputs[pid] = (ids, q0_len, refusals)
        rs._swift_fast.pending += 1
        self.passes_submitted += 1
        if self.is_async:
            task = asyncio.get_running_loop().create_task(self.engine_core.add_request_async(req))
            self._tasks.add(task)
            task.add_done_callback(lambda t, pid=pid: self._submitted(pid, t))
        else:
            try:
                self.engine_core.add_request(req)
            except Exception as e:
                self._forget_pass(pid)
                rs._swift_fast.pending -= 1
                self._pass_failed(rs, kind, e)

    def _pass_failed(self, rs, kind: str, e: Exception) -> None:
        """A pass that cannot run: its value is None (``sar``, or ``swift_score`` of an emitted head),
        logged once per kind of failure, so a server refusing many passes does not flood its log."""
        what = "sar" if kind == "sar" else "swift_score"
        self.warn_once(
            f"no-{kind}-pass:" + type(e).__name__,
            "swift-fast: no %s pass for request %s, its %s is None: %s (later requests failing the same way are "
            "logged at debug level)", "SAR" if kind == "sar" else "last-state", rs.external_req_id, what, e,
        )
        logger.debug("swift-fast: no %s pass for request %s: %s", kind, rs.external_req_id, e)
        if kind == "sar":
            rs._swift_fast.sar = None
        else:
            rs._swift_fast.last_missing = str(e)

    def _forget_pass(self, pass_id: str):
        """Unregister a pass; returns its ``(candidate RequestState, kind)`` or None."""
        entry = self.passes.pop(pass_id, None)
        self.pass_tokens.pop(pass_id, None)
        self.pass_inputs.pop(pass_id, None)
        if entry is not None:
            rid = entry[0].request_id
            pids = self.pass_of.get(rid, [])
            if pass_id in pids:
                pids.remove(pass_id)
            if not pids:
                self.pass_of.pop(rid, None)
        return entry

    def _submitted(self, pass_id: str, task) -> None:
        """Done callback of an asynchronous pass submission: a failed one counts as back (no engine
        output will ever arrive for it), and its candidate is released if nothing else is pending."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is not None:
            entry = self._forget_pass(pass_id)
            if entry is not None:
                rs, kind = entry
                self._pass_failed(rs, kind, task.exception() if not task.cancelled() else RuntimeError("cancelled"))
                self._one_back(rs)
                self._release([])

    def _one_back(self, rs) -> None:
        acc = rs._swift_fast
        acc.pending -= 1
        if acc.pending <= 0:
            self.to_release.append(rs)

    def _park(self, pass_id: str, rs, kind: str) -> None:
        """A pass the engine refused while generation is paused: submitted again after the pause;
        its candidate stays held (its ``pending`` count keeps the pass)."""
        ids, q0_len, refusals = self.pass_inputs[pass_id]
        self._forget_pass(pass_id)
        self.passes_refused += 1
        delay = min(_RETRY_FIRST * 2 ** refusals, _RETRY_MAX)
        self.parked.append((rs, kind, ids, q0_len, refusals + 1, time.monotonic() + delay))
        if not refusals:
            logger.info("swift-fast: the engine is paused: the %s pass of request %s runs when it resumes",
                        "SAR" if kind == "sar" else "last-state", rs.external_req_id)
        if self.is_async:
            with contextlib.suppress(RuntimeError):  # no running loop: the next step submits it
                asyncio.get_running_loop().call_later(delay, self._submit_parked)

    def _submit_parked(self, force: bool = False) -> None:
        """Submit the parked passes that are due (``force``: all of them, the engine has resumed);
        a candidate aborted meanwhile drops its passes."""
        now, keep, released = time.monotonic(), [], False
        for entry in self.parked:
            rs, kind, ids, q0_len, refusals, due = entry
            acc = rs._swift_fast
            if acc.released or self.op.request_states.get(rs.request_id) is not rs:
                continue
            if not force and due > now:
                keep.append(entry)
                continue
            acc.pending -= 1  # _submit counts it again, unless it fails at once
            self._submit(rs, kind, ids, q0_len, refusals)
            if acc.pending <= 0:
                self.to_release.append(rs)
                released = True
        self.parked = keep
        if released and self.is_async:
            self._release([])

    def _pass_done(self, pass_id: str, rs, kind: str, v: Values | None, eco, weight_version=None) -> None:
        if _refused_while_paused(eco):
            self._park(pass_id, rs, kind)
            return
        self._forget_pass(pass_id)
        acc = rs._swift_fast
        if v is not None:
            acc.note_version(weight_version)
        if kind == "last":
            self.last_state_passes += 1
            stats = getattr(eco, "prefill_stats", None)
            if stats is not None:
                self.last_state_tokens += int(stats.num_prompt_tokens) - int(stats.num_cached_tokens)
            if v is None or int(v.tokens) != 1:
                self._pass_failed(rs, kind, RuntimeError(f"the pass reported no state ({eco.finish_reason})"))
            else:
                acc.add_last(v)
        elif v is None or v.logp_tokens <= 0 or acc.lpn <= 0:
            logger.warning(
                "swift-fast: SAR pass for request %s returned no log-probs (%s); sar is None",
                rs.external_req_id, eco.finish_reason,
            )
            acc.sar = None
        elif int(v.logp_tokens) != acc.lpn:
            # both passes must cover the same answer tokens; a mean over different sets would be
            # a plausible-looking but wrong reward
            logger.warning(
                "swift-fast: SAR for request %s: the question-removed pass scored %d answer tokens, the "
                "generation %d; sar is None", rs.external_req_id, int(v.logp_tokens), acc.lpn,
            )
            acc.sar = None
        else:
            acc.sar = sar_value(acc.lp / acc.lpn, v.logp / v.logp_tokens)
        self._one_back(rs)


#: a pass refused while generation is paused is submitted again after 0.5 s, 1 s, ... at most 8 s apart
_RETRY_FIRST, _RETRY_MAX = 0.5, 8.0


def _refused_while_paused(eco) -> bool:
    """vLLM >= 0.33 finishes a request added during a pause with ``"engine_paused"`` (0.32 queues it)."""
    from vllm.v1.engine import FinishReason

    error = getattr(eco, "error", None)
    return eco.finish_reason == FinishReason.ERROR and getattr(error, "code", None) == "engine_paused"


def sar_value(mean_with_question: float, mean_without_question: float) -> float:
    """``swift_fast.rewards.sar.sar_from_means`` on two Python floats, in float64 on the host: it runs once
    per finished candidate in the front end's loop, where building tensors costs more than the math."""
    return min(1.0, max(-1.0, -math.expm1(mean_without_question - mean_with_question)))


_PATCHED = False


def _patch_request_state() -> None:
    """Wrap two ``RequestState`` methods, once per process and only once a configured engine
    exists; requests of other engines (no ``_swift_fast`` accumulator) pass straight through."""
    global _PATCHED
    if _PATCHED:
        return
    from vllm.v1.engine import FinishReason
    from vllm.v1.engine.output_processor import RequestState

    orig_make = RequestState.make_request_output
    orig_new = RequestState._new_completion_output
    no_sar = (FinishReason.ABORT, FinishReason.ERROR)

    def make_request_output(self, new_token_ids, pooling_output, finish_reason, stop_reason, *args, **kwargs):
        acc = getattr(self, "_swift_fast", None)
        if (
            acc is not None
            and (acc.sar_wanted or acc.last_wanted)
            and finish_reason is not None
            and acc.held is None
            and finish_reason not in no_sar
        ):
            acc.frontend.hold(self, ((new_token_ids, pooling_output, finish_reason, stop_reason, *args), kwargs))
            return None
        return orig_make(self, new_token_ids, pooling_output, finish_reason, stop_reason, *args, **kwargs)

    def _new_completion_output(self, *args, **kwargs):
        out = orig_new(self, *args, **kwargs)
        acc = getattr(self, "_swift_fast", None)
        if acc is not None:
            acc.attach(out, len(self.detokenizer.output_token_ids))
        return out

    from vllm.outputs import RequestOutput

    orig_add = RequestOutput.add

    def add(self, next_output, aggregate):
        # merging streamed deltas keeps the first CompletionOutput object: give it the newest scores
        orig_add(self, next_output, aggregate)
        if aggregate:
            newest = {c.index: c for c in next_output.outputs if hasattr(c, "swift_score")}
            if newest:
                for c in self.outputs:
                    src = newest.get(c.index)
                    if src is not None and src is not c:
                        for k in _FIELDS:
                            if hasattr(src, k):
                                setattr(c, k, getattr(src, k))

    RequestState.make_request_output = make_request_output
    RequestState._new_completion_output = _new_completion_output
    RequestOutput.add = add
    _patch_beam_search()
    _PATCHED = True


def _patch_beam_search() -> None:
    """Run vLLM's offline and online beam search with :data:`_IN_BEAM_SEARCH` set (the online one
    submits its step requests from tasks it creates, which copy the context)."""
    from vllm.entrypoints.generate.beam_search.offline import BeamSearchOfflineMixin
    from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin

    orig_offline = BeamSearchOfflineMixin.beam_search
    orig_online = BeamSearchOnlineMixin.beam_search

    @functools.wraps(orig_offline)
    def beam_search(self, *args, **kwargs):
        token = _IN_BEAM_SEARCH.set(True)
        try:
            return orig_offline(self, *args, **kwargs)
        finally:
            _IN_BEAM_SEARCH.reset(token)

    @functools.wraps(orig_online)
    async def beam_search_online(self, *args, **kwargs):
        token = _IN_BEAM_SEARCH.set(True)
        try:
            async for out in orig_online(self, *args, **kwargs):
                yield out
        finally:
            # a generator closed from another context (garbage collection) cannot reset its token
            try:
                _IN_BEAM_SEARCH.reset(token)
            except ValueError:
                pass

    BeamSearchOfflineMixin.beam_search = beam_search
    BeamSearchOnlineMixin.beam_search = beam_search_online


_FIELDS = ("swift_score", "swift_tokens", "swift_pruned", "swift_trace", "sar", "sar_context",
           "swift_weight_versions")
