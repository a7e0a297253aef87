"""``token_logprobs`` and ``token_logprobs_from_hidden``: hand float64, reference, fast paths."""

import importlib
import math

import pytest
import torch

from swift_fast.kernels._dispatch import HAVE_TRITON, interpreting, native_module

# the package exports the functions under the modules' names: fetch the modules themselves
tlp = importlib.import_module("swift_fast.kernels.token_logprobs")
tfh = importlib.import_module("swift_fast.kernels.token_logprobs_from_hidden")

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # interpreter: numpy inf/NaN
CUDA = torch.cuda.is_available()
INTERP = HAVE_TRITON and interpreting()
# Inputs are cast exactly to float32 on every path, so the tolerance does not depend on the
# logits dtype: online logsumexp vs log_softmax differ by float32 rounding only.
ATOL, RTOL = 1e-4, 1e-5


def _hand(logits, targets, temperature=1.0):
    """Float64 ``x_y / temp - log sum exp(x / temp)`` per row by explicit loops."""
    out = []
    for row, y in zip(logits.double().tolist(), targets.tolist()):
        row = [x / temperature for x in row]
        if not 0 <= y < len(row) or any(math.isnan(x) for x in row):
            out.append(float("nan"))
            continue
        m = max(row)
        if m == float("-inf"):
            out.append(float("nan"))
            continue
        lse = m + math.log(math.fsum(math.exp(x - m) for x in row))
        out.append(row[y] - lse)
    return torch.tensor(out, dtype=torch.float64)


def _logits(t, v, dtype, seed=0, scale=4.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(t, v, generator=g) * scale).to(dtype), torch.randint(0, v, (t,), generator=g)


def _fast(logits, targets, backend, **kw):
    if backend == "triton":
        return tlp.token_logprobs_triton(logits, targets, **kw)
    return tlp.token_logprobs(logits, targets, backend=backend, **{k: v for k, v in kw.items() if k == "temperature"})


def _fast_backends():
    return (["triton"] if INTERP else []) + (["native"] if native_module() is not None else [])


def test_reference_matches_hand_float64():
    x, y = _logits(5, 37, torch.float32)
    x[1, 3] = float("-inf")
    y[1] = 3
    torch.testing.assert_close(tlp.token_logprobs_reference(x, y).double(), _hand(x, y), atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(
        tlp.token_logprobs_reference(x, y, temperature=0.7).double(), _hand(x, y, 0.7), atol=ATOL, rtol=RTOL
    )


@pytest.mark.parametrize("backend", _fast_backends())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("split", [1, 3, None])
def test_fast_matches_reference_and_hand(backend, dtype, split):
    if backend == "native" and split != 1:
        pytest.skip("split is a Triton launch setting")
    x, y = _logits(7, 1031, dtype)  # odd sizes; 9 vocabulary blocks of 128
    kw = dict(split=split, block_v=128) if backend == "triton" else {}
    got = _fast(x, y, backend, **kw)
    assert got.dtype == torch.float32 and got.shape == (7,)
    torch.testing.assert_close(got, tlp.token_logprobs_reference(x, y), atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(got.double(), _hand(x, y), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("backend", _fast_backends())
def test_extremes_nan_and_bad_targets(backend):
    x, y = _logits(8, 300, torch.float32)
    x[0, :] = -1e4
    x[0, 5] = 1e4  # one dominant logit
    y[0] = 5
    x[1, ::2] = float("-inf")  # half the vocabulary impossible, target among them
    y[1] = 4
    x[2, :] = float("-inf")  # nothing possible: NaN, like log_softmax
    x[3, 7] = float("nan")  # NaN stays in its row
    y[4] = -100  # ignore index: NaN, nothing read outside the row
    y[5] = 300
    x[6, :150] = 1e4
    x[6, 150:] = -1e4
    kw = dict(split=2, block_v=64) if backend == "triton" else {}
    got = _fast(x, y, backend, **kw)
    want = tlp.token_logprobs_reference(x, y)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL, equal_nan=True)
    torch.testing.assert_close(got.double(), _hand(x, y), atol=ATOL, rtol=RTOL, equal_nan=True)
    assert got[0] == 0 and got[1] == float("-inf")
    assert torch.isnan(got[[2, 3, 4, 5]]).all() and torch.isfinite(got[[0, 6, 7]]).all()


@pytest.mark.parametrize("backend", _fast_backends())
def test_strided_logits_and_temperature(backend):
    x, y = _logits(6, 500, torch.bfloat16, seed=3)
    wide = torch.zeros(6, 517, dtype=torch.bfloat16)
    wide[:, 9 : 9 + 500] = x
    rows_strided = wide[:, 9 : 9 + 500]  # row stride 517
    col_strided = x.T.contiguous().T  # column stride 6: copied to rows first
    kw = dict(block_v=64, split=2) if backend == "triton" else {}
    for view in (rows_strided, col_strided):
        got = _fast(view, y, backend, temperature=0.6, **kw)
        torch.testing.assert_close(got.double(), _hand(x, y, 0.6), atol=ATOL, rtol=RTOL)


@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
@pytest.mark.parametrize("rows", [2, 1])
@pytest.mark.parametrize("split", [1, 4])
def test_logit_feature_projection_in_the_same_pass(rows, split):
    x, y = _logits(9, 700, torch.bfloat16, seed=4)
    g = torch.Generator().manual_seed(5)
    w, b = torch.randn(rows, 700, generator=g) * 0.01, torch.randn(rows, generator=g)
    lp, z = tlp.token_logprobs_triton(x, y, w, b, split=split, block_v=128)
    lp_ref, z_ref = tlp.token_logprobs_reference(x, y, w, b)
    torch.testing.assert_close(lp, lp_ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(z, z_ref, atol=1e-4, rtol=1e-4)
    hand = torch.tensor(
        [[sum(float(x[t, i]) * float(w[j, i]) for i in range(700)) + float(b[j]) for j in range(rows)]
         for t in range(9)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(z.double(), hand, atol=1e-4, rtol=1e-4)
    assert tlp.token_logprobs(x, y, w, b, backend="triton")[1].shape == (9, rows)


def test_choose_split_fills_the_device():
    cpu = torch.device("cpu")
    assert tlp.choose_split(32768, 128256, 4096, cpu) == 1
    few = tlp.choose_split(2, 128256, 4096, cpu)
    assert few > 1 and 2 * few >= tlp.PROGRAMS_PER_SM * 4 // 2
    assert tlp.choose_split(2, 4096, 4096, cpu) == 1  # one block: nothing to split


def test_errors_name_the_problem():
    x, y = _logits(3, 10, torch.float32)
    with pytest.raises(ValueError, match="flatten"):
        tlp.token_logprobs(x[None], y)
    with pytest.raises(ValueError, match="targets"):
        tlp.token_logprobs(x, y[:2])
    with pytest.raises(ValueError, match="temperature"):
        tlp.token_logprobs(x, y, temperature=0.0)


@pytest.mark.parametrize("backend", ["torch"] + _fast_backends())
@pytest.mark.parametrize("chunk_rows", [None, 4])
def test_from_hidden_matches_reference(backend, chunk_rows):
    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(11, 24, generator=g).to(torch.bfloat16)
    lm_head = (torch.randn(301, 24, generator=g) * 0.3).to(torch.bfloat16)
    y = torch.randint(0, 301, (11,), generator=g)
    got = tfh.token_logprobs_from_hidden(hidden, lm_head, y, chunk_rows=chunk_rows, backend=backend)
    want = tfh.token_logprobs_from_hidden_reference(hidden, lm_head, y)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-3)  # bf16 logits rounded per chunk GEMM
    # same chunk logits through the materialising reference: float32 agreement
    exact = torch.cat(
        [tlp.token_logprobs_reference(hidden[i : i + 4] @ lm_head.T, y[i : i + 4]) for i in range(0, 11, 4)]
    )
    if chunk_rows == 4:
        torch.testing.assert_close(got, exact, atol=ATOL, rtol=RTOL)
    with pytest.raises(ValueError, match="same d"):
        tfh.token_logprobs_from_hidden(hidden, lm_head[:, :5], y)


# ---------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 128256), (257, 32000), (1000, 4099)])
def test_cuda_matches_reference(dtype, shape):
    t, v = shape
    x, y = _logits(t, v, dtype)
    x[0, :] = -1e4
    x[0, 11] = 1e4
    x[1 % t, ::3] = float("-inf")
    x, y = x.cuda(), y.cuda()
    got = tlp.token_logprobs(x, y)
    torch.testing.assert_close(got, tlp.token_logprobs_reference(x, y), atol=ATOL, rtol=RTOL)
    w, b = torch.randn(2, v, device="cuda") * 0.01, torch.randn(2, device="cuda")
    lp, z = tlp.token_logprobs(x, y, w, b)
    lp_ref, z_ref = tlp.token_logprobs_reference(x, y, w, b)
    torch.testing.assert_close(lp, lp_ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(z, z_ref, atol=1e-2, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_memory_is_linear_in_rows():
    t, v = 2048, 128256
    x, y = _logits(t, v, torch.bfloat16)
    x, y = x.cuda(), y.cuda()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    tlp.token_logprobs(x, y)
    tlp.token_logprobs(x[:8], y[:8])  # split mode
    extra = torch.cuda.max_memory_allocated() - base
    assert extra < 64 * t * 4 + (1 << 20), f"{extra} bytes: more than O(T)"
    hidden = torch.randn(t, 512, device="cuda", dtype=torch.bfloat16)
    lm_head = torch.randn(v, 512, device="cuda", dtype=torch.bfloat16) * 0.05
    got = tfh.token_logprobs_from_hidden(hidden, lm_head, y, chunk_rows=256)
    want = tfh.token_logprobs_from_hidden_reference(hidden, lm_head, y)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=1e-3)


# Launch settings small enough that every loop runs several tiles plus a tail: V = 1031 over
# BLOCK_V (the online logsumexp's loop), over SPLIT vocabulary slices (the last one shorter), and
# the logit-feature projection's rows over BLOCK_T programs.
LOGPROB_TILINGS = {
    "v-tiles9": dict(block_v=128, split=1),
    "v-slices3-of-tiles3": dict(block_v=128, split=3),
    "v-slices5-of-tiles7": dict(block_v=32, split=5),
}


@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
@pytest.mark.parametrize("projection", [False, True], ids=["logprobs", "logprobs+projection"])
@pytest.mark.parametrize("config", LOGPROB_TILINGS.values(), ids=LOGPROB_TILINGS.keys())
def test_every_loop_runs_several_tiles(config, projection):
    x, y = _logits(11, 1031, torch.bfloat16, seed=8)
    if projection:
        g = torch.Generator().manual_seed(9)
        w, b = torch.randn(2, 1031, generator=g) * 0.01, torch.randn(2, generator=g)
        lp, z = tlp.token_logprobs_triton(x, y, w, b, **config)
        hand_z = x.double() @ w.double().T + b.double()
        torch.testing.assert_close(z.double(), hand_z, atol=1e-4, rtol=1e-4)
    else:
        lp = tlp.token_logprobs_triton(x, y, **config)
    torch.testing.assert_close(lp.double(), _hand(x, y), atol=ATOL, rtol=RTOL)


def _hand_lse(logits, temperature=1.0):
    """Float64 ``log sum exp(x / temp)`` per row by explicit loops."""
    out = []
    for row in logits.double().tolist():
        row = [x / temperature for x in row]
        m = max(row)
        out.append(m + math.log(sum(math.exp(x - m) for x in row)))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logsumexp_rows_reference_matches_hand_computation(dtype, temperature):
    x, _ = _logits(5, 300, dtype, seed=11)
    got = tlp.logsumexp_rows(x, temperature, backend="torch")
    assert got.dtype == torch.float32 and got.shape == (5,)
    torch.testing.assert_close(got.double(), _hand_lse(x, temperature), atol=ATOL, rtol=RTOL)


@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
@pytest.mark.parametrize("config", LOGPROB_TILINGS.values(), ids=LOGPROB_TILINGS.keys())
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logsumexp_rows_triton_runs_every_tile(config, temperature):
    """A row's log-normaliser plus its target's logit is the target's log-prob: both kernels agree."""
    x, y = _logits(11, 1031, torch.bfloat16, seed=12)
    lse = tlp.token_logprobs_triton(x, None, temperature=temperature, **config)
    torch.testing.assert_close(lse.double(), _hand_lse(x, temperature), atol=ATOL, rtol=RTOL)
    x_y = x.float().gather(1, y[:, None])[:, 0] / temperature
    torch.testing.assert_close((x_y - lse).double(), _hand(x, y, temperature), atol=ATOL, rtol=RTOL)
    # a row of all -inf has no distribution (NaN, as its log-probs) and leaves the others alone
    x[3] = float("-inf")
    lse = tlp.logsumexp_rows(x, temperature, backend="triton")
    assert math.isnan(lse[3]) and torch.isfinite(lse[torch.arange(11) != 3]).all()
    assert math.isnan(tlp.logsumexp_rows(x, temperature, backend="torch")[3])
