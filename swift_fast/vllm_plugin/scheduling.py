"""Engine core: the front end's passes go to the head of the scheduler's waiting queue.

A pass (SAR's question-removed pass, an ``emitted`` head's last-state pass, :mod:`.last_state`)
belongs to a candidate that has already finished: the candidate's output is held until its passes
are back, so every step a pass waits adds to that request's latency; and a last-state pass reads
the candidate's KV blocks from the prefix cache, which vLLM keeps after the candidate finished
only until it needs the memory. vLLM's first-come-first-served queue would put the pass behind
every request that arrived before it, and in a batch that fills the KV cache their prefills evict
those blocks: the pass would then recompute the whole sequence (exact, but a second prefill). So
right after vLLM's ``Scheduler.add_request`` has queued a pass, it is moved to the front of the
waiting queue; under the ``priority`` policy the front end gives the pass its candidate's
priority and arrival time instead, which order it before everything that arrived later.

NOTE: vLLM schedules running requests before waiting ones, and a running request's decode step
that needs a new block takes the least recently freed one; when the KV cache is full that can be
one of the finished candidate's blocks, so under pressure a last-state pass may still recompute
more than one block (``FrontEnd.last_state_tokens`` counts what the passes computed).
"""

from __future__ import annotations

import types

from .config import is_internal_pass


def install_on_scheduler(scheduler) -> None:
    from vllm.v1.core.sched.request_queue import SchedulingPolicy

    if getattr(scheduler, "policy", None) != SchedulingPolicy.FCFS:
        return  # priority: ordered by the (priority, arrival time) the front end gave each pass
    orig = scheduler.add_request

    def add_request(self, request):
        orig(request)
        params = request.sampling_params
        if params is not None and is_internal_pass(params.extra_args):
            try:
                self.waiting.remove_request(request)
            except ValueError:
                return  # not in the plain waiting queue (held for a KV transfer, or a streaming update)
            self.waiting.prepend_request(request)

    scheduler.add_request = types.MethodType(add_request, scheduler)
