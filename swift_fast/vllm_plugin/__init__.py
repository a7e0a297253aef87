"""vLLM general plugin: SWIFT (and SAR) rewards computed while vLLM generates, and the values that
need no head (the mean log-prob and DeepConf's confidences), with DeepConf's online early stopping.

Activation
----------
Installing swift-fast registers :func:`register` under the entry-point group
``vllm.general_plugins``; vLLM calls it in every process it starts (front end, engine core,
workers), before any configuration exists. ``register`` only wraps a few constructors
(``EngineArgs.create_engine_config``, ``LLMEngine``/``AsyncLLM``, the scheduler, the model
runner's ``load_model``; the OpenAI serving handlers once a configured engine exists). Each
wrapper looks for ``additional_config["swift_fast"]`` (see :mod:`.config`) and, when it is
absent, returns what vLLM built untouched: without the config the plugin changes no object and
costs nothing per step. ``VLLM_PLUGINS=swift_fast`` restricts vLLM to this plugin.

With or without a head. ``{"swift_fast": {}}`` (no ``head``) runs every step below but the
forward's: nothing is hooked into the model, and each sampled token brings its log-prob and
DeepConf confidence only; ``swift_score`` is then None, and the head's start-up checks and
limits (prefill context parallelism, torchrun pipeline stages) do not apply.

Data path (vLLM 0.32-0.33, whichever model runner vLLM selects)
----------------------------------------------------------------
1. Start-up (front end, ``create_engine_config``): the head is loaded and checked against the
   model (``SwiftHead.check_model``: an error names head and model), speculative decoding,
   micro-batching and torchrun's pipeline stages are refused (:func:`.config.check_engine`), every
   vLLM symbol the plugin relies on is checked (:mod:`.surface`: the table in
   :mod:`.surface.table`, checked by :mod:`.surface.runtime`), and the head file's
   digest is written into the config, so vLLM's compile cache (keyed on ``additional_config``)
   never reuses a graph built for another head. The plugin runs on the model runner vLLM
   selects -- Model Runner V2 (the GPU default) or the V1 runner -- and never changes that choice
   (``VLLM_USE_V2_MODEL_RUNNER`` is the user's).
2. Forward (:mod:`.model_hooks`): the decoder modules producing the head's states get a
   subclass whose ``forward`` calls ``torch.ops.swift_fast.project_layer_`` on the state the
   moment it exists, adding ``h @ W_l^T`` into a float32 accumulator ``acc[max_batched_tokens, 2]``.
   ``acc`` and the weights are buffers registered on those modules, so ``torch.compile`` (vLLM's
   default) carries the mutation, and CUDA graphs replay into the same addresses. Nothing else
   is kept: extra memory is O(max batched tokens) + O(max sequences). Under pipeline parallelism
   each stage projects the states of its own layers and its partial sums travel to the next
   stage with the hidden states (:mod:`.pipeline`); the last stage holds every token's sum.
3. Step (:mod:`.runner`, one core; the model-runner adapters :mod:`.runner_v1` and
   :mod:`.runner_v2` tell it, through each runner's own seams, which rows sample for which
   request, the logits before the sampler, the sampled tokens and where the output is;
   :mod:`.runner_adapters` picks the adapter when the runner has loaded its model): rows that
   sample a kept token get a slot, ``finish_`` gates and sums their projection, and the step's
   per-request values (one token's ``g r``, ``g``, the sampled token's log-prob under the
   model's unprocessed distribution, :mod:`.sar_worker`, and its DeepConf confidence) ride on the
   ``ModelRunnerOutput``. The worker holds no score state across steps, and the
   step never waits for the device (index uploads through :mod:`.staging`).
4. Engine core (:mod:`.transport`, which also names the values' fields; :mod:`.scheduling`
   puts the front end's passes at the head of the waiting queue): after
   ``Scheduler.update_from_output`` built the per-request ``EngineCoreOutput``s, the values go
   into ``ec_transfer_params["swift_fast"]`` of the output that carries the token: the same
   object in-process, msgpack over ZMQ in multiprocess mode.
5. Front end (:mod:`.frontend`, wraps the engine's ``OutputProcessor``): the values are popped
   (users never see the key) and summed per request exactly for the tokens appended to the
   output (:mod:`.accumulator`); ``CompletionOutput`` gets ``swift_score``, ``swift_tokens``,
   ``sar``, ``mean_logprob`` and DeepConf's three confidences (:mod:`.output_hooks`). SAR holds a
   finished candidate back, runs its question-removed pass through the engine (and, for an
   ``emitted`` head, its last-state pass, :mod:`.last_state`), then releases it
   (:mod:`.passes`); each request's question-removed context comes from :mod:`.contexts` (its
   own chat rendered with the question emptied, an explicit context, or the BOS default).
6. Pruning (:mod:`.pruning`, policy in :mod:`swift_fast.selection.pruning`): with a ``prune`` setting
   (engine default or per request), the candidates of a request with ``n > 1`` are ranked by
   their running SWIFT score (or DeepConf's confidence, or both) as they are generated, and the
   weakest are stopped: finished in the front end as a stop string finishes a request, with
   ``swift_pruned = True``, and aborted in the engine core with the step's aborts, which frees
   their KV blocks (before the next step in-process; a step or two later from a separate
   engine-core process). DeepConf online (:mod:`.deepconf`) stops candidates the same way, against
   a threshold the request's warmup candidates set, holds later waves back in the front end (its
   engine client's ``add_request``, wrapped on that engine), and
   stops a request whose finished candidates agree.
7. Server (:mod:`.serving`): OpenAI completion and chat responses carry each choice's scores;
   ``"best_of_n": N`` returns the best of N candidates (never a pruned one while another exists);
   the endpoints without scores (``/v1/responses``, the chat batch, Anthropic's ``/v1/messages``)
   refuse the plugin's fields.
8. Logs (:mod:`.logs`): the plugin's lines go through vLLM's handler in every process.

Per-request results therefore need no side channel, RPC or shared memory: they travel with the
tokens, in both engine-core modes, and a token's value reaches the user only if the token does.
:mod:`.diagnostics` reports what the plugin holds in each worker (``collective_rpc``).

Exactness
---------
``predicting`` alignment is always exact: token r_j is scored with the states of the position
that sampled it, which every forward computes (prefix caching never skips the last prompt
token; chunked prefill samples only on the last chunk; a preempted request is recomputed and
samples its next token from a fresh state; each token's value is counted once, when the token
is appended). ``emitted`` alignment (the paper's) is exact too: each step's sampling state is
that of the previous token as an input, and the states of the last token, which generation
never feeds back, come from a last-state pass that recomputes at most one KV block per finished
candidate (:mod:`.last_state`; where no exact last state exists the score is None).

Limits: no speculative decoding, no dual-batch overlap / micro-batching, no pipeline stages
under the torchrun (``external_launcher``) backend, and on Model Runner V2 no batch-sharded
sampling and no prefill context parallelism (all refused at start-up, naming the feature);
beam search runs unscored; models laid out as ``model.model.layers`` + ``model.model.norm``
(Llama, Qwen2/3, Mistral and kin). Tested with vLLM 0.32 on both runners, and read against
0.33 (:data:`.surface.TESTED_VLLM`; another version starts with a warning, and one whose symbols moved
does not start, :mod:`.surface`).
"""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger("swift_fast.vllm_plugin")

_REGISTERED = False


def register() -> None:
    """Called by vLLM in every process; does nothing unless ``additional_config["swift_fast"]`` is set."""
    global _REGISTERED
    if _REGISTERED:
        return
    _REGISTERED = True
    from . import logs

    logs.configure()
    _wrap_engine_args()
    _wrap_engines()
    _wrap_scheduler()
    _wrap_runners()


def _configured(vllm_config):
    from .config import plugin_config

    return plugin_config(vllm_config)


# -- front end: start-up checks ---------------------------------------------------------------
def prepare_config(vllm_config) -> None:
    """Validate the configuration (and a configured head against the model, pinning its digest
    into the config)."""
    from ..support.files import sha256_of
    from .config import KEY, check_engine, plugin_config

    cfg = plugin_config(vllm_config)
    if cfg is None:
        return
    from .surface import check_surface, installed_version, select

    check_surface()  # the front end's and the engine core's vLLM symbols, before any process starts
    head = cfg.load_head()
    check_engine(vllm_config, head)
    warn_untested_vllm()
    section = vllm_config.additional_config[KEY]
    if isinstance(section, str):
        section = {"head": section}
    section = {} if section is True else dict(section)
    if head is not None:
        warn_costly_last_state(vllm_config, head)
        section["head"] = cfg.head_path
        section["_head_sha256"] = sha256_of(cfg.head_path)
    vllm_config.additional_config[KEY] = section
    logger.info("swift-fast %s: %s on %s, vLLM %s's %s model runner; SAR %s, pruning %s; "
                "%d vLLM symbols of the front end and engine core checked", _version(),
                f"head {cfg.head_path} ({head.extra_repr()})" if head is not None else "no head (head-free values)",
                vllm_config.model_config.model, installed_version(),
                "V2" if vllm_config.use_v2_model_runner else "V1", "on" if cfg.sar else "off",
                "on by default" if cfg.prune is not None else "per request", len(select()))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("swift-fast")
    except PackageNotFoundError:
        return "(not installed)"


def warn_costly_last_state(vllm_config, head) -> None:
    from ..rewards.head import ALIGNMENT

    if ALIGNMENT[head.alignment].extra_forward and not vllm_config.cache_config.enable_prefix_caching:
        logger.warning(
            "swift-fast: the head uses the '%s' alignment: the states of each finished candidate's last token "
            "cost one more forward, and with prefix caching off that "
            "forward recomputes the whole candidate (prompt + answer) instead of at most one KV block. Enable "
            "prefix caching (vLLM's default) to keep it cheap", head.alignment,
        )


def warn_untested_vllm() -> None:
    """A vLLM outside the tested range whose symbols all check out (:mod:`.surface`) still runs,
    with this warning."""
    from .surface import installed_version, is_tested, tested_range

    version = installed_version()
    if not is_tested(version):
        logger.warning(
            "swift-fast is tested with vLLM %s and this is vLLM %s: every vLLM symbol the plugin uses was found "
            "as expected (swift_fast.vllm_plugin.surface), but their behaviour may have changed; check the scores "
            "(e.g. tests/test_vllm_plugin.py) before relying on them", tested_range(), version,
        )


def _wrap_engine_args() -> None:
    from vllm.engine.arg_utils import EngineArgs

    orig = EngineArgs.create_engine_config
    if getattr(orig, "_swift_fast", False):
        return

    @functools.wraps(orig)
    def create_engine_config(self, *args, **kwargs):
        vllm_config = orig(self, *args, **kwargs)
        prepare_config(vllm_config)
        return vllm_config

    create_engine_config._swift_fast = True
    EngineArgs.create_engine_config = create_engine_config


# -- front end: engines -----------------------------------------------------------------------
def _wrap_engines() -> None:
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.llm_engine import LLMEngine

    for cls, is_async in ((LLMEngine, False), (AsyncLLM, True)):
        orig = cls.__init__
        if getattr(orig, "_swift_fast", False):
            continue

        def make(orig, is_async):
            @functools.wraps(orig)
            def __init__(self, vllm_config, *args, **kwargs):
                orig(self, vllm_config, *args, **kwargs)
                cfg = _configured(vllm_config)
                if cfg is not None:
                    from .frontend import FrontEnd

                    self._swift_fast_frontend = FrontEnd(self, cfg, is_async)
                    if is_async:
                        from .serving import install_serving

                        install_serving()

            __init__._swift_fast = True
            return __init__

        cls.__init__ = make(orig, is_async)


# -- engine core: scheduler -------------------------------------------------------------------
def _wrap_scheduler() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    orig = Scheduler.__init__
    if getattr(orig, "_swift_fast", False):
        return

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        if _configured(self.vllm_config) is not None and "update_from_output" not in vars(self):
            from . import scheduling, transport

            transport.install_on_scheduler(self)
            scheduling.install_on_scheduler(self)
            logger.info("swift-fast: %s carries each step's values to the front end, the front end's passes "
                        "first in its waiting queue", type(self).__name__)

    __init__._swift_fast = True
    Scheduler.__init__ = __init__


# -- workers: model runner --------------------------------------------------------------------
#: (module, class) of every model runner whose ``load_model`` installs the plugin: V1 (GPU, CPU)
#: and Model Runner V2 (its CPU runner inherits ``load_model`` from the GPU one)
_RUNNERS = (
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
    ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"),
)


def _wrap_runners() -> None:
    """Wrap the runners' ``load_model`` now if their modules are loaded (a worker process that
    loads plugins from its worker's constructor), else at the first worker's construction, so
    a front-end process never imports the runner modules."""
    import sys

    if any(m in sys.modules for m, _ in _RUNNERS):
        _wrap_runner_classes(v2=True)
        return
    from vllm.v1.worker.worker_base import WorkerBase

    orig = WorkerBase.__init__
    if getattr(orig, "_swift_fast", False):
        return

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        _wrap_runner_classes(v2=_configured(vllm_config) is not None and vllm_config.use_v2_model_runner)
        orig(self, *args, **kwargs)

    __init__._swift_fast = True
    WorkerBase.__init__ = __init__


def _wrap_runner_classes(v2: bool) -> None:
    """``v2``: import Model Runner V2's module too (only a worker that runs it needs it; one already
    imported is wrapped either way)."""
    import importlib
    import sys

    for name, cls_name in _RUNNERS:
        if name.startswith("vllm.v1.worker.gpu.") and not v2 and name not in sys.modules:
            continue
        try:
            cls = getattr(importlib.import_module(name), cls_name)
        except (ImportError, AttributeError):
            continue
        orig = cls.__dict__.get("load_model")
        if orig is None or getattr(orig, "_swift_fast", False):
            continue

        def make(orig):
            @functools.wraps(orig)
            def load_model(self, *args, **kwargs):
                out = orig(self, *args, **kwargs)
                cfg = _configured(self.vllm_config)
                if cfg is not None and getattr(self, "_swift_fast", None) is None:
                    from .runner_adapters import install_on_runner, runner_kind
                    from .surface import check_surface

                    check_surface(runner_kind(self))  # this worker's runner's symbols, before any is hooked

                    self._swift_fast = install_on_runner(self, cfg)
                return out

            load_model._swift_fast = True
            return load_model

        cls.load_model = make(orig)
