"""SAR's question-removed context ``q0`` (DESIGN 2): the generation's own prompt with the user's
question removed and everything else unchanged.

``ppl(a)`` conditions the answer on ``q0``. Every path (vLLM plugin, Hugging Face, the CLI) takes
``q0`` from one of three sources and says which one it used (``sar_context`` beside ``sar``):

``"chat"``
    The prompt was rendered from chat messages. ``q0`` is the same messages with the content of
    the last user message emptied (:func:`question_removed_messages`), rendered as the prompt
    was: the same chat template, system turns (or none), template arguments and generation
    prompt. A template that inserts a default system turn when none is given (SmolLM2,
    Qwen2.5, ...) inserts it in both renderings, so it stays.
``"request"``
    The caller gave the question-removed context: token ids, or text tokenised the way that
    path tokenises prompt text. This is the only exact choice for a raw prompt, because the
    question's boundary cannot be read from text.
``"default"``
    A raw prompt without an explicit context: the tokenizer's BOS token alone
    (:func:`default_context_ids`), i.e. the answer with nothing but the start of the sequence
    before it. A tokenizer without a BOS token has no such context, and then SAR is missing
    (None, NaN in arrays) with a message asking for an explicit context.

Nothing is added to ``q0`` that the generation did not see: SAR's reference system prompt
(:data:`swift_fast.definitions.DEFAULT_SYSTEM_PROMPT`) belongs to generation prompts that use
it, never to ``q0`` alone.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

CHAT, REQUEST, DEFAULT = "chat", "request", "default"


class ContextError(ValueError):
    """A question-removed context cannot be built from what was given."""


def _as_dict(message: Any) -> dict:
    if isinstance(message, Mapping):
        return dict(message)
    if hasattr(message, "model_dump"):  # pydantic message objects
        return message.model_dump(exclude_none=True)
    raise ContextError(f"a chat message must be a mapping with 'role' and 'content', got {type(message).__name__}")


def question_removed_messages(messages: Sequence[Any]) -> list[dict]:
    """A copy of ``messages`` whose last user message has empty content (the question removed).

    Every other message (system turns, earlier turns, a partial assistant turn) is kept as it
    is. Raises ``ContextError`` when no message has the role ``user``.
    """
    out = [_as_dict(m) for m in messages]
    for m in reversed(out):
        if m.get("role") == "user":
            m["content"] = ""
            return out
    raise ContextError("the conversation has no user message, so there is no question to remove for SAR")


def chat_ids(tokenizer, messages: Sequence[Any], **chat_template_kwargs) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template and the generation
    prompt (``apply_chat_template`` returns a list or, in some tokenizers, an encoding: both handled).
    ``chat_template_kwargs`` reach the template (``add_generation_prompt`` among them may be overridden)."""
    kwargs = {"add_generation_prompt": True, **chat_template_kwargs}
    ids = tokenizer.apply_chat_template(list(messages), tokenize=True, return_dict=False, **kwargs)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def chat_context_ids(tokenizer, messages: Sequence[Any], **chat_template_kwargs) -> list[int]:
    """``q0`` of a chat prompt: :func:`question_removed_messages` rendered as :func:`chat_ids` renders
    the prompt itself (same template arguments)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ContextError("the tokenizer has no chat template to render the question-removed messages with")
    return chat_ids(tokenizer, question_removed_messages(messages), **chat_template_kwargs)


def default_context_ids(tokenizer) -> list[int]:
    """``q0`` of a raw prompt with no explicit context: ``[BOS]``, or ``[]`` when the tokenizer has no
    BOS token (then SAR cannot be computed; see the module notes)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return [int(bos)] if bos is not None else []


def explicit_context_ids(
    context: Any, encode: Callable[[str], list[int]], what: str = "sar_context", vocab_size: int | None = None
) -> list[int]:
    """Token ids of a caller's question-removed context: a non-empty list of token ids (used as given,
    each in ``[0, vocab_size)`` when that is given) or a text (``encode``: the calling path's
    tokenisation of text taken exactly as written, no special tokens added). Raises ``ContextError``
    on anything else, naming ``what`` and the offending item."""
    if isinstance(context, str):
        ids = [int(t) for t in encode(context)]
        if not ids:
            raise ContextError(f"{what} is an empty text: give the question-removed context the answer should follow")
        return ids
    if not isinstance(context, (list, tuple)):
        raise ContextError(
            f"{what} must be the question-removed context as a list of token ids or as text, "
            f"got {type(context).__name__}"
        )
    if not context:
        raise ContextError(f"{what} is an empty list: the answer's first token would have nothing to follow")
    for i, t in enumerate(context):
        if type(t) is not int or t < 0 or (vocab_size is not None and t >= vocab_size):
            bound = f" in [0, {vocab_size})" if vocab_size is not None else " (non-negative)"
            raise ContextError(f"{what}[{i}] = {t!r} is not a token id{bound}")
    return [int(t) for t in context]


def missing_context_message(source: str) -> str:
    """Why SAR is missing when a context resolved to no tokens."""
    if source == DEFAULT:
        return (
            "SAR needs the question-removed context of a raw prompt and the tokenizer has no BOS token to "
            "stand for it: pass one per request (sar_context: token ids or text) or an engine default"
        )
    return (
        f"the question-removed context ({source}) has no tokens, so the answer's first token has nothing to follow: "
        "give a non-empty sar_context"
    )
