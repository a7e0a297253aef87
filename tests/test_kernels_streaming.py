"""Streaming SWIFT custom ops: ``project_layer_`` and ``finish_`` (CPU, interpreter, CUDA)."""

import math

import pytest
import torch

from swift_fast.kernels import streaming as st
from swift_fast.kernels._dispatch import HAVE_TRITON, interpreting

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # interpreter: numpy inf/NaN
CUDA = torch.cuda.is_available()


def _hand_state(layers, weight, bias, slots, n_slots, norm=None):
    """Float64 state by explicit loops over tokens, layers and features (SWIFT Eq. 2-4).

    ``norm = (eps, gains)``: each state is first normalised explicitly, ``gains[l] * x /
    sqrt(mean(x^2) + eps)`` (the model's RMSNorm), and ``weight`` is the *unfolded* head weight.
    """
    rows = weight.shape[0]
    t_count, d = layers[0][0].shape
    state = [[0.0, 0.0, 0.0] for _ in range(n_slots)]
    for t in range(t_count):
        s = int(slots[t])
        if not 0 <= s < n_slots:
            continue
        z = [float(bias[j]) for j in range(rows)]
        for li, (h, r) in enumerate(layers):
            # the residual stream is the pair's sum in the input dtype, as the engine stores it
            x = h[t] if r is None else (h[t] + r[t])
            x = x.double().tolist()
            if norm is not None:
                eps, gains = norm
                rms = math.sqrt(sum(v * v for v in x) / d + eps)
                x = [float(gains[li][i]) * x[i] / rms for i in range(d)]
            for j in range(rows):
                z[j] += sum(x[i] * float(weight[j, li * d + i]) for i in range(d))
        if rows == 2:
            g, rew = 1.0 / (1.0 + math.exp(-z[0])), z[1]
        else:
            g, rew = 1.0, z[0]
        state[s][0] += g * rew
        state[s][1] += g
        state[s][2] += 1.0
    return torch.tensor(state, dtype=torch.float64)


TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 1])
def test_reference_matches_hand_float64(dtype, rows):
    g = torch.Generator().manual_seed(1)
    t, d, k = 6, 9, 2
    layers = [
        (torch.randn(t, d, generator=g).to(dtype), torch.randn(t, d, generator=g).to(dtype)),
        (torch.randn(t, d, generator=g).to(dtype), None),
    ]
    weight = torch.randn(rows, k * d, generator=g) * 0.3
    bias = torch.randn(rows, generator=g)
    slots = torch.tensor([2, 2, -1, 0, 5, 2])
    acc, state = st.new_buffers(8, 4)
    for li, (h, r) in enumerate(layers):
        st.project_layer_reference(acc, h, r, weight[:, li * d : (li + 1) * d])
    st.finish_reference(acc, bias, slots, state)
    want = _hand_state(layers, weight, bias, slots, 4)
    torch.testing.assert_close(state.double(), want, rtol=1e-5, atol=1e-5)
    assert acc.abs().sum() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 1])
def test_ops_match_reference(cpu_backend, dtype, rows):
    g = torch.Generator().manual_seed(2)
    t, d, n_layers = 11, 37, 3
    # strided: hidden states are column slices of a wider buffer (row stride 2*d + 3)
    big = torch.randn(n_layers, t, 2 * d + 3, generator=g).to(dtype)
    hs = [big[i, :, 3 : 3 + d] for i in range(n_layers)]
    rs = [torch.randn(t, d, generator=g).to(dtype) if i != 1 else None for i in range(n_layers)]
    weight = torch.randn(rows, n_layers * d, generator=g) * 0.2
    bias = torch.randn(rows, generator=g)
    # duplicates in a run (prefill chunk), a non-contiguous repeat, unscored and out-of-range slots
    slots = torch.tensor([4, 4, 4, -1, 0, 1, 1, 4, 9, -1, 2], dtype=torch.int32)
    ref_acc, ref_state = st.new_buffers(16, 6)
    ref_state += torch.arange(18.0).view(6, 3)  # earlier steps already accumulated
    acc, state = ref_acc.clone(), ref_state.clone()
    for i in range(n_layers):
        w_l = weight[:, i * d : (i + 1) * d]
        st.project_layer_reference(ref_acc, hs[i], rs[i], w_l)
        st.project_layer_(acc, hs[i], rs[i], w_l)
    torch.testing.assert_close(acc, ref_acc, rtol=1e-5, atol=1e-4)
    st.finish_reference(ref_acc, bias, slots, ref_state)
    st.finish_(acc, bias, slots, state)
    torch.testing.assert_close(state, ref_state, rtol=1e-5, atol=1e-4)
    want = _hand_state(list(zip(hs, rs)), weight, bias, slots, 6) + torch.arange(18.0).view(6, 3).double()
    torch.testing.assert_close(state.double(), want, rtol=TOL[dtype], atol=TOL[dtype])
    assert acc.abs().sum() == 0
    assert state[3].tolist() == [9.0, 10.0, 11.0] and state[5].tolist() == [15.0, 16.0, 17.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pair_sum_rounds_like_the_engine(cpu_backend, dtype):
    # every 16-bit pattern (normal, subnormal, inf, NaN) plus a residual of every magnitude:
    # the projected stream must equal torch's add in that dtype, bit for bit
    h = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    g = torch.Generator().manual_seed(8)
    r = (torch.randn(65536, generator=g) * torch.logspace(-8, 5, 65536)).to(dtype)
    if cpu_backend == "triton":  # the interpreter is slow: every 16th pattern
        h, r = h[::16], r[::16]
    acc = torch.zeros(h.numel(), 2)
    if cpu_backend == "triton":
        from swift_fast.kernels.swift_reduce import project_triton

        project_triton([(h[:, None], r[:, None])], torch.ones(1, 1), acc, accumulate=True, block_t=4096, block_d=1)
    else:
        st.project_layer_(acc, h[:, None], r[:, None], torch.ones(1, 1))
    want = (h + r).float()
    same = (acc[:, 0] == want) | (torch.isnan(acc[:, 0]) & torch.isnan(want))
    assert bool(same.all()), f"{int((~same).sum())} sums differ from torch's {dtype} add"


def test_finish_nan_stays_in_its_slot(cpu_backend):
    acc, state = st.new_buffers(6, 3)
    acc[:4] = torch.tensor([[0.1, 1.0], [float("nan"), 2.0], [0.3, 3.0], [float("nan"), 0.0]])
    st.finish_(acc, torch.zeros(2), torch.tensor([0, 1, 2, -1]), state)
    assert torch.isnan(state[1, :2]).all() and state[1, 2] == 1
    assert torch.isfinite(state[[0, 2]]).all()
    assert torch.isfinite(acc).all() and acc.abs().sum() == 0


def test_finish_is_bit_stable(cpu_backend):
    g = torch.Generator().manual_seed(3)
    acc0 = torch.randn(300, 2, generator=g) * 5
    slots = torch.randint(-1, 7, (300,), generator=g)
    runs = []
    for _ in range(2):
        acc, state = acc0.clone(), torch.zeros(7, 3)
        st.finish_(acc, torch.tensor([0.5, -0.2]), slots, state)
        runs.append(state)
    assert torch.equal(runs[0], runs[1])


def test_bad_shapes_say_what_is_wrong():
    acc, state = st.new_buffers(4, 2)
    with pytest.raises(ValueError, match="do not fit acc"):
        st.project_layer_(acc, torch.randn(5, 3), None, torch.randn(2, 3))
    with pytest.raises(ValueError, match="weight_l"):
        st.project_layer_(acc, torch.randn(2, 3), None, torch.randn(2, 4))
    with pytest.raises(ValueError, match="state"):
        st.finish_(acc, torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.zeros(2, 2))


class _Scorer(torch.nn.Module):
    """A model stand-in: computes layers, projects each at once, finishes the step; ``norm_eps`` a
    plain float attribute (a head's state norm), as the vLLM hooks keep it."""

    def __init__(self, weight, bias, n_layers, d, max_tokens, max_slots, norm_eps=None):
        super().__init__()
        self.n_layers, self.d, self.norm_eps = n_layers, d, norm_eps
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        acc, state = st.new_buffers(max_tokens, max_slots)
        self.register_buffer("acc", acc)
        self.register_buffer("state", state)
        self.mix = torch.nn.Linear(d, d)

    def forward(self, x, slots):
        residual = x
        for i in range(self.n_layers):
            hidden = torch.tanh(self.mix(x)) * (i + 1) ** 3  # the layers' rms differ
            st.project_layer_(self.acc, hidden, residual, self.weight[:, i * self.d : (i + 1) * self.d], self.norm_eps)
            x = hidden + residual
            residual = x
        st.finish_(self.acc, self.bias, slots, self.state)
        return x


def _steps(module, steps):
    for x, slots in steps:
        module(x, slots)
    return module.state.clone()


@pytest.mark.parametrize("norm_eps", [None, 1e-5], ids=["plain", "state-norm"])
def test_custom_ops_under_torch_compile_cpu(cpu_backend, norm_eps):
    if cpu_backend == "triton":
        pytest.skip("compiled graph is backend-independent; one CPU backend is enough")
    torch.manual_seed(4)
    d, n_layers = 16, 3
    weight, bias = torch.randn(2, n_layers * d) * 0.3, torch.randn(2)
    steps = [(torch.randn(5, d), torch.tensor([0, 0, 1, -1, 2])) for _ in range(3)]
    eager = _Scorer(weight, bias, n_layers, d, 8, 4, norm_eps=norm_eps)
    compiled = _Scorer(weight, bias, n_layers, d, 8, 4, norm_eps=norm_eps)
    compiled.load_state_dict(eager.state_dict())
    want = _steps(eager, steps)
    fn = torch.compile(compiled, fullgraph=True)
    got = _steps(fn, steps)
    assert want[:, 2].tolist() == [6.0, 3.0, 3.0, 0.0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert compiled.acc.abs().sum() == 0
    if norm_eps is not None:
        # the eps reached the compiled op: without the norm the sums differ
        plain = _Scorer(weight, bias, n_layers, d, 8, 4)
        plain.load_state_dict(eager.state_dict())
        assert not torch.allclose(_steps(plain, steps)[:, 0], want[:, 0], rtol=0.05, atol=0.05)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_reference_and_graph_replay(dtype):
    torch.manual_seed(5)
    d, n_layers, t = 1000, 3, 37
    weight, bias = (torch.randn(2, n_layers * d) * 0.05).cuda(), torch.randn(2).cuda()
    hs = [torch.randn(t, d, device="cuda").to(dtype) for _ in range(n_layers)]
    rs = [torch.randn(t, d, device="cuda").to(dtype) for _ in range(n_layers)]
    slots = torch.tensor([3] * 20 + [-1] * 2 + [0] * 15, device="cuda", dtype=torch.int32)
    acc, state = st.new_buffers(64, 8, device="cuda")
    ref_acc, ref_state = acc.clone(), state.clone()

    def step(a, s, project, finish):
        for i in range(n_layers):
            project(a, hs[i], rs[i], weight[:, i * d : (i + 1) * d])
        finish(a, bias, slots, s)

    step(ref_acc, ref_state, st.project_layer_reference, st.finish_reference)
    step(acc, state, st.project_layer_, st.finish_)
    torch.testing.assert_close(state, ref_state, rtol=1e-4, atol=1e-3)
    # capture one step in a CUDA graph, replay it twice: state doubles
    state.zero_()
    graph_stream = torch.cuda.Stream()
    graph_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(graph_stream):
        step(acc, state, st.project_layer_, st.finish_)  # warm-up compiles the kernels
    torch.cuda.current_stream().wait_stream(graph_stream)
    torch.cuda.synchronize()
    once = state.clone()
    state.zero_()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step(acc, state, st.project_layer_, st.finish_)
    state.zero_()
    g.replay()
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(state, 2 * once, rtol=1e-6, atol=1e-6)
    assert acc.abs().sum().item() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 37, 9000])
def test_norm_cuda_matches_reference(dtype, t):
    # t picks each row of PROJECT_TILES
    torch.manual_seed(19)
    d, n_layers, eps = 1000, 3, 1e-6
    weight = (torch.randn(2, n_layers * d) * 0.05).cuda()
    scale = torch.exp(torch.empty(t, 1).uniform_(-2.5, 3.0)).cuda()
    hs = [(torch.randn(t, d, device="cuda") * scale).to(dtype) for _ in range(n_layers)]
    rs = [(torch.randn(t, d, device="cuda") * scale).to(dtype) for _ in range(n_layers)]
    acc, ref = torch.zeros(t, 2, device="cuda"), torch.zeros(t, 2, device="cuda")
    for i in range(n_layers):
        st.project_layer_(acc, hs[i], rs[i], weight[:, i * d : (i + 1) * d], eps)
        st.project_layer_reference(ref, hs[i], rs[i], weight[:, i * d : (i + 1) * d], eps)
    torch.testing.assert_close(acc, ref, rtol=1e-4, atol=1e-4)


# Launch settings small enough that every loop runs several tiles plus a tail: d = 37 over
# BLOCK_D = 8 (four tiles and a tail of 5), 11 tokens over BLOCK_T = 4 (programs and, in
# ``finish_``, loop tiles 4 + 4 + 3), 6 slots over BLOCK_S = 4 (two slot programs, one partial).
STREAM_TILINGS = {
    "project-t-programs3-d-tiles5": dict(tiles=(4, 8)),
    "project-t-programs11-d-tiles3": dict(tiles=(1, 16)),
}
FINISH_TILINGS = {
    "finish-slot-programs2-t-tiles3": dict(block_s=4, block_t=4),
    "finish-slot-programs6-t-tiles6": dict(block_s=1, block_t=2),
}


@pytest.mark.skipif(not (HAVE_TRITON and interpreting()), reason="needs the Triton interpreter")
@pytest.mark.parametrize("rows", [2, 1], ids=["gate", "no-gate"])
@pytest.mark.parametrize("finish", FINISH_TILINGS.values(), ids=FINISH_TILINGS.keys())
@pytest.mark.parametrize("project", STREAM_TILINGS.values(), ids=STREAM_TILINGS.keys())
def test_every_loop_runs_several_tiles(project, finish, rows):
    g = torch.Generator().manual_seed(9)
    t, d, n_layers = 11, 37, 2
    hs = [torch.randn(t, d, generator=g).to(torch.bfloat16) for _ in range(n_layers)]
    rs = [torch.randn(t, d, generator=g).to(torch.bfloat16), None]
    weight = torch.randn(rows, n_layers * d, generator=g) * 0.2
    bias = torch.randn(rows, generator=g)
    slots = torch.tensor([4, 4, 4, -1, 0, 1, 1, 4, 9, -1, 5], dtype=torch.int32)
    acc, state = st.new_buffers(16, 6)
    for i in range(n_layers):
        st.project_layer_triton(acc, hs[i], rs[i], weight[:, i * d : (i + 1) * d], **project)
    st.finish_triton(acc, bias, slots, state, **finish)
    want = _hand_state(list(zip(hs, rs)), weight, bias, slots, 6)
    torch.testing.assert_close(state.double(), want, rtol=TOL[torch.bfloat16], atol=TOL[torch.bfloat16])
    assert acc.abs().sum() == 0 and state[3].tolist() == [0.0, 0.0, 0.0]


# ----------------------------------------------------------------------------------------------
# state norm: ``project_layer_(..., norm_eps)`` scales each token's partial projection by
# rsqrt(mean(stream^2) + norm_eps); the head's weight holds the norm's gain folded in


def _norm_layers(dtype, t, d, n_layers, paired, seed, strided=True):
    """States whose rms varies per token and per layer over ~3 decades, residuals on every other
    layer (``paired``), gains around 1, an unfolded weight and the folded ``g * w``."""
    g = torch.Generator().manual_seed(seed)
    hs, rs, gains = [], [], []
    for i in range(n_layers):
        scale = torch.exp(torch.empty(t, 1).uniform_(-2.5, 3.0, generator=g))
        wide = torch.randn(t, 2 * d + 3, generator=g) * scale
        hs.append((wide[:, 3 : 3 + d] if strided else wide[:, :d].contiguous()).to(dtype))
        rs.append((torch.randn(t, d, generator=g) * scale.flip(0)).to(dtype) if paired and i % 2 == 0 else None)
        gains.append(0.5 + torch.rand(d, generator=g))
    return hs, rs, gains


NORM_SHAPES = {"t1-d1": (1, 1), "t2-d5": (2, 5), "t11-d37": (11, 37)}


@pytest.mark.parametrize("shape", NORM_SHAPES.values(), ids=NORM_SHAPES.keys())
@pytest.mark.parametrize("eps", [1e-6, 0.0, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 1])
@pytest.mark.parametrize("paired", [True, False], ids=["pairs", "plain"])
def test_norm_reference_matches_hand_float64(paired, rows, dtype, eps, shape):
    t, d = shape
    hs, rs, gains = _norm_layers(dtype, t, d, 2, paired, seed=11)
    g = torch.Generator().manual_seed(12)
    w = torch.randn(rows, 2 * d, generator=g) * 0.3
    folded = w * torch.cat(gains)[None, :]
    bias = torch.randn(rows, generator=g)
    slots = torch.tensor([2, 0, -1, 2, 1, 5, 2, 2, 0, 3, 1][:t])
    acc, state = st.new_buffers(12, 4)
    for i in range(2):
        st.project_layer_reference(acc, hs[i], rs[i], folded[:, i * d : (i + 1) * d], eps)
    st.finish_reference(acc, bias, slots, state)
    want = _hand_state(list(zip(hs, rs)), w, bias, slots, 4, norm=(eps, gains))
    # float32 arithmetic over float64: the inputs are the stored values, whatever their dtype
    torch.testing.assert_close(state.double(), want, rtol=1e-5, atol=1e-5)
    if d > 1:  # the data really exercises the norm
        plain = _hand_state(list(zip(hs, rs)), folded, bias, slots, 4)
        assert not torch.allclose(plain[:, 0], want[:, 0], rtol=0.05, atol=0.05)


@pytest.mark.parametrize("shape", NORM_SHAPES.values(), ids=NORM_SHAPES.keys())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [2, 1])
@pytest.mark.parametrize("paired", [True, False], ids=["pairs", "plain"])
def test_norm_ops_match_reference(cpu_backend, paired, rows, dtype, shape):
    t, d = shape
    n_layers, eps = 3, 1e-5
    hs, rs, gains = _norm_layers(dtype, t, d, n_layers, paired, seed=13)
    g = torch.Generator().manual_seed(14)
    w = torch.randn(rows, n_layers * d, generator=g) * 0.2
    folded = w * torch.cat(gains)[None, :]
    bias = torch.randn(rows, generator=g)
    slots = torch.tensor([4, 4, 4, -1, 0, 1, 1, 4, 9, -1, 2][:t], dtype=torch.int32)
    ref_acc, ref_state = st.new_buffers(16, 6)
    ref_state += torch.arange(18.0).view(6, 3)  # earlier steps already accumulated
    acc, state = ref_acc.clone(), ref_state.clone()
    for i in range(n_layers):
        w_l = folded[:, i * d : (i + 1) * d]
        st.project_layer_reference(ref_acc, hs[i], rs[i], w_l, eps)
        st.project_layer_(acc, hs[i], rs[i], w_l, eps)
    torch.testing.assert_close(acc, ref_acc, rtol=1e-5, atol=1e-4)
    st.finish_reference(ref_acc, bias, slots, ref_state)
    st.finish_(acc, bias, slots, state)
    torch.testing.assert_close(state, ref_state, rtol=1e-5, atol=1e-4)
    want = _hand_state(list(zip(hs, rs)), w, bias, slots, 6, norm=(eps, gains)) + torch.arange(18.0).view(6, 3).double()
    torch.testing.assert_close(state.double(), want, rtol=1e-5, atol=1e-4)


def test_norm_native_takes_what_it_fits(cpu_backend):
    # a residual of another dtype does not fit the native kernel: the reference takes it, with the norm
    hs, _, _ = _norm_layers(torch.bfloat16, 5, 9, 1, False, seed=15)
    r = torch.randn(5, 9, dtype=torch.float32)
    w = torch.randn(2, 9)
    acc, ref = torch.zeros(8, 2), torch.zeros(8, 2)
    st.project_layer_(acc, hs[0], r, w, 0.25)
    st.project_layer_reference(ref, hs[0], r, w, 0.25)
    torch.testing.assert_close(acc, ref, rtol=1e-5, atol=1e-5)
    x = (hs[0] + r).double()
    want = (x @ w.double().T) / torch.sqrt(x.square().mean(-1, keepdim=True) + 0.25)
    torch.testing.assert_close(acc[:5].double(), want, rtol=1e-5, atol=1e-5)


def test_norm_eps_is_checked():
    acc, _ = st.new_buffers(4, 2)
    for bad in (-1e-3, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="norm_eps must be None or a finite float >= 0"):
            st.project_layer_(acc, torch.randn(2, 3), None, torch.randn(2, 3), bad)


@pytest.mark.skipif(not (HAVE_TRITON and interpreting()), reason="needs the Triton interpreter")
@pytest.mark.parametrize("project", STREAM_TILINGS.values(), ids=STREAM_TILINGS.keys())
def test_norm_every_loop_runs_several_tiles(project):
    t, d, n_layers, eps = 11, 37, 2, 1e-6
    hs, rs, gains = _norm_layers(torch.bfloat16, t, d, n_layers, True, seed=16)
    g = torch.Generator().manual_seed(17)
    w = torch.randn(2, n_layers * d, generator=g) * 0.2
    folded = w * torch.cat(gains)[None, :]
    bias = torch.randn(2, generator=g)
    slots = torch.tensor([4, 4, 4, -1, 0, 1, 1, 4, 9, -1, 5], dtype=torch.int32)
    acc, state = st.new_buffers(16, 6)
    for i in range(n_layers):
        st.project_layer_triton(acc, hs[i], rs[i], folded[:, i * d : (i + 1) * d], eps, **project)
    st.finish_triton(acc, bias, slots, state)
    want = _hand_state(list(zip(hs, rs)), w, bias, slots, 6, norm=(eps, gains))
    torch.testing.assert_close(state.double(), want, rtol=1e-5, atol=1e-4)


