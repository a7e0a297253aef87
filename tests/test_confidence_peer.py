"""DeepConf's confidences (``swift_fast.rewards.confidence``) against float64 values worked out here
by plain loops, and against the ``deepconf`` package's own functions (``deepconf.utils``).

The peer's ``utils`` module is loaded from its file alone: the package's ``__init__`` imports vLLM
(its wrapper), which these functions do not use.

The peer rounds every token confidence to 3 decimals (``compute_confidence``) and every full
window's mean (``compute_least_grouped``); its tail and bottom-10% functions do not round. Fed
confidences that already have 3 decimals, the peer's tail and bottom 10% must then agree to float
precision and its windows to their rounding (5e-4).
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
from types import SimpleNamespace

import pytest
import torch

from swift_fast.rewards import confidence as cf

EXACT = 1e-12


# -- hand-worked float64 ---------------------------------------------------------------------------
def hand_windows(c, w):
    if not c:
        return []
    if len(c) <= w:
        return [sum(c) / len(c)]
    return [sum(c[i : i + w]) / w for i in range(len(c) - w + 1)]


def hand_token_confidence(row: list[float], k: int) -> float:
    lse = math.log(sum(math.exp(x - max(row)) for x in row)) + max(row)
    top = sorted((x - lse for x in row), reverse=True)[:k]
    return -sum(top) / len(top)


def sequences(seed=0):
    """Token confidences of several lengths around the windows used (3 decimals, as the peer keeps them)."""
    rnd = random.Random(seed)
    out = []
    for n in (1, 2, 3, 4, 5, 9, 16, 17, 40, 101, 230):
        out.append([round(rnd.uniform(0.2, 9.0), 3) for _ in range(n)])
    return out


WINDOWS = [1, 2, 4, 16, 2048]


def test_worked_example():
    c = [1.0, 3.0, 2.0, 6.0, 4.0]
    assert cf.window_means(c, 2) == [2.0, 2.5, 4.0, 5.0]
    assert cf.lowest_group(c, 2) == 2.0
    assert cf.tail(c, 2) == 5.0
    assert cf.bottom(c, 2) == 2.0  # 4 windows: the lowest max(1, int(0.4)) = 1
    assert cf.bottom(c, 2, fraction=0.5) == 2.25  # the lowest 2 of 4
    assert cf.window_means(c, 5) == [3.2] and cf.window_means(c, 9) == [3.2]  # at most W tokens: one group
    assert cf.summary(c, 9) == {"confidence_lowest_group": 3.2, "confidence_tail": 3.2, "confidence_bottom10": 3.2}
    assert cf.summary(c, 2) == {"confidence_lowest_group": 2.0, "confidence_tail": 5.0, "confidence_bottom10": 2.0}


@pytest.mark.parametrize("w", WINDOWS)
def test_group_confidences_equal_plain_loops(w):
    for c in sequences():
        means = hand_windows(c, w)
        got = cf.window_means(c, w)
        assert len(got) == len(means) == max(1, len(c) - w + 1)
        assert got == pytest.approx(means, rel=EXACT, abs=EXACT)
        k = max(1, len(means) // 10)
        want = {
            "confidence_lowest_group": min(means),
            "confidence_tail": sum(c[-w:]) / len(c[-w:]),
            "confidence_bottom10": sum(sorted(means)[:k]) / k,
        }
        assert cf.lowest_group(c, w) == pytest.approx(want["confidence_lowest_group"], rel=EXACT)
        assert cf.tail(c, w) == pytest.approx(want["confidence_tail"], rel=EXACT)
        assert cf.bottom(c, w) == pytest.approx(want["confidence_bottom10"], rel=EXACT)
        got = cf.summary(c, w)
        assert list(got) == list(want)
        for name in want:
            assert got[name] == pytest.approx(want[name], rel=EXACT), name


def test_bottom_averages_the_lowest_tenth_of_the_windows():
    rnd = random.Random(4)
    c = [rnd.uniform(1.0, 5.0) for _ in range(31)]  # W = 2: 30 windows, the lowest 3 averaged
    means = sorted(hand_windows(c, 2))
    assert cf.bottom(c, 2) == pytest.approx(sum(means[:3]) / 3, rel=EXACT)
    assert cf.bottom(c, 2) > cf.lowest_group(c, 2)
    assert cf.bottom(c[:20], 2) == pytest.approx(min(hand_windows(c[:20], 2)), rel=EXACT)  # 19 windows: 1


def test_no_token_no_confidence_and_windows_are_positive_integers():
    assert cf.window_means([], 4) == []
    for v in cf.summary([], 4).values():
        assert math.isnan(v)
    assert math.isnan(cf.bottom([], 4)) and math.isnan(cf.tail([], 4)) and math.isnan(cf.lowest_group([], 4))
    for bad in (0, -1, 2.0, True, None, "4"):
        for fn in (cf.window_means, cf.lowest_group, cf.tail, cf.bottom, cf.summary):
            with pytest.raises(ValueError, match="positive number of tokens"):
                fn([1.0, 2.0], bad)
    assert cf.DEFAULT_WINDOW == 2048 and cf.TOP_K == 20 and cf.BOTTOM_FRACTION == 0.1


def test_window_means_do_not_drift_on_long_sequences():
    """A reasoning trace's length (100k tokens) at DeepConf's window: every window mean as an exact
    float64 sum of its own tokens gives it, to 1e-9."""
    rnd = random.Random(1)
    c = [rnd.uniform(0.0, 20.0) for _ in range(100_000)]
    w = cf.DEFAULT_WINDOW
    got = cf.window_means(c, w)
    assert len(got) == len(c) - w + 1
    for i in range(0, len(got), 997):
        assert got[i] == pytest.approx(math.fsum(c[i : i + w]) / w, abs=1e-9)
    low = min(range(len(got)), key=got.__getitem__)
    assert cf.lowest_group(c, w) == pytest.approx(math.fsum(c[low : low + w]) / w, abs=1e-9)


# -- token confidence -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_confidence_equals_a_float64_top_k_by_hand(dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, 300, generator=g) * 4).to(dtype)
    got = cf.token_confidence(logits)
    assert got.dtype == torch.float32 and got.shape == (6,)
    rows = logits.double().tolist()
    want = [hand_token_confidence(r, 20) for r in rows]
    assert got.tolist() == pytest.approx(want, rel=2e-6)
    # the caller's logsumexp, as the plugin passes it
    lse = torch.logsumexp(logits.float(), dim=-1)
    assert cf.token_confidence(logits, lse=lse).tolist() == pytest.approx(want, rel=2e-6)
    assert cf.token_confidence(logits, k=3).tolist() == pytest.approx([hand_token_confidence(r, 3) for r in rows],
                                                                      rel=2e-6)


def test_token_confidence_caps_k_at_the_vocabulary_and_checks_its_input():
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    # k = 20 > V = 3: the mean of all three log-probs
    assert cf.token_confidence(logits).item() == pytest.approx(hand_token_confidence([0.0, 1.0, 2.0], 3), rel=1e-6)
    with pytest.raises(ValueError, match=r"\[T, V\]"):
        cf.token_confidence(torch.zeros(3))
    with pytest.raises(ValueError, match="at least 1"):
        cf.token_confidence(logits, k=0)


# -- the deepconf package -------------------------------------------------------------------------
def deepconf_utils():
    """``deepconf.utils`` (the ``deepconf`` test dependency), without running the package's
    ``__init__``; skips the test when the package is not installed."""
    spec = importlib.util.find_spec("deepconf")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the deepconf package is not installed (a test dependency: pip install -e '.[test]')")
    path = os.path.join(list(spec.submodule_search_locations)[0], "utils.py")
    module_spec = importlib.util.spec_from_file_location("_deepconf_utils", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def du():
    return deepconf_utils()


def logprobs_of(logits: torch.Tensor, k: int = 20) -> list[dict]:
    """What vLLM's ``logprobs=k`` gives a token whose sampled id is in the top k: ``{id: Logprob}``."""
    lp = torch.log_softmax(logits.double(), dim=-1)
    top = torch.topk(lp, k, dim=-1)
    return [{int(i): SimpleNamespace(logprob=float(v), rank=r + 1) for r, (v, i) in enumerate(zip(vals, ids))}
            for vals, ids in zip(top.values, top.indices)]


def test_token_confidence_equals_deepconfs_compute_confidence(du):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(40, 500, generator=g) * 3
    peer = du.compute_confidence(logprobs_of(logits))
    got = cf.token_confidence(logits).tolist()
    assert len(peer) == len(got)
    assert got == pytest.approx(peer, abs=5e-4 + 1e-6)  # the peer rounds to 3 decimals
    assert peer == [round(x, 3) for x in peer]


@pytest.mark.parametrize("w", [1, 2, 4, 16, 2048])
def test_group_confidences_equal_deepconfs(du, w):
    for c in sequences(seed=2):
        trace = {"confs": c}
        peer_lowest = min(du.compute_least_grouped(c, w))
        rounded = len(c) >= w  # a full window: the peer rounds its mean to 3 decimals
        assert cf.lowest_group(c, w) == pytest.approx(peer_lowest, abs=5e-4 + 1e-12 if rounded else EXACT)
        assert cf.tail(c, w) == pytest.approx(float(du.calculate_tail_confidence(trace, w)), rel=EXACT)
        assert cf.bottom(c, w) == pytest.approx(float(du.calculate_bottom_window_confidence(trace, w, 0.1)),
                                                rel=EXACT)
        peer_means = du.compute_least_grouped(c, w)
        assert cf.window_means(c, w) == pytest.approx(peer_means, abs=5e-4 + 1e-12 if rounded else EXACT)
        # the peer's min window (bottom_percent=-1) is the lowest group
        assert cf.lowest_group(c, w) == pytest.approx(
            float(du.calculate_bottom_window_confidence(trace, w, -1)), rel=EXACT)


def test_the_peer_and_the_plugin_agree_end_to_end_within_1e_3(du):
    """From logits to the three values: the peer's rounding twice (tokens, then windows) at most."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(57, 400, generator=g) * 2.5
    conf = cf.token_confidence(logits).tolist()
    peer_conf = du.compute_confidence(logprobs_of(logits))
    trace = {"confs": peer_conf}
    for w in (4, 8, 57, 64):
        got = cf.summary(conf, w)
        assert got["confidence_lowest_group"] == pytest.approx(min(du.compute_least_grouped(peer_conf, w)), abs=1e-3)
        assert got["confidence_tail"] == pytest.approx(float(du.calculate_tail_confidence(trace, w)), abs=1e-3)
        assert got["confidence_bottom10"] == pytest.approx(
            float(du.calculate_bottom_window_confidence(trace, w, 0.1)), abs=1e-3)
