"""``swift-fast demo``: Best-of-N on the held-out problems with the shipped model and head.

For every test problem the backend samples N candidates (temperature 1.0, top-p 0.9), each
carrying its SWIFT score and SAR; the candidates are graded against the exact sum and the
Best-of-N table is built with ``swift_fast.report`` (random choice, majority vote, SWIFT, SAR,
SWIFT-weighted vote, SWIFT+SAR rank and scaled, oracle pass@k, 95% bootstrap intervals over
problems). Outputs in ``out_dir``: ``rollouts.jsonl``, ``table.txt``, ``table.json``,
``bon.png`` and ``candidates.html``.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict

import torch

from .. import report
from ..rollouts import Problem, write_rollouts
from . import assets as A
from . import task as T
from .backend import Sampling, make_backend
from .tokenizer import prompt_ids

KS = (1, 2, 4, 8, 16)
SCORE, SAR = "SWIFT", "SAR"


def problems_from_split(rows: list[dict], tokenizer) -> list[Problem]:
    out = []
    for r in rows:
        ids = prompt_ids(tokenizer, r["question"])
        q0 = prompt_ids(tokenizer, r["question"], with_question=False)  # SAR's context: the same chat, user turn empty
        out.append(Problem(id=r["id"], candidates=[], question=r["question"], reference=r["reference"],
                           kind="integer", prompt=tokenizer.decode(ids), prompt_token_ids=ids,
                           extra={"sar_context_token_ids": q0}))
    return out


def grade(problem: Problem) -> None:
    for c in problem.candidates:
        c["answer"] = T.extract_answer(c["text"])
        c["correct"] = c["answer"] is not None and c["answer"] == str(problem.reference)


def table(problems: list[Problem], ks=KS, reps: int = 2000):
    """The BoN table and the paired difference SWIFT@max(k) minus single-sample accuracy."""
    c = report.gather(problems, ["swift_score", "sar"], n=max(ks))
    c.scores = {SCORE: c.scores["swift_score"], SAR: c.scores["sar"]}
    t = report.bon_table(c, report.standard_selectors(SCORE, sar=SAR), ks=ks, reps=reps)
    k = max(ks)
    # Single-sample accuracy per problem: the mean correctness of all its candidates (the
    # expectation of one sample); paired with SWIFT's pick on the same problem.
    single = c.correct[:, :k].double().mean(1)
    d = t.outcomes[SCORE][k] - single
    lo, hi = report.bootstrap_ci(d, reps=reps)
    best_internal = max((SCORE, f"{SCORE} weighted vote", SAR, f"{SCORE}+{SAR} rank", f"{SCORE}+{SAR} scaled"),
                        key=lambda r: t.rows[r][k])
    summary = {
        "problems": len(problems),
        "k": k,
        "single_sample_accuracy": single.mean().item(),
        "swift_minus_single": {"difference": d.mean().item(), "ci95": [lo, hi],
                               "method": "paired percentile bootstrap over problems, 2000 resamples"},
        "best_internal": {"selector": best_internal, "accuracy": t.rows[best_internal][k]},
        "majority": t.rows["majority"][k],
        "bar": {
            "swift_10_points_over_single": d.mean().item() >= 0.10 and lo > 0,
            "best_internal_at_least_majority": t.rows[best_internal][k] >= t.rows["majority"][k],
        },
    }
    return t, summary


def summary_text(s: dict) -> str:
    d = s["swift_minus_single"]
    return (
        f"single-sample accuracy {100 * s['single_sample_accuracy']:.1f}%; SWIFT@{s['k']} minus single sample "
        f"{100 * d['difference']:+.1f} points, 95% CI [{100 * d['ci95'][0]:+.1f}, {100 * d['ci95'][1]:+.1f}] "
        f"({d['method']}); best internal selector at k={s['k']}: {s['best_internal']['selector']} "
        f"{100 * s['best_internal']['accuracy']:.1f}% vs majority {100 * s['majority']:.1f}%"
    )


def run_demo(
    out_dir: str = "demo_out",
    root: str = A.ASSETS_DIR,
    backend: str = "auto",
    limit: int | None = None,
    n: int = 16,
    seed: int = 0,
    show: int = 4,
    progress: bool = True,
    verify: bool = True,
    log=print,
) -> dict:
    """Run the demo end to end; return the summary (also written to ``out_dir/table.json``)."""
    from transformers import AutoTokenizer

    t0 = time.time()
    prov = A.verify(root) if verify else A.read_provenance(root)
    model_dir = os.path.join(root, A.MODEL)
    head_path = os.path.join(root, A.HEAD)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = A.read_split(root, "test.jsonl")
    if limit:
        rows = rows[:limit]
    problems = problems_from_split(rows, tok)
    ks = tuple(k for k in KS if k <= n)
    sampling = Sampling(n=n, seed=seed, max_new_tokens=prov["recipe"]["max_new_tokens"])
    log(f"swift-fast demo: {len(problems)} held-out problems x {n} candidates, backend {backend}")
    be = make_backend(backend, model_dir, head_path, seed=seed)
    try:
        cands = be.generate([p.prompt_token_ids for p in problems], sampling, progress=progress,
                            contexts=[p.extra["sar_context_token_ids"] for p in problems])
    finally:
        be.close()
    for p, cs in zip(problems, cands):
        p.candidates = cs
        grade(p)
    os.makedirs(out_dir, exist_ok=True)
    write_rollouts(os.path.join(out_dir, "rollouts.jsonl"), problems)
    t, s = table(problems, ks=ks)
    s.update(backend=be.name, sampling=asdict(sampling), seconds=None)
    text = report.format_table(t)
    log(text)
    log(summary_text(s))
    report.plot(t, os.path.join(out_dir, "bon.png"), title="swift-fast demo: Best-of-N on held-out sums")
    if show:
        # problems where selection matters (correct and incorrect candidates both present) first
        mixed = [p for p in problems if len({bool(c["correct"]) for c in p.candidates}) == 2]
        ids = {id(p) for p in mixed}
        shown = (mixed + [p for p in problems if id(p) not in ids])[:show]
        _html(shown, model_dir, head_path, tok, os.path.join(out_dir, "candidates.html"), summary_text(s))
    s["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(out_dir, "table.txt"), "w", encoding="utf-8") as f:
        f.write(text + "\n" + summary_text(s) + "\n")
    report.save_json(t, os.path.join(out_dir, "table.json"), summary=s)
    log(f"wrote {out_dir}/table.txt, table.json, bon.png, candidates.html, rollouts.jsonl ({s['seconds']:.0f} s)")
    return s


def _html(problems, model_dir, head_path, tok, path, summary):
    from transformers import AutoModelForCausalLM

    from ..head import SwiftHead
    from .html import render, token_values

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    head = SwiftHead.load(head_path)
    with torch.no_grad():
        values = [
            token_values(model, head, p.prompt_token_ids, [c["token_ids"] for c in p.candidates]) for p in problems
        ]
    page = render(problems, values, tok, "swift-fast demo: candidates and their SWIFT token scores",
                  f"<p>{summary}</p>")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
