"""DeepConf online against SWIFT pruning and full Best-of-N on the demo's two tasks, in one engine.

For each demo task (its shipped model and head, its held-out problems, the demo's sampling: N =
16, temperature 1.0, top-p 0.9, per-problem seeds), one vLLM engine with the plugin runs, in this
order and on the same draws: full Best-of-N (traced), the demo's SWIFT pruning
(``swift_fast.demo.run.DEMO_PRUNE``), and DeepConf online at each ``--deepconf`` setting (the
plugin's ``deepconf``). Each run reports the tokens it generated, its vLLM wall time and BoN@N with
the paired 95% interval against the full run, by SWIFT and by DeepConf's confidence-weighted vote
(weights: each candidate's lowest group confidence over ``window`` tokens, from its per-token
confidences). The demo's answers are integers read by the demo's own rule, not a grading kind the
engine extracts, so DeepConf's consensus stop is off here (``consensus`` null): what is measured is
its threshold, in waves.

    python bench/bench_deepconf_demo.py --json bench/results/2026-12-06-cpu-deepconf-demo.json

CPU timings here are ratios within one run (the same engine, the same problems); the machine's
load is said beside them in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from swift_fast.demo import assets as A
from swift_fast.demo.backend import Sampling, make_backend
from swift_fast.demo.run import DEMO_PRUNE, grade, problems_from_split
from swift_fast.reports import pruning as pr
from swift_fast.rewards.confidence import lowest_group
from swift_fast.selection.deepconf import DeepConfConfig, parse_text

VOTE = "vote:confidence_lowest_group"


def run_task(task: str, root: str, n: int, settings: list[DeepConfConfig], limit: int | None, reps: int) -> dict:
    from transformers import AutoTokenizer

    prov = A.read_provenance(root)
    model_dir, head = os.path.join(root, A.MODEL), os.path.join(root, A.HEAD)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = A.read_split(root, "test.jsonl")[:limit] if limit else A.read_split(root, "test.jsonl")
    sampling = Sampling(n=n, seed=0, max_new_tokens=prov["recipe"]["max_new_tokens"])
    be = make_backend("vllm", model_dir, head, seed=0)
    runs = [("full", {"trace": True, "prune": False}),
            ("swift pruning", {"trace": True, "prune": DEMO_PRUNE.to_dict()})]
    runs += [(f"deepconf percentile={c.percentile:g}", {"trace": True, "deepconf": c.to_dict()}) for c in settings]
    out = {"task": task, "problems": len(rows), "n": n, "runs": {}}
    outcomes = {}
    try:
        warm = problems_from_split(rows[:2], tok)  # the engine's first steps are slower: not in the full run's time
        be.generate([p.prompt_token_ids for p in warm], sampling, progress=False, plugin_args={"trace": True})
        for name, args in runs:
            problems = problems_from_split(rows, tok)
            contexts = [p.extra["sar_context_token_ids"] for p in problems]
            t0 = time.perf_counter()
            cands = be.generate([p.prompt_token_ids for p in problems], sampling, progress=False, contexts=contexts,
                                plugin_args=args, desc=name)
            seconds = time.perf_counter() - t0
            window = args.get("deepconf", {}).get("window", settings[0].window if settings else 16)
            for p, cs in zip(problems, cands):
                p.candidates = cs
                grade(p)
                for c in cs:
                    c["confidence_lowest_group"] = lowest_group(c["swift_trace"]["confidence"], window) \
                        if c["swift_trace"]["confidence"] else None
            outcomes[name] = {s: pr.outcome(problems, n, select=s) for s in ("swift", VOTE)}
            row = {"seconds": seconds, "settings": args.get("deepconf") or args.get("prune")}
            if name != "full":
                for s in ("swift", VOTE):
                    row[s] = pr.compare(outcomes["full"][s], outcomes[name][s], reps=reps, select=s)
                row["wall_time_fraction"] = seconds / out["runs"]["full"]["seconds"]
            else:
                row["tokens"] = outcomes[name]["swift"].total_tokens
                row["accuracy"] = {s: outcomes[name][s].accuracy for s in ("swift", VOTE)}
            out["runs"][name] = row
    finally:
        be.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--limit", type=int, default=None, help="first problems of each task only")
    ap.add_argument("--deepconf", action="append",
                    help="DeepConf settings (key=value,...; repeatable; default: the demo-scale window 16 in waves "
                         "of 4, DeepConf-high and DeepConf-low)")
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    given = args.deepconf or ["window=16,wave=4,consensus=null,percentile=10",
                              "window=16,wave=4,consensus=null,percentile=90"]
    settings = [parse_text(s) for s in given]
    results = [run_task(task, root, args.n, settings, args.limit, args.bootstrap) for task, root in A.TASK_DIRS.items()]
    for r in results:
        print(f"{r['task']}: {r['problems']} problems x {r['n']}")
        full = r["runs"]["full"]
        print(f"  full: {full['tokens']:,} tokens, {full['seconds']:.1f} s, BoN@{r['n']} by SWIFT "
              f"{100 * full['accuracy']['swift']:.1f}%, by DeepConf's vote {100 * full['accuracy'][VOTE]:.1f}%")
        for name, row in r["runs"].items():
            if name == "full":
                continue
            print(f"  {name}: {pr.summary_text(row['swift'], 'by SWIFT')}; by DeepConf's vote "
                  f"{100 * row[VOTE]['accuracy']:.1f}% ({100 * row[VOTE]['difference']:+.1f}); "
                  f"{100 * row['wall_time_fraction']:.0f}% of the full run's wall time")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
