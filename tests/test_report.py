"""The trivial intrinsic selectors of the Best-of-N report (longest, shortest, mean logprob,
DeepConf's confidences and confidence-weighted votes) against picks worked out by hand, their
columns from rollout candidates (the plugin's fields, or the older trace-derived ones), and the
demo's per-task table and summary built from them."""

import json
import math

import pytest
import torch

from swift_fast.cli import main
from swift_fast.data.datasets import DataError
from swift_fast.data.rollouts import Problem, write_rollouts
from swift_fast.reports import best_of_n as report

NAN = math.nan

# 3 problems x 4 candidates: the head-free columns per candidate
COLUMNS = {
    "num_tokens": [[5, 9, 9, 3], [4, 4, 4, 4], [7, NAN, 2, 7]],
    "mean_logprob": [[NAN, -1.0, -0.5, -0.5], [-2.0, -0.1, NAN, -0.3], [NAN, NAN, NAN, NAN]],
    "confidence_lowest_group": [[1.0, 3.0, 2.0, 3.0], [NAN, 0.5, 0.5, 0.7], [4.0, 4.0, 9.0, NAN]],
    "confidence_tail": [[2.0, 1.0, 1.0, 0.5], [0.2, 0.2, NAN, 0.1], [NAN, 1.0, 1.0, 3.0]],
    "confidence_bottom10": [[0.5, 0.5, 0.9, NAN], [1.0, 2.0, 3.0, 4.0], [NAN, NAN, NAN, NAN]],
}
TRIVIAL_ROWS = ["longest", "shortest", "mean logprob", "confidence (lowest group)", "confidence (tail)",
                "confidence (bottom 10%)", "confidence (lowest group) weighted vote",
                "confidence (tail) weighted vote", "confidence (bottom 10%) weighted vote"]
# the picks, by hand: highest (lowest for shortest) value, ties to the lowest index, NaN never
# wins; a problem whose first k values are all NaN falls back to candidate 0
PICKS = {
    4: {
        "longest": [1, 0, 0],  # p0: 9 at c1 and c2 -> c1; p2: 7 at c0 and c3, NaN c1 -> c0
        "shortest": [3, 0, 2],
        "mean logprob": [2, 1, 0],  # p0: -0.5 at c2 and c3 -> c2; p2: all NaN -> c0
        "confidence (lowest group)": [1, 3, 2],
        "confidence (tail)": [0, 0, 3],
        "confidence (bottom 10%)": [2, 3, 0],  # p0: NaN c3 never wins; p2: all NaN -> c0
    },
    2: {
        "longest": [1, 0, 0],
        "shortest": [0, 0, 0],
        "mean logprob": [1, 1, 0],  # p0: NaN vs -1.0 -> c1
        "confidence (lowest group)": [1, 1, 0],  # p1: NaN vs 0.5 -> c1; p2: tie -> c0
        "confidence (tail)": [0, 0, 1],  # p2: NaN vs 1.0 -> c1
        "confidence (bottom 10%)": [0, 1, 0],  # p0: tie -> c0
    },
}


def _candidates(correct=None):
    scores = {k: torch.tensor(v, dtype=torch.float64) for k, v in COLUMNS.items()}
    correct = torch.zeros(3, 4, dtype=torch.bool) if correct is None else correct
    return report.Candidates(ids=["p0", "p1", "p2"], correct=correct, answers=[[None] * 4] * 3, scores=scores)


def _picks(selector, k):
    """The index each problem's pick has: the outcome is 1 exactly when the correct candidate is it."""
    picks = [None] * 3
    for j in range(4):
        correct = torch.zeros(3, 4, dtype=torch.bool)
        correct[:, j] = True
        out = selector(_candidates(correct), k)
        for p in range(3):
            if out[p] == 1.0:
                assert picks[p] is None
                picks[p] = j
    return picks


@pytest.mark.parametrize("k", [4, 2])
def test_trivial_selectors_pick_by_hand(k):
    sel = report.trivial_selectors(_candidates())
    assert list(sel) == TRIVIAL_ROWS
    for name, want in PICKS[k].items():
        assert _picks(sel[name], k) == want, name


def test_trivial_rows_sit_between_majority_and_the_scores_in_the_table():
    c = _candidates(torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0], [0, 0, 1, 1]], dtype=torch.bool))
    c.scores["s"] = torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 3, dtype=torch.float64)
    rows = report.standard_selectors("s", trivial=report.trivial_selectors(c))
    assert list(rows)[:7] == ["random", "majority", "longest", "shortest", "mean logprob",
                              "confidence (lowest group)", "confidence (tail)"]
    assert list(rows)[-1] == "oracle pass@k"
    t = report.bon_table(c, rows, ks=[2, 4], reps=200)
    # k=4 picks: longest [1,0,0] -> correct, correct, wrong; shortest [3,0,2] -> wrong, correct, correct
    assert t.rows["longest"][4] == pytest.approx(2 / 3)
    assert t.rows["shortest"][4] == pytest.approx(2 / 3)
    assert t.rows["mean logprob"][4] == pytest.approx(1 / 3)  # [2,1,0]: correct, wrong, wrong
    assert "longest" in report.format_table(t)


def _problem(pid, cands, **kw):
    return Problem(id=pid, candidates=cands, reference="1", prompt_token_ids=[0], **kw)


def test_signal_columns_from_candidates():
    ps = [
        _problem("a", [{"token_ids": [1, 2, 3], "correct": True, "mean_logprob": -0.5},
                       {"token_ids": [1], "num_tokens": 7, "correct": False, "mean_logprob": None}]),
        _problem("b", [{"correct": True, "conf_tail": 2.0}, {"token_ids": [], "correct": False}]),
    ]
    c = report.gather(ps, signals=True)
    # num_tokens: the field where present, else len(token_ids), else NaN
    assert c.scores["num_tokens"].tolist()[0] == [3.0, 7.0]
    assert math.isnan(c.scores["num_tokens"][1, 0]) and c.scores["num_tokens"][1, 1] == 0.0
    assert c.scores["mean_logprob"].tolist()[0][0] == -0.5 and math.isnan(c.scores["mean_logprob"][0, 1])
    # an older file's trace-derived conf_tail is read as the tail confidence
    assert c.scores["confidence_tail"].tolist()[1][0] == 2.0
    assert "confidence_lowest_group" not in c.scores  # no candidate has it: no row, no error
    assert list(report.trivial_selectors(c)) == ["longest", "shortest", "mean logprob", "confidence (tail)",
                                                 "confidence (tail) weighted vote"]
    assert report.gather(ps).scores == {}  # only when asked
    ps[0].candidates[0]["conf_tail"] = "high"
    with pytest.raises(DataError, match="conf_tail"):
        report.gather(ps, signals=True)


def _demo_problems():
    """8 problems x 4 candidates where the longest candidate is the correct one, SWIFT agrees on
    6 of them and picks a wrong one on 2."""
    out = []
    for i in range(8):
        cands = []
        for j in range(4):
            good = j == 2
            cands.append({"token_ids": [5] * (10 if good else 6 + j), "text": "", "answer": "1" if good else str(j + 2),
                          "correct": good, "swift_score": (1.0 if good else 0.0) if i < 6 else (1.0 if j == 0 else 0.0),
                          "sar": 0.0, "mean_logprob": -1.0, "conf_lowest": 1.0, "conf_tail": float(j)})
        out.append(_problem(f"p{i}", cands))
    return out


def test_task_table_names_the_best_trivial_selector_and_the_paired_difference():
    from swift_fast.demo.run import summary_text, task_table

    t, s = task_table(_demo_problems(), ks=(1, 2, 4), reps=500)
    for r in ("longest", "shortest", "mean logprob", "confidence (lowest group)", "confidence (tail)", "majority"):
        assert 0.0 <= t.rows[r][4] <= 1.0
    assert t.rows["longest"][4] == 1.0 and t.rows["SWIFT"][4] == pytest.approx(6 / 8)
    assert s["best_trivial"] == {"selector": "longest", "name": "longest", "accuracy": 1.0}
    d = s["swift_minus_best_trivial"]
    assert d["selector"] == "longest" and d["difference"] == pytest.approx(-2 / 8)
    assert d["ci95"][0] <= -2 / 8 <= d["ci95"][1] and d["ci95"][1] <= 0.0
    assert "500 resamples" in d["method"] and s["bar"]["swift_above_best_trivial"] is False
    assert "best trivial selector at k=4: longest 100.0%" in summary_text(s)


def test_eval_cli_adds_the_trivial_rows_when_the_rollouts_have_them(tmp_path, capsys):
    f = tmp_path / "r.jsonl"
    write_rollouts(f, _demo_problems())
    js = tmp_path / "s.json"
    assert main(["eval", str(f), "--plot", "none", "--json", str(js), "--bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    assert "confidence (lowest group)" in out and "shortest" in out
    sel = json.loads(js.read_text())["selectors"]
    assert sel["longest"]["accuracy"]["4"] == 1.0 and sel["confidence_tail"]["accuracy"]["4"] == 0.0  # tail: c3
    assert sel["confidence_tail"]["name"] == "confidence (tail)"
    assert main(["eval", str(f), "--plot", "none", "--no-trivial", "--bootstrap", "50"]) == 0
    assert "longest" not in capsys.readouterr().out


def test_pruned_candidates_neither_win_nor_vote_while_another_exists():
    """Rollouts of a pruned run: ``swift_pruned`` candidates are never picked by a score, do not
    vote, and count only in a problem whose candidates were all pruned."""
    def cand(score, answer, correct, pruned):
        return {"swift_score": score, "answer": answer, "correct": correct, "swift_pruned": pruned,
                "token_ids": [1, 2]}

    probs = [
        Problem(id="a", candidates=[cand(0.9, "7", False, True), cand(0.9, "7", False, True),
                                    cand(0.1, "5", True, False), cand(None, None, False, False)]),
        Problem(id="b", candidates=[cand(0.2, "1", False, True), cand(0.8, "2", True, True),
                                    cand(0.5, "1", False, True), cand(0.3, "1", False, True)]),
    ]
    c = report.gather(probs, ["swift_score"], n=4)
    assert c.pruned.tolist() == [[True, True, False, False], [True, True, True, True]]
    assert report.best_of("swift_score")(c, 4).tolist() == [1.0, 1.0]  # a: c2 (c3 has no score); b: c1
    assert report.majority(c, 4).tolist() == [1.0, 0.0]  # a: "5" alone votes; b: all pruned, "1" wins
    assert report.gather([Problem(id="x", candidates=[cand(0.1, "1", True, False)])], ["swift_score"]).pruned is None


def test_combinations_oracle_and_random_leave_pruned_candidates_out():
    """A pruned candidate's partial text may grade as correct and its scores may be the best: the
    combinations, the oracle and random choice count only the others (unless all were pruned)."""
    def cand(s, t, correct, pruned):
        return {"swift_score": s, "sar": t, "answer": None, "correct": correct, "swift_pruned": pruned,
                "token_ids": [1]}

    probs = [
        Problem(id="a", candidates=[cand(0.9, 0.9, True, True), cand(None, None, False, False),
                                    cand(0.1, 0.2, False, False)]),
        Problem(id="b", candidates=[cand(0.9, 0.1, True, True), cand(0.2, 0.8, True, True),
                                    cand(0.1, 0.0, False, True)]),
    ]
    c = report.gather(probs, ["swift_score", "sar"], n=3)
    # a: the pruned c0 is best on both scores and correct; the eligible pick is c2 (c1 has no
    #    score and ranks last); b: all pruned, so all count
    assert report.ranked("swift_score", "sar")(c, 3).tolist() == [0.0, 1.0]
    assert report.scaled("swift_score", "sar")(c, 3).tolist() == [0.0, 1.0]
    assert report.oracle(c, 3).tolist() == [0.0, 1.0]
    assert report.random_choice(c, 3).tolist() == [0.0, pytest.approx(2 / 3)]


def test_selection_summary_by_hand_single_sample_differences_and_truncation():
    """Every problem has 1 correct candidate of 4: single-sample accuracy 1/4 (the k=1 column is
    the first candidate alone: 0); SWIFT picks the correct one on 6 of 8 problems."""
    probs = _demo_problems()
    probs[0].candidates[2]["finish_reason"] = "length"  # cut off, graded correct (a complete answer)
    probs[1].candidates[0]["finish_reason"] = "length"
    probs[1].candidates[1]["finish_reason"] = "stop"
    c = report.gather(probs, ["swift_score", "sar"], signals=True)
    t = report.bon_table(c, report.standard_selectors("swift_score", sar="sar", trivial=report.trivial_selectors(c)),
                         ks=[1, 4], reps=300)
    s = report.selection_summary(c, t, "SWIFT", reps=300)
    assert t.rows["SWIFT"][1] == 0.0 and s["single_sample_accuracy"] == 0.25
    d = s["swift_minus_single"]
    assert d["difference"] == pytest.approx(6 / 8 - 1 / 4) and d["ci95"][0] <= 0.5 <= d["ci95"][1]
    assert s["best_trivial"]["selector"] == "longest" and s["swift_minus_best_trivial"]["difference"] == -0.25
    assert s["best_internal"]["selector"] in ("swift", "swift_weighted_vote", "sar", "swift_sar_rank",
                                              "swift_sar_scaled")
    assert s["score"] == {"selector": "swift", "name": "SWIFT"}
    assert s["candidates"] == 32 and s["truncated"] == {"candidates": 2, "graded_correct": 1}
    text = report.summary_text(s)
    assert "single-sample accuracy 25.0% (mean over all 4 candidates of each problem)" in text
    assert "SWIFT@4 minus single sample +50.0 points" in text and "SWIFT@4 minus longest -25.0 points" in text
    assert "truncated: 2 of 32 candidates stopped at the length limit (1 of them graded correct)" in text
    with pytest.raises(ValueError, match="no row 'rm'"):
        report.selection_summary(c, t, "rm")


def test_rows_carry_the_same_names_everywhere():
    names = list(report.standard_selectors("swift_score", "rm", "sar"))
    assert names == ["random", "majority", "SWIFT", "SAR", "rm", "SWIFT weighted vote", "SWIFT+SAR rank",
                     "SWIFT+SAR scaled", "SWIFT+rm rank", "SWIFT+rm scaled", "oracle pass@k"]


def test_figures_fit_their_titles(tmp_path):
    """A long title is wrapped inside the figure, never cut at its edges or widening the image."""
    from PIL import Image

    from swift_fast.reports import pruning as prune_report

    long = "pruning during Best-of-N: lag (the solver reads the first term twice and stays one term behind)"
    c = report.gather(_demo_problems(), ["swift_score", "sar"], signals=True)
    t = report.bon_table(c, report.standard_selectors("swift_score", sar="sar", trivial=report.trivial_selectors(c)),
                         ks=[1, 2, 4], reps=50)
    rows = [{"settings": {"signal": sig, "warmup": 4, "every": 4, "keep": k, "min_keep": 1, "window": 4},
             "accuracy": a, "full_accuracy": 0.75, "token_fraction": f}
            for sig, k, a, f in (("swift", 0.5, 0.75, 0.6), ("confidence", 0.5, 0.5, 0.55),
                                 ("combined", 0.25, 0.6, 0.4), ("random", 0.5, 0.55, 0.6))]
    for path, draw, (w, h) in (
        (tmp_path / "bon.png", lambda p: report.plot(t, str(p), title="swift-fast demo: " + long), (9.0, 4.8)),
        (tmp_path / "prune.png", lambda p: prune_report.plot_sweep(rows, str(p), title=long), (8.0, 5.0)),
    ):
        draw(path)
        width, height = Image.open(path).size
        # bbox_inches="tight" grows the image around anything outside it: a cut or overlong title would
        assert width <= (w + 0.4) * 120 and height <= (h + 0.4) * 120, (path.name, width, height)


def test_a_long_title_is_wrapped_inside_the_figure(monkeypatch):
    """The title and subtitle's drawn extents lie within the figure; without the wrapping the same
    title runs past both edges (the check can fail)."""
    from swift_fast.reports import plotting

    long = ("pruning during Best-of-N: lag (the solver reads the first term twice and stays one term behind), "
            "200 held-out problems x 16 candidates")

    def outside() -> list[str]:
        fig, ax = plotting.figure(8.0, 5.0)
        plotting.titles(fig, ax, long, "each dot: one pruning setting replayed on the full run's values; " * 3)
        fig.canvas.draw()
        r, box = fig.canvas.get_renderer(), fig.bbox
        out = [t.get_text()[:20] for t in (fig._suptitle, ax.title)
               if t.get_window_extent(r).x0 < box.x0 or t.get_window_extent(r).x1 > box.x1]
        plotting.pyplot().close(fig)
        return out

    assert outside() == []
    monkeypatch.setattr(plotting, "_wrap", lambda text, width_in, fontsize: text)
    assert len(outside()) == 2


def test_report_intervals_are_the_one_bootstrap_over_problems_checked_by_brute_force():
    """``bootstrap_ci`` is ``swift_fast.selection.bootstrap``'s, under the name reports use; a
    table's interval and a paired difference's are resamples of problems, counted here by hand."""
    from swift_fast.selection.bootstrap import bootstrap_interval

    assert report.bootstrap_ci is bootstrap_interval
    correct = torch.tensor([[True, False, False], [False, False, True], [False, False, False], [True, True, False],
                            [False, True, False]])
    scores = torch.tensor([[0.9, 0.1, 0.2], [0.5, 0.3, 0.4], [0.1, 0.2, 0.3], [0.2, 0.9, 0.1], [0.3, 0.2, 0.1]],
                          dtype=torch.float64)
    c = report.Candidates(ids=list("abcde"), correct=correct, answers=[[None] * 3] * 5, scores={"s": scores})
    t = report.bon_table(c, {"s": report.best_of("s"), "random": report.random_choice}, ks=[3], reps=400, seed=2)
    picks = {"s": [1.0, 0.0, 0.0, 1.0, 0.0],  # highest score: c0, c0, c2, c1, c0
             "random": [1 / 3, 1 / 3, 0.0, 2 / 3, 1 / 3]}  # correct share of each problem
    g = torch.Generator().manual_seed(2)
    draws = torch.randint(0, 5, (400, 5), generator=g).tolist()

    def interval(per_problem):
        means = sorted(sum(per_problem[i] for i in row) / 5 for row in draws)
        at = [(len(means) - 1) * q for q in (0.025, 0.975)]
        return [means[int(h)] + (h - int(h)) * (means[int(h) + 1] - means[int(h)]) for h in at]

    for row, per_problem in picks.items():
        assert t.rows[row][3] == pytest.approx(sum(per_problem) / 5)
        assert list(t.ci[row][3]) == pytest.approx(interval(per_problem), abs=1e-12)
    d, lo, hi = t.difference_ci("s", "random", 3, reps=400, seed=2)
    diffs = [a - b for a, b in zip(picks["s"], picks["random"])]
    assert d == pytest.approx(sum(diffs) / 5) and [lo, hi] == pytest.approx(interval(diffs), abs=1e-12)


def _demo_table(ks=(1, 2, 4), reps=50):
    c = report.gather(_demo_problems(), ["swift_score", "sar"], signals=True)
    return report.bon_table(c, report.standard_selectors("swift_score", sar="sar",
                                                         trivial=report.trivial_selectors(c)), ks=ks, reps=reps)


def test_json_report_keys_rows_in_snake_case_with_their_display_names_beside():
    """Display names ("confidence (lowest group)") are for reading; the JSON keys a program reads
    are stable snake_case, each row's display name beside it, in table order."""
    t = _demo_table()
    js = json.loads(json.dumps(t.to_json()))
    assert set(js) == {"num_problems", "ks", "selectors"}
    assert list(js["selectors"]) == ["random", "majority", "longest", "shortest", "mean_logprob",
                                     "confidence_lowest_group", "confidence_tail",
                                     "confidence_lowest_group_weighted_vote", "confidence_tail_weighted_vote",
                                     "swift", "sar",
                                     "swift_weighted_vote", "swift_sar_rank", "swift_sar_scaled", "oracle_pass_at_k"]
    assert [r["name"] for r in js["selectors"].values()] == list(t.rows)
    row = js["selectors"]["confidence_lowest_group"]
    assert row["name"] == "confidence (lowest group)" and set(row) == {"name", "accuracy", "ci95"}
    assert row["accuracy"]["4"] == t.rows["confidence (lowest group)"][4]
    assert row["ci95"]["4"] == list(t.ci["confidence (lowest group)"][4])
    # keys stay unique when a score column is named like another row
    assert report.selector_keys(["SWIFT", "swift", "rm score", "rm_score"]) == {
        "SWIFT": "swift", "swift": "swift_2", "rm score": "rm_score", "rm_score": "rm_score_2"}
    # the summary names each row it refers to by key and display name alike
    c = report.gather(_demo_problems(), ["swift_score", "sar"], signals=True)
    s = report.selection_summary(c, t, "SWIFT", reps=50)
    assert s["score"] == {"selector": "swift", "name": "SWIFT"}
    assert s["best_trivial"]["selector"] == "longest" and s["swift_minus_best_trivial"]["name"] == "longest"
    assert s["trivial"]["confidence_lowest_group"] == {"name": "confidence (lowest group)",
                                                       "accuracy": t.rows["confidence (lowest group)"][4]}
    assert all(" " not in k and "(" not in k for k in s["trivial"])


def test_csv_report_one_line_per_selector_and_k(tmp_path, capsys):
    import csv

    t = _demo_table()
    path = report.save_csv(t, str(tmp_path / "t.csv"))
    with open(path, newline="") as f:
        lines = list(csv.DictReader(f))
    assert list(lines[0]) == ["selector", "name", "k", "accuracy", "ci95_low", "ci95_high"]
    assert len(lines) == len(t.rows) * len(t.ks)
    keys = t.row_keys()
    for line in lines:
        name, k = line["name"], int(line["k"])
        assert line["selector"] == keys[name]
        assert float(line["accuracy"]) == t.rows[name][k]  # full precision
        assert [float(line["ci95_low"]), float(line["ci95_high"])] == list(t.ci[name][k])
    assert [(x["selector"], x["k"]) for x in lines[:4]] == [("random", "1"), ("random", "2"), ("random", "4"),
                                                             ("majority", "1")]
    # `eval --csv` writes the same table
    f = tmp_path / "r.jsonl"
    write_rollouts(f, _demo_problems())
    out = tmp_path / "eval.csv"
    assert main(["eval", str(f), "--plot", "none", "--csv", str(out), "--bootstrap", "50"]) == 0
    assert f"table: {out}" in capsys.readouterr().out
    with open(out, newline="") as fh:
        got = {(x["selector"], x["k"]): float(x["accuracy"]) for x in csv.DictReader(fh)}
    assert got[("longest", "4")] == 1.0 and got[("swift", "4")] == pytest.approx(6 / 8)
    assert got[("oracle_pass_at_k", "1")] == t.rows["oracle pass@k"][1]


def test_plot_keeps_the_score_best_trivial_and_oracle_prominent_the_rest_muted(tmp_path, monkeypatch):
    """Read back from matplotlib's own objects: SWIFT bold and on top of every line (the oracle
    coincides with it here at k=4 on some problems), the best trivial selector (longest) and the
    oracle prominent, every other row thin and grey under one legend entry."""
    from matplotlib.colors import to_rgb

    from swift_fast.reports import plotting

    t = _demo_table()
    figs = []
    real_save = plotting.save
    monkeypatch.setattr(plotting, "save", lambda fig, path: (figs.append(fig), real_save(fig, path))[1])
    report.plot(t, str(tmp_path / "bon.png"), title="demo")
    (fig,) = figs
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == set(t.rows)
    swift, best, oracle = lines["SWIFT"], lines["longest"], lines["oracle pass@k"]
    muted = [ln for name, ln in lines.items() if name not in ("SWIFT", "longest", "oracle pass@k")]
    assert len(muted) == len(t.rows) - 3
    assert swift.get_zorder() > max(ln.get_zorder() for ln in lines.values() if ln is not swift)
    assert swift.get_linewidth() > best.get_linewidth() >= 2.0 and oracle.get_linewidth() >= 1.5
    assert oracle.get_linestyle() == "--"
    for ln in muted:
        r, g, b = to_rgb(ln.get_color())
        assert ln.get_linewidth() <= 1.0 and ln.get_zorder() < best.get_zorder(), ln.get_label()
        assert max(r, g, b) - min(r, g, b) < 0.05, ln.get_label()  # grey
    colours = {to_rgb(ln.get_color()) for ln in (swift, best, oracle)}
    assert len(colours) == 3
    legend = [x.get_text() for x in ax.get_legend().get_texts()]
    assert len(legend) == 4 and legend[0].startswith("SWIFT") and "longest (best trivial selector)" in legend[1]
    assert legend[2].startswith("oracle pass@k") and legend[3].startswith("other selectors:")
    assert "confidence (lowest group)" in legend[3].replace("\n", " ")
    assert report.plot_roles(t)["longest"] == "best trivial" == report.plot_roles(t, ["SAR"])["longest"]
    assert report.plot_roles(t, ["SAR"])["SAR"] == "score" and report.plot_roles(t, ["SAR"])["SWIFT"] == "muted"


def _vote_problem():
    # answers A B B C -; by hand: majority B (c1, 2 votes); tail-weighted A 3.0 > B 2.5 > C 0 (NaN adds
    # nothing) -> c0; lowest-group-weighted C 5 > B 2 > A 1 -> c3; bottom-10%-weighted only B has a
    # weight -> c1; exp(mean logprob)-weighted A e^-0.1 = 0.905 > B 2e^-2 = 0.271 > C e^-3 -> c0
    answers = ["A", "B", "B", "C", None]
    tail = [3.0, 1.0, 1.5, None, 10.0]
    lowest = [1.0, 1.0, 1.0, 5.0, 1.0]
    bottom = [None, None, 0.1, None, None]
    mean = [-0.1, -2.0, -2.0, -3.0, 0.0]
    cands = [{"token_ids": [1] * (i + 1), "answer": a, "correct": i == 3, "confidence_tail": t,
              "confidence_lowest_group": g, "confidence_bottom10": b, "mean_logprob": m}
             for i, (a, t, g, b, m) in enumerate(zip(answers, tail, lowest, bottom, mean))]
    return _problem("v", cands)


def test_confidence_weighted_votes_by_hand():
    c = report.gather([_vote_problem()], signals=True)
    choosers = report.trivial_choosers(c)
    want = {"confidence (tail) weighted vote": 0, "confidence (lowest group) weighted vote": 3,
            "confidence (bottom 10%) weighted vote": 1}
    for name, idx in want.items():
        assert choosers[name](c, 5).tolist() == [idx], name
    assert report.choose_majority(c, 5).tolist() == [1]
    assert report.selector_chooser("vote:mean_logprob")(c, 5).tolist() == [0]
    # the first 3 only: tail A 3.0 vs B 2.5 -> c0; lowest group A 1 vs B 2 -> c1
    assert choosers["confidence (tail) weighted vote"](c, 3).tolist() == [0]
    assert choosers["confidence (lowest group) weighted vote"](c, 3).tolist() == [1]


def test_selector_rows_name_every_selector_of_by_value():
    assert report.selector_row("swift") == "SWIFT" and report.selector_row("sar") == "SAR"
    assert report.selector_row("mean_logprob") == "mean logprob"
    assert report.selector_row("confidence_bottom10") == "confidence (bottom 10%)"
    assert report.selector_row("vote") == "majority" and report.selector_row("rank") == "SWIFT+SAR rank"
    assert report.selector_row("vote:confidence_lowest_group") == "confidence (lowest group) weighted vote"
    assert report.selector_row("vote:swift") == "SWIFT weighted vote"
    from swift_fast.selection.by_value import SelectorError

    with pytest.raises(SelectorError, match="'best' is not a selector"):
        report.selector_row("best")
    rows = report.with_selector(report.standard_selectors(None, trivial={}), "vote:mean_logprob")
    assert list(rows)[-2:] == ["mean logprob weighted vote", "oracle pass@k"]


def _head_free_problems():
    """8 problems x 4 candidates without a SWIFT column: the longest (c2) is correct; the tail
    confidence picks it on 6 problems, c0 on the last 2."""
    out = []
    for i in range(8):
        cands = []
        for j in range(4):
            good = j == 2
            tail = (1.0 if good else 0.5) if i < 6 else (1.0 if j == 0 else 0.5)
            cands.append({"token_ids": [5] * (10 if good else 6 + j), "answer": "1" if good else str(j + 2),
                          "correct": good, "mean_logprob": -1.0, "confidence_lowest_group": 1.0,
                          "confidence_tail": tail, "confidence_bottom10": 1.0})
        out.append(_problem(f"p{i}", cands))
    return out


def test_a_report_without_a_head_has_a_head_free_headline():
    c = report.gather(_head_free_problems(), signals=True)
    rows = report.with_selector(report.standard_selectors(None, trivial=report.trivial_selectors(c)),
                                "confidence_tail")
    assert "SWIFT" not in rows and list(rows)[:3] == ["random", "majority", "longest"]
    t = report.bon_table(c, rows, ks=[1, 4], reps=100)
    assert t.rows["confidence (tail)"][4] == pytest.approx(6 / 8) and t.rows["longest"][4] == 1.0
    s = report.selection_summary(c, t, report.selector_row("confidence_tail"), reps=100)
    assert s["score"] == {"selector": "confidence_tail", "name": "confidence (tail)"}
    # the best trivial selector is another one than the headline; no score row but the headline
    assert s["best_trivial"]["name"] == "longest" and s["swift_minus_best_trivial"]["difference"] == -0.25
    assert s["best_internal"]["name"] == "confidence (tail)"
    assert s["swift_minus_single"]["difference"] == pytest.approx(6 / 8 - 1 / 4)
    text = report.summary_text(s)
    assert "confidence (tail)@4 minus longest -25.0 points" in text
    assert report.plot_roles(t, ["confidence (tail)"])["longest"] == "best trivial"


def test_eval_cli_on_rollouts_without_a_head(tmp_path, capsys):
    """No `swift_score` anywhere: `eval` reports the head-free rows, headed by DeepConf's lowest
    group confidence (the plugin's default selector without a head) or --score's column."""
    f = tmp_path / "r.jsonl"
    write_rollouts(f, _head_free_problems())
    js = tmp_path / "s.json"
    assert main(["eval", str(f), "--plot", "none", "--json", str(js), "--bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    assert "SWIFT" not in out and "confidence (bottom 10%) weighted vote" in out
    s = json.loads(js.read_text())
    assert s["summary"]["score"] == {"selector": "confidence_lowest_group", "name": "confidence (lowest group)"}
    assert s["selectors"]["confidence_tail"]["accuracy"]["4"] == pytest.approx(6 / 8)
    assert main(["eval", str(f), "--plot", "none", "--json", str(js), "--bootstrap", "50",
                 "--score", "confidence_tail"]) == 0
    assert json.loads(js.read_text())["summary"]["score"]["name"] == "confidence (tail)"
    assert main(["eval", str(f), "--plot", "none", "--score", "swift_score"]) == 2
    assert "no candidate has a score column 'swift_score'" in capsys.readouterr().err
