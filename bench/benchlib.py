"""Benchmark helpers: one device, paper shapes on CUDA, small shapes on the CPU.

Every benchmark records ``impl`` (what ran), ``bytes`` (bytes the op must read: its floor) and
the achieved ``GB/s`` in ``extra_info``; ``bench/summarize.py`` turns a ``--benchmark-json``
file into the results table (time, bandwidth, % of the measured copy bandwidth, speed-up over
each peer in the same group).

Triton benchmarks run only on CUDA (the interpreter's speed means nothing); native C++ ones only
where the extension is built.
"""

import importlib
import os

import pytest
import torch

if os.environ.get("SWIFT_FAST_BENCH_THREADS"):  # CPU threads; 1 is steadier on a shared machine
    torch.set_num_threads(int(os.environ["SWIFT_FAST_BENCH_THREADS"]))

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
DEVICE_NAME = torch.cuda.get_device_name() if CUDA else f"cpu x{torch.get_num_threads()}"
ROUNDS = int(os.environ.get("SWIFT_FAST_BENCH_ROUNDS", "10" if CUDA else "7"))


def kernel_module(name):
    """``swift_fast.kernels.<name>`` itself (the package re-exports functions under these names)."""
    return importlib.import_module(f"swift_fast.kernels.{name}")


def has_native():
    from swift_fast.kernels._dispatch import native_module

    return native_module() is not None


def sync():
    if CUDA:
        torch.cuda.synchronize()


def liger_selective_log_softmax():
    """Liger-Kernel's ``fused_selective_log_softmax`` when importable (GPU peer), else None."""
    try:
        from liger_kernel.ops.grpo_loss import fused_selective_log_softmax
    except Exception:
        return None
    return fused_selective_log_softmax


def free_memory():
    if CUDA:
        torch.cuda.empty_cache()


needs_cuda = pytest.mark.skipif(not CUDA, reason="Triton kernels are timed on CUDA only")
needs_native = pytest.mark.skipif(not has_native(), reason="native extension not built")


def write_and_shut_down(result: dict, path: str | None, engines) -> None:
    """The end of a vLLM benchmark run: ``result`` to ``path`` (JSON; None: not written), then
    every engine's processes stopped (the ``LLM`` objects of ``engines``)."""
    import json

    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
    for llm in engines:
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None:
            core.shutdown()
