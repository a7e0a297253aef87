"""The passes a finished candidate needs, run by the front end (:mod:`.frontend`) while the
candidate's final output is held back: SAR's question-removed pass and an ``emitted`` head's
last-state pass (:mod:`.last_state`).

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

NOTE: :class:`PassRunner` is the part of ``FrontEnd`` that holds, submits and parks passes; it
keeps its own state (:meth:`PassRunner._init_passes`) but works on the engine the front end was
installed on, through the attributes ``FrontEnd`` sets (``op``, ``input_processor``,
``engine_core``, ``is_async``, ``max_model_len``, ``_orig_finish``) and its ``warn_once``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from typing import Any

from ..rewards.sar_context import DEFAULT
from . import last_state
from .accumulator import Accumulator
from .transport import Values

logger = logging.getLogger("swift_fast.vllm_plugin")

#: a pass refused while generation is paused is submitted again after 0.5 s, 1 s, ... at most 8 s apart
_RETRY_FIRST, _RETRY_MAX = 0.5, 8.0


class PassRunner:
    """Holding finished candidates and running their passes: the pass side of ``FrontEnd``."""

    def _init_passes(self) -> None:
        """The pass state, empty (``FrontEnd.__init__``)."""
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

    # -- hold and release --------------------------------------------------------------------
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

    def _release(self, request_outputs: list) -> None:
        """Build and emit the held final outputs whose passes are all back, then let vLLM finish
        their requests; a candidate aborted meanwhile is skipped."""
        while self.to_release:
            rs = self.to_release.pop(0)
            acc = rs._swift_fast
            if acc.released or self.op.request_states.get(rs.request_id) is not rs:
                continue  # aborted meanwhile
            acc.released = True
            args, kwargs = acc.held
            self._emit(rs, rs.make_request_output(*args, **kwargs), request_outputs)
            self._orig_finish(rs)

    @staticmethod
    def _emit(rs, out, request_outputs: list) -> None:
        """An output built outside vLLM's loop goes where the loop would put it: an ``AsyncLLM``
        request's collector, else the step's request outputs (``LLMEngine``)."""
        if out is not None:
            if rs.queue is not None:
                rs.queue.put(out)
            else:
                request_outputs.append(out)

    # -- the passes ----------------------------------------------------------------------------
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

    # -- pauses --------------------------------------------------------------------------------
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


def _refused_while_paused(eco) -> bool:
    """vLLM >= 0.33 finishes a request added during a pause with ``"engine_paused"`` (0.32 queues it)."""
    from vllm.v1.engine import FinishReason

    error = getattr(eco, "error", None)
    return eco.finish_reason == FinishReason.ERROR and getattr(error, "code", None) == "engine_paused"


def sar_value(mean_with_question: float, mean_without_question: float) -> float:
    """``swift_fast.rewards.sar.sar_from_means`` on two Python floats, in float64 on the host: it runs once
    per finished candidate in the front end's loop, where building tensors costs more than the math."""
    return min(1.0, max(-1.0, -math.expm1(mean_without_question - mean_with_question)))
