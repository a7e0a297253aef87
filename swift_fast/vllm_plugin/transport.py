"""Engine-core side: carry each step's per-request values from the model runner to the front end.

What travels (:class:`Values`, one record per request and step, named once here and read by
name on both sides): the contribution of the one token the request sampled this step,
``(g * r, g, 1)`` (zeros without a head), ``(log p(token), 1)`` and the token's DeepConf
confidence (:mod:`swift_fast.rewards.confidence`); for a SAR question-removed pass, on the
step that completes its prefill, the sum and count of the answer's log-probs over all its
chunks. The runner fills a float32 ``[rows, NCOLS]`` tensor whose column ``COL.<name>`` holds
field ``<name>``.

The runner attaches a :class:`StepScores` to its ``ModelRunnerOutput`` (an attribute: the
dataclass pickles it when a multiprocess executor ships the output). The scheduler turns that
output into one ``EngineCoreOutput`` per request; after it has, the values of request ``r`` go
into that request's ``EngineCoreOutput.ec_transfer_params`` under :data:`TRANSPORT` -- the one
free-form, per-request field that crosses every engine-core client (in-process objects and
msgpack over ZMQ alike). vLLM sets ``ec_transfer_params`` only for encoder-cache connectors;
the front end pops the plugin's key before vLLM reads the field, so users and connectors never
see it.

A value is attached only to an output that carries new tokens: a token the scheduler dropped
(stale output, request already finished) never reaches the front end, and neither does its score.
"""

from __future__ import annotations

import types
from typing import NamedTuple

TRANSPORT = "swift_fast"


class Values(NamedTuple):
    """One request's values of one step (floats; counts are whole numbers)."""

    weighted: float  # sum of g * r over the tokens scored
    gate: float  # sum of g
    tokens: float  # tokens scored
    logp: float  # the sampled token's log-prob, or the sum over a question-removed pass's answer (SAR)
    logp_tokens: float  # how many log-probs ``logp`` sums
    conf: float = 0.0  # the token's DeepConf confidence


NCOLS = len(Values._fields)
#: Column of each field in the runner's ``[rows, NCOLS]`` step tensor: ``values[:, COL.logp]``.
COL = Values(*range(NCOLS))


class StepScores:
    """The values of one step, attached to ``ModelRunnerOutput.swift_fast``.

    ``values`` is float32 ``[n, NCOLS]`` (row i for ``req_ids[i]``) on the model's device; the
    rows in ``report`` are sent. On a GPU the copy to the host is asynchronous and
    :meth:`as_dict` waits for it (the scheduler reads it after the step's sampled tokens, which
    took the same path).
    """

    def __init__(self, req_ids: list[str], values, report: list[int]):
        import torch

        self.req_ids = req_ids
        self.report = report
        self._event = None
        if values.device.type == "cuda":
            self._values = values.to("cpu", non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._values = values
        self._dict = None

    def as_dict(self) -> dict[str, list[float]]:
        if self._dict is None:
            if self._event is not None:
                self._event.synchronize()
                self._event = None
            rows = self._values.tolist()
            self._dict = {self.req_ids[i]: rows[i] for i in self.report}
            self._values = None
        return self._dict

    def __getstate__(self):  # a multiprocess executor pickles the runner output
        return {"req_ids": None, "report": None, "_dict": self.as_dict(), "_values": None, "_event": None}


def attach(outputs_by_client: dict, model_runner_output) -> None:
    scores = getattr(model_runner_output, "swift_fast", None)
    if scores is None:
        return
    values = scores.as_dict()
    if not values:
        return
    for eco_batch in outputs_by_client.values():
        for eco in eco_batch.outputs:
            v = values.get(eco.request_id)
            if v is None or not eco.new_token_ids:
                continue
            params = eco.ec_transfer_params
            if params is None:
                eco.ec_transfer_params = {TRANSPORT: v}
            else:
                eco.ec_transfer_params = {**params, TRANSPORT: v}


def pop(eco) -> Values | None:
    """The plugin's values carried by one ``EngineCoreOutput`` (None when absent), removed from it."""
    params = eco.ec_transfer_params
    if not params or TRANSPORT not in params:
        return None
    v = params.pop(TRANSPORT)
    if not params:
        eco.ec_transfer_params = None
    return Values(*v)


def install_on_scheduler(scheduler) -> None:
    orig = scheduler.update_from_output

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = orig(scheduler_output, model_runner_output)
        attach(outputs, model_runner_output)
        return outputs

    scheduler.update_from_output = types.MethodType(update_from_output, scheduler)
