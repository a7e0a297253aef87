"""The demo pipeline end to end on a handful of held-out problems."""

import json
import os

import pytest
import torch

from swift_fast import SwiftHead
from swift_fast.data.rollouts import read_rollouts
from swift_fast.demo import assets as A
from swift_fast.demo import task as T
from swift_fast.demo.run import run_demo
from swift_fast.kernels.swift_reduce import swift_reduce_reference


def _reference_scores(problems, root=A.ASSETS_DIR):
    """SWIFT scores recomputed independently: one plain forward with output_hidden_states,
    states of the predicting positions, reference reduction."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.path.join(root, A.MODEL), dtype=torch.float64).eval()
    head = SwiftHead.load(os.path.join(root, A.HEAD)).double()
    out = []
    for p in problems:
        for c in p.candidates:
            ids = torch.tensor([p.prompt_token_ids + c["token_ids"]])
            n, m = len(p.prompt_token_ids), len(c["token_ids"])
            with torch.no_grad():
                hs = model(input_ids=ids, output_hidden_states=True).hidden_states
                layers = [hs[i][0, n - 1 : n + m - 1] for i in head.layers]
                s, _, _ = swift_reduce_reference(layers, head.weight, head.bias, torch.tensor([0, m]))
            out.append(float(s[0]))
    return out


def _check_outputs(out, problems, summary):
    for name in ("table.txt", "table.json", "bon.png", "candidates.html", "rollouts.jsonl"):
        assert os.path.getsize(out / name) > 0
    table = json.loads((out / "table.json").read_text())
    rows = {r["name"]: r["accuracy"] for r in table["selectors"].values()}
    for r in ("random", "majority", "SWIFT", "SAR", "SWIFT weighted vote", "SWIFT+SAR rank", "SWIFT+SAR scaled",
              "oracle pass@k"):
        assert r in rows
    # the trivial intrinsic selectors beside SWIFT, as percentages in [0, 100]
    trivial = ("longest", "shortest", "mean logprob", "confidence (lowest group)", "confidence (tail)")
    for r in trivial:
        assert all(0.0 <= 100 * v <= 100.0 for v in rows[r].values()), r
    text = (out / "table.txt").read_text()
    assert all(r in text for r in trivial) and "best trivial selector at k=" in text
    s = table["summary"]
    assert s["best_trivial"]["name"] in (*trivial, "majority")
    d = s["swift_minus_best_trivial"]
    assert d["ci95"][0] <= d["difference"] <= d["ci95"][1]
    assert s["signals"]["window"] == 16 and s["signals"]["top_k"] == 20 and s["signals"]["seconds"] >= 0
    for p in problems:
        for c in p.candidates:
            assert c["num_tokens"] == len(c["token_ids"]) > 0
            assert c["mean_logprob"] <= 0.0
            # the tail is one of the windows the lowest group is the minimum of
            assert 0.0 < c["conf_lowest"] <= c["conf_tail"] + 1e-6
    for p in problems:
        for c in p.candidates:
            assert c["correct"] == (T.extract_answer(c["text"]) == str(sum(map(int, p.question.split("+")))))
            assert -1.0 <= c["sar"] <= 1.0
    # oracle >= every selector at every k, and the accuracies are those of the rollouts
    for _name, row in rows.items():
        for k, v in row.items():
            assert v <= rows["oracle pass@k"][k] + 1e-12
    k = str(max(int(k) for k in rows["random"]))
    assert abs(rows["random"][k] - summary["single_sample_accuracy"]) < 1e-12
    _check_page((out / "candidates.html").read_text())


def _check_page(page: str) -> tuple[float, list[tuple[str | None, float]]]:
    """The page's marking threshold (from its legend) and every token's (class, g*r): a token is
    coloured exactly when |g*r| reaches the threshold, green when positive, red when negative."""
    import re

    threshold = float(re.search(r"data-threshold='([^']+)'", page).group(1))
    tokens = [(m.group(1), float(m.group(2))) for m in
              re.finditer(r'<span(?: class="(hi|lo)"[^>]*)? title="g\*r = ([-0-9.]+)"', page)]
    assert tokens and threshold > 0
    for cls, v in tokens:  # the title rounds to 3 decimals
        if cls is None:
            assert abs(v) <= threshold + 5e-4, (v, threshold)
        else:
            assert abs(v) >= threshold - 5e-4 and (cls == "hi") == (v > 0), (cls, v, threshold)
    return threshold, tokens


class _Tokenizer:
    def decode(self, ids):
        return "".join(f"<{i}>" for i in ids)


def test_candidates_page_shows_each_distinct_candidate_once_its_count_the_picks_and_marks_above_a_threshold():
    """Hand-made inputs: 4 candidates, 3 of them the same text. The page shows 2 rows (the repeated
    one with count 3 and its indices), the selectors' picks side by side, and colours only the
    tokens whose |g*r| reaches 5% of the page's largest (10.0): 10.0 and -8.0, not 0.0, -0.3, 0.2."""
    from swift_fast.data.rollouts import Problem
    from swift_fast.demo.html import MARK_FRACTION, render, selector_picks

    def cand(ids, score, answer, correct, sar):
        return {"token_ids": ids, "swift_score": score, "sar": sar, "answer": answer, "correct": correct,
                "num_tokens": len(ids), "mean_logprob": -0.5, "conf_lowest": 1.0, "conf_tail": 1.0}

    same = [11, 12, 13]
    p = Problem(id="demo/0", question="4+7", reference="11",
                candidates=[cand(same, -2.0, "7", False, 0.5), cand(same, -2.0, "7", False, 0.5),
                            cand([14, 15], 1.0, "11", True, 0.1), cand(same, -2.0, "7", False, 0.5)])
    values = [[torch.tensor([10.0, 0.0, -0.3])] * 2 + [torch.tensor([-8.0, 0.2])] + [torch.tensor([10.0, 0.0, -0.3])]]
    picks = selector_picks([p])
    assert picks[0]["SWIFT"] == 2 and picks[0]["SAR"] == 0 and picks[0]["majority"] == 0
    assert picks[0]["longest"] == 0 and picks[0]["shortest"] == 2
    assert list(picks[0])[:4] == ["SWIFT", "SAR", "majority", "longest"]
    page = render([p], values, _Tokenizer(), "t", "line one\nline two", picks=picks)
    threshold, tokens = _check_page(page)
    assert threshold == pytest.approx(MARK_FRACTION * 10.0) == 0.5
    # each distinct candidate once: 3 + 2 tokens, not 3 x 3 + 2
    assert sorted(v for _, v in tokens) == [-8.0, -0.3, 0.0, 0.2, 10.0]
    assert [v for cls, v in tokens if cls] == [10.0, -8.0]
    assert "<td class='num'>3</td><td>0&ndash;1, 3</td>" in page and "<td class='num'>1</td><td>2</td>" in page
    assert "4 candidates, 2 distinct, 1 correct" in page
    # the picks side by side: SWIFT the second distinct candidate (B, correct), SAR and majority the first
    assert "<th>SWIFT</th><th>SAR</th><th>majority</th><th>longest</th>" in page
    assert "<th>picks</th><td class='ok'>B &#10003;</td><td class='bad'>A &#10007;</td>" in page
    assert page.count("class='sel-swift'") == 1
    assert "g&middot;r &ge; +0.5" in page and "5% of the largest on this page (10)" in page
    assert "<li>line one</li><li>line two</li>" in page  # summary lines, one each


def test_demo_transformers_backend(tmp_path):
    out = tmp_path / "out"
    summary = run_demo(
        out_dir=str(out), backend="transformers", limit=3, n=4, show=2, progress=False, log=lambda *a: None
    )
    problems = read_rollouts(out / "rollouts.jsonl")
    assert len(problems) == 3 and all(len(p.candidates) == 4 for p in problems)
    _check_outputs(out, problems, summary)
    got = [c["swift_score"] for p in problems for c in p.candidates]
    assert got == pytest.approx(_reference_scores(problems), abs=1e-4)
    # the mean log-prob agrees with the library's other log-prob path (fused kernel, no logits)
    from transformers import AutoModelForCausalLM

    from swift_fast.hf import response_logprobs

    model = AutoModelForCausalLM.from_pretrained(os.path.join(A.ASSETS_DIR, A.MODEL), dtype=torch.float32).eval()
    seqs = [p.prompt_token_ids + c["token_ids"] for p in problems for c in p.candidates]
    lp, cu = response_logprobs(model, seqs, [len(p.prompt_token_ids) for p in problems for _ in p.candidates])
    means = [lp[cu[i] : cu[i + 1]].double().mean().item() for i in range(len(seqs))]
    assert [c["mean_logprob"] for p in problems for c in p.candidates] == pytest.approx(means, abs=1e-5)


@pytest.mark.slow
def test_demo_vllm_backend_runs_every_task(tmp_path):
    """`swift-fast demo` as a user runs it (its own process, real descriptors 1 and 2): every shipped
    task through the vLLM plugin, each in its folder; only the demo's own output is printed, one line
    per phase off a terminal, and vLLM's (engine, native code, loading bars) is in vllm.log."""
    pytest.importorskip("vllm")
    import subprocess
    import sys

    from swift_fast.demo.run import SHIPPED_PRUNE

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_LOGGING_LEVEL", "PYTHONWARNINGS")}
    r = subprocess.run([sys.executable, "-m", "swift_fast", "demo", "--backend", "vllm", "--limit", "2", "--n", "4",
                        "--show", "1", "--out", str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    printed = r.stdout + r.stderr
    for vllm_says in ("INFO", "WARNING", "Triton", "NUMA", "Loading safetensors", "Loading weights",
                      "Processed prompts", "Rendering prompts", "\r"):
        assert vllm_says not in printed, (vllm_says, printed)
    lines = [line for line in r.stderr.splitlines() if line.startswith("generate, ")]
    # one closing line per phase; running lines (each tenth, each 30 s) say where the phase is
    phases = [line for line in lines if " candidates in " in line]
    assert len(phases) == 2 * len(A.TASK_DIRS) and all(" 8/8 candidates in " in line for line in phases), r.stderr
    assert all(" after " in line and "%)" in line for line in lines if line not in phases), r.stderr
    assert "pruning sweep: " in r.stdout and "graded 8 candidates: " in r.stdout
    assert "NUMA" in (out / "vllm.log").read_text()
    summaries = json.loads((out / "summary.json").read_text())
    assert list(summaries) == list(A.TASK_DIRS)
    for task, summary in summaries.items():
        d = out / task
        assert summary["backend"] == "vllm"
        problems = read_rollouts(d / "rollouts.jsonl")
        _check_outputs(d, problems, summary)
        got = [c["swift_score"] for p in problems for c in p.candidates]
        assert got == pytest.approx(_reference_scores(problems, A.TASK_DIRS[task]), abs=1e-3)
        # the trivial signals came from the plugin's per-token values: the transformers pass agrees
        assert "swift_trace" in summary["signals"]["source"]
        from transformers import AutoModelForCausalLM

        from swift_fast.hf import record_signals

        fields = ("num_tokens", "mean_logprob", "conf_lowest", "conf_tail")
        plugin = [[c[f] for f in fields] for p in problems for c in p.candidates]
        model = AutoModelForCausalLM.from_pretrained(os.path.join(A.TASK_DIRS[task], A.MODEL),
                                                     dtype=torch.float32).eval()
        record_signals(model, problems, window=16)
        hf = [[c[f] for f in fields] for p in problems for c in p.candidates]
        assert torch.tensor(plugin, dtype=torch.float64).allclose(torch.tensor(hf, dtype=torch.float64), atol=1e-4)
        # the pruned run beside full Best-of-N, with the task's shipped settings
        pr = json.loads((d / "table.json").read_text())["summary"]["prune"]
        assert pr["settings"] == SHIPPED_PRUNE[task].to_dict() and pr["seconds"]["pruned"] > 0
        m = pr["measured"]
        assert m["tokens"] <= m["full_tokens"] == sum(len(c["token_ids"]) for p in problems for c in p.candidates)
        pruned = read_rollouts(d / "rollouts_pruned.jsonl")
        assert m["tokens"] == sum(len(c["token_ids"]) for p in pruned for c in p.candidates)
        assert {r["settings"]["signal"] for r in pr["sweep"]} == {"swift", "confidence", "combined", "random"}
        assert os.path.getsize(d / "prune.png") > 0


def test_vllm_info_logs_are_quiet_unless_asked(monkeypatch):
    import logging
    import sys

    from swift_fast.support.engine_logs import quiet_vllm_logs

    monkeypatch.delenv("PYTHONWARNINGS", raising=False)  # restored after the test: quiet_vllm_logs sets it
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    quiet_vllm_logs()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG"  # the user's choice stands
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    logger = logging.getLogger("vllm")
    before = logger.level
    monkeypatch.setitem(sys.modules, "vllm", sys.modules.get("vllm", object()))
    try:
        quiet_vllm_logs()
        assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
        assert logger.getEffectiveLevel() == logging.ERROR
    finally:
        logger.setLevel(before)


def test_the_pruned_runs_time_says_slower_when_it_was():
    from swift_fast.demo.run import _speed

    assert _speed(1.568) == "1.57x faster"
    assert _speed(0.57) == "1.75x slower in wall time"
