"""Self-aligned reward (SAR) with a Hugging Face causal LM (DESIGN 2; SAR paper Eq. 8-9).

Two passes over each response ``a``: after its own prompt (question kept) and after ``q0``,
the chat template of ``[system: SYS, user: ""]`` with the generation prompt (question removed,
system prompt kept). The response's positions follow the prompt in each pass (contiguous from
0), as in the SAR reference. Both passes go through :func:`response_logprobs` (no ``[T, V]``
logits) and combine in :func:`swift_fast.sar.sar_reward`.
"""

from __future__ import annotations

from torch import nn

from ..sar import DEFAULT_SYSTEM_PROMPT, sar_reward
from .features import as_token_lists
from .logprobs import response_logprobs


def chat_token_ids(tokenizer, messages, **chat_template_kwargs) -> list[int]:
    """Token ids of ``messages`` rendered with the chat template and the generation prompt
    (``apply_chat_template`` returns a list or, in some tokenizers, an encoding: both handled)."""
    ids = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=True, tokenize=True, return_dict=False, **chat_template_kwargs
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def question_removed_prompt(tokenizer, system_prompt: str | None = DEFAULT_SYSTEM_PROMPT) -> list[int]:
    """Token ids of ``q0``: the chat template of ``[system: SYS, user: ""]`` plus the generation
    prompt (``[user: ""]`` alone when ``system_prompt`` is None)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "SAR's question-removed pass renders [system, empty user] with the tokenizer's chat template, "
            "and this tokenizer has none: set tokenizer.chat_template"
        )
    msgs = ([{"role": "system", "content": system_prompt}] if system_prompt is not None else []) + [
        {"role": "user", "content": ""}
    ]
    return chat_token_ids(tokenizer, msgs)


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
            out.append([int(t) for t in tokenizer(p, add_special_tokens=False)["input_ids"]])
        elif isinstance(p, (list, tuple)) and p and isinstance(p[0], dict):
            out.append(chat_token_ids(tokenizer, p, **(chat_template_kwargs or {})))
        else:
            out.extend(as_token_lists([p], what=f"prompts[{i}]"))
        if not out[-1]:
            raise ValueError(f"prompt {i} is empty: SAR conditions the response on it")
    return out


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
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    batch_size: int = 8,
    temperature: float = 1.0,
    chat_template_kwargs: dict | None = None,
    return_logprobs: bool = False,
):
    """Self-aligned reward of each response: ``[B]`` float32 in ``[-1, 1]``.

    Args:
        model: a Llama/Qwen2/Qwen3/Mistral ``...ForCausalLM``.
        tokenizer: its tokenizer (chat template used for ``q0`` and for message-list prompts).
        prompts: ``B`` prompts, as token ids, chat messages or rendered text (see
            :func:`prompt_token_ids`).
        responses: ``B`` responses, as token ids (the generated ids: preferred) or strings
            (tokenised once).
        system_prompt: the system prompt kept in ``q0`` (SAR's default).
        temperature: divides the logits of both passes (1.0: the model's distribution).
        return_logprobs: also return ``(logp_q[T], logp_q0[T], cu_seqlens[B+1])``.
    An empty response gets 0 (no evidence either way; ``swift_fast.sar``).
    """
    p_ids = prompt_token_ids(tokenizer, prompts, chat_template_kwargs)
    r_ids = response_token_ids(tokenizer, responses)
    if len(p_ids) != len(r_ids):
        raise ValueError(f"{len(p_ids)} prompts but {len(r_ids)} responses")
    q0 = question_removed_prompt(tokenizer, system_prompt)
    b = len(r_ids)
    seqs = [p + r for p, r in zip(p_ids, r_ids)] + [q0 + r for r in r_ids]
    plens = [len(p) for p in p_ids] + [len(q0)] * b
    lp, cu = response_logprobs(model, seqs, plens, batch_size=batch_size, temperature=temperature)
    half = int(cu[b])
    lq, l0 = lp[:half], lp[half:]
    cu_r = cu[: b + 1]
    r = sar_reward(lq, l0, cu_r)
    return (r, (lq, l0, cu_r)) if return_logprobs else r
