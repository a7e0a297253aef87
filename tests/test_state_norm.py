"""Heads with a state norm (``norm_eps``: each selected state RMS-normalised before the head, the
norm's gain folded into the weight) on the library's paths: Hugging Face offline scoring and
generate-time scoring against float64 computed here from ``output_hidden_states`` and the model's
own final norm, the vLLM forward hooks on a stand-in decoder, and training's refusal."""

import pytest
import torch
from hf_fixtures import FAMILIES, tiny_model_dir

from swift_fast.rewards.head import HeadError, SwiftHead

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # interpreter: numpy inf/NaN


def _load(path, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    # a final norm with a non-trivial gain (the tiny models' is all ones): folding it must matter
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        model.model.norm.weight.copy_(0.5 + torch.rand(model.config.hidden_size, generator=g))
    return model, AutoTokenizer.from_pretrained(path)


def _norm_head(model, layers, alignment, gate=True, seed=0):
    """``(head, w)``: a head whose weight is ``g * w`` (``g`` the final norm's weight, per state)
    and ``norm_eps`` the norm's epsilon, and the unfolded float64 ``w``."""
    norm = model.model.norm
    d = model.config.hidden_size
    rows = 2 if gate else 1
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, len(layers) * d, generator=gen, dtype=torch.float64) * 0.3
    head = SwiftHead(d, layers, gate=gate, alignment=alignment, norm_eps=float(norm.variance_epsilon))
    with torch.no_grad():
        head.weight.copy_(w * norm.weight.detach().double().repeat(len(layers)))
        head.bias.copy_(torch.randn(rows, generator=gen, dtype=torch.float64))
    return head, w


def _sequences(vocab, seed):
    """``(sequences, prompt_lengths)`` of random ids: responses of 6, 11, 1 and 0 tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for p, m in [(5, 6), (3, 11), (9, 1), (4, 0)]:
        out.append(torch.randint(3, vocab, (p + m,), generator=g).tolist())
    return out, [5, 3, 9, 4]


def _hidden_states(model64, seqs):
    """``output_hidden_states`` of each sequence, one float64 forward each."""
    with torch.no_grad():
        return [model64(torch.tensor([s]), output_hidden_states=True).hidden_states for s in seqs]


def _float64_scores(model64, head, w, states, seqs, plens):
    """DESIGN 2 with the SWIFT code's ``--apply_norm``, by hand in float64: from each sequence's
    ``output_hidden_states`` (``states``), apply the model's final norm to each selected state at
    the scored positions, concatenate, multiply by the unfolded ``w``, sigmoid gate, gated mean
    (Eq. 2-4).

    NOTE: transformers' RMSNorm squares and scales in float32 even in a float64 model; that
    rounding (~1e-7 relative) is far below the tolerances used here.
    """
    shift = 1 if head.alignment == "predicting" else 0
    out = []
    with torch.no_grad():
        for hs, s, p in zip(states, seqs, plens):
            if len(s) == p:
                out.append(0.0)
                continue
            pos = torch.arange(p, len(s)) - shift
            h = torch.cat([model64.model.norm(hs[i][0, pos]) for i in head.layers], dim=-1)
            z = h @ w.T + head.bias.detach().double()
            if head.gate:
                g, r = torch.sigmoid(z[:, 0]), z[:, 1]
                out.append(float((g * r).sum() / torch.clamp(g.sum(), min=1e-8)))
            else:
                out.append(float(z[:, 0].mean()))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("alignment", ["predicting", "emitted"])
@pytest.mark.parametrize("family", FAMILIES)
def test_swift_scores_match_float64_final_norm(tmp_path_factory, family, alignment):
    from swift_fast.hf import swift_scores

    model64, _ = _load(tiny_model_dir(tmp_path_factory, family), torch.float64)
    L = model64.config.num_hidden_layers
    seqs, plens = _sequences(model64.config.vocab_size, seed=1)
    states = _hidden_states(model64, seqs)
    # all states; the final one (already the norm's output: normalised a second time, as the
    # reference code does); the embeddings and a middle one, out of order; no gate
    cases = [(list(range(L + 1)), True), ([L], True), ([2, 0], True), ([1, L], False)]
    for k, (layers, gate) in enumerate(cases):
        head, w = _norm_head(model64, layers, alignment, gate, seed=k)
        want = _float64_scores(model64, head, w, states, seqs, plens)
        got = swift_scores(model64, head, seqs, plens, batch_size=3)
        assert got.dtype == torch.float32 and got[-1] == 0.0 and want[-1] == 0.0
        # float32 accumulation of float64 states
        torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5, msg=f"{family} {layers} {alignment}")
        if layers != [L]:  # state L is the norm's output already: its rms is about 1
            # the norm is what makes these agree: the same weight without it scores differently
            plain = SwiftHead(head.hidden_size, layers, gate=gate, alignment=alignment)
            plain.load_state_dict(head.state_dict())
            assert not torch.allclose(swift_scores(model64, plain, seqs, plens).double(), want, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("alignment", ["predicting", "emitted"])
def test_swift_scores_float32_model_every_backend(tmp_path_factory, cpu_backend, alignment):
    from swift_fast.hf import swift_scores

    path = tiny_model_dir(tmp_path_factory, "llama")
    model64, _ = _load(path, torch.float64)
    model32, _ = _load(path, torch.float32)
    L = model32.config.num_hidden_layers
    seqs, plens = _sequences(model32.config.vocab_size, seed=2)
    head, w = _norm_head(model32, list(range(L + 1)), alignment, seed=7)
    want = _float64_scores(model64, head, w, _hidden_states(model64, seqs), seqs, plens)
    got = swift_scores(model32, head, seqs, plens, batch_size=2)
    # a float32 forward against a float64 one, then the float32 projection
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("alignment", ["predicting", "emitted"])
@pytest.mark.parametrize("projection", ["step", "layer"])
def test_generate_time_scores_equal_offline(tmp_path_factory, projection, alignment):
    from swift_fast.hf import GenerationScorer, response_lengths, swift_scores

    model, tok = _load(tiny_model_dir(tmp_path_factory, "llama"), torch.float32)
    tok.padding_side = "left"
    L = model.config.num_hidden_layers
    head, _ = _norm_head(model, [L, 0, 2], alignment, seed=3)
    msgs = [[{"role": "user", "content": "What is 3x + 5 = 20? Find x."}], [{"role": "user", "content": "Hi"}]]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", padding=True,
                                  return_dict=True)
    out, got = GenerationScorer(model, head, projection=projection).generate(
        **enc, do_sample=False, max_new_tokens=6, return_dict_in_generate=True
    )
    seqs = out.sequences
    p = enc["input_ids"].shape[1]
    lengths = response_lengths(seqs[:, p:], [tok.eos_token_id])
    full, plens = [], []
    for b in range(seqs.shape[0]):
        prompt = seqs[b, :p][enc["attention_mask"][b].bool()].tolist()
        full.append(prompt + seqs[b, p : p + int(lengths[b])].tolist())
        plens.append(len(prompt))
    want = swift_scores(model, head, full, plens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# -- the vLLM forward hooks, on a stand-in decoder with vLLM's layer interface ----------------


class _InputNorm(torch.nn.Module):
    """``norm(x) -> normed`` or ``norm(x, residual) -> (normed, x + residual)`` like vLLM's RMSNorm."""

    def forward(self, x, residual=None):
        r = x if residual is None else x + residual
        normed = r / r.norm(dim=-1, keepdim=True)
        return normed if residual is None else (normed, r)


class _Layer(torch.nn.Module):
    """``forward(positions, hidden_states, residual) -> (hidden, residual)`` like vLLM's layers,
    the residual added by the input norm."""

    def __init__(self, d, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.input_layernorm = _InputNorm()
        self.lin = torch.nn.Linear(d, d)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(d, d, generator=g) * (seed + 1) / d**0.5)

    def forward(self, positions, hidden_states, residual):
        if residual is None:
            residual, h = hidden_states, self.input_layernorm(hidden_states)
        else:
            h, residual = self.input_layernorm(hidden_states, residual)
        return torch.tanh(self.lin(h)) * (1 + positions[:, None]), residual


class _Norm(torch.nn.Module):
    def forward(self, hidden_states, residual):
        x = hidden_states + residual
        return x / x.norm(dim=-1, keepdim=True), x


class _Decoder(torch.nn.Module):
    def __init__(self, d, n_layers):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(_Layer(d, i) for i in range(n_layers))
        self.model.norm = _Norm()

    def forward(self, positions, x):
        """Returns every state in HF numbering, for the check."""
        states, residual = [x], None
        for layer in self.model.layers:
            x, residual = layer(positions, x, residual)
            states.append(x + residual)
        states[-1] = self.model.norm(x, residual)[0]
        return states


def test_vllm_hooks_pass_the_heads_norm_eps(cpu_backend):
    from swift_fast.vllm_plugin import model_hooks

    d, n_layers, t, eps = 16, 3, 5, 1e-5
    model = _Decoder(d, n_layers)
    positions = torch.arange(t, dtype=torch.float32)
    x = torch.randn(t, d, generator=torch.Generator().manual_seed(9)) * 4
    with torch.no_grad():
        states = model(positions, x)
    head = SwiftHead(d, [n_layers, 0, 2], norm_eps=eps)
    fs = model_hooks.install(model, head, max_tokens=8, device=torch.device("cpu"))
    with torch.no_grad():
        model(positions, x)
        eager = fs.acc.clone()
        fs.acc.zero_()
        torch.compile(model, fullgraph=True)(positions, x)  # the eps is a constant of the graph
    w = head.weight.detach().double()
    want = torch.zeros(t, 2, dtype=torch.float64)
    for i, s in enumerate(head.layers):
        h = states[s].double()
        want += (h / torch.sqrt(h.square().mean(-1, keepdim=True) + eps)) @ w[:, i * d : (i + 1) * d].T
    torch.testing.assert_close(eager[:t].double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fs.acc, eager, rtol=1e-5, atol=1e-5)
    assert fs.acc[t:].abs().sum() == 0


def test_training_refuses_a_norm_head():
    from swift_fast.training import train_head

    with pytest.raises(HeadError, match="does not train heads with a state norm"):
        train_head(SwiftHead(8, [0, 1], norm_eps=1e-6), None, [], [])
