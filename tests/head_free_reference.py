"""The head-free values of a candidate computed by hand, in float64, from a Hugging Face forward:
the oracle the plugin's outputs, `bon`'s rollouts and `score` without a head are held to.

Definitions (DeepConf; ``swift_fast.rewards.confidence``'s module docstring): token ``j``'s
distribution is the one its token was sampled from (the logits at the position before it); its
confidence is ``-mean(top-20 log-probs)``; a candidate's lowest group confidence is the minimum of
the means of every window of ``window`` consecutive tokens (one window of all when there are at
most ``window``), its tail confidence the mean over its last ``window`` tokens, its bottom-10%
confidence the mean of the lowest 10% of the window means (at least one). ``mean_logprob`` is the
mean log-prob of its tokens. Written from those words, not from the library's code.
"""

from __future__ import annotations

import torch

TOP_K = 20


def head_free(model, prompt: list[int], response: list[int], window: int) -> dict[str, float]:
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)]
    lse = torch.logsumexp(rows, dim=-1)
    logprob = rows.gather(1, torch.tensor(response).view(-1, 1)).squeeze(1) - lse
    top = torch.topk(rows, min(TOP_K, rows.shape[1]), dim=-1).values
    conf = [float(x) for x in (lse - top.mean(dim=-1))]  # -mean(top-k log-probs)
    m = len(conf)
    if m <= window:
        means = [sum(conf) / m]
    else:
        means = [sum(conf[i : i + window]) / window for i in range(m - window + 1)]
    tail = conf[-window:]
    low = sorted(means)[: max(1, int(len(means) * 0.1))]
    return {"mean_logprob": float(logprob.mean()), "confidence_lowest_group": min(means),
            "confidence_tail": sum(tail) / len(tail), "confidence_bottom10": sum(low) / len(low)}


FIELDS = ("mean_logprob", "confidence_lowest_group", "confidence_tail", "confidence_bottom10")


def assert_head_free(got: list[dict], model, prompts, responses, window: int, rtol=1e-4, atol=1e-4) -> None:
    """Each of ``got`` (a mapping with the four values) equals the reference of its candidate."""
    want = [head_free(model, p, r, window) for p, r in zip(prompts, responses)]
    g = torch.tensor([[float(x[f]) for f in FIELDS] for x in got], dtype=torch.float64)
    w = torch.tensor([[x[f] for f in FIELDS] for x in want], dtype=torch.float64)
    torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
