"""Selectors by value name (``swift_fast.selection.by_value``): their names, what each needs, and
the one pick, against hand-worked examples."""

from __future__ import annotations

import math

import pytest
import torch

from swift_fast.selection import by_value as bv
from swift_fast.selection.by_value import Available, SelectorError, check_prune, check_selector, choose, needs, parse
from swift_fast.selection.pruning import PruneConfig

NAN = float("nan")
ALL = Available(head=True, sar=True, answers=True)
NOTHING = Available(head=False, sar=False, answers=False)
SWIFT = bv.FIELD["swift"]  # the key ``choose`` reads SWIFT scores under (vLLM's ``swift_score``)


# -- names ----------------------------------------------------------------------------------------
def test_the_values_and_their_fields():
    assert bv.HEAD_FREE == ("mean_logprob", "confidence_lowest_group", "confidence_tail", "confidence_bottom10")
    assert bv.VALUES == ("swift", "sar") + bv.HEAD_FREE
    assert bv.FIELD == {"swift": "swift_score", **{v: v for v in bv.VALUES[1:]}}
    assert bv.DEFAULT_HEAD_FREE == "confidence_lowest_group"
    assert bv.all_selectors() == [*bv.VALUES, "rank", "scaled", "vote", *[f"vote:{v}" for v in bv.VALUES]]


def test_parse():
    for v in bv.VALUES:
        assert parse(v) == ("value", v)
        assert parse(f"vote:{v}") == ("vote", v)
    assert parse("swift_score") == ("value", "swift")  # vLLM's field name
    assert parse(" sar ") == ("value", "sar")
    assert parse("rank") == ("rank", None) and parse("scaled") == ("scaled", None)
    assert parse("vote") == ("vote", None)


@pytest.mark.parametrize("bad", ["best", "vote:", "vote:best", "vote:swift_score", "confidence", "", None, 3, ["sar"]])
def test_an_unknown_selector_is_refused_by_name_and_where(bad):
    with pytest.raises(SelectorError) as e:
        parse(bad, where='additional_config["swift_fast"]["select"]')
    msg = str(e.value)
    assert msg.startswith(f'additional_config["swift_fast"]["select"] = {bad!r} is not a selector')
    for s in bv.all_selectors():
        assert repr(s) in msg
    assert isinstance(e.value, ValueError)


def test_needs():
    assert needs("swift") == Available(head=True, sar=False, answers=False)
    assert needs("sar") == Available(head=False, sar=True, answers=False)
    for v in bv.HEAD_FREE:
        assert needs(v) == NOTHING
        assert needs(f"vote:{v}") == Available(head=False, sar=False, answers=True)
    assert needs("rank") == needs("scaled") == Available(head=True, sar=True, answers=False)
    assert needs("vote") == Available(head=False, sar=False, answers=True)
    assert needs("vote:swift") == Available(head=True, sar=False, answers=True)
    assert needs("vote:sar") == Available(head=False, sar=True, answers=True)


def test_every_selector_passes_with_everything_and_the_head_free_ones_with_nothing():
    for s in bv.all_selectors():
        check_selector(s, ALL)
    for v in bv.HEAD_FREE:
        check_selector(v, NOTHING)
        check_selector(f"vote:{v}", Available(head=False, sar=False, answers=True))
    check_selector("sar", Available(head=False, sar=True, answers=False))


HEAD = "a SWIFT head"
SAR = 'SAR ("sar": true)'
ANSWERS = "an answer extractor"


@pytest.mark.parametrize(
    "selector, have, missing",
    [
        ("swift", NOTHING, [HEAD]),
        ("swift_score", Available(False, True, True), [HEAD]),
        ("sar", Available(True, False, True), [SAR]),
        ("rank", Available(True, False, False), [SAR]),
        ("scaled", Available(False, True, False), [HEAD]),
        ("rank", NOTHING, [HEAD, SAR]),
        ("vote", Available(True, True, False), [ANSWERS]),
        ("vote:confidence_tail", NOTHING, [ANSWERS]),
        ("vote:swift", Available(False, True, False), [HEAD, ANSWERS]),
        ("vote:sar", Available(True, False, True), [SAR]),
    ],
)
def test_a_selector_that_needs_what_is_missing_names_both(selector, have, missing):
    with pytest.raises(SelectorError) as e:
        check_selector(selector, have, where="select")
    msg = str(e.value)
    assert msg.startswith(f"select = {selector!r} needs ")
    assert msg.endswith("which this engine does not have")
    for m in missing:
        assert m in msg
    for m in {HEAD, SAR, ANSWERS} - set(missing):
        assert m not in msg
    if HEAD in missing:  # it says what works without one
        for v in bv.HEAD_FREE:
            assert repr(v) in msg


def test_an_unknown_selector_is_refused_before_what_it_needs():
    with pytest.raises(SelectorError, match="'best' is not a selector"):
        check_selector("best", ALL, where="select")


def test_a_pruning_signal_that_needs_a_head():
    for signal in ("swift", "combined"):
        with pytest.raises(SelectorError) as e:
            check_prune(PruneConfig(signal=signal), NOTHING, where="prune")
        assert str(e.value).startswith(f"prune: signal {signal!r}") and "needs a SWIFT head" in str(e.value)
        check_prune(PruneConfig(signal=signal), Available(True, False, False))
    check_prune(PruneConfig(signal="confidence"), NOTHING)


# -- the pick -------------------------------------------------------------------------------------
def test_the_highest_value_wins_ties_to_the_lowest_index():
    assert choose({"mean_logprob": [-1.0, -0.5, -0.7]}, "mean_logprob") == 1
    assert choose({"confidence_tail": [3.0, 5.0, 5.0, 1.0]}, "confidence_tail") == 1
    assert choose({"sar": [0.2, 0.2]}, "sar") == 0
    assert choose({SWIFT: [0.1, 0.9]}, "swift") == 1
    assert choose({SWIFT: [0.1, 0.9]}, "swift_score") == 1
    # the value the selector names, whatever else is given
    vals = {"confidence_tail": [1.0, 2.0, 3.0], "confidence_lowest_group": [3.0, 2.0, 1.0]}
    assert choose(vals, "confidence_tail") == 2 and choose(vals, "confidence_lowest_group") == 0


@pytest.mark.parametrize("missing", [None, NAN])
def test_a_missing_value_never_wins_over_a_number(missing):
    assert choose({"confidence_bottom10": [missing, -5.0, missing]}, "confidence_bottom10") == 1
    assert choose({"mean_logprob": [missing, missing, -30.0]}, "mean_logprob") == 2
    assert choose({"sar": [missing, missing]}, "sar") == 0  # none has one: the first


def test_an_ineligible_candidate_wins_only_when_all_are():
    v = {"confidence_lowest_group": [1.0, 3.0, 2.0]}
    assert choose(v, "confidence_lowest_group", eligible=[True, False, True]) == 2
    assert choose(v, "confidence_lowest_group", eligible=[False, False, True]) == 2
    assert choose(v, "confidence_lowest_group", eligible=[False, False, False]) == 1
    assert choose(v, "confidence_lowest_group", eligible=[True, True, True]) == 1
    # an eligible candidate without a value still beats an ineligible one with a value
    assert choose({"sar": [None, 0.9]}, "sar", eligible=[True, False]) == 0


def test_rank_and_scaled_combinations_by_hand():
    # ranks (0 best): swift [1, 0, 2], sar [0, 2, 1] -> max [1, 2, 2] -> candidate 0
    v = {SWIFT: [0.5, 0.9, 0.1], "sar": [0.8, -0.2, 0.3]}
    assert choose(v, "rank") == 0
    # scaled: swift [0.5, 1, 0], sar [1, 0, 0.5] -> means [0.75, 0.5, 0.25] -> candidate 0
    assert choose(v, "scaled") == 0
    # where they disagree: ranks swift [0, 2, 1], sar [2, 0, 1] -> max [2, 2, 1] -> 2; scaled swift
    # [1, 0, 0.6], sar [0, 1, 0.3] -> means [0.5, 0.5, 0.45] -> 0 (tie to the lowest index)
    v = {SWIFT: [10.0, 0.0, 6.0], "sar": [0.0, 10.0, 3.0]}
    assert choose(v, "rank") == 2
    assert choose(v, "scaled") == 0
    v = {SWIFT: [3.0, 2.0, 1.0, 0.0], "sar": [0.0, 0.9, 1.0, 0.95]}
    # rank: swift [0, 1, 2, 3], sar [3, 2, 0, 1] -> max [3, 2, 2, 3] -> 1 (tie to the lowest index)
    assert choose(v, "rank") == 1
    # scaled: swift [1, 2/3, 1/3, 0], sar [0, .9, 1, .95] -> means [.5, .783, .667, .475] -> 1
    assert choose(v, "scaled") == 1


def test_majority_vote_by_hand():
    # "8" three times against "7" twice; None (nothing extracted) does not vote; the pick is the
    # winning answer's first candidate
    assert choose({}, "vote", answers=["7", None, "8", "8", "7", "8"]) == 2
    # tied two to two: the answer seen first
    assert choose({}, "vote", answers=[None, "8", "7", "7", "8"]) == 1
    assert choose({}, "vote", answers=[None, None]) == 0  # no answer at all: the first candidate
    # the values given do not matter to a plain majority
    assert choose({"confidence_tail": [9.0, 0.0, 0.0]}, "vote", answers=["a", "b", "b"]) == 1


def test_a_vote_counts_only_eligible_candidates_while_there_are_any():
    answers = ["b", "a", "a", "b", "b"]
    assert choose({}, "vote", answers=answers) == 0
    assert choose({}, "vote", answers=answers, eligible=[True, True, True, False, False]) == 1
    assert choose({}, "vote", answers=answers, eligible=[False] * 5) == 0
    v = {"confidence_tail": [1.0, 1.0, 1.0, 5.0, 5.0]}
    assert choose(v, "vote:confidence_tail", answers=answers) == 0  # b 11, a 2
    assert choose(v, "vote:confidence_tail", answers=answers, eligible=[False, True, True, True, False]) == 3


def test_weights_as_documented():
    x = torch.tensor([-2.0, 0.0, 0.5], dtype=torch.float64)
    w = {name: bv.VOTE_WEIGHTS[name](x).tolist() for name in bv.VALUES}
    assert w["swift"] == pytest.approx([1 / (1 + math.exp(2.0)), 0.5, 1 / (1 + math.exp(-0.5))])
    assert w["sar"] == pytest.approx([-0.5, 0.5, 0.75])
    assert w["mean_logprob"] == pytest.approx([math.exp(-2.0), 1.0, math.exp(0.5)])
    for name in ("confidence_lowest_group", "confidence_tail", "confidence_bottom10"):
        assert w[name] == pytest.approx(x.tolist())


# answers ["a", "b", "b"]: each example's weights make the vote differ from a plain majority (b)
# or from weighting by the raw value, so the pick shows which weight was applied
@pytest.mark.parametrize(
    "value, values, want, why",
    [
        # the confidence itself: a 5 > b 2 + 2
        ("confidence_lowest_group", [5.0, 2.0, 2.0], 0, "a 5 against b 4"),
        ("confidence_tail", [3.0, 2.0, 2.0], 1, "a 3 against b 4"),
        ("confidence_bottom10", [4.5, 2.0, 2.0], 0, "a 4.5 against b 4"),
        # sigmoid(swift): a 0.622 < b 2 x 0.378 = 0.755 (raw values would give a: 0.5 against -1)
        ("swift", [0.5, -0.5, -0.5], 1, "sigmoid"),
        ("swift", [2.0, -0.5, -0.5], 0, "a 0.881 against b 0.755"),
        # exp(mean_logprob): a 0.607 < b 2 x 0.368 = 0.736 (raw: a -0.5 against -2)
        ("mean_logprob", [-0.5, -1.0, -1.0], 1, "exp"),
        ("mean_logprob", [-0.1, -1.0, -1.0], 0, "a 0.905 against b 0.736"),
        # (1 + sar) / 2: a 0.6 < b 2 x 0.35 = 0.7 (raw: a 0.2 against -0.6)
        ("sar", [0.2, -0.3, -0.3], 1, "(1 + sar) / 2"),
        ("sar", [0.5, -0.3, -0.3], 0, "a 0.75 against b 0.7"),
    ],
)
def test_weighted_votes_by_hand(value, values, want, why):
    assert choose({bv.FIELD[value]: values}, f"vote:{value}", answers=["a", "b", "b"]) == want, why


def test_a_weighted_vote_picks_the_winning_answers_first_candidate_and_ties_to_the_first_answer():
    # a 1 + 2.5 = 3.5 against b 3: candidate 1, the first "a", though candidate 2 weighs more
    assert choose({"confidence_tail": [3.0, 1.0, 2.5]}, "vote:confidence_tail", answers=["b", "a", "a"]) == 1
    assert choose({"confidence_tail": [2.0, 2.0]}, "vote:confidence_tail", answers=["x", "y"]) == 0


@pytest.mark.parametrize("missing", [None, NAN])
def test_a_missing_weight_adds_nothing(missing):
    # b's missing weight would poison its tally: b is 0.8, a 1.0
    v = {"confidence_tail": [1.0, missing, 0.8]}
    assert choose(v, "vote:confidence_tail", answers=["a", "b", "b"]) == 0
    v = {"mean_logprob": [missing, -1.0, missing]}  # a 0 against b exp(-1)
    assert choose(v, "vote:mean_logprob", answers=["a", "b", "a"]) == 1


def test_a_vote_without_answers_is_refused_by_name():
    for s in ("vote", "vote:confidence_tail"):
        with pytest.raises(SelectorError, match=f"'{s}' votes over the candidates' answers"):
            choose({"confidence_tail": [1.0, 2.0]}, s)
