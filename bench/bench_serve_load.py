"""Load and fault run against `swift-fast serve`: throughput, errors, memory, and what is left held.

One server (`swift-fast serve --sar`, the embedded demo model and head by default) on loopback
gets a bounded mixed load from ``--concurrency`` concurrent clients:

- chat and completion requests, ``n`` of 1, 2 or 4, completions with one or two prompts;
- server-side Best-of-N (``"best_of_n": 2`` or ``4``) in both APIs;
- streamed chat and completions (scores on each choice's final chunk);
- SAR on for every request (its question-removed pass runs after each candidate finishes);
- client cancellations (``--cancel-fraction`` of the valid requests), three kinds:
  ``early`` (the task is cancelled at a random time within the running median latency of its
  kind: mid-generation), ``late`` (non-streamed, cancelled at 0.5-1.1x that median: at the end
  of generation, while the SAR passes run, or just after the answer), ``at_sar`` (streamed with
  ``ignore_eos`` and a fixed ``max_tokens``: the client reads tokens until every choice has all
  but its last one, then closes the connection within a couple of steps, when the last token is
  generated and the candidate is held for its SAR pass). A cancellation whose answer arrived
  first counts as ``ok`` (and is checked like any answer);
- ``--malformed`` malformed requests interleaved (bad JSON, wrong content type, ``best_of_n``
  of 0 / a string / with ``stream`` / with ``n`` / above the server's limit / greedy,
  unknown model, token ids out of the vocabulary, prompts over the context, ...): each must be
  answered 4xx; a 5xx or a dropped connection is an error.

Every answered choice must carry a non-null ``swift_score`` and a ``sar`` key (Best-of-N: all
N candidates' scores, the chosen one's equal to the choice's); a null ``sar`` fails the run too.
A warm-up round (one request of every kind, then ``--concurrency`` mixed requests) runs first;
the server process tree's resident memory (psutil: API server, engine core, worker) is read
after it and after each of ``--rounds`` load rounds, and sampled every 0.5 s for the peak.
"Held afterwards" is read from vLLM's Prometheus gauges (``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``, which counts the KV blocks of SAR
passes too): the engine publishes them only when it steps, so after an abort they can be stale;
one probe request (answered and checked) refreshes them, then they are polled until they read
zero. Valid requests carry ``X-Request-Id: <run tag>-<index>`` (vLLM's request id), so a server
log taken with ``--enable-log-requests`` shows which cancellations reached the engine as aborts.

Default sizes: 800 valid requests plus 40 malformed, 64 concurrent, 25% of the valid ones
cancelled, ``max_tokens`` 64 (the demo's answers take 10-45 tokens), ``at_sar`` streams of 16
tokens, 120 s per request, one round. With the embedded demo model on a 2-core CPU: server start
~25 s (eager), then 15-40 s per round.

    python bench/bench_serve_load.py                                # start a demo server, run
    python bench/bench_serve_load.py --requests 200 --concurrency 16 --json load.json
    python bench/bench_serve_load.py --url http://127.0.0.1:8000 --model M   # a running server

Faults (each its own run): ``--prune`` makes every request with several candidates ask
``"prune": true`` (pruned choices carry a partial score and no ``sar``); ``--pause-at S`` pauses
the engine S seconds into each round (``POST /pause?mode=wait``, as an RL weight sync does; the
started server gets ``VLLM_SERVER_DEV_MODE=1``), resumes it ``--pause-for`` seconds later, and
the run must still pass every check above; ``--kill-engine-at S`` kills the engine core S
seconds into the round (SIGKILL): every request must then end, with an answer, an error or a
closed connection, before its timeout (no request hangs), and nothing is settled afterwards.

Exit status 1 when a request errs, a choice is unscored, a malformed request is not answered
4xx, or the server still holds requests afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import re
import statistics
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field

import httpx

from swift_fast import testing
from swift_fast.testing import Server

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "swift_fast", "assets", "demo")
DEMO_MODEL = os.path.join(DEMO, "model")
DEMO_HEAD = os.path.join(DEMO, "head.safetensors")

#: the demo's task; other models just get arithmetic questions
QUESTIONS = ("12+34+5", "4+7+70", "36+7+6+87+7", "9+5+0+8", "51+3+20", "8+61+9+2", "77+1+40+6+3", "2+9+13")

#: request kinds and their share of the valid requests
MIX = {"chat": 0.25, "chat_stream": 0.15, "chat_bon": 0.15,
       "completion": 0.15, "completion_stream": 0.15, "completion_bon": 0.15}

STARTUP_TIMEOUT = 600


@dataclass
class LoadConfig:
    requests: int = 800
    concurrency: int = 64
    cancel_fraction: float = 0.25
    malformed: int = 40
    max_tokens: int = 64
    rounds: int = 1  # the load repeated; memory is read after each
    sar_tokens: int = 16  # max_tokens of the at_sar streams
    request_timeout: float = 120.0
    settle_timeout: float = 60.0
    # below the server's keep-alive timeout (uvicorn's, VLLM_HTTP_TIMEOUT_KEEP_ALIVE=5 s): a client
    # reusing a connection the server is closing gets a reset that is no fault of the server's
    keepalive_expiry: float = 2.0
    seed: int = 0
    prune: bool = False  # "prune": true on every request with several candidates (n > 1, best_of_n)
    pause_at: float | None = None  # seconds into each round: POST /pause?mode=wait, then /resume
    pause_for: float = 3.0  # seconds between the pause returning and the resume
    kill_engine_at: float | None = None  # seconds into the round: the engine core is killed (SIGKILL)


@dataclass
class Spec:
    """One request of the plan."""

    i: int
    kind: str
    path: str
    body: dict | None = None
    raw: bytes | None = None  # malformed: sent as is
    headers: dict = field(default_factory=dict)
    stream: bool = False
    choices: int = 1  # choices the answer must have
    bon: int | None = None
    cancel: str | None = None  # early / late / at_sar
    case: str | None = None  # malformed case name


# -- the plan ------------------------------------------------------------------------------------
def _valid(i: int, kind: str, rng: random.Random, model: str, prompts: dict, cfg: LoadConfig) -> Spec:
    chat = kind.startswith("chat")
    q = rng.choice(QUESTIONS)
    body: dict = {"model": model, "max_tokens": cfg.max_tokens, "temperature": 1.0}
    n_prompts = 1
    if chat:
        body["messages"] = [{"role": "user", "content": q}]
    else:
        n_prompts = 2 if rng.random() < 0.3 else 1
        ids = [prompts[q]] + [prompts[rng.choice(QUESTIONS)] for _ in range(n_prompts - 1)]
        body["prompt"] = ids[0] if n_prompts == 1 else ids
    spec = Spec(i, kind, "/v1/chat/completions" if chat else "/v1/completions", body)
    if kind.endswith("_bon"):
        spec.bon = rng.choice((2, 4))
        body["best_of_n"] = spec.bon
        spec.choices = n_prompts
    else:
        n = rng.choice((1, 2) if kind.endswith("_stream") else (1, 2, 4))
        if n > 1:
            body["n"] = n
        spec.choices = n * n_prompts
    if cfg.prune and (spec.bon or body.get("n", 1) > 1):
        body["prune"] = True
    if kind.endswith("_stream"):
        spec.stream = body["stream"] = True
    return spec


def malformed_cases(model: str, prompts: dict) -> list[Spec]:
    """Requests that must be answered 4xx."""
    p = prompts[QUESTIONS[0]]
    comp = {"model": model, "prompt": p, "max_tokens": 4}
    chat = {"model": model, "messages": [{"role": "user", "content": QUESTIONS[0]}], "max_tokens": 4}
    C, H = "/v1/completions", "/v1/chat/completions"
    cases = [
        ("bad_json", C, b'{"model": "' + model.encode() + b'", "prompt": [1, 2', None),
        ("not_an_object", H, b"[1, 2, 3]", None),
        ("empty_body", C, b"", None),
        ("wrong_content_type", C, json.dumps(comp).encode(), {"Content-Type": "text/plain"}),
        ("best_of_n_zero", C, {**comp, "best_of_n": 0}, None),
        ("best_of_n_string", H, {**chat, "best_of_n": "4"}, None),
        ("best_of_n_with_stream", H, {**chat, "best_of_n": 2, "stream": True}, None),
        ("best_of_n_with_n", C, {**comp, "best_of_n": 2, "n": 2}, None),
        ("best_of_n_over_limit", C, {**comp, "best_of_n": 1000}, None),
        ("best_of_n_greedy", H, {**chat, "best_of_n": 2, "temperature": 0.0}, None),
        ("best_of_n_on_responses", "/v1/responses", {"model": model, "input": QUESTIONS[0], "best_of_n": 2}, None),
        ("unknown_model", H, {**chat, "model": "no-such-model"}, None),
        ("no_messages", H, {"model": model, "max_tokens": 4}, None),
        ("messages_not_a_list", H, {**chat, "messages": QUESTIONS[0]}, None),
        ("message_without_role", H, {**chat, "messages": [{"content": QUESTIONS[0]}]}, None),
        ("token_out_of_vocab", C, {**comp, "prompt": [1, 2, 10**6]}, None),
        ("prompt_over_context", C, {**comp, "prompt": (p * 64)[:2000]}, None),
        ("max_tokens_over_context", H, {**chat, "max_tokens": 10**6}, None),
        ("negative_max_tokens", C, {**comp, "max_tokens": -3}, None),
        ("n_zero", H, {**chat, "n": 0}, None),
        ("temperature_not_a_number", C, {**comp, "temperature": "hot"}, None),
        ("sar_context_bad_shape", C, {**comp, "sar_context": {"not": "ids"}}, None),
    ]
    out = []
    for name, path, body, headers in cases:
        s = Spec(-1, "malformed", path, case=name, headers=dict(headers or {}))
        if isinstance(body, bytes):
            s.raw = body
            s.headers.setdefault("Content-Type", "application/json")
        else:
            s.body = body
        out.append(s)
    return out


def plan(model: str, prompts: dict, cfg: LoadConfig) -> list[Spec]:
    """The requests of one run, in sending order (deterministic for ``cfg.seed``)."""
    rng = random.Random(cfg.seed)
    kinds = list(MIX)
    specs = [_valid(i, rng.choices(kinds, weights=[MIX[k] for k in kinds])[0], rng, model, prompts, cfg)
             for i in range(cfg.requests)]
    for s in rng.sample(specs, round(cfg.cancel_fraction * len(specs))):
        if s.stream:
            s.cancel = rng.choice(("early", "at_sar"))
        else:
            s.cancel = rng.choice(("early", "late"))
        if s.cancel == "at_sar":
            # a known length: the client can tell when only the last token is missing
            s.body.update(ignore_eos=True, max_tokens=cfg.sar_tokens, return_token_ids=True)
    bad = malformed_cases(model, prompts)
    for j in range(cfg.malformed):
        s = Spec(**{**asdict(bad[j % len(bad)]), "i": cfg.requests + j})
        specs.insert(rng.randrange(len(specs) + 1), s)
    return specs


# -- one exchange ----------------------------------------------------------------------------------
class _Latencies:
    """Running median latency per kind: where ``early`` and ``late`` cancellations aim."""

    def __init__(self, default: float = 1.0):
        self.by_kind: dict = collections.defaultdict(lambda: collections.deque(maxlen=64))
        self.default = default

    def add(self, kind: str, t: float) -> None:
        self.by_kind[kind].append(t)

    def median(self, kind: str) -> float:
        d = self.by_kind[kind]
        return statistics.median(d) if d else self.default


def check_choices(spec: Spec, choices: list[dict]) -> tuple[list[str], int]:
    """Problems with an answer's choices (final chunks for streams); the count of null ``sar``."""
    problems, sar_null, pruned = [], 0, 0
    if len(choices) != spec.choices:
        problems.append(f"{len(choices)} choices, expected {spec.choices}")
    for c in choices:
        if c.get("swift_score") is None:
            problems.append(f"choice {c.get('index')}: swift_score is {c.get('swift_score')!r}")
        if "sar" not in c:
            problems.append(f"choice {c.get('index')}: no sar key")
        elif c.get("finish_reason") == "pruned":  # a pruned candidate gets no SAR pass
            pruned += 1
        elif c["sar"] is None:
            sar_null += 1
        if spec.bon:
            info = c.get("best_of_n") or {}
            scores = info.get("swift_scores") or []
            if info.get("n") != spec.bon or len(scores) != spec.bon or any(x is None for x in scores):
                problems.append(f"choice {c.get('index')}: best_of_n {info!r}")
            elif scores[info["index"]] != c.get("swift_score"):
                problems.append(f"choice {c.get('index')}: swift_score is not the chosen candidate's")
    return problems, sar_null, pruned


class _ClientClosed(Exception):
    """The client closed the connection on purpose (an ``at_sar`` cancellation)."""


async def _event_before(lines, deadline: float) -> str:
    """The next SSE event line if it comes before ``deadline``; else the client gives up."""
    while True:
        try:
            line = await asyncio.wait_for(anext(lines), max(deadline - time.perf_counter(), 0.0))
        except asyncio.TimeoutError:
            raise _ClientClosed() from None  # leaving the response's block closes the connection
        if line.strip():  # blank lines only separate events
            return line


async def _exchange(client: httpx.AsyncClient, spec: Spec, rec: dict, rng: random.Random, tag: str) -> None:
    """Send ``spec`` and fill ``rec`` (status, error, problems, sar_null)."""

    async def trace(name, info):
        # whether a failed exchange had a fresh connection or a reused one tells a server fault
        # from a keep-alive race
        if name == "connection.connect_tcp.complete":
            rec["new_connection"] = True

    # vLLM takes X-Request-Id as its request id: server-side log lines can be matched to requests
    headers = {**spec.headers, "X-Request-Id": f"{tag}-{spec.i}"} if spec.case is None else spec.headers
    kw: dict = {"headers": headers, "extensions": {"trace": trace}}
    if spec.raw is not None:
        kw["content"] = spec.raw
    else:
        kw["json"] = spec.body
    if not spec.stream:
        r = await client.post(spec.path, **kw)
        rec["status"] = r.status_code
        if r.status_code != 200:
            rec["error"] = r.text[:300]
            return
        data = r.json()
        rec["problems"], rec["sar_null"], rec["pruned"] = check_choices(spec, data.get("choices") or [])
        return
    async with client.stream("POST", spec.path, **kw) as r:
        rec["status"] = r.status_code
        if r.status_code != 200:
            rec["error"] = (await r.aread()).decode(errors="replace")[:300]
            return
        finals: dict = {}
        tokens: dict = collections.Counter()
        done = False
        gaps: collections.deque = collections.deque(maxlen=8)
        last = time.perf_counter()
        lines = r.aiter_lines()
        armed = spec.cancel == "at_sar"
        while True:
            try:
                if armed and len(tokens) == spec.choices and min(tokens.values()) >= spec.body["max_tokens"] - 1:
                    armed = False
                    # the last token is being generated, then the SAR pass runs: close within about two steps
                    t_armed = time.perf_counter()
                    wait = rng.uniform(0.0, 2.5 * (statistics.median(gaps) if gaps else 0.05))
                    line = await _event_before(lines, t_armed + wait)
                    rec["answered_after_s"] = time.perf_counter() - t_armed
                else:
                    line = await anext(lines)
            except StopAsyncIteration:
                break
            if not line.startswith("data: "):
                continue
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
            payload = line[len("data: "):].strip()
            if payload == "[DONE]":
                done = True
                continue
            chunk = json.loads(payload)
            if "error" in chunk:
                rec["status"] = "stream_error"
                rec["error"] = json.dumps(chunk["error"])[:300]
                return
            for c in chunk.get("choices") or []:
                tokens[c.get("index")] += len(c.get("token_ids") or [])
                if c.get("finish_reason") is not None:
                    finals[c.get("index")] = c
        problems, rec["sar_null"], rec["pruned"] = check_choices(spec, list(finals.values()))
        if not done:
            problems.append("stream ended without [DONE]")
        rec["problems"] = problems


async def run_one(client: httpx.AsyncClient, spec: Spec, lat: _Latencies, rng: random.Random, timeout: float,
                  tag: str = "load") -> dict:
    rec: dict = {"i": spec.i, "kind": spec.kind, "cancel": spec.cancel, "case": spec.case}
    t0 = time.perf_counter()
    rec["sent_at"] = t0
    task = asyncio.ensure_future(_exchange(client, spec, rec, rng, tag))
    remaining = timeout
    if spec.cancel in ("early", "late"):
        m = lat.median(spec.kind)
        delay = rng.uniform(0.0, m) if spec.cancel == "early" else rng.uniform(0.5 * m, 1.1 * m)
        done, _ = await asyncio.wait({task}, timeout=delay)
        if not done:
            task.cancel()  # httpx closes a connection whose exchange was cancelled
            await asyncio.gather(task, return_exceptions=True)
            rec.update(outcome="cancelled", latency=time.perf_counter() - t0)
            return rec
        remaining = max(timeout - delay, 1e-3)
    try:
        await asyncio.wait_for(task, remaining)
    except asyncio.TimeoutError:
        rec.update(outcome="timeout", error=f"no answer within {timeout:.0f} s")
    except _ClientClosed:
        rec["outcome"] = "cancelled"
    except httpx.TransportError as e:
        cause = e.__cause__ or e.__context__
        rec.update(outcome="connection_error", error=f"{type(e).__name__}: {e} ({cause!r})"[:300])
    except Exception as e:  # an answer this run cannot parse is the server's fault
        rec.update(outcome="invalid", error=f"{type(e).__name__}: {e}"[:300])
    rec["latency"] = time.perf_counter() - t0
    if "outcome" in rec:
        return rec
    status = rec.get("status")
    if spec.case is not None:
        rec["outcome"] = "rejected_4xx" if isinstance(status, int) and 400 <= status < 500 else "malformed_accepted"
        if isinstance(status, int) and status >= 500:
            rec["outcome"] = "http_5xx"
    elif status == 200:
        rec["outcome"] = "invalid" if rec.get("problems") else "ok"
        if rec["outcome"] == "ok" and spec.cancel is None:
            lat.add(spec.kind, rec["latency"])
    elif status == "stream_error":
        rec["outcome"] = "stream_error"
    elif isinstance(status, int) and status >= 500:
        rec["outcome"] = "http_5xx"
    else:
        rec["outcome"] = "http_4xx"
    return rec


async def run_load(base_url: str, specs: list[Spec], cfg: LoadConfig, lat: _Latencies | None = None,
                   on_tick=None) -> tuple[list[dict], float]:
    """Send ``specs`` with ``cfg.concurrency`` clients; the records (in plan order) and the wall time."""
    lat = lat or _Latencies()
    rng = random.Random(cfg.seed + 1)
    tag = f"load{os.getpid():x}{int(time.time() * 1000) % 10**8:x}"
    queue: asyncio.Queue = asyncio.Queue()
    for s in specs:
        queue.put_nowait(s)
    out: dict = {}
    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency,
                          keepalive_expiry=cfg.keepalive_expiry)
    timeout = httpx.Timeout(cfg.request_timeout, connect=30.0)

    async def worker():
        while True:
            try:
                s = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            out[s.i] = await run_one(client, s, lat, rng, cfg.request_timeout, tag)

    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        t0 = time.perf_counter()
        ticker = asyncio.ensure_future(on_tick()) if on_tick else None
        try:
            await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
        finally:
            if ticker is not None:
                ticker.cancel()
                await asyncio.gather(ticker, return_exceptions=True)
        wall = time.perf_counter() - t0
    records = [out[s.i] for s in specs]
    for r in records:
        r["request_id"] = f"{tag}-{r['i']}"
    return records, wall


# -- the server ------------------------------------------------------------------------------------
def serve(log_path: str, model: str = DEMO_MODEL, head: str = DEMO_HEAD, *, eager: bool = True,
          kv_cache_bytes: int = 64 * 2**20, extra: tuple = (), startup_timeout: float = STARTUP_TIMEOUT):
    """`swift-fast serve --sar` with the embedded model and head (``swift_fast.testing.serve``).

    ``eager`` skips torch.compile (start-up ~25 s instead of ~50 s on a 2-core CPU; the compiled path is
    tests/test_vllm_server.py's)."""
    return testing.serve(model, head, log_path, sar=True, eager=eager, max_model_len=512,
                         kv_cache_bytes=kv_cache_bytes, extra=("--disable-uvicorn-access-log", *extra),
                         startup_timeout=startup_timeout, cwd=REPO)


def process_memory(pid: int | None) -> list[dict]:
    """Resident memory of ``pid`` and its descendants: ``[{pid, role, rss_bytes}]``."""
    if pid is None:
        return []
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in procs:
        try:
            name, cmd, rss = p.name(), " ".join(p.cmdline()), p.memory_info().rss
        except psutil.Error:
            continue
        role = ("api_server" if p.pid == pid else "engine_core" if "EngineCore" in name + cmd
                else "worker" if "Worker" in name + cmd else "resource_tracker" if "resource_tracker" in cmd
                else name)
        out.append({"pid": p.pid, "role": role, "rss_bytes": rss})
    return out


_SAMPLE = re.compile(r"^(vllm:[a-z_]+)(\{[^}]*\})?\s+(\S+)$")


def metrics(base_url: str) -> dict:
    """vLLM's Prometheus samples: ``{name: {labels: value}}``."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict = collections.defaultdict(dict)
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1)][m.group(2) or ""] = float(m.group(3))
    return out


def _total(samples: dict, name: str, label: str | None = None) -> float:
    return sum(v for k, v in samples.get(name, {}).items() if label is None or label in k)


def _idle(h: dict) -> bool:
    return (h["running"], h["waiting"], h["kv_cache_usage"]) == (0, 0, 0)


def held(base_url: str) -> dict:
    m = metrics(base_url)
    return {"running": _total(m, "vllm:num_requests_running"), "waiting": _total(m, "vllm:num_requests_waiting"),
            "kv_cache_usage": _total(m, "vllm:kv_cache_usage_perc"),
            "generation_tokens": _total(m, "vllm:generation_tokens_total")}


def chat_prompt_ids(base_url: str, model: str) -> dict:
    """Every question as the server's chat template renders it (token ids, for /v1/completions)."""
    out = {}
    for q in QUESTIONS:
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": q}],
                           "add_generation_prompt": True}).encode()
        req = urllib.request.Request(f"{base_url}/tokenize", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            out[q] = json.loads(r.read())["tokens"]
    return out


async def settle(server: Server, cfg: LoadConfig, prompts: dict) -> dict:
    """Send one probe (which refreshes the engine's gauges), then poll them until they read zero."""
    probe = _valid(-2, "chat", random.Random(0), server.model, prompts, cfg)
    probe.body.pop("n", None)
    probe.body.pop("prune", None)  # "prune" needs several candidates
    probe.choices = 1
    rec = (await run_load(server.url, [probe], LoadConfig(concurrency=1, request_timeout=cfg.request_timeout)))[0][0]
    t0 = time.perf_counter()
    while True:
        h = held(server.url)
        if _idle(h) or time.perf_counter() - t0 > cfg.settle_timeout:
            break
        await asyncio.sleep(0.5)
    h.update(probe=rec["outcome"], settled_after_s=round(time.perf_counter() - t0, 2))
    return h


# -- the whole run ------------------------------------------------------------------------------------
def summarize(records: list[dict], wall: float) -> dict:
    valid = [r for r in records if r["case"] is None]
    bad = [r for r in records if r["case"] is not None]
    counts = collections.Counter(r["outcome"] for r in records)
    ok = [r for r in valid if r["outcome"] == "ok"]
    lats = sorted(r["latency"] for r in ok)
    cancels = [r for r in valid if r["cancel"]]
    per_kind = {}
    for kind in MIX:
        rs = [r for r in valid if r["kind"] == kind]
        ls = sorted(r["latency"] for r in rs if r["outcome"] == "ok")
        per_kind[kind] = {"sent": len(rs), "ok": len(ls), "cancelled": sum(r["outcome"] == "cancelled" for r in rs),
                          "p50_s": _q(ls, 0.5), "p95_s": _q(ls, 0.95)}
    errors = [r for r in records if r["outcome"] not in ("ok", "cancelled", "rejected_4xx")]
    start = min((r["sent_at"] for r in records), default=0.0)
    for r in records:
        r["sent_after_s"] = round(r.pop("sent_at") - start, 3)
    return {
        "sent": len(records), "valid": len(valid), "malformed": len(bad), "wall_s": wall,
        "requests_per_s": len(records) / wall if wall else None, "ok_per_s": len(ok) / wall if wall else None,
        "latency_p50_s": _q(lats, 0.5), "latency_p95_s": _q(lats, 0.95),
        "outcomes": dict(counts),
        "cancellations": {m: {"tried": sum(r["cancel"] == m for r in cancels),
                              "cancelled": sum(r["cancel"] == m and r["outcome"] == "cancelled" for r in cancels)}
                          for m in ("early", "late", "at_sar")},
        # at_sar streams answered before the client closed: how long after the last-but-one token
        "at_sar_answered_after_s": sorted(r["answered_after_s"] for r in cancels if "answered_after_s" in r),
        "malformed_cases": {c: collections.Counter(r.get("status") for r in bad if r["case"] == c)
                            for c in sorted({r["case"] for r in bad})},
        "sar_null": sum(r.get("sar_null", 0) for r in valid),
        "pruned_choices": sum(r.get("pruned", 0) for r in valid),
        "errors": len(errors),
        "error_examples": [{k: r.get(k) for k in ("i", "kind", "case", "cancel", "outcome", "status", "error",
                                                   "problems", "sent_after_s", "latency", "new_connection")}
                           for r in errors[:20]],
        "per_kind": per_kind,
    }


def _q(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _post_json(url: str, timeout: float) -> tuple[int, str]:
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return -1, repr(e)


async def _pause_and_resume(base_url: str, cfg: LoadConfig, out: dict) -> None:
    """A wait-mode pause in the middle of the load (what an RL weight sync does), then a resume.
    The server needs ``VLLM_SERVER_DEV_MODE=1`` for these routes."""
    await asyncio.sleep(cfg.pause_at)
    t0 = time.perf_counter()
    out["pause"] = await asyncio.to_thread(_post_json, f"{base_url}/pause?mode=wait&clear_cache=false",
                                           cfg.request_timeout)
    out["paused_after_s"] = round(time.perf_counter() - t0, 2)
    await asyncio.sleep(cfg.pause_for)
    out["resume"] = await asyncio.to_thread(_post_json, f"{base_url}/resume", cfg.request_timeout)


async def _kill_engine(pid: int, cfg: LoadConfig, out: dict) -> None:
    import signal

    await asyncio.sleep(cfg.kill_engine_at)
    cores = [p["pid"] for p in process_memory(pid) if p["role"] == "engine_core"]
    for core in cores:
        os.kill(core, signal.SIGKILL)
    out["killed"] = cores


async def _with_fault(load, fault) -> tuple:
    task = asyncio.create_task(fault) if fault is not None else None
    try:
        return await load
    finally:
        if task is not None:
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def bench(server: Server, cfg: LoadConfig, log=print) -> dict:
    """Warm up, read memory, run the load (memory sampled), settle, read memory again."""
    prompts = chat_prompt_ids(server.url, server.model)
    lat = _Latencies()
    warm_cfg = LoadConfig(**{**asdict(cfg), "cancel_fraction": 0.0, "malformed": 0, "seed": cfg.seed + 7})
    rng = random.Random(cfg.seed + 3)
    warm = [_valid(i, k, rng, server.model, prompts, cfg) for i, k in enumerate(MIX)]
    warm_recs, _ = await run_load(server.url, warm, LoadConfig(concurrency=1, request_timeout=cfg.request_timeout), lat)
    warm2 = plan(server.model, prompts, LoadConfig(**{**asdict(warm_cfg), "requests": cfg.concurrency}))
    warm_recs += (await run_load(server.url, warm2, warm_cfg, lat))[0]
    warm_errors = [r for r in warm_recs if r["outcome"] != "ok"]
    log(f"warm-up: {len(warm_recs)} requests, {len(warm_errors)} not ok")
    before = process_memory(server.pid)
    peak = {"rss_bytes": sum(p["rss_bytes"] for p in before)}

    async def sample():
        while True:
            await asyncio.sleep(0.5)
            peak["rss_bytes"] = max(peak["rss_bytes"], sum(p["rss_bytes"] for p in process_memory(server.pid)))

    records: list = []
    wall = 0.0
    rounds = []
    for k in range(cfg.rounds):
        specs = plan(server.model, prompts, LoadConfig(**{**asdict(cfg), "seed": cfg.seed + 1000 * k}))
        log(f"load round {k + 1}/{cfg.rounds}: {len(specs)} requests, {cfg.concurrency} concurrent")
        fault: dict = {}
        if cfg.kill_engine_at is not None:
            recs, w = await _with_fault(run_load(server.url, specs, cfg, lat), _kill_engine(server.pid, cfg, fault))
            outcomes = collections.Counter(r["outcome"] for r in recs)
            log(f"  engine core {fault.get('killed')} killed at {cfg.kill_engine_at} s: {dict(outcomes)}")
            result = summarize(recs, w)
            result.update(config=asdict(cfg), url=server.url, model=server.model, fault=fault, records=recs)
            # every request must end (an answer, an error, a closed connection) before its timeout
            result["passed"] = bool(fault.get("killed")) and outcomes["timeout"] == 0 and outcomes["ok"] < len(recs)
            return result
        pausing = _pause_and_resume(server.url, cfg, fault) if cfg.pause_at is not None else None
        recs, w = await _with_fault(run_load(server.url, specs, cfg, lat, on_tick=sample if server.pid else None),
                                    pausing)
        if pausing is not None:
            log(f"  paused at {cfg.pause_at} s: {fault.get('pause')} after {fault.get('paused_after_s')} s, "
                f"resumed: {fault.get('resume')}")
        after_load = held(server.url)
        h = await settle(server, cfg, prompts)
        after = process_memory(server.pid)
        errors = sum(r["outcome"] not in ("ok", "cancelled", "rejected_4xx") for r in recs)
        rounds.append({"wall_s": w, "requests_per_s": len(recs) / w, "errors": errors, "held": h, "fault": fault,
                       "total_rss_bytes": sum(p["rss_bytes"] for p in after), "memory": after})
        log(f"  {len(recs) / w:.1f} requests/s, {errors} errors, "
            f"total RSS {sum(p['rss_bytes'] for p in after) / 2**20:.0f} MiB")
        records += recs
        wall += w
    result = summarize(records, wall)
    result.update(
        config=asdict(cfg), url=server.url, model=server.model,
        warmup={"sent": len(warm_recs), "not_ok": [{k: r.get(k) for k in ("kind", "outcome", "status", "error")}
                                                   for r in warm_errors[:10]]},
        held_right_after_load=after_load, held=h, rounds=rounds,
        memory={"before": before, "after": after, "peak_total_rss_bytes": peak["rss_bytes"] if server.pid else None},
    )
    result["passed"] = passed(result)
    result["records"] = records
    return result


def passed(result: dict) -> bool:
    h = result["held"]
    rounds_idle = all(r["held"]["probe"] == "ok" and _idle(r["held"]) for r in result.get("rounds", []))
    paused = all(r["fault"].get("pause", (200,))[0] == 200 and r["fault"].get("resume", (200,))[0] == 200
                 for r in result.get("rounds", []))
    return (paused and result["errors"] == 0 and result["sar_null"] == 0 and h["probe"] == "ok" and _idle(h)
            and rounds_idle)


def _mib(b) -> str:
    return "-" if b is None else f"{b / 2**20:.0f}"


def format_report(r: dict) -> str:
    o = r["outcomes"]
    lines = [
        f"server {r['url']}  model {r['model']}",
        f"{r['sent']} requests ({r['valid']} valid, {r['malformed']} malformed), "
        f"{r['config']['concurrency']} concurrent, {r['wall_s']:.1f} s: {r['requests_per_s']:.2f} requests/s, "
        f"{r['ok_per_s']:.2f} ok/s",
        f"latency of ok requests: p50 {_s(r['latency_p50_s'])}  p95 {_s(r['latency_p95_s'])}",
        "",
        "| outcome | count |", "| --- | ---: |",
    ]
    for k in ("ok", "cancelled", "rejected_4xx", "http_4xx", "http_5xx", "stream_error", "connection_error",
              "timeout", "invalid", "malformed_accepted"):
        lines.append(f"| {k} | {o.get(k, 0)} |")
    lines += ["", "| kind | sent | ok | cancelled | p50 s | p95 s |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for k, v in r["per_kind"].items():
        lines.append(f"| {k} | {v['sent']} | {v['ok']} | {v['cancelled']} | {_s(v['p50_s'])} | {_s(v['p95_s'])} |")
    c = r["cancellations"]
    lines += ["", "cancellations (cancelled / tried; the rest were answered first): "
              + ", ".join(f"{m} {v['cancelled']}/{v['tried']}" for m, v in c.items())
              + (f" (at_sar answers that came first: median {_s(_q(r['at_sar_answered_after_s'], 0.5))} s after the"
                 " last-but-one token)" if r["at_sar_answered_after_s"] else ""),
              "malformed: " + ", ".join(f"{k} {dict(v)}" for k, v in r["malformed_cases"].items()),
              f"choices with a null sar: {r['sar_null']}, pruned choices: {r['pruned_choices']}"]
    mem = r["memory"]
    if mem["before"]:
        rounds = r.get("rounds") or [{"memory": mem["after"]}]
        after = [{p["pid"]: p["rss_bytes"] for p in rd["memory"]} for rd in rounds]
        cols = ["after"] if len(rounds) == 1 else [f"after round {k + 1}" for k in range(len(rounds))]
        lines += ["", "| process | pid | RSS MiB before | " + " | ".join(f"{c}" for c in cols) + " | delta |",
                  "| --- | ---: | ---: | " + " | ".join("---:" for _ in cols) + " | ---: |"]
        for p in mem["before"]:
            a = [rd.get(p["pid"]) for rd in after]
            d = None if a[-1] is None else a[-1] - p["rss_bytes"]
            lines.append(f"| {p['role']} | {p['pid']} | {_mib(p['rss_bytes'])} | "
                         + " | ".join(_mib(x) for x in a) + f" | {_mib(d)} |")
        tb = sum(p["rss_bytes"] for p in mem["before"])
        ta = [sum(rd.values()) for rd in after]
        lines.append(f"| total | | {_mib(tb)} | " + " | ".join(_mib(x) for x in ta) + f" | {_mib(ta[-1] - tb)} |")
        lines.append(f"peak total RSS during the load: {_mib(mem['peak_total_rss_bytes'])} MiB")
    h, h0 = r["held"], r["held_right_after_load"]
    lines += ["", f"held right after the load: running {h0['running']:.0f}, waiting {h0['waiting']:.0f}, "
              f"KV cache {h0['kv_cache_usage']:.3f}",
              f"held after the probe ({h['probe']}) and {h['settled_after_s']} s: running {h['running']:.0f}, "
              f"waiting {h['waiting']:.0f}, KV cache {h['kv_cache_usage']:.3f}",
              f"errors: {r['errors']}  ->  {'PASS' if r['passed'] else 'FAIL'}"]
    for e in r["error_examples"][:5]:
        lines.append(f"  {e}")
    return "\n".join(lines)


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    d = LoadConfig()
    ap.add_argument("--requests", type=int, default=d.requests, help="valid requests (default %(default)s)")
    ap.add_argument("--concurrency", type=int, default=d.concurrency, help="concurrent clients (default %(default)s)")
    ap.add_argument("--cancel-fraction", type=float, default=d.cancel_fraction,
                    help="share of the valid requests the client cancels (default %(default)s)")
    ap.add_argument("--malformed", type=int, default=d.malformed, help="malformed requests (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=d.rounds,
                    help="repeat the load this many times, reading memory after each (default %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=d.max_tokens, help="max_tokens per request (default %(default)s)")
    ap.add_argument("--timeout", type=float, default=d.request_timeout,
                    help="seconds per request (default %(default)s)")
    ap.add_argument("--keepalive-expiry", type=float, default=d.keepalive_expiry,
                    help="seconds the client keeps an idle connection (default %(default)s)")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--url", help="use a running server instead of starting one (its --model must be given)")
    ap.add_argument("--model", help="with --url: the served model name")
    ap.add_argument("--pid", type=int, help="with --url: the server's process id, for its memory")
    ap.add_argument("--compile", action="store_true", help="start the server with torch.compile (default: eager)")
    ap.add_argument("--prune", action="store_true",
                    help='every request with several candidates (n > 1, best_of_n) asks "prune": true (the '
                         "engine's default policy); a pruned choice carries its partial score and no sar")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="extra `vllm serve` argument for the started server (repeatable), e.g. "
                         "--server-arg=--enable-log-requests")
    ap.add_argument("--pause-at", type=float, default=None, metavar="S",
                    help="S seconds into each round, pause the engine (POST /pause?mode=wait, as an RL weight sync "
                         "does), wait --pause-for seconds, resume; the started server gets VLLM_SERVER_DEV_MODE=1")
    ap.add_argument("--pause-for", type=float, default=d.pause_for, help="seconds paused (default %(default)s)")
    ap.add_argument("--kill-engine-at", type=float, default=None, metavar="S",
                    help="S seconds into the round, kill the engine core (SIGKILL): every request must still end, "
                         "with an answer or an error, before its timeout (one round; nothing is settled after)")
    ap.add_argument("--log", default=None, help="server log file (default: a temporary file)")
    ap.add_argument("--json", help="write the full result here")
    args = ap.parse_args(argv)
    cfg = LoadConfig(requests=args.requests, concurrency=args.concurrency, cancel_fraction=args.cancel_fraction,
                     malformed=args.malformed, max_tokens=args.max_tokens, rounds=args.rounds,
                     request_timeout=args.timeout,
                     keepalive_expiry=args.keepalive_expiry, seed=args.seed, prune=args.prune,
                     pause_at=args.pause_at, pause_for=args.pause_for, kill_engine_at=args.kill_engine_at)
    if args.pause_at is not None:
        os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # vLLM serves /pause and /resume only then

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    if args.url:
        if not args.model:
            ap.error("--url needs --model")
        result = asyncio.run(bench(Server(args.url.rstrip("/"), args.model, args.pid), cfg, log))
    else:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            log_path = args.log or os.path.join(tmp, "server.log")
            t0 = time.perf_counter()
            with serve(log_path, eager=not args.compile, extra=tuple(args.server_arg)) as server:
                log(f"server up in {time.perf_counter() - t0:.0f} s (log: {log_path})")
                result = asyncio.run(bench(server, cfg, log))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    if "fault" in result:  # the engine was killed: what each request got, nothing settled after
        o = result["outcomes"]
        print(f"engine core {result['fault'].get('killed')} killed {args.kill_engine_at} s into the load; "
              f"{result['sent']} requests in {result['wall_s']:.1f} s: "
              + ", ".join(f"{k} {v}" for k, v in o.items() if v)
              + f"  ->  {'PASS' if result['passed'] else 'FAIL'} (every request ended before its timeout)")
    else:
        print(format_report(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
