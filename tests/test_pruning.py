"""The pruning policy and DeepConf's confidence signals (core, no engine): settings and their
errors, the ranking rule on hand-made groups, the replay, and the confidence math against
explicit loops in float64."""

from __future__ import annotations

import math
import random

import pytest
import torch

from swift_fast.rewards.confidence import RunningConfidence, lowest_group, tail, token_confidence
from swift_fast.selection.pruning import (
    PruneConfig,
    PruneConfigError,
    replay,
    running_confidence,
    running_swift,
    signal_lag,
    threshold,
    to_prune,
)


# -- settings ------------------------------------------------------------------------------------
def test_parse_fills_from_the_base_then_the_defaults_and_coerces_flat_strings():
    base = PruneConfig(signal="confidence", warmup=8)
    cfg = PruneConfig.parse({"keep": "0.25", "every": "4"}, base=base)
    assert cfg == PruneConfig(signal="confidence", warmup=8, every=4, keep=0.25)
    assert PruneConfig.parse(True) == PruneConfig()
    assert PruneConfig.parse(True, base=base) is base
    assert PruneConfig.parse(False) is None and PruneConfig.parse(None) is None
    assert PruneConfig.parse({"warmup": 12.0}).warmup == 12


@pytest.mark.parametrize("given, match", [
    ({"keep": 0}, r"prune: keep .* in \(0, 1\]"),
    ({"keep": 1.5}, r"keep .* in \(0, 1\]; got 1.5"),
    ({"keep": float("nan")}, r"keep"),
    ({"warmup": -1}, r"warmup must be a whole number >= 1"),
    ({"warmup": 0}, r"warmup must be a whole number >= 1"),
    ({"every": -2}, r"every must be a whole number >= 0"),
    ({"min_keep": 0}, r"min_keep"),
    ({"window": 2.5}, r"prune.window must be a whole number of tokens"),
    ({"signal": "entropy"}, r"signal must be one of \['swift', 'confidence', 'combined'\], got 'entropy'"),
    ({"kepp": 0.5}, r"unknown setting\(s\) \['kepp'\]"),
    ({"warmup": True}, r"prune.warmup must be a number"),
    ({"keep": "half"}, r"prune.keep must be a number, got 'half'"),
    ("fast", r"must be an object"),
])
def test_bad_settings_name_the_field(given, match):
    with pytest.raises(PruneConfigError, match=match):
        PruneConfig.parse(given)


def test_command_line_settings_as_json_or_pairs():
    from swift_fast.selection.pruning import parse_text

    assert parse_text("signal=confidence, keep=0.25,window=8") == PruneConfig(signal="confidence", keep=0.25, window=8)
    assert parse_text('{"warmup": 4, "every": 0}') == PruneConfig(warmup=4, every=0)
    assert parse_text("") == parse_text(None) == PruneConfig()
    with pytest.raises(PruneConfigError, match="key=value"):
        parse_text("keep")
    with pytest.raises(PruneConfigError, match="not valid JSON"):
        parse_text("{keep: 1}")


def test_thresholds():
    assert [threshold(PruneConfig(warmup=5, every=3), d) for d in range(3)] == [5, 8, 11]
    one = PruneConfig(warmup=5, every=0)
    assert threshold(one, 0) == 5 and threshold(one, 1) is None


# -- the ranking rule ---------------------------------------------------------------------------
def test_to_prune_keeps_the_best_fraction_ties_to_the_lower_index_nan_last():
    cfg = PruneConfig(keep=0.5, min_keep=1)
    assert to_prune([0.1, 0.9, 0.5, 0.3], cfg) == [0, 3]
    assert to_prune([0.5, 0.5, 0.5, 0.5], cfg) == [2, 3]  # ties: the lower index stays
    assert to_prune([math.nan, 0.2, -1.0], cfg) == [0]  # ceil(1.5) = 2 kept; NaN ranks last
    assert to_prune([None, 0.2], PruneConfig(keep=0.5, min_keep=1)) == [0]
    assert to_prune([1.0, 2.0, 3.0], PruneConfig(keep=1.0, min_keep=1)) == []
    assert to_prune([], cfg) == []


def test_combined_ranks_by_the_larger_of_the_two_ranks():
    cfg = PruneConfig(signal="combined", keep=0.5, min_keep=1)
    # swift ranks: c0 0, c1 1, c2 2, c3 3; confidence ranks: c0 3, c1 0, c2 1, c3 2
    # max ranks: c0 3, c1 1, c2 2, c3 3 -> keep c1 and c2
    pairs = [(4.0, 0.1), (3.0, 0.9), (2.0, 0.8), (1.0, 0.5)]
    assert to_prune(pairs, cfg) == [0, 3]
    # ties on the max rank go to the lower index; NaN ranks last under its signal
    assert to_prune([(1.0, math.nan), (0.5, 1.0), (0.2, 0.9), (0.9, 0.8)], PruneConfig(signal="combined", keep=0.25,
                                                                                    min_keep=1)) == [0, 2, 3]


def test_min_keep_counts_the_candidates_outside_the_ranking():
    cfg = PruneConfig(keep=0.25, min_keep=3)
    assert to_prune([4.0, 3.0, 2.0, 1.0], cfg) == [3]  # min_keep 3 beats ceil(1)
    assert to_prune([4.0, 3.0, 2.0, 1.0], cfg, others=1) == [2, 3]
    assert to_prune([4.0, 3.0, 2.0, 1.0], cfg, others=5) == [1, 2, 3]  # ceil keeps one running


def test_replay_follows_lock_step_decisions_by_hand():
    cfg = PruneConfig(warmup=2, every=2, keep=0.5, min_keep=1)
    signals = [
        [0.0, 1.0, 1.0, 1.0, 1.0, 1.0],  # best at 2, worst of the two left at 4
        [0.0, 0.5, 0.5, 0.5, 0.5, 0.5],  # pruned at 2
        [0.0, 2.0, 2.0, 2.0, 2.0],  # best throughout
        [0.0, 0.2, 0.2],  # would finish at 3 tokens; pruned at 2
    ]
    r = replay(signals, cfg)
    # at 2: running 0..3 -> keep ceil(2) (2 and 0); at 4: running {0, 2}: keep ceil(1) -> prune 0
    assert r.pruned == [True, True, False, True]
    assert r.tokens == [4, 2, 5, 2]


def test_replay_never_prunes_a_candidate_that_finished_at_the_threshold():
    r = replay([[1.0, 1.0], [0.0, 0.0, 0.0, 0.0]], PruneConfig(warmup=2, every=0, keep=0.5, min_keep=1))
    assert r.pruned == [False, False] and r.tokens == [2, 4]


def test_replay_with_the_emitted_lag_by_hand():
    """An emitted head's score over t tokens is known once token t + 1 exists: the decision at t
    sees a candidate of t + 1 tokens as finished, and stops the others at t + 1."""
    cfg = PruneConfig(warmup=2, every=2, keep=0.5, min_keep=1)
    signals = [
        [0.0, 1.0, 1.0, 1.0, 1.0, 1.0],  # kept at 2; at 4 the worse of the two running: pruned at 5
        [0.0, 0.5, 0.5, 0.5, 0.5, 0.5],  # pruned at 2 (+1)
        [0.0, 2.0, 2.0, 2.0, 2.0, 2.0],  # best throughout
        [0.0, 0.2, 0.2],  # 3 tokens: finished when the decision at 2 is taken, so never pruned
    ]
    r = replay(signals, cfg, lag=1)
    # at 2: running {0, 1, 2} (3 is finished, counted among the others): keep ceil(1.5) = 2 -> prune 1;
    # at 4: running {0, 2}: keep 1 -> prune 0
    assert r.pruned == [True, True, False, False]
    assert r.tokens == [5, 3, 6, 3]
    assert replay(signals, cfg).pruned == [True, True, False, True]  # without the lag: pruned at 2
    assert signal_lag(cfg, "emitted") == 1 and signal_lag(cfg, "predicting") == 0
    assert signal_lag(PruneConfig(signal="confidence"), "emitted") == 0
    assert signal_lag(PruneConfig(signal="combined"), "emitted") == 1


def test_running_swift_by_hand():
    g, r = [0.5, 0.0, 1.0], [2.0, 100.0, -1.0]
    assert running_swift([a * b for a, b in zip(g, r)], g) == pytest.approx([2.0, 2.0, (1.0 - 1.0) / 1.5])
    assert running_swift([0.0], [0.0]) == [0.0]  # no gate mass: sum 0 / eps


# -- DeepConf's confidence -------------------------------------------------------------------------
def test_token_confidence_against_float64_by_hand():
    torch.manual_seed(0)
    logits = torch.randn(5, 40, dtype=torch.float32) * 3
    for k in (1, 7, 20, 40, 100):
        got = token_confidence(logits, k)
        x = logits.double()
        want = []
        for row in x:
            lp = sorted((row - torch.logsumexp(row, 0)).tolist(), reverse=True)[: min(k, 40)]
            want.append(-sum(lp) / len(lp))
        torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    assert token_confidence(logits.bfloat16()).dtype == torch.float32
    with pytest.raises(ValueError, match=r"\[T, V\]"):
        token_confidence(logits[0])


def _lowest_by_loops(c, w):
    if len(c) <= w:
        return sum(c) / len(c)
    return min(sum(c[i : i + w]) / w for i in range(len(c) - w + 1))


def test_group_confidences_against_explicit_windows():
    rng = random.Random(0)
    for n in (1, 3, 16, 17, 40):
        c = [rng.uniform(0, 5) for _ in range(n)]
        for w in (1, 4, 16):
            assert lowest_group(c, w) == pytest.approx(_lowest_by_loops(c, w))
            assert tail(c, w) == pytest.approx(sum(c[-w:]) / len(c[-w:]))
            run = running_confidence(c, w)
            assert run == pytest.approx([_lowest_by_loops(c[: t + 1], w) for t in range(n)])
    assert math.isnan(lowest_group([], 4)) and math.isnan(tail([], 4)) and math.isnan(RunningConfidence(4).value())
    with pytest.raises(ValueError, match="window"):
        lowest_group([1.0], 0)


def test_running_confidence_does_not_drift_on_long_sequences():
    rng = random.Random(1)
    c = [rng.uniform(0, 1e4) if i % 2 else rng.uniform(0, 1e-3) for i in range(20000)]
    r = RunningConfidence(7)
    for x in c:
        r.push(x)
    assert r.value() == pytest.approx(_lowest_by_loops(c, 7), rel=1e-12)


# -- the report --------------------------------------------------------------------------------
def _cand(gr, g, conf, correct, score):
    return {"token_ids": list(range(len(g))), "correct": correct, "swift_score": score,
            "swift_trace": {"gate_reward": gr, "gate": g, "confidence": conf}}


def test_replayed_outcome_counts_tokens_and_picks_among_the_unpruned_by_hand():
    from swift_fast.data.rollouts import Problem
    from swift_fast.reports import pruning as pr

    # candidate 0 leads after 2 tokens but ends wrong with the best final score; 1 and 2 are pruned at 2
    p = Problem(id="p", candidates=[
        _cand([1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0] * 4, False, 0.5),
        _cand([0.0, 0.0, 4.0], [1.0, 1.0, 1.0], [3.0] * 3, True, 4.0 / 3),
        _cand([0.5, 0.0, 0.0], [1.0, 1.0, 1.0], [2.0] * 3, True, 1.0 / 6),
        _cand([2.0, 2.0], [1.0, 1.0], [0.5, 0.5], True, 2.0),  # finishes at the threshold
    ])
    cfg = PruneConfig(warmup=2, every=0, keep=0.5, min_keep=1)
    out = pr.replayed([p], cfg, 4)
    # at 2 tokens: running 0, 1, 2 (3 finished) with running scores 1.0, 0.0, 0.25 -> keep ceil(1.5) = 2
    assert out.pruned.tolist() == [[False, True, False, False]]
    assert out.total_tokens == 4 + 2 + 3 + 2
    assert out.correct.tolist() == [1.0]  # the pick is candidate 3 (score 2.0), never the pruned 1
    conf = pr.replayed([p], PruneConfig(signal="confidence", warmup=2, every=0, keep=0.5, min_keep=1, window=2), 4)
    assert conf.pruned.tolist() == [[True, False, False, False]]  # lowest confidence among 0, 1, 2
    full = pr.outcome([p], 4)
    c = pr.compare(full, out, reps=50)
    assert c["token_fraction"] == pytest.approx(11 / 12) and c["difference"] == 0.0 and c["pruned_candidates"] == 1
    with pytest.raises(Exception, match="swift_trace"):
        pr.replayed([Problem(id="q", candidates=[{"token_ids": [1], "correct": True, "swift_score": 1.0}])], cfg, 1)


def test_recommend_and_equal_budget_pick_by_hand():
    from swift_fast.reports import pruning as pr

    def row(signal, frac, acc):
        return {"settings": {"signal": signal}, "token_fraction": frac, "accuracy": acc, "full_accuracy": 0.9}

    rows = [row("swift", 0.3, 0.85), row("swift", 0.5, 0.895), row("swift", 0.6, 0.9), row("confidence", 0.4, 0.89),
            row("confidence", 0.7, 0.88)]
    assert pr.recommend(rows)["token_fraction"] == 0.5
    assert pr.recommend(rows, signal="confidence")["token_fraction"] == 0.4
    assert pr.recommend(rows, max_drop=0.0)["token_fraction"] == 0.6
    best = pr.at_budget(rows, 0.5)
    assert best["swift"]["accuracy"] == 0.895 and best["confidence"]["accuracy"] == 0.89 and best["combined"] is None


def test_random_baseline_keeps_the_policys_budget_and_picks_blindly():
    from swift_fast.data.rollouts import Problem
    from swift_fast.reports import pruning as pr

    # two candidates of 4 tokens; the correct one has the lower final score, so only pruning can
    # change the pick: random ranks keep it in some draws, never in all
    probs = [Problem(id=f"p{i}", candidates=[
        _cand([0.0] * 4, [1.0] * 4, [1.0] * 4, True, 0.0),
        _cand([1.0] * 4, [1.0] * 4, [1.0] * 4, False, 1.0),
    ]) for i in range(40)]
    cfg = PruneConfig(warmup=2, every=0, keep=0.5, min_keep=1)
    rnd = pr.replayed_random(probs, cfg, 2)
    assert rnd.total_tokens == 40 * (4 + 2)  # one of the two stopped at 2 tokens, in every draw
    assert 0.2 < rnd.accuracy < 0.8  # the correct one survives about half the time
    assert rnd.correct.tolist() == pr.replayed_random(probs, cfg, 2).correct.tolist()  # seeded
    assert pr.replayed(probs, cfg, 2).accuracy == 0.0  # the running SWIFT score stops the lower, correct one
    keep_all = pr.replayed_random(probs, PruneConfig(warmup=2, every=0, keep=1.0, min_keep=1), 2)
    assert keep_all.accuracy == pr.outcome(probs, 2).accuracy == 0.0 and keep_all.total_tokens == 40 * 8
