"""``swift-fast demo``: Best-of-N on the held-out problems with the shipped model and head.

For every test problem the backend samples N candidates (temperature 1.0, top-p 0.9), each
carrying its SWIFT score and SAR; the candidates are graded against the exact sum, the shipped
model gives each its trivial signals on the same token ids (``swift_fast.hf.record_signals``:
generated length, mean token log-prob, DeepConf confidence), and the Best-of-N table is built with
``swift_fast.reports.best_of_n`` (random choice, majority vote, longest, shortest, mean logprob, confidence
(lowest group) and (tail), SWIFT, SAR, SWIFT-weighted vote, SWIFT+SAR rank and scaled, oracle
pass@k, 95% bootstrap intervals over problems). Outputs in ``out_dir``: ``rollouts.jsonl``,
``table.txt``, ``table.json``, ``bon.png`` and ``candidates.html``.

:func:`task_table` builds one task's table and summary from its graded, scored problems; a
second task calls it on its own problems.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict

import torch

from ..data.rollouts import Problem, write_rollouts
from ..reports import best_of_n as report
from ..rewards.confidence import TOP_K
from ..selection.pruning import PruneConfig
from . import assets as A
from . import task as T
from .backend import Sampling, make_backend
from .tokenizer import prompt_ids

KS = (1, 2, 4, 8, 16)
SCORE, SAR = report.selector_name("swift_score"), report.selector_name("sar")
#: DeepConf's group size for the demo. The paper's W = 2048 is for reasoning traces of thousands
#: of tokens; the demo's answers are 8 to 47 tokens (one token a character, median 26, in a run
#: of the 3,200 held-out candidates). W = 16 is two running-sum steps (``46+5=51;`` is 8
#: tokens): shorter than most answers, so the lowest group is a minimum over several windows
#: rather than the mean of the whole answer, and the tail spans the last step and the final
#: ``#answer``, where an early stop is decided.
#: Chosen from the answer format, not tuned on the held-out problems.
CONF_WINDOW = 16
#: the pruning :func:`run_demo` runs beside full Best-of-N unless told otherwise (the plugin's defaults)
DEMO_PRUNE = PruneConfig()
#: each task's shipped pruning: the setting the replayed sweep recommends (fewest tokens within 1
#: point of full Best-of-N) on that task's *training* problems, ``swift-fast demo --task T --split
#: train --no-prune`` (vLLM, 400 problems x 16): forget 89.7% of the tokens at -0.2 points; lag 48.2%
#: at 0.0. Reported on the held-out problems, which chose nothing.
SHIPPED_PRUNE = {
    "forget": PruneConfig(signal="swift", warmup=16, every=16, keep=0.75, min_keep=2),
    "lag": PruneConfig(signal="swift", warmup=16, every=16, keep=0.25, min_keep=2),
}


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


def graded_text(problems: list[Problem]) -> str:
    """One line: how many candidates were graded, the share correct, and how many stopped at the
    length limit."""
    cands = [c for p in problems for c in p.candidates]
    right = sum(bool(c.get("correct")) for c in cands)
    cut = sum(c.get("finish_reason") == "length" for c in cands)
    return (f"graded {len(cands):,} candidates: {100 * right / max(1, len(cands)):.1f}% correct, "
            f"{cut:,} stopped at the length limit")


def task_table(problems: list[Problem], ks=KS, reps: int = 2000) -> tuple[report.Table, dict]:
    """One task's Best-of-N table and summary (:func:`swift_fast.reports.best_of_n.selection_summary`, at
    ``k = max(ks)``) from its graded problems (candidates carrying ``swift_score``, ``sar`` and,
    when computed, the :data:`swift_fast.reports.best_of_n.SIGNAL_FIELDS`). :func:`summary_text` renders
    the summary."""
    c = report.gather(problems, ["swift_score", "sar"], n=max(ks), signals=True)
    rows = report.standard_selectors("swift_score", sar="sar", trivial=report.trivial_selectors(c))
    t = report.bon_table(c, rows, ks=ks, reps=reps)
    return t, report.selection_summary(c, t, SCORE, reps=reps)


#: the earlier name of :func:`task_table`
table = task_table
summary_text = report.summary_text


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
    prune: PruneConfig | None = DEMO_PRUNE,
    split: str = "test.jsonl",
    title: str = "Best-of-N on held-out sums",
    log=print,
) -> dict:
    """Run the demo end to end; return the summary (also written to ``out_dir/table.json``).
    ``prune``: settings of the pruned run beside full Best-of-N (vLLM backend; None: only the
    replayed sweep); ``split``: the problems (``train.jsonl`` to choose pruning settings on problems
    the held-out results are not measured on)."""
    from transformers import AutoTokenizer

    t0 = time.time()
    prov = A.verify(root) if verify else A.read_provenance(root)
    model_dir = os.path.join(root, A.MODEL)
    head_path = os.path.join(root, A.HEAD)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = A.read_split(root, split)
    if limit:
        rows = rows[:limit]
    problems = problems_from_split(rows, tok)
    ks = tuple(k for k in KS if k <= n)
    sampling = Sampling(n=n, seed=seed, max_new_tokens=prov["recipe"]["max_new_tokens"])
    log(f"swift-fast demo: {len(problems)} held-out problems x {n} candidates, backend {backend}")
    be = make_backend(backend, model_dir, head_path, seed=seed)
    traced = be.name == "vllm"
    pruning = _sample_and_grade(be, problems, sampling, prune, out_dir, progress=progress, log=log, title=title)
    model = _load_model(model_dir)
    signals = _trivial_signals(model, problems, traced, log)
    os.makedirs(out_dir, exist_ok=True)
    for p in problems:
        for c in p.candidates:
            c.pop("swift_trace", None)  # tens of floats per token: the report keeps what it needs
    write_rollouts(os.path.join(out_dir, "rollouts.jsonl"), problems)
    t, s = task_table(problems, ks=ks)
    s.update(backend=be.name, sampling=asdict(sampling), signals=signals, seconds=None)
    if pruning is not None:
        s["prune"] = pruning
    text = report.format_table(t)
    log(text)
    log(summary_text(s))
    if pruning is not None:
        log(prune_text(pruning))
    report.plot(t, os.path.join(out_dir, "bon.png"), title=f"swift-fast demo: {title}")
    if show:
        _html(_shown_problems(problems, show), model, head_path, tok, os.path.join(out_dir, "candidates.html"),
              summary_text(s))
    s["seconds"] = round(time.time() - t0, 1)
    _write_table(out_dir, t, s, text, pruning, log)
    return s


def _sample_and_grade(be, problems: list[Problem], sampling: Sampling, prune: PruneConfig | None, out_dir: str,
                      progress: bool, log, title: str) -> dict | None:
    """Sample each problem's candidates with ``be``, grade them and log the graded text; with vLLM
    and N > 1 also run the pruning beside them and return its summary (else None). Closes ``be``."""
    contexts = [p.extra["sar_context_token_ids"] for p in problems]
    traced = be.name == "vllm"
    pruning = None
    try:
        # traced: each token's values come back too, for the trivial selectors and the pruning sweep
        cands = be.generate([p.prompt_token_ids for p in problems], sampling, progress=progress, contexts=contexts,
                            desc="generate, full Best-of-N", **({"plugin_args": {"trace": True}} if traced else {}))
        for p, cs in zip(problems, cands):
            p.candidates = cs
            grade(p)
        log(graded_text(problems))
        if traced and sampling.n > 1:
            pruning = prune_run(be, problems, sampling, contexts, prune, out_dir, progress=progress, log=log,
                                title=title)
    finally:
        be.close()
    return pruning


def _trivial_signals(model, problems: list[Problem], traced: bool, log) -> dict:
    """Record each candidate's trivial signals (from the plugin's per-token values where every
    candidate has them, else from ``model``) and return how they were computed."""
    if traced and report.record_trace_signals(problems, CONF_WINDOW) == sum(len(p.candidates) for p in problems):
        signals = {"window": CONF_WINDOW, "top_k": TOP_K, "candidates": sum(len(p.candidates) for p in problems),
                   "seconds": 0.0, "source": "the vLLM plugin's per-token values (swift_trace)"}
    else:
        signals = add_signals(model, problems)
        signals["source"] = "transformers, one forward per batch"
    if signals["seconds"]:  # from the plugin's per-token values they cost nothing worth a line
        log(f"trivial signals (length, mean logprob, confidence W={CONF_WINDOW}, top-{signals['top_k']}) of "
            f"{signals['candidates']} candidates: {signals['seconds']:.1f} s ({signals['source']})")
    return signals


def _shown_problems(problems: list[Problem], show: int) -> list[Problem]:
    """The first ``show`` problems for ``candidates.html``."""
    # problems where selection matters (correct and incorrect candidates both present) first
    mixed = [p for p in problems if len({bool(c["correct"]) for c in p.candidates}) == 2]
    ids = {id(p) for p in mixed}
    return (mixed + [p for p in problems if id(p) not in ids])[:show]


def _write_table(out_dir: str, t: report.Table, s: dict, text: str, pruning: dict | None, log) -> None:
    """Write ``table.txt`` and ``table.json`` and log what the run wrote."""
    with open(os.path.join(out_dir, "table.txt"), "w", encoding="utf-8") as f:
        f.write(text + "\n" + summary_text(s) + "\n")
    report.save_json(t, os.path.join(out_dir, "table.json"), summary=s)
    extra = ", prune.png, rollouts_pruned.jsonl" if pruning is not None and "measured" in pruning else (
        ", prune.png" if pruning is not None else "")
    log(f"wrote {out_dir}/table.txt, table.json, bon.png, candidates.html, rollouts.jsonl{extra} "
        f"({s['seconds']:.0f} s)")


#: each demo task in a few words (headings, plot titles)
TITLES = {
    "forget": "the solver forgets the last term",
    "lag": "the solver reads the first term twice and stays one term behind",
}


def run_tasks(out_dir: str = "demo_out", roots: dict[str, str] | None = None, prune: bool = True, log=print,
              **kwargs) -> dict:
    """:func:`run_demo` for each task in ``roots`` (name -> artefact folder; default every shipped
    task), each into ``out_dir/<task>``, with the shipped pruning (``prune``); the per-task
    summaries also go to ``out_dir/summary.json``."""
    import json

    roots = roots or A.TASK_DIRS
    t0 = time.time()
    out = {}
    for name, root in roots.items():
        what = TITLES.get(name, name)
        log(f"\n=== demo task '{name}': {what} ===")
        shipped = SHIPPED_PRUNE.get(name, DEMO_PRUNE)
        out[name] = run_demo(out_dir=os.path.join(out_dir, name), root=root, prune=shipped if prune else None,
                             title=f"{name} ({what})", log=log, **kwargs)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, default=str)
    log(f"\nall tasks: {time.time() - t0:.0f} s; one folder per task in {out_dir}/")
    return out


def prune_run(be, problems: list[Problem], sampling: Sampling, contexts, cfg: PruneConfig | None, out_dir: str,
              progress: bool = True, log=print, title: str = "") -> dict:
    """Pruning on a traced full run (``problems``): the sweep of settings replayed on its per-token
    values (and the setting :func:`swift_fast.reports.pruning.recommend` picks), then, with ``cfg``,
    Best-of-N again on the same problems with that pruning during generation (same per-prompt
    seeds: the same draws up to each pruning point), compared with the full run; ``prune.png``."""
    from ..reports import pruning as pr

    n = sampling.n
    full = pr.outcome(problems, n)
    t0 = time.perf_counter()
    rows = pr.sweep(problems, n, base=cfg or PruneConfig(), reps=500)
    log(f"pruning sweep: {len(rows)} settings replayed on the full run's per-token values "
        f"({time.perf_counter() - t0:.1f} s)")
    rec = pr.recommend(rows)
    out: dict = {"sweep": rows, "recommended": None if rec is None else {
        "settings": rec["settings"], "accuracy": rec["accuracy"], "token_fraction": rec["token_fraction"],
        "rule": "the swept SWIFT setting with the fewest tokens within 1 point of full Best-of-N"}}
    measured_pts = []
    if cfg is not None:
        full_seconds = be.seconds
        be.seconds = 0.0
        # traced as the full run was, so the two times differ by the pruning alone
        cands = be.generate([p.prompt_token_ids for p in problems], sampling, progress=progress, contexts=contexts,
                            plugin_args={"prune": cfg.to_dict(), "trace": True},
                            desc=f"generate, pruned ({_settings(cfg.to_dict())})")
        pruned_seconds = be.seconds
        for cs in cands:
            for c in cs:
                c.pop("swift_trace", None)
        pruned = [Problem(id=p.id, candidates=cs, question=p.question, reference=p.reference, kind=p.kind,
                          prompt=p.prompt, prompt_token_ids=p.prompt_token_ids) for p, cs in zip(problems, cands)]
        for p in pruned:
            grade(p)
        os.makedirs(out_dir, exist_ok=True)
        write_rollouts(os.path.join(out_dir, "rollouts_pruned.jsonl"), pruned)
        measured = pr.compare(full, pr.outcome(pruned, n))
        budget = pr.at_budget(rows, measured["token_fraction"])
        out.update(
            settings=cfg.to_dict(),
            measured=measured,
            replayed=pr.compare(full, pr.replayed(problems, cfg, n)),
            seconds={"full": round(full_seconds, 2), "pruned": round(pruned_seconds, 2),
                     "speedup": round(full_seconds / max(pruned_seconds, 1e-9), 3)},
            at_equal_budget={k: None if v is None else {"settings": v["settings"], "accuracy": v["accuracy"],
                                                         "token_fraction": v["token_fraction"]}
                             for k, v in budget.items()},
        )
        measured_pts.append(("pruned run, shipped settings", measured["token_fraction"], measured["accuracy"]))
    os.makedirs(out_dir, exist_ok=True)
    out["plot"] = pr.plot_sweep(rows, os.path.join(out_dir, "prune.png"),
                                title=f"pruning during Best-of-N{': ' + title if title else ''}", measured=measured_pts)
    return out


def _speed(ratio: float) -> str:
    # the pruned run can lose in wall time (little to cut, a busy machine): never print "0.57x faster"
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower in wall time"


def prune_text(d: dict) -> str:
    """The pruning summary: settings, tokens, time, accuracy, the signals at equal budget, and
    the setting the sweep recommends."""
    from ..reports import pruning as pr

    lines = []
    if "measured" in d:
        t = d["seconds"]
        lines += [f"pruning during generation ({_settings(d['settings'])}), Best-of-N by SWIFT:",
                  "  " + pr.summary_text(d["measured"], "pruned run"),
                  f"  vLLM time {t['pruned']:.1f} s vs {t['full']:.1f} s for full Best-of-N ({_speed(t['speedup'])})",
                  "  " + pr.summary_text(d["replayed"], "replayed on the full run's per-token values")]
        for signal, r in d["at_equal_budget"].items():
            if r is not None:
                lines.append(f"  best swept {signal} setting within that token budget: {100 * r['accuracy']:.1f}% at "
                             f"{100 * r['token_fraction']:.1f}% of the tokens ({_settings(r['settings'])})")
    if "measured" not in d:
        lines.append("pruning during generation, replayed on the full run's per-token values:")
    r = d.get("recommended")
    lines.append("  sweep (replayed): " + ("no SWIFT setting stays within 1 point of full Best-of-N" if r is None else
                 f"fewest tokens within 1 point of full Best-of-N: {_settings(r['settings'])}, "
                 f"{100 * r['token_fraction']:.1f}% of the tokens, {100 * r['accuracy']:.1f}%"))
    return "\n".join(lines)


def _settings(d: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items())


def _load_model(model_dir: str):
    from transformers import AutoModelForCausalLM

    from ..support.engine_logs import engine_starting

    with engine_starting():  # transformers' loading bar is not the demo's output
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def add_signals(model, problems: list[Problem], window: int = CONF_WINDOW) -> dict:
    """Record the trivial selectors' fields (``num_tokens``, ``mean_logprob``, ``conf_lowest``,
    ``conf_tail``) on every candidate with the Hugging Face model; return their settings and the
    seconds they took."""
    from ..hf.signals import record_signals

    t0 = time.perf_counter()
    # One intra-op thread: the model's 128-wide matrices are too small for threads to pay, and
    # on a busy machine (another process on a core) two threads waiting on each other made this
    # pass ten times slower here (50 s against 5 s for the 3,200 candidates).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sig = record_signals(model, problems, window=window, batch_size=64)
    finally:
        torch.set_num_threads(threads)
    return {"window": sig.window, "top_k": sig.top_k, "candidates": int(sig.num_tokens.numel()),
            "seconds": round(time.perf_counter() - t0, 2)}


def _html(problems, model, head_path, tok, path, summary):
    from ..rewards.head import SwiftHead
    from .html import render, selector_picks, token_values

    head = SwiftHead.load(head_path)
    with torch.no_grad():
        values = [
            token_values(model, head, p.prompt_token_ids, [c["token_ids"] for c in p.candidates]) for p in problems
        ]
    page = render(problems, values, tok, "swift-fast demo: candidates and their SWIFT token scores", summary,
                  picks=selector_picks(problems))
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
