"""Front-end side (the process that owns ``LLMEngine`` / ``AsyncLLM``): sums each request's
per-token values into its score, attaches the results to every ``CompletionOutput``, and runs
the passes a finished candidate needs (SAR's, an ``emitted`` head's last state).

The parts: :class:`FrontEnd` (here), installed on one engine, wraps that engine's
``OutputProcessor`` and runs each step; :mod:`.accumulator` keeps one request's sums and gives
its outputs their fields (and says when a value is None); :mod:`.passes` holds a finished
candidate back while its passes run, across a pause of the engine too; :mod:`.output_hooks`
wraps vLLM's output classes once per process, where an output is held and where it gets its
fields.

Scores. ``OutputProcessor.process_outputs`` is wrapped: before vLLM's loop, the values each
``EngineCoreOutput`` carries (see :mod:`.transport`) are popped and added to the request's
accumulator (kept on vLLM's ``RequestState``, so it is freed with it). Each value belongs to the
one token its output carries, and that token is appended to the output, so the sums cover
exactly ``CompletionOutput.token_ids``. ``CompletionOutput`` gets ``swift_score``,
``swift_tokens`` (tokens scored) and, with SAR, ``sar`` and ``sar_context`` (where ``q0`` came
from: ``"chat"``, ``"request"`` or ``"default"``, :mod:`.contexts`).

Pruning (:mod:`.pruning`). After vLLM's loop has appended a step's tokens, the groups (the
candidates of one request with ``n > 1``) that received values are checked against the pruning
policy; a candidate it stops gets its final output at once (``finish_reason`` ``"pruned"``,
``swift_pruned = True``, its partial score, no SAR) and is aborted in the engine core with the
step's ``reqs_to_abort``.

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

import logging
import types

from ..rewards.head import ALIGNMENT
from . import last_state, transport
from .accumulator import Accumulator
from .config import SCORE, PluginConfig, request_kind, trace_requested
from .contexts import context_of
from .deepconf import DeepConf
from .output_hooks import IN_BEAM_SEARCH, install_output_hooks
from .passes import PassRunner
from .pruning import Pruner

logger = logging.getLogger("swift_fast.vllm_plugin")


class FrontEnd(PassRunner):
    """Installed on one ``LLMEngine`` or ``AsyncLLM``; the passes' side is :class:`.passes.PassRunner`."""

    def __init__(self, engine, cfg: PluginConfig, is_async: bool):
        self.cfg = cfg
        self.is_async = is_async
        self.op = engine.output_processor
        self.engine_core = engine.engine_core
        self.input_processor = engine.input_processor
        self.max_model_len = engine.vllm_config.model_config.max_model_len
        head = cfg.load_head()
        self.has_head = head is not None
        self.last_wanted = head is not None and ALIGNMENT[head.alignment].extra_forward
        self.contexts = None
        if cfg.sar:
            from .contexts import Contexts

            self.contexts = Contexts(engine, cfg)
        self._warned: set[str] = set()
        self._init_passes()
        self.pruner = Pruner(engine.input_processor, cfg.prune, cfg.deepconf, self.has_head)
        self.deepconf = DeepConf(self)
        self._wrap_resume(engine)
        # data-parallel engine cores in rank order (None with one engine core)
        engines = getattr(self.engine_core, "core_engines", None)
        self._engines = list(engines) if engines is not None and len(engines) > 1 else None
        self._touched: set = set()  # pruning groups that received values this step
        install_output_hooks()
        self._wrap()

    # -- wiring ------------------------------------------------------------------------------
    def _wrap(self) -> None:
        """Wrap this engine's ``OutputProcessor`` on the instance: ``add_request`` (a scored request's
        accumulator, its pruning group), ``process_outputs`` (values popped before vLLM's loop; held
        candidates released and pruning decided after it), ``_finish_request`` (a held candidate stays
        registered), ``abort_requests`` (with the candidates' passes), ``get_num_queued_tokens``."""
        op = self.op
        fe = self
        orig_add, orig_process = op.add_request, op.process_outputs
        orig_finish, orig_abort = op._finish_request, op.abort_requests

        def add_request(self_, request, *args, **kwargs):
            orig_add(request, *args, **kwargs)
            rs = self_.request_states.get(request.request_id)
            if rs is not None and rs.detokenizer is not None and getattr(rs, "_swift_fast", None) is None:
                scored = request_kind(request.sampling_params)[0] == SCORE and not IN_BEAM_SEARCH.get()
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
                fe.deepconf.join(acc, rs, parent, index, request.sampling_params)

        def process_outputs(self_, engine_core_outputs, *args, **kwargs):
            # vLLM passes the step's weight version by keyword (0.32, 0.33)
            keep = fe._pre(engine_core_outputs, kwargs.get("weight_version"))
            result = orig_process(keep, *args, **kwargs)
            fe._release(result.request_outputs)
            if fe._touched or fe.deepconf.touched:
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
                        if acc.dc is not None:
                            self.deepconf.note_values(acc)
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
        groups, self._touched = self._touched, set()
        for rs in self.pruner.decide(groups, self._running):
            self._stop(rs, result, iteration_stats)
        if self.deepconf.touched:
            stop, submit = self.deepconf.decide(self._running)
            for rs, req in submit:
                if self.op.request_states.get(rs.request_id) is rs:  # not aborted while it waited
                    self.deepconf.submit(req)
            for rs in stop:
                acc = rs._swift_fast
                acc.pruned = True
                # a candidate whose wave never started was never sent to the engine core
                never = acc.dc.deferred.pop(acc.index, None) is not None
                self._stop(rs, result, iteration_stats, abort=not never)

    def _stop(self, rs, result, iteration_stats, abort: bool = True) -> None:
        """Finish a stopped candidate now (its final output, as vLLM's loop would emit it) and abort it
        in the engine core with the step's ``reqs_to_abort``; the engine's statistics count it as a
        finished (aborted) request."""
        from vllm.v1.engine import FinishReason

        out = rs.make_request_output([], None, FinishReason.ABORT, None, None, None)
        self._emit(rs, out, result.request_outputs)
        self._orig_finish(rs)
        if abort:
            result.reqs_to_abort.append(rs.request_id)
        self.op._update_stats_from_finished(rs, FinishReason.ABORT, iteration_stats)

    # -- warnings ------------------------------------------------------------------------------
    def warn_once(self, key: str, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(msg, *args)
