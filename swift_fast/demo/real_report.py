"""``report.md`` of a real-model recipe run (``swift_fast.demo.real_model``): every figure read
from the files the run's commands wrote (``bon``'s summary JSON, the head's provenance,
``times.json``, ``ablations.json`` when ablations ran), none typed in."""

from __future__ import annotations

import json
import os


def _load(path: str):
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _ci(ci) -> str:
    return "" if not ci else f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _diff(d: dict) -> str:
    lo, hi = d["ci95"]
    return f"{100 * d['difference']:+.1f} points [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def bon_markdown(s: dict) -> list[str]:
    """A ``bon`` summary JSON as a Markdown table (every row, every k, CI at the largest k) and
    the lines under it."""
    ks = s["ks"]
    top = str(max(ks))
    lines = ["| selector | " + " | ".join(f"k={k}" for k in ks[:-1]) + f" | k={top} [95% CI] |",
             "| --- | " + " | ".join("---:" for _ in ks) + " |"]
    for row in s["selectors"].values():
        acc = row["accuracy"]
        cells = [_pct(acc[str(k)]) for k in ks[:-1]] + [_pct(acc[top]) + _ci(row["ci95"][top])]
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    m = s.get("summary")
    if m:
        lines += [
            "",
            f"- single-sample accuracy {_pct(m['single_sample_accuracy'])}%; SWIFT@{top} minus single sample "
            f"{_diff(m['swift_minus_single'])}",
            f"- best trivial selector: {m['best_trivial']['name']} {_pct(m['best_trivial']['accuracy'])}%; "
            f"SWIFT@{top} minus it {_diff(m['swift_minus_best_trivial'])} (paired bootstrap over problems)",
            f"- truncated: {m['truncated']['candidates']} of {m['candidates']} candidates at the length limit",
        ]
    return lines


def prune_markdown(p: dict) -> list[str]:
    m, r = p["measured"], p["replayed"]
    out = [f"settings: {', '.join(f'{k}={v}' for k, v in p['settings'].items())}", ""]
    out.append(f"- pruned run: {_pct(m['token_fraction'])}% of the full run's tokens, BoN accuracy "
               f"{_pct(m['accuracy'])}% vs {_pct(m['full_accuracy'])}% "
               f"(difference {_diff({'difference': m['difference'], 'ci95': m['ci95']})})")
    out.append(f"- replayed on the full run's per-token values: {_pct(r['token_fraction'])}% of the tokens, "
               f"{_pct(r['accuracy'])}%")
    if p.get("seconds"):
        sec = p["seconds"]
        out.append(f"- vLLM wall time: full {sec['full']:.0f} s, pruned {sec['pruned']:.0f} s "
                   f"({sec['full'] / max(sec['pruned'], 1e-9):.2f}x)")
    return out


def write_report(out: str) -> str:
    times = _load(os.path.join(out, "times.json")) or {}
    rec = times.get("recipe", {})
    lines = ["# Real-model run", ""]
    lines.append(f"Model: `{times.get('gguf', '?')}` converted to `{times.get('model', '?')}`.")
    lines.append(f"Task: one-step arithmetic, {rec.get('train_problems')} training and {rec.get('test_problems')} "
                 f"held-out problems, {rec.get('n')} candidates each, temperature {rec.get('temperature')}, "
                 f"top-p {rec.get('top_p')}, at most {rec.get('max_new_tokens')} new tokens.")
    head = os.path.join(out, "head.safetensors")
    if os.path.exists(head):
        from ..rewards.head import SwiftHead

        prov = SwiftHead.load(head).provenance or {}
        d = prov.get("data", {})
        if prov.get("solver") == "probe":
            how = (f"the probe (ungated, logistic regression on mean states), L2 strength {prov.get('lambda')} "
                   f"chosen by {prov.get('folds')}-fold cross-validation of {prov.get('lambdas')}, refitted on "
                   f"{prov.get('candidates')} candidates")
        else:
            how = (f"loss {prov.get('loss')}, best epoch {prov.get('best_epoch')} of {prov.get('epochs_run')}, kept by "
                   f"{prov.get('select', 'loss')}")
        lines += ["", "## Training", "",
                  f"{d.get('candidates')} candidates of {d.get('problems')} problems, {_pct(d.get('positive_rate'))}% "
                  f"correct; {how}."]
        verdict = (prov.get("baselines") or {}).get("verdict", {}).get("text")
        if verdict:
            lines.append(f"On the validation problems: {verdict}")
    s = _load(os.path.join(out, "test_bon.summary.json"))
    if s:
        lines += ["", "## Best-of-N on the held-out problems", "", *bon_markdown(s)]
        if s.get("prune"):
            lines += ["", "## Pruning", "", *prune_markdown(s["prune"])]
    g = _load(os.path.join(out, "gsm8k_bon.summary.json"))
    if g:
        lines += ["", "## GSM8K (the same head, a harder task)", "", *bon_markdown(g)]
    a = _load(os.path.join(out, "ablations.json"))
    if a:
        lines += ["", "## Ablations (held-out BoN@16)", "",
                  "| variant | SWIFT | length regressed out | weighted vote | within-problem AUC "
                  "| minus best trivial |",
                  "| --- | ---: | ---: | ---: | ---: | --- |"]
        for name, v in list(a["variants"].items()) + [(f"curve {k}", v) for k, v in a.get("curve", {}).items()]:
            if not v:
                continue
            b = v["bon"]
            key = score_row(v, a["baselines"])
            lines.append(f"| {name} | {_pct(b.get(key))} | {_pct(b.get(key + ' (length regressed out)'))} | "
                         f"{_pct(b.get(key + ' weighted vote'))} | {v['within_problem_auc']:.3f} | "
                         f"{_diff(v['minus_best_trivial'])} |")
    if a and a.get("curve"):
        lines += ["", f"![learning curve]({os.path.basename(plot_curve(a, os.path.join(out, 'learning_curve.png')))})"]
    sec = times.get("seconds")
    if sec:
        lines += ["", "## Time", "", "| step | seconds |", "| --- | ---: |"]
        lines += [f"| {k} | {v:.0f} |" for k, v in sec.items()]
    path = os.path.join(out, "report.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


def score_row(variant: dict, baselines: dict) -> str:
    """The row of a variant's ``bon`` that is its own score (a curve point shares its variant's
    rows, named after the variant): neither a baseline nor one of the score's derived rows."""
    return next(r for r in variant["bon"]
                if r not in baselines and not r.endswith((" weighted vote", " (length regressed out)")))


def plot_curve(ablations: dict, path: str, title: str = "SWIFT on SmolLM2-135M-Instruct: learning curve") -> str:
    """Held-out BoN@16 of the learning curve's heads against training problems, with the trivial
    selectors and the oracle as horizontal lines and each point's 95% interval of the
    difference to the best trivial selector drawn around it."""
    from ..reports.plotting import figure, save, titles

    curve = {int(k): v for k, v in ablations.get("curve", {}).items() if v}
    xs = sorted(curve)
    name_of = {k: score_row(curve[k], ablations["baselines"]) for k in xs}
    ys = [100 * curve[k]["bon"][name_of[k]] for k in xs]
    base = ablations["baselines"]
    best = max((r for r in base if r not in ("oracle pass@k", "random")), key=lambda r: base[r])
    lo = [100 * (base[best] + curve[k]["minus_best_trivial"]["ci95"][0]) for k in xs]
    hi = [100 * (base[best] + curve[k]["minus_best_trivial"]["ci95"][1]) for k in xs]
    fig, ax = figure(6.4, 4.0)
    ax.fill_between(xs, lo, hi, color="tab:blue", alpha=0.15, label=f"SWIFT: 95% CI of its lead over {best}")
    ax.plot(xs, ys, "o-", color="tab:blue", lw=2, label="SWIFT@16")
    styles = {"oracle pass@k": ("k", "--"), "majority": ("tab:green", "-."), "mean logprob": ("tab:orange", "-."),
              "random": ("gray", ":")}
    for r, v in base.items():
        c, ls = styles.get(r, ("silver", ":"))
        ax.axhline(100 * v, color=c, ls=ls, lw=1, label=f"{r} {100 * v:.1f}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("training problems (16 candidates each)")
    ax.set_ylabel("held-out BoN@16 accuracy (%)")
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8, frameon=False)
    held = ablations.get("held_out_problems")
    titles(fig, ax, title, "each head trained with train's defaults on the first N training problems; the same "
                           f"held-out candidates ({held or 'the'} problems x 16) scored by each; lines: selectors that "
                           "need no training", legend_width=2.0)
    return save(fig, path)
