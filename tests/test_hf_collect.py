"""`swift-fast collect`: prompts from the templates as token ids, candidates as generated,
graded; resumable. One run through vLLM (engine start is expensive), the rest through
transformers."""

import json

import pytest
import torch
from hf_fixtures import eos_prone_model_dir

from swift_fast.data.rollouts import read_rollouts

transformers = pytest.importorskip("transformers")

DATA = [
    {"id": "a", "prompt": "What is 2 + 3?", "answer": "5"},
    {"id": "b", "prompt": "What is 12 + 34?", "answer": "46"},
    {"id": "c", "prompt": "Let 3x + 5 = 20. Find x.", "answer": "5"},
]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("collect") / "data.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in DATA))
    return str(p)


def _check_rollouts(path, tok, n, max_new):
    from swift_fast.data.templates import render_prompt
    from swift_fast.grading import grade

    problems = read_rollouts(path)
    assert [p.id for p in problems] == [r["id"] for r in DATA]
    ends = []
    for p, row in zip(problems, DATA):
        msgs = render_prompt({"question": row["prompt"]})
        want = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
        assert p.prompt_token_ids == list(want) and p.question == row["prompt"] and p.reference == row["answer"]
        # SAR's question-removed prompt: the paper's templates have no system turn, so the user turn emptied
        q0 = tok.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True, return_dict=False)
        assert p.extra["sar_context_token_ids"] == list(q0)
        assert len(p.candidates) == n
        for c in p.candidates:
            ids = c["token_ids"]
            assert 1 <= len(ids) <= max_new
            if c["finish_reason"] == "stop":
                assert ids[-1] == tok.eos_token_id and tok.eos_token_id not in ids[:-1]
            else:
                assert c["finish_reason"] == "length" and len(ids) == max_new and tok.eos_token_id not in ids
            assert c["text"] == tok.decode(ids, skip_special_tokens=True)
            assert isinstance(c["correct"], bool)
            assert c["correct"] == grade(c["text"], p.reference, finish_reason=c["finish_reason"])
            assert "answer" in c
            ends.append(c["finish_reason"])
    return problems, ends


def test_collect_with_transformers_resumes_after_an_interruption(tmp_path_factory, data_file, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swift_fast.data.datasets import load_dataset
    from swift_fast.jobs.collect import CollectConfig, collect
    from swift_fast.jobs.engine import HFEngine

    path = eos_prone_model_dir(tmp_path_factory)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    engine = HFEngine(model, tok)
    examples = load_dataset(data_file)
    cfg = CollectConfig(n=4, max_new_tokens=12, chunk=1, seed=3, grade_timeout=None)  # grade in-process

    full = tmp_path / "full.jsonl"
    collect(engine, tok, examples, full, cfg, progress=False)

    part = tmp_path / "part.jsonl"

    def stop_after_first(written):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        collect(engine, tok, examples, part, cfg, progress=False, on_chunk=stop_after_first)
    assert [p.id for p in read_rollouts(part)] == ["a"]
    stats = collect(engine, tok, examples, part, cfg, progress=True)
    assert stats["skipped_done"] == 1 and stats["written"] == 2
    problems, ends = _check_rollouts(part, tok, 4, 12)
    assert {"stop", "length"} <= set(ends)
    # per-problem seeds: the resumed file is the uninterrupted one
    assert [p.to_json() for p in problems] == [p.to_json() for p in read_rollouts(full)]
    assert problems[0].extra["sampling"] == {"n": 4, "temperature": 1.0, "top_p": 0.9, "max_new_tokens": 12, "seed": 3}


def test_score_sar_uses_the_question_removed_prompt_collect_recorded(tmp_path_factory, data_file, tmp_path, capsys):
    from hf_fixtures import random_head
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swift_fast.cli import main
    from swift_fast.data.datasets import load_dataset
    from swift_fast.data.rollouts import write_rollouts
    from swift_fast.hf import sar_rewards
    from swift_fast.jobs.collect import CollectConfig, collect
    from swift_fast.jobs.engine import HFEngine

    path = eos_prone_model_dir(tmp_path_factory)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    rollouts = tmp_path / "r.jsonl"
    collect(HFEngine(model, tok), tok, load_dataset(data_file), rollouts,
            CollectConfig(n=2, max_new_tokens=8, seed=5, grade_timeout=None), progress=False)
    head = random_head(model.config.hidden_size, [1], "predicting")
    head.bind_model(model.config, name=path)
    head.save(tmp_path / "h.safetensors")
    out = tmp_path / "scored.jsonl"
    args = ["score", "--model", path, "--head", str(tmp_path / "h.safetensors"), "--rollouts", str(rollouts),
            "--out", str(out), "--sar", "--no-progress", "--dtype", "float32"]
    assert main(args) == 0
    problems = read_rollouts(out)
    P = [p.prompt_token_ids for p in problems for _ in p.candidates]
    R = [c["token_ids"] for p in problems for c in p.candidates]
    q0 = list(tok.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True, return_dict=False))
    want = sar_rewards(model, tok, P, R, contexts=[q0] * len(P))
    got = torch.tensor([c["sar"] for p in problems for c in p.candidates])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # rollouts without the recorded context: --sar refuses, naming the field and the problem
    for p in problems:
        p.extra.pop("sar_context_token_ids")
    old = tmp_path / "old.jsonl"
    write_rollouts(old, problems)
    capsys.readouterr()
    assert main(args[:6] + [str(old), "--out", str(tmp_path / "o.jsonl"), "--sar", "--no-progress"]) == 2
    assert "sar_context_token_ids" in capsys.readouterr().err


@pytest.mark.slow
def test_collect_cli_with_vllm(tmp_path_factory, data_file, tmp_path, capsys):
    pytest.importorskip("vllm")
    from transformers import AutoTokenizer

    from swift_fast.cli import main

    path = eos_prone_model_dir(tmp_path_factory)
    out = tmp_path / "rollouts.jsonl"
    args = ["collect", "--model", path, "--data", data_file, "--n", "4", "--max-new-tokens", "12", "--out", str(out),
            "--no-progress"]
    assert main(args + ["--engine", "vllm", "--limit", "2"]) == 0
    assert [p.id for p in read_rollouts(out)] == ["a", "b"]
    # resume: the finished problems are kept, the missing one is added (with the other engine)
    assert main(args + ["--engine", "transformers"]) == 0
    assert "1 problems" in capsys.readouterr().out
    tok = AutoTokenizer.from_pretrained(path)
    problems, ends = _check_rollouts(out, tok, 4, 12)
    assert [p.extra["engine"] for p in problems] == ["vllm", "vllm", "transformers"]
    assert "stop" in ends[:8]  # vLLM keeps the end-of-turn token it stopped on


def test_collect_warns_after_its_first_chunk_when_almost_nothing_is_correct(caplog):
    from swift_fast.jobs.collect import CollectConfig, warn_few_correct

    cfg = CollectConfig(n=8, temperature=1.0)
    with caplog.at_level("WARNING", logger="swift_fast.collect"):
        assert warn_few_correct(0, 40, 5, cfg) is True
        assert warn_few_correct(1, 40, 5, CollectConfig(n=8, temperature=0.5)) is True
        assert warn_few_correct(2, 40, 5, cfg) is False  # 5%: not "almost nothing"
        assert warn_few_correct(0, 0, 0, cfg) is False
    first, second = (r.getMessage() for r in caplog.records)
    assert "after the first 5 problems only 0 of 40 candidates (0.0%) are correct" in first
    assert "a lower temperature (--temperature 0.5; now 1)" in first and "--n 16" in first
    assert "1 of 40 candidates (2.5%)" in second and "temperature" not in second  # already low


def test_collect_on_a_model_that_gets_nothing_right_says_so(tmp_path_factory, data_file, tmp_path, caplog):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swift_fast.data.datasets import load_dataset
    from swift_fast.jobs.collect import CollectConfig, collect
    from swift_fast.jobs.engine import HFEngine

    path = eos_prone_model_dir(tmp_path_factory)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    cfg = CollectConfig(n=2, max_new_tokens=6, chunk=2, seed=1, grade_timeout=None)
    with caplog.at_level("WARNING", logger="swift_fast.collect"):
        stats = collect(HFEngine(model, tok), tok, load_dataset(data_file), tmp_path / "r.jsonl", cfg, progress=False)
    first = read_rollouts(tmp_path / "r.jsonl")[:2]
    right = sum(c["correct"] for p in first for c in p.candidates)
    assert stats["written"] == 3 and right < 0.05 * 4  # a random model: nothing right
    assert [r.getMessage()[:45] for r in caplog.records] == ["swift-fast: after the first 2 problems only 0"]
