"""Worker side entry: which model runner vLLM built, and the scoring core (:mod:`.runner`) installed
on it through that runner's adapter (:mod:`.runner_v1`, :mod:`.runner_v2`).

Called from the runners' ``load_model`` wrapper (:mod:`swift_fast.vllm_plugin`), once the model
exists: the head is checked against the engine, the core is built, the adapter wraps its runner's
seams, and ``profile_run`` -- the same seam on both runners -- is wrapped here.
"""

from __future__ import annotations

import logging
import types

from .config import PluginConfig, check_engine, check_same_head
from .runner import StepScoring
from .runner_v1 import V1Adapter
from .runner_v2 import V2Adapter

logger = logging.getLogger("swift_fast.vllm_plugin")


def runner_kind(runner) -> str:
    """``"v2"`` for Model Runner V2 (``vllm.v1.worker.gpu.model_runner`` and its subclasses, the
    CPU one included), ``"v1"`` for the V1 runner."""
    for cls in type(runner).__mro__:
        if cls.__module__.startswith("vllm.v1.worker.gpu."):
            return "v2"
    return "v1"


def install_on_runner(runner, cfg: PluginConfig) -> StepScoring:
    """Load the head, check it against the model and hook the runner through its adapter
    (``core.adapter``)."""
    if cfg.has_head:
        check_same_head(runner.vllm_config, cfg.head_path)
    head = cfg.load_head()
    check_engine(runner.vllm_config, head)
    core = StepScoring(runner, cfg, head)
    kind = runner_kind(runner)
    core.adapter = (V2Adapter if kind == "v2" else V1Adapter)(runner, core)
    _wrap_profile_run(runner, core)
    from .surface import select

    logger.info("swift-fast: %s on %s.%s, %s%s; %d vLLM symbols of this runner checked",
                type(core.adapter).__name__, type(runner).__module__, type(runner).__name__,
                f"head {cfg.head_path} ({head.extra_repr()})" if head is not None else "no head (head-free values)",
                ", SAR" if cfg.sar else "", len(select(kind)))
    return core


def _wrap_profile_run(runner, core: StepScoring) -> None:
    """vLLM's memory profiling (the runner's ``profile_run``, the same seam on both runners) also
    measures SAR's transient peak (:meth:`StepScoring.profile`), before the KV cache is sized."""
    orig = runner.profile_run

    def profile_run(self_, *args, **kwargs):
        out = orig(*args, **kwargs)
        core.profile()
        return out

    runner.profile_run = types.MethodType(profile_run, runner)
