"""``swift_reduce``: reference against hand float64, fast paths against the reference."""

import importlib
import math

import pytest
import torch

from swift_fast.kernels._dispatch import HAVE_TRITON, interpreting, native_module

# the package exports the function under the module's name: fetch the module itself
sr = importlib.import_module("swift_fast.kernels.swift_reduce")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # interpreter: numpy inf/NaN
CUDA = torch.cuda.is_available()
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _fast_backends():
    out = []
    if HAVE_TRITON and interpreting():
        out.append("triton")
    if native_module() is not None:
        out.append("native")
    return out


def _hand(layers, weight, bias, cu, gains=None, eps=None):
    """Float64 ``(score, gate_sum, weighted_sum)`` by explicit loops (SWIFT Eq. 2-4). With ``eps``,
    every state is normalised explicitly first, ``g_l * h / sqrt(mean(h^2) + eps)`` (``h`` the
    stored stream: the pair summed in its dtype; ``gains[l]`` the norm's gain ``g_l``), and
    ``weight`` is the *unfolded* one."""
    rows = weight.shape[0]
    d = weight.shape[1] // len(layers)
    out = []
    for b in range(len(cu) - 1):
        gs = ws = 0.0
        for t in range(int(cu[b]), int(cu[b + 1])):
            z = [float(bias[j]) for j in range(rows)]
            for li, layer in enumerate(layers):
                x = layer[0][t] + layer[1][t] if isinstance(layer, tuple) else layer[t]
                x = x.double().tolist()
                if eps is not None:
                    rms = math.sqrt(sum(v * v for v in x) / d + eps)
                    x = [float(gains[li][i]) * x[i] / rms for i in range(d)]
                for j in range(rows):
                    z[j] += sum(x[i] * float(weight[j, li * d + i]) for i in range(d))
            g, r = (1.0 / (1.0 + math.exp(-z[0])), z[1]) if rows == 2 else (1.0, z[0])
            gs += g
            ws += g * r
        out.append((ws / max(gs, 1e-8), gs, ws))
    return torch.tensor(out, dtype=torch.float64).reshape(-1, 3).T


def _case(dtype, rows=2, t=29, d=37, k=5, pairs=(0, 2), strided=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    layers = []
    for i in range(k):
        if strided:  # each state is a column slice of a wider buffer
            h = torch.randn(t, d + 5, generator=g).to(dtype)[:, 2 : 2 + d]
        else:
            h = torch.randn(t, d, generator=g).to(dtype)
        layers.append((h, torch.randn(t, d, generator=g).to(dtype)) if i in pairs else h)
    weight = torch.randn(rows, k * d, generator=g) * 0.1
    bias = torch.randn(rows, generator=g)
    return layers, weight, bias


# empty (leading, middle, trailing), single-token and longer segments, tokens outside cu
CU = torch.tensor([1, 1, 2, 9, 9, 10, 27, 27])


@pytest.mark.parametrize("rows", [2, 1])
def test_reference_matches_hand_float64(rows):
    layers, weight, bias = _case(torch.float32, rows=rows, t=12, d=6, k=3, pairs=(1,))
    cu = torch.tensor([0, 0, 1, 5, 12])
    got = torch.stack(sr.swift_reduce_reference(layers, weight, bias, cu)).double()
    torch.testing.assert_close(got, _hand(layers, weight, bias, cu), rtol=1e-5, atol=1e-5)
    assert got[0, 0] == 0 and got[1, 0] == 0  # empty segment scores 0


@pytest.mark.parametrize("backend", _fast_backends())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 1])
def test_fast_matches_reference(backend, dtype, rows):
    layers, weight, bias = _case(dtype, rows=rows)
    want = sr.swift_reduce_reference(layers, weight, bias, CU)
    got = sr.swift_reduce(layers, weight, bias, CU, backend=backend)
    for a, b in zip(got, want):
        assert a.dtype == torch.float32 and a.shape == (7,)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
    hand = _hand(layers, weight, bias, CU)
    torch.testing.assert_close(torch.stack(got).double(), hand, rtol=TOL[dtype], atol=TOL[dtype])
    assert got[0][[0, 3, 6]].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("backend", _fast_backends())
def test_bit_identical_runs_and_nan_policy(backend):
    layers, weight, bias = _case(torch.bfloat16, k=2, pairs=(1,))
    first = sr.swift_reduce(layers, weight, bias, CU, backend=backend)
    again = sr.swift_reduce(layers, weight, bias, CU, backend=backend)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    layers[0][12, 3] = float("nan")  # token 12 is in segment 5 = [10, 27)
    layers[0][0, 0] = float("nan")  # token 0 is outside every segment: never read
    got = sr.swift_reduce(layers, weight, bias, CU, backend=backend)
    for a, b in zip(got, first):
        assert torch.isnan(a[5])
        keep = [0, 1, 2, 3, 4, 6]
        assert torch.equal(a[keep], b[keep])


@pytest.mark.parametrize("backend", _fast_backends())
def test_extreme_values(backend):
    layers, weight, bias = _case(torch.float32, k=1, pairs=(), t=8, d=5)
    layers[0][:4] = 1e4  # gate saturates at 0 or 1, nothing overflows to NaN
    cu = torch.tensor([0, 4, 8])
    got = sr.swift_reduce(layers, weight, bias, cu, backend=backend)
    want = sr.swift_reduce_reference(layers, weight, bias, cu)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-3)


@pytest.mark.skipif(not (HAVE_TRITON and interpreting()), reason="needs the Triton interpreter")
def test_segment_split_and_millions_of_tokens():
    # one huge segment spread over SPLIT programs, int64 offsets, empty and tiny ones beside it
    t = 2_100_000
    g = torch.Generator().manual_seed(7)
    z = torch.randn(t, 2, generator=g)
    bias = torch.tensor([0.25, -0.5])
    cu = torch.tensor([0, 0, 3, t - 1, t - 1, t])
    got = sr.segment_reduce_triton(z, bias, cu, gate=True)
    g_, r_ = sr.gate_and_reward(z + bias, True)
    gsum = torch.stack([g_[a:b].double().sum() for a, b in zip(cu[:-1], cu[1:])])
    wsum = torch.stack([(g_ * r_)[a:b].double().sum() for a, b in zip(cu[:-1], cu[1:])])
    torch.testing.assert_close(got[1].double(), gsum, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(got[2].double(), wsum, rtol=1e-4, atol=1e-2)
    assert sr._split_for(t, 5) > 1


@pytest.mark.skipif(not (HAVE_TRITON and interpreting()), reason="needs the Triton interpreter")
def test_projection_large_token_count():
    # rows * stride past 2**31 elements is exercised by int64 row offsets; here 3M rows x d=1
    t = 3_000_000
    h = torch.randn(t, 1)
    w = torch.tensor([[0.5], [-2.0]])
    z = torch.empty(t, 2)
    sr.project_triton([(h, None)], w, z, accumulate=False, block_t=1 << 16, block_d=1)
    torch.testing.assert_close(z, h @ w.T)


def test_swift_score_uses_the_backends():
    from swift_fast.rewards.head import SwiftHead
    from swift_fast.rewards.scoring import swift_score

    layers, _, _ = _case(torch.bfloat16, k=3, pairs=(1,))
    head = SwiftHead(37, layers=[0, 4, 8])
    with torch.no_grad():
        head.bias.copy_(torch.tensor([0.3, -0.1]))
    want = sr.swift_reduce_reference(layers, head.weight.detach(), head.bias.detach(), CU)[0]
    for backend in ["torch", "auto"] + _fast_backends():
        got = swift_score(layers, head, CU, backend=backend)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_errors_name_the_problem():
    layers, weight, bias = _case(torch.float32, k=2, pairs=())
    with pytest.raises(ValueError, match="non-decreasing"):
        sr.swift_reduce(layers, weight, bias, torch.tensor([0, 5, 3]), backend="torch")
    with pytest.raises(ValueError, match="multiple of"):
        sr.swift_reduce(layers, weight[:, :-1], bias, CU, backend="triton" if _fast_backends() else "torch")
    with pytest.raises(ValueError, match="backend"):
        sr.swift_reduce(layers, weight, bias, CU, backend="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 1])
def test_cuda_matches_reference(dtype, rows):
    layers, weight, bias = _case(dtype, rows=rows, t=3000, d=4096 + 7, k=6)
    layers = [tuple(x.cuda() for x in layer) if isinstance(layer, tuple) else layer.cuda() for layer in layers]
    cu = torch.tensor([0, 0, 1, 700, 700, 2999, 3000]).cuda()
    weight, bias = weight.cuda(), bias.cuda()
    want = sr.swift_reduce_reference(layers, weight, bias, cu)
    got = sr.swift_reduce(layers, weight, bias, cu)
    again = sr.swift_reduce(layers, weight, bias, cu)
    for a, b, c in zip(got, want, again):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)
        assert torch.equal(a, c)


# Launch settings small enough that every loop of the Triton path runs several tiles plus a
# tail: the hidden size over BLOCK_D (d = 37), layers over LAYERS_PER_LAUNCH (nine layers of two
# kinds: launches of 4 + 1 pairs and 4 plain states), a segment's tokens over BLOCK within each of
# SPLIT slices (the longest segment, 17 tokens), segments over BLOCK_B (7 segments).
TILINGS = {
    "d-tiles5-t-programs8-seg-blocks3-b-programs4": dict(block_t=4, block_d=8, split=2, block=4, block_b=2),
    "d-tiles3-t-programs3-seg-slices4-b-programs2": dict(block_t=16, block_d=16, split=4, block=2, block_b=4),
}


@pytest.mark.skipif(not (HAVE_TRITON and interpreting()), reason="needs the Triton interpreter")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("config", TILINGS.values(), ids=TILINGS.keys())
def test_every_loop_runs_several_tiles(config, dtype):
    layers, weight, bias = _case(dtype, t=29, d=37, k=9, pairs=(0, 1, 2, 3, 4))
    got = sr.swift_reduce_triton(layers, weight, bias, CU, **config)
    want = sr.swift_reduce_reference(layers, weight, bias, CU)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(torch.stack(got).double(), _hand(layers, weight, bias, CU), rtol=TOL[dtype],
                               atol=TOL[dtype])


# ----------------------------------------------------------------------------------------------
# state norm (``norm_eps``): each layer's partial projection scaled by the token's
# rsqrt(mean(h^2) + eps) for that layer, i.e. the head applied to RMSNorm-ed states with the
# norm's gain folded into the weight


def _hand_norm(layers, w, gains, eps, bias, cu):
    """:func:`_hand` over RMSNorm-ed states (the unfolded weight ``w``, the gains, ``eps``)."""
    return _hand(layers, w, bias, cu, gains=gains, eps=eps)


def _norm_case(dtype, rows=2, t=29, d=37, k=5, pairs=(0, 2), seed=0):
    """States whose rms varies per token and per layer over ~3 decades (so a missing, per-layer or
    per-column scale shows), gains ``g_l`` around 1, the unfolded weight ``w`` and the folded
    ``g * w`` a head with a state norm stores."""
    g = torch.Generator().manual_seed(seed)
    layers, gains = [], []
    for i in range(k):
        scale = torch.exp(torch.empty(t, 1).uniform_(-2.5, 3.0, generator=g))
        h = (torch.randn(t, d + 5, generator=g) * scale).to(dtype)[:, 2 : 2 + d]  # strided
        if i in pairs:
            h = (h, (torch.randn(t, d, generator=g) * scale.flip(0)).to(dtype))
        layers.append(h)
        gains.append(0.5 + torch.rand(d, generator=g))
    w = torch.randn(rows, k * d, generator=g) * 0.3
    bias = torch.randn(rows, generator=g)
    return layers, w, gains, w * torch.cat(gains)[None, :], bias


#: (t, d, k, cu): one token and width 1, two tokens, longer segments with empty ones and a token
#: outside every segment
NORM_SHAPES = {
    "t1-d1-k1": (1, 1, 1, torch.tensor([0, 0, 1])),
    "t2-d5-k2": (2, 5, 2, torch.tensor([0, 1, 2])),
    "t12-d6-k3": (12, 6, 3, torch.tensor([0, 0, 1, 5, 11])),
}


@pytest.mark.parametrize("shape", NORM_SHAPES.values(), ids=NORM_SHAPES.keys())
@pytest.mark.parametrize("eps", [1e-6, 0.0, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 1])
@pytest.mark.parametrize("paired", [False, True], ids=["plain", "pairs"])
def test_norm_reference_matches_hand_float64(paired, rows, dtype, eps, shape):
    t, d, k, cu = shape
    layers, w, gains, folded, bias = _norm_case(dtype, rows=rows, t=t, d=d, k=k, pairs=(0,) if paired else ())
    got = torch.stack(sr.swift_reduce_reference(layers, folded, bias, cu, norm_eps=eps)).double()
    want = _hand_norm(layers, w, gains, eps, bias, cu)
    # float32 arithmetic over float64: the inputs are the stored values, whatever their dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if d > 1:  # the data really exercises the norm: without it the scores are far off
        plain = torch.stack(sr.swift_reduce_reference(layers, folded, bias, cu)).double()
        assert not torch.allclose(plain[0], want[0], rtol=0.05, atol=0.05)


@pytest.mark.parametrize("backend", _fast_backends())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 1])
@pytest.mark.parametrize("pairs", [(0, 2), ()], ids=["pairs", "plain"])
@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_norm_fast_matches_reference(backend, dtype, rows, pairs, eps):
    layers, w, gains, folded, bias = _norm_case(dtype, rows=rows, pairs=pairs)
    want = sr.swift_reduce_reference(layers, folded, bias, CU, norm_eps=eps)
    got = sr.swift_reduce(layers, folded, bias, CU, backend=backend, norm_eps=eps)
    for a, b in zip(got, want):
        assert a.dtype == torch.float32 and a.shape == (7,)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
    hand = _hand_norm(layers, w, gains, eps, bias, CU)
    torch.testing.assert_close(torch.stack(got).double(), hand, rtol=1e-5, atol=1e-4)
    assert got[0][[0, 3, 6]].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("backend", _fast_backends())
@pytest.mark.parametrize("shape", NORM_SHAPES.values(), ids=NORM_SHAPES.keys())
def test_norm_fast_small_shapes(backend, shape):
    t, d, k, cu = shape
    layers, w, gains, folded, bias = _norm_case(torch.bfloat16, t=t, d=d, k=k, pairs=(0,))
    got = sr.swift_reduce(layers, folded, bias, cu, backend=backend, norm_eps=1e-6)
    want = sr.swift_reduce_reference(layers, folded, bias, cu, norm_eps=1e-6)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.stack(got).double(), _hand_norm(layers, w, gains, 1e-6, bias, cu),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", _fast_backends())
def test_norm_bit_identical_runs_and_nan_policy(backend):
    layers, _, _, folded, bias = _norm_case(torch.bfloat16, k=2, pairs=(1,))
    first = sr.swift_reduce(layers, folded, bias, CU, backend=backend, norm_eps=1e-6)
    again = sr.swift_reduce(layers, folded, bias, CU, backend=backend, norm_eps=1e-6)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    layers[0][12, 3] = float("nan")  # poisons token 12's rms: its segment 5 only
    layers[0][0, 0] = float("nan")  # outside every segment: never read
    got = sr.swift_reduce(layers, folded, bias, CU, backend=backend, norm_eps=1e-6)
    for a, b in zip(got, first):
        assert torch.isnan(a[5])
        keep = [0, 1, 2, 3, 4, 6]
        assert torch.equal(a[keep], b[keep])


@pytest.mark.skipif(not (HAVE_TRITON and interpreting()), reason="needs the Triton interpreter")
@pytest.mark.parametrize("config", TILINGS.values(), ids=TILINGS.keys())
def test_norm_every_loop_runs_several_tiles(config):
    # the sum of squares runs over several d tiles, four layers a launch, then a second launch
    layers, w, gains, folded, bias = _norm_case(torch.bfloat16, t=29, d=37, k=9, pairs=(0, 1, 2, 3, 4))
    got = sr.swift_reduce_triton(layers, folded, bias, CU, norm_eps=1e-5, **config)
    want = sr.swift_reduce_reference(layers, folded, bias, CU, norm_eps=1e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(torch.stack(got).double(), _hand_norm(layers, w, gains, 1e-5, bias, CU),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("backend", ["torch"] + _fast_backends())
@pytest.mark.parametrize("eps", [-1e-6, float("nan"), float("inf")])
def test_norm_eps_must_be_finite_and_not_negative(backend, eps):
    layers, _, _, folded, bias = _norm_case(torch.float32, k=2, pairs=())
    with pytest.raises(ValueError, match="norm_eps must be None or a finite float >= 0"):
        sr.swift_reduce(layers, folded, bias, CU, backend=backend, norm_eps=eps)


def test_swift_score_applies_the_heads_state_norm():
    from swift_fast.rewards.head import SwiftHead
    from swift_fast.rewards.scoring import swift_score, token_scores

    layers, w, gains, folded, bias = _norm_case(torch.bfloat16, k=3, pairs=(1,))
    head = SwiftHead(37, layers=[0, 4, 8], norm_eps=1e-5)
    with torch.no_grad():
        head.weight.copy_(folded)
        head.bias.copy_(bias)
    want = _hand_norm(layers, w, gains, 1e-5, bias, CU)
    for backend in ["torch", "auto"] + _fast_backends():
        got = swift_score(layers, head, CU, backend=backend)
        torch.testing.assert_close(got.double(), want[0], rtol=1e-5, atol=1e-4)
    # per token: one segment per token of CU's span, so the hand sums are the token values
    g, r = token_scores(layers, head)
    each = torch.arange(int(CU[0]), int(CU[-1]) + 1)
    hand = _hand_norm(layers, w, gains, 1e-5, bias, each)
    span = slice(int(CU[0]), int(CU[-1]))
    torch.testing.assert_close(g[span].double(), hand[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((g * r)[span].double(), hand[2], rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 1])
def test_norm_cuda_matches_reference(dtype, rows):
    layers, _, _, folded, bias = _norm_case(dtype, rows=rows, t=3000, d=4096 + 7, k=6)
    layers = [tuple(x.cuda() for x in layer) if isinstance(layer, tuple) else layer.cuda() for layer in layers]
    cu = torch.tensor([0, 0, 1, 700, 700, 2999, 3000]).cuda()
    folded, bias = folded.cuda(), bias.cuda()
    want = sr.swift_reduce_reference(layers, folded, bias, cu, norm_eps=1e-6)
    got = sr.swift_reduce(layers, folded, bias, cu, norm_eps=1e-6)
    again = sr.swift_reduce(layers, folded, bias, cu, norm_eps=1e-6)
    for a, b, c in zip(got, want, again):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)
        assert torch.equal(a, c)
