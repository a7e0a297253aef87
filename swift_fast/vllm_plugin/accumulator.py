"""One request's sums in the front end (:class:`Accumulator`) and the fields its outputs get from them.

The front end (:mod:`.frontend`) keeps an accumulator on vLLM's ``RequestState`` as
``_swift_fast`` (so it is freed with it) and adds to it the values each step brings for the
request's one new token (:meth:`Accumulator.add`) and the value of a last-state pass
(:meth:`Accumulator.add_last`); a SAR pass's result lands in ``sar`` (:mod:`.passes`). Every
``CompletionOutput`` vLLM builds for the request then gets its fields from here
(:meth:`Accumulator.attach`, called from the output hooks, :mod:`.output_hooks`):
``swift_score``, ``swift_tokens`` (tokens scored), ``swift_pruned``, ``swift_weight_versions``,
the head-free values (below), a requested ``swift_trace`` on the final output, and with SAR
``sar`` and ``sar_context``.

Head-free values, with or without a head: ``mean_logprob`` (the mean log-prob of the generated
tokens under the model's own distribution) and DeepConf's ``confidence_lowest_group``,
``confidence_tail`` and ``confidence_bottom10`` over the engine's ``confidence_window``
(:func:`swift_fast.rewards.confidence.summary`). They are computed on a final output (and a
pruned or aborted one) from the token confidences kept here, 8 bytes a token; a streamed
output's earlier chunks carry None, so a long stream costs O(tokens), not O(tokens^2). Without
a head ``swift_score`` is None and ``swift_tokens`` 0.

A missing value is None, never a number: ``swift_score`` is None for a request that opted out
and whenever ``swift_tokens`` differs from the number of tokens in the output (a path that was
never scored: the first such request is logged with the reason); ``sar`` is None when its pass
could not run (no question-removed context, ``q0 + answer`` over ``max_model_len``, an engine
error) or its two passes scored different tokens. An ``emitted`` head's value of a token comes
with the next token (:mod:`.last_state`): a streamed or stopped (pruned, aborted) output's score
covers every token but the last, and a finished one's all of them, its last token's from a
last-state pass (None when that pass cannot run).

Weight versions: ``versions`` lists the labels of the steps that brought the candidate values,
first seen first (:mod:`.frontend` says where the labels come from and what two of them mean).
"""

from __future__ import annotations

from array import array

from ..definitions import GATE_EPS
from ..rewards.confidence import summary
from ..selection.by_value import HEAD_FREE
from .pruning import FINISH_REASON
from .transport import Values


class Accumulator:
    """Per-request sums (float64 on the host).

    ``frontend``: the :class:`.frontend.FrontEnd` of the request's engine (its settings, and its
    ``warn_once`` for an output with unscored tokens)."""

    __slots__ = ("scored", "sar_wanted", "last_wanted", "frontend", "context", "wsum", "gsum", "n", "sampled", "lp",
                 "lpn", "sar", "held", "pending", "released", "last_done", "last_missing", "request", "group",
                 "index", "at", "conf", "pruned", "trace", "versions", "confs", "dc", "dc_swift")

    def __init__(self, scored: bool, sar_wanted: bool, frontend, context: dict | None = None,
                 last_wanted: bool = False):
        self.scored = scored
        self.sar_wanted = sar_wanted
        #: an ``emitted`` head: the last token's states come from a last-state pass (.last_state)
        self.last_wanted = last_wanted
        self.frontend = frontend  # the FrontEnd of its engine (.frontend): its settings and warn_once
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
        self.confs = array("d")  # each generated token's confidence (the head-free values)
        self.dc = None  # deepconf.DeepConfGroup when the candidate's request runs DeepConf online
        self.dc_swift: list | None = None  # its running SWIFT score after each scored token (signal "swift")

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
        self.confs.append(v.conf)
        if self.conf is not None:
            self.conf.push(v.conf)
        if self.trace is not None:
            self.trace[2].append(v.conf)
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
        if not self.scored or not self.frontend.has_head:
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
        self._head_free(out, num_tokens, done=final or self.pruned)
        out.swift_pruned = self.pruned
        out.swift_weight_versions = list(self.versions) or None
        if self.trace is not None and final:  # on the final output only
            out.swift_trace = {"gate_reward": list(self.trace[0]), "gate": list(self.trace[1]),
                               "confidence": list(self.trace[2]), "logprob": list(self.trace[3])}
        if self.pruned and final:
            out.finish_reason, out.stop_reason = FINISH_REASON, None
        if self.frontend.cfg.sar:
            out.sar = self.sar
            ran = self.sar_wanted and self.context and not self.pruned  # a pruned candidate gets no pass
            out.sar_context = self.context["source"] if ran else None

    def _head_free(self, out, num_tokens: int, done: bool) -> None:
        """``mean_logprob`` and the three confidences on a final output whose every token brought its
        values (else None: a path that was never scored, as ``swift_score``)."""
        values = None
        if self.scored and done and self.sampled == num_tokens and num_tokens:
            values = summary(self.confs, self.frontend.cfg.confidence_window)
            values["mean_logprob"] = self.lp / self.lpn if self.lpn == num_tokens else None
        for name in HEAD_FREE:
            setattr(out, name, None if values is None else values[name])
        out.deepconf = self.dc.info(self.index) if self.dc is not None else None
