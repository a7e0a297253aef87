"""DeepConf online inside vLLM (the policy: :mod:`swift_fast.selection.deepconf`): a request's
warmup candidates set a confidence threshold, later candidates stop as soon as their group
confidence falls below it, and the request stops altogether once its finished candidates agree.

Why here. The peers need a fork of vLLM, or a logits processor that runs only on CUDA, asks for
``logprobs=20`` on every token (20 log-probs a token through the front end) and stops a trace by
forcing its end-of-sequence token, so a stopped trace still reads as finished. Here each token's
confidence already arrives with the token (one float, :mod:`.transport`; computed in the worker
on both runners), a stopped candidate is aborted in the engine core as pruning does (its KV
blocks freed), and its output says it was stopped.

Settings. ``additional_config["swift_fast"]["deepconf"]`` is the engine default (``true`` or an
object of :class:`~swift_fast.selection.deepconf.DeepConfConfig` settings), applied to every
scored request whose ``n`` exceeds the warmup; a request sets its own with
``SamplingParams(extra_args={"swift_fast": {"deepconf": {...} | True | False}})``, the flat keys
``swift_fast_deepconf`` / ``swift_fast_deepconf_<setting>``, or the server's ``"deepconf"`` body
field. They are checked with the request's other inputs (``process_inputs``, :mod:`.pruning`):
a bad setting, a request with ``n`` at most the warmup, ``signal: "swift"`` without a head, or
``prune`` beside ``deepconf`` is an error before anything is queued. The resolved settings ride
in the request's own ``extra_args`` under :data:`RESOLVED`.

Groups. The candidates of one request share a :class:`DeepConfGroup` on vLLM's ``ParentRequest``.
Each step, after vLLM's ``OutputProcessor`` appended the step's tokens:

1. candidates that finished this step report their final signal (lowest group confidence, or
   SWIFT score) and, when the engine has an ``answer`` setting, their answer
   (:func:`swift_fast.grading.extract_answer` of the output text);
2. once the threshold is known, each running later candidate is checked against it, O(1) a token
   (a running window sum; the first check after the threshold scans what it generated so far);
   one below is stopped as pruning stops one: final output now (``finish_reason`` ``"pruned"``,
   ``swift_pruned`` True), aborted in the engine core;
3. a boundary that is due is passed (:meth:`~swift_fast.selection.deepconf.Group.advance`): a
   consensus stops every remaining candidate, or the next wave is submitted.

Waves. A later candidate of a request with waves is not sent to the engine core when vLLM fans
the request out: the engine client's ``add_request`` (``add_request_async``) is wrapped so that it
keeps such a child in its group, and the group submits it when its wave starts. A candidate a
consensus stops before its wave gets a final output with no tokens. Its ``RequestState`` exists
from the start (vLLM registered it), so the request's own output, aborts and statistics see
every candidate as vLLM would.

Each candidate's output gets ``deepconf``: ``{"warmup": bool, "threshold": s or None (not yet
known), "stop": None | "threshold" | "consensus", "crossing": t or None, "early": bool (a later
candidate that finished before the warmup did), "share": the vote share at the last boundary}``
-- what :func:`swift_fast.selection.deepconf.replay` needs to reproduce the decisions.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections import deque
from typing import Any

from ..selection.deepconf import CONSENSUS, FIELDS, THRESHOLD, DeepConfConfig, DeepConfConfigError, Group, crossing
from .config import SCORE, request_kind, request_setting

logger = logging.getLogger("swift_fast.vllm_plugin")

#: key of a request's resolved settings (a dict of :class:`DeepConfConfig` fields) in its extra_args
RESOLVED = "_swift_fast_deepconf"
#: flat request keys: ``swift_fast_deepconf`` (on/off) and ``swift_fast_deepconf_<setting>``
FLAT = "swift_fast_deepconf"

def requested(extra: dict | None) -> tuple[bool, Any, str]:
    """``(given, setting, where)`` of a request's DeepConf settings (:func:`.config.request_setting`)."""
    return request_setting(extra, "deepconf", FIELDS, DeepConfConfigError, "DeepConf")


def resolve(params, default: DeepConfConfig | None, has_head: bool, pruned: bool) -> DeepConfConfig | None:
    """The settings a request runs DeepConf online with, or None. Raises ``DeepConfConfigError``
    naming the field for a bad setting, and for a request it cannot apply to."""
    given, setting, where = requested(getattr(params, "extra_args", None))
    n = getattr(params, "n", 1) or 1
    scored = request_kind(params)[0] == SCORE
    if not given:
        if default is None or not scored or n <= default.warmup or pruned:
            return None
        return default
    cfg = DeepConfConfig.parse(setting, where=where, base=default)
    if cfg is None:
        return None
    if not scored:
        raise DeepConfConfigError("deepconf stops a request's candidates by their confidence, and this request opted "
                                  "out of scoring: drop one of the two")
    if pruned:
        raise DeepConfConfigError("a request is stopped either by prune or by deepconf: drop one of the two")
    if n <= cfg.warmup:
        raise DeepConfConfigError(
            f"deepconf runs warmup = {cfg.warmup} candidates to the end and stops later ones, and this request has "
            f"n = {n}: ask for more candidates (server: \"best_of_n\"), or a smaller warmup"
        )
    if cfg.signal == "swift" and not has_head:
        raise DeepConfConfigError('deepconf signal "swift" thresholds the running SWIFT score, which needs a SWIFT '
                                  'head: use signal "confidence", or start the engine with a head')
    return cfg


def config_of(params) -> DeepConfConfig | None:
    d = (getattr(params, "extra_args", None) or {}).get(RESOLVED)
    return DeepConfConfig(**d) if isinstance(d, dict) else None


class Watch:
    """One running candidate's signal against the threshold, O(1) a token once it is known: the
    sum of its last ``window`` token confidences (re-summed every ``window`` tokens, so no drift),
    or its running SWIFT score."""

    __slots__ = ("checked", "run", "win")

    def __init__(self):
        self.checked = 0  # tokens whose windows were compared with the threshold
        self.run = 0.0
        self.win: deque | None = None

    def crossed(self, acc, cfg: DeepConfConfig, s: float) -> int | None:
        """The crossing among the tokens generated since the last call (None: none)."""
        if cfg.signal == "swift":
            hist = acc.dc_swift
            t = crossing(hist[self.checked:], s, max(cfg.window - self.checked, 1), "swift")
            t = None if t is None else t + self.checked
            self.checked = len(hist)
            return t
        c = acc.confs
        w = cfg.window
        if self.win is None:  # first check since the threshold: the whole prefix at once
            t = crossing(c, s, w)
            self.checked = len(c)
            if t is None and len(c) >= 1:
                self.win = deque(c[-w:], maxlen=w)
                self.run = math.fsum(self.win)
            return t
        for t in range(self.checked, len(c)):
            x = c[t]
            if len(self.win) == w:
                self.run -= self.win[0]
            self.win.append(x)
            self.run += x
            if (t + 1) % w == 0:
                self.run = math.fsum(self.win)
            if t + 1 >= w and self.run / w < s:
                self.checked = t + 1
                return t + 1
        self.checked = len(c)
        return None


class DeepConfGroup:
    """One request's candidates under DeepConf online: the policy's :class:`Group`, the members
    (weak references to their ``RequestState``), each one's :class:`Watch`, and the children held
    back for a later wave (their ``EngineCoreRequest``)."""

    __slots__ = ("policy", "cfg", "members", "watch", "deferred", "__weakref__")

    def __init__(self, cfg: DeepConfConfig, n: int):
        self.cfg = cfg
        self.policy = Group(cfg, n)
        self.members: dict[int, weakref.ref] = {}
        self.watch: dict[int, Watch] = {}
        self.deferred: dict[int, Any] = {}

    def info(self, index: int) -> dict:
        p = self.policy
        return {"warmup": index < self.cfg.warmup, "threshold": p.threshold, "stop": p.stopped.get(index),
                "crossing": p.crossings.get(index), "early": index in p.early, "share": p.share}


class DeepConf:
    """Installed with the front end (:class:`~.frontend.FrontEnd`) of one engine: joins candidates to
    their groups, holds back later waves, and takes each step's decisions."""

    def __init__(self, frontend):
        self.fe = frontend
        self.default = frontend.cfg.deepconf
        self.stopped = 0  # candidates stopped so far (diagnostics)
        self.touched: set = set()
        self._warned_no_answer = False
        self._wrap_engine_client(frontend.engine_core)

    # -- joining and waves ---------------------------------------------------------------------
    def join(self, acc, rs, parent_req, index: int, params) -> None:
        if parent_req is None or not acc.scored:
            return
        cfg = config_of(params)
        if cfg is None:
            return
        group = getattr(parent_req, "_swift_fast_deepconf", None)
        if group is None:
            group = parent_req._swift_fast_deepconf = DeepConfGroup(cfg, parent_req.n)
        group.members[index] = weakref.ref(rs)
        group.watch[index] = Watch()
        acc.dc, acc.index = group, index
        if cfg.signal == "swift":
            acc.dc_swift = []

    def _wrap_engine_client(self, client) -> None:
        """Children of a later wave stay in their group until it starts (module notes)."""
        dc = self
        orig, orig_async = getattr(client, "add_request", None), getattr(client, "add_request_async", None)

        def held_back(request) -> bool:
            rs = dc.fe.op.request_states.get(request.request_id)
            acc = getattr(rs, "_swift_fast", None)
            group = getattr(acc, "dc", None)
            if group is None or acc.index < group.policy.released:
                return False
            group.deferred[acc.index] = request
            return True

        if orig is not None:
            def add_request(request, *args, **kwargs):
                if held_back(request):
                    return None
                return orig(request, *args, **kwargs)

            client.add_request = add_request
        if orig_async is not None:
            async def add_request_async(request, *args, **kwargs):
                if held_back(request):
                    return None
                return await orig_async(request, *args, **kwargs)

            client.add_request_async = add_request_async
        self._submit_sync, self._submit_async = orig, orig_async

    def submit(self, request) -> None:
        """Send a held-back candidate whose wave starts to the engine core."""
        if self.fe.is_async:
            import asyncio

            task = asyncio.get_running_loop().create_task(self._submit_async(request))
            self.fe._tasks.add(task)
            task.add_done_callback(self.fe._tasks.discard)
        else:
            self._submit_sync(request)

    # -- per step --------------------------------------------------------------------------------
    def finished(self, rs, acc, finish_reason) -> bool:
        """Candidate ``rs`` finished by itself this step (``make_request_output`` with a finish
        reason, before any hold for SAR): its final signal and answer go to the policy. Returns True
        when its last token crossed the threshold: it is then stopped there (``acc.pruned``), as the
        policy judges a candidate on every token it generated."""
        group = acc.dc
        p = group.policy
        if acc.pruned or p.done(acc.index):
            return False
        if p.threshold is not None and acc.index >= group.cfg.warmup:
            t = group.watch[acc.index].crossed(acc, group.cfg, p.threshold)
            if t is not None:
                p.stopped[acc.index], p.crossings[acc.index] = THRESHOLD, t
                acc.pruned = True
                self.stopped += 1
                self.touched.add(group)
                return True
        cfg = group.cfg
        errored = str(finish_reason).lower() == "error"
        if errored:
            signal = math.nan  # no signal, but the warmup must not wait for it forever
        elif cfg.signal == "swift":
            signal = acc.dc_swift[-1] if acc.dc_swift else math.nan
        else:
            from ..rewards.confidence import lowest_group

            signal = lowest_group(acc.confs, cfg.window) if len(acc.confs) else math.nan
        answer = None
        kind = self.fe.cfg.answer
        if kind is not None and cfg.consensus is not None and not errored:
            from ..grading.answers import extract_answer

            text = getattr(rs.detokenizer, "output_text", "") or ""
            answer = extract_answer(text, kind, finish_reason=str(finish_reason).lower() if finish_reason else None)
        group.policy.finish(acc.index, signal, answer)
        self.touched.add(group)
        return False

    def decide(self, is_running) -> tuple[list, list]:
        """``(stop, submit)``: the running or held-back candidates (``RequestState``) to stop now, and
        ``(RequestState, EngineCoreRequest)`` of the held-back candidates whose wave starts now."""
        stop, submit = [], []
        groups, self.touched = self.touched, set()
        answers = self.fe.cfg.answer is not None
        for g in groups:
            p = g.policy
            if len(g.members) < p.n:
                continue  # children are registered one by one: decide on the whole group
            while True:
                if p.threshold is not None:
                    for i, ref in g.members.items():
                        rs = ref()
                        if (rs is None or i < g.cfg.warmup or p.done(i) or i >= p.released
                                or not is_running(rs)):
                            continue
                        t = g.watch[i].crossed(rs._swift_fast, g.cfg, p.threshold)
                        if t is not None:
                            p.stopped[i], p.crossings[i] = THRESHOLD, t
                            stop.append(rs)
                if not p.due():
                    break
                if p.boundary == 0 and g.cfg.consensus is not None and not answers and not self._warned_no_answer:
                    self._warned_no_answer = True
                    logger.warning("swift-fast: DeepConf's consensus stop needs the engine's \"answer\" setting (the "
                                   "kind of answer to extract); without it no group stops on consensus")
                halted, released = p.advance(answers)
                for i in halted:
                    rs = g.members[i]()
                    if rs is not None:
                        stop.append(rs)
                for i in released:
                    req, rs = g.deferred.pop(i, None), g.members[i]()
                    if req is not None and rs is not None:
                        submit.append((rs, req))
        self.stopped += len(stop)
        return stop, submit

    def note_values(self, acc) -> None:
        """A candidate of a group received a token's values this step."""
        if acc.dc_swift is not None and acc.n:
            from ..definitions import GATE_EPS

            if len(acc.dc_swift) < acc.n:
                acc.dc_swift.append(acc.wsum / max(acc.gsum, GATE_EPS))
        self.touched.add(acc.dc)


__all__ = ["CONSENSUS", "FLAT", "RESOLVED", "THRESHOLD", "DeepConf", "DeepConfGroup", "config_of", "requested",
           "resolve"]
