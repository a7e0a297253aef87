"""``sar_from_logits``: hand float64 (SAR Eq. 8-9), ``sar_reward``, fast paths."""

import importlib
import math

import pytest
import torch

from swift_fast.kernels._dispatch import HAVE_TRITON, interpreting, native_module
from swift_fast.rewards.sar import sar_reward

sfl = importlib.import_module("swift_fast.kernels.sar_from_logits")
tlp = importlib.import_module("swift_fast.kernels.token_logprobs")

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # interpreter: exp/log of inf
CUDA = torch.cuda.is_available()
INTERP = HAVE_TRITON and interpreting()


def _hand(xq, x0, y, cu):
    """Float64 SAR by explicit loops: ``ppl = exp(-mean log p)``, ``clip((ppl0 - pplq) / ppl0)``."""

    def lp(row, t):
        row = [float(v) for v in row]
        m = max(row)
        return row[t] - (m + math.log(math.fsum(math.exp(v - m) for v in row)))

    out = []
    for b in range(len(cu) - 1):
        rows = range(int(cu[b]), int(cu[b + 1]))
        if not rows:
            out.append(0.0)
            continue
        mq = sum(lp(xq[j].tolist(), int(y[j])) for j in rows) / len(rows)
        m0 = sum(lp(x0[j].tolist(), int(y[j])) for j in rows) / len(rows)
        ppl_q, ppl_0 = math.exp(-mq), math.exp(-m0)
        out.append(min(1.0, max(-1.0, (ppl_0 - ppl_q) / ppl_0)))
    return torch.tensor(out, dtype=torch.float64)


def _case(t, v, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    xq = torch.randn(t, v, generator=g) * 2
    # the question-free pass: same logits blurred, so R_SA stays inside (-1, 1)
    x0 = xq * 0.8 + torch.randn(t, v, generator=g) * 0.3
    return xq.to(dtype), x0.to(dtype), torch.randint(0, v, (t,), generator=g)


# rows 0 and 13 belong to no answer; empty answers first, in the middle and last
CU = torch.tensor([1, 1, 2, 6, 6, 13, 13])


def _fast(xq, x0, y, cu, backend, **kw):
    if backend == "triton":
        return sfl.sar_from_logits_triton(xq, x0, y, cu, **kw)
    return sfl.sar_from_logits(xq, x0, y, cu, backend=backend)


def _fast_cases():
    out = []
    if INTERP:
        out += [("triton", dict(fused=f, split=s, block_v=128)) for f in (True, False) for s in (1, 3)]
    if native_module() is not None:
        out.append(("native", {}))
    return out


def test_reference_matches_hand_float64_and_sar_reward():
    xq, x0, y = _case(14, 50, torch.float32)
    got = sfl.sar_from_logits_reference(xq, x0, y, CU)
    torch.testing.assert_close(got.double(), _hand(xq, x0, y, CU), atol=1e-5, rtol=1e-5)
    lq, l0 = tlp.token_logprobs_reference(xq, y), tlp.token_logprobs_reference(x0, y)
    torch.testing.assert_close(got, sar_reward(lq, l0, CU), atol=0, rtol=0)
    assert got[[0, 3, 5]].abs().sum() == 0


@pytest.mark.parametrize("backend,kw", _fast_cases())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fast_matches_reference(backend, kw, dtype):
    xq, x0, y = _case(14, 517, dtype)
    got = _fast(xq, x0, y, CU, backend, **kw)
    want = sfl.sar_from_logits_reference(xq, x0, y, CU)
    assert got.dtype == torch.float32 and got.shape == (6,)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(got.double(), _hand(xq.float(), x0.float(), y, CU), atol=2e-5, rtol=1e-4)
    lq = tlp.token_logprobs(xq, y, backend="torch")
    l0 = tlp.token_logprobs(x0, y, backend="torch")
    torch.testing.assert_close(got, sar_reward(lq, l0, CU), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("backend,kw", _fast_cases())
def test_nan_outside_rows_policy_and_bit_stability(backend, kw):
    xq, x0, y = _case(14, 300, torch.bfloat16, seed=1)
    first = _fast(xq, x0, y, CU, backend, **kw)
    assert torch.equal(first, _fast(xq, x0, y, CU, backend, **kw))
    xq[0, 5] = float("nan")  # row 0 is in no answer: never read
    x0[13, :] = float("nan")
    x0[3, 9] = float("nan")  # answer 2 = rows [2, 6)
    got = _fast(xq, x0, y, CU, backend, **kw)
    assert torch.isnan(got[2])
    keep = [0, 1, 3, 4, 5]
    assert torch.equal(got[keep], first[keep])


@pytest.mark.parametrize("backend,kw", _fast_cases())
def test_extremes_and_clipping(backend, kw):
    xq, x0, y = _case(6, 200, torch.float32, seed=2)
    cu = torch.tensor([0, 2, 4, 6])
    xq[0:2] = -1e4
    xq[0, y[0]] = 1e4
    xq[1, y[1]] = 1e4  # certain with the question, unlikely without: R_SA -> 1
    x0[2:4] = -1e4
    x0[2, y[2]] = 1e4
    x0[3, y[3]] = 1e4  # certain without the question: R_SA very negative, clipped to -1
    xq[4, ::2] = float("-inf")
    got = _fast(xq, x0, y, cu, backend, **kw)
    want = sfl.sar_from_logits_reference(xq, x0, y, cu)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert got[0] > 0.99 and got[1] == -1.0


@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
def test_near_certain_answers_keep_their_precision():
    # near-certain tokens have log-probs ~ -1e-7: they must not round to 0 (the max is
    # subtracted before the log, and the max's own term kept out of the sum: log1p), and a
    # small R_SA must not cancel (expm1)
    v = 64
    y = torch.tensor([3, 10, 7, 0])
    xq = torch.zeros(4, v)
    xq[torch.arange(4), y] = 20.0
    x0 = xq.clone()
    x0[torch.arange(4), y] = 15.0
    cu = torch.tensor([0, 4])
    got = sfl.sar_from_logits_triton(xq, x0, y, cu, block_v=16)
    want = _hand(xq.double(), x0.double(), y, cu)
    assert 1e-5 < float(got[0]) < 1e-4
    torch.testing.assert_close(got.double(), want, atol=1e-12, rtol=1e-4)
    lp = tlp.token_logprobs_triton(xq, y, block_v=16)
    assert (lp < 0).all()
    # log(1 + 1.3e-7) from a float32 sum 1 + s would be off by up to 50%; log1p(s) is not
    want_lp = -math.log1p(63 * math.exp(-20.0))
    torch.testing.assert_close(lp.double(), torch.full((4,), want_lp, dtype=torch.float64), atol=0, rtol=1e-5)


def test_public_sar_functions_use_the_kernels():
    from swift_fast.rewards import sar

    xq, x0, y = _case(14, 300, torch.bfloat16, seed=5)
    want = sar.sar_reward(sar.token_logprobs(xq, y, backend="torch"), sar.token_logprobs(x0, y, backend="torch"), CU)
    for backend in ["torch", "auto"] + sorted({b for b, _ in _fast_cases()}):
        torch.testing.assert_close(sar.sar_from_logits(xq, x0, y, CU, backend=backend), want, atol=2e-5, rtol=1e-4)


def test_sar_from_hidden_matches_the_logits_path():
    from swift_fast.rewards import sar

    g = torch.Generator().manual_seed(6)
    hq, h0 = torch.randn(14, 16, generator=g), torch.randn(14, 16, generator=g)
    lm_head = torch.randn(200, 16, generator=g) * 0.5
    y = torch.randint(0, 200, (14,), generator=g)
    want = sfl.sar_from_logits_reference(hq @ lm_head.T, h0 @ lm_head.T, y, CU)
    torch.testing.assert_close(sar.sar_from_hidden(hq, h0, lm_head, y, CU), want, atol=2e-5, rtol=1e-4)


def test_errors_name_the_problem():
    xq, x0, y = _case(4, 10, torch.float32)
    with pytest.raises(ValueError, match="same rows"):
        sfl.sar_from_logits(xq, x0[:3], y, torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="spans rows"):
        sfl.sar_from_logits(xq, x0, y, torch.tensor([0, 9]))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(40, 128256), (3000, 32000)])
@pytest.mark.parametrize("fused", [True, False])
def test_cuda_matches_reference(dtype, shape, fused):
    t, v = shape
    xq, x0, y = _case(t, v, dtype)
    cu = torch.tensor([1, 1, 2, t // 2, t // 2, t - 1, t - 1])
    xq, x0, y, cu = xq.cuda(), x0.cuda(), y.cuda(), cu.cuda()
    got = sfl.sar_from_logits_triton(xq, x0, y, cu, fused=fused)
    want = sfl.sar_from_logits_reference(xq, x0, y, cu)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    for _ in range(3):
        assert torch.equal(got, sfl.sar_from_logits_triton(xq, x0, y, cu, fused=fused))


# Launch settings small enough that every loop runs several tiles plus a tail: V = 517 over
# BLOCK_V (5 tiles, the last of 5 logits), over SPLIT vocabulary slices, and each answer's rows
# (up to 7; BLOCK_R a power of two) over BLOCK_R when its SAR is combined; fused (counters) and two-kernel forms.
SAR_TILINGS = {
    "v-tiles5-r-tiles4": dict(block_v=128, split=1, block_r=2),
    "v-slices3-r-tiles2": dict(block_v=64, split=3, block_r=4),
}


@pytest.mark.skipif(not INTERP, reason="needs the Triton interpreter")
@pytest.mark.parametrize("fused", [True, False], ids=["one-launch", "two-kernels"])
@pytest.mark.parametrize("config", SAR_TILINGS.values(), ids=SAR_TILINGS.keys())
def test_every_loop_runs_several_tiles(config, fused):
    xq, x0, y = _case(14, 517, torch.bfloat16, seed=5)
    got = sfl.sar_from_logits_triton(xq, x0, y, CU, fused=fused, **config)
    torch.testing.assert_close(got.double(), _hand(xq.float(), x0.float(), y, CU), atol=2e-5, rtol=1e-4)
