"""Generate-time SWIFT scores equal offline scores of the same token ids."""

import pytest
import torch
from hf_fixtures import eos_prone_model_dir, random_head, tiny_model_dir

from swift_fast.hf import GenerationError, GenerationScorer, generate_with_scores, response_lengths, swift_scores
from swift_fast.rewards.head import SwiftHead

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def eos_model(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = eos_prone_model_dir(tmp_path_factory)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval(), tok


def _head(model, layers, alignment, feature="hidden", gate=True, seed=0):
    width = model.config.vocab_size if feature == "logits" else model.config.hidden_size
    return random_head(width, layers, alignment, feature, gate, seed)


def _prompts(tok):
    msgs = [[{"role": "user", "content": "What is 3x + 5 = 20? Find x."}], [{"role": "user", "content": "Hi"}]]
    return tok.apply_chat_template(
        msgs, add_generation_prompt=True, return_tensors="pt", padding=True, return_dict=True
    )


def _offline(model, head, enc, seqs, n, eos):
    """Offline scores of the generated rows: unpadded prompt + response up to the first EOS."""
    p = enc["input_ids"].shape[1]
    mask = enc["attention_mask"].repeat_interleave(n, 0).bool()
    lengths = response_lengths(seqs[:, p:], eos)
    full, plens = [], []
    for b in range(seqs.shape[0]):
        prompt = seqs[b, :p][mask[b]].tolist()
        full.append(prompt + seqs[b, p : p + int(lengths[b])].tolist())
        plens.append(len(prompt))
    return swift_scores(model, head, full, plens, batch_size=4), lengths


@pytest.mark.parametrize(
    "layers,alignment,feature,gate,projection",
    [
        ([0, 1, 2], "predicting", "hidden", True, "step"),
        ([2, 0, 1], "predicting", "hidden", True, "layer"),
        ([2], "emitted", "hidden", True, "step"),
        ([0, 2], "emitted", "hidden", False, "layer"),
        ([1, 0], "emitted", "hidden", True, "step"),
        (None, "predicting", "logits", True, "step"),
        (None, "emitted", "logits", True, "layer"),
    ],
)
def test_generate_time_scores_equal_offline_scores(eos_model, layers, alignment, feature, gate, projection):
    model, tok = eos_model
    head = _head(model, layers, alignment, feature, gate)
    enc = _prompts(tok)
    assert enc["attention_mask"][1, 0] == 0  # the batch really is left-padded
    torch.manual_seed(0)
    seqs, scores = GenerationScorer(model, head, projection=projection).generate(
        **enc, do_sample=True, top_k=0, top_p=0.9, max_new_tokens=12, num_return_sequences=3
    )
    assert isinstance(seqs, torch.Tensor) and scores.shape == (6,)
    want, lengths = _offline(model, head, enc, seqs, 3, [tok.eos_token_id])
    # rows ended at different steps, some at the length limit and some on the end-of-turn token
    assert len(set(lengths.tolist())) > 1 and (lengths < seqs.shape[1] - enc["input_ids"].shape[1]).any()
    torch.testing.assert_close(scores, want, rtol=1e-5, atol=1e-5)


def test_attached_scorer_around_plain_generate(eos_model):
    model, tok = eos_model
    head = _head(model, [1, 2], "emitted", seed=3)
    enc = _prompts(tok)
    with GenerationScorer(model, head) as scorer:
        torch.manual_seed(1)
        out = model.generate(**enc, do_sample=True, top_k=0, max_new_tokens=10, return_dict_in_generate=True)
        got = scorer.scores(out)
        # the sequences alone lack the cache the extra step needs: a clear refusal, not a guess
        torch.manual_seed(1)
        plain = model.generate(**enc, do_sample=True, top_k=0, max_new_tokens=10)
        with pytest.raises(GenerationError, match="emitted.*return_dict_in_generate=True"):
            scorer.scores(plain)
    want, _ = _offline(model, head, enc, out.sequences, 1, [tok.eos_token_id])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # hooks are gone after the block: generation is untouched and nothing is recorded
    assert not model.model.layers[0]._forward_hooks and not model.model._forward_pre_hooks


def test_explicit_response_lengths_and_unsupported_modes(eos_model):
    model, tok = eos_model
    head = _head(model, [0, 2], "predicting", seed=4)
    enc = _prompts(tok)
    scorer = GenerationScorer(model, head)
    cut = torch.tensor([3, 5])  # rows stopped by some other rule than EOS
    scorer.attach()
    try:
        torch.manual_seed(2)
        seqs = model.generate(**enc, do_sample=True, top_k=0, max_new_tokens=8, eos_token_id=[])
        got = scorer.scores(seqs, cut)
    finally:
        scorer.detach()
    p = enc["input_ids"].shape[1]
    mask = enc["attention_mask"].bool()
    full = [seqs[b, :p][mask[b]].tolist() + seqs[b, p : p + int(cut[b])].tolist() for b in range(2)]
    want = swift_scores(model, head, full, [int(mask[b].sum()) for b in range(2)])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(GenerationError, match="beam search"):
        generate_with_scores(model, head, **enc, num_beams=2, max_new_tokens=4)
    right = dict(enc)
    right["input_ids"] = enc["input_ids"].flip(1)
    right["attention_mask"] = enc["attention_mask"].flip(1)
    with pytest.raises(GenerationError, match="left padding"):
        scorer.generate(**right, max_new_tokens=4)


def test_head_for_another_model_is_refused_before_generating(tmp_path_factory, eos_model):
    from swift_fast.rewards.head import HeadError

    model, _ = eos_model
    head = SwiftHead(model.config.hidden_size, [0, 3])
    with pytest.raises(HeadError, match="layers \\[3\\] do not exist"):
        GenerationScorer(model, head)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral"])
def test_generate_time_scores_on_other_families(tmp_path_factory, family):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model_dir(tmp_path_factory, family)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    enc = _prompts(tok)
    L = model.config.num_hidden_layers
    for alignment in ("predicting", "emitted"):
        head = _head(model, [L, 0, 2], alignment, seed=5)
        seqs, scores = generate_with_scores(model, head, **enc, do_sample=False, max_new_tokens=5)
        want, _ = _offline(model, head, enc, seqs, 1, [tok.eos_token_id])
        torch.testing.assert_close(scores, want, rtol=1e-5, atol=1e-5)
