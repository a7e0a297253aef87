"""Self-aligned reward (SAR paper, arXiv 2509.05489, Eq. 8-9; DESIGN 2).

``ppl(a|q) = exp(-mean_j log P(a_j | q, a_<j))`` and ``ppl(a) = exp(-mean_j log P(a_j | q0, a_<j))``
with ``q0`` the generation's own prompt with only the user's question removed
(:mod:`swift_fast.rewards.sar_context`).
``R_SA = clip((ppl(a) - ppl(a|q)) / ppl(a), -1, 1)``.

Empty answer: the mean over no tokens is taken as 0, so its perplexity is 1 under both
contexts and ``R_SA = 0`` (no evidence either way). NaN log-probs propagate to NaN rewards.
"""

from __future__ import annotations

import torch

from ..definitions import DEFAULT_SYSTEM_PROMPT

# The fused entry points are the kernels' own functions, public here beside the reference math.
from ..kernels.sar_from_logits import mean_logprob, sar_from_logits, sar_from_means, sar_reference
from ..kernels.token_logprobs import token_logprobs
from ..kernels.token_logprobs_from_hidden import token_logprobs_from_hidden

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_SYSTEM_PROMPT",
    "mean_logprob",
    "perplexity",
    "rl_reward",
    "sar_from_hidden",
    "sar_from_logits",
    "sar_from_means",
    "sar_reference",
    "sar_reward",
    "token_logprobs",
]

DEFAULT_ALPHA = 0.2


def perplexity(token_logprobs: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``exp(-mean log p)`` per segment: ``[B]`` float32 (1 for an empty segment)."""
    return torch.exp(-mean_logprob(token_logprobs, cu_seqlens))


def sar_reward(
    logp_with_question: torch.Tensor,
    logp_without_question: torch.Tensor,
    cu_seqlens: torch.Tensor,
) -> torch.Tensor:
    """Self-aligned reward per answer.

    Args:
        logp_with_question: ``[T]`` log P(a_j | q, a_<j) of every answer token, answers packed.
        logp_without_question: ``[T]`` log P(a_j | q0, a_<j), same packing.
        cu_seqlens: int ``[B+1]`` answer boundaries.
    Returns:
        ``[B]`` float32 in ``[-1, 1]``.
    """
    if logp_with_question.shape != logp_without_question.shape:
        raise ValueError(
            f"both passes must score the same answer tokens: {tuple(logp_with_question.shape)} vs "
            f"{tuple(logp_without_question.shape)}"
        )
    return sar_reference(logp_with_question, logp_without_question, cu_seqlens)


def sar_from_hidden(
    hidden_with_question: torch.Tensor,
    hidden_without_question: torch.Tensor,
    lm_head: torch.Tensor,
    targets: torch.Tensor,
    cu_seqlens: torch.Tensor,
    temperature: float = 1.0,
    backend: str = "auto",
) -> torch.Tensor:
    """Self-aligned reward per answer from both passes' final hidden states ``[T, d]`` and the LM
    head ``[V, d]``, never holding either pass's ``[T, V]`` logits (chunked log-probs)."""
    lq = token_logprobs_from_hidden(hidden_with_question, lm_head, targets, temperature, backend=backend)
    l0 = token_logprobs_from_hidden(hidden_without_question, lm_head, targets, temperature, backend=backend)
    return sar_reward(lq, l0, cu_seqlens)


def rl_reward(verifiable: torch.Tensor, sar: torch.Tensor, alpha: float = DEFAULT_ALPHA) -> torch.Tensor:
    """``R_VR + alpha * R_SA`` (SAR paper; alpha 0.2 by default)."""
    return verifiable.float() + alpha * sar.float()
