"""Engine-core side: carry each step's per-request values from the model runner to the front end.

The runner attaches a :class:`~swift_fast.vllm_plugin.runner.StepScores` to its
``ModelRunnerOutput`` (an attribute: the dataclass pickles it when a multiprocess executor ships
the output). The scheduler turns that output into one ``EngineCoreOutput`` per request; after it
has, the values of request ``r`` go into that request's ``EngineCoreOutput.ec_transfer_params``
under :data:`TRANSPORT` -- the one free-form, per-request field that crosses every engine-core
client (in-process objects and msgpack over ZMQ alike). vLLM sets ``ec_transfer_params`` only
for encoder-cache connectors; the front end pops the plugin's key before vLLM reads the field,
so users and connectors never see it.

A value is attached only to an output that carries new tokens: a token the scheduler dropped
(stale output, request already finished) never reaches the front end, and neither does its score.
"""

from __future__ import annotations

import types

TRANSPORT = "swift_fast"


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


def pop(eco):
    """The plugin's values carried by one ``EngineCoreOutput`` (None when absent), removed from it."""
    params = eco.ec_transfer_params
    if not params or TRANSPORT not in params:
        return None
    v = params.pop(TRANSPORT)
    if not params:
        eco.ec_transfer_params = None
    return v


def install_on_scheduler(scheduler) -> None:
    orig = scheduler.update_from_output

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = orig(scheduler_output, model_runner_output)
        attach(outputs, model_runner_output)
        return outputs

    scheduler.update_from_output = types.MethodType(update_from_output, scheduler)
