"""What makes a head learn on a real model: variants of ``swift-fast train`` trained on the
recipe's training rollouts, all scoring the same held-out candidates (the recipe's ``bon``
run), each set beside every trivial selector on those candidates.

Every variant reads its states from one feature cache of all hidden states (predicting
alignment, bfloat16, response tokens only) of training and held-out candidates alike, computed
once (``HFFeatureSource``); a variant picks its layers from it (``_LayerView``). The held-out
candidates never reach training, the choice of the probe's strength or early stopping.

Each fit is what ``swift-fast train`` does on a rollout file holding the problems it is given:
their 80/20 split by problem (the same seeded split, in the same order of problems as the
file), the validation problems deciding the epoch loop's stopping point or measuring the probe
before it is refitted on all of them. The learning curve repeats one variant (by default the
first, train's default) on the first N problems of a seeded shuffle of the training problems, so
each point is the head a user gets from rollouts of N problems.

Reported per variant: Best-of-N at k = N on the held-out problems, SWIFT minus the best trivial
selector with a paired bootstrap interval, the weighted vote, the within-problem AUC (the mean
over problems with both kinds of candidate of the AUC of the score among that problem's
candidates: what Best-of-N rewards, blind to how hard a problem is), and the same for the score
with length regressed out within problems (``length_residual``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Sequence

import torch

from ..data.rollouts import read_rollouts
from ..reports import best_of_n as report
from ..training.metrics import within_problem_auc

KS = (1, 2, 4, 8, 16)


class _LayerView:
    """A ``FeatureSource`` over a cache of every state: the states at ``positions`` of it."""

    def __init__(self, source, positions: Sequence[int]):
        self.source, self.positions = source, list(positions)
        self.recomputes = False
        self.progress_note = None

    def features(self, keys):
        states, cu = self.source.features(keys)
        return [states[i] for i in self.positions], cu

    def mean_logprobs(self, keys):
        return self.source.mean_logprobs(keys)


def length_residual(scores: torch.Tensor, lengths: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``scores`` minus their least-squares fit on length within problems (both centred per
    problem, one slope for all): what of the score length does not explain, float64."""
    s, n = scores.double(), lengths.double()
    sc, nc = s.clone(), n.clone()
    for g in torch.unique(groups):
        idx = groups == g
        sc[idx] -= s[idx].mean()
        nc[idx] -= n[idx].mean()
    den = float((nc * nc).sum())
    beta = float((sc * nc).sum()) / den if den > 0 else 0.0
    return s - beta * n


def run_ablations(out: str = "real_out", variants: dict | None = None, curve: Sequence[int] = (100, 200, 400),
                  seed: int = 0, model: str | None = None, test_rollouts: str | None = None,
                  curve_variant: str | None = None, log=print) -> dict:
    """Train each variant (``{name: train keyword changes}``; default ``default_variants()``) and
    the learning curve on ``out/train_rollouts.jsonl``, score the held-out candidates
    (``test_rollouts``, default ``out/test_bon.jsonl``), write ``out/ablations.json`` and return
    it. The held-out rows beside each variant are the trivial selectors whose columns the file
    has (a ``bon`` file: all of them; a ``collect`` file: length and, computed here in the forward
    that gives the features, mean log-prob). The learning curve repeats ``curve_variant``
    (default: the first variant). ``model``: the model folder (default: the one the recipe's
    ``times.json`` names)."""
    model = _load_model(out, model)
    train_p = read_rollouts(os.path.join(out, "train_rollouts.jsonl"))
    test_p = read_rollouts(test_rollouts or os.path.join(out, "test_bon.jsonl"))
    seqs, plens, owner = _candidate_sequences(train_p, test_p)
    everything = list(range(model.config.num_hidden_layers + 1))
    source = _every_state_source(model, seqs, plens, everything, out, log)
    _fill_mean_logprobs(source, owner, test_p, len(seqs))
    ablation = _Ablation(model.config, source, everything, owner, test_p, seed, log)
    train_ids = ablation.train_ids

    results = {"variants": {}, "curve": {}, "held_out_problems": len(test_p), "training_problems": len(train_ids)}
    variants = variants or default_variants()
    for name, change in variants.items():
        results["variants"][name] = ablation.fit(name, train_ids, **change)
    curve_variant = curve_variant or next(iter(variants))
    order = list(train_ids)
    import random

    random.Random(seed).shuffle(order)
    for size in curve:
        if size < len(train_ids):
            results["curve"][size] = ablation.fit(f"curve {size}", order[:size], **variants[curve_variant])
    results["curve"][len(train_ids)] = results["variants"][curve_variant]
    results["curve_variant"] = curve_variant
    b = next(iter(results["variants"].values()))["bon"]
    results["baselines"] = {r: v for r, v in b.items() if not r.startswith(tuple(results["variants"]))}
    with open(os.path.join(out, "ablations.json"), "w") as f:
        json.dump(results, f, indent=1)
    return results


def _load_model(out: str, model: str | None):
    """The float32 causal LM in folder ``model`` (default: the one ``out/times.json`` names), in eval mode."""
    from transformers import AutoModelForCausalLM

    from ..hf.loading import transformers_bars

    if model is None:
        with open(os.path.join(out, "times.json")) as f:
            model = json.load(f)["model"]
    with transformers_bars(sys.stderr.isatty()):
        return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()


def _candidate_sequences(train_p, test_p) -> tuple[list[list[int]], list[int], list[tuple]]:
    """``(seqs, plens, owner)`` of every non-empty candidate, training problems first: its prompt
    and response token ids, its prompt's length and ``(part, problem id, index, correct)``."""
    seqs, plens, owner = [], [], []
    for part, problems in (("train", train_p), ("test", test_p)):
        for p in problems:
            for i, c in enumerate(p.candidates):
                if not c["token_ids"]:
                    continue
                seqs.append(list(p.prompt_token_ids) + list(c["token_ids"]))
                plens.append(len(p.prompt_token_ids))
                owner.append((part, p.id, i, bool(c["correct"])))
    return seqs, plens, owner


def _every_state_source(model, seqs, plens, everything: list[int], out: str, log):
    """The filled feature cache (``out/ablation_cache``) of the states ``everything`` of ``seqs``."""
    from ..hf.train import HFFeatureSource

    t0 = time.perf_counter()
    source = HFFeatureSource(model, seqs, plens, everything, "predicting", "hidden",
                             cache_dir=os.path.join(out, "ablation_cache"),
                             spec={"what": "every state, predicting", "n": len(seqs), "tokens": sum(map(len, seqs))},
                             logprob_keys=None)  # mean log-probs from the same forward: length's peer
    log(source.cache_note)

    source.fill(progress=True)
    log(f"features of {len(seqs)} candidates in {time.perf_counter() - t0:.0f} s")
    return source


def _fill_mean_logprobs(source, owner, test_p, n: int) -> None:
    """Give each held-out candidate without a ``mean_logprob`` the one of ``source``."""
    lp = source.mean_logprobs(list(range(n))).tolist()
    test_by_id = {p.id: p for p in test_p}
    for key, (part, pid, i, _) in enumerate(owner):
        if part == "test":
            cand = test_by_id[pid].candidates[i]
            if cand.get("mean_logprob") is None:
                cand["mean_logprob"] = lp[key]


class _Ablation:
    """One feature cache, its candidates as examples, and the held-out problems: fits a variant on
    some training problems and scores it on the held-out ones."""

    def __init__(self, config, source, everything: list[int], owner, test_p, seed: int, log):
        from ..training.splits import Example

        self.config, self.source, self.everything = config, source, everything
        self.test_p, self.seed, self.log = test_p, seed, log
        # the file's order, as train reads it
        self.train_ids = list(dict.fromkeys(o[1] for o in owner if o[0] == "train"))
        self.examples_by_problem: dict[str, list[Example]] = {}
        self.test_ex = []
        for key, (part, pid, _, y) in enumerate(owner):
            e = Example(key=key, problem=pid, label=y)
            (self.examples_by_problem.setdefault(pid, []) if part == "train" else self.test_ex).append(e)
        self.test_index = {(o[1], o[2]): k for k, o in enumerate(owner) if o[0] == "test"}

    def view(self, layers) -> _LayerView:
        """The cache's states of ``layers``."""
        return _LayerView(self.source, [self.everything.index(i) for i in layers])

    def evaluate(self, head, name) -> dict:
        """``head``'s Best-of-N at k = 16 beside the trivial selectors, its margin over the best of
        them and its within-problem AUCs on the held-out candidates (scores stored as ``a:name``
        and ``r:name`` on them)."""
        from ..training.loop import score_and_count

        test_ex, test_p = self.test_ex, self.test_p
        s, tokens = score_and_count(head, self.view(head.layers), test_ex, batch_size=64)
        by_key = {e.key: float(v) for e, v in zip(test_ex, s)}
        labels = torch.tensor([float(e.label) for e in test_ex])
        index = {pid: g for g, pid in enumerate(dict.fromkeys(e.problem for e in test_ex))}
        groups = torch.tensor([index[e.problem] for e in test_ex])
        resid = length_residual(s, tokens, groups)
        res_key = {e.key: float(v) for e, v in zip(test_ex, resid)}
        for p in test_p:
            for i, c in enumerate(p.candidates):
                k = self.test_index.get((p.id, i))
                c[f"a:{name}"] = by_key.get(k, float("-inf"))
                c[f"r:{name}"] = res_key.get(k, float("-inf"))
        cands = report.gather(test_p, [f"a:{name}", f"r:{name}"], n=16, signals=True)
        rows = {"random": report.random_choice, "majority": report.majority, **report.trivial_selectors(cands),
                name: report.best_of(f"a:{name}"), f"{name} (length regressed out)": report.best_of(f"r:{name}"),
                f"{name} weighted vote": report.weighted(f"a:{name}"), "oracle pass@k": report.oracle}
        t = report.bon_table(cands, rows, KS, reps=1000)
        summ = report.selection_summary(cands, t, name, reps=1000)
        return {
            "bon": {r: t.rows[r][16] for r in t.rows},
            "minus_best_trivial": summ["swift_minus_best_trivial"],
            "within_problem_auc": within_problem_auc(s, labels, groups),
            "within_problem_auc_length_residual": within_problem_auc(resid, labels, groups),
        }

    def fit(self, name, problem_ids, **change) -> dict:
        """Train a head as ``swift-fast train`` would with ``change`` on ``problem_ids``, log and
        return its setting, how it was fitted and ``evaluate``'s results."""
        from ..rewards.head import SwiftHead, resolve_layers
        from ..training.loop import train_head
        from ..training.probe import train_probe
        from ..training.splits import split_by_problem

        h = _train_setting(change)
        layers = resolve_layers(h["layers"], self.config.num_hidden_layers)
        head = SwiftHead(self.config.hidden_size, layers, gate=h.get("gate", False), alignment="predicting")
        view = self.view(layers)
        seed = self.seed
        tr_ids, va_ids = split_by_problem(problem_ids, 0.2, seed)  # as train splits a file of these problems
        tr = [e for pid in tr_ids for e in self.examples_by_problem[pid]]
        va = [e for pid in va_ids for e in self.examples_by_problem[pid]]
        t = time.perf_counter()
        if h["solver"] == "probe":
            # as train does: validation measured, then refitted on training and validation problems
            res = train_probe(head, view, tr, va, seed=seed, progress=False, refit=h.get("refit", True))
        else:
            res = train_head(head, view, tr, va, loss=h["loss"], lr=h["lr"], weight_decay=h["weight_decay"],
                             seed=seed, progress=False, select=h["select"], standardize=h["standardize"])
        fitted = set(tr_ids) | (set(va_ids) if res.fit.get("refit") else set())
        r = {"setting": h, "problems": len(problem_ids), "fitted_on_problems": len(fitted),
             "best_epoch": res.best_epoch, "epochs_run": res.epochs_run, "fit": res.fit,
             "seconds": time.perf_counter() - t, **self.evaluate(head, name)}
        self.log(_fit_line(name, r, res))
        return r


def _train_setting(change: dict) -> dict:
    """Train's settings for a variant: its defaults for the solver ``change`` names, updated by ``change``."""
    from ..training.settings import TrainSettings

    h = {"solver": "probe", "layers": "all"}  # train's default for bce
    if change.get("solver", "adamw") == "adamw":  # the epoch loop, with train's defaults for it
        d = TrainSettings()
        h = {"solver": "adamw", "layers": d.layers, "loss": d.loss, "lr": d.lr, "weight_decay": d.weight_decay,
             "gate": True, "select": d.select, "standardize": d.standardize}
    h.update(change)
    return h


def _fit_line(name: str, r: dict, res) -> str:
    """One fit's line of the log: its Best-of-N at 16, length-residual, vote, AUC and margin."""
    bon = r["bon"]
    return (f"{name:34s} BoN@16 {100 * bon[name]:5.1f}"
            f"  length-residual {100 * bon[name + ' (length regressed out)']:5.1f}"
            f"  vote {100 * bon[name + ' weighted vote']:5.1f}  wAUC {r['within_problem_auc']:.3f}"
            f"  vs best trivial {100 * r['minus_best_trivial']['difference']:+5.1f}"
            f" [{100 * r['minus_best_trivial']['ci95'][0]:+.1f}, {100 * r['minus_best_trivial']['ci95'][1]:+.1f}]"
            f"  ({_how(res)}, {r['seconds']:.0f} s)")


def _how(res) -> str:
    if res.fit:
        return f"L2 {res.fit['lambda']:g}"
    return f"epoch {res.best_epoch}/{res.epochs_run}"


def default_variants() -> dict:
    """The variants of docs/real-model.md: train's default (the probe) and changes to it, then the
    epoch loop (``--solver adamw``) with its defaults (standardised states, the epoch kept by
    within-problem AUC, BCE, lr 1e-4, weight decay 1e-5, every state, gated) and changes to them."""
    return {
        "train's default (the probe)": {"solver": "probe"},
        "probe, not refitted (80% of the problems)": {"solver": "probe", "refit": False},
        "probe, the last 16 states": {"solver": "probe", "layers": "last16"},
        "epoch loop (--solver adamw)": {},
        "epoch loop, no gate": {"gate": False},
        "the paper's defaults": {"standardize": False, "select": "loss"},
    }
