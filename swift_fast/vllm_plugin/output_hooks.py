"""The front end's hooks on vLLM's output classes, installed once per process: where a finished
candidate's output is held back and where every ``CompletionOutput`` gets its scores.

vLLM builds a request's outputs in ``RequestState`` (one per request, in the front end's
``OutputProcessor``). Wrapped on the class, for the requests that carry an accumulator
(:mod:`.accumulator`; a request of an engine without the plugin has none and passes
straight through):

- ``make_request_output``: a scored candidate's final output, when SAR is on or the head is
  ``emitted``, is not built but handed to its front end (``FrontEnd.hold``, :mod:`.passes`) with
  the arguments it was called with; the front end builds it once the candidate's passes are back.
  An abort or an engine error is never held;
- ``_new_completion_output``: every ``CompletionOutput`` gets the accumulator's fields
  (``Accumulator.attach``), counted against the tokens appended so far.

``RequestOutput.add`` merges a streamed request's deltas into the first ``CompletionOutput``
object (``aggregate``): it is given the newest delta's scores. vLLM's beam search (offline and
online) runs with :data:`IN_BEAM_SEARCH` set, which the front end reads when a request is added:
beam search runs unscored.
"""

from __future__ import annotations

import contextvars
import functools

#: True while vLLM's beam search runs: its one-token step requests are not candidates, so they
#: are left unscored and never get a SAR pass (which would double every beam step).
IN_BEAM_SEARCH = contextvars.ContextVar("swift_fast_in_beam_search", default=False)
#: what ``Accumulator.attach`` gives a ``CompletionOutput``: copied when streamed deltas merge
_FIELDS = ("swift_score", "swift_tokens", "swift_pruned", "swift_trace", "sar", "sar_context",
           "swift_weight_versions", "mean_logprob", "confidence_lowest_group", "confidence_tail",
           "confidence_bottom10", "deepconf")

_PATCHED = False


def install_output_hooks() -> None:
    """Wrap two ``RequestState`` methods and ``RequestOutput.add``, once per process and only once
    a configured engine exists; requests of other engines (no ``_swift_fast`` accumulator) pass
    straight through."""
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
        if acc is not None and acc.dc is not None and finish_reason is not None and acc.held is None:
            # DeepConf online: a candidate that finished by itself reports to its group now, before a
            # hold for SAR delays its output (an engine error reports it too, with no signal); one
            # whose last token crossed the threshold is stopped there, and gets no pass
            if finish_reason != FinishReason.ABORT:
                acc.frontend.deepconf.finished(self, acc, finish_reason)
        if (
            acc is not None
            and not acc.pruned
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
    """Run vLLM's offline and online beam search with :data:`IN_BEAM_SEARCH` set (the online one
    submits its step requests from tasks it creates, which copy the context)."""
    from vllm.entrypoints.generate.beam_search.offline import BeamSearchOfflineMixin
    from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin

    orig_offline = BeamSearchOfflineMixin.beam_search
    orig_online = BeamSearchOnlineMixin.beam_search

    @functools.wraps(orig_offline)
    def beam_search(self, *args, **kwargs):
        token = IN_BEAM_SEARCH.set(True)
        try:
            return orig_offline(self, *args, **kwargs)
        finally:
            IN_BEAM_SEARCH.reset(token)

    @functools.wraps(orig_online)
    async def beam_search_online(self, *args, **kwargs):
        token = IN_BEAM_SEARCH.set(True)
        try:
            async for out in orig_online(self, *args, **kwargs):
                yield out
        finally:
            # a generator closed from another context (garbage collection) cannot reset its token
            try:
                IN_BEAM_SEARCH.reset(token)
            except ValueError:
                pass

    BeamSearchOfflineMixin.beam_search = beam_search
    BeamSearchOnlineMixin.beam_search = beam_search_online

