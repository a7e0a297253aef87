"""``token_logprobs`` against ``log_softmax(float).gather``, its ``torch.compile`` and Liger-Kernel's
``fused_selective_log_softmax``. GPU: 32768 x 128256 bf16 (8 x 4096 tokens of Llama-3.1-8B) and
few-row shapes (<= 256 rows, the split-vocabulary mode); CPU: 256 x 32000."""

import pytest
import torch
import torch.nn.functional as F
from benchlib import CUDA, DEVICE, free_memory, has_native, kernel_module, liger_selective_log_softmax, needs_cuda

tlp = kernel_module("token_logprobs")
tfh = kernel_module("token_logprobs_from_hidden")

V = 128256 if CUDA else 32000
ROWS = [32768, 256, 64, 8] if CUDA else [256]
DTYPES = [torch.bfloat16] if CUDA else [torch.bfloat16, torch.float16, torch.float32]


def log_softmax_gather(x, y):
    return torch.log_softmax(x.float(), dim=-1).gather(-1, y[:, None]).squeeze(-1)


compiled_log_softmax_gather = torch.compile(log_softmax_gather)


@pytest.fixture(scope="module", params=[(r, d) for r in ROWS for d in DTYPES],
                ids=lambda p: f"{p[0]}x{V}-{str(p[1]).replace('torch.', '')}")
def case(request):
    rows, dtype = request.param
    g = torch.Generator(device=DEVICE).manual_seed(0)
    x = (torch.randn(rows, V, device=DEVICE, generator=g) * 3).to(dtype)
    y = torch.randint(0, V, (rows,), device=DEVICE, generator=g)
    yield dict(x=x, y=y, rows=rows, dtype=dtype, bytes=x.nbytes,
               group=f"token_logprobs {rows}x{V} {str(dtype).replace('torch.', '')}")
    del x
    free_memory()


def test_swift_fast(bench, case):
    c = case
    backend = "triton" if CUDA else "native"
    if backend == "native" and not has_native():
        pytest.skip("native extension not built (the torch reference is the log_softmax row)")
    bench(lambda: tlp.token_logprobs(c["x"], c["y"], backend=backend), group=c["group"], impl=f"swift_fast {backend}",
          bytes_read=c["bytes"])


def test_torch_log_softmax_gather(bench, case):
    c = case
    bench(lambda: log_softmax_gather(c["x"], c["y"]), group=c["group"], impl="log_softmax(float).gather",
          bytes_read=c["bytes"])


def test_torch_compile(bench, case):
    c = case
    compiled_log_softmax_gather(c["x"], c["y"])  # compile outside the timing
    bench(lambda: compiled_log_softmax_gather(c["x"], c["y"]), group=c["group"],
          impl="torch.compile(log_softmax.gather)", bytes_read=c["bytes"])


@needs_cuda
def test_liger(bench, case):
    fn = liger_selective_log_softmax()
    if fn is None:
        pytest.skip("liger-kernel is not importable")
    _bench_liger(bench, case, fn)
    free_memory()  # Liger's copy of the logits is gone with _bench_liger's frame


def _bench_liger(bench, c, fn):
    rows = c["rows"]
    batch = 8 if rows >= 8 * 1024 else 1
    # Liger's layout: [B, L + 1, V] logits, row l predicts input_ids[:, -L:][l]
    x = torch.empty(batch, rows // batch + 1, V, device=DEVICE, dtype=c["dtype"])
    x[:, :-1] = c["x"].view(batch, rows // batch, V)
    ids = c["y"].view(batch, rows // batch)
    got = fn(x, ids, temperature=1.0).flatten()
    torch.testing.assert_close(got, tlp.token_logprobs(c["x"], c["y"]), atol=1e-4, rtol=1e-5)
    bench(lambda: fn(x, ids, temperature=1.0), group=c["group"], impl="liger fused_selective_log_softmax",
          bytes_read=c["bytes"])


@needs_cuda
@pytest.mark.parametrize("block_v,num_warps,num_stages", [(4096, 8, 3), (4096, 8, 1), (2048, 4, 3), (8192, 8, 3),
                                                          (8192, 16, 3), (4096, 4, 4)])
def test_sweep_blocks(bench, case, block_v, num_warps, num_stages):
    c = case
    if c["rows"] < 32768:
        pytest.skip("block sweep on the paper shape only")
    bench(lambda: tlp.token_logprobs_triton(c["x"], c["y"], block_v=block_v, num_warps=num_warps,
                                            num_stages=num_stages),
          group="sweep " + c["group"], impl=f"triton v{block_v} w{num_warps} s{num_stages}", bytes_read=c["bytes"],
          rounds=5)


@needs_cuda
@pytest.mark.parametrize("split", [1, 4, 16, 64])
def test_sweep_split(bench, case, split):
    c = case
    if c["rows"] > 256:
        pytest.skip("split sweep on few-row shapes only")
    bench(lambda: tlp.token_logprobs_triton(c["x"], c["y"], split=split), group="sweep " + c["group"],
          impl=f"triton split {split}", bytes_read=c["bytes"], rounds=5)


@pytest.mark.parametrize("impl", ["fused projection", "log-probs then logits @ W^T"])
@needs_cuda
def test_logit_feature_projection(bench, case, impl):
    c = case
    if c["rows"] != ROWS[0] or c["dtype"] != torch.bfloat16:
        pytest.skip("one shape")
    w = torch.randn(2, V, device=DEVICE) * 0.01
    b = torch.zeros(2, device=DEVICE)
    if impl == "fused projection":
        fn = lambda: tlp.token_logprobs(c["x"], c["y"], w, b)  # noqa: E731 - the call to time, by impl
    else:
        wl = w.to(c["dtype"])
        fn = lambda: (tlp.token_logprobs(c["x"], c["y"]), F.linear(c["x"], wl).float() + b)  # noqa: E731 - the call to time, by impl
    bench(fn, group=f"token_logprobs + logit-feature projection {c['rows']}x{V}", impl=impl, bytes_read=c["bytes"])


@pytest.fixture(scope="module")
def hidden_case():
    t, d = (8192, 4096) if CUDA else (256, 512)
    g = torch.Generator(device=DEVICE).manual_seed(1)
    hidden = torch.randn(t, d, device=DEVICE, generator=g).bfloat16()
    lm_head = (torch.randn(V, d, device=DEVICE, generator=g) / d**0.5).bfloat16()
    y = torch.randint(0, V, (t,), device=DEVICE, generator=g)
    yield dict(hidden=hidden, lm_head=lm_head, y=y, group=f"token_logprobs_from_hidden {t}x{d} -> {V} bf16",
               bytes=hidden.nbytes + lm_head.nbytes)
    free_memory()


@pytest.mark.parametrize("impl", ["chunked", "full logits + log_softmax"])
def test_from_hidden(bench, hidden_case, impl):
    c = hidden_case
    if impl == "chunked":
        fn = lambda: tfh.token_logprobs_from_hidden(c["hidden"], c["lm_head"], c["y"])  # noqa: E731 - the call to time, by impl
    else:
        fn = lambda: log_softmax_gather(c["hidden"] @ c["lm_head"].T, c["y"])  # noqa: E731 - the call to time, by impl
    bench(fn, group=c["group"], impl=impl, bytes_read=c["bytes"], rounds=5)


@needs_cuda
@pytest.mark.parametrize("impl", ["row logsumexp, then the sampled logit", "copy the rows, then token_logprobs"])
def test_plugin_step_sampled_logprobs(bench, case, impl):
    """What the vLLM plugin's SAR costs a step for a row's sampled token: the fused row logsumexp before
    sampling and one gathered logit after (O(rows) memory), against copying the rows' logits to float32
    before the sampler edits them and reducing the copy (what float32 logits still need)."""
    c = case
    if c["rows"] > 256:
        pytest.skip("a decode step's rows")
    x, y = c["x"], c["y"]
    rows = torch.arange(x.shape[0], device=DEVICE)
    if impl.startswith("row"):
        fn = lambda: x[rows, y].float() - tlp.logsumexp_rows(x)  # noqa: E731 - the call to time, by impl
    else:
        fn = lambda: tlp.token_logprobs(x.index_select(0, rows).float(), y)  # noqa: E731 - the call to time, by impl
    torch.testing.assert_close(fn(), tlp.token_logprobs(x, y), atol=1e-4, rtol=1e-5)
    bench(fn, group=f"plugin step: sampled-token log-probs {c['rows']}x{V}", impl=impl, bytes_read=c["bytes"])
