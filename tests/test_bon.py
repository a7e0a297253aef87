import math

import pytest
import torch

from swift_fast import (
    bon_accuracy,
    bon_select,
    combine_rank,
    combine_scaled,
    majority_vote,
    oracle_accuracy,
    weighted_vote,
)
from swift_fast.selection.bon import default_ks, exclude_pruned, minmax, ranks


def test_bon_uses_first_k_and_ties_go_to_lowest_index():
    s = [[0.1, 0.9, 0.9, 5.0], [3.0, 3.0, 1.0, 0.0], [float("nan"), -1.0, float("nan"), -2.0]]
    assert bon_select(s, 3).tolist() == [1, 0, 1]
    assert bon_select(s, 4).tolist() == [3, 0, 1]
    assert bon_select(s, 1).tolist() == [0, 0, 0]
    assert bon_select([[float("nan")] * 3], 3).tolist() == [0]


def test_bon_accuracy_and_oracle():
    scores = [[0.2, 0.8, 0.5, 0.1], [0.9, 0.1, 0.3, 0.2]]
    correct = [[True, False, True, False], [False, False, False, True]]
    assert bon_accuracy(scores, correct, [1, 2, 4]) == {1: 0.5, 2: 0.0, 4: 0.0}
    assert oracle_accuracy(correct, [1, 2, 3, 4]) == {1: 0.5, 2: 0.5, 3: 0.5, 4: 1.0}
    with pytest.raises(ValueError, match="k=5"):
        bon_select(scores, 5)


def test_ranks_are_stable_descending():
    assert ranks([[0.5, 0.9, 0.5, 0.1]], 4).tolist() == [[1, 0, 2, 3]]


def test_combine_rank_by_hand():
    a = [[0.9, 0.8, 0.1, 0.5]]  # ranks 0 1 3 2
    b = [[0.1, 0.7, 0.9, 0.8]]  # ranks 3 2 0 1
    # rank_rel = max: 3 2 3 2 -> lowest is 2, first at index 1
    assert combine_rank(a, b, 4).tolist() == [1]
    # k=2: a ranks 0 1, b ranks 1 0 -> rel 1 1 -> tie -> index 0
    assert combine_rank(a, b, 2).tolist() == [0]


def test_combine_scaled_by_hand():
    a = [[0.0, 10.0, 5.0], [2.0, 2.0, 2.0]]
    b = [[1.0, 0.0, 0.8], [1.0, 3.0, 2.0]]
    # problem 0: a -> 0, 1, .5 ; b -> 1, 0, .8 ; mean .5 .5 .65 -> index 2
    # problem 1: a all equal -> 1 ; b -> 0, 1, .5 ; mean .5 1 .75 -> index 1
    assert combine_scaled(a, b, 3).tolist() == [2, 1]
    assert minmax([[2.0, 2.0]], 2).tolist() == [[1.0, 1.0]]
    m = minmax([[float("nan"), 1.0, 3.0, float("inf")]], 4)
    assert m.tolist() == [[0.0, 0.0, 1.0, 1.0]]


def test_majority_vote_rules():
    answers = [
        ["7", "8", "8", "7", "9"],  # tie 7/8 at k=4 -> answer seen first (7) -> index 0
        [None, "3", None, "4", "4"],  # None does not vote
        [None, None, None, None, None],  # nothing extracted -> index 0
    ]
    assert majority_vote(answers, 4).tolist() == [0, 1, 0]
    assert majority_vote(answers, 5).tolist() == [0, 3, 0]
    assert majority_vote(answers, 3).tolist() == [1, 1, 0]


def test_weighted_vote_sums_sigmoid_of_scores():
    answers = [["a", "b", "b"]]
    scores = [[4.0, -1.0, -1.5]]
    # a: sigmoid(4)=.982 ; b: sigmoid(-1)+sigmoid(-1.5)=.269+.182=.451 -> a wins although b is the majority
    assert weighted_vote(answers, scores, 3).tolist() == [0]
    assert majority_vote(answers, 3).tolist() == [1]
    s = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731 - a one-line helper for this check
    assert s(4.0) > s(-1.0) + s(-1.5)


def test_default_ks():
    assert default_ks(16) == [1, 2, 4, 8, 16]
    assert default_ks(12) == [1, 2, 4, 8, 12]
    assert default_ks(1) == [1]


def test_scores_must_be_a_matrix():
    with pytest.raises(ValueError, match="problems, candidates"):
        bon_select(torch.zeros(4), 1)


def test_a_pruned_candidate_is_never_picked_while_another_exists():
    """Candidates stopped during generation (pruned) lose to any other, even one without a score;
    a problem whose candidates were all pruned still gets its best one."""
    nan = float("nan")
    scores = torch.tensor([[0.9, 0.1, 0.5], [0.9, nan, nan], [0.2, 0.8, 0.5], [0.3, 0.1, 0.9]], dtype=torch.float64)
    pruned = torch.tensor([[True, False, False], [True, False, False], [True, True, True], [False, True, True]])
    assert bon_select(scores, 3, pruned=pruned).tolist() == [2, 1, 1, 0]
    assert bon_select(scores, 2, pruned=pruned).tolist() == [1, 1, 1, 0]
    ex = exclude_pruned(scores, pruned, 3)
    assert torch.isnan(ex[0, 0]) and ex[2].tolist() == [0.2, 0.8, 0.5] and torch.isnan(ex[3, 2])


def test_bon_select_takes_none_as_nan():
    """vLLM reports a value it could not compute as None (README): a score row may hold it."""
    assert bon_select([[None, 0.2, 0.7], [None, None, None], [0.1, None, 0.1]], 3).tolist() == [2, 0, 0]
    assert bon_select([[None, 0.2], [0.3, None]], 2, pruned=[[False, True], [True, False]]).tolist() == [0, 1]


# -- best_output: the pick over one request's candidates, duck-typed ------------------------------
def _cand(index, **values):
    from types import SimpleNamespace

    return SimpleNamespace(index=index, text=f"c{index}", swift_pruned=values.pop("pruned", False), **values)


def test_best_output_skips_none_nan_and_pruned_candidates():
    from types import SimpleNamespace

    from swift_fast import best_output

    nan = float("nan")
    outs = [_cand(0, swift_score=None, sar=0.1), _cand(1, swift_score=0.9, sar=0.9, pruned=True),
            _cand(2, swift_score=nan, sar=None), _cand(3, swift_score=0.4, sar=0.2), _cand(4, swift_score=0.6, sar=0.2)]
    request = SimpleNamespace(outputs=outs)
    assert best_output(request).index == 4  # 0.9 is pruned, None and NaN never win
    assert best_output(request, by="sar").index == 3  # a tie at 0.2: the lower index
    assert best_output(outs[::-1], by="sar").index == 3  # the order is the candidates' own index
    assert best_output(SimpleNamespace(choices=outs)).index == 4  # an OpenAI response
    parsed = {"choices": [{"index": 0, "swift_score": 0.2}, {"index": 1, "swift_score": 0.7, "swift_pruned": False}]}
    assert best_output(parsed)["index"] == 1  # its parsed JSON (requests' .json())
    # mappings (JSON choices), and no index: the list order breaks ties
    assert best_output([{"swift_score": 0.5, "text": "a"}, {"swift_score": 0.5, "text": "b"}])["text"] == "a"
    # -inf is a value: it may win when it is the only one
    assert best_output([_cand(0, swift_score=None), _cand(1, swift_score=float("-inf"))]).index == 1


def test_best_output_says_why_no_candidate_is_left_or_returns_the_default():
    from swift_fast import best_output

    none_left = [_cand(0, swift_score=None), _cand(1, swift_score=0.9, pruned=True), _cand(2, swift_score=float("nan"))]
    why = r"of 3 candidates, 2 without a swift_score value \(None or NaN\) and 1 pruned"
    with pytest.raises(ValueError, match=why):
        best_output(none_left)
    assert best_output(none_left, default=None) is None
    with pytest.raises(ValueError, match="there are no candidates"):
        best_output([])
    with pytest.raises(ValueError, match=r"no candidate has a 'swift' value: check the name"):
        best_output([_cand(0, swift_score=1.0)], by="swift")
    with pytest.raises(ValueError, match="is not a number"):
        best_output([_cand(0, swift_score="high")])


def test_the_readme_snippet_failed_where_best_output_does_not():
    """The README's former one-liner raised on a None score and could pick a pruned candidate."""
    from swift_fast import best_output

    outs = [_cand(0, swift_score=None), _cand(1, swift_score=2.0, pruned=True), _cand(2, swift_score=1.0)]
    with pytest.raises(TypeError):
        max(outs, key=lambda c: c.swift_score)
    assert max(outs[1:], key=lambda c: c.swift_score).swift_pruned  # the old pick
    assert best_output(outs).index == 2


# -- one home per rule: flat candidates laid out by problem, oracle, random pick, the bootstrap ----
def test_by_problem_lays_flat_candidates_out_with_padding_marked():
    from swift_fast.selection.bon import by_problem

    groups = [5, 2, 5, 2, 9, 5]  # problem 2: candidates 1, 3; problem 5: 0, 2, 5; problem 9: 4
    scores = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], dtype=torch.float64)
    correct = torch.tensor([True, False, False, True, False, True])
    (s, c), pad = by_problem(groups, scores, correct)
    # rows in sorted order of the ids, each problem's candidates in their flat order, padding (NaN) at the end
    assert s.nan_to_num(-7.0).tolist() == [[0.2, 0.4, -7.0], [0.1, 0.3, 0.6], [0.5, -7.0, -7.0]]
    assert c.tolist() == [[False, True, False], [True, False, True], [False, False, False]]
    assert pad.tolist() == [[False, False, True], [False, False, False], [False, True, True]]
    (empty,), pad0 = by_problem(torch.zeros(0, dtype=torch.long), torch.zeros(0))
    assert empty.shape == (0, 0) and pad0.shape == (0, 0)


def test_padding_is_never_picked_and_an_all_nan_problem_picks_its_first_candidate():
    from swift_fast.selection.bon import by_problem

    nan = float("nan")
    # problem 0: every score NaN -> its first candidate (index 0), never the padding after it;
    # problem 1: a tie at 0.7 -> the lower index; problem 2: one candidate with -inf, padding NaN
    groups = [0, 0, 1, 1, 1, 2]
    scores = [nan, nan, 0.7, 0.2, 0.7, float("-inf")]
    (s,), pad = by_problem(groups, torch.tensor(scores, dtype=torch.float64))
    assert bon_select(s, 3, pruned=pad).tolist() == [0, 0, 0]
    flipped = [nan, nan, 0.2, 0.7, 0.7, float("-inf")]
    (s,), pad = by_problem(groups, torch.tensor(flipped, dtype=torch.float64))
    assert bon_select(s, 3, pruned=pad).tolist() == [0, 1, 0]


def test_oracle_and_random_pick_by_hand_with_and_without_pruning():
    from swift_fast.selection.bon import oracle, random_pick

    correct = torch.tensor([[False, True, False, True], [True, False, False, False], [False, False, True, False]])
    pruned = torch.tensor([[False, True, False, False], [True, True, True, True], [False, False, True, True]])
    # by hand, first k = 3: p0 has c1 correct; p1 c0; p2 c2
    assert oracle(correct, 3).tolist() == [1.0, 1.0, 1.0]
    assert random_pick(correct, 3).tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    # pruned: p0 may pick c0, c2 (neither correct); p1 all pruned so all count; p2 only c0, c1
    assert oracle(correct, 3, pruned).tolist() == [0.0, 1.0, 0.0]
    assert random_pick(correct, 3, pruned).tolist() == pytest.approx([0.0, 1 / 3, 0.0])
    # default k: every candidate; p0 may pick c0, c2, c3 of which c3 is correct
    assert oracle(correct, pruned=pruned).tolist() == [1.0, 1.0, 0.0]
    assert random_pick(correct, pruned=pruned).tolist() == pytest.approx([1 / 3, 1 / 4, 0.0])
    assert oracle_accuracy(correct, [3, 4]) == {3: 1.0, 4: 1.0}


def _quantile(values, q):
    """Linear interpolation between order statistics, written out (numpy's default, 'linear')."""
    v = sorted(values)
    h = (len(v) - 1) * q
    lo = math.floor(h)
    return v[lo] + (h - lo) * (v[min(lo + 1, len(v) - 1)] - v[lo])


def _brute_interval(values, reps, seed, level=0.95):
    """The bootstrap over problems by hand: one [reps, P] draw, each resample's mean over the drawn
    problems that have a number (NaN ones count for nothing), resamples without one left out."""
    g = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, len(values), (reps, len(values)), generator=g).tolist()
    means = []
    for row in draws:
        kept = [values[i] for i in row if not math.isnan(values[i])]
        if kept:
            means.append(sum(kept) / len(kept))
    return _quantile(means, (1 - level) / 2), _quantile(means, (1 + level) / 2)


@pytest.mark.parametrize("sum_by", ["draws", "counts"])
def test_the_bootstrap_over_problems_against_a_brute_force(sum_by):
    from swift_fast.selection.bootstrap import bootstrap_interval

    nan = float("nan")
    values = [1.0, 0.0, 0.5, nan, 1.0, 0.25, nan, 0.0, 1.0, 0.75, 0.0, 1 / 3]
    for reps, seed in ((2000, 0), (300, 7), (257, 3)):  # 257: one resample past a chunk
        lo, hi = bootstrap_interval(torch.tensor(values, dtype=torch.float64), reps=reps, seed=seed, sum_by=sum_by)
        want = _brute_interval(values, reps, seed)
        assert lo == pytest.approx(want[0], abs=1e-12) and hi == pytest.approx(want[1], abs=1e-12)
    lo, hi = bootstrap_interval(values, reps=500, level=0.8, seed=1, sum_by=sum_by)
    assert (lo, hi) == pytest.approx(_brute_interval(values, 500, 1, level=0.8), abs=1e-12)
    # nothing to resample: no interval
    assert all(math.isnan(x) for x in bootstrap_interval([nan, nan], sum_by=sum_by))
    assert all(math.isnan(x) for x in bootstrap_interval([], sum_by=sum_by))
    assert bootstrap_interval(torch.ones(10), sum_by=sum_by) == (1.0, 1.0)


def test_the_bootstrap_draws_in_chunks_that_are_the_rows_of_one_draw(monkeypatch):
    from swift_fast.selection import bootstrap

    values = torch.tensor([0.0, 1.0, 1.0, 0.5, 0.25] * 40, dtype=torch.float64)
    shapes = []
    randint = torch.randint

    def spy(*args, **kw):
        out = randint(*args, **kw)
        shapes.append(tuple(out.shape))
        return out

    monkeypatch.setattr(bootstrap.torch, "randint", spy)
    means = bootstrap.resample_means(values, reps=700, seed=4)
    monkeypatch.undo()
    assert shapes == [(256, 200), (256, 200), (188, 200)]  # memory: CHUNK rows at a time
    g = torch.Generator().manual_seed(4)
    draws = torch.randint(0, 200, (700, 200), generator=g)
    assert torch.equal(means, values[draws].mean(1))  # the same numbers as one [700, 200] draw
