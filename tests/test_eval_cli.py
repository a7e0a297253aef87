import json
import subprocess
import sys

import pytest
import torch

from swift_fast.cli import main
from swift_fast.data.datasets import DataError
from swift_fast.data.rollouts import Problem, RolloutWriter, done_ids, read_rollouts, write_rollouts
from swift_fast.reports import best_of_n as report


def _problems():
    # 4 candidates each; answers, correctness and two score columns chosen so every selector's
    # outcome can be read off by hand.
    rows = [
        # p0: swift picks c1 (correct), rm picks c3 (wrong), majority "5" (c0, wrong)
        [("5", 0, 0.1, 0.2), ("7", 1, 0.9, 0.1), ("5", 0, 0.2, 0.3), ("9", 0, 0.3, 0.9)],
        # p1: swift picks c0 (wrong), rm picks c2 (correct), majority "2" (c2, correct)
        [("1", 0, 0.8, 0.0), ("2", 1, 0.1, 0.1), ("2", 1, 0.2, 0.8), ("3", 0, 0.4, 0.2)],
        # p2: nothing correct
        [("4", 0, 0.5, 0.5), ("4", 0, 0.1, 0.1), (None, 0, 0.2, 0.2), ("6", 0, 0.3, 0.3)],
    ]
    out = []
    for i, r in enumerate(rows):
        cands = [
            {"token_ids": [1, 2], "text": f"x {a}", "answer": a, "correct": bool(c), "swift_score": s, "rm": m}
            for a, c, s, m in r
        ]
        out.append(Problem(id=f"p{i}", candidates=cands, reference="?", prompt_token_ids=[0]))
    return out


def test_table_by_hand():
    c = report.gather(_problems(), ["swift_score", "rm"])
    t = report.bon_table(c, report.standard_selectors("swift_score", "rm"), ks=[1, 2, 4], reps=200)
    r = t.rows
    assert r["random"][4] == pytest.approx((1 / 4 + 2 / 4 + 0) / 3)
    assert r["random"][1] == pytest.approx(0.0)
    assert r["SWIFT"][4] == pytest.approx(1 / 3)  # p0 only
    assert r["rm"][4] == pytest.approx(1 / 3)  # p1 only
    assert r["majority"][4] == pytest.approx(1 / 3)  # p1 only
    assert r["oracle pass@k"] == {1: 0.0, 2: pytest.approx(2 / 3), 4: pytest.approx(2 / 3)}
    # rank combination p0: swift ranks [3,0,2,1], rm ranks [2,3,1,0] -> max [3,3,2,1] -> c3 (wrong)
    # p1: swift [0,3,2,1], rm [3,2,0,1] -> max [3,3,2,1] -> c3 (wrong)
    assert r["SWIFT+rm rank"][4] == 0.0
    lo, hi = t.ci["oracle pass@k"][4]
    assert 0.0 <= lo <= 2 / 3 <= hi <= 1.0


def test_bootstrap_ci_contains_the_mean_and_narrows_with_n():
    x = torch.tensor([1.0, 0.0] * 50)
    lo, hi = report.bootstrap_ci(x, seed=1)
    assert lo < 0.5 < hi and hi - lo < 0.25
    lo2, hi2 = report.bootstrap_ci(torch.tensor([1.0, 0.0] * 500), seed=1)
    assert hi2 - lo2 < hi - lo
    assert report.bootstrap_ci(torch.ones(10)) == (1.0, 1.0)


def test_eval_cli_prints_table_and_writes_plot(tmp_path, capsys):
    f = tmp_path / "r.jsonl"
    write_rollouts(f, _problems())
    png, js = tmp_path / "p.png", tmp_path / "s.json"
    assert main(["eval", str(f), "--external", "rm", "--plot", str(png), "--json", str(js), "--bootstrap", "100"]) == 0
    out = capsys.readouterr().out
    assert "majority" in out and "SWIFT+rm scaled" in out and "oracle pass@k" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads(js.read_text())
    assert summary["selectors"]["swift"]["accuracy"]["4"] == pytest.approx(1 / 3)
    assert summary["selectors"]["swift_rm_scaled"]["name"] == "SWIFT+rm scaled"


def test_eval_errors_name_file_and_line(tmp_path, capsys):
    f = tmp_path / "bad.jsonl"
    good = json.dumps(_problems()[0].to_json())
    f.write_text(good + "\n{not json\n" + good.replace('"p0"', '"p9"') + "\n")
    assert main(["eval", str(f), "--plot", "none"]) == 2
    assert f"{f}:2: invalid JSON" in capsys.readouterr().err
    assert main(["eval", str(f), "--plot", "none", "--skip-bad", "--bootstrap", "50"]) == 0
    assert "skipped 1 malformed lines" in capsys.readouterr().err


def test_missing_correctness_and_scores_are_explained(tmp_path):
    ps = _problems()
    del ps[1].candidates[2]["correct"]
    with pytest.raises(DataError, match="--grade"):
        report.gather(ps, ["swift_score"], where="f.jsonl")
    with pytest.raises(DataError, match="no candidate has a score column 'nope'"):
        report.gather(_problems(), ["nope"])


def test_bad_rows_in_a_rollout_file_are_named_by_file_and_line(tmp_path):
    f = tmp_path / "r.jsonl"
    ps = _problems()
    ps[2].candidates[1]["swift_score"] = "high"
    write_rollouts(f, ps)
    with pytest.raises(DataError, match=rf"{f}:3: problem 'p2' candidate 1: score 'swift_score' must be a number"):
        report.gather(read_rollouts(f), ["swift_score"], where=str(f))
    del ps[2].candidates[1]["correct"]
    write_rollouts(f, ps)
    with pytest.raises(DataError, match=rf"{f}:3: problem 'p2' candidate 1 has no 'correct' field"):
        report.gather(read_rollouts(f), ["swift_score"], where=str(f))


def test_rollout_writer_resumes_after_a_torn_line(tmp_path):
    f = tmp_path / "r.jsonl"
    with RolloutWriter(f) as w:
        for p in _problems()[:2]:
            w.write(p)
    with open(f, "a") as fh:
        fh.write('{"id": "p2", "candi')  # killed mid-write
    assert done_ids(f) == {"p0", "p1"}
    with RolloutWriter(f) as w:
        assert w.done == {"p0", "p1"}
        w.write(_problems()[2])
    assert [p.id for p in read_rollouts(f)] == ["p0", "p1", "p2"]


def test_nan_scores_are_written_as_null(tmp_path):
    ps = _problems()
    ps[0].candidates[0]["swift_score"] = float("nan")
    write_rollouts(tmp_path / "r.jsonl", ps)
    assert read_rollouts(tmp_path / "r.jsonl")[0].candidates[0]["swift_score"] is None


def test_help_lists_every_subcommand():
    out = subprocess.run(
        [sys.executable, "-m", "swift_fast.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for cmd in ("score", "eval", "train", "collect", "bon", "serve", "demo"):
        assert f"    {cmd}" in out


def test_eval_grade_fills_answers_and_correctness(tmp_path, capsys):
    texts = ["so \\boxed{6/5}", "it is \\boxed{1.2}", "\\boxed{7}", "no idea"]
    cands = [{"token_ids": [1], "text": t, "s": float(i)} for i, t in enumerate(texts)]
    f = tmp_path / "r.jsonl"
    write_rollouts(f, [Problem(id="q", candidates=cands, reference="\\frac{6}{5}", kind="math")])
    js = tmp_path / "s.json"
    assert main(
        ["eval", str(f), "--grade", "--score", "s", "--plot", "none", "--json", str(js), "--bootstrap", "20"]
    ) == 0
    acc = {r["name"]: r["accuracy"] for r in json.loads(js.read_text())["selectors"].values()}
    assert acc["oracle pass@k"] == {"1": 1.0, "2": 1.0, "4": 1.0}
    assert acc["s"]["4"] == 0.0 and acc["s"]["2"] == 1.0  # highest score: "no idea", then "1.2"
    assert acc["majority"]["4"] == 1.0  # 6/5 and 1.2 share one answer key


def test_eval_shows_sar_rows_when_the_file_has_the_column(tmp_path, capsys):
    """`--sar` means SAR on, as in bon, score and serve: by default SAR's rows come with a file that
    has the column (`bon --sar` writes `sar`), --sar requires it, --no-sar leaves the rows out; 0.1's
    `--sar COLUMN` still names the column."""
    def rows(*argv):
        assert main(["eval", *map(str, argv), "--plot", "none", "--bootstrap", "20"]) == 0
        out = capsys.readouterr().out
        return {line.split("  ")[0] for line in out.splitlines() if line.startswith(("SAR", "SWIFT+", "s2"))}

    plain, with_sar = tmp_path / "plain.jsonl", tmp_path / "sar.jsonl"
    write_rollouts(plain, _problems())
    ps = _problems()
    for p in ps:
        for i, c in enumerate(p.candidates):
            c["sar"] = c["s2"] = 0.1 * i
    write_rollouts(with_sar, ps)
    assert rows(plain) == set()
    sar_rows = {"SAR", "SWIFT+SAR rank", "SWIFT+SAR scaled"}
    assert rows(with_sar) == sar_rows
    assert rows(with_sar, "--sar") == sar_rows == rows("--sar", with_sar) == rows(with_sar, "--sar", "sar")
    assert rows(with_sar, "--no-sar") == set()
    assert rows(with_sar, "--sar-column", "s2") == {"s2", "SWIFT+s2 rank", "SWIFT+s2 scaled"} == rows(
        with_sar, "--sar", "s2")
    assert main(["eval", str(plain), "--sar", "--plot", "none"]) == 2
    assert "no candidate has a score column 'sar'" in capsys.readouterr().err


def test_eval_takes_the_first_n_candidates(tmp_path, capsys):
    f = tmp_path / "r.jsonl"
    write_rollouts(f, _problems())
    js = tmp_path / "s.json"
    for flag in ("--n", "-n"):  # -n: 0.1's spelling
        assert main(["eval", str(f), flag, "2", "--plot", "none", "--json", str(js), "--bootstrap", "20"]) == 0
        acc = {r["name"]: r["accuracy"] for r in json.loads(js.read_text())["selectors"].values()}
        assert set(acc["oracle pass@k"]) == {"1", "2"}


def test_eval_is_headed_by_the_heads_recommended_selector(tmp_path, capsys):
    """The head named by --head, or by the rollouts' run record while its file is unchanged,
    heads the report with its recommended selector; --select and --score choose otherwise.
    Outcomes by hand: the vote at T=0.1 follows the highest score's answer (p0 "7": right; p1
    "1": wrong), at T=100 it is the majority's (p1 "2": right)."""
    from swift_fast.jobs.run_record import record_path
    from swift_fast.rewards.head import SwiftHead
    from swift_fast.support.files import sha256_of

    path = tmp_path / "r.jsonl"
    write_rollouts(path, _problems())
    head = SwiftHead(4, [0])
    head.selector = {"select": "vote:swift@100"}
    head_path = tmp_path / "h.safetensors"
    head.save(head_path)

    def headline(*args):
        assert main(["eval", str(path), "--plot", "none", "--json", str(tmp_path / "s.json"), *args]) == 0
        out = capsys.readouterr().out
        return json.loads((tmp_path / "s.json").read_text())["summary"], out

    s, out = headline("--head", str(head_path))
    assert s["score"]["name"] == "SWIFT weighted vote (T=100)" and s["select"]["by"] == "recommended by h.safetensors"
    assert "selected by vote:swift@100 (recommended by h.safetensors" in out
    assert s["best_internal"]["accuracy"] >= 0 and "SWIFT weighted vote (T=100)" in out
    s, _ = headline("--head", str(head_path), "--select", "vote:swift@0.1")
    assert s["score"]["name"] == "SWIFT weighted vote (T=0.1)" and s["select"]["by"] == "--select"
    s, _ = headline()  # no record: --score's default column, as before
    assert s["score"]["name"] == "SWIFT" and "select" not in s
    record = {"run_id": "x", "record": {"head": {"sha256": sha256_of(head_path)}}, "sources": {"head": str(head_path)}}
    with open(record_path(path), "w") as f:
        json.dump(record, f)
    s, _ = headline()
    assert s["score"]["name"] == "SWIFT weighted vote (T=100)"
    s, _ = headline("--score", "swift_score")  # a column asked for by name heads the table
    assert s["score"]["name"] == "SWIFT"
    head.selector = {"select": "mean_logprob"}
    head.save(head_path)  # rewritten since the run: the record no longer names this head
    s, _ = headline()
    assert s["score"]["name"] == "SWIFT"
    t = report.bon_table(report.gather(_problems(), ["swift_score"]),
                         report.with_selector({}, "vote:swift@0.1"), ks=[4], reps=10)
    assert t.rows["SWIFT weighted vote (T=0.1)"][4] == pytest.approx(1 / 3)  # p0 right, p1 "1" wrong
    t = report.bon_table(report.gather(_problems(), ["swift_score"]),
                         report.with_selector({}, "vote:swift@100"), ks=[4], reps=10)
    assert t.rows["SWIFT weighted vote (T=100)"][4] == pytest.approx(1 / 3)  # p0 "5" wrong, p1 "2" right
