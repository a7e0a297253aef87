"""Front end: each request's SAR question-removed context ``q0`` (the rule and its three sources,
``chat``, ``request`` and ``default``, are in :mod:`swift_fast.sar_context`).

Chat requests. ``LLM.chat`` and the OpenAI chat endpoint both render conversations through the
engine's renderer (``render_chat`` / ``render_chat_async``). With SAR on, the engine's renderer
instance gets a wrapper that renders, for every conversation, the same conversation with its
last user message emptied, with the same ``ChatParams`` (template, content format, template
arguments, tools, generation prompt) and the same tokenisation settings: ``q0`` is rendered
exactly as the request was. The ids ride on the engine input dict under :data:`CHAT_INPUT`
until the engine's ``InputProcessor.process_inputs`` (wrapped on the instance; its
``process_inputs_async`` is rebuilt on the wrapper, since vLLM binds it at construction) pops
them before vLLM reads the input.

Raw prompts. An explicit context per request (``extra_args``, see :mod:`.config`) wins, even
over a chat context; it is checked in ``process_inputs``, so a malformed one fails the request
at once (a 400 on the server). Else the engine's ``sar_context``, else the tokenizer's BOS.

The outcome is stored once, in the request's own cloned ``SamplingParams.extra_args`` under
:data:`RESOLVED` (ids, source, and why there is none), which ``n > 1`` children share and the
front end reads when it builds the SAR pass. Conversations that cannot give a ``q0`` (no user
message, multimodal inputs, a template that fails on an empty message) get none: their SAR is
None, with the reason logged, never a score against a wrong context.
"""

from __future__ import annotations

import logging
from typing import Any

from ..sar_context import (
    CHAT,
    DEFAULT,
    REQUEST,
    ContextError,
    explicit_context_ids,
    missing_context_message,
    question_removed_messages,
)
from .config import KEY, PluginConfig

logger = logging.getLogger("swift_fast.vllm_plugin")

#: engine-input key carrying a chat request's rendered ``q0`` (or the reason it has none)
CHAT_INPUT = "_swift_fast_q0"
#: ``extra_args`` key of the resolved context: ``{"ids": [...] | None, "source": str, "why": str | None}``
RESOLVED = "_swift_fast_q0"
#: flat ``extra_args`` key of an explicit context (what ``vllm_xargs`` can carry)
FLAT = "swift_fast_sar_context"


def explicit_context(extra: dict | None) -> Any:
    """The caller's own context in ``extra_args`` (None when absent)."""
    extra = extra or {}
    own = extra.get(KEY)
    if isinstance(own, dict) and own.get("sar_context") is not None:
        return own["sar_context"]
    return extra.get(FLAT)


class Contexts:
    """Installed on one engine's renderer and input processor (SAR on)."""

    def __init__(self, engine, cfg: PluginConfig):
        self.input_processor = engine.input_processor
        self.tokenizer = self.input_processor.tokenizer
        if cfg.sar_context is None:
            bos = getattr(self.tokenizer, "bos_token_id", None)
            ids = [int(bos)] if bos is not None else []
        else:
            ids = explicit_context_ids(
                list(cfg.sar_context) if isinstance(cfg.sar_context, tuple) else cfg.sar_context,
                self.encode, what=f'additional_config["{KEY}"]["sar_context"]',
            )
        self.default = self._record(ids, DEFAULT)
        self._wrap_renderer(engine.renderer)
        self._wrap_input_processor()

    def encode(self, text: str) -> list[int]:
        """Text as vLLM tokenises a completion prompt (the tokenizer's special tokens added)."""
        return list(self.tokenizer.encode(text))

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
            return "SAR's question-removed pass takes text-only conversations (this one has other inputs)"
        return [int(t) for t in engine_input["prompt_token_ids"]]

    @staticmethod
    def _failure(e: Exception) -> str:
        if isinstance(e, ContextError):
            return str(e)
        return f"rendering the conversation with its question removed failed: {type(e).__name__}: {e}"

    def _wrap_renderer(self, renderer) -> None:
        orig, orig_async = renderer.render_chat, renderer.render_chat_async
        ctx = self

        def render_chat(conversations, chat_params, tok_params=None, **kwargs):
            convs, engine_inputs = orig(conversations, chat_params, tok_params, **kwargs)
            for conv, eng in zip(conversations, engine_inputs):
                try:
                    (q0,) = orig([question_removed_messages(conv)], chat_params, tok_params, **kwargs)[1]
                    eng[CHAT_INPUT] = ctx._ids_of(q0)
                except Exception as e:  # this request gets no SAR; it is still served
                    eng[CHAT_INPUT] = ctx._failure(e)
            return convs, engine_inputs

        async def render_chat_async(conversations, chat_params, tok_params=None, **kwargs):
            convs, engine_inputs = await orig_async(conversations, chat_params, tok_params, **kwargs)
            for conv, eng in zip(conversations, engine_inputs):
                try:
                    (q0,) = (await orig_async([question_removed_messages(conv)], chat_params, tok_params, **kwargs))[1]
                    eng[CHAT_INPUT] = ctx._ids_of(q0)
                except Exception as e:
                    eng[CHAT_INPUT] = ctx._failure(e)
            return convs, engine_inputs

        renderer.render_chat = render_chat
        renderer.render_chat_async = render_chat_async

    # -- every request ----------------------------------------------------------------------------
    def record_for(self, chat: list[int] | str | None, extra: dict | None) -> dict:
        """The context of one request: its explicit one (``ContextError`` when malformed), else its
        chat rendering's, else the engine default."""
        given = explicit_context(extra)
        if given is not None:
            return self._record(explicit_context_ids(given, self.encode), REQUEST)
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
            rec = ctx.record_for(chat, params.extra_args) if isinstance(params, SamplingParams) else None
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
