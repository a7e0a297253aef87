import random

import pytest
from test_demo_task import _steps  # the first task's independent reading of a solution

from swift_fast.demo import task_lag as L
from swift_fast.demo.tasks import module_for
from swift_fast.demo.tokenizer import build_tokenizer


def test_example():
    assert L.solution([4, 7, 2, 9, 5]) == "4+7=11;11+2=13;13+9=22;22+5=27#27"
    assert L.solution([4, 7, 2, 9, 5], lag=True) == "4+4=8;8+7=15;15+2=17;17+9=26#26"


@pytest.mark.parametrize("seed", range(3))
def test_lag_keeps_the_step_count_and_gives_one_wrong_total(seed):
    rng = random.Random(seed)
    cfg = L.LagConfig()
    for _ in range(100):
        terms = L.sample_terms(rng, cfg)
        assert cfg.min_terms <= len(terms) <= cfg.max_terms and all(1 <= t <= 9 for t in terms)
        good, bad = L.solution(terms), L.solution(terms, lag=True)
        gs, ga = _steps(good)
        bs, ba = _steps(bad)
        assert len(gs) == len(bs) == len(terms) - 1  # as many steps
        assert all(x + y == z for x, y, z in gs + bs)
        assert [y for _, y, _ in gs] == terms[1:] and [y for _, y, _ in bs] == terms[:-1]
        assert ga == sum(terms) and ba == sum(terms) - terms[-1] + terms[0] != ga
        assert L.lagged(bad, terms) and not L.lagged(good, terms)
        assert L.is_correct(good, terms) and not L.is_correct(bad, terms)


def test_lag_rate_grows_with_the_number_of_terms():
    rng = random.Random(0)
    cfg = L.LagConfig(lag_rates=(0.2, 0.4, 0.6, 0.8))
    seen = {n: [0, 0] for n in range(5, 9)}
    for _ in range(8000):
        terms = L.sample_terms(rng, cfg)
        seen[len(terms)][0] += L.lagged(L.training_solution(terms, cfg, rng), terms)
        seen[len(terms)][1] += 1
    for n, want in zip(range(5, 9), cfg.lag_rates):
        assert abs(seen[n][0] / seen[n][1] - want) < 0.05


def test_config_splits_tokenizer_and_dispatch():
    with pytest.raises(ValueError, match="one entry per number of terms"):
        L.LagConfig(lag_rates=(0.1,))
    cfg = L.LagConfig()
    assert module_for(cfg) is L
    a = L.make_split(100, cfg, seed=1)
    assert a == L.make_split(100, cfg, seed=1)
    qa = {L.question(t) for t in a}
    assert len(qa) == 100 and not qa & {L.question(t) for t in L.make_split(100, cfg, seed=2, exclude=qa)}
    tok = build_tokenizer()
    rng = random.Random(1)
    for _ in range(20):
        terms = L.sample_terms(rng, cfg)
        text = L.training_solution(terms, cfg, rng)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids and tok.decode(ids) == text and len(ids) == len(text)
