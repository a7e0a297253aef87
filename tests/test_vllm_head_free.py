"""The plugin without a SWIFT head, on both model runners: every scored candidate's head-free values.

One engine per runner, ``additional_config={"swift_fast": {"sar": True, "confidence_window": 4}}``
and no head: the V1 runner (in-process engine core) and Model Runner V2 (through the harness in
``tests/mrv2_shim``). Each runs one ``generate`` of candidates of several lengths (shorter than,
equal to and longer than the window; one long enough for the bottom 10% to average two windows)
at temperature 1 with ``logprobs=20``, and one request opted out of scoring. The engine is shut
down as soon as its outputs are in; the tests read those outputs.

Checked against two independent sources:

* a float64 reference written here: the Hugging Face model (float32 weights) on the prompt and
  response ids, a float64 ``log_softmax`` of the logits that predict each response token, the top
  20 picked by sorting, and the windows, lowest group, tail and bottom 10% by plain loops; SAR
  straight from its equation (DESIGN.md 2) with ``q0`` the BOS token alone (a raw token prompt);
* the ``deepconf`` package's own functions on vLLM's ``logprobs=20`` of the same candidates.

A third, smaller engine starts with ``{"swift_fast": {}}`` (every default) on the V1 runner.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("vllm")

from test_confidence_peer import deepconf_utils
from test_vllm_plugin import KV_BYTES_PER_TOKEN, env, shutdown, sp

from swift_fast.testing import build_tiny_model

pytestmark = pytest.mark.slow

WINDOW = 4
K = 20  # DeepConf's top-k, and vLLM's logprobs=20
#: plugin (float32 logits in vLLM) against the float64 reference on the HF model's float32 logits
RTOL, ATOL = 2e-5, 1e-5
#: one rounding of the peer's to 3 decimals, plus float32 slack
PEER_ROUNDING, PEER_SLACK = 5e-4, 2e-5
V2_RUNNER = "vllm.v1.worker.cpu.model_runner"
HEAD_FREE = ("mean_logprob", "confidence_lowest_group", "confidence_tail", "confidence_bottom10")

TEXTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.",
    "Let x be a real number such that 3x + 5 = 20. What is x?",
    "A coin is heads up. Ka flips the coin. Is the coin still heads up?",
]
#: (prompt, n, max_tokens, trace, other sampling settings); lengths 3 < W, 4 = W, 6, 9 and 26 > W
#: (26 tokens: 23 windows, the bottom 10% averages the lowest 2). The last one samples from an
#: edited distribution; its values are still those of the raw one.
REQUESTS = [
    (0, 3, 26, True, {}),
    (1, 2, 4, False, {}),
    (2, 2, 3, True, {}),
    (1, 2, 9, False, {}),
    (0, 1, 6, True, {"temperature": 0.6, "top_k": 50, "repetition_penalty": 1.3}),
]
OPTED_OUT = (2, 1, 5)


# -- the float64 reference ------------------------------------------------------------------------
class Reference:
    """The tiny model in Hugging Face transformers (float32 weights), read in float64."""

    def __init__(self, path: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.tok = AutoTokenizer.from_pretrained(path)
        self.bos = int(self.tok.bos_token_id)

    def prompt(self, text: str) -> list[int]:
        return [self.bos] + [int(t) for t in self.tok.encode(text, add_special_tokens=False)]

    def rows(self, context: list[int], response: list[int]) -> torch.Tensor:
        """float64 log-probs ``[len(response), V]`` of the distributions that predict each response token."""
        ids = torch.tensor([list(context) + list(response)])
        with torch.no_grad():
            logits = self.model(ids).logits[0].double()
        a = len(context) - 1
        return torch.log_softmax(logits[a : a + len(response)], dim=-1)

    def tokens(self, prompt, response) -> tuple[list[float], list[float]]:
        """Each response token's log-prob and DeepConf confidence ``-(mean of the top 20 log-probs)``."""
        lp, conf = [], []
        for row, t in zip(self.rows(prompt, response), response):
            values = row.tolist()
            top = sorted(values, reverse=True)[:K]
            conf.append(-sum(top) / len(top))
            lp.append(values[t])
        return lp, conf

    def sar(self, prompt, response) -> float:
        """``clip((ppl(a) - ppl(a|q)) / ppl(a), -1, 1)``, ``ppl(a)`` conditioned on the BOS token alone."""
        with_q = [row[t].item() for row, t in zip(self.rows(prompt, response), response)]
        without_q = [row[t].item() for row, t in zip(self.rows([self.bos], response), response)]
        ppl_aq = math.exp(-sum(with_q) / len(with_q))
        ppl_a = math.exp(-sum(without_q) / len(without_q))
        return max(-1.0, min(1.0, (ppl_a - ppl_aq) / ppl_a))


def windows(conf: list[float], w: int) -> list[float]:
    if len(conf) <= w:
        return [sum(conf) / len(conf)]
    out = []
    for i in range(len(conf) - w + 1):
        s = 0.0
        for x in conf[i : i + w]:
            s += x
        out.append(s / w)
    return out


def expected(lp: list[float], conf: list[float], w: int) -> dict[str, float]:
    means = windows(conf, w)
    last = conf[-w:]
    k = max(1, len(means) // 10)
    return {
        "mean_logprob": sum(lp) / len(lp),
        "confidence_lowest_group": min(means),
        "confidence_tail": sum(last) / len(last),
        "confidence_bottom10": sum(sorted(means)[:k]) / k,
    }


# -- engines --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(tmp_path_factory):
    # initializer_range 0.2: peaked enough that token confidences differ by tenths (the default
    # tiny model's are all near log V), flat enough that some sampled tokens fall outside the top 20
    return build_tiny_model("llama", tmp_path_factory.mktemp("head_free") / "llama", initializer_range=0.2)


@pytest.fixture(scope="module")
def ref(model):
    return Reference(model)


def _runner(worker):
    from swift_fast.vllm_plugin.diagnostics import plugin_state

    return type(worker.model_runner).__module__, plugin_state(worker)["runner"]


def _engine(model, section, **kw):
    from vllm import LLM

    return LLM(model=model, dtype="float32", enforce_eager=True, seed=0, max_model_len=256,
               kv_cache_memory_bytes=1024 * KV_BYTES_PER_TOKEN, additional_config={"swift_fast": section}, **kw)


def _generate(llm, ref):
    prompts = [ref.prompt(t) for t in TEXTS]
    inputs, params, meta = [], [], []
    for i, n, m, trace, kw in REQUESTS:
        inputs.append({"prompt_token_ids": prompts[i]})
        extra = {"swift_fast": {"trace": True}} if trace else None
        params.append(sp(n=n, max_tokens=m, logprobs=K, extra_args=extra, **kw))
        meta.append((prompts[i], trace))
    i, n, m = OPTED_OUT
    inputs.append({"prompt_token_ids": prompts[i]})
    params.append(sp(n=n, max_tokens=m, logprobs=K, extra_args={"swift_fast": {"score": False}}))
    res = llm.generate(inputs, params, use_tqdm=False)
    scored = [(p, trace, c) for r, (p, trace) in zip(res[:-1], meta) for c in r.outputs]
    return scored, list(res[-1].outputs)


def _collect(llm, ref):
    try:
        return llm.llm_engine.vllm_config.use_v2_model_runner, llm.collective_rpc(_runner), _generate(llm, ref)
    finally:
        shutdown(llm)


@pytest.fixture(scope="module", params=["V1", "V2"])
def run(request, model, ref):
    """``(runner, scored candidates as (prompt, traced, output), opted-out outputs)`` of one engine."""
    section = {"sar": True, "confidence_window": WINDOW}
    with env(VLLM_ALLOW_INSECURE_SERIALIZATION=1):
        if request.param == "V1":
            with env(VLLM_ENABLE_V1_MULTIPROCESSING=0):
                llm = _engine(model, section)
            v2, runner, out = _collect(llm, ref)
        else:
            from mrv2_shim.mrv2 import model_runner_v2

            with model_runner_v2():
                v2, runner, out = _collect(_engine(model, section), ref)
    assert v2 == (request.param == "V2")
    return (request.param, runner) + out


# -- tests ----------------------------------------------------------------------------------------
def test_the_engine_runs_its_runner_with_the_plugin_and_no_head(run):
    kind, runner, scored, _ = run
    if kind == "V1":
        assert runner[0][1] == "V1Adapter" and runner[0][0] != V2_RUNNER
    else:
        assert runner == [(V2_RUNNER, "V2Adapter")]
    lengths = sorted({len(c.token_ids) for _, _, c in scored})
    assert lengths[0] < WINDOW and WINDOW in lengths and lengths[-1] >= 23 + WINDOW - 1, lengths


def test_no_head_means_no_swift_score(run):
    _, _, scored, _ = run
    for _, _, c in scored:
        assert c.swift_score is None and c.swift_tokens == 0
        assert c.swift_pruned is False


def test_head_free_values_equal_the_float64_reference(run, ref):
    _, _, scored, _ = run
    worst = dict.fromkeys(HEAD_FREE + ("token_confidence", "token_logprob"), 0.0)
    for prompt, traced, c in scored:
        r = list(c.token_ids)
        lp, conf = ref.tokens(prompt, r)
        want = expected(lp, conf, WINDOW)
        for name in HEAD_FREE:
            got = getattr(c, name)
            assert isinstance(got, float), (name, got)
            assert got == pytest.approx(want[name], rel=RTOL, abs=ATOL), (name, len(r))
            worst[name] = max(worst[name], abs(got - want[name]) / abs(want[name]))
        if traced:  # the per-token values behind them
            t = c.swift_trace
            assert len(t["confidence"]) == len(t["logprob"]) == len(r)
            assert t["confidence"] == pytest.approx(conf, rel=RTOL, abs=ATOL)
            assert t["logprob"] == pytest.approx(lp, rel=RTOL, abs=ATOL)
            worst["token_confidence"] = max([worst["token_confidence"]]
                                            + [abs(a - b) / abs(b) for a, b in zip(t["confidence"], conf)])
            worst["token_logprob"] = max([worst["token_logprob"]]
                                         + [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(t["logprob"], lp)])
    # the three confidences tell windows apart here: a lowest window below the tail, and a bottom
    # 10% of two windows above the lowest
    assert any(c.confidence_lowest_group < c.confidence_tail - 1e-3 for _, _, c in scored)
    assert any(c.confidence_lowest_group < c.confidence_bottom10 - 1e-4 for _, _, c in scored)
    print("max relative difference to the float64 reference:", worst)


def test_mean_logprob_is_that_of_vllms_own_sampled_logprobs(run):
    _, _, scored, _ = run
    for _, _, c in scored:
        mine = [d[t].logprob for d, t in zip(c.logprobs, c.token_ids)]
        assert c.mean_logprob == pytest.approx(sum(mine) / len(mine), rel=RTOL, abs=ATOL)


def _top20(step: dict, sampled: int) -> tuple[dict, bool]:
    """vLLM's ``logprobs=20`` entries of one token: the top 20, plus the sampled token (rank > 20)
    when it is not among them. Returns the top 20 alone and whether the sampled token is in them."""
    in_top = step[sampled].rank <= K
    assert len(step) == (K if in_top else K + 1)
    top = {t: v for t, v in step.items() if v.rank <= K}
    assert len(top) == K and sorted(v.rank for v in top.values()) == list(range(1, K + 1))
    return top, in_top


def test_confidences_equal_the_deepconf_packages_on_vllms_logprobs(run):
    """The peer's ``compute_confidence`` averages every entry vLLM returns for a token: 21 when the
    sampled token is outside the top 20, where the plugin (and DeepConf's definition) averages the
    top 20. Token by token, only the tokens inside the top 20 are compared. For the group values, a
    candidate whose every token is inside goes to the peer exactly as vLLM returned it; one with a
    token outside goes with the 21st entry (that sampled token) dropped from those tokens, so the
    peer averages the same top 20 as the plugin. Both kinds occur here (asserted).

    The peer rounds every token confidence to 3 decimals (so its means of them are within 5e-4)
    and ``compute_least_grouped`` rounds each window mean again when there is a full window: 1e-3."""
    du = deepconf_utils()
    _, _, scored, _ = run
    kinds = set()
    worst = {"token": 0.0, "confidence_lowest_group": 0.0, "confidence_tail": 0.0, "confidence_bottom10": 0.0}
    for _, traced, c in scored:
        steps = [_top20(d, t) for d, t in zip(c.logprobs, c.token_ids)]
        inside = [in_top for _, in_top in steps]
        kinds.add(all(inside))
        raw = du.compute_confidence(c.logprobs)
        assert len(raw) == len(c.token_ids)
        if traced:
            for j, ok in enumerate(inside):
                if ok:
                    d = abs(raw[j] - c.swift_trace["confidence"][j])
                    assert d <= PEER_ROUNDING + PEER_SLACK, (j, raw[j], c.swift_trace["confidence"][j])
                    worst["token"] = max(worst["token"], d)
        confs = raw if all(inside) else du.compute_confidence([top for top, _ in steps])
        trace = {"confs": confs}
        peer = {
            "confidence_lowest_group": min(du.compute_least_grouped(confs, WINDOW)),
            "confidence_tail": float(du.calculate_tail_confidence(trace, WINDOW)),
            "confidence_bottom10": float(du.calculate_bottom_window_confidence(trace, WINDOW, 0.1)),
        }
        for name, want in peer.items():
            assert want > 0.0  # the peer answers 0.0 on any error it swallows
            twice = name == "confidence_lowest_group" and len(confs) >= WINDOW  # tokens, then windows
            rounding = 2 * PEER_ROUNDING if twice else PEER_ROUNDING
            d = abs(getattr(c, name) - want)
            assert d <= rounding + PEER_SLACK, (name, len(confs), getattr(c, name), want)
            worst[name] = max(worst[name], d)
    assert kinds == {True, False}, "candidates both with and without a sampled token outside the top 20"
    print("max absolute difference to deepconf:", worst)


def test_sar_equals_the_float64_reference_with_the_bos_context(run, ref):
    _, _, scored, _ = run
    worst = 0.0
    for prompt, _, c in scored:
        want = ref.sar(prompt, list(c.token_ids))
        assert c.sar_context == "default"
        assert c.sar == pytest.approx(want, rel=1e-4, abs=1e-5)
        assert -1.0 < want < 1.0  # not clipped: the comparison says something
        worst = max(worst, abs(c.sar - want))
    print("max absolute SAR difference to the float64 reference:", worst)


def test_a_request_opted_out_of_scoring_gets_no_values(run):
    _, _, _, opted_out = run
    assert opted_out and all(c.token_ids for c in opted_out)
    for c in opted_out:
        assert c.swift_score is None and c.swift_tokens == 0 and c.sar is None
        for name in HEAD_FREE:
            assert getattr(c, name) is None, name


def test_the_plugin_starts_with_an_empty_section(model, ref):
    """``{"swift_fast": {}}``: no head, no SAR, DeepConf's 2048-token window (here longer than every
    answer, so all three confidences are the mean token confidence). V1 runner only."""
    from swift_fast.rewards.confidence import DEFAULT_WINDOW

    assert DEFAULT_WINDOW == 2048
    with env(VLLM_ENABLE_V1_MULTIPROCESSING=0):
        llm = _engine(model, {})
    try:
        p = ref.prompt(TEXTS[1])
        (res,) = llm.generate([{"prompt_token_ids": p}], sp(n=2, max_tokens=6), use_tqdm=False)
    finally:
        shutdown(llm)
    for c in res.outputs:
        assert c.swift_score is None and c.swift_tokens == 0
        assert getattr(c, "sar", None) is None
        lp, conf = ref.tokens(p, list(c.token_ids))
        want = expected(lp, conf, DEFAULT_WINDOW)
        assert want["confidence_lowest_group"] == want["confidence_tail"] == want["confidence_bottom10"]
        for name in HEAD_FREE:
            assert getattr(c, name) == pytest.approx(want[name], rel=RTOL, abs=ATOL), name
