"""The jobs without a SWIFT head, apart from vLLM: `score` writes the head-free values (held to their
definitions computed by hand), `eval` reports them, and a run record tells a run without a head
from one with a head."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from head_free_reference import assert_head_free

from swift_fast.cli import main
from swift_fast.data.rollouts import Problem, read_rollouts, write_rollouts
from swift_fast.testing import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")
    return path, AutoModelForCausalLM.from_pretrained(path).float().eval(), AutoTokenizer.from_pretrained(path)


def _rollouts(tok) -> list[Problem]:
    """Two problems, responses of 9, 2, 1 and 0 tokens (token ids as a model would have generated them)."""
    prompts = [tok.encode(q) for q in ("What is 2 + 3?", "Name a colour.")]
    responses = [[[40, 41, 42, 43, 44, 45, 46, 47, 48], [50, 51]], [[60], []]]
    return [Problem(id=f"p{i}", prompt_token_ids=p, reference="5", kind="math",
                    candidates=[{"token_ids": r, "text": "5" if j == 0 else "7", "answer": "5" if j == 0 else "7",
                                 "correct": j == 0} for j, r in enumerate(rs)])
            for i, (p, rs) in enumerate(zip(prompts, responses))]


def test_score_without_a_head_writes_the_head_free_values(tiny, tmp_path, capsys):
    path, model, tok = tiny
    src, out = tmp_path / "r.jsonl", tmp_path / "s.jsonl"
    write_rollouts(src, _rollouts(tok))
    assert main(["score", "--model", path, "--rollouts", str(src), "--out", str(out), "--confidence-window", "3",
                 "--no-progress", "--dtype", "float32", "--device", "cpu"]) == 0
    assert "head-free values mean_logprob, confidence_lowest_group" in capsys.readouterr().out
    got = read_rollouts(out)
    cands = [(p.prompt_token_ids, c) for p in got for c in p.candidates]
    assert [c["num_tokens"] for _, c in cands] == [9, 2, 1, 0]
    full = [(p, c) for p, c in cands if c["token_ids"]]
    assert_head_free([c for _, c in full], model, [p for p, _ in full], [c["token_ids"] for _, c in full], window=3,
                     rtol=1e-5, atol=1e-5)
    empty = cands[-1][1]  # no token: no value, never a plausible number
    assert [empty[k] for k in ("mean_logprob", "confidence_lowest_group", "confidence_tail",
                               "confidence_bottom10")] == [None] * 4
    assert "swift_score" not in empty
    # `eval` on them: headed by DeepConf's lowest group confidence, no SWIFT row
    js = tmp_path / "e.json"
    assert main(["eval", str(out), "--plot", "none", "--json", str(js), "--bootstrap", "20", "--n", "2"]) == 0
    summary = json.loads(js.read_text())
    assert summary["summary"]["score"]["name"] == "confidence (lowest group)" and "swift" not in summary["selectors"]
    # the SWIFT score's column needs a head
    assert main(["score", "--model", path, "--rollouts", str(src), "--out", str(tmp_path / "x.jsonl"),
                 "--column", "s"]) == 2
    assert "--column names the SWIFT score's field, which needs --head" in capsys.readouterr().err


def test_a_run_without_a_head_is_another_run_than_one_with_a_head(tiny, tmp_path):
    """`bon`'s run records: the head (or none) and the plugin's settings are part of the run."""
    import hashlib

    from transformers import AutoConfig

    from swift_fast.jobs.collect import CollectConfig
    from swift_fast.jobs.engine import EngineConfig
    from swift_fast.jobs.run_record import build, first_difference
    from swift_fast.rewards.head import SwiftHead

    path = tiny[0]
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "a", "prompt": "1+1?", "answer": "2"}) + "\n")
    hp = tmp_path / "head.safetensors"
    head = SwiftHead(AutoConfig.from_pretrained(path).hidden_size, layers=[1])
    head.bind_model(AutoConfig.from_pretrained(path), name=path)
    head.save(hp)
    cfg, engine = CollectConfig(n=4), EngineConfig(engine="vllm")
    free = build(path, str(data), cfg, engine, sar=False)
    headed = build(path, str(data), cfg, engine, head=str(hp), sar=False)
    collected = build(path, str(data), cfg, engine)
    assert free.record["head"] is None and free.record["plugin"] == {"sar": False, "request": {}}
    assert headed.record["head"] == {"sha256": hashlib.sha256(hp.read_bytes()).hexdigest()}
    assert len({free.run_id, headed.run_id, collected.run_id}) == 3
    assert first_difference(free.record, headed.record)[0] == "head"
    assert first_difference(collected.record, free.record)[0] == "head"  # collect's record has no plugin at all
    # the engine's confidence window, recorded where it is not the default (2048)
    other = build(path, str(data), cfg, engine, sar=False, plugin={"confidence_window": 64})
    assert first_difference(free.record, other.record)[0] == "plugin.confidence_window"
