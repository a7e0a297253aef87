"""Streaming ops per generation step: ``project_layer_`` for every layer, then ``finish_``.

GPU: Llama-3.1-8B shape (33 states, d=4096, bf16 (hidden, residual) pairs), a decode step of 256
tokens and a prefill chunk of 8192; CPU: 9 states of d=1024, 256 tokens.
"""

import pytest
import torch
from benchlib import CUDA, DEVICE, has_native, kernel_module

st = kernel_module("streaming")

K, D, SLOTS = (33, 4096, 256) if CUDA else (9, 1024, 64)
TOKENS = [256, 8192] if CUDA else [256]


@pytest.fixture(scope="module", params=TOKENS, ids=lambda t: f"T{t}")
def step(request):
    t = request.param
    g = torch.Generator(device=DEVICE).manual_seed(0)
    hs = [torch.randn(t, D, device=DEVICE, generator=g).bfloat16() for _ in range(K)]
    rs = [torch.randn(t, D, device=DEVICE, generator=g).bfloat16() for _ in range(K)]
    w = torch.randn(2, K * D, device=DEVICE, generator=g) / (K * D) ** 0.5
    ws = [w[:, i * D : (i + 1) * D] for i in range(K)]
    slots = (torch.arange(t, device=DEVICE) * SLOTS // t).to(torch.int32)  # contiguous requests
    acc, state = st.new_buffers(t, SLOTS, device=DEVICE)
    return dict(t=t, hs=hs, rs=rs, ws=ws, bias=torch.zeros(2, device=DEVICE), slots=slots, acc=acc, state=state,
                bytes=2 * K * t * D * 2)


def _backends():
    if CUDA:
        return ["triton", "torch"]
    return ["torch"] + (["native"] if has_native() else [])


@pytest.mark.parametrize("backend", _backends())
def test_step(bench, step, backend):
    s = step
    if CUDA:
        project = st.project_layer_ if backend == "triton" else st.project_layer_reference
        finish = st.finish_ if backend == "triton" else st.finish_reference
    else:
        prev = st.set_cpu_backend(backend)
        project, finish = st.project_layer_, st.finish_

    def run():
        for h, r, w in zip(s["hs"], s["rs"], s["ws"]):
            project(s["acc"], h, r, w)
        finish(s["acc"], s["bias"], s["slots"], s["state"])

    try:
        bench(run, group=f"streaming step {K} layers x T{s['t']} x {D} bf16 pairs", impl=f"swift_fast {backend}",
              bytes_read=s["bytes"])
    finally:
        if not CUDA:
            st.set_cpu_backend(prev)


@pytest.mark.parametrize("impl", ["custom op", "torch reference (direct call)"])
def test_finish_only(bench, step, impl):
    s = step
    fn = st.finish_reference if impl.startswith("torch") else st.finish_
    label = f"torch.ops.swift_fast.finish_ ({'triton' if CUDA else 'torch'})" if impl == "custom op" else impl
    bench(lambda: fn(s["acc"], s["bias"], s["slots"], s["state"]), group=f"finish_ T{s['t']} S{SLOTS}",
          impl=label, bytes_read=s["t"] * 12)
