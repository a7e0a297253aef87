"""Offline SWIFT scoring and feature extraction on tiny models of every supported family,
against a float64 computation written here from ``output_hidden_states``."""

import pytest
import torch
from hf_fixtures import FAMILIES, random_head, tiny_model_dir

from swift_fast.hf import UnsupportedModelError, extract_features, swift_scores
from swift_fast.rewards.head import HeadError, SwiftHead

transformers = pytest.importorskip("transformers")


def _load(path, dtype=torch.float64):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval(), AutoTokenizer.from_pretrained(path)


def _chat_sequences(tok, gen: torch.Generator):
    """Prompts from the family's chat template (token ids), responses of random ids ending with
    the end-of-turn token, one of them empty."""
    out = []
    for _i, (q, m) in enumerate([("What is 2 + 3?", 7), ("Natalia sold clips.", 12), ("x = 5", 1), ("Hi", 0)]):
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False
        )
        resp = torch.randint(3, tok.vocab_size, (m,), generator=gen).tolist()
        if m:
            resp[-1] = tok.eos_token_id
        out.append((list(prompt), resp))
    return out


def _direct_score(hs, logits, weight, bias, layers, alignment, p, n, gate=True):
    """DESIGN 2 by hand: cat the selected states at the scored positions, W h + b, sigmoid gate,
    gated mean; float64."""
    pos = torch.arange(p, n) - (1 if alignment == "predicting" else 0)
    if len(pos) == 0:
        return 0.0
    if layers is None:
        h = logits[0, pos]
    else:
        h = torch.cat([hs[i][0, pos] for i in layers], dim=-1)
    z = h @ weight.detach().double().T + bias.detach().double()
    if not gate:
        return float(z[:, 0].mean())
    g, r = torch.sigmoid(z[:, 0]), z[:, 1]
    return float((g * r).sum() / torch.clamp(g.sum(), min=1e-8))


@pytest.mark.parametrize("family", FAMILIES)
def test_swift_scores_match_float64_output_hidden_states(tmp_path_factory, family):
    model, tok = _load(tiny_model_dir(tmp_path_factory, family))
    L = model.config.num_hidden_layers
    pairs = _chat_sequences(tok, torch.Generator().manual_seed(1))
    seqs = [p + r for p, r in pairs]
    plens = [len(p) for p, _ in pairs]
    refs = []
    with torch.no_grad():
        for s in seqs:
            out = model(torch.tensor([s]), output_hidden_states=True)
            assert len(out.hidden_states) == L + 1
            refs.append((out.hidden_states, out.logits))
    selections = [list(range(L + 1)), [L], [0, 2], [L, 1]]
    cases = [(sel, al, "hidden", gate) for sel in selections for al in ("predicting", "emitted") for gate in (True,)]
    cases += [([0, L], "predicting", "hidden", False)]
    cases += [(None, al, "logits", True) for al in ("predicting", "emitted")]
    for k, (sel, alignment, feature, gate) in enumerate(cases):
        width = model.config.vocab_size if feature == "logits" else model.config.hidden_size
        head = random_head(width, sel, alignment, feature, gate, seed=k)
        got = swift_scores(model, head, seqs, plens, batch_size=3)
        want = torch.tensor(
            [
                _direct_score(hs, lg, head.weight, head.bias, sel, alignment, p, len(s), gate)
                for (hs, lg), s, p in zip(refs, seqs, plens)
            ],
            dtype=torch.float64,
        )
        assert got.dtype == torch.float32 and got.shape == (len(seqs),)
        assert want[-1] == 0.0 and got[-1] == 0.0  # empty response scores 0 (DESIGN 2)
        torch.testing.assert_close(
            got.double(), want, rtol=2e-5, atol=2e-5, msg=f"{family} {sel} {alignment} {feature}"
        )


def test_scores_do_not_depend_on_batching_or_padding(tmp_path_factory):
    model, tok = _load(tiny_model_dir(tmp_path_factory, "qwen2"), dtype=torch.float32)
    pairs = _chat_sequences(tok, torch.Generator().manual_seed(2))
    seqs = [p + r for p, r in pairs]
    plens = [len(p) for p, _ in pairs]
    head = random_head(model.config.hidden_size, [0, 1, 3], "predicting")
    one_by_one = torch.cat([swift_scores(model, head, [s], [p]) for s, p in zip(seqs, plens)])
    together = swift_scores(model, head, [torch.tensor(s) for s in seqs], plens, batch_size=4)
    torch.testing.assert_close(together, one_by_one, rtol=1e-5, atol=1e-5)
    # a DistributedDataParallel-style wrapper (.module) is looked through
    wrapper = torch.nn.Module()
    wrapper.module = model
    torch.testing.assert_close(swift_scores(wrapper, head, seqs, plens, batch_size=4), together)


@pytest.mark.parametrize("alignment", ["predicting", "emitted"])
def test_extract_features_are_the_output_hidden_states(tmp_path_factory, alignment):
    model, tok = _load(tiny_model_dir(tmp_path_factory, "mistral"))
    pairs = _chat_sequences(tok, torch.Generator().manual_seed(3))[:3]
    seqs = [p + r for p, r in pairs]
    plens = [len(p) for p, _ in pairs]
    states, cu = extract_features(model, seqs, plens, layers="all", alignment=alignment)
    logits, cu2 = extract_features(model, seqs, plens, alignment=alignment, feature="logits")
    assert torch.equal(cu, cu2) and cu.tolist() == [0, 7, 19, 20]
    shift = 1 if alignment == "predicting" else 0
    for b, (s, p) in enumerate(zip(seqs, plens)):
        with torch.no_grad():
            out = model(torch.tensor([s]), output_hidden_states=True)
        pos = torch.arange(p, len(s)) - shift
        for i, h in enumerate(out.hidden_states):
            torch.testing.assert_close(states[i][cu[b] : cu[b + 1]], h[0, pos], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(logits[0][cu[b] : cu[b + 1]], out.logits[0, pos], rtol=1e-10, atol=1e-10)


def test_head_on_the_wrong_model_is_refused(tmp_path_factory):
    small, _ = _load(tiny_model_dir(tmp_path_factory, "llama", num_layers=2), dtype=torch.float32)
    big, _ = _load(tiny_model_dir(tmp_path_factory, "llama", num_layers=3), dtype=torch.float32)
    head = SwiftHead(big.config.hidden_size, [0, 3]).bind_model(big.config, name="tiny-llama-3")
    with pytest.raises(HeadError, match=r"does not fit model .*layers \[3\] do not exist"):
        swift_scores(small, head, [[1, 2, 3]], [2])
    other_family, _ = _load(tiny_model_dir(tmp_path_factory, "qwen3"), dtype=torch.float32)
    with pytest.raises(HeadError, match=r"architecture LlamaForCausalLM != Qwen3ForCausalLM.*tiny-llama-3"):
        swift_scores(other_family, head, [[1, 2, 3]], [2])


def test_unsupported_architecture_is_a_clear_error():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=0)
    )
    head = SwiftHead(32, [0, 1])
    with pytest.raises(
        UnsupportedModelError, match=r"unsupported architecture GPT2LMHeadModel.*Llama.*Qwen2.*Qwen3.*Mistral"
    ):
        swift_scores(model, head, [[1, 2, 3]], [1])


def test_bad_spans_are_clear_errors(tmp_path_factory):
    model, _ = _load(tiny_model_dir(tmp_path_factory, "llama", num_layers=2), dtype=torch.float32)
    head = SwiftHead(model.config.hidden_size, [0, 2])
    with pytest.raises(ValueError, match="predicting.*at least one token"):
        swift_scores(model, head, [[5, 6, 7]], [0])
    with pytest.raises(ValueError, match="sequence 0 is empty"):
        swift_scores(model, head, [[]], [0])
    with pytest.raises(ValueError, match="prompt length 9 is outside 0..3"):
        swift_scores(model, head, [[5, 6, 7]], [9])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        swift_scores(model, head, [[5, 6, 100000]], [1])
    with pytest.raises(TypeError, match="token ids"):
        swift_scores(model, head, ["some text"], [1])
    # an empty response is no error: nothing is scored and R = 0
    emitted = SwiftHead(model.config.hidden_size, [0, 2], alignment="emitted")
    assert swift_scores(model, emitted, [[5, 6, 7], [8]], [3, 0]).tolist()[0] == 0.0


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("projection", ["step", "layer"])
def test_model_split_over_two_devices(tmp_path_factory, projection):
    """Layers alternate between cuda:0 and cuda:1 (the LM head on cuda:1): every state is
    projected on its own device, offline and during generate, and the scores equal the CPU's."""
    from transformers import AutoModelForCausalLM

    from swift_fast.hf import GenerationScorer

    path = tiny_model_dir(tmp_path_factory, "llama")
    cpu, tok = _load(path, dtype=torch.float32)
    L = cpu.config.num_hidden_layers
    device_map = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1}
    device_map.update({f"model.layers.{i}": i % 2 for i in range(L)})
    split = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map=device_map).eval()
    assert {p.device.index for p in split.model.layers.parameters()} == {0, 1}
    pairs = _chat_sequences(tok, torch.Generator().manual_seed(4))
    seqs, plens = [p + r for p, r in pairs], [len(p) for p, _ in pairs]
    head = random_head(cpu.config.hidden_size, list(range(L + 1)), "predicting")
    want = swift_scores(cpu, head, seqs, plens)
    torch.testing.assert_close(swift_scores(split, head, seqs, plens), want, rtol=1e-4, atol=1e-4)
    prompt = torch.tensor([pairs[0][0]], device="cuda:0")
    out, got = GenerationScorer(split, head, projection=projection).generate(
        input_ids=prompt, do_sample=False, max_new_tokens=6, return_dict_in_generate=True
    )
    gen = out.sequences[0].tolist()
    offline = swift_scores(cpu, head, [gen], [prompt.shape[1]])
    torch.testing.assert_close(got, offline, rtol=1e-4, atol=1e-4)
