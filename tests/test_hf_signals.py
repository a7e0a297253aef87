"""Per-candidate trivial signals (length, mean token log-prob, DeepConf confidence) from a Hugging
Face model, against a direct float64 computation from the model's full logits written here."""

import math

import pytest
import torch
from hf_fixtures import tiny_model_dir

from swift_fast.data.rollouts import Problem
from swift_fast.hf import candidate_signals, record_signals

transformers = pytest.importorskip("transformers")


def _load(path, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def _direct(model64, prompt, response, window, k=20):
    """(num_tokens, mean log-prob, lowest group, tail, token confidences) from one unpadded float64
    forward: log_softmax of the logits at the positions predicting each response token, the top-k
    mean of it, and the windows by explicit loops."""
    m = len(response)
    if m == 0:
        return 0, math.nan, math.nan, math.nan, []
    with torch.no_grad():
        logits = model64(torch.tensor([prompt + response])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    n = len(prompt)
    lps = [float(logp[n - 1 + j, t]) for j, t in enumerate(response)]
    conf = [-float(torch.topk(logp[n - 1 + j], k).values.mean()) for j in range(m)]
    if m <= window:
        lowest = sum(conf) / m
    else:
        lowest = min(sum(conf[i : i + window]) / window for i in range(m - window + 1))
    last = conf[-window:]
    return m, sum(lps) / m, lowest, sum(last) / len(last), conf


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = tiny_model_dir(tmp_path_factory, "llama", num_layers=2)
    return _load(path, torch.float32), _load(path, torch.float64)


def _cases():
    g = torch.Generator().manual_seed(3)

    def ids(n):
        return torch.randint(5, 500, (n,), generator=g).tolist()

    # (prompt, response): different prompt lengths, an empty response, responses shorter than,
    # equal to and longer than the window, one prompt of a single token
    return [(ids(7), ids(12)), (ids(3), ids(1)), (ids(9), []), (ids(1), ids(5)), (ids(5), ids(4)), (ids(11), ids(9))]


@pytest.mark.parametrize("window", [4, 16])
def test_signals_match_a_direct_float64_computation(llama, monkeypatch, window):
    model, model64 = llama
    # small row chunks, so the logits go through lm_head several blocks at a time
    monkeypatch.setattr("swift_fast.hf.features._CHUNK_ELEMENTS", 512 * 5)
    cases = _cases()
    s = candidate_signals(model, [p + r for p, r in cases], [len(p) for p, _ in cases], window=window, batch_size=4)
    assert s.num_tokens.dtype == torch.long and s.mean_logprob.dtype == torch.float64
    assert s.token_confidence.dtype == torch.float32 and s.cu_seqlens.tolist()[-1] == sum(len(r) for _, r in cases)
    assert (s.window, s.top_k) == (window, 20)
    for b, (p, r) in enumerate(cases):
        m, mean, lowest, tail, conf = _direct(model64, p, r, window)
        assert int(s.num_tokens[b]) == m
        got = [float(s.mean_logprob[b]), float(s.conf_lowest[b]), float(s.conf_tail[b])]
        if m == 0:
            assert all(math.isnan(x) for x in got)
            continue
        assert got == pytest.approx([mean, lowest, tail], abs=1e-4)
        a, e = int(s.cu_seqlens[b]), int(s.cu_seqlens[b + 1])
        assert s.token_confidence[a:e].tolist() == pytest.approx(conf, abs=1e-4)
    # a window larger than every response: lowest group and tail are both the mean confidence
    if window == 16:
        assert s.conf_lowest[0] == pytest.approx(float(s.conf_tail[0]), abs=1e-6)


def test_record_signals_writes_fields_and_null_for_an_empty_response(llama):
    model, model64 = llama
    cases = _cases()
    problems = [
        Problem(id="a", candidates=[{"token_ids": r} for _, r in cases[:3]], prompt_token_ids=cases[0][0]),
        Problem(id="b", candidates=[{"token_ids": r} for _, r in cases[3:]], prompt_token_ids=cases[3][0]),
    ]
    s = record_signals(model, problems, window=4, top_k=7)
    assert s.num_tokens.tolist() == [len(r) for _, r in cases]
    for p in problems:
        for c in p.candidates:
            m, mean, lowest, tail, _ = _direct(model64, p.prompt_token_ids, c["token_ids"], 4, k=7)
            assert c["num_tokens"] == m
            if m == 0:
                assert c["mean_logprob"] is None and c["conf_lowest"] is None and c["conf_tail"] is None
            else:
                assert [c["mean_logprob"], c["conf_lowest"], c["conf_tail"]] == pytest.approx(
                    [mean, lowest, tail], abs=1e-4)


def test_signals_refuse_text_and_bad_windows(llama):
    model, _ = llama
    with pytest.raises(TypeError, match="token ids"):
        candidate_signals(model, ["some text"], [1], window=4)
    with pytest.raises(ValueError, match="window"):
        candidate_signals(model, [[5, 6, 7]], [1], window=0)
    with pytest.raises(ValueError, match="prompt"):
        candidate_signals(model, [[5, 6, 7]], [0], window=4)
