"""Head training: each loss against its formula written out here, the split by problem, early
stopping that restores the best epoch, reproducibility. No model: features are synthetic."""

import math

import pytest
import torch

from swift_fast.head import SwiftHead
from swift_fast.training import (
    GROUP_LOSSES,
    LOSSES,
    Example,
    LabelBalanceError,
    auc,
    check_label_balance,
    compute_loss,
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
