"""Front end: each request's SAR question-removed context ``q0`` (the rule and its three sources,
``chat``, ``request`` and ``default``, are in :mod:`swift_fast.rewards.sar_context`).

Chat requests. ``LLM.chat`` and the OpenAI chat endpoint both render conversations through the
engine's renderer (``render_chat`` / ``render_chat_async``). With SAR on, the engine's renderer
instance gets a wrapper that renders, for every conversation, the same conversation with its
last user message emptied, with the same ``ChatParams`` (template, content format, template
arguments, tools, generation prompt) and the same tokenisation settings: ``q0`` is rendered
exactly as the request was. The ids ride on the engine input dict under :data:`CHAT_INPUT`
until the engine's ``InputProcessor.process_inputs`` (wrapped on the instance; its
``process_inputs_async`` is rebuilt on the wrapper, since vLLM binds it at construction) pops
them before vLLM reads the input.

Raw prompts. An explicit context per request (``extra_args``, see :mod:`.config`) wins over
everything, a chat rendering included; it is checked in ``process_inputs`` (token ids inside the
vocabulary, text tokenised as written, never empty), so a malformed one fails the request at once
(the server answers 400 before that). Else the engine's ``sar_context``, else the tokenizer's BOS.

The outcome is stored once, in the request's own cloned ``SamplingParams.extra_args`` under
:data:`RESOLVED` (ids, source, and why there is none), which ``n > 1`` children share and the
front end reads when it builds the SAR pass (it also reaches the engine core and workers with the
request's other arguments: once per request, a few hundred bytes). Conversations that cannot give
a ``q0`` (no user message, multimodal inputs, a template that fails on an empty message) get none:
their SAR is None, with the reason logged, never a score against a wrong context. The
question-removed renderings of a batch of conversations are made in one call (concurrently on
the server), after the request's own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..rewards.sar_context import (
    CHAT,
    DEFAULT,
    REQUEST,
    ContextError,
    default_context_ids,
    explicit_context_ids,
    missing_context_message,
    question_removed_messages,
)
from .config import KEY, PluginConfig, PluginConfigError, is_internal_pass

logger = logging.getLogger("swift_fast.vllm_plugin")

#: engine-input key carrying a chat request's rendered ``q0`` (or the reason it has none)
CHAT_INPUT = "_swift_fast_q0"
#: ``extra_args`` key of the resolved context: ``{"ids": [...] | None, "source": str, "why": str | None}``
RESOLVED = "_swift_fast_context"
#: flat ``extra_args`` key of an explicit context (what ``vllm_xargs`` can carry)
FLAT = "swift_fast_sar_context"


def explicit_context(extra: dict | None) -> Any:
    """The caller's own context in ``extra_args`` (None when absent)."""
    extra = extra or {}
    own = extra.get(KEY)
    if isinstance(own, dict) and own.get("sar_context") is not None:
        return own["sar_context"]
    return extra.get(FLAT)


def _text_only(conversation) -> bool:
    """Whether every message's content is text (a string, or parts that are all text)."""
    for m in conversation:
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", None)
        if isinstance(content, (list, tuple)) and any(
            (p.get("type") if isinstance(p, dict) else getattr(p, "type", None)) != "text" for p in content
        ):
            return False
    return True


_NOT_TEXT = "SAR's question-removed pass takes text-only conversations (this one has other inputs)"


class Contexts:
    """Installed on one engine's renderer and input processor (SAR on)."""

    def __init__(self, engine, cfg: PluginConfig):
        self.input_processor = engine.input_processor
        self.tokenizer = self.input_processor.tokenizer
        self.vocab_size = engine.vllm_config.model_config.get_vocab_size()
        if cfg.sar_context is None:
            ids = default_context_ids(self.tokenizer)
        else:
            given = list(cfg.sar_context) if isinstance(cfg.sar_context, tuple) else cfg.sar_context
            try:
                ids = self.ids(given, what=f'additional_config["{KEY}"]["sar_context"]')
            except ContextError as e:
                raise PluginConfigError(str(e)) from e
        self.default = self._record(ids, DEFAULT)
        self._wrap_renderer(engine.renderer)
        self._wrap_input_processor()

    def encode(self, text: str) -> list[int]:
        """A context given as text, tokenised exactly as written (no special tokens added: a rendered
        prompt's text already holds them), as the Hugging Face path does."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def ids(self, given: Any, what: str = "sar_context") -> list[int]:
        """The token ids of an explicit context (``ContextError`` when it cannot be one)."""
        return explicit_context_ids(given, self.encode, what=what, vocab_size=self.vocab_size)

    @staticmethod
    def _record(ids, source: str, why: str | None = None) -> dict:
        if ids is not None and not ids and why is None:
            why = missing_context_message(source)
        return {"ids": list(ids) if ids else None, "source": source, "why": why}

    # -- chat -----------------------------------------------------------------------------------
    @staticmethod
    def _ids_of(engine_input) -> list[int] | str:
        """The ``q0`` ids of a rendered question-removed conversation, or why it cannot be used."""
        if engine_input.get("type") not in (None, "token") or "prompt_token_ids" not in engine_input:
            return _NOT_TEXT
        return [int(t) for t in engine_input["prompt_token_ids"]]

    @staticmethod
    def _failure(e: Exception) -> str:
        if isinstance(e, ContextError):
            return str(e)
        return f"rendering the conversation with its question removed failed: {type(e).__name__}: {e}"

    def _wrap_renderer(self, renderer) -> None:
        orig, orig_async = renderer.render_chat, renderer.render_chat_async
        ctx = self

        def plan(conversations) -> tuple[dict, list[int], list]:
            """``(reasons, where, todo)``: why each conversation that cannot give a ``q0`` cannot, and
            the question-removed conversations to render with their positions."""
            reasons, where, todo = {}, [], []
            for i, conv in enumerate(conversations):
                if not _text_only(conv):
                    reasons[i] = _NOT_TEXT
                    continue
                try:
                    todo.append(question_removed_messages(conv))
                    where.append(i)
                except ContextError as e:
                    reasons[i] = str(e)
            return reasons, where, todo

        def render_chat(conversations, chat_params, tok_params=None, **kwargs):
            convs, engine_inputs = orig(conversations, chat_params, tok_params, **kwargs)
            found, where, todo = plan(conversations)
            if todo:
                try:  # one batched rendering; one by one only when it fails, to name the one that did
                    found.update(zip(where, map(ctx._ids_of, orig(todo, chat_params, tok_params, **kwargs)[1])))
                except Exception:
                    for i, conv in zip(where, todo):
                        try:
                            found[i] = ctx._ids_of(orig([conv], chat_params, tok_params, **kwargs)[1][0])
                        except Exception as e:  # this request gets no SAR; it is still served
                            found[i] = ctx._failure(e)
            for i, eng in enumerate(engine_inputs):
                eng[CHAT_INPUT] = found[i]
            return convs, engine_inputs

        async def render_chat_async(conversations, chat_params, tok_params=None, **kwargs):
            convs, engine_inputs = await orig_async(conversations, chat_params, tok_params, **kwargs)
            found, where, todo = plan(conversations)

            async def one(conv):
                try:
                    return ctx._ids_of((await orig_async([conv], chat_params, tok_params, **kwargs))[1][0])
                except Exception as e:
                    return ctx._failure(e)

            found.update(zip(where, await asyncio.gather(*(one(c) for c in todo))))
            for i, eng in enumerate(engine_inputs):
                eng[CHAT_INPUT] = found[i]
            return convs, engine_inputs

        renderer.render_chat = render_chat
        renderer.render_chat_async = render_chat_async

    # -- every request ----------------------------------------------------------------------------
    def record_for(self, chat: list[int] | str | None, extra: dict | None) -> dict:
        """The context of one request: its explicit one (``ContextError`` when malformed), else its
        chat rendering's, else the engine default."""
        given = explicit_context(extra)
        if given is not None:
            return self._record(self.ids(given), REQUEST)
        if isinstance(chat, list):
            return self._record(chat, CHAT)
        if isinstance(chat, str):
            return self._record(None, CHAT, why=chat)
        return self.default

    def _wrap_input_processor(self) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.utils.async_utils import make_async

        ip = self.input_processor
        orig = ip.process_inputs
        ctx = self

        def process_inputs(request_id, prompt, params, *args, **kwargs):
            chat = prompt.pop(CHAT_INPUT, None) if isinstance(prompt, dict) else None
            rec = None
            if isinstance(params, SamplingParams) and not is_internal_pass(params.extra_args):
                rec = ctx.record_for(chat, params.extra_args)
            req = orig(request_id, prompt, params, *args, **kwargs)
            sp = getattr(req, "sampling_params", None)
            if rec is not None and sp is not None and sp is not params:  # vLLM's clone: this request's own
                sp.extra_args = {**(sp.extra_args or {}), RESOLVED: rec}
            return req

        ip.process_inputs = process_inputs
        ip.process_inputs_async = make_async(process_inputs, executor=ip.renderer._executor)


def context_of(params) -> dict | None:
    """The resolved context of a request (None for requests that never went through
    ``process_inputs``, e.g. an ``EngineCoreRequest`` added directly)."""
    extra = getattr(params, "extra_args", None) or {}
    rec = extra.get(RESOLVED)
    return rec if isinstance(rec, dict) else None


__all__ = ["CHAT_INPUT", "FLAT", "RESOLVED", "Contexts", "context_of", "explicit_context"]
