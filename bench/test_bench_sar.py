"""``sar_from_logits`` (one launch) against two ``token_logprobs`` calls plus ``sar_reward``, and
the materialising reference. GPU: 2 x 32768 x 128256 bf16 (64 answers of 512 tokens) and
256 rows; CPU: 2 x 256 x 32000."""

import pytest
import torch
from benchlib import CUDA, DEVICE, free_memory, has_native, kernel_module, needs_cuda

sfl = kernel_module("sar_from_logits")
tlp = kernel_module("token_logprobs")

V = 128256 if CUDA else 32000
ROWS = [32768, 256] if CUDA else [256]


@pytest.fixture(scope="module", params=ROWS, ids=lambda r: f"{r}x{V}")
def case(request):
    rows = request.param
    g = torch.Generator(device=DEVICE).manual_seed(0)
    xq = (torch.randn(rows, V, device=DEVICE, generator=g) * 3).bfloat16()
    x0 = (torch.randn(rows, V, device=DEVICE, generator=g) * 3).bfloat16()
    y = torch.randint(0, V, (rows,), device=DEVICE, generator=g)
    cu = torch.linspace(0, rows, 65 if rows >= 64 * 8 else 9, device=DEVICE).long()
    yield dict(xq=xq, x0=x0, y=y, cu=cu, bytes=2 * xq.nbytes, group=f"sar_from_logits 2x{rows}x{V} bf16")
    del xq, x0
    free_memory()


def _fast_backend():
    return "triton" if CUDA else ("native" if has_native() else "torch")


def test_sar_from_logits(bench, case):
    c = case
    b = _fast_backend()
    bench(lambda: sfl.sar_from_logits(c["xq"], c["x0"], c["y"], c["cu"], backend=b), group=c["group"],
          impl=f"swift_fast {b} (one launch)" if CUDA else f"swift_fast {b}", bytes_read=c["bytes"])


@needs_cuda
def test_sar_from_logits_two_kernels(bench, case):
    c = case
    bench(lambda: sfl.sar_from_logits_triton(c["xq"], c["x0"], c["y"], c["cu"], fused=False), group=c["group"],
          impl="swift_fast triton (partials + finish kernel)", bytes_read=c["bytes"])


def test_two_token_logprobs_calls(bench, case):
    c = case
    b = _fast_backend()

    def run():
        lq = tlp.token_logprobs(c["xq"], c["y"], backend=b)
        l0 = tlp.token_logprobs(c["x0"], c["y"], backend=b)
        return sfl.sar_reference(lq, l0, c["cu"])

    bench(run, group=c["group"], impl=f"2 x token_logprobs ({b}) + sar_reward", bytes_read=c["bytes"])


def test_reference(bench, case):
    c = case
    bench(lambda: sfl.sar_from_logits_reference(c["xq"], c["x0"], c["y"], c["cu"]), group=c["group"],
          impl="torch reference (2 x log_softmax)", bytes_read=c["bytes"], rounds=5)
