"""Pruning a request's candidates while vLLM generates them (the policy: :mod:`swift_fast.selection.pruning`).

Settings. ``additional_config["swift_fast"]["prune"]`` is the engine default (applied to every
scored request with ``n > 1``; ``n = 1`` requests are left alone); a request sets its own with
``SamplingParams(extra_args={"swift_fast": {"prune": {...} | True | False}})``, or with flat keys
(``vllm_xargs`` cannot carry an object): ``swift_fast_prune`` (true/false) and
``swift_fast_prune_<setting>``; the server also takes a ``"prune"`` body field beside
``best_of_n``. Settings a request leaves out come from the engine default, else from
:class:`~swift_fast.selection.pruning.PruneConfig`'s defaults. They are checked in ``process_inputs``
(wrapped on the engine's ``InputProcessor``), so a bad setting is an error before anything is
queued (a 400 on the server), and pruning asked of a request with ``n = 1`` is refused there. The
resolved settings ride in the request's own (cloned) ``extra_args`` under :data:`RESOLVED`, so the
workers see them too: a worker computes DeepConf's token confidence only for the requests whose
signal needs it.

Groups. vLLM fans a request with ``n > 1`` out into child requests that share one
``ParentRequest``; the group is kept on it (freed with it) and knows its members by index (weak
references). A server ``best_of_n`` request is such a request. Each step, after vLLM's
``OutputProcessor`` has appended the step's tokens (so stop strings and finished candidates are
already known), every group that received values is checked: when all of its running, started
members have reached the next decision's token count ``t``, :func:`swift_fast.selection.pruning.to_prune`
ranks them by their signal *at exactly* ``t`` tokens (kept when each crossed ``t``: the same
float64 sums that become ``swift_score``, or :class:`~swift_fast.rewards.confidence.RunningConfidence`),
so a candidate that ran ahead of a sibling started or preempted later is compared on equal
terms, and the decisions are those :func:`swift_fast.selection.pruning.replay` takes on the same tokens.

Stopping a candidate. It is finished in the front end exactly as vLLM finishes a request on a
stop string: its final ``CompletionOutput`` is made now (the tokens so far, the partial
``swift_score``, ``swift_pruned = True``, ``finish_reason = "pruned"``; a stream ends with that
chunk), its state is freed, and its id joins the step's ``reqs_to_abort``, which vLLM sends to
the engine core after the step: with an in-process engine core the scheduler frees its KV blocks
before it schedules the next step; a separate engine-core process (the default of ``LLM`` and of
the server) keeps stepping while the front end works, so the candidate may run one or two more
steps before the abort lands. A pruned candidate never gets a SAR pass (its ``sar`` is None). Tokens the core generated
for it before the abort landed are dropped, as for any finished request.
"""

from __future__ import annotations

import logging
import math
import weakref
from typing import Any

from ..definitions import GATE_EPS
from ..rewards.confidence import RunningConfidence
from ..selection.pruning import FIELDS, PruneConfig, PruneConfigError, threshold, to_prune
from . import deepconf
from .config import SCORE, is_internal_pass, request_kind, request_setting

logger = logging.getLogger("swift_fast.vllm_plugin")

#: key of a request's resolved settings (a dict of :class:`PruneConfig` fields) in its extra_args
RESOLVED = "_swift_fast_prune"
#: flat request keys: ``swift_fast_prune`` (on/off) and ``swift_fast_prune_<setting>``
FLAT = "swift_fast_prune"
FINISH_REASON = "pruned"

def requested(extra: dict | None) -> tuple[bool, Any, str]:
    """``(given, setting, where)`` of a request's pruning (:func:`.config.request_setting`)."""
    return request_setting(extra, "prune", FIELDS, PruneConfigError, "pruning")


def resolve(params, default: PruneConfig | None) -> PruneConfig | None:
    """The settings a request (``SamplingParams``) is pruned with, or None. Raises
    ``PruneConfigError`` naming the field for a bad setting, and for pruning asked of ``n = 1``."""
    given, setting, where = requested(getattr(params, "extra_args", None))
    n = getattr(params, "n", 1) or 1
    scored = request_kind(params)[0] == SCORE
    if not given:
        return default if n > 1 and scored else None
    cfg = PruneConfig.parse(setting, where=where, base=default)
    if cfg is not None and n < 2:
        raise PruneConfigError(
            "prune stops the weakest of a request's candidates, and this request has one (n = 1): ask for "
            'n > 1 (server: "best_of_n": N), or leave prune out'
        )
    if cfg is not None and not scored:
        raise PruneConfigError("prune ranks a request's candidates by their scores, and this request opted out of "
                               "scoring: drop one of the two")
    return cfg


def config_of(params) -> PruneConfig | None:
    """The resolved settings a request carries (None: not pruned)."""
    d = (getattr(params, "extra_args", None) or {}).get(RESOLVED)
    return PruneConfig(**d) if isinstance(d, dict) else None


class Group:
    """The candidates of one parent request. ``members[index]`` is a weak reference to the
    candidate's vLLM ``RequestState`` (whose accumulator refers to this group: a strong reference
    back would keep every finished group alive until Python's cycle collector ran); ``pruned`` the
    indices stopped so far."""

    __slots__ = ("cfg", "size", "members", "pruned", "decisions")

    def __init__(self, cfg: PruneConfig, size: int):
        self.cfg = cfg
        self.size = size
        self.members: dict[int, weakref.ref] = {}
        self.pruned: set[int] = set()
        self.decisions = 0

    def record(self, acc, swift: bool) -> None:
        """After candidate ``acc`` received a token's values (``swift``: including a SWIFT value):
        keep each of its signals whose count is a decision threshold, so that every candidate is
        ranked on its values at exactly that many tokens, even when it ran ahead of a sibling that
        started or was preempted later. The counts differ for an ``emitted`` head, whose SWIFT value
        of a token arrives with the next token (:mod:`.last_state`): each signal is kept at its own."""
        cfg = self.cfg
        if swift and cfg.signal != "confidence":
            self._keep(acc, "swift", acc.n)
        if cfg.signal != "swift":
            self._keep(acc, "confidence", acc.sampled)

    def _keep(self, acc, name: str, n: int) -> None:
        cfg = self.cfg
        if n >= cfg.warmup and (n == cfg.warmup if cfg.every == 0 else (n - cfg.warmup) % cfg.every == 0):
            if n >= (threshold(cfg, self.decisions) or n + 1):  # thresholds already decided are not needed
                value = acc.wsum / max(acc.gsum, GATE_EPS) if name == "swift" else acc.conf.value()
                acc.at.setdefault(n, {})[name] = value


class Pruner:
    """Installed with the front end (:class:`~.frontend.FrontEnd`) of one engine. Its check of a
    request's inputs also resolves the request's DeepConf settings (:mod:`.deepconf`): the two
    ways of stopping candidates exclude each other, so they are resolved together."""

    def __init__(self, input_processor, default: PruneConfig | None, deepconf_default=None, has_head: bool = True):
        self.default = default
        self.deepconf_default = deepconf_default
        self.has_head = has_head
        self.pruned = 0  # candidates pruned so far (diagnostics)
        self._wrap_input_processor(input_processor)

    def _wrap_input_processor(self, ip) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.utils.async_utils import make_async

        orig = ip.process_inputs
        pruner = self

        def process_inputs(request_id, prompt, params, *args, **kwargs):
            cfg = dc = None
            if isinstance(params, SamplingParams) and not is_internal_pass(params.extra_args):
                cfg, dc = pruner.resolve_both(params)  # raises before anything is queued
            req = orig(request_id, prompt, params, *args, **kwargs)
            sp = getattr(req, "sampling_params", None)
            if sp is not None and sp is not params:  # vLLM's clone: this request's own
                # only the plugin sets the resolved keys
                own = {k: v for k, v in (sp.extra_args or {}).items() if k not in (RESOLVED, deepconf.RESOLVED)}
                if cfg is not None:
                    own[RESOLVED] = cfg.to_dict()
                if dc is not None:
                    own[deepconf.RESOLVED] = dc.to_dict()
                sp.extra_args = own or None
            return req

        ip.process_inputs = process_inputs
        ip.process_inputs_async = make_async(process_inputs, executor=ip.renderer._executor)

    def resolve_both(self, params) -> tuple[PruneConfig | None, Any]:
        """A request's pruning and DeepConf settings: the one it names wins over the engine's default
        of the other; naming both is an error."""
        extra = getattr(params, "extra_args", None)
        prune_given = requested(extra)[0]
        dc_given = deepconf.requested(extra)[0]
        cfg = resolve(params, self.default)
        if cfg is not None and prune_given and not self.has_head:
            from ..selection.by_value import Available, SelectorError, check_prune

            try:  # a SWIFT signal without a head would never decide: refused, not ignored
                check_prune(cfg, Available(head=False, sar=False, answers=False), where=requested(extra)[2])
            except SelectorError as e:
                raise PruneConfigError(str(e)) from None
        pruned = cfg is not None and (prune_given or not dc_given)
        dc = deepconf.resolve(params, self.deepconf_default, self.has_head, pruned)
        if dc is not None and not prune_given:
            cfg = None
        return cfg, dc

    # -- groups ------------------------------------------------------------------------------
    @staticmethod
    def join(acc, rs, parent_req, index: int, params) -> None:
        """Make candidate ``rs`` (accumulator ``acc``) a member of its parent's group."""
        if parent_req is None or not acc.scored:
            return
        cfg = config_of(params)
        if cfg is None:
            return
        group = getattr(parent_req, "_swift_fast_group", None)
        if group is None:
            group = parent_req._swift_fast_group = Group(cfg, parent_req.n)
        group.members[index] = weakref.ref(rs)
        acc.group, acc.index, acc.at = group, index, {}
        if cfg.signal in ("confidence", "combined"):
            acc.conf = RunningConfidence(cfg.window)

    def decide(self, groups, is_running) -> list:
        """The candidates to prune now, over ``groups`` (those that received values this step);
        ``is_running(rs)``: neither finished, held for SAR, aborted nor pruned."""
        out = []
        for g in groups:
            if len(g.members) < g.size:
                continue  # children are registered one by one: decide on the whole group
            while True:
                t = threshold(g.cfg, g.decisions)
                live = [r() for r in g.members.values()]
                running = [rs for rs in live if rs is not None and is_running(rs)]
                # members the scheduler has not started (no KV room yet) are not ranked: they
                # must not block the decision that would free room for them
                started = [rs for rs in running if rs._swift_fast.sampled > 0]
                if t is None or not started or min(count(rs._swift_fast, g.cfg) for rs in started) < t:
                    break
                others = len(g.members) - len(g.pruned) - len(started)
                values = [signal_at(rs._swift_fast, g.cfg, t) for rs in started]
                for j in to_prune(values, g.cfg, others):
                    acc = started[j]._swift_fast
                    acc.pruned = True
                    g.pruned.add(acc.index)
                    out.append(started[j])
                for rs in running:
                    rs._swift_fast.at.pop(t, None)
                g.decisions += 1
        self.pruned += len(out)
        return out


def count(acc, cfg: PruneConfig) -> int:
    """Tokens a candidate's signal covers: its scored tokens (SWIFT), its sampled tokens
    (confidence), the fewer of the two (combined)."""
    if cfg.signal == "swift":
        return acc.n
    if cfg.signal == "confidence":
        return acc.sampled
    return min(acc.n, acc.sampled)


def signal_at(acc, cfg: PruneConfig, t: int):
    """A candidate's signal at ``t`` tokens, as recorded (higher is better; NaN when it has none;
    ``combined``: the ``(swift, confidence)`` pair)."""
    at = acc.at.get(t, {})
    if cfg.signal == "combined":
        return at.get("swift", math.nan), at.get("confidence", math.nan)
    return at.get(cfg.signal, math.nan)


__all__ = ["FINISH_REASON", "FLAT", "RESOLVED", "Group", "Pruner", "config_of", "requested", "resolve"]
