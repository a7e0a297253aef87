import random

import pytest

from swift_fast.demo import task as T
from swift_fast.demo.tokenizer import build_tokenizer, prompt_ids, vocabulary


def _eval_steps(text):
    """Independent reading of a solution: every 'a+b=c;' step with its numbers."""
    body = text.split("#")[0]
    steps = [s for s in body.replace("check;", "").split(";") if "=" in s]
    return [(int(l.split("+")[0]), int(l.split("+")[1].split("=")[0]), int(l.split("=")[1])) for l in steps]


@pytest.mark.parametrize("seed", range(5))
def test_clean_solution_adds_up_and_checks(seed):
    rng = random.Random(seed)
    cfg = T.TaskConfig()
    for _ in range(50):
        terms = T.sample_terms(rng, cfg)
        assert cfg.min_terms <= len(terms) <= cfg.max_terms
        assert all(0 <= t < 10**cfg.max_digits for t in terms)
        text = T.solution(terms, cfg)
        assert all(a + b == c for a, b, c in _eval_steps(text))
        assert T.verdict(text) == "ok"
        assert T.extract_answer(text) == str(sum(terms))
        assert T.is_correct(text, terms)


def test_flawed_solution_is_caught_by_its_check():
    rng = random.Random(3)
    cfg = T.TaskConfig()
    for _ in range(200):
        terms = T.sample_terms(rng, cfg)
        text = T.solution(terms, cfg, rng, flawed=True)
        steps = _eval_steps(text)
        wrong = [s for s in steps if s[0] + s[1] != s[2]]
        assert len(wrong) == 1  # one slip, carried on consistently afterwards
        assert T.verdict(text) == "no"
        assert not T.is_correct(text, terms)
        # the check pass (the last len(terms)-1 steps) is right and ends at the true sum
        assert steps[-1][2] == sum(terms)


def test_training_stream_flaw_rate():
    rng = random.Random(0)
    cfg = T.TaskConfig(flaw_rate=0.25)
    texts = [T.training_solution(T.sample_terms(rng, cfg), cfg, rng) for _ in range(2000)]
    rate = sum(T.verdict(t) == "no" for t in texts) / len(texts)
    assert 0.21 < rate < 0.29
    nocheck = T.TaskConfig(check=False)
    assert "check" not in T.training_solution([1, 2], nocheck, rng)


def test_extract_answer():
    assert T.extract_answer("1+2=3;check;2+1=3;ok#3") == "3"
    assert T.extract_answer("1+2=3;ok#003") == "3"
    assert T.extract_answer("1+2=3;ok#0") == "0"
    assert T.extract_answer("1+2=3;ok#") is None
    assert T.extract_answer("1+2=3") is None
    assert T.extract_answer("#12+3") is None


def test_splits_are_disjoint_and_reproducible():
    cfg = T.TaskConfig()
    a = T.make_split(100, cfg, seed=1)
    assert a == T.make_split(100, cfg, seed=1)
    qa = {T.question(t) for t in a}
    assert len(qa) == 100
    b = T.make_split(100, cfg, seed=2, exclude=qa)
    assert not qa & {T.question(t) for t in b}


def test_tokenizer_round_trip_and_chat_template():
    tok = build_tokenizer()
    assert len(tok) == len(vocabulary())
    rng = random.Random(1)
    cfg = T.TaskConfig()
    for _ in range(20):
        terms = T.sample_terms(rng, cfg)
        text = T.training_solution(terms, cfg, rng)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text
        # digits are single tokens: one id per character outside the words
        assert len(ids) == len(text) - sum(len(w) - 1 for w in ("check", "vs", "ok", "no") for _ in range(text.count(w)))
    p = prompt_ids(tok, "12+34")
    s = tok.decode(p)
    assert s.startswith("<|begin_of_text|>") and s.endswith("assistant<|end_header_id|>\n\n")
    assert "user<|end_header_id|>\n\n12+34<|eot_id|>" in s
    q0 = prompt_ids(tok, "12+34", with_question=False)
    assert "12+34" not in tok.decode(q0)
    # SAR's question-removed prompt as the library builds it for a model without system prompt
    from swift_fast.hf.sar import question_removed_prompt

    assert question_removed_prompt(tok, None) == q0
    assert tok.eos_token == "<|eot_id|>"
