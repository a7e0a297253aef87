"""The pure-torch references against values computed independently, in float64 Python
arithmetic, straight from the equations (SWIFT Eq. 2-4, SAR Eq. 8-9)."""

import math
import random

import pytest
import torch

from swift_fast import SwiftHead, perplexity, rl_reward, sar_reward, swift_score, token_scores


def _hand_swift(layers64, weight, bias, cu, gate):
    """SWIFT score by explicit loops: concatenate, project, gate, gated average."""
    k = len(layers64)
    out = []
    for b in range(len(cu) - 1):
        num = den = 0.0
        for t in range(cu[b], cu[b + 1]):
            feats = [x for j in range(k) for x in layers64[j][t]]
            z = [sum(w * f for w, f in zip(weight[row], feats)) + bias[row] for row in range(len(weight))]
            if gate:
                g, r = 1.0 / (1.0 + math.exp(-z[0])), z[1]
            else:
                g, r = 1.0, z[0]
            num += g * r
            den += g
        out.append(0.0 if cu[b] == cu[b + 1] else num / max(den, 1e-8))
    return out


def _case(seed, T, d, k, gate, dtype):
    g = torch.Generator().manual_seed(seed)
    layers = [torch.randn(T, d, generator=g).to(dtype) for _ in range(k)]
    head = SwiftHead(d, list(range(k)), gate=gate)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=g) * 0.3)
        head.bias.copy_(torch.randn(head.bias.shape, generator=g))
    layers64 = [layer.double().tolist() for layer in layers]
    return layers, layers64, head


# bf16 inputs are exact in float64, so the tolerance covers only float32 accumulation.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("gate", [True, False])
def test_swift_score_matches_hand_computation(dtype, gate):
    cu = [0, 3, 3, 4, 11, 17]  # an empty and a single-token segment among them
    layers, layers64, head = _case(1, 17, 5, 3, gate, dtype)
    want = _hand_swift(layers64, head.weight.double().tolist(), head.bias.double().tolist(), cu, gate)
    got = swift_score(layers, head, torch.tensor(cu))
    assert got.dtype == torch.float32 and got.shape == (5,)
    assert got[1].item() == 0.0
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-5)


def test_no_gate_is_plain_mean_of_rewards():
    layers, layers64, head = _case(2, 6, 4, 2, False, torch.float32)
    got = swift_score(layers, head, torch.tensor([0, 6]))
    w, b = head.weight.double()[0], head.bias.double()[0]
    rs = [sum(w[i].item() * x for i, x in enumerate(layers64[0][t] + layers64[1][t])) + b.item() for t in range(6)]
    assert got.item() == pytest.approx(sum(rs) / 6, rel=1e-5)


def test_pairs_stand_for_their_sum_and_offsets_are_honoured():
    layers, layers64, head = _case(3, 9, 4, 2, True, torch.float32)
    halves = [(layer * 0.25, layer * 0.75) for layer in layers]
    cu = torch.tensor([2, 5, 9])  # rows 0-1 belong to no segment
    torch.testing.assert_close(swift_score(halves, head, cu), swift_score(layers, head, cu), rtol=1e-6, atol=1e-6)
    want = _hand_swift(layers64, head.weight.double().tolist(), head.bias.double().tolist(), [2, 5, 9], True)
    torch.testing.assert_close(
        swift_score(layers, head, cu).double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-6
    )


def test_gate_makes_a_weighted_average():
    # Two tokens; the gate row gives token 0 sigmoid(2) and token 1 sigmoid(-1).
    head = SwiftHead(1, [0])
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0], [1.0]]))
        head.bias.zero_()
    layer = torch.tensor([[2.0], [-1.0]])
    g0, g1 = 1 / (1 + math.exp(-2)), 1 / (1 + math.exp(1))
    assert swift_score([layer], head, torch.tensor([0, 2])).item() == pytest.approx((2 * g0 - g1) / (g0 + g1), rel=1e-6)
    gate, reward = token_scores([layer], head)
    assert gate.tolist() == pytest.approx([g0, g1]) and reward.tolist() == [2.0, -1.0]


def test_nan_stays_in_its_segment_and_wrong_layer_count_is_refused():
    layers, _, head = _case(4, 6, 3, 1, True, torch.float32)
    layers[0][4, 1] = float("nan")
    s = swift_score(layers, head, torch.tensor([0, 3, 6]))
    assert torch.isfinite(s[0]) and torch.isnan(s[1])
    with pytest.raises(ValueError, match="reads 1 states"):
        swift_score(layers * 2, head, torch.tensor([0, 6]))


def test_gate_floor_keeps_a_tiny_gate_sum_finite():
    head = SwiftHead(1, [0])
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0], [0.0]]))
        head.bias.copy_(torch.tensor([0.0, 3.0]))
    s = swift_score([torch.tensor([[-200.0]])], head, torch.tensor([0, 1]))
    # sigmoid(-200) ~ 1.4e-87 underflows to 0 in float32: R = 0 / max(0, 1e-8) = 0, not NaN.
    assert s.item() == 0.0


def _hand_ppl(lp):
    return math.exp(-sum(lp) / len(lp)) if lp else 1.0


def test_perplexity_and_sar_by_hand():
    rnd = random.Random(0)
    lens = [4, 0, 1, 7]
    with_q = [[-rnd.uniform(0.01, 3) for _ in range(n)] for n in lens]
    without_q = [[-rnd.uniform(0.01, 3) for _ in range(n)] for n in lens]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)))
    flat = lambda xs: torch.tensor([x for s in xs for x in s], dtype=torch.float32)  # noqa: E731 - one-line helper
    ppl = perplexity(flat(with_q), cu)
    assert ppl.tolist() == pytest.approx([_hand_ppl(x) for x in with_q], rel=1e-5)
    want = []
    for a, b in zip(with_q, without_q):
        p_aq, p_a = _hand_ppl(a), _hand_ppl(b)
        want.append(max(-1.0, min(1.0, (p_a - p_aq) / p_a)))
    got = sar_reward(flat(with_q), flat(without_q), cu)
    assert got.tolist() == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert got[1].item() == 0.0  # empty answer


def test_sar_clips_and_survives_huge_perplexities():
    cu = torch.tensor([0, 1, 2, 3])
    # question makes the answer far less likely: raw value 1 - e^3 -> clipped to -1
    with_q = torch.tensor([-5.0, -0.1, -900.0])
    without_q = torch.tensor([-2.0, -3.0, -1000.0])
    got = sar_reward(with_q, without_q, cu)
    assert got[0].item() == -1.0
    assert got[1].item() == pytest.approx(1 - math.exp(-2.9), rel=1e-6)
    # exp(1000) overflows float64, yet the ratio is exp(-100): R = 1 - e^-100
    assert got[2].item() == pytest.approx(1.0, abs=1e-7) and torch.isfinite(got).all()


def test_rl_reward_default_alpha():
    assert rl_reward(torch.tensor([1.0, 0.0]), torch.tensor([0.5, -1.0])).tolist() == pytest.approx([1.1, -0.2])


def test_sar_refuses_mismatched_passes():
    with pytest.raises(ValueError, match="same answer tokens"):
        sar_reward(torch.zeros(3), torch.zeros(4), torch.tensor([0, 3]))
