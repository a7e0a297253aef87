"""Ablations of the demo head, from one run: heads trained on the build's rollouts with one
setting changed each, all scoring the same held-out candidates (a demo run's ``rollouts.jsonl``)
offline with ``swift_fast.hf.swift_scores``.

Variants: the shipped setting; without gate; ``emitted`` alignment; last four states only;
logits only; and the other loss (cross-entropy vs DPO).
"""

from __future__ import annotations

import json
import os

import torch

from ..data.rollouts import read_rollouts, write_rollouts
from ..reports import best_of_n as report
from .recipe import DEFAULT, Recipe

KS = (1, 2, 4, 8, 16)


def variants(recipe: Recipe) -> dict[str, dict]:
    other = "bce" if recipe.head.loss == "dpo" else "dpo"
    return {
        "shipped": {},
        "no gate": {"gate": False},
        "emitted": {"alignment": "emitted"},
        "last four": {"layers": "last4"},
        "logits": {"feature": "logits"},
        f"loss {other}": {"loss": other},
        f"emitted, loss {other}": {"alignment": "emitted", "loss": other},
    }


def run_ablations(rollouts: str, work: str = "demo_build", out: str = "demo_out/ablations.json",
                  recipe: Recipe = DEFAULT, only: list[str] | None = None, progress: bool = True,
                  log=print) -> dict:
    from transformers import AutoModelForCausalLM

    from ..hf.scoring import swift_scores
    from .build import train_head

    model_dir = os.path.join(work, "model")
    train_rollouts = os.path.join(work, "train_rollouts.jsonl")
    for p in (model_dir, train_rollouts):
        if not os.path.exists(p):
            raise FileNotFoundError(f"{p} is missing: run `swift-fast demo build` first (intermediates in {work})")
    problems = read_rollouts(rollouts)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seqs = [p.prompt_token_ids + c["token_ids"] for p in problems for c in p.candidates]
    plens = [len(p.prompt_token_ids) for p in problems for c in p.candidates]
    results = {}
    for name, change in variants(recipe).items():
        if only and name not in only:
            continue
        h = dict(recipe.head.__dict__, **change)
        cache = os.path.join(work, f"feature_cache_{h['feature']}_{h['layers']}_{h['alignment']}")
        head, res = train_head(model_dir, train_rollouts, recipe, progress=progress, cache_dir=cache, **change)
        s = swift_scores(model, head, seqs, plens, batch_size=64).tolist()
        it = iter(s)
        for p in problems:
            for c in p.candidates:
                c[f"ablation:{name}"] = next(it)
        c_ = report.gather(problems, [f"ablation:{name}"], n=max(KS))
        c_.scores = {name: c_.scores[f"ablation:{name}"]}
        sel = {"majority": report.majority, name: report.best_of(name), f"{name} weighted vote": report.weighted(name)}
        t = report.bon_table(c_, sel, ks=KS)
        results[name] = {
            "setting": h, "best_epoch": res.best_epoch, "selectors": t.to_json()["selectors"]
        }
        log(f"{name:12s} " + " ".join(f"k={k}: {100 * t.rows[name][k]:5.1f}" for k in KS)
            + f" | weighted vote @16 {100 * t.rows[f'{name} weighted vote'][16]:5.1f}"
            f" | majority @16 {100 * t.rows['majority'][16]:5.1f}")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
    write_rollouts(os.path.splitext(out)[0] + "_rollouts.jsonl", problems)
    return results
