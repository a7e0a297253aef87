"""Test harness only: run the vLLM engines built inside :func:`model_runner_v2` on Model Runner V2.

Every process those engines start (engine cores, workers, an API server) imports
``sitecustomize`` from this directory, put first on their ``PYTHONPATH``, before vLLM: it
registers the inactive ``"cpu"`` Triton backend vLLM looks for, so they run MRv2 with its Triton
kernels interpreted. The test process itself is not changed that way -- the V1 tests that share
it keep Triton off, as a user's CPU install has it (with Triton on, vLLM's V1 sampler would switch
to its Triton top-k/top-p kernel). It only builds the engines' config, and there the one thing
vLLM reads is ``vllm.config.vllm.HAS_TRITON`` (its check that MRv2 can run), set for the duration.
So every MRv2 engine of the tests runs its engine core in its own process (the default;
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` would run MRv2 in the test process, which cannot).
"""

from __future__ import annotations

import contextlib
import os

SHIM_DIR = os.path.dirname(os.path.abspath(__file__))


def environment(base: dict | None = None) -> dict:
    """``base`` (default ``os.environ``) with what a process needs to start vLLM on MRv2 here."""
    env = dict(os.environ if base is None else base)
    path = env.get("PYTHONPATH")
    env.update(
        VLLM_USE_V2_MODEL_RUNNER="1",
        SWIFT_FAST_TEST_TRITON_CPU="1",
        TRITON_INTERPRET="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="1",
        PYTHONPATH=SHIM_DIR + (os.pathsep + path if path else ""),
    )
    return env


@contextlib.contextmanager
def model_runner_v2():
    """Engines built inside run Model Runner V2 (restored afterwards, with vLLM's cached environment)."""
    import vllm.config.vllm as config_module
    from vllm import envs

    def forget_cached_environment():  # an in-process engine core earlier may have cached it
        getattr(envs.__getattr__, "cache_clear", lambda: None)()

    saved = dict(os.environ)
    has_triton = config_module.HAS_TRITON
    os.environ.update(environment())
    config_module.HAS_TRITON = True
    forget_cached_environment()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        config_module.HAS_TRITON = has_triton
        forget_cached_environment()
