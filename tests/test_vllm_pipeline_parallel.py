"""The vLLM plugin under pipeline parallelism (vllm-cpu), checked against the Hugging Face reference
like the single-worker engines of ``test_vllm_plugin.py``.

Each stage projects the head's states of its own layers and sends its partial sums downstream with
the hidden states (``swift_fast.vllm_plugin.pipeline``); the last stage gates, sums and reports.
Every stage holds two decoder layers, and the heads read states on both sides of each boundary
(the first state of a later stage is rebuilt by its first layer from what the previous stage sent).
Both engines: chunked prefill (64-token budget), prefix caching and a 12-block KV cache (per stage)
that forces preemption.

* Llama, 4 layers, 2 stages of 2 tensor-parallel ranks each (the sums are sent and received by
  every rank of a stage), SAR on, a gated head over every state.
* Qwen2, 6 layers, 3 stages, an ``emitted`` head (last-state passes through every stage), ungated,
  over states ``[6, 4, 0]`` (out of order): the middle stage projects none of them and passes the
  first stage's sums on.

vllm-cpu runs pipeline stages only under torch.compile (with ``enforce_eager=True`` its second stage
fails in vLLM itself), and on this machine only with a core bound to each stage
(``VLLM_CPU_OMP_THREADS_BIND``; three or four workers share the two cores).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("vllm")

from test_vllm_plugin import (
    KV_BYTES_PER_TOKEN,
    LONG_TEXT,
    TEXTS,
    Ref,
    _preemptions,
    assert_scores,
    env,
    make_head,
    shutdown,
    sp,
    tokens,
)

from swift_fast.testing import build_tiny_model
from swift_fast.vllm_plugin.diagnostics import plugin_state

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pipeline stages need two cores"),
]

BLOCK = 32
_CORES = sorted(os.sched_getaffinity(0))[:2]
#: family: (decoder layers, tensor-parallel ranks, cores bound to each worker, head states, the states
#: each worker projects; workers in vLLM's rank order, the TP ranks of stage 0 first)
ENGINES = {
    "llama": (4, 2, [*_CORES, *_CORES], [0, 1, 2, 3, 4], [[0, 1], [0, 1], [2, 3, 4], [2, 3, 4]]),
    "qwen2": (6, 1, [*_CORES, _CORES[-1]], [6, 4, 0], [[0], [], [6, 4]]),
}


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def engine(request, tmp_path_factory):
    from vllm import LLM

    family = request.param
    num_layers, tp, cores, states, _ = ENGINES[family]
    root = tmp_path_factory.mktemp(f"pp_{family}")
    path = build_tiny_model(family, root / family, num_layers=num_layers)
    sar = family == "llama"
    head = make_head(path, layers=states, seed=21, gate=sar)
    if not sar:
        head.alignment = "emitted"
    hp = str(root / "head.safetensors")
    head.save(hp)
    with env(VLLM_CPU_OMP_THREADS_BIND="|".join(map(str, cores)), VLLM_ALLOW_INSECURE_SERIALIZATION=1):
        llm = LLM(model=path, dtype="float32", tensor_parallel_size=tp, pipeline_parallel_size=len(cores) // tp,
                  seed=0, max_model_len=256,
                  block_size=BLOCK, max_num_batched_tokens=64, enable_prefix_caching=True,
                  kv_cache_memory_bytes=12 * BLOCK * KV_BYTES_PER_TOKEN, disable_log_stats=False,
                  additional_config={"swift_fast": {"head": hp, "sar": sar}})
        try:
            yield family, llm, head, Ref(path), sar
        finally:
            shutdown(llm)


def test_each_stage_projects_the_states_of_its_own_layers(engine):
    family, llm, head, ref, sar = engine
    prompts = [ref.prompt(t) for t in TEXTS]
    res = llm.generate(tokens(prompts), sp(n=2, max_tokens=10), use_tqdm=False)
    outs = assert_scores(ref, head, res, prompts, sar=sar)
    assert len({round(c.swift_score, 6) for c in outs}) > 1
    workers = llm.collective_rpc(plugin_state)
    _, tp, _, _, states = ENGINES[family]
    assert [w["states"] for w in workers] == states
    assert all(w["pipeline_received"] == 0 for w in workers[:tp])
    assert all(w["pipeline_received"] > 0 for w in workers[tp:])


def test_prefix_cache_hits_and_chunked_prefill_across_stages(engine):
    family, llm, head, ref, sar = engine
    p = ref.prompt(LONG_TEXT)
    assert len(p) > 64  # more than one prefill chunk
    first = llm.generate(tokens([p]), sp(max_tokens=6), use_tqdm=False)
    second = llm.generate(tokens([p, p]), sp(max_tokens=6), use_tqdm=False)
    assert all(r.num_cached_tokens > 0 for r in second)
    assert_scores(ref, head, first + second, [p, p, p], sar=sar)


def test_preemption_across_stages_counts_no_token_twice(engine):
    family, llm, head, ref, sar = engine
    before = _preemptions(llm)
    prompts = [ref.prompt(t + " Please think step by step.") for t in TEXTS * 2]
    res = llm.generate(tokens(prompts), sp(max_tokens=48, ignore_eos=True), use_tqdm=False)
    assert _preemptions(llm) > before, "the 12-block KV cache must have forced preemption"
    assert_scores(ref, head, res, prompts, sar=sar)


def test_pipeline_stages_under_torchrun_are_refused_naming_the_backend(tmp_path):
    """vLLM's external_launcher (torchrun) sends the stages' tensors from inside its model runner, where
    the partial sums cannot travel; the check runs on a real config with those settings."""
    from vllm.engine.arg_utils import EngineArgs

    from swift_fast.rewards.head import HeadError
    from swift_fast.vllm_plugin.config import check_engine

    path = build_tiny_model("llama", tmp_path / "llama", num_layers=4)
    cfg = EngineArgs(model=path, dtype="float32", enforce_eager=True).create_engine_config()
    head = make_head(path, layers=[0, 4])
    cfg.parallel_config.pipeline_parallel_size = 2
    check_engine(cfg, head)  # vLLM's own backends carry them
    cfg.parallel_config.distributed_executor_backend = "external_launcher"
    with pytest.raises(HeadError, match="external_launcher"):
        check_engine(cfg, head)


def test_bon_with_pipeline_stages_scores_exactly(tmp_path, capfd, monkeypatch, vllm_logs_restored):
    """``swift-fast bon --pipeline-parallel-size 2`` on the CPU: the command binds a core to each stage
    and compiles (vLLM's stages need it there) by itself, and keeps vLLM's INFO logs out of its output
    (this process's and the engine processes', read at the file descriptors); every score exact
    against Hugging Face."""
    from test_vllm_bon_data_parallel import QUESTIONS
    from test_vllm_plugin import ATOL, RTOL

    from swift_fast.cli import main
    from swift_fast.data.rollouts import read_rollouts

    path = build_tiny_model("llama", tmp_path / "llama", num_layers=4)
    head = make_head(path, layers=[0, 2, 4], seed=9)
    hp = tmp_path / "head.safetensors"
    head.save(hp)
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": q, "answer": a}) + "\n"
                            for i, (q, a) in enumerate(QUESTIONS)))
    out = tmp_path / "bon.jsonl"
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)  # chosen by the command
    rc = main([
        "bon", "--model", path, "--head", str(hp), "--data", str(data), "--n", "3", "--max-new-tokens", "10",
        "--dtype", "float32", "--out", str(out), "--bootstrap", "50", "--no-progress", "--plot", "none",
        "--vllm", "max_model_len=256", "--vllm", f"kv_cache_memory_bytes={512 * KV_BYTES_PER_TOKEN}",
        "--pipeline-parallel-size", "2",
    ])
    printed = capfd.readouterr()
    assert rc == 0, printed.out + printed.err
    info = [line for line in (printed.out + printed.err).splitlines() if " INFO " in line]
    assert not info, info[:5]
    assert "VLLM_CPU_OMP_THREADS_BIND" not in os.environ, "the binding is the started engine's, not the process's"
    assert f"({len(QUESTIONS)} problems generated, 0 already there)" in printed.out
    problems = read_rollouts(out)
    P = [p.prompt_token_ids for p in problems for _ in p.candidates]
    R = [c["token_ids"] for p in problems for c in p.candidates]
    assert len(R) == 3 * len(QUESTIONS)
    got = torch.tensor([c["swift_score"] for p in problems for c in p.candidates])
    torch.testing.assert_close(got, Ref(path).swift(head, P, R), rtol=RTOL, atol=ATOL)
