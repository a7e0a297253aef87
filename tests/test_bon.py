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
