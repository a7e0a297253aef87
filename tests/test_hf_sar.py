"""SAR with Hugging Face models, its TRL reward function and VERL hook, against a direct
two-forward float64 computation of the SAR paper's Eq. 8-9 written here."""

import copy
import math

import pytest
import torch
from hf_fixtures import eos_prone_model_dir, tiny_model_dir

from swift_fast.hf import (
    response_logprobs,
    sar_rewards,
    trl_sar_reward,
    verl_question_removed_batch,
    verl_sar_reward,
    verl_token_level,
)
from swift_fast.sar import DEFAULT_SYSTEM_PROMPT

transformers = pytest.importorskip("transformers")


def _load(path, dtype=torch.float64):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval(), AutoTokenizer.from_pretrained(path)


def _ids(x):
    return list(x["input_ids"] if isinstance(x, dict) or hasattr(x, "keys") else x)


def _direct_sar(model, tok, prompt_ids, response_ids, system=DEFAULT_SYSTEM_PROMPT):
    """Two plain forwards with full logits, float64: ppl(a|q), ppl(a|q0), clip((ppl0 - pplq) / ppl0)."""
    q0 = _ids(
        tok.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": ""}], add_generation_prompt=True
        )
    )

    def ppl(prefix):
        if not response_ids:
            return 1.0
        seq = torch.tensor([prefix + response_ids])
        with torch.no_grad():
            logits = model.double()(seq).logits[0].double()
        logp = torch.log_softmax(logits, -1)
        total = sum(float(logp[len(prefix) - 1 + j, t]) for j, t in enumerate(response_ids))
        return math.exp(-total / len(response_ids))

    pq, p0 = ppl(prompt_ids), ppl(q0)
    return max(-1.0, min(1.0, (p0 - pq) / p0))


def _cases(tok, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    questions = ["What is 2 + 3?", "Natalia sold 48 clips in April.", "Is the coin still heads up?", "x = 5"]
    prompts = [[{"role": "user", "content": q}] for q in questions[:n]]
    responses = []
    for i in range(n):
        r = torch.randint(3, tok.vocab_size, (3 + 4 * i,), generator=g).tolist()
        responses.append(r + [tok.eos_token_id])
    return prompts, responses


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_sar_rewards_equal_direct_two_forward_computation(tmp_path_factory, family):
    model, tok = _load(tiny_model_dir(tmp_path_factory, family))
    prompts, responses = _cases(tok)
    prompt_ids = [_ids(tok.apply_chat_template(p, add_generation_prompt=True)) for p in prompts]
    want = torch.tensor([_direct_sar(model, tok, p, r) for p, r in zip(prompt_ids, responses)], dtype=torch.float64)
    got = sar_rewards(model, tok, prompts, responses, batch_size=3)  # chat messages rendered with the template
    assert got.dtype == torch.float32 and got.shape == (4,)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    # token-id prompts give the same; so do rendered-text prompts (tokenised once, no special tokens added)
    torch.testing.assert_close(sar_rewards(model, tok, prompt_ids, responses), got)
    texts = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    torch.testing.assert_close(sar_rewards(model, tok, texts, responses), got)


def test_sar_edge_cases(tmp_path_factory):
    model, tok = _load(tiny_model_dir(tmp_path_factory, "qwen2"))
    prompts, responses = _cases(tok, n=2, seed=1)
    responses = [[], responses[1]]
    got, (lq, l0, cu) = sar_rewards(model, tok, prompts, responses, system_prompt="Be brief.", return_logprobs=True)
    assert got[0] == 0.0  # empty answer: no evidence either way
    assert cu.tolist() == [0, 0, len(responses[1])] and lq.shape == l0.shape == (len(responses[1]),)
    p_ids = _ids(tok.apply_chat_template(prompts[1], add_generation_prompt=True))
    assert got[1].item() == pytest.approx(_direct_sar(model, tok, p_ids, responses[1], system="Be brief."), abs=1e-6)
    # the question-kept log-probs are those of a plain forward
    lp, cu2 = response_logprobs(model, [p_ids + responses[1]], [len(p_ids)])
    torch.testing.assert_close(lp, lq)
    # temperature divides the logits of the model's distribution
    with torch.no_grad():
        logits = model(torch.tensor([p_ids + responses[1]])).logits[0].double() / 0.7
    pos = torch.arange(len(p_ids) - 1, len(p_ids) + len(responses[1]) - 1)
    want = torch.log_softmax(logits, -1)[pos, torch.tensor(responses[1])]
    hot, _ = response_logprobs(model, [p_ids + responses[1]], [len(p_ids)], temperature=0.7)
    torch.testing.assert_close(hot.double(), want, rtol=1e-5, atol=1e-6)
    # strings as responses: tokenised once, without special tokens
    text = "The answer is 5."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    torch.testing.assert_close(
        sar_rewards(model, tok, prompts[:1], [text]), sar_rewards(model, tok, prompts[:1], [ids])
    )
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        sar_rewards(model, tok, prompts, responses[:1])


@pytest.mark.filterwarnings("ignore:TRL currently supports vLLM")
def test_trl_grpo_step_with_the_sar_reward(tmp_path_factory, tmp_path):
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from trl import GRPOConfig, GRPOTrainer

    model, tok = _load(eos_prone_model_dir(tmp_path_factory), dtype=torch.float32)
    reward = trl_sar_reward(model, tok)
    seen = []

    def sar(prompts, completions, completion_ids=None, **kwargs):
        # reference at call time, on a float64 copy of the policy as it is now
        snapshot = copy.deepcopy(model).double()
        ref = [
            _direct_sar(snapshot, tok, _ids(tok.apply_chat_template(p, add_generation_prompt=True)), list(c))
            for p, c in zip(prompts, completion_ids)
        ]
        out = reward(prompts, completions, completion_ids=completion_ids, **kwargs)
        seen.append((out, ref, [len(c) for c in completion_ids]))
        return out

    ds = datasets.Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": "What is 2 + 3?"}]},
            {"prompt": [{"role": "user", "content": "Hi there"}]},
        ]
    )
    cfg = GRPOConfig(
        output_dir=str(tmp_path / "grpo"), max_steps=1, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=8, report_to=[], use_cpu=True, logging_steps=1, save_strategy="no", seed=0, bf16=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[sar], args=cfg, train_dataset=ds, processing_class=tok)
    trainer.train()
    assert len(seen) == 1
    out, ref, lengths = seen[0]
    assert len(out) == 4 and all(isinstance(x, float) for x in out)
    assert out == pytest.approx(ref, abs=2e-5)
    logged = next(h for h in trainer.state.log_history if "rewards/sar/mean" in h)
    assert logged["rewards/sar/mean"] == pytest.approx(sum(out) / 4, abs=1e-6)
    assert model.training  # the reward put the policy back in the mode it found it in


def test_trl_reward_contract_without_completion_ids(tmp_path_factory):
    model, tok = _load(tiny_model_dir(tmp_path_factory, "llama"), dtype=torch.float32)
    fn = trl_sar_reward(model, tok, name="self_aligned")
    assert fn.__name__ == "self_aligned"
    text = ["What is 2 + 3?", "Hi"]
    completions = ["The answer is 5.", "Hello"]
    got = fn(prompts=text, completions=completions, trainer_state=None, log_metric=lambda *a: None)
    # text prompts are tokenised the way GRPOTrainer does (the tokenizer's default call)
    p_ids = [tok(t)["input_ids"] for t in text]
    c_ids = [tok(c, add_special_tokens=False)["input_ids"] for c in completions]
    assert got == pytest.approx(sar_rewards(model, tok, p_ids, c_ids).tolist(), abs=1e-7)


def test_verl_hook_matches_sar_rewards(tmp_path_factory):
    """VERL layout: left-padded prompts, right-padded responses, per-token log-probs [B, R] from
    a plain forward (what compute_log_prob returns at temperature 1)."""
    model, tok = _load(tiny_model_dir(tmp_path_factory, "qwen2"))
    prompts, responses = _cases(tok, n=3, seed=2)
    p_ids = [_ids(tok.apply_chat_template(p, add_generation_prompt=True)) for p in prompts]
    pad = tok.pad_token_id
    P, R = max(map(len, p_ids)), max(map(len, responses))
    B = len(p_ids)
    prompts_t = torch.full((B, P), pad)
    responses_t = torch.full((B, R), pad)
    attn = torch.zeros((B, P + R), dtype=torch.long)
    for b in range(B):
        prompts_t[b, P - len(p_ids[b]) :] = torch.tensor(p_ids[b])
        responses_t[b, : len(responses[b])] = torch.tensor(responses[b])
        attn[b, P - len(p_ids[b]) : P + len(responses[b])] = 1
    response_mask = attn[:, P:]

    def verl_log_probs(input_ids, attention_mask, position_ids, n_resp):
        with torch.no_grad():
            logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        logp = torch.log_softmax(logits.double(), -1)[:, :-1].gather(-1, input_ids[:, 1:, None])[..., 0]
        return logp[:, -n_resp:]

    pos = torch.clamp(attn.cumsum(-1) - 1, min=0)
    lq = verl_log_probs(torch.cat([prompts_t, responses_t], 1), attn, pos, R)
    q0 = verl_question_removed_batch(responses_t, response_mask, tok)
    l0 = verl_log_probs(q0["input_ids"], q0["attention_mask"], q0["position_ids"], R)
    lq = lq.masked_fill(response_mask == 0, float("nan"))  # padding may hold anything
    got = verl_sar_reward(lq, l0, response_mask)
    want = sar_rewards(model, tok, p_ids, responses)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    dense = verl_token_level(got, response_mask)
    for b in range(B):
        assert dense[b, len(responses[b]) - 1] == got[b] and dense[b].count_nonzero() <= 1
