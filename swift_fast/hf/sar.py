"""Self-aligned reward (SAR) with a Hugging Face causal LM (DESIGN 2; SAR paper Eq. 8-9).

Two passes over each response ``a``: after its own prompt (question kept) and after ``q0``, the
same prompt with the question removed (:mod:`swift_fast.rewards.sar_context`: from the prompt's own chat
messages, from an explicit context, or the BOS default for a raw prompt). The response's
positions follow the prompt in each pass (contiguous from 0), as in the SAR reference. Both
passes go through :func:`response_logprobs` (no ``[T, V]`` logits) and combine in
:func:`swift_fast.rewards.sar.sar_reward`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..rewards.sar import sar_reward
from ..rewards.sar_context import (
    CHAT,
    DEFAULT,
    REQUEST,
    ContextError,
    chat_context_ids,
    chat_ids,
    default_context_ids,
    explicit_context_ids,
)
from .features import as_token_lists
from .logprobs import response_logprobs


def _is_messages(p) -> bool:
    return isinstance(p, (list, tuple)) and bool(p) and isinstance(p[0], dict)


def _encode_text(tokenizer):
    # prompt text is taken exactly as the model saw it: a rendered chat prompt already holds its special tokens
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_token_ids(tokenizer, prompts, chat_template_kwargs: dict | None = None) -> list[list[int]]:
    """Prompts as token ids.

    Each prompt may be token ids (used as they are), a list of chat messages (rendered with the
    chat template and the generation prompt), or a string: the prompt text exactly as the model
    saw it, tokenised once without adding special tokens (a rendered chat prompt already holds
    them).
    """
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            out.append([int(t) for t in _encode_text(tokenizer)(p)])
        elif _is_messages(p):
            out.append(chat_ids(tokenizer, p, **(chat_template_kwargs or {})))
        else:
            out.extend(as_token_lists([p], what=f"prompts[{i}]"))
        if not out[-1]:
            raise ValueError(f"prompt {i} is empty: SAR conditions the response on it")
    return out


def question_removed_contexts(
    tokenizer, prompts, contexts=None, chat_template_kwargs: dict | None = None
) -> tuple[list[list[int]], list[str]]:
    """``(q0 token ids, source)`` per prompt (sources: ``"chat"``, ``"request"``, ``"default"``).

    ``contexts[i]``, when given and not None, is prompt i's question-removed context (token ids,
    or text taken as the model saw it); otherwise a prompt given as chat messages gets the same
    messages with the last user message emptied, rendered with ``chat_template_kwargs``, and any
    other prompt the tokenizer's BOS alone (``[]`` without one: its SAR is then NaN).
    """
    if contexts is not None and len(contexts) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(contexts)} question-removed contexts")
    ids, sources = [], []
    for i, p in enumerate(prompts):
        c = None if contexts is None else contexts[i]
        try:
            if c is not None:
                ids.append(explicit_context_ids(c, _encode_text(tokenizer), what=f"contexts[{i}]"))
                sources.append(REQUEST)
            elif _is_messages(p):
                ids.append(chat_context_ids(tokenizer, p, **(chat_template_kwargs or {})))
                sources.append(CHAT)
            else:
                ids.append(default_context_ids(tokenizer))
                sources.append(DEFAULT)
        except ContextError as e:
            raise ValueError(f"prompt {i}: {e}") from e
    return ids, sources


def response_token_ids(tokenizer, responses) -> list[list[int]]:
    """Responses as token ids: ids are used as they are; a string is tokenised once, without
    special tokens (prefer the generated ids: re-tokenised text may differ from what was sampled)."""
    out = []
    for r in responses:
        if isinstance(r, str):
            out.append([int(t) for t in tokenizer(r, add_special_tokens=False)["input_ids"]])
        else:
            out.extend(as_token_lists([r], what="responses"))
    return out


def sar_rewards(
    model: nn.Module,
    tokenizer,
    prompts,
    responses,
    contexts=None,
    batch_size: int = 8,
    temperature: float = 1.0,
    chat_template_kwargs: dict | None = None,
    return_logprobs: bool = False,
):
    """Self-aligned reward of each response: ``[B]`` float32 in ``[-1, 1]``.

    Args:
        model: a Llama/Qwen2/Qwen3/Mistral ``...ForCausalLM``.
        tokenizer: its tokenizer (chat template for message-list prompts and their ``q0``).
        prompts: ``B`` prompts, as token ids, chat messages or rendered text (see
            :func:`prompt_token_ids`).
        responses: ``B`` responses, as token ids (the generated ids: preferred) or strings
            (tokenised once).
        contexts: optional ``B`` question-removed contexts (token ids or text; None entries fall
            back), see :func:`question_removed_contexts`: needed to be exact for prompts given as
            ids or text, whose question cannot be located.
        temperature: divides the logits of both passes (1.0: the model's distribution).
        chat_template_kwargs: template arguments of message-list prompts (and of their ``q0``).
        return_logprobs: also return ``(logp_q[T], logp_q0[T], cu_seqlens[B+1])`` (rows without a
            context hold NaN in ``logp_q0``).
    An empty response gets 0 (no evidence either way; ``swift_fast.rewards.sar``); a response whose
    ``q0`` is empty (a raw prompt, no context, no BOS token) gets NaN.
    """
    p_ids = prompt_token_ids(tokenizer, prompts, chat_template_kwargs)
    r_ids = response_token_ids(tokenizer, responses)
    if len(p_ids) != len(r_ids):
        raise ValueError(f"{len(p_ids)} prompts but {len(r_ids)} responses")
    q0s, _ = question_removed_contexts(tokenizer, prompts, contexts, chat_template_kwargs)
    b = len(r_ids)
    ok = [i for i in range(b) if q0s[i]]
    seqs = [p + r for p, r in zip(p_ids, r_ids)] + [q0s[i] + r_ids[i] for i in ok]
    plens = [len(p) for p in p_ids] + [len(q0s[i]) for i in ok]
    lp, cu = response_logprobs(model, seqs, plens, batch_size=batch_size, temperature=temperature)
    half = int(cu[b])
    lq = lp[:half]
    cu_r = cu[: b + 1]
    l0 = torch.full_like(lq, math.nan)
    for k, i in enumerate(ok):
        a, e = int(cu[b + k]), int(cu[b + k + 1])
        l0[int(cu_r[i]) : int(cu_r[i + 1])] = lp[a:e]
    r = sar_reward(lq, l0, cu_r)  # NaN where l0 is: an empty response stays 0
    return (r, (lq, l0, cu_r)) if return_logprobs else r
