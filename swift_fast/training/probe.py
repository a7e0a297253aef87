"""The mean-pooled probe: an ungated SWIFT head fitted as an L2-regularised logistic regression.

Without its gate a head scores a candidate by the plain mean of its token rewards (DESIGN 2),
``R = mean_t (w . h_t + b) = w . mean_t(h_t) + b``: a linear function of the candidate's states
averaged over its scored tokens. Fitting it with BCE on ``R`` is then a logistic regression on
one vector per candidate (``k * d`` values, the selected states' token means), which is convex:
it has one optimum, found by full-batch L-BFGS, with no learning rate, no epochs, no early
stopping and no dependence on a seed. What is left to choose is the L2 strength, and that is
chosen on the training problems alone, by K-fold cross-validation over problems (a problem's
candidates never straddle two folds), keeping the strength whose out-of-fold scores rank each
problem's candidates best (``within_problem_auc``, what Best-of-N uses; ties to the stronger).

Why it is ``train``'s default for BCE: on SmolLM2-135M-Instruct (docs/real-model.md) the
paper's gated head trained by AdamW with early stopping moved by a few points of held-out BoN@16
from one seed to the next and learns from four fifths of the problems (the rest decide when it
stops); the probe, fitted on every training problem, was as good or better on the same held-out
problems (800 problems x 16: 41.3% against 40.7%) and is reproducible by construction. The
gated head stays one flag away (``--solver adamw``), with every other loss.

The pooled vectors are standardised per (state, dimension) over the training candidates and
the scaling folded into the head exactly (``scaling.fold``, float64), so the head file,
the plugin and the kernels see an ordinary ungated head over raw states. One pass over the
features (``pooled_states``) is all the model work; a feature cache is never needed. Memory:
``candidates x k x d`` float32 (SmolLM2-135M, 12,800 candidates over 31 states: 0.9 GB).
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import Sequence

import torch
import torch.nn.functional as F

from ..rewards.head import HeadError, SwiftHead
from ..support.progress import phase
from .loop import TrainResult, baselines_of
from .losses import compute_loss
from .metrics import selection_metrics, within_problem_auc
from .scaling import STD_FLOOR, FeatureScale, fold
from .settings import DEFAULT_FOLDS, DEFAULT_LAMBDAS  # settings (TrainSettings.lambdas, .folds): declared there
from .splits import LabelShareWarning, check_label_balance, describe_balance, label_share_warning, whole_balance

#: L-BFGS iterations per fit (warm-started along the path of strengths)
MAX_ITER = 200


def pooled_states(source, keys: Sequence[int], batch_size: int = 64, progress: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(means [N, k, d] float32, tokens [N] int64)``: each candidate's selected states averaged
    over its scored tokens (zeros for a candidate with none), on the CPU, in the order of ``keys``.
    A source with ``runs(keys, batch_size)`` (``HFFeatureSource``: one prompt at a time, cut by
    length) is read in those batches."""
    keys = list(keys)
    position = {k: i for i, k in enumerate(keys)}
    if len(position) != len(keys):
        raise ValueError("pooled_states takes each key once")
    runs = getattr(source, "runs", None)
    batches = runs(keys, batch_size) if callable(runs) else [keys[a : a + batch_size]
                                                             for a in range(0, len(keys), batch_size)]
    out, counts = None, torch.zeros(len(keys), dtype=torch.long)
    bar = phase("features", total=len(keys), unit="candidate", enabled=progress)
    for batch in batches:
        rows = torch.tensor([position[k] for k in batch], dtype=torch.long)
        states, cu = source.features(batch)
        cu = cu.cpu().long()
        n = cu.diff()
        seg = torch.repeat_interleave(torch.arange(len(batch)), n)
        x = torch.stack([s.detach().float().cpu() for s in states], 1)  # [rows, k, d]
        if out is None:
            out = torch.zeros((len(keys), x.shape[1], x.shape[2]))
        sums = torch.zeros((len(batch), x.shape[1], x.shape[2])).index_add_(0, seg, x)
        out[rows] = sums / n.clamp_min(1).float()[:, None, None]
        counts[rows] = n
        bar.update(len(batch))
    bar.close()
    if out is None:
        raise ValueError("no candidate to pool")
    return out, counts


def pooled_scale(x: torch.Tensor) -> FeatureScale:
    """Mean and standard deviation of each (state, dimension) of pooled vectors ``[N, k, d]``,
    float64 (a floor relative to the largest of the state keeps constant dimensions finite)."""
    xd = x.double()
    m = xd.mean(0)
    std = xd.std(0, unbiased=False)
    floor = STD_FLOOR * std.amax(1, keepdim=True).clamp_min(1e-30)
    return FeatureScale(mean=m, std=torch.maximum(std, floor), tokens=x.shape[0])


def _standardise(x: torch.Tensor, scale: FeatureScale) -> torch.Tensor:
    return ((x - scale.mean.float()) / scale.std.float()).reshape(x.shape[0], -1)


def fit_logistic(z: torch.Tensor, y: torch.Tensor, lam: float, init: tuple | None = None,
                 max_iter: int = MAX_ITER) -> tuple[torch.Tensor, torch.Tensor]:
    """Minimise ``mean BCEWithLogits(z w + b, y) + lam |w|^2`` (the bias unpenalised) by L-BFGS;
    ``z [N, F]`` float32, ``y [N]``. Returns ``(w [F], b [])`` float32."""
    w = (init[0].clone() if init else torch.zeros(z.shape[1])).requires_grad_(True)
    b = (init[1].clone() if init else torch.zeros(())).requires_grad_(True)
    yt = y.float()
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-6, tolerance_change=1e-9)

    def closure():
        opt.zero_grad()
        value = F.binary_cross_entropy_with_logits(z @ w + b, yt) + lam * (w * w).sum()
        value.backward()
        return value

    opt.step(closure)
    return w.detach(), b.detach()


def _group_ids(problems: Sequence[str]) -> torch.Tensor:
    index: dict[str, int] = {}
    return torch.tensor([index.setdefault(p, len(index)) for p in problems], dtype=torch.long)


def _folds(problems: Sequence[str], folds: int, seed: int) -> list[list[int]]:
    ids = sorted(set(problems))
    g = torch.Generator().manual_seed(seed)
    order = [ids[i] for i in torch.randperm(len(ids), generator=g).tolist()]
    fold_of = {p: i % folds for i, p in enumerate(order)}
    return [[j for j, p in enumerate(problems) if fold_of[p] == f] for f in range(folds)]


def check_probe_split(balance: dict, folds: int) -> str | None:
    """Refuse a training split (``check_label_balance``'s counts) that the strength's
    cross-validation cannot fold, before any state is computed. Returns a sentence when no
    training problem has both a correct and an incorrect candidate (the strength then follows
    the out-of-fold loss: ``choose_lambda``), else None."""
    if folds < 2:
        raise ValueError(f"folds must be at least 2, got {folds}")
    problems = int(balance["train"]["problems"])
    if problems < folds:
        fix = f"--folds {problems} (folds= in Python)" if problems >= 2 else "rollouts of more problems"
        raise ValueError(f"the probe chooses its L2 strength by {folds}-fold cross-validation over the training "
                         f"problems, but the training split has {problems}: use {fix}")
    if not balance["train"].get("problems_with_both"):
        return (f"none of the {problems} training problems has both a correct and an incorrect candidate, so the "
                "probe's strength follows the out-of-fold loss instead of the within-problem AUC")
    return None


def choose_lambda(z: torch.Tensor, y: torch.Tensor, problems: Sequence[str], lams: Sequence[float] = DEFAULT_LAMBDAS,
                  folds: int = DEFAULT_FOLDS, seed: int = 0, bar=None) -> tuple[float, list[dict]]:
    """``cross_validate``'s strength and records (its out-of-fold scores dropped)."""
    lam, records, _ = cross_validate(z, y, problems, lams, folds, seed, bar)
    return lam, records


def cross_validate(z: torch.Tensor, y: torch.Tensor, problems: Sequence[str], lams: Sequence[float] = DEFAULT_LAMBDAS,
                   folds: int = DEFAULT_FOLDS, seed: int = 0, bar=None) -> tuple[float, list[dict], torch.Tensor]:
    """The L2 strength whose out-of-fold scores have the best within-problem AUC (ties to the
    stronger), one record per strength (``cv_within_problem_auc``, ``cv_loss``: the mean BCE of
    the out-of-fold scores, ``selected_by``) and the chosen strength's out-of-fold scores
    (float64 ``[N]``). Where no problem has both kinds of
    candidate the AUC is undefined and the lowest out-of-fold loss decides. ``z`` standardised
    ``[N, F]``; folds by problem. Standardisation is over all of ``z`` (labels play no part)."""
    lams = sorted(lams, reverse=True)
    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    if len(set(problems)) < folds:
        raise ValueError(f"{len(set(problems))} training problems cannot make {folds} folds: use fewer folds")
    parts = _folds(problems, folds, seed)
    oof = torch.zeros((len(lams), z.shape[0]))
    for held in parts:
        held_t = torch.tensor(held, dtype=torch.long)
        keep = torch.ones(z.shape[0], dtype=torch.bool)
        keep[held_t] = False
        zt, yt = z[keep], y[keep]
        init = None
        for i, lam in enumerate(lams):
            init = fit_logistic(zt, yt, lam, init)
            oof[i, held_t] = z[held_t] @ init[0] + init[1]
            if bar is not None:
                bar.update(1)
    labels, groups = y.float(), _group_ids(problems)
    records = [{"lambda": lam, "cv_within_problem_auc": within_problem_auc(oof[i], labels, groups),
                "cv_loss": float(F.binary_cross_entropy_with_logits(oof[i], labels))} for i, lam in enumerate(lams)]
    by_pairs = not all(math.isnan(r["cv_within_problem_auc"]) for r in records)
    if by_pairs:
        best = max(range(len(lams)), key=lambda i: (-math.inf if math.isnan(records[i]["cv_within_problem_auc"])
                                                   else records[i]["cv_within_problem_auc"], -i))
    else:
        best = min(range(len(lams)), key=lambda i: (records[i]["cv_loss"], i))
    for r in records:
        r["selected_by"] = "within_problem_auc" if by_pairs else "loss"
    return lams[best], records, oof[best].double()


def fit_head(head: SwiftHead, x: torch.Tensor, y: torch.Tensor, lam: float) -> FeatureScale:
    """Fit ``head`` (ungated) in place on pooled vectors ``x [N, k, d]`` and labels ``y``: the
    standardised logistic regression at strength ``lam``, folded into raw-state weights."""
    scale = pooled_scale(x)
    w, b = fit_logistic(_standardise(x, scale), y, lam)
    with torch.no_grad():
        wr, br = fold(w.reshape(1, -1), b.reshape(1), scale)
        head.weight.copy_(wr.to(head.weight.device, head.weight.dtype))
        head.bias.copy_(br.to(head.bias.device, head.bias.dtype))
    return scale


def check_probe_head(head: SwiftHead) -> None:
    if head.gate or head.weight.shape[0] != 1:
        raise HeadError("the probe fits an ungated head (the plain mean of token rewards): build the head with "
                        "gate=False, or train a gated head with solver='adamw' (--solver adamw)")
    if head.norm_eps is not None:
        raise HeadError(f"the probe does not fit heads with a state norm (this head has norm_eps={head.norm_eps})")


def train_probe(head: SwiftHead, source, train: list, val: list, lams: Sequence[float] = DEFAULT_LAMBDAS,
                folds: int = DEFAULT_FOLDS, seed: int = 0, refit: bool = True, progress: bool = True) -> TrainResult:
    """Fit the ungated ``head`` in place on ``train`` (``Example`` lists, as ``train_head`` takes).

    The strength is chosen by ``choose_lambda`` on the training problems; the head fitted on them
    is measured on ``val`` (metrics, ``free_baselines``: the figures ``train_head`` reports, on
    candidates neither fit saw); with ``refit`` the head returned is then fitted again, at the
    same strength, on training and validation candidates together (selection done, every
    problem teaches). ``result.fit`` records the strengths tried, the chosen one and whether
    the head was refitted; ``result.history`` holds one record per strength.

    Raises ``LabelBalanceError`` as ``train_head`` does, and ``HeadError`` for a gated head.
    """
    check_probe_head(head)
    if not train:
        raise ValueError("no training examples")
    if not val:
        raise ValueError("no validation examples: the probe's figures are measured on a validation set")
    balance = check_label_balance(train, val, "bce")
    for note in (check_probe_split(balance, folds), label_share_warning(whole_balance(balance))):
        if note:
            warnings.warn(note, LabelShareWarning, stacklevel=2)
    examples = list(train) + list(val)
    if progress:
        from tqdm.auto import tqdm

        tqdm.write(f"training split:   {describe_balance(balance['train'])}", file=sys.stderr)
        tqdm.write(f"validation split: {describe_balance(balance['val'])}", file=sys.stderr)
    x, tokens = pooled_states(source, [e.key for e in examples], progress=progress)
    y = torch.tensor([float(e.label) for e in examples])
    nt = len(train)
    bar = phase("probe fits", total=folds * len(lams) + 1 + int(refit), unit="fit", enabled=progress)
    scale = pooled_scale(x[:nt])
    zt = _standardise(x[:nt], scale)
    lam, records, oof = cross_validate(zt, y[:nt], [e.problem for e in train], lams, folds, seed, bar)
    w, b = fit_logistic(zt, y[:nt], lam)
    bar.update(1)
    train_loss = float(F.binary_cross_entropy_with_logits(zt @ w + b, y[:nt]))
    del zt
    s_val = (_standardise(x[nt:], scale) @ w + b).float()
    labels_v, groups_v = y[nt:], _group_ids([e.problem for e in val])
    vm = selection_metrics(s_val, labels_v, groups_v)
    vm["loss"] = float(compute_loss("bce", s_val.double(), labels_v.double(), groups_v))
    baselines = baselines_of(source, list(val), s_val, tokens[nt:], seed)
    if refit:
        fit_head(head, x, y, lam)
        bar.update(1)
    else:
        with torch.no_grad():
            wr, br = fold(w.reshape(1, -1), b.reshape(1), scale)
            head.weight.copy_(wr.to(head.weight.device, head.weight.dtype))
            head.bias.copy_(br.to(head.bias.device, head.bias.dtype))
    bar.close()
    head.eval()
    return TrainResult(
        best_epoch=0, epochs_run=0, stopped_early=False, history=records, val_metrics=vm,
        train_metrics={"loss": train_loss}, labels=balance, baselines=baselines, select="pairs",
        fit={"solver": "probe", "lambda": lam, "lambdas": sorted(lams, reverse=True), "folds": folds,
             "refit": refit, "candidates": len(examples) if refit else nt},
        # every problem once, scored by a fit that did not see it: the training problems out of fold (at
        # the chosen strength), the validation problems by the fit on the training ones
        evidence={"keys": [e.key for e in examples], "scores": torch.cat([oof, s_val.double()]),
                  "how": "out-of-fold"},
    )
