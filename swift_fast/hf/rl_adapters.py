"""SAR as a reward in RL trainers: a TRL GRPO reward function and a hook for VERL.

TRL (``GRPOTrainer``)
    TRL calls each reward function with ``prompts``, ``completions``, ``completion_ids`` (the
    generated token ids, end-of-turn included) and the dataset's columns, and passes no
    log-probs, so the function runs both SAR passes itself with the policy model it closes over
    (the same module object the trainer updates, so it always scores the current policy)::

        from swift_fast.hf import trl_sar_reward
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[accuracy_reward, trl_sar_reward(model, tokenizer)],
            reward_weights=[1.0, 0.2],          # R_VR + alpha * R_SA, alpha = 0.2 (SAR paper)
            ...)

    Prompts are tokenised as ``GRPOTrainer`` tokenises them (chat messages: chat template with
    the generation prompt and ``chat_template_kwargs``; text: the tokenizer's default call), and
    responses are ``completion_ids``: nothing is re-tokenised from decoded text. SAR's
    question-removed prompt of a conversational prompt is the same messages with the last user
    message emptied. A text prompt has no question boundary: give a ``sar_context`` dataset column
    (token ids or text, per row), else it gets the BOS default (``swift_fast.rewards.sar_context``), and
    the reward refuses to run when that does not exist either.

VERL (``RayPPOTrainer``)
    VERL computes ``old_log_probs`` = log P(a | q) for every response token in
    ``actor_rollout_wg.compute_log_prob(batch)``; SAR needs one more call of the same function on
    the question-removed batch built here, then combines the two::

        from swift_fast.hf.rl_adapters import verl_question_removed_batch, verl_sar_reward, verl_token_level

        # after: old_log_prob = self.actor_rollout_wg.compute_log_prob(batch)
        # (data.return_raw_chat=True keeps each row's chat messages in non_tensor_batch["raw_prompt"])
        q0 = verl_question_removed_batch(batch.batch["responses"], batch.batch["response_mask"], tokenizer,
                                         messages=batch.non_tensor_batch["raw_prompt"])
        q0_out = self.actor_rollout_wg.compute_log_prob(DataProto.from_dict(tensors=q0, meta_info=batch.meta_info))
        r_sa = verl_sar_reward(old_log_prob.batch["old_log_probs"], q0_out.batch["old_log_probs"],
                               batch.batch["response_mask"])
        batch.batch["token_level_scores"] += 0.2 * verl_token_level(r_sa, batch.batch["response_mask"])

    VERL's ``compute_log_prob`` divides logits by ``meta_info["temperature"]``; SAR is defined on
    the model's distribution, so set it to 1.0 for both calls unless you sample at another
    temperature on purpose (the SAR paper samples at 1.0).
"""

from __future__ import annotations

import torch
from torch import nn

from ..rewards.sar import sar_from_means
from .sar import prompt_token_ids, question_removed_contexts, response_token_ids, sar_rewards


def trl_prompt(tokenizer, prompt):
    """Messages stay messages (``sar_rewards`` renders them and their ``q0``); text is tokenised
    with the tokenizer's default call, as ``GRPOTrainer`` does."""
    if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], dict):
        return list(prompt)
    if isinstance(prompt, str):
        return [int(t) for t in tokenizer(text=prompt)["input_ids"]]
    return [int(t) for t in prompt]


def trl_prompts(tokenizer, prompts, trainer) -> tuple[list, list[list[int]], dict]:
    """``(prompts as given, prompt token ids, chat template keywords)`` of a ``GRPOTrainer``
    batch, rendered as the trainer renders them (chat: the template with the generation prompt
    and the trainer's ``chat_template_kwargs``; text: the tokenizer's default call)."""
    kwargs = getattr(trainer, "chat_template_kwargs", None) or {}
    given = [trl_prompt(tokenizer, p) for p in prompts]
    return given, prompt_token_ids(tokenizer, given, chat_template_kwargs=kwargs), kwargs


def completion_text(c) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, (list, tuple)) and c and isinstance(c[-1], dict):
        return str(c[-1].get("content", ""))
    raise TypeError(f"cannot read a completion of type {type(c).__name__}")


def trl_sar_reward(
    model: nn.Module,
    tokenizer,
    batch_size: int = 8,
    chat_template_kwargs: dict | None = None,
    name: str = "sar",
):
    """A TRL reward function returning ``R_SA`` of each completion (``list[float]``).

    Without ``completion_ids`` (TRL versions before they were passed) the completions' text is
    tokenised once, without special tokens: prefer a TRL that passes ids.
    """

    def reward(prompts, completions, completion_ids=None, sar_context=None, **kwargs):
        ps = [trl_prompt(tokenizer, p) for p in prompts]
        if sar_context is None and tokenizer.bos_token_id is None and any(not isinstance(p[0], dict) for p in ps):
            raise ValueError(
                "SAR of a text prompt needs its question-removed context: add a 'sar_context' column to the "
                "dataset (the prompt with the question removed, as token ids or text), or use conversational "
                "prompts; this tokenizer has no BOS token to stand for it"
            )
        if completion_ids is None:
            r_ids = response_token_ids(tokenizer, [completion_text(c) for c in completions])
        else:
            r_ids = [[int(t) for t in ids] for ids in completion_ids]
        was_training = model.training
        model.eval()
        try:
            r = sar_rewards(model, tokenizer, ps, r_ids, contexts=sar_context, batch_size=batch_size,
                            chat_template_kwargs=chat_template_kwargs)
        finally:
            model.train(was_training)
        return [float(x) for x in r]

    reward.__name__ = name
    reward.__qualname__ = name
    return reward


# -- VERL --------------------------------------------------------------------------------------
def verl_question_removed_batch(
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    tokenizer,
    messages=None,
    contexts=None,
    chat_template_kwargs: dict | None = None,
) -> dict[str, torch.Tensor]:
    """VERL's batch layout for the question-removed pass, on the same responses.

    Args:
        responses: ``[B, R]`` response token ids, right-padded (VERL's ``responses``).
        response_mask: ``[B, R]`` 1 on response tokens.
        messages: ``B`` chat conversations the prompts were rendered from (VERL's ``raw_prompt``
            with ``data.return_raw_chat=True``): ``q0`` is each with its last user message emptied.
        contexts: instead, ``B`` question-removed contexts (token ids). With neither, every row
            gets the BOS default (``swift_fast.rewards.sar_context``).
    Returns:
        ``prompts [B, P0]`` (each row's ``q0``, left-padded as VERL pads prompts), ``responses``,
        ``input_ids [B, P0+R]``, ``attention_mask``, ``position_ids`` (contiguous from 0 on the
        real tokens, VERL's cumsum rule) and ``response_mask``: what ``compute_log_prob`` reads.
    """
    b = responses.shape[0]
    if messages is not None:
        prompts_in = [list(m) for m in messages]  # numpy object rows included
        bad = [i for i, m in enumerate(prompts_in) if not m or not all(isinstance(x, dict) for x in m)]
        if bad:
            raise ValueError(f"messages[{bad[0]}] is not a chat conversation (a list of {{'role', 'content'}} dicts)")
    else:
        prompts_in = [[0]] * b  # token-id placeholders: each row then takes its context, or the BOS default
    if len(prompts_in) != b:
        raise ValueError(f"{b} responses but {len(prompts_in)} conversations")
    q0s, _ = question_removed_contexts(tokenizer, prompts_in, contexts, chat_template_kwargs)
    if any(not q for q in q0s):
        raise ValueError(
            "a row has no question-removed context (no chat messages, no context, and the tokenizer has no BOS "
            "token): pass messages= or contexts="
        )
    width = max(len(q) for q in q0s)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    prompts = torch.full((b, width), pad, dtype=responses.dtype, device=responses.device)
    pmask = torch.zeros((b, width), dtype=torch.long, device=responses.device)
    for i, q in enumerate(q0s):
        prompts[i, width - len(q) :] = torch.tensor(q, dtype=responses.dtype)
        pmask[i, width - len(q) :] = 1
    input_ids = torch.cat([prompts, responses], 1)
    rmask = response_mask.to(torch.long)
    attention_mask = torch.cat([pmask, rmask], 1)
    position_ids = torch.clamp(attention_mask.cumsum(-1) - 1, min=0)
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": rmask,
    }


def verl_sar_reward(
    logp_with_question: torch.Tensor, logp_without_question: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """``R_SA`` per row from VERL's ``[B, R]`` per-token log-probs of the two passes: ``[B]`` float32."""
    if logp_with_question.shape != logp_without_question.shape or logp_with_question.shape != response_mask.shape:
        raise ValueError(
            f"log-probs {tuple(logp_with_question.shape)} / {tuple(logp_without_question.shape)} and response mask "
            f"{tuple(response_mask.shape)} must have the same [B, R] shape"
        )
    m = response_mask.to(torch.float32)
    n = m.sum(-1).clamp(min=1)
    zero = torch.zeros((), dtype=torch.float32, device=m.device)
    # where(), not a product: padded positions may hold anything, NaN included.
    mq = torch.where(m > 0, logp_with_question.float(), zero).sum(-1) / n
    m0 = torch.where(m > 0, logp_without_question.float(), zero).sum(-1) / n
    return sar_from_means(mq, m0)


def verl_token_level(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` reward tensor with each row's score on its last response token (VERL's convention)."""
    m = response_mask.to(torch.long)
    out = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    last = (m.sum(-1) - 1).clamp(min=0)
    has = m.sum(-1) > 0
    rows = torch.arange(m.shape[0], device=m.device)[has]
    out[rows, last[has]] = scores.to(out.device, torch.float32)[has]
    return out
