"""Head training: each loss against its formula written out here, the split by problem, early
stopping that restores the best epoch, reproducibility. No model: features are synthetic."""

import math

import pytest
import torch

from swift_fast.rewards.head import SwiftHead
from swift_fast.training import (
    GROUP_LOSSES,
    LOSSES,
    Example,
    LabelBalanceError,
    LabelShareWarning,
    auc,
    check_label_balance,
    compute_loss,
    format_baselines,
    free_baselines,
    label_balance,
    label_share_warning,
    selection_metrics,
    split_by_problem,
    train_head,
)


def _sig(x):
    return 1.0 / (1.0 + math.exp(-x))


def _groups(groups):
    out = {}
    for i, g in enumerate(groups):
        out.setdefault(g, []).append(i)
    return list(out.values())


def ref_bce(R, y, g, alpha):
    return sum(-(yi * math.log(_sig(r)) + (1 - yi) * math.log(1 - _sig(r))) for r, yi in zip(R, y)) / len(R)


def ref_hinge(R, y, g, alpha):
    return sum(max(0.0, 1 - (1 if yi else -1) * r) for r, yi in zip(R, y)) / len(R)


def ref_dpo(R, y, g, alpha):
    terms = [
        -math.log(_sig(R[i] - R[j])) for idx in _groups(g) for i in idx if y[i] for j in idx if not y[j]
    ]
    return sum(terms) / len(terms)


def _p(idx, y, alpha):
    den = sum(math.exp(y[k] / alpha) for k in idx)
    return [math.exp(y[k] / alpha) / den for k in idx]


def ref_infonca(R, y, g, alpha):
    total = []
    for idx in _groups(g):
        lse = math.log(sum(math.exp(R[k]) for k in idx))
        total.append(-sum(p * (R[k] - lse) for p, k in zip(_p(idx, y, alpha), idx)))
    return sum(total) / len(total)


def ref_nca(R, y, g, alpha):
    total = []
    for idx in _groups(g):
        pos = -sum(p * math.log(_sig(R[k])) for p, k in zip(_p(idx, y, alpha), idx))
        neg = -sum(math.log(_sig(-R[k])) for k in idx) / len(idx)
        total.append(pos + neg)
    return sum(total) / len(total)


REFS = {"bce": ref_bce, "hinge": ref_hinge, "dpo": ref_dpo, "infonca": ref_infonca, "nca": ref_nca}


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("alpha", [0.01, 0.7])
def test_each_loss_matches_its_formula(loss, alpha):
    g = torch.Generator().manual_seed(0)
    R = (torch.randn(11, generator=g, dtype=torch.float64) * 1.5).tolist()
    y = [1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 1]
    groups = [7, 7, 7, 3, 3, 3, 3, 9, 9, 5, 5]  # problem 9 has no correct candidate
    got = compute_loss(
        loss, torch.tensor(R, dtype=torch.float64, requires_grad=True), torch.tensor(y), torch.tensor(groups), alpha
    )
    assert got.requires_grad
    assert float(got.detach()) == pytest.approx(REFS[loss](R, y, groups, alpha), rel=1e-10, abs=1e-12)


def test_group_losses_need_problem_ids_and_dpo_without_pairs_is_zero():
    R = torch.tensor([0.3, -0.2], requires_grad=True)
    with pytest.raises(ValueError, match="problem ids"):
        compute_loss("dpo", R, torch.tensor([1, 0]))
    zero = compute_loss("dpo", R, torch.tensor([1, 1]), torch.tensor([0, 0]))
    zero.backward()
    assert float(zero.detach()) == 0.0 and torch.equal(R.grad, torch.zeros(2))
    with pytest.raises(ValueError, match="unknown loss"):
        compute_loss("mse", R, torch.tensor([1, 0]))


def test_split_is_by_problem_seeded_and_80_20():
    ids = [f"p{i // 3}" for i in range(30)]  # 10 problems, 3 candidates each
    train, val = split_by_problem(ids, 0.2, seed=5)
    assert len(val) == 2 and len(train) == 8 and not set(train) & set(val)
    assert set(train) | set(val) == set(ids)
    assert split_by_problem(ids, 0.2, seed=5) == (train, val)
    assert any(split_by_problem(ids, 0.2, seed=s)[1] != val for s in range(6, 12))
    with pytest.raises(ValueError, match="at least 2 problems"):
        split_by_problem(["a", "a"], 0.2)


def test_auc_and_selection_metrics_by_brute_force():
    g = torch.Generator().manual_seed(1)
    s = torch.randint(0, 5, (40,), generator=g).double()  # many ties
    y = torch.rand(40, generator=g) < 0.4
    pairs = [(1.0 if a > b else 0.5 if a == b else 0.0) for a, ya in zip(s, y) if ya for b, yb in zip(s, y) if not yb]
    assert auc(s, y) == pytest.approx(sum(pairs) / len(pairs), rel=1e-12)
    m = selection_metrics(
        torch.tensor([0.1, 0.9, 0.9, -1.0, 2.0]), torch.tensor([0, 1, 0, 1, 0]), torch.tensor([0, 0, 0, 1, 1])
    )
    assert m["bon"] == 0.5  # problem 0: tie at 0.9 goes to index 1 (correct); problem 1 picks the wrong one
    assert m["oracle"] == 1.0 and m["random"] == pytest.approx((1 / 3 + 1 / 2) / 2)
    assert m["accuracy"] == pytest.approx(1 / 5)  # R > 0 predicts correct: only index 1 agrees


class Source:
    """Candidate ``key`` has a few tokens whose single feature row is ``sign * direction + noise``."""

    def __init__(self, n, d=8, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.direction = torch.randn(d, generator=g)
        self.sign = (torch.rand(n, generator=g) < 0.5).float() * 2 - 1
        self.rows = [
            self.sign[k] * self.direction + 0.5 * torch.randn(int(torch.randint(2, 6, (), generator=g)), d, generator=g)
            for k in range(n)
        ]
        self.calls = []

    def features(self, keys):
        self.calls.append(list(keys))
        rows = [self.rows[k] for k in keys]
        cu = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
        return [torch.cat(rows)], cu


def _examples(src, keys, flip=False):
    return [Example(key=k, problem=f"p{k // 4}", label=bool(src.sign[k] > 0) != flip) for k in keys]


@pytest.mark.parametrize("loss", LOSSES)
def test_trainer_learns_a_learnable_label_and_is_reproducible(loss):
    src = Source(160)
    train, val = _examples(src, range(0, 128)), _examples(src, range(128, 160))
    heads = []
    for _ in range(2):
        head = SwiftHead(8, [0])
        res = train_head(head, src, train, val, loss=loss, lr=1e-2, max_epochs=6, progress=False, seed=3)
        heads.append(head)
    # pairwise and listwise losses fix no threshold: accuracy (R > 0) is asked of pointwise ones only
    if loss in ("bce", "hinge"):
        assert res.val_metrics["accuracy"] >= 0.95
    assert res.val_metrics["auc"] >= 0.99 and res.val_metrics["bon"] > res.val_metrics["random"] + 0.25
    assert torch.equal(heads[0].weight, heads[1].weight) and torch.equal(heads[0].bias, heads[1].bias)
    assert len(res.history) == res.epochs_run and res.best_epoch == min(
        range(1, res.epochs_run + 1), key=lambda e: res.history[e - 1]["val_loss"]
    )


def test_early_stopping_restores_the_best_epoch():
    src = Source(96, seed=2)
    train = _examples(src, range(0, 64))
    # the held-out labels contradict the training ones: every epoch of learning makes them worse
    val = _examples(src, range(0, 32), flip=True)
    snapshots = {}
    head = SwiftHead(8, [0])
    res = train_head(
        head, src, train, val, lr=1e-2, max_epochs=20, patience=3, progress=False,
        on_epoch=lambda e, h, rec: snapshots.__setitem__(e, (h.weight.detach().clone(), rec["val_loss"])),
    )
    losses = [snapshots[e][1] for e in sorted(snapshots)]
    assert res.best_epoch == 1 and res.epochs_run == 4 and res.stopped_early
    assert losses[0] < min(losses[1:])
    assert torch.equal(head.weight, snapshots[1][0]) and not torch.equal(head.weight, snapshots[4][0])
    assert res.val_metrics["loss"] == pytest.approx(losses[0])


def test_problem_wise_losses_batch_whole_problems():
    src = Source(64, seed=4)
    train, val = _examples(src, range(0, 48)), _examples(src, range(48, 64))
    head = SwiftHead(8, [0])
    res = train_head(head, src, train, val, loss="dpo", batch_size=10, max_epochs=2, progress=True)
    train_calls = [c for c in src.calls if c and c[0] < 48 and len(c) != 16]
    assert train_calls and all(len(c) <= 10 and len(c) % 4 == 0 for c in train_calls)
    for c in train_calls:
        problems = {k // 4 for k in c}
        assert sum(len([k for k in c if k // 4 == p]) for p in problems) == len(c) == 4 * len(problems)
    assert res.epochs_run == 2


def _labelled(keys, label_of):
    return [Example(key=k, problem=f"p{k // 4}", label=label_of(k)) for k in keys]


@pytest.mark.parametrize("loss", LOSSES)
def test_all_wrong_candidates_are_refused_before_any_feature_is_computed(loss):
    src = Source(40)
    train, val = _labelled(range(0, 32), lambda k: False), _labelled(range(32, 40), lambda k: False)
    with pytest.raises(LabelBalanceError) as e:
        train_head(SwiftHead(8, [0]), src, train, val, loss=loss, progress=False)
    msg = str(e.value)
    why = "no correct candidate"
    if loss in GROUP_LOSSES:
        why = "no problem with both a correct and an incorrect candidate"
    assert f"cannot train a head with the {loss} loss: the training split has {why}" in msg
    assert "  all data:         10 problems, 40 candidates (0 correct, 40 incorrect); 0 problems with both" in msg
    assert "  training split:   8 problems, 32 candidates (0 correct, 32 incorrect)" in msg
    assert "  validation split: 2 problems, 8 candidates (0 correct, 8 incorrect)" in msg
    assert "every candidate is incorrect" in msg and "more candidates per problem" in msg
    assert src.calls == []  # refused before the first epoch
    assert e.value.balance["train"]["incorrect"] == 32


def test_problem_wise_losses_need_a_problem_with_both_kinds_pointwise_ones_do_not():
    src = Source(40)
    # problems alternate all correct / all incorrect: both classes exist, no problem has both
    train, val = _labelled(range(0, 32), lambda k: k // 4 % 2 == 0), _labelled(range(32, 40), lambda k: k // 4 % 2 == 0)
    for loss in GROUP_LOSSES:
        with pytest.raises(LabelBalanceError, match=f"the {loss} loss: the training split has no problem with both"):
            train_head(SwiftHead(8, [0]), src, train, val, loss=loss, progress=False)
        with pytest.raises(LabelBalanceError) as e:
            check_label_balance(train, val, loss)
        msg = str(e.value)
        assert "(16 correct, 16 incorrect); 0 problems with both, 4 all correct, 4 all incorrect" in msg
        assert "no problem has both kinds" in msg and "pointwise loss (bce, hinge)" in msg
    assert src.calls == []
    for loss in ("bce", "hinge"):
        res = train_head(SwiftHead(8, [0]), src, train, val, loss=loss, max_epochs=1, progress=False)
        assert res.labels["train"] == {
            "problems": 8, "candidates": 32, "correct": 16, "incorrect": 16,
            "problems_with_both": 0, "problems_all_correct": 4, "problems_all_incorrect": 4,
        }


def test_a_validation_split_that_cannot_measure_the_loss_is_refused():
    src = Source(48)
    train = _labelled(range(0, 32), lambda k: k % 2 == 0)
    val = _labelled(range(32, 48), lambda k: True)  # the data has both kinds, this split one
    with pytest.raises(LabelBalanceError) as e:
        train_head(SwiftHead(8, [0]), src, train, val, loss="bce", progress=False)
    msg = str(e.value)
    assert "the validation split has no incorrect candidate" in msg and "early stopping" in msg
    assert "change the split" in msg and "--val-fraction" in msg
    with pytest.raises(LabelBalanceError, match="validation split has no problem with both"):
        check_label_balance(train, val, "dpo")
    # one problem with both kinds is enough to measure a pairwise loss
    val[0].label = False
    assert check_label_balance(train, val, "dpo")["val"]["problems_with_both"] == 1


# -- what the head learned against what was free ----------------------------------------------
def test_auc_by_hand():
    # pairs (correct, incorrect): 0.35 beats 0.1, loses to 0.4; 0.8 beats both -> 3 of 4
    assert auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == 0.75
    # a tie counts one half: (1 vs 1) = 0.5, (1 vs 2) = 0 -> 0.25
    assert auc(torch.tensor([1.0, 1.0, 2.0]), torch.tensor([1, 0, 0])) == 0.25
    assert math.isnan(auc(torch.tensor([1.0, 2.0]), torch.tensor([0, 0])))  # one class: no AUC


def test_balanced_figures_by_hand():
    # R > 0 predicts correct: TP = 1 (index 1), FP = 2 (2, 4), FN = 1 (3), TN = 1 (0)
    m = selection_metrics(
        torch.tensor([-0.1, 0.9, 0.9, -1.0, 2.0]), torch.tensor([0, 1, 0, 1, 0]), torch.tensor([0, 0, 0, 1, 1])
    )
    assert m["balanced_accuracy"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert m["precision"] == pytest.approx(1 / 3) and m["recall"] == pytest.approx(1 / 2)
    assert m["accuracy"] == pytest.approx(2 / 5) and m["majority_class_share"] == pytest.approx(3 / 5)
    # always "incorrect" on 1-in-10 data: the 0.9 accuracy of the issue, and nothing learned
    m = selection_metrics(-torch.ones(10), torch.tensor([1] + [0] * 9), torch.zeros(10))
    assert m["accuracy"] == pytest.approx(0.9) == m["majority_class_share"]
    assert m["balanced_accuracy"] == 0.5 and m["recall"] == 0 and math.isnan(m["precision"])


def _length_data(seed=0, problems=12, n=6):
    """Correct candidates are the short ones (3..5 tokens), incorrect ones long (8..12)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.rand(problems * n, generator=g) < 0.4
    lengths = torch.where(labels, torch.randint(3, 6, labels.shape, generator=g), torch.randint(8, 13, labels.shape,
                                                                                               generator=g))
    groups = torch.arange(problems).repeat_interleave(n)
    return labels, lengths, groups


def test_length_that_predicts_the_labels_is_a_baseline_the_head_does_not_beat():
    y, length, groups = _length_data()
    head = y.double() + torch.randn(len(y), generator=torch.Generator().manual_seed(1))  # good, not perfect
    b = free_baselines(head, y, groups, length, seed=0)
    assert b["length"] == {"direction": "shorter", "auc": 1.0, "within_auc": 1.0, "bon": b["oracle"]["bon"]}
    assert 0.5 < b["head"]["auc"] < 1.0 and b["mean_logprob"] is None
    v = b["verdict"]
    assert v["against"] == "length" and v["outcome"] == "does not beat" and v["difference"] < 0
    assert v["text"].startswith(
        f"the head does not beat length (shorter better): within-problem AUC {b['head']['within_auc']:.3f} vs 1.000")
    # the same lengths reversed favour the longer ones, named so
    assert free_baselines(head, y, groups, -length + 100)["length"]["direction"] == "longer"
    table = format_baselines(b)
    lines = table.splitlines()
    assert lines[1].split() == ["AUC", "AUC(within)", "BoN@6"] and lines[3].startswith("length (shorter better) ")
    assert lines[3].split()[-2:] == ["1.000", f"{b['oracle']['bon']:.3f}"] and table.endswith(v["text"])

    # oracle and random by hand: pass@N and mean correctness per problem
    per = [y[groups == p] for p in range(12)]
    assert b["oracle"]["bon"] == pytest.approx(sum(float(t.any()) for t in per) / 12)
    assert b["random"]["bon"] == pytest.approx(sum(float(t.double().mean()) for t in per) / 12)


def test_bon_of_the_baselines_and_the_paired_bootstrap_by_hand():
    y = torch.tensor([0, 1, 0, 1, 0, 0, 1, 0, 1])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    length = torch.tensor([5, 5, 9, 7, 2, 9, 4, 4, 4])  # ties go to the lowest index
    lp = torch.tensor([-1.0, -0.5, -2.0, -0.3, -0.3, -1.0, -2.0, -1.0, -1.5])
    head = torch.tensor([0.2, 0.1, 0.0, 0.4, 0.3, 0.2, 0.9, 0.1, 0.8])
    b = free_baselines(head, y, groups, length, lp, reps=300, seed=5)
    assert b["head"]["bon"] == pytest.approx(2 / 3)  # p0 picks 0 (wrong), p1 picks 3, p2 picks 6
    # 4 correct x 5 incorrect pairs; shorter wins: 2.5 + 2 + 3.5 + 3.5 of 20 (longer: the other 8.5)
    assert b["length"]["direction"] == "shorter" and b["length"]["auc"] == pytest.approx(11.5 / 20)
    assert b["length"]["bon"] == pytest.approx(1 / 3)  # p0 picks 0 (tie 5, 5: wrong), p1 picks 4 (wrong), p2 picks 6
    assert b["mean_logprob"]["bon"] == pytest.approx(2 / 3)  # p0 picks 1, p1 picks 3 (tie), p2 picks 7 (wrong)
    assert b["mean_logprob"]["auc"] == pytest.approx(10 / 20) and b["head"]["auc"] == pytest.approx(16.5 / 20)
    # within each problem, pairs counted by hand (head; shorter; mean log-prob):
    # p0 (1 correct of 3): 1/2, 1/2 (tie 5, 5) + 1 = 3/4, 1 + 1 = 1 over 2 pairs
    # p1 (1 of 3): 2/2, 0 + 1 = 1/2, 1/2 (tie) + 1 = 3/4; p2 (2 of 3): 2/2, 4 ties = 1/2, 0 of 2
    per_problem = {"head": [0.5, 1.0, 1.0], "length": [0.75, 0.5, 0.5], "lp": [1.0, 0.75, 0.0]}
    assert b["head"]["within_auc"] == pytest.approx(2.5 / 3)
    assert b["length"]["within_auc"] == pytest.approx(1.75 / 3) == b["mean_logprob"]["within_auc"]
    # the verdict is on the within-problem AUC; on a tie there length (the cheaper) stands
    v = b["verdict"]
    assert v["against"] == "length" and v["difference"] == pytest.approx(0.75 / 3)
    assert v["head_auc"] == pytest.approx(2.5 / 3) and v["baseline_auc"] == pytest.approx(1.75 / 3)
    # the interval, recomputed by brute force: the same resamples of problems, each problem's pairs counted
    g = torch.Generator().manual_seed(5)
    draws = torch.randint(0, 3, (300, 3), generator=g)
    d = torch.tensor([sum(per_problem["head"][p] - per_problem["length"][p] for p in row) / 3
                      for row in draws.tolist()], dtype=torch.float64)
    lo, hi = torch.quantile(d, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    assert v["interval"] == pytest.approx([lo, hi], abs=1e-12)
    for p, idx in enumerate([[0, 1, 2], [3, 4, 5], [6, 7, 8]]):  # the hand counts, checked by brute force
        assert _pair_auc(head[idx], y[idx]) == per_problem["head"][p]
        assert _pair_auc(-length[idx].double(), y[idx]) == per_problem["length"][p]
        assert _pair_auc(lp[idx], y[idx]) == per_problem["lp"][p]


def test_the_verdict_is_on_ranking_within_problems_not_on_telling_hard_problems_from_easy():
    # a score that knows how hard each problem is and nothing about its candidates: every pooled
    # pair across problems goes its way, yet it picks no better candidate than a coin
    g = torch.Generator().manual_seed(11)
    rate = torch.rand(40, generator=g)
    groups = torch.arange(40).repeat_interleave(8)
    y = torch.rand(320, generator=g) < rate[groups]
    length = torch.randint(5, 50, (320,), generator=g)
    b = free_baselines(rate[groups].double(), y, groups, length, seed=2)
    assert b["head"]["auc"] > 0.75 and b["head"]["within_auc"] == 0.5  # all ties within a problem
    v = b["verdict"]
    assert v["head_auc"] == 0.5 and v["outcome"] in ("barely beats", "does not beat")
    assert v["interval"][0] < 0 < v["interval"][1] and v["text"].startswith("the head ")
    assert " beats length" not in v["text"] or "the interval includes 0" in v["text"]
    # and where no problem has both kinds, no verdict rather than a figure
    b = free_baselines(torch.arange(16).double(), torch.arange(16) < 8, torch.arange(16) // 8, torch.ones(16))
    assert b["verdict"]["outcome"] is None and b["verdict"]["text"].startswith("no verdict against length")


def _pair_auc(s, y):
    pos = [float(a) for a, t in zip(s, y) if t]
    neg = [float(a) for a, t in zip(s, y) if not t]
    if not pos or not neg:
        return float("nan")
    return sum(1.0 if a > c else 0.5 if a == c else 0.0 for a in pos for c in neg) / (len(pos) * len(neg))


def test_a_head_that_separates_beats_random_length_and_random_labels_do_not():
    g = torch.Generator().manual_seed(7)
    y = torch.rand(240, generator=g) < 0.5
    length = torch.randint(5, 50, (240,), generator=g)
    groups = torch.arange(30).repeat_interleave(8)
    b = free_baselines(y.double() * 2 + torch.randn(240, generator=g), y, groups, length, seed=1)
    assert b["verdict"]["outcome"] == "beats" and b["verdict"]["interval"][0] > 0
    assert b["verdict"]["text"].startswith("the head beats length")
    # a head that knows nothing: the interval of its difference from length includes 0
    b = free_baselines(torch.randn(240, generator=g), y, groups, length, seed=1)
    lo, hi = b["verdict"]["interval"]
    assert lo < 0 < hi and b["verdict"]["outcome"] in ("barely beats", "does not beat")
    if b["verdict"]["outcome"] == "barely beats":
        assert "the interval includes 0" in b["verdict"]["text"]


def test_trainer_reports_baselines_from_the_scored_tokens():
    src = Source(160)
    train, val = _examples(src, range(0, 128)), _examples(src, range(128, 160))
    res = train_head(SwiftHead(8, [0]), src, train, val, lr=1e-2, max_epochs=3, progress=False, seed=3)
    b = res.baselines
    # length is the number of scored rows the source gave each validation candidate
    lengths = torch.tensor([len(src.rows[e.key]) for e in val])
    labels = torch.tensor([e.label for e in val])
    assert b["length"]["auc"] == pytest.approx(max(auc(lengths, labels), auc(-lengths, labels)))
    assert b["head"]["auc"] == res.val_metrics["auc"] and b["head"]["bon"] == res.val_metrics["bon"]
    assert b["mean_logprob"] is None and b["problems"] == 8 and b["n"] == 4


def test_little_to_learn_from_is_warned_about_with_its_counts():
    # 12 correct of 800 in 9 of 100 problems
    problems = [[i < 9 and j < (2 if i < 3 else 1) for j in range(8)] for i in range(100)]
    ex = [Example(key=8 * i + j, problem=f"p{i}", label=c) for i, row in enumerate(problems) for j, c in enumerate(row)]
    b = label_balance(ex)
    assert label_share_warning(b) == (
        "12 of 800 candidates are correct (1.5%), in 9 of 100 problems: the head has little to learn from; collect "
        "at a lower temperature, with easier problems or more candidates"
    )
    flipped = label_balance([Example(e.key, e.problem, not e.label) for e in ex])
    assert label_share_warning(flipped).startswith(
        "788 of 800 candidates are correct (98.5%); 12 incorrect, in 9 of 100 problems: the head has little to "
        "learn from; collect at a higher"
    )
    even = label_balance([Example(k, f"p{k // 4}", k % 2 == 0) for k in range(40)])
    assert label_share_warning(even) is None
    few = label_balance([Example(k, f"p{k // 4}", k % 2 == 0) for k in range(16)])  # 8 and 8: too few of a kind
    assert "too few of a kind" in label_share_warning(few) and label_share_warning(few).startswith("8 of 16")
    # train_head warns before the first epoch, with the counts of all data
    src = Source(40)
    train = _labelled(range(0, 32), lambda k: k in (0, 5))
    val = _labelled(range(32, 40), lambda k: k == 33)
    with pytest.warns(LabelShareWarning, match=r"^3 of 40 candidates are correct \(7\.5%\), in 3 of 10 problems"):
        train_head(SwiftHead(8, [0]), src, train, val, max_epochs=1, progress=False)


def test_within_problem_auc_by_hand():
    from swift_fast.training import within_problem_auc

    s = torch.tensor([0.9, 0.1, 0.5, 0.3, 0.3, 0.7, 0.2, 0.8])
    y = torch.tensor([1, 0, 0, 1, 1, 1, 0, 0])
    g = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    # problem 0: the correct 0.9 beats both wrong ones -> 1; problem 1 has no wrong candidate -> left
    # out; problem 2: the correct 0.7 beats 0.2, loses to 0.8 -> 1/2
    assert within_problem_auc(s, y, g) == pytest.approx((1.0 + 0.5) / 2)
    # a score that only says which problem is easy (constant within problems) ranks nothing: 1/2
    assert within_problem_auc(g.double(), y, g) == pytest.approx(0.5)
    assert math.isnan(within_problem_auc(s[3:5], y[3:5], g[3:5]))


def test_select_pairs_keeps_the_epoch_with_the_best_within_problem_auc():
    src = Source(96, seed=2)
    train = _examples(src, range(0, 64))
    val = _examples(src, range(64, 96))
    records = {}
    head = SwiftHead(8, [0])
    res = train_head(head, src, train, val, lr=1e-2, max_epochs=5, patience=5, progress=False, select="pairs",
                     on_epoch=lambda e, h, rec: records.__setitem__(e, rec))
    aucs = [records[e]["val_within_problem_auc"] for e in sorted(records)]
    best = max(range(len(aucs)), key=lambda i: (aucs[i], -i)) + 1  # the first of the highest
    assert res.best_epoch == best and res.val_metrics["within_problem_auc"] == aucs[best - 1]
    with pytest.raises(ValueError, match="unknown select"):
        train_head(SwiftHead(8, [0]), src, train, val, progress=False, select="bon")


class _Offset(Source):
    """``Source`` with states far from unit scale: a large offset and one massive dimension."""

    def features(self, keys):
        (x,), cu = super().features(keys)
        x = x * torch.linspace(0.01, 3.0, x.shape[1]) + 40.0
        x[:, 0] = 500.0 * x[:, 0]
        return [x], cu


def test_standardised_features_by_hand_and_the_fold_gives_the_same_scores_on_raw_states():
    from swift_fast.training import score_examples
    from swift_fast.training.scaling import ScaledSource, feature_scale, fold

    src = _Offset(48, seed=4)
    keys = list(range(32))
    scale = feature_scale(src, keys, batch_size=5)
    (x,), _ = src.features(keys)
    x = x.double()
    assert torch.allclose(scale.mean[0], x.mean(0), rtol=0, atol=1e-9)
    assert torch.allclose(scale.std[0], x.std(0, unbiased=False), rtol=1e-9, atol=1e-9)
    assert scale.tokens == x.shape[0]
    (z,), _ = ScaledSource(src, scale).features(keys)
    assert torch.allclose(z.double().mean(0), torch.zeros(8, dtype=torch.float64), atol=1e-4)

    train = _examples(src, range(0, 32))
    val = _examples(src, range(32, 48))
    snap = {}
    head = SwiftHead(8, [0])
    train_head(head, src, train, val, lr=1e-2, max_epochs=1, patience=1, progress=False, standardize=True,
               on_epoch=lambda e, h, rec: snap.__setitem__(e, (h.weight.detach().clone(), h.bias.detach().clone())))
    trained = SwiftHead(8, [0])
    with torch.no_grad():
        trained.weight.copy_(snap[1][0])
        trained.bias.copy_(snap[1][1])
    want = score_examples(trained, ScaledSource(src, feature_scale(src, [e.key for e in train])), val)
    got = score_examples(head, src, val)  # the folded head, on raw states
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    # the fold by hand in float64: w/sigma over raw states, b - sum(w mu / sigma)
    w, b = fold(trained.weight, trained.bias, scale)
    want_b = trained.bias.double() - (trained.weight.double() * scale.mean[0] / scale.std[0]).sum(1)
    assert torch.allclose(b.double(), want_b, rtol=1e-6, atol=1e-6)
    assert torch.allclose(w.double(), trained.weight.double() / scale.std[0], rtol=1e-6, atol=0)


def test_select_auto_takes_pairs_when_it_can_and_the_loss_with_a_warning_when_it_cannot():
    src = Source(96, seed=2)
    train = _examples(src, range(0, 64))
    val = _examples(src, range(64, 96))
    res = train_head(SwiftHead(8, [0]), src, train, val, lr=1e-2, max_epochs=2, progress=False, select="auto")
    assert res.select == "pairs"
    # every validation problem of one kind only: no within-problem AUC to keep an epoch by
    one_kind = [Example(key=e.key, problem=f"v{e.key}", label=e.label) for e in val]
    with pytest.warns(UserWarning, match="none of the 32 validation problems has both"):
        res = train_head(SwiftHead(8, [0]), src, train, one_kind, lr=1e-2, max_epochs=2, progress=False,
                         select="auto")
    assert res.select == "loss"
    assert res.best_epoch == min(range(1, res.epochs_run + 1), key=lambda e: res.history[e - 1]["val_loss"])
    with pytest.raises(ValueError, match="none of the 32 validation problems has both.*--select loss"):
        train_head(SwiftHead(8, [0]), src, train, one_kind, progress=False, select="pairs")


# -- one home per rule: Best-of-N, oracle, random and the bootstrap come from swift_fast.selection --
def test_flat_best_of_n_oracle_and_random_by_hand_on_interleaved_problems():
    from swift_fast.training import bon_outcomes

    nan = float("nan")
    # candidates of three problems interleaved, in generation order within each problem:
    # problem 3: 0.4 (wrong), 0.9 (right), 0.9 (wrong) -> the tie goes to the earlier, right one
    # problem 1: NaN (right), 0.1 (wrong) -> NaN never wins: the wrong one
    # problem 7: NaN (wrong), NaN (right) -> no score at all: the first candidate, wrong
    groups = torch.tensor([3, 1, 3, 7, 1, 3, 7])
    scores = torch.tensor([0.4, nan, 0.9, nan, 0.1, 0.9, nan])
    labels = torch.tensor([0, 1, 1, 0, 0, 0, 1])
    assert bon_outcomes(scores, labels, groups).tolist() == [0.0, 1.0, 0.0]  # problems 1, 3, 7
    m = selection_metrics(scores, labels, groups)
    assert m["bon"] == pytest.approx(1 / 3) and m["problems"] == 3 and m["oracle"] == 1.0
    assert m["random"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 2) / 3)
    # a problem without a correct candidate lowers the oracle; no problem at all gives 0
    assert selection_metrics(scores, torch.tensor([0, 0, 1, 0, 0, 0, 1]), groups)["oracle"] == pytest.approx(2 / 3)
    empty = selection_metrics(torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty["oracle"] == empty["random"] == empty["bon"] == 0.0 and empty["problems"] == 0


def test_the_verdict_interval_leaves_problems_of_one_kind_out_by_brute_force():
    y = torch.tensor([0, 1, 0, 1, 1, 1, 0, 1, 0, 1, 0, 0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])  # problem 1: all correct, no within AUC
    length = torch.tensor([5, 3, 9, 4, 6, 8, 2, 7, 4, 1, 6, 5])
    head = torch.tensor([0.2, 0.8, 0.1, 0.5, 0.4, 0.3, 0.6, 0.9, 0.2, 0.7, 0.1, 0.8])
    b = free_baselines(head, y, groups, length, reps=500, seed=3)
    v = b["verdict"]
    assert v["against"] == "length" and b["length"]["direction"] == "shorter"
    # per problem with both kinds: the head's pairs won minus length's (shorter better), counted by hand
    per = {}
    for p in (0, 2, 3):
        idx = [i for i in range(12) if groups[i] == p]
        per[p] = _pair_auc(head[idx], y[idx]) - _pair_auc(-length[idx].double(), y[idx])
    g = torch.Generator().manual_seed(3)
    draws = torch.randint(0, 4, (500, 4), generator=g).tolist()
    means = []
    for row in draws:  # problem 1 is drawn like any other and counts for nothing
        kept = [per[p] for p in row if p != 1]
        if kept:
            means.append(sum(kept) / len(kept))
    means.sort()
    at = [(len(means) - 1) * q for q in (0.025, 0.975)]  # linear interpolation between order statistics
    want = [means[int(h)] + (h - int(h)) * (means[int(h) + 1] - means[int(h)]) for h in at]
    assert v["interval"] == pytest.approx(want, abs=1e-12)
    assert v["difference"] == pytest.approx(sum(per.values()) / 3)


# -- the settings: one dataclass for train_head, train_from_rollouts and swift-fast train ---------
def test_settings_defaults_and_the_solver_auto_stands_for():
    from swift_fast.training import TrainSettings

    s = TrainSettings()
    assert (s.solver, s.loss, s.select, s.standardize, s.gate) == ("auto", "bce", "auto", True, None)
    assert s.resolved_solver == "probe" and not s.gated
    assert TrainSettings(loss="dpo").resolved_solver == "adamw" and TrainSettings(loss="dpo").gated
    assert TrainSettings(gate=True).resolved_solver == "adamw"  # the probe cannot fit a gate
    paper = TrainSettings.paper(lr=1e-3)
    assert (paper.solver, paper.select, paper.standardize, paper.lr, paper.gated) == ("adamw", "loss", False, 1e-3,
                                                                                      True)
    assert TrainSettings(lambdas=None, folds=None) == TrainSettings()  # None: the default, as keywords had it
    for bad, match in (({"loss": "mse"}, "unknown loss"), ({"select": "bon"}, "unknown select"),
                       ({"solver": "sgd"}, "unknown solver")):
        with pytest.raises(ValueError, match=match):
            TrainSettings(**bad)


def test_train_head_keywords_are_its_settings_and_an_unknown_one_is_named():
    from swift_fast.training import TrainSettings

    src = Source(64, seed=5)
    train, val = _examples(src, range(0, 48)), _examples(src, range(48, 64))
    a, b = SwiftHead(8, [0]), SwiftHead(8, [0])
    ra = train_head(a, src, train, val, lr=1e-2, max_epochs=2, progress=False, seed=1)
    rb = train_head(b, src, train, val, TrainSettings.paper(lr=1e-2, max_epochs=2, seed=1), progress=False)
    assert torch.equal(a.weight, b.weight) and ra.history == rb.history and ra.select == "loss"
    with pytest.raises(TypeError, match=r"train_head\(\) got an unknown keyword 'lrate' \(did you mean 'lr'\?\)"):
        train_head(SwiftHead(8, [0]), src, train, val, lrate=1e-2)
    with pytest.raises(TypeError, match="unknown keyword 'layers'"):  # not one of the epoch loop's
        train_head(SwiftHead(8, [0]), src, train, val, layers="all")


def test_the_command_line_takes_its_defaults_and_names_from_the_settings():
    from swift_fast import cli
    from swift_fast.cli.train import settings_of
    from swift_fast.training import TrainSettings

    base = ["train", "--model", "m", "--rollouts", "r.jsonl", "--out", "h.safetensors"]
    cli._ARGV = list(base)
    assert settings_of(cli.build_parser().parse_args(base)) == TrainSettings()
    argv = base + ["--epochs", "5", "--no-gate", "--no-standardize", "--weight-decay", "0.1", "--lambdas", "0.5,2",
                   "--loss", "dpo", "--select", "loss", "--layers", "last4", "--val-fraction", "0.3"]
    cli._ARGV = list(argv)
    s = settings_of(cli.build_parser().parse_args(argv))
    assert s == TrainSettings(max_epochs=5, gate=False, standardize=False, weight_decay=0.1, lambdas=(0.5, 2.0),
                              loss="dpo", select="loss", layers="last4", val_fraction=0.3)
    assert s.resolved_solver == "adamw"
