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

transformers = pytest.importorskip("transformers")

# A template in Qwen2.5's style: a default system turn when the conversation has none, whose text
# a template argument can change.
DEFAULT_SYSTEM_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\n{{ persona | default('You are helpful.') }}"
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _load(path, dtype=torch.float64):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval(), AutoTokenizer.from_pretrained(path)


def _ids(x):
    return list(x["input_ids"] if isinstance(x, dict) or hasattr(x, "keys") else x)


def _text_ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _direct_sar(model, prompt_ids, q0_ids, response_ids):
    """Two plain forwards with full logits, float64: ppl(a|q), ppl(a|q0), clip((ppl0 - pplq) / ppl0).
    ``q0_ids`` is written by each test from the prompt with only the question removed."""

    def ppl(prefix):
        if not response_ids:
            return 1.0
        seq = torch.tensor([prefix + response_ids])
        with torch.no_grad():
            logits = model.double()(seq).logits[0].double()
        logp = torch.log_softmax(logits, -1)
        total = sum(float(logp[len(prefix) - 1 + j, t]) for j, t in enumerate(response_ids))
        return math.exp(-total / len(response_ids))

    pq, p0 = ppl(prompt_ids), ppl(q0_ids)
    return max(-1.0, min(1.0, (p0 - pq) / p0))


QUESTIONS = ["What is 2 + 3?", "Natalia sold 48 clips in April.", "Is the coin still heads up?", "x = 5"]


def _cases(tok, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [[{"role": "user", "content": q}] for q in QUESTIONS[:n]]
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
    # the prompts have no system turn, and neither has q0
    q0 = _ids(tok.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True))
    want = torch.tensor([_direct_sar(model, p, q0, r) for p, r in zip(prompt_ids, responses)], dtype=torch.float64)
    got = sar_rewards(model, tok, prompts, responses, batch_size=3)  # chat messages rendered with the template
    assert got.dtype == torch.float32 and got.shape == (4,)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    # token-id and rendered-text prompts hide the question: with the context given they agree
    torch.testing.assert_close(sar_rewards(model, tok, prompt_ids, responses, contexts=[q0] * 4), got)
    texts = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    q0_text = tok.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True, tokenize=False)
    torch.testing.assert_close(sar_rewards(model, tok, texts, responses, contexts=[q0_text] * 4), got)
    # without a context a raw prompt's answer follows the BOS token alone
    bos_only = torch.tensor([_direct_sar(model, p, [tok.bos_token_id], r) for p, r in zip(prompt_ids, responses)])
    torch.testing.assert_close(sar_rewards(model, tok, prompt_ids, responses).double(), bos_only.double(),
                               rtol=1e-5, atol=1e-6)


def test_system_turn_and_template_arguments_are_kept_in_q0(tmp_path_factory):
    """The generation's own system prompt stays in q0; a template's default system turn stays too,
    with the text its template argument gave it."""
    model, tok = _load(tiny_model_dir(tmp_path_factory, "qwen2"))
    tok.chat_template = DEFAULT_SYSTEM_TEMPLATE
    _, responses = _cases(tok, n=2, seed=3)
    with_system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTIONS[0]}]
    without = [{"role": "user", "content": QUESTIONS[1]}]
    got = sar_rewards(model, tok, [with_system, without], responses, chat_template_kwargs={"persona": "Be exact."})
    p_ids = [
        _text_ids(tok, f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{QUESTIONS[0]}<|im_end|>\n"
                       "<|im_start|>assistant\n"),
        _text_ids(tok, f"<|im_start|>system\nBe exact.<|im_end|>\n<|im_start|>user\n{QUESTIONS[1]}<|im_end|>\n"
                       "<|im_start|>assistant\n"),
    ]
    q0 = [
        _text_ids(tok, f"<|im_start|>system\n{s}<|im_end|>\n<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n")
        for s in ("Be brief.", "Be exact.")
    ]
    want = [_direct_sar(model, p, q, r) for p, q, r in zip(p_ids, q0, responses)]
    assert got.tolist() == pytest.approx(want, abs=1e-6)
    # the default system turn is the template's own when no argument is given
    got_plain = sar_rewards(model, tok, [without], responses[1:])
    p_plain = _text_ids(tok, f"<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n{QUESTIONS[1]}"
                             "<|im_end|>\n<|im_start|>assistant\n")
    q_plain = _text_ids(tok, "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n<|im_end|>\n"
                             "<|im_start|>assistant\n")
    assert got_plain.item() == pytest.approx(_direct_sar(model, p_plain, q_plain, responses[1]), abs=1e-6)


def test_sar_edge_cases(tmp_path_factory):
    model, tok = _load(tiny_model_dir(tmp_path_factory, "qwen2"))
    prompts, responses = _cases(tok, n=2, seed=1)
    responses = [[], responses[1]]
    got, (lq, l0, cu) = sar_rewards(model, tok, prompts, responses, return_logprobs=True)
    assert got[0] == 0.0  # empty answer: no evidence either way
    assert cu.tolist() == [0, 0, len(responses[1])] and lq.shape == l0.shape == (len(responses[1]),)
    p_ids = _ids(tok.apply_chat_template(prompts[1], add_generation_prompt=True))
    q0 = _ids(tok.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True))
    assert got[1].item() == pytest.approx(_direct_sar(model, p_ids, q0, responses[1]), abs=1e-6)
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
    # a raw prompt, no context, a tokenizer without BOS (Qwen): no q0, so SAR is missing, not a number
    assert tok.bos_token_id is None
    missing = sar_rewards(model, tok, [p_ids, p_ids], [responses[1], []])
    assert math.isnan(missing[0]) and missing[1] == 0.0
    with pytest.raises(ValueError, match="no user message"):
        sar_rewards(model, tok, [[{"role": "system", "content": "x"}]], [responses[1]])
    with pytest.raises(ValueError, match="token ids or as text"):
        sar_rewards(model, tok, [p_ids], [responses[1]], contexts=[3.5])


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
        q0 = _ids(tok.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True))
        ref = [
            _direct_sar(snapshot, _ids(tok.apply_chat_template(p, add_generation_prompt=True)), q0, list(c))
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
    # the conversations differ in their system turns, so the rows' q0 differ in length (left-padded)
    prompts[0] = [{"role": "system", "content": "Be brief."}] + prompts[0]
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
    q0 = verl_question_removed_batch(responses_t, response_mask, tok, messages=prompts)
    l0 = verl_log_probs(q0["input_ids"], q0["attention_mask"], q0["position_ids"], R)
    lq = lq.masked_fill(response_mask == 0, float("nan"))  # padding may hold anything
    got = verl_sar_reward(lq, l0, response_mask)
    q0_rows = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": ""}]] + [
        [{"role": "user", "content": ""}]] * (B - 1)
    want = torch.tensor([
        _direct_sar(model, p, _ids(tok.apply_chat_template(q, add_generation_prompt=True)), r)
        for p, q, r in zip(p_ids, q0_rows, responses)
    ])
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-6)
    dense = verl_token_level(got, response_mask)
    for b in range(B):
        assert dense[b, len(responses[b]) - 1] == got[b] and dense[b].count_nonzero() <= 1


def test_trl_text_prompts_take_a_sar_context_column(tmp_path_factory):
    """A text prompt hides its question: TRL's dataset column ``sar_context`` gives the context; a
    tokenizer without BOS (Qwen) and no column is refused instead of handing GRPO a NaN reward."""
    model, tok = _load(tiny_model_dir(tmp_path_factory, "qwen2"), dtype=torch.float32)
    assert tok.bos_token_id is None
    fn = trl_sar_reward(model, tok)
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in QUESTIONS[:2]]
    _, responses = _cases(tok, n=2, seed=4)
    with pytest.raises(ValueError, match="sar_context"):
        fn(prompts=texts, completions=["x", "y"], completion_ids=responses)
    q0 = _ids(tok.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True))
    got = fn(prompts=texts, completions=["x", "y"], completion_ids=responses, sar_context=[q0, q0])
    p_ids = [tok(t)["input_ids"] for t in texts]
    want = [_direct_sar(model, p, q0, r) for p, r in zip(p_ids, responses)]
    assert got == pytest.approx(want, abs=2e-5)
