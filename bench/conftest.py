"""The ``bench`` fixture (see ``benchlib.py``).

Timing. On the CPU, pytest-benchmark times synchronous calls (``pedantic``, min/median over
rounds). On CUDA, wall-clock timing with a sync overstates small ops: inputs of a few MB (8-256
rows of log-probs) stay in the H200's 50 MB L2 cache from one repetition to the next. There each
repetition is timed with CUDA events after the L2 cache is flushed, and quantiles are taken
(``triton.testing.do_bench``, as Liger-Kernel's benchmark scripts do); pytest-benchmark stays the
reporting frame: the quantiles go into ``extra_info`` (``median_s``, ``q20_s``, ``q80_s``), which
``summarize.py`` prefers, beside one synchronised wall-clock call of its own.
"""

import pytest
import torch
from benchlib import CUDA, DEVICE_NAME, ROUNDS, sync

#: CUDA: warm-up and measuring time per case, in ms (do_bench's own defaults).
CUDA_WARMUP_MS, CUDA_REP_MS = 25, 100


@pytest.fixture
def bench(benchmark):
    """``bench(fn, group=..., impl=..., bytes_read=...)``: time ``fn`` and record."""

    def run(fn, *, group, impl, bytes_read, rounds=None, **info):
        benchmark.group = group
        benchmark.extra_info.update(impl=impl, bytes=int(bytes_read), device=DEVICE_NAME, **info)

        def call():
            fn()
            sync()

        if CUDA:
            from triton.testing import do_bench

            call()  # compile / autotune outside every measurement
            # memory the op allocates beyond what exists when it is called (before do_bench
            # allocates its L2-flush buffer)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            call()
            benchmark.extra_info["extra_GiB"] = (torch.cuda.max_memory_allocated() - base) / 2**30
            q50, q20, q80 = do_bench(fn, warmup=CUDA_WARMUP_MS, rep=CUDA_REP_MS, quantiles=[0.5, 0.2, 0.8])
            benchmark.extra_info.update(timer="CUDA events, L2 flushed (triton.testing.do_bench)",
                                        median_s=q50 / 1e3, q20_s=q20 / 1e3, q80_s=q80 / 1e3)
            benchmark.pedantic(call, rounds=1, iterations=1)
            median = q50 / 1e3
        else:
            benchmark.pedantic(call, rounds=rounds or ROUNDS, iterations=1, warmup_rounds=2)
            median = benchmark.stats.stats.median
        benchmark.extra_info["GB/s"] = bytes_read / median / 1e9

    return run
