"""Learning curves on a real-model recipe run: what a head gives with little data, beside every
selector that needs none.

``swift-fast demo real-curves [--task one-step|two-step]`` reads the recipe's training rollouts
(``out/train_rollouts.jsonl``) and held-out candidates (``out/test_bon.jsonl``, else
``out/test_rollouts.jsonl``), and for each training size N (the first N problems of a seeded
shuffle, as a user with rollouts of N problems) fits each head variant as ``swift-fast train``
would on a file of those problems, chooses its selector from the training evidence as ``train``
does (:mod:`swift_fast.training.recommend`), and scores the held-out candidates. Reported per
point: held-out Best-of-N at k = n of the head's highest score, of its weighted vote at the
recommended temperature and of the recommended selector (what the shipped defaults select), each
minus the best trivial selector (picked on the held-out candidates after the fact: the
conservative side) with a paired bootstrap interval over problems.

Variants (each a change to ``train``'s default, the probe):

- ``probe``: ``train``'s default: the probe's own steps (``cross_validate``, ``fit_logistic``,
  the refit) in the order ``swift_fast.training.probe.train_probe`` runs them;
- ``last16``: the last 16 states only (fewer features);
- ``rank128``: the probe on the 128 leading principal components of the standardised states
  (a low-rank projection learned on the training candidates, labels unused);
- ``pairwise``: the within-problem objective: logistic loss on every correct x incorrect pair of
  a problem (each problem weighing the same), L2 strength by the same cross-validation;
- ``vote-labels``: no grading at all: each candidate labelled by whether its answer is its
  problem's majority answer (a user's own unlabeled prompts); its evidence is those labels too;
- ``graded+vote``: the N graded problems plus every other training problem labelled by its vote.

All read one cache of every candidate's states averaged over its response tokens (every state,
predicting alignment, float32, ``out/curves/<file>.pt``: one forward of the model over the
candidates, resumable per file), with the model's mean log-prob from the same forward. The
held-out trivial selectors read the held-out file's own columns where it has them (``bon``
writes the engine's), else DeepConf's confidences computed here over windows of 16 tokens.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from ..selection.bootstrap import bootstrap_interval
from ..training import probe as P
from ..training.metrics import within_problem_auc
from ..training.recommend import answer_rows, best_outcomes, by_problem_id, recommend, vote_outcomes

SIZES = (100, 200, 400, 800)
VARIANTS = ("probe", "last16", "rank128", "pairwise", "vote-labels", "graded+vote")
#: the trivial selectors (no head, no reward model), by the held-out value each reads (None: a vote)
TRIVIAL = {"majority": None, "mean log-prob": "mean_logprob", "confidence (lowest group)": "confidence_lowest_group",
           "confidence (tail)": "confidence_tail", "shortest": "-num_tokens", "longest": "num_tokens"}
WINDOW = 16
RANK = 128


@dataclass
class Pooled:
    """Every non-empty candidate of one rollout file: ``x`` ``[N, states, d]`` float32 (states
    averaged over response tokens), and per candidate its problem id, label, answer, token count
    and values (``mean_logprob`` and, held out, the confidences)."""

    x: torch.Tensor
    problem: list[str]
    label: torch.Tensor
    answer: list
    values: dict

    def rows(self, problems: set[str]) -> list[int]:
        return [i for i, p in enumerate(self.problem) if p in problems]


def pooled(model, path: str, cache: str, held_out: bool, log=print) -> Pooled:
    """The :class:`Pooled` of the rollouts at ``path``, read from ``cache`` when an earlier run
    wrote it (same file size and name), else computed and written there."""
    if os.path.exists(cache):
        d = torch.load(cache)
        if d.get("source") == [os.path.abspath(path), os.path.getsize(path)]:
            return Pooled(d["x"], d["problem"], d["label"], d["answer"], d["values"])
    from ..hf.features import decoder_parts
    from ..hf.rollout_data import rollout_sequences
    from ..hf.signals import candidate_signals
    from ..hf.train import HFFeatureSource

    seqs = rollout_sequences(path, need_labels=True)
    keys = [i for i in range(len(seqs.sequences)) if seqs.response_length(i) > 0]
    cands = [seqs.problems[seqs.refs[k][0]].candidates[seqs.refs[k][1]] for k in keys]
    layers = list(range(decoder_parts(model).num_layers + 1))
    t = time.perf_counter()
    with torch.no_grad():
        source = HFFeatureSource(model, seqs.sequences, seqs.prompt_lengths, layers, "predicting", "hidden")
        x, tokens = P.pooled_states(source, keys, progress=True)
        values = {"mean_logprob": source.mean_logprobs(keys), "num_tokens": tokens.double()}
    if held_out:
        names = ("confidence_lowest_group", "confidence_tail")
        if all(isinstance(c.get(n), (int, float)) for c in cands for n in names):
            for n in names:
                values[n] = torch.tensor([float(c[n]) for c in cands], dtype=torch.float64)
        else:
            sig = candidate_signals(model, [seqs.sequences[k] for k in keys], [seqs.prompt_lengths[k] for k in keys],
                                    window=WINDOW)
            values["confidence_lowest_group"], values["confidence_tail"] = sig.conf_lowest, sig.conf_tail
    log(f"    states of {len(keys)} candidates of {os.path.basename(path)} in {time.perf_counter() - t:.0f} s")
    d = {"x": x, "problem": [seqs.problems[seqs.refs[k][0]].id for k in keys],
         "label": torch.tensor([bool(seqs.labels[k]) for k in keys]), "answer": [c.get("answer") for c in cands],
         "values": values, "source": [os.path.abspath(path), os.path.getsize(path)]}
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    torch.save(d, cache + ".partial")
    os.replace(cache + ".partial", cache)
    return Pooled(d["x"], d["problem"], d["label"], d["answer"], d["values"])


def vote_labels(answers: Sequence, problems: Sequence[str]) -> torch.Tensor:
    """1.0 where a candidate's answer is its problem's most frequent one (ties: the earliest),
    0.0 elsewhere and for a candidate without an answer: the vote as a label, no grading."""
    by: dict[str, list[int]] = {}
    for i, p in enumerate(problems):
        by.setdefault(p, []).append(i)
    y = torch.zeros(len(answers))
    for idx in by.values():
        tally: dict = {}
        for i in idx:
            if answers[i] is not None:
                tally.setdefault(answers[i], [0, i])[0] += 1
        if tally:
            top = max(tally, key=lambda a: (tally[a][0], -tally[a][1]))
            for i in idx:
                y[i] = float(answers[i] == top)
    return y


def fit_pairwise(z: torch.Tensor, y: torch.Tensor, groups: torch.Tensor, lam: float, init=None) -> torch.Tensor:
    """``w`` minimising the mean over problems with both kinds of the mean of
    ``log(1 + exp(s_wrong - s_right))`` over their correct x incorrect pairs, plus ``lam |w|^2``
    (``s = z w``; a bias cancels in every pair). Convex; L-BFGS."""
    a, b, wt = [], [], []
    problems = 0
    for g in torch.unique(groups):
        idx = (groups == g).nonzero().flatten()
        pos, neg = idx[y[idx] > 0.5], idx[y[idx] < 0.5]
        if len(pos) and len(neg):
            pp, nn = torch.meshgrid(pos, neg, indexing="ij")
            a.append(pp.flatten())
            b.append(nn.flatten())
            wt.append(torch.full((pp.numel(),), 1.0 / pp.numel()))
            problems += 1
    w = (init.clone() if init is not None else torch.zeros(z.shape[1])).requires_grad_(True)
    if not problems:
        return w.detach()
    ia, ib, wts = torch.cat(a), torch.cat(b), torch.cat(wt) / problems
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=P.MAX_ITER, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-6, tolerance_change=1e-9)

    def closure():
        opt.zero_grad()
        s = z @ w
        v = (wts * F.softplus(s[ib] - s[ia])).sum() + lam * (w * w).sum()
        v.backward()
        return v

    opt.step(closure)
    return w.detach()


class _Linear:
    """A fitted linear score over standardised (optionally projected) pooled states."""

    def __init__(self, scale, proj, w, b, states):
        self.scale, self.proj, self.w, self.b, self.states = scale, proj, w, b, states

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        z = P._standardise(x[:, self.states], self.scale)
        if self.proj is not None:
            z = (z - self.proj[0]) @ self.proj[1] / self.proj[2]
        return (z @ self.w + self.b).double()


def _design(x: torch.Tensor, states, rank: int | None):
    scale = P.pooled_scale(x[:, states])
    z = P._standardise(x[:, states], scale)
    proj = None
    if rank:
        mean = z.mean(0)
        _, _, v = torch.svd_lowrank(z - mean, q=rank, niter=4, M=None)
        zp = (z - mean) @ v
        std = zp.std(0).clamp_min(1e-6)
        proj = (mean, v, std)
        z = zp / std
    return z, scale, proj


def _cv(z, y, problems, kind: str, seed: int):
    """``(strength, out-of-fold scores)``: the probe's cross-validation, or the pairwise one."""
    if kind == "bce":
        lam, _, oof = P.cross_validate(z, y, problems, seed=seed)
        return lam, oof
    lams = sorted(P.DEFAULT_LAMBDAS, reverse=True)
    groups = P._group_ids(problems)
    oof = torch.zeros((len(lams), z.shape[0]), dtype=torch.float64)
    for held in P._folds(problems, P.DEFAULT_FOLDS, seed):
        h = torch.tensor(held)
        keep = torch.ones(z.shape[0], dtype=torch.bool)
        keep[h] = False
        w = None
        for i, lam in enumerate(lams):
            w = fit_pairwise(z[keep], y[keep], groups[keep], lam, w)
            oof[i, h] = (z[h] @ w).double()
    aucs = [within_problem_auc(oof[i], y, groups) for i in range(len(lams))]
    best = max(range(len(lams)), key=lambda i: (-1.0 if math.isnan(aucs[i]) else aucs[i], -i))
    return lams[best], oof[best]


def fit_variant(variant: str, train: Pooled, problems: list[str], seed: int = 0):
    """``(score function of pooled states, evidence)`` of ``variant`` fitted on ``problems`` of
    ``train`` as ``swift-fast train`` would: its 80/20 split by problem, the strength by
    cross-validation on the training problems, the evidence (out-of-fold training scores and the
    validation scores) for the selector, then the refit on every problem."""
    from ..training.splits import split_by_problem

    states = list(range(train.x.shape[1]))[-16:] if variant == "last16" else list(range(train.x.shape[1]))
    rank = RANK if variant == "rank128" else None
    kind = "pairwise" if variant == "pairwise" else "bce"
    chosen = set(problems)
    rows = train.rows(chosen)
    pid = [train.problem[i] for i in rows]
    tr_ids, va_ids = split_by_problem(pid, 0.2, seed)
    va = set(va_ids)
    tr_rows = [r for r, p in zip(rows, pid) if p not in va]
    va_rows = [r for r, p in zip(rows, pid) if p in va]
    extra = [i for i, p in enumerate(train.problem) if p not in chosen] if variant == "graded+vote" else []

    def labels(idx):
        if variant == "vote-labels":
            return vote_labels([train.answer[i] for i in idx], [train.problem[i] for i in idx])
        return train.label[idx].float()

    y_extra = vote_labels([train.answer[i] for i in extra], [train.problem[i] for i in extra]) if extra else None
    fit_rows = tr_rows + extra
    y_fit = torch.cat([labels(tr_rows)] + ([y_extra] if extra else []))
    z, scale, proj = _design(train.x[fit_rows], states, rank)
    lam, oof = _cv(z, y_fit, [train.problem[i] for i in fit_rows], kind, seed)
    score = _fit(z, y_fit, [train.problem[i] for i in fit_rows], kind, lam, scale, proj, states)
    ev_rows = tr_rows + va_rows
    evidence = {"rows": ev_rows, "scores": torch.cat([oof[: len(tr_rows)].double(), score(train.x[va_rows])]),
                "labels": torch.cat([labels(tr_rows), labels(va_rows)]).bool(), "lambda": lam}
    all_rows = rows + extra
    y_all = torch.cat([labels(rows)] + ([y_extra] if extra else []))
    z, scale, proj = _design(train.x[all_rows], states, rank)
    return _fit(z, y_all, [train.problem[i] for i in all_rows], kind, lam, scale, proj, states), evidence


def _fit(z, y, problems, kind, lam, scale, proj, states) -> _Linear:
    if kind == "pairwise":
        w, b = fit_pairwise(z, y, P._group_ids(problems), lam), torch.zeros(())
    else:
        w, b = P.fit_logistic(z, y, lam)
    return _Linear(scale, proj, w, b, states)


def _ci(d: torch.Tensor, seed: int = 0) -> list[float]:
    lo, hi = bootstrap_interval(d, 2000, 0.95, seed)
    return [float(d.mean()), lo, hi]


class HeldOut:
    """The held-out candidates as ``[P, n]`` matrices, and the outcome of every trivial selector."""

    def __init__(self, d: Pooled):
        self.d = d
        (self.correct,), self.padding = by_problem_id(d.problem, d.label)
        self.answers = answer_rows(d.problem, d.answer)
        self.outcomes = {}
        for name, key in TRIVIAL.items():
            if key is None:
                self.outcomes[name] = vote_outcomes(self.answers, torch.zeros(self.correct.shape, dtype=torch.float64),
                                                     self.correct, None)
            elif key.lstrip("-") in d.values:
                v = d.values[key.lstrip("-")].double() * (-1.0 if key.startswith("-") else 1.0)
                self.outcomes[name] = self.best(v)
        self.random = self.correct.double().sum(1) / (~self.padding).sum(1)
        self.oracle = self.correct.any(1).double()

    def best(self, scores: torch.Tensor) -> torch.Tensor:
        return best_outcomes(by_problem_id(self.d.problem, scores.double())[0][0], self.correct, self.padding)

    def vote(self, scores: torch.Tensor, selector: str) -> torch.Tensor:
        return vote_outcomes(self.answers, by_problem_id(self.d.problem, scores.double())[0][0], self.correct, selector)

    def best_trivial(self) -> str:
        return max(self.outcomes, key=lambda k: float(self.outcomes[k].mean()))


def evaluate(variant: str, n: int, score, evidence: dict, train: Pooled, test: HeldOut, seed: int = 0) -> dict:
    """One point of a curve: the recommendation from ``evidence`` and the held-out figures."""
    rows = evidence["rows"]
    free = {"mean_logprob": train.values["mean_logprob"][rows]}
    rec = recommend(evidence["scores"], evidence["labels"], [train.problem[i] for i in rows],
                    [train.answer[i] for i in rows], free, evidence="out-of-fold", seed=seed)
    s = score(test.d.x)
    best = test.best(s)
    t = rec["temperature"]["chosen"] if rec["temperature"] else 1.0
    vote = test.vote(s, f"vote:swift@{t:g}")
    select = rec["select"]
    chosen = (best if select == "swift" else vote if select.startswith("vote:swift") else
              test.outcomes["majority"] if select == "vote" else test.outcomes["mean log-prob"])
    top = test.outcomes[test.best_trivial()]
    groups = P._group_ids(test.d.problem)
    return {"variant": variant, "n": n, "lambda": evidence["lambda"], "recommended": select,
            "evidence": rec["accuracy"], "recommendation": rec,
            "within_problem_auc": within_problem_auc(s, test.d.label.float(), groups),
            "swift": float(best.mean()), "vote": float(vote.mean()), "defaults": float(chosen.mean()),
            "swift_minus_best_trivial": _ci(best - top, seed), "vote_minus_best_trivial": _ci(vote - top, seed),
            "defaults_minus_best_trivial": _ci(chosen - top, seed),
            "vote_minus_majority": _ci(vote - test.outcomes["majority"], seed)}


def run_curves(out: str, sizes: Sequence[int] = SIZES, variants: Sequence[str] = VARIANTS, seed: int = 0,
               model: str | None = None, log=print) -> dict:
    """Every (size, variant) point into ``out/curves.json`` (resumable: points already there are
    kept), then ``out/curves.png``; returns the results."""
    from .real_ablations import _load_model

    test_path = next((os.path.join(out, f) for f in ("test_bon.jsonl", "test_rollouts.jsonl")
                      if os.path.exists(os.path.join(out, f))), None)
    if test_path is None:
        raise ValueError(f"{out} has no held-out candidates (test_bon.jsonl or test_rollouts.jsonl): run the recipe "
                         "first (swift-fast demo real)")
    m = _load_model(out, model)
    train = pooled(m, os.path.join(out, "train_rollouts.jsonl"), os.path.join(out, "curves", "train.pt"), False, log)
    test = HeldOut(pooled(m, test_path, os.path.join(out, "curves", "test.pt"), True, log))
    del m
    path = os.path.join(out, "curves.json")
    res = json.load(open(path)) if os.path.exists(path) else {"points": []}
    res["held_out"] = {"problems": int(test.correct.shape[0]), "random": float(test.random.mean()),
                       "oracle": float(test.oracle.mean()),
                       **{k: float(v.mean()) for k, v in test.outcomes.items()}, "best_trivial": test.best_trivial()}
    ids = sorted(set(train.problem))
    order = [ids[i] for i in torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed)).tolist()]
    done = {(p["n"], p["variant"]) for p in res["points"]}
    for n in sizes:
        n = min(n, len(order))
        for v in variants:
            if (n, v) in done:
                continue
            t = time.perf_counter()
            score, evidence = fit_variant(v, train, order[:n], seed)
            point = evaluate(v, n, score, evidence, train, test, seed)
            point["seconds"] = time.perf_counter() - t
            res["points"].append(point)
            log(_line(point))
            with open(path + ".tmp", "w") as f:
                json.dump(res, f, indent=1)
            os.replace(path + ".tmp", path)
    return res


def _line(p: dict) -> str:
    d = p["defaults_minus_best_trivial"]
    return (f"    N={p['n']:4d} {p['variant']:12s} SWIFT {100 * p['swift']:5.1f}  vote {100 * p['vote']:5.1f}  "
            f"defaults ({p['recommended']}) {100 * p['defaults']:5.1f}, minus best trivial {100 * d[0]:+.1f} "
            f"[{100 * d[1]:+.1f}, {100 * d[2]:+.1f}]  ({p['seconds']:.0f} s)")


def _cell(d: list[float]) -> str:
    return f"{100 * d[0]:+.1f} [{100 * d[1]:+.1f}, {100 * d[2]:+.1f}]"


def curves_markdown(res: dict) -> str:
    """``curves.json`` as Markdown: the held-out trivial selectors, then per training size the
    shipped defaults (the probe with its recommended selector) and each variant's highest score and
    weighted vote, with the defaults minus the best trivial selector."""
    held = res["held_out"]
    sizes = sorted({p["n"] for p in res["points"]})
    by = {(p["n"], p["variant"]): p for p in res["points"]}
    out = [f"Held out: {held['problems']} problems; random {100 * held['random']:.1f}, "
           + ", ".join(f"{k} {100 * held[k]:.1f}" for k in TRIVIAL if k in held)
           + f", oracle {100 * held['oracle']:.1f} (BoN@16, %); best trivial: {held['best_trivial']}.", "",
           "| training problems | " + " | ".join(str(n) for n in sizes) + " |",
           "| --- | " + " | ".join("---:" for _ in sizes) + " |"]

    def row(label, variant, fn):
        out.append(f"| {label} | " + " | ".join(fn(by[(n, variant)]) if (n, variant) in by else ""
                                                for n in sizes) + " |")

    row("**shipped defaults**: the recommended selector", "probe",
        lambda p: f"{p['recommended']} {100 * p['defaults']:.1f}")
    row("defaults minus best trivial", "probe", lambda p: _cell(p["defaults_minus_best_trivial"]))
    for variant in [v for v in VARIANTS if any(p["variant"] == v for p in res["points"])]:
        row(f"{variant}: highest score / weighted vote", variant,
            lambda p: f"{100 * p['swift']:.1f} / {100 * p['vote']:.1f}")
    row("probe: weighted vote minus best trivial", "probe", lambda p: _cell(p["vote_minus_best_trivial"]))
    row("probe: weighted vote minus majority", "probe", lambda p: _cell(p["vote_minus_majority"]))
    row("probe: highest score minus best trivial", "probe", lambda p: _cell(p["swift_minus_best_trivial"]))
    row("probe: within-problem AUC", "probe", lambda p: f"{p['within_problem_auc']:.3f}")
    return "\n".join(out)


def plot_curves(res: dict, path: str, title: str) -> str:
    """Held-out BoN@n against training problems: the shipped defaults (the recommended selector of
    the probe) and the probe's highest score and weighted vote, each variant's weighted vote thin,
    the trivial selectors as horizontal lines."""
    from ..reports.plotting import figure, save, titles

    fig, ax = figure(7.5, 4.2)
    pts = res["points"]

    def curve(variant, key):
        got = sorted((p["n"], 100 * p[key]) for p in pts if p["variant"] == variant)
        return [n for n, _ in got], [v for _, v in got]

    others = iter(("tab:purple", "tab:pink", "tab:gray", "tab:olive", "tab:cyan"))
    for v in VARIANTS:
        if v != "probe" and any(p["variant"] == v for p in pts):
            ax.plot(*curve(v, "vote"), lw=0.8, alpha=0.7, marker=".", color=next(others),
                    label=f"{v}: weighted vote")
    ax.plot(*curve("probe", "swift"), lw=1.8, marker="o", color="tab:blue", label="probe: highest score")
    ax.plot(*curve("probe", "vote"), lw=1.8, marker="s", color="tab:green", label="probe: weighted vote")
    ax.plot(*curve("probe", "defaults"), lw=2.6, marker="D", color="black", ls="--",
            label="shipped defaults (recommended selector)")
    held = res["held_out"]
    lines = (("majority", "tab:red"), ("mean log-prob", "tab:orange"), ("confidence (lowest group)", "tab:brown"))
    for name, color in lines:
        if name in held:
            ax.axhline(100 * held[name], color=color, lw=1, ls=":", label=f"{name} (no head)")
    ax.set_xscale("log", base=2)
    ns = sorted({p["n"] for p in pts})
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("training problems (x 16 candidates)")
    ax.set_ylabel("held-out BoN@16 accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    titles(fig, ax, title, f"{held['problems']} held-out problems; dotted lines need no head; a point is one head "
           "trained on the first N training problems, its selector chosen on its own training evidence", 2.6)
    return save(fig, path)


if __name__ == "__main__":  # pragma: no cover - a long run, from the command line
    run_curves(sys.argv[1])
