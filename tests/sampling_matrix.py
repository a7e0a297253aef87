"""The sampling settings Best-of-N users set, in one batch, checked on either model runner.

Every request of the batch changes how vLLM samples -- top-p, top-k, min-p, the three
penalties, a logit bias, bad words, allowed tokens, min_tokens, a seed, a lower temperature, a
structured-output (regex) grammar -- beside a plain request. The plugin's values are of the
model's unprocessed distribution (``docs/definitions.md``): SWIFT reads hidden states, which no
sampling setting changes, and SAR's log-probs and DeepConf's confidence are taken from the
logits before the sampler and the grammar mask touch them. So each candidate's SWIFT, SAR and
traced confidence must equal the Hugging Face reference computed from the raw model, whatever
its request's settings. A logit bias of +100 makes that choice visible: every sampled token is
the biased one, whose processed log-prob is 0 and whose raw one is far from it.

Each setting is also checked to have acted (else the batch would prove nothing about it): the
biased token everywhere, no bad word, only allowed tokens, top-k 1 equal to greedy, two requests
with the same seed equal, the grammar's text matching its regex, min_tokens reached.
"""

from __future__ import annotations

import re

import torch
from test_vllm_plugin import assert_scores, sp, tokens
from test_vllm_pruning import token_confidences

GRAMMAR = "[a-z ]{4,24}"
MAX_TOKENS = 10


def _single_token(tok, text: str) -> int:
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == 1, f"{text!r} must be one token of this tokenizer"
    return ids[0]


def settings(tok) -> dict[str, dict]:
    """``SamplingParams`` keyword arguments of each request, by name."""
    from vllm.sampling_params import StructuredOutputsParams

    trace = {"swift_fast": {"trace": True}}
    return {
        "plain": {},
        "greedy": dict(temperature=0.0),
        "top_k_1": dict(top_k=1),
        "top_p": dict(top_p=0.8, extra_args=trace),
        "top_k": dict(top_k=5),
        "min_p": dict(min_p=0.2),
        "temperature": dict(temperature=0.5),
        "repetition": dict(repetition_penalty=1.5),
        "presence": dict(presence_penalty=1.5),
        "frequency": dict(frequency_penalty=1.5),
        "logit_bias": dict(logit_bias={_single_token(tok, " the"): 100.0}, extra_args=trace),
        "bad_words": dict(bad_words=[" the", " a"]),
        "allowed": dict(allowed_token_ids=list(range(100, 300))),
        "min_tokens": dict(min_tokens=MAX_TOKENS, max_tokens=MAX_TOKENS),
        "seed_a": dict(seed=1234),
        "seed_b": dict(seed=1234),
        "grammar": dict(structured_outputs=StructuredOutputsParams(regex=GRAMMAR), extra_args=trace),
    }


def check(llm, head, ref, prompt_text: str) -> None:
    """One ``generate`` with every setting; the scores exact against the raw model, each setting seen acting."""
    tok = ref.tok
    cases = settings(tok)
    p = ref.prompt(prompt_text)
    params = [sp(**{"max_tokens": MAX_TOKENS, **kw}) for kw in cases.values()]
    res = llm.generate(tokens([p] * len(cases)), params, use_tqdm=False)
    outs = assert_scores(ref, head, res, [p] * len(cases), sar=True)
    got = {name: c for name, c in zip(cases, outs)}
    ids = {name: list(c.token_ids) for name, c in got.items()}

    the = _single_token(tok, " the")
    assert ids["logit_bias"] == [the] * MAX_TOKENS, "the +100 bias samples its token every time"
    banned = {_single_token(tok, w) for w in (" the", " a")}
    assert not banned & set(ids["bad_words"])
    assert all(100 <= t < 300 for t in ids["allowed"])
    assert ids["top_k_1"] == ids["greedy"], "top-k 1 is greedy"
    assert ids["seed_a"] == ids["seed_b"], "the same seed samples the same tokens"
    assert re.fullmatch(GRAMMAR, got["grammar"].text), got["grammar"].text
    assert len(ids["min_tokens"]) == MAX_TOKENS

    for name in ("top_p", "logit_bias", "grammar"):
        c = got[name]
        want = torch.tensor(token_confidences(ref, p, ids[name]), dtype=torch.float64)
        torch.testing.assert_close(torch.tensor(c.swift_trace["confidence"], dtype=torch.float64), want,
                                   rtol=1e-4, atol=1e-4, msg=f"{name}: confidence of the raw model")
    # the biased token's raw log-prob is nowhere near the processed distribution's 0
    assert got["logit_bias"].sar is not None
    with torch.no_grad():
        lp = torch.log_softmax(ref.model(torch.tensor([p + ids["logit_bias"]])).logits[0].double(), -1)
    raw = [float(lp[len(p) - 1 + j, t]) for j, t in enumerate(ids["logit_bias"])]
    assert sum(raw) / len(raw) < -1.0
