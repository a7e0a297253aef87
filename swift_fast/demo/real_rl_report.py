"""``report.md`` and ``rl.png`` of an RL recipe run (:mod:`.real_rl`): every figure read from the
files the run wrote (each arm's evaluations and its trainer's log), none typed in. A run still
going is reported as far as it got (its latest checkpoint's log)."""

from __future__ import annotations

import glob
import json
import os

from ..selection.bootstrap import bootstrap_interval

#: the trainer's log keys drawn against steps: (key, label)
CURVES = (("rewards/accuracy_reward/mean", "R_VR (training batch)"), ("rewards/sar/mean", "R_SA (training batch)"),
          ("completions/mean_length", "response length (tokens, training batch)"))


def _load(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def arm_log(folder: str) -> list[dict]:
    """The trainer's per-step log of an arm: the finished run's, else its latest checkpoint's."""
    done = os.path.join(folder, "history.json")
    if os.path.exists(done):
        return _load(done)["log_history"]
    states = sorted(glob.glob(os.path.join(folder, "checkpoints", "checkpoint-*", "trainer_state.json")),
                    key=lambda p: int(p.split("checkpoint-")[-1].split(os.sep)[0]))
    return _load(states[-1])["log_history"] if states else []


def arm_evals(folder: str) -> dict[int, dict]:
    """``{step: evaluation}`` of an arm (per-problem ``accuracy`` and ``length`` lists)."""
    return {(e := _load(p))["step"]: e for p in sorted(glob.glob(os.path.join(folder, "eval", "step_*.json")))}


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def _paired(after: list[float], before: list[float]) -> tuple[float, tuple[float, float]]:
    d = [a - b for a, b in zip(after, before)]
    return _mean(d), bootstrap_interval(d)


def summary(out: str) -> dict:
    """Per arm: the evaluations' means by step, and before/after with paired intervals; and the
    arms' difference at the last step they share."""
    meta = _load(os.path.join(out, "recipe.json"))
    arms = {}
    for arm in meta["arms"]:
        ev = arm_evals(os.path.join(out, arm))
        if not ev:
            continue
        first, last = min(ev), max(ev)
        means = {s: {"accuracy": _mean(e["accuracy"]), "length": _mean(e["length"])} for s, e in sorted(ev.items())}
        row = {"steps": means, "first": first, "last": last}
        for key in ("accuracy", "length"):
            d, ci = _paired(ev[last][key], ev[first][key])
            row[f"{key}_change"] = {"difference": d, "ci95": ci}
        arms[arm] = row
    both = None
    if len(arms) == 2:
        a, b = (arm_evals(os.path.join(out, x)) for x in meta["arms"])
        shared = max(set(a) & set(b))
        base, sar = a[shared], b[shared]
        assert base["ids"] == sar["ids"]
        both = {"step": shared, **{key: dict(zip(("difference", "ci95"), _paired(sar[key], base[key])))
                                   for key in ("accuracy", "length")}}
    return {"recipe": meta["recipe"], "arms": arms, "sar_minus_rvr": both}


def plot(out: str, path: str) -> str:
    from ..reports.plotting import pyplot, save

    plt = pyplot()
    meta = _load(os.path.join(out, "recipe.json"))
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6), constrained_layout=True)
    colors = {"rvr": "tab:blue", "rvr_sar": "tab:orange"}
    for arm, w in meta["arms"].items():
        log = [h for h in arm_log(os.path.join(out, arm)) if "reward" in h]
        label = "R_VR" if not w else f"R_VR + {w} R_SA"
        for ax, (key, title) in zip(axes, CURVES):
            steps = [h["step"] for h in log if key in h]
            vals = [h[key] for h in log if key in h]
            ax.plot(steps, vals, color=colors.get(arm), alpha=0.25, lw=0.8)
            k = 5  # a trailing 5-step mean over the noisy per-batch values
            ax.plot(steps, [_mean(vals[max(0, i - k + 1):i + 1]) for i in range(len(vals))], color=colors.get(arm),
                    lw=1.8, label=label)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("step")
        ev = arm_evals(os.path.join(out, arm))
        axes[3].plot(list(ev), [100 * _mean(e["accuracy"]) for e in ev.values()], "o-", color=colors.get(arm),
                     label=label)
    r = meta["recipe"]
    axes[3].set_title(f"held-out accuracy (%), {r['test_problems']} problems x {r['eval_n']}", fontsize=10)
    axes[3].set_xlabel("step")
    axes[0].legend(fontsize=8)
    fig.suptitle("GRPO on SmolLM2-135M-Instruct, arithmetic: thin lines per batch, thick a 5-step mean", fontsize=11)
    return save(fig, path)


def _pct_ci(d: dict, scale: float = 100.0, unit: str = " points") -> str:
    lo, hi = d["ci95"]
    return f"{scale * d['difference']:+.1f}{unit} [{scale * lo:+.1f}, {scale * hi:+.1f}]"


def write_report(out: str) -> str:
    s = summary(out)
    r = s["recipe"]
    png = plot(out, os.path.join(out, "rl.png"))
    lines = ["# GRPO with and without SAR (plugin rollouts)", "",
             f"{r['steps']} steps of {r['prompts_per_step']} prompts x {r['generations']} completions, learning rate "
             f"{r['learning_rate']}, temperature {r['temperature']}, top-p {r['top_p']}, at most "
             f"{r['max_completion_length']} new tokens, seed {r['seed']}. Held out: {r['test_problems']} problems x "
             f"{r['eval_n']} samples, the same seeds at every evaluation. Intervals: paired bootstrap over "
             "problems, 95%.",
             "", f"![curves]({os.path.basename(png)})", "",
             "| arm | step | held-out accuracy | mean length (tokens) |", "| --- | ---: | ---: | ---: |"]
    for arm, row in s["arms"].items():
        for step, v in row["steps"].items():
            lines.append(f"| {arm} | {step} | {100 * v['accuracy']:.1f}% | {v['length']:.1f} |")
    lines += ["", "| arm | accuracy, last minus first evaluation | length, last minus first |", "| --- | --- | --- |"]
    for arm, row in s["arms"].items():
        lines.append(f"| {arm} (steps {row['first']}-{row['last']}) | {_pct_ci(row['accuracy_change'])} | "
                     f"{_pct_ci(row['length_change'], 1.0, ' tokens')} |")
    if s["sar_minus_rvr"]:
        d = s["sar_minus_rvr"]
        lines += ["", f"rvr_sar minus rvr at step {d['step']}: accuracy {_pct_ci(d['accuracy'])}, "
                      f"length {_pct_ci(d['length'], 1.0, ' tokens')}."]
    path = os.path.join(out, "report.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    return path
