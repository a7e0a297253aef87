"""The ``bench`` fixture (see ``benchlib.py``)."""

import pytest
import torch

from benchlib import CUDA, DEVICE_NAME, ROUNDS, sync


@pytest.fixture
def bench(benchmark):
    """``bench(fn, group=..., impl=..., bytes_read=...)``: time ``fn`` (synchronised) and record."""

    def run(fn, *, group, impl, bytes_read, rounds=None, **info):
        benchmark.group = group
        benchmark.extra_info.update(impl=impl, bytes=int(bytes_read), device=DEVICE_NAME, **info)

        def call():
            fn()
            sync()

        benchmark.pedantic(call, rounds=rounds or ROUNDS, iterations=1, warmup_rounds=2)
        benchmark.extra_info["GB/s"] = bytes_read / benchmark.stats.stats.median / 1e9
        if CUDA:  # memory the op allocates beyond its inputs
            benchmark.extra_info["extra_GiB"] = (torch.cuda.max_memory_allocated() - base) / 2**30

    base = 0
    if CUDA:
        sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    return run

