import random

import pytest

from swift_fast.demo import task as T
from swift_fast.demo.tokenizer import build_tokenizer, prompt_ids, vocabulary


def _steps(text):
    """Independent reading of a solution: every 'a+b=c' step with its numbers, and the answer."""
    body, answer = text.split("#")
    steps = []
    for s in body.split(";"):
        lhs, c = s.split("=")
        a, b = lhs.split("+")
        steps.append((int(a), int(b), int(c)))
    return steps, int(answer)


@pytest.mark.parametrize("seed", range(5))
def test_solution_is_running_sums(seed):
    rng = random.Random(seed)
    cfg = T.TaskConfig()
    for _ in range(50):
        terms = T.sample_terms(rng, cfg)
        assert cfg.min_terms <= len(terms) <= cfg.max_terms
        assert all(0 <= t < 10**cfg.max_digits for t in terms)
        text = T.solution(terms)
        steps, answer = _steps(text)
        assert len(steps) == len(terms) - 1
        assert all(a + b == c for a, b, c in steps)
        assert [b for _, b, _ in steps] == terms[1:] and steps[0][0] == terms[0]
        # each step starts from the previous result
        assert all(steps[i + 1][0] == steps[i][2] for i in range(len(steps) - 1))
        assert answer == sum(terms) and T.is_correct(text, terms)
        assert not T.stopped_early(text, terms)


def test_sloppy_solution_forgets_the_last_term():
    assert T.solution([12, 34, 5, 20]) == "12+34=46;46+5=51;51+20=71#71"
    assert T.solution([12, 34, 5, 20], forget_last=True) == "12+34=46;46+5=51#51"
    rng = random.Random(3)
    cfg = T.TaskConfig()
    for _ in range(200):
        terms = T.sample_terms(rng, cfg)
        text = T.solution(terms, forget_last=True)
        steps, answer = _steps(text)
        assert len(steps) == len(terms) - 2
        assert all(a + b == c for a, b, c in steps)  # the arithmetic is right, a term is missing
        assert answer == sum(terms[:-1])
        assert T.stopped_early(text, terms)
        assert not T.is_correct(text, terms) or terms[-1] == 0
    with pytest.raises(ValueError, match="no step"):
        T.solution([1, 2], forget_last=True)


def test_forget_rate_grows_with_the_number_of_terms():
    rng = random.Random(0)
    cfg = T.TaskConfig(forget_rates=(0.2, 0.45, 0.7))
    seen = {n: [0, 0] for n in (3, 4, 5)}
    for _ in range(6000):
        terms = T.sample_terms(rng, cfg)
        text = T.training_solution(terms, cfg, rng)
        seen[len(terms)][0] += T.stopped_early(text, terms)
        seen[len(terms)][1] += 1
    for n, want in zip((3, 4, 5), cfg.forget_rates):
        got = seen[n][0] / seen[n][1]
        assert abs(got - want) < 0.05, (n, got, want)


def test_config_is_checked():
    with pytest.raises(ValueError, match="one per number of terms"):
        T.TaskConfig(min_terms=3, max_terms=5, forget_rates=(0.1, 0.2))
    with pytest.raises(ValueError, match="probabilities"):
        T.TaskConfig(min_terms=3, max_terms=4, forget_rates=(0.1, 1.5))
    with pytest.raises(ValueError, match="min_terms"):
        T.TaskConfig(min_terms=1, max_terms=3, forget_rates=(0.0, 0.0, 0.0))


def test_extract_answer():
    assert T.extract_answer("1+2=3;3+4=7#7") == "7"
    assert T.extract_answer("1+2=3#003") == "3"
    assert T.extract_answer("1+2=3#0") == "0"
    assert T.extract_answer("1+2=3#") is None
    assert T.extract_answer("1+2=3") is None
    assert T.extract_answer("#12+3") is None
    assert T.steps_written("1+2=3;3+4=7#7") == 2


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
        assert len(ids) == len(text)  # one token per character: a digit, '+', '=', ';' or '#'
    p = prompt_ids(tok, "12+34")
    s = tok.decode(p)
    assert s.startswith("<|begin_of_text|>") and s.endswith("assistant<|end_header_id|>\n\n")
    assert "user<|end_header_id|>\n\n12+34<|eot_id|>" in s
    q0 = prompt_ids(tok, "12+34", with_question=False)
    assert "12+34" not in tok.decode(q0)
    # SAR's question-removed prompt as the library builds it from the problem's chat
    from swift_fast.demo.tokenizer import messages
    from swift_fast.rewards.sar_context import chat_context_ids

    assert chat_context_ids(tok, messages("12+34")) == q0
    assert tok.eos_token == "<|eot_id|>"
