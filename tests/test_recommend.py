"""The selector a head is recommended with, and the temperature-weighted vote it may recommend,
checked against tallies written out by hand (float64, plain Python)."""

import math

import pytest
import torch

from swift_fast.reports import best_of_n as report
from swift_fast.selection import by_value
from swift_fast.training import recommend as R


def _hand_vote(answers, scores, t):
    """The answer with the largest sum of exp(score / t), ties to the earliest first occurrence;
    the index of its first occurrence (plain Python, float64)."""
    tally, first = {}, {}
    for i, (a, s) in enumerate(zip(answers, scores)):
        if a is None or s is None:
            continue
        tally[a] = tally.get(a, 0.0) + math.exp(s / t)
        first.setdefault(a, i)
    best = max(tally, key=lambda a: (tally[a], -first[a]))
    return first[best]


@pytest.mark.parametrize("t", [0.1, 0.5, 1.0, 3.0, 100.0])
def test_a_temperature_vote_weighs_each_answer_by_exp_score_over_t(t):
    answers = ["7", "9", "7", "9", "9", None, "7"]
    scores = [2.0, 0.5, -1.0, 0.4, 0.3, 5.0, -0.2]
    want = _hand_vote(answers, scores, t)
    got = by_value.choose({"swift_score": scores}, f"vote:swift@{t}", answers)
    assert got == want
    # the same pick through the report's chooser (the table of `bon`), on a [1, n] problem
    c = report.Candidates(ids=["p"], correct=torch.tensor([[a == "7" for a in answers]]),
                          scores={"swift_score": torch.tensor([scores], dtype=torch.float64)},
                          answers=[answers], pruned=torch.zeros(1, len(answers), dtype=torch.bool))
    assert int(report.selector_chooser(f"vote:swift@{t}")(c, len(answers))[0]) == want


def test_the_temperature_spans_majority_vote_and_the_best_score():
    answers = ["a", "b", "b", "b"]
    scores = [3.0, 0.0, 0.0, 0.0]
    assert by_value.choose({"swift_score": scores}, "vote:swift@100", answers) == 1  # 3 votes beat e^0.03
    assert by_value.choose({"swift_score": scores}, "vote:swift@0.5", answers) == 0  # e^6 beats 3
    # large scores do not overflow: the weights are taken relative to the group's largest
    assert by_value.choose({"swift_score": [2000.0, 1999.5, 1999.5]}, "vote:swift@1", ["a", "b", "b"]) == 1
    # a missing score adds nothing
    assert by_value.choose({"swift_score": [None, 0.0, 0.1]}, "vote:swift@1", ["a", "b", "c"]) == 2


@pytest.mark.parametrize("bad", ["vote:swift@0", "vote:swift@-1", "vote:swift@x", "vote:swift@inf", "vote:nope@1"])
def test_a_bad_temperature_or_value_is_refused_by_name(bad):
    with pytest.raises(by_value.SelectorError, match="vote:"):
        by_value.parse(bad)


def test_the_row_of_a_temperature_vote_names_it():
    assert report.selector_row("vote:swift@0.5") == "SWIFT weighted vote (T=0.5)"
    assert report.selector_row("vote:swift") == "SWIFT weighted vote"


def _problems():
    """Six problems of four candidates: answers, correctness and a score, all by hand. The score
    is right about which candidate is correct in problems 0-3 (where the majority is wrong in 0 and
    1) and wrong in 4-5."""
    rows = [
        # (answers, correct, score, mean log-prob)
        (["1", "2", "2", "2"], [1, 0, 0, 0], [3.0, 0.0, 0.1, -0.1], [-1.0, -0.1, -0.2, -0.3]),
        (["5", "5", "6", "6"], [0, 0, 1, 1], [-1.0, -1.0, 2.0, 2.0], [-0.1, -0.2, -0.5, -0.6]),
        (["3", "3", "3", "4"], [1, 1, 1, 0], [1.0, 1.0, 1.0, -2.0], [-0.1, -0.1, -0.1, -0.9]),
        (["8", "9", "8", "7"], [1, 0, 1, 0], [0.5, 0.0, 0.6, -1.0], [-0.3, -0.1, -0.2, -0.4]),
        (["4", "4", "1", "4"], [1, 1, 0, 1], [0.0, 0.0, 2.0, 0.0], [-0.2, -0.2, -0.9, -0.2]),
        (["0", "2", "2", "0"], [0, 1, 1, 0], [1.0, 0.0, 0.0, 1.0], [-0.9, -0.1, -0.1, -0.9]),
    ]
    flat = {"scores": [], "labels": [], "groups": [], "answers": [], "lp": []}
    for p, (ans, y, s, lp) in enumerate(rows):
        flat["scores"] += s
        flat["labels"] += [bool(v) for v in y]
        flat["groups"] += [f"p{p}"] * 4
        flat["answers"] += ans
        flat["lp"] += lp
    return rows, flat


def _hand_outcomes(rows):
    """Per selector, the list of 0/1 outcomes over the problems (plain Python)."""
    out = {"swift": [], "vote": [], "mean_logprob": []}
    for ans, y, s, lp in rows:
        out["swift"].append(y[max(range(4), key=lambda i: (s[i], -i))])
        out["mean_logprob"].append(y[max(range(4), key=lambda i: (lp[i], -i))])
        counts = {}
        for i, a in enumerate(ans):
            counts.setdefault(a, [0, i])[0] += 1
        best = max(counts, key=lambda a: (counts[a][0], -counts[a][1]))
        out["vote"].append(y[counts[best][1]])
    for t in R.TEMPERATURES:
        out[t] = [y[_hand_vote(ans, s, t)] for ans, y, s, lp in rows]
    return out


def test_the_recommendation_measures_every_selector_and_takes_the_best():
    rows, flat = _problems()
    rec = R.recommend(torch.tensor(flat["scores"]), torch.tensor(flat["labels"]), flat["groups"], flat["answers"],
                      {"mean_logprob": torch.tensor(flat["lp"])}, evidence="out-of-fold")
    hand = _hand_outcomes(rows)
    acc = rec["accuracy"]
    for key in ("swift", "vote", "mean_logprob"):
        assert acc[key] == pytest.approx(sum(hand[key]) / 6)
    # each T's accuracy on all problems, and the one chosen (ties to the larger T)
    for t in R.TEMPERATURES:
        assert rec["temperature"]["accuracy"][str(t)] == pytest.approx(sum(hand[t]) / 6)
    best_t = max(R.TEMPERATURES, key=lambda t: (sum(hand[t]), t))
    assert rec["temperature"]["chosen"] == best_t
    # the cross-validated vote: each fold at the T best on the other folds (folds as the module draws them)
    folds = R._folds(6, R.FOLDS, 0)
    cv = [None] * 6
    for held in folds:
        rest = [p for p in range(6) if p not in held.tolist()]
        t = max(R.TEMPERATURES, key=lambda t: (sum(hand[t][p] for p in rest), t))
        for p in held.tolist():
            cv[p] = hand[t][p]
    assert acc["vote:swift@cv"] == pytest.approx(sum(cv) / 6)
    order = ["vote", "mean_logprob", "swift", "vote:swift@cv"]
    best = max(order, key=lambda k: (acc[k], -order.index(k)))
    want = f"vote:swift@{best_t:g}" if best == "vote:swift@cv" else best
    assert rec["select"] == want and rec["problems"] == 6 and rec["candidates"] == 24
    assert rec["evidence"] == "out-of-fold" and "recommended selector: " + want in R.describe(rec)


def test_a_score_that_knows_nothing_is_not_recommended_over_the_vote():
    """The score is the reverse of correctness: majority vote wins, and the description says the
    head does not pick better than a selector that needs no head."""
    g = torch.Generator().manual_seed(0)
    groups, answers, labels, scores = [], [], [], []
    for p in range(30):
        for i in range(8):
            right = i < 5  # the majority answer is right
            groups.append(p)
            answers.append("r" if right else f"w{int(torch.randint(0, 9, (), generator=g))}")
            labels.append(right)
            scores.append(-1.0 if right else 1.0 + float(torch.rand((), generator=g)))
    rec = R.recommend(torch.tensor(scores), torch.tensor(labels), groups, answers)
    assert rec["select"] == "vote" and rec["accuracy"]["vote"] == 1.0 and rec["accuracy"]["swift"] == 0.0
    assert "does not pick better than a selector that needs no head" in R.describe(rec)


def test_without_answers_only_the_scores_compete_and_a_partial_value_stays_out():
    _, flat = _problems()
    lp = torch.tensor(flat["lp"])
    lp[3] = float("nan")
    rec = R.recommend(torch.tensor(flat["scores"]), torch.tensor(flat["labels"]), flat["groups"], None,
                      {"mean_logprob": lp})
    assert set(rec["accuracy"]) == {"swift"} and rec["select"] == "swift" and rec["temperature"] is None


def test_serve_says_what_best_of_n_selects_by(tmp_path):
    """`swift-fast serve` prints the selector at start-up: --select, the head's recommendation (and
    the fallback a vote without an answer kind takes), or the default."""
    import argparse

    from swift_fast.cli.serve import _what
    from swift_fast.testing import heads_recommending

    heads = heads_recommending(tmp_path, old=None, new="vote:swift@0.5")
    old, new = heads["old"], heads["new"]

    def what(head, select=None, answer=None):
        return _what(argparse.Namespace(head=None if head is None else str(head), select=select, answer=answer))

    assert "selects by vote:swift@0.5 (the head's recommendation; a vote" in what(new)
    assert what(new, answer="math").endswith("selects by vote:swift@0.5 (the head's recommendation)")
    assert what(new, select="mean_logprob").endswith("selects by mean_logprob (--select)")
    assert "selects by swift (the head records no recommended selector)" in what(old)
    assert "confidence_lowest_group" in what(None)
