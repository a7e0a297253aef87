"""DeepConf online's policy (swift_fast.selection.deepconf) on hand-worked groups: the threshold,
each crossing, waves and the consensus stop, and the settings' errors. The engine side is in
tests/test_vllm_pruning.py (V1 runner) and tests/test_vllm_runner_v2.py (Model Runner V2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from swift_fast.selection.deepconf import (
    CONSENSUS,
    THRESHOLD,
    DeepConfConfig,
    DeepConfConfigError,
    Group,
    consensus_share,
    crossing,
    percentile,
    replay,
)


@pytest.mark.parametrize("q", [0, 10, 37.5, 50, 90, 100])
def test_the_threshold_percentile_is_numpys_linear_one(q):
    values = [4.2, 1.0, 3.3, 7.9, 2.5]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-12)
    assert percentile(values + [math.nan, None], q) == pytest.approx(float(np.percentile(values, q)), abs=1e-12)
    assert math.isnan(percentile([math.nan], q))


def test_a_crossing_is_the_first_full_window_below_the_threshold():
    c = [5.0, 5.0, 4.0, 1.0, 1.0, 5.0]
    # windows of 2 end at t = 2..6 with means 5, 4.5, 2.5, 1, 3
    assert crossing(c, 4.0, 2) == 4
    assert crossing(c, 4.6, 2) == 3
    assert crossing(c, 0.5, 2) is None
    assert crossing(c[:1], 9.0, 2) is None, "shorter than a window: never stopped (DeepConf's processor)"
    assert crossing([3.0, 3.0], 3.5, 2) == 2
    # running SWIFT scores: the first t >= window below the threshold
    assert crossing([0.1, -2.0, 0.3, -1.0], 0.0, 2, "swift") == 2
    assert crossing([0.1, -2.0, 0.3, -1.0], 0.0, 3, "swift") == 4


def test_a_long_crossing_scan_does_not_drift():
    c = [1e8, 1.0, 1.0] * 3000 + [0.5] * 10
    w = 3
    got = crossing(c, 0.9, w)
    # by hand: the first window of three 0.5s (or a window mixing 1.0s and 0.5s below 0.9)
    means = [sum(c[t - w:t]) / w for t in range(w, len(c) + 1)]
    want = next(t for t, m in zip(range(w, len(c) + 1), means) if m < 0.9)
    assert got == want


def test_without_waves_later_candidates_are_judged_on_their_own_sequences():
    cfg = DeepConfConfig(warmup=2, percentile=50, window=2, consensus=None, wave=0)
    sig = [[5, 5, 5], [3, 3, 3, 3], [5, 4, 1, 1, 5], [6, 6, 6, 6], [2, 2]]
    r = replay(sig, cfg)
    assert r.threshold == 4.0  # lowest groups 5 and 3
    assert r.stopped == [None, None, THRESHOLD, None, THRESHOLD]
    assert r.crossing == [None, None, 3, None, 2]
    assert all(r.started)
    # a later candidate that finished before the warmup did is kept, and its crossing ignored
    r = replay(sig, cfg, early=[4])
    assert r.stopped == [None, None, THRESHOLD, None, None]


def test_the_warmup_is_never_stopped_and_high_keeps_more_than_low():
    sig = [[1.0] * 4, [2.0] * 4, [3.0] * 4, [4.0] * 4, [2.5] * 4, [1.5] * 4, [3.5] * 4, [0.5] * 4]
    low = replay(sig, DeepConfConfig(warmup=4, percentile=90, window=2, consensus=None))
    high = replay(sig, DeepConfConfig(warmup=4, percentile=10, window=2, consensus=None))
    assert low.stopped[:4] == high.stopped[:4] == [None] * 4
    assert low.threshold == pytest.approx(3.7) and high.threshold == pytest.approx(1.3)
    assert low.stopped[4:] == [THRESHOLD, THRESHOLD, THRESHOLD, THRESHOLD]
    assert high.stopped[4:] == [None, None, None, THRESHOLD]


def test_waves_stop_on_consensus_before_later_waves_start():
    cfg = DeepConfConfig(warmup=2, percentile=0, window=2, consensus=0.7, wave=2)
    sig = [[5.0] * 3, [5.0] * 3, [5.0] * 3, [6.0] * 3, [5.0] * 3, [5.0] * 3]  # threshold 5: none crosses
    # warmup: a 5 / b 5 -> 0.5; wave 1 (2, 3): a 10 / b 11 -> 11/21, so wave 2 runs; after the last
    # wave nothing is left to stop and no vote is taken
    answers = ["a", "b", "a", "b", "a", "a"]
    r = replay(sig, cfg, answers)
    assert r.stopped == [None] * 6 and r.share == pytest.approx(11 / 21)
    answers = ["a", "b", "a", "a", "b", "b"]  # after wave 1: a 5 + 5 + 6 = 16 of 21 >= 0.7
    r = replay(sig, cfg, answers)
    assert r.stopped == [None, None, None, None, CONSENSUS, CONSENSUS]
    assert r.started == [True, True, True, True, False, False]
    assert r.share == pytest.approx(16 / 21)
    # the same group without answers takes no vote
    assert replay(sig, cfg).stopped == [None] * 6


def test_consensus_at_the_warmup_stops_the_running_candidates_without_waves():
    cfg = DeepConfConfig(warmup=2, percentile=0, window=2, consensus=0.9, wave=0)
    sig = [[5.0] * 3] * 5
    r = replay(sig, cfg, ["7", "7", "8", None, "9"])
    assert r.stopped == [None, None, CONSENSUS, CONSENSUS, CONSENSUS] and all(r.started)
    # stopped candidates do not vote, None answers do not vote, and a crossing beats the vote
    assert consensus_share(["x", None, "y", "x"], [1.0, 5.0, 2.0, 1.0]) == pytest.approx(0.5)
    assert math.isnan(consensus_share([None, None], [1.0, 1.0]))


def test_a_warmup_candidate_without_a_signal_does_not_hold_the_group():
    g = Group(DeepConfConfig(warmup=2, percentile=50, window=2, consensus=None, wave=1), 4)
    g.finish(0, math.nan)  # an engine error
    assert not g.due()
    g.finish(1, 3.0)
    assert g.due()
    assert g.advance() == ([], [2])
    assert g.threshold == 3.0


@pytest.mark.parametrize("given, match", [
    ({"warmup": 0}, r"warmup must be a whole number >= 1"),
    ({"percentile": 120}, r"percentile .* in \[0, 100\]"),
    ({"consensus": 0}, r"consensus .* in \(0, 1\]"),
    ({"wave": -1}, r"wave must be a whole number >= 0"),
    ({"window": 2.5}, r"window must be a whole number"),
    ({"signal": "entropy"}, r"signal must be one of"),
    ({"warmpu": 4}, r"unknown setting.*warmpu"),
    ("yes", r"must be an object"),
])
def test_bad_settings_name_the_field(given, match):
    with pytest.raises(DeepConfConfigError, match=match):
        DeepConfConfig.parse(given, where="deepconf")


def test_flat_strings_read_as_numbers_and_a_request_needs_more_than_the_warmup():
    cfg = DeepConfConfig.parse({"warmup": "3", "percentile": "90", "consensus": "null", "wave": "2"})
    assert cfg == DeepConfConfig(warmup=3, percentile=90.0, consensus=None, wave=2)
    assert DeepConfConfig.parse(True) == DeepConfConfig() and DeepConfConfig.parse(False) is None
    with pytest.raises(DeepConfConfigError, match=r"n = 3.*ask for more"):
        Group(cfg, 3)
