"""``swift_reduce`` against the paper's path (``torch.cat`` + Linear), per-layer matmuls and its
torch reference. GPU: Llama-3.1-8B, 33 states of d=4096, 64 candidates x 1024 tokens, bf16."""

import pytest
import torch
import torch.nn.functional as F
from benchlib import CUDA, DEVICE, free_memory, has_native, kernel_module, needs_cuda, needs_native

sr = kernel_module("swift_reduce")

if CUDA:
    K, T, D, B = 33, 64 * 1024, 4096, 64
    DTYPES = [torch.bfloat16]
else:
    K, T, D, B = 9, 2048, 1024, 8
    DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.fixture(scope="module", params=DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def case(request):
    dtype = request.param
    g = torch.Generator(device=DEVICE).manual_seed(0)
    layers = [torch.randn(T, D, device=DEVICE, generator=g).to(dtype) for _ in range(K)]
    weight = torch.randn(2, K * D, device=DEVICE, generator=g) / (K * D) ** 0.5
    bias = torch.zeros(2, device=DEVICE)
    cu = torch.arange(0, T + 1, T // B, device=DEVICE)
    yield dict(layers=layers, weight=weight, bias=bias, cu=cu, dtype=dtype, bytes=K * T * D * layers[0].element_size())
    del layers
    free_memory()


def _group(case, what="swift_reduce"):
    return f"{what} {K}x{T}x{D} {str(case['dtype']).replace('torch.', '')}"


def _gated_average(z, bias, cu):
    g, r = sr.gate_and_reward(z.float() + bias, True)
    gsum, wsum = sr.segment_sums(g, cu), sr.segment_sums(g * r, cu)
    return sr.finish_scores(wsum, gsum)


@needs_cuda
def test_triton(bench, case):
    c = case
    bench(lambda: sr.swift_reduce(c["layers"], c["weight"], c["bias"], c["cu"], backend="triton"),
          group=_group(c), impl="swift_fast triton", bytes_read=c["bytes"])


@needs_native
def test_native(bench, case):
    c = case
    bench(lambda: sr.swift_reduce(c["layers"], c["weight"], c["bias"], c["cu"], backend="native"),
          group=_group(c), impl="swift_fast native", bytes_read=c["bytes"])


def test_torch_reference(bench, case):
    c = case
    bench(lambda: sr.swift_reduce_reference(c["layers"], c["weight"], c["bias"], c["cu"]),
          group=_group(c), impl="torch reference (per layer, float32)", bytes_read=c["bytes"])


def test_torch_cat_linear(bench, case):
    """The paper's path: concatenate every state, one Linear in the model dtype, gated average."""
    c = case
    w = c["weight"].to(c["dtype"])

    def run():
        h = torch.cat(c["layers"], dim=-1)
        return _gated_average(F.linear(h, w), c["bias"], c["cu"])

    bench(run, group=_group(c), impl="torch.cat + Linear", bytes_read=c["bytes"])


def test_torch_per_layer_matmul(bench, case):
    c = case
    ws = [c["weight"][:, i * D : (i + 1) * D].to(c["dtype"]) for i in range(K)]

    def run():
        z = c["layers"][0] @ ws[0].T
        for h, w in zip(c["layers"][1:], ws[1:]):
            z = z + h @ w.T
        return _gated_average(z, c["bias"], c["cu"])

    bench(run, group=_group(c), impl="per-layer h @ W_l", bytes_read=c["bytes"])


SWEEP = [(16, 256, 8, 3), (16, 256, 8, 1), (8, 256, 4, 3), (32, 256, 8, 3), (16, 512, 8, 3), (16, 256, 4, 4)]


@needs_cuda
@pytest.mark.parametrize("block_t,block_d,num_warps,num_stages", SWEEP)
def test_triton_sweep(bench, case, block_t, block_d, num_warps, num_stages):
    c = case
    cfg = dict(block_t=block_t, block_d=block_d, num_warps=num_warps, num_stages=num_stages)
    bench(lambda: sr.swift_reduce_triton(c["layers"], c["weight"], c["bias"], c["cu"], **cfg),
          group=_group(c, "sweep swift_reduce"), impl=f"triton t{block_t} d{block_d} w{num_warps} s{num_stages}",
          bytes_read=c["bytes"], rounds=5)


@pytest.fixture(scope="module")
def pairs_case():
    """(hidden, residual) pairs, as vLLM's layers return them (CPU only: 2x the bytes)."""
    if CUDA:
        pytest.skip("pairs are benchmarked through the streaming op on the GPU")
    g = torch.Generator().manual_seed(1)
    layers = [tuple(torch.randn(T, D, generator=g).bfloat16() for _ in range(2)) for _ in range(K)]
    return dict(layers=layers, weight=torch.randn(2, K * D, generator=g) / (K * D) ** 0.5, bias=torch.zeros(2),
                cu=torch.arange(0, T + 1, T // B), bytes=2 * K * T * D * 2)


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_pairs(bench, pairs_case, backend):
    if backend == "native" and not has_native():
        pytest.skip("native extension not built")
    c = pairs_case
    bench(lambda: sr.swift_reduce(c["layers"], c["weight"], c["bias"], c["cu"], backend=backend),
          group=f"swift_reduce pairs {K}x{T}x{D} bfloat16", impl=f"swift_fast {backend}", bytes_read=c["bytes"])
