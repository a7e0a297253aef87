"""What the plugin holds, for tests, benchmarks and operators: called in each worker through
``LLM.collective_rpc(plugin_state)``, or in the front end process directly (:func:`traced_bytes`)."""

from __future__ import annotations

import os
import tracemalloc


def plugin_state(worker, trace: bool = False) -> dict:
    """What the plugin holds in one worker: its adapter (``V1Adapter`` or ``V2Adapter``), the
    requests it keeps a record of (until vLLM reports them finished), how many of those hold a
    SAR pass's running sums, the head's states this worker projects (a pipeline stage: those of its own
    layers) and how many forwards started from an upstream stage's sums, the plugin's buffer sizes
    in bytes, the process's resident memory and CPU time (user + system) and, while
    ``tracemalloc`` traces (``trace=True`` starts it), the bytes currently allocated by
    swift-fast's own code."""
    import psutil

    runner = getattr(worker, "model_runner", worker)
    scoring = getattr(runner, "_swift_fast", None)
    reqs = scoring.requests if scoring is not None else {}
    passes = sum(1 for info in reqs.values() if info.sar_pass is not None)
    buffers = 0
    if scoring is not None:
        seen = set()
        for t in scoring.tensors():
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                buffers += t.numel() * t.element_size()
    process = psutil.Process()
    return {
        "installed": scoring is not None,
        "runner": scoring.adapter.__class__.__name__ if scoring is not None else None,
        "requests": len(reqs),
        "sar_passes": passes,
        "states": list(scoring.forward.states) if scoring is not None and scoring.forward is not None else [],
        "pipeline_received": scoring.pipeline.received if scoring is not None and scoring.pipeline else 0,
        "buffer_bytes": buffers,
        "rss_bytes": process.memory_info().rss,
        "cpu_seconds": sum(process.cpu_times()[:2]),
        "traced_bytes": traced_bytes(start=trace),
    }


def traced_bytes(start: bool = False) -> int | None:
    """Bytes allocated by swift-fast's Python code and still alive (None unless tracemalloc traces)."""
    if start and not tracemalloc.is_tracing():
        tracemalloc.start()
    if not tracemalloc.is_tracing():
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, os.path.join(root, "*"))])
    return sum(s.size for s in snap.statistics("filename"))
