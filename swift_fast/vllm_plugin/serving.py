"""OpenAI-compatible server (``vllm serve``): scores in responses and server-side Best-of-N.

With a head configured, every choice of ``/v1/completions`` and ``/v1/chat/completions`` carries
``swift_score`` and ``swift_tokens`` (and ``sar`` with SAR on); in a streamed response they ride
on each choice's final chunk (the one with its ``finish_reason``).

A request may ask ``"best_of_n": N`` (a body field, as ``extra_body`` of the ``openai`` client):
the server samples ``N`` candidates (``n`` must then be 1 or absent, ``stream`` false) and
returns, per prompt, only the one the configured selection ranks first (``select``: SWIFT by
default; ties go to the lowest index; a candidate without a score never wins over one with),
with::

    "best_of_n": {"n": N, "index": <chosen candidate>, "swift_scores": [...N], "sar": [...N]}

``usage`` counts all ``N`` candidates' tokens: they were all generated. ``best_of_n`` is refused
(400, naming the field) above the engine's ``max_best_of_n``, with greedy sampling (N copies of
one answer), with beam search, and on a request that opted out of scoring.

With SAR on, a raw completion prompt may bring its question-removed context in a
``"sar_context"`` body field (token ids or text; :mod:`.contexts`), and every choice says which
context its ``sar`` used (``sar_context``).

``/v1/responses`` and ``/v1/chat/completions/batch`` carry no scores: a request to them that
asks for ``best_of_n`` or ``sar_context`` is answered 400, naming the endpoint. Beam search
(``use_beam_search``) runs unscored (:mod:`.frontend`).

The serving classes are patched once per process, when the first engine with a head is built;
each wrapper checks its own engine, so a server without a head is served unchanged.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

_INSTALLED = False


def _frontend(serving) -> Any:
    return getattr(getattr(serving, "engine_client", None), "_swift_fast_frontend", None)


def choice_fields(output, sar: bool) -> dict:
    """The fields a response choice gets from a ``CompletionOutput``."""
    d = {"swift_score": _num(getattr(output, "swift_score", None)), "swift_tokens": getattr(output, "swift_tokens", 0)}
    if sar:
        d["sar"] = _num(getattr(output, "sar", None))
        d["sar_context"] = getattr(output, "sar_context", None)
    return d


def _num(x):
    # JSON has no NaN: a score that could not be computed is null
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return float(x)


def _set(choice, fields: dict) -> None:
    for k, v in fields.items():
        setattr(choice, k, v)  # response models allow extra fields


def select_best(fields: list[dict], how: str) -> int:
    """Index of the candidate ``how`` (``swift``/``sar``/``rank``/``scaled``) ranks first."""
    import torch

    from .. import bon

    def col(key):
        return torch.tensor([[math.nan if f.get(key) is None else f[key] for f in fields]], dtype=torch.float64)

    n = len(fields)
    if how == "swift":
        return int(bon.bon_select(col("swift_score"), n)[0])
    if how == "sar":
        return int(bon.bon_select(col("sar"), n)[0])
    if how == "rank":
        return int(bon.combine_rank(col("swift_score"), col("sar"), n)[0])
    return int(bon.combine_scaled(col("swift_score"), col("sar"), n)[0])


def _best_of_n(serving, request, fe) -> tuple[int | None, str | None]:
    """``(N, error)`` from a request body's ``best_of_n``."""
    from .config import SKIP, request_kind

    extra = getattr(request, "model_extra", None) or {}
    if "best_of_n" not in extra:
        return None, None
    n = extra["best_of_n"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return None, f"best_of_n must be a positive integer, got {n!r}"
    if n > fe.cfg.max_best_of_n:
        return None, (
            f"best_of_n = {n} is above this server's limit of {fe.cfg.max_best_of_n} (the plugin's max_best_of_n): "
            "ask for fewer candidates"
        )
    if request.n not in (None, 1):
        return None, "best_of_n returns one choice per prompt: leave n unset (or 1)"
    if getattr(request, "stream", False):
        return None, "best_of_n needs every candidate finished before it answers: set stream to false"
    if getattr(request, "use_beam_search", False):
        return None, "best_of_n cannot be combined with beam search"
    temperature = request.temperature
    if temperature is None:
        temperature = (getattr(serving, "default_sampling_params", None) or {}).get("temperature", 1.0)
    if temperature is not None and temperature < 1e-5:
        return None, (
            f"best_of_n = {n} with greedy sampling (temperature {temperature}) would generate {n} copies of one "
            "answer: set a temperature above 0"
        )
    xargs = getattr(request, "vllm_xargs", None) or {}
    if request_kind(_Params(xargs))[0] == SKIP:
        return None, "best_of_n ranks candidates by their scores, and this request opted out of scoring"
    return n, None


class _Params:
    """What ``request_kind`` reads of a request's sampling parameters, from its ``vllm_xargs``."""

    def __init__(self, extra_args: dict):
        self.extra_args = extra_args


def _move_sar_context(request, fe) -> str | None:
    """The ``sar_context`` body field into ``vllm_xargs`` (which reach ``SamplingParams.extra_args``);
    the error message when it is malformed or SAR is off."""
    from ..sar_context import ContextError
    from .contexts import FLAT

    extra = getattr(request, "model_extra", None) or {}
    if "sar_context" in extra:
        request.vllm_xargs = {**(request.vllm_xargs or {}), FLAT: extra["sar_context"]}
    given = (request.vllm_xargs or {}).get(FLAT)
    if given is None:
        return None
    if fe.contexts is None:
        return "sar_context is SAR's question-removed context, and this server computes no SAR (start it with --sar)"
    try:
        fe.contexts.ids(given)
    except ContextError as e:
        return str(e)
    return None


def _reduce(response, n: int, fe) -> None:
    """Keep the best of each group of ``n`` consecutive choices (prompt-major)."""
    choices = list(response.choices)
    kept = []
    for g in range(0, len(choices), n):
        group = choices[g : g + n]
        fields = [dict(c.model_extra or {}) for c in group]
        best = select_best(fields, fe.cfg.select)
        c = group[best]
        info = {"n": n, "index": best, "swift_scores": [f.get("swift_score") for f in fields]}
        if fe.cfg.sar:
            info["sar"] = [f.get("sar") for f in fields]
        c.index = len(kept)
        _set(c, {"best_of_n": info})
        kept.append(c)
    response.choices = kept


def _with_best_of_n(orig):
    """Wrap a server's ``create_*completion``: a ``"best_of_n": N`` request generates N choices
    per prompt and answers with the best of each group (the same for completions and chat)."""
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    @functools.wraps(orig)
    async def create(self, request, raw_request=None):
        fe = _frontend(self)
        if fe is None:
            return await orig(self, request, raw_request)
        n, err = _best_of_n(self, request, fe)
        err = err or _move_sar_context(request, fe)
        if err:
            return self.create_error_response(err)
        if n is None:
            return await orig(self, request, raw_request)
        request.n = n
        response = await orig(self, request, raw_request)
        if not isinstance(response, ErrorResponse):
            _reduce(response, n, fe)
        return response

    return create


def _refuse_plugin_fields(orig, endpoint: str):
    """Wrap an endpoint that carries no scores: a request asking for the plugin's fields gets a 400."""

    @functools.wraps(orig)
    async def create(self, request, *args, **kwargs):
        extra = getattr(request, "model_extra", None) or {}
        asked = [k for k in ("best_of_n", "sar_context") if k in extra]
        if asked and _frontend(self) is not None:
            return self.create_error_response(
                f"{endpoint} does not support {', '.join(asked)} (its responses carry no swift-fast scores): "
                "use /v1/chat/completions or /v1/completions"
            )
        return await orig(self, request, *args, **kwargs)

    return create


def _rewrite_sse(chunk: str, finals: dict, key_of, sar: bool) -> str:
    """Add the scores to the choices of an SSE ``data:`` chunk that carry a finish reason."""
    if not chunk.startswith("data: ") or '"finish_reason"' not in chunk:
        return chunk
    body = chunk[len("data: ") :].strip()
    try:
        data = json.loads(body)
    except ValueError:
        return chunk
    changed = False
    for ch in data.get("choices") or []:
        if ch.get("finish_reason") is None:
            continue
        out = finals.get(key_of(ch.get("index")))
        if out is not None:
            ch.update(choice_fields(out, sar))
            changed = True
    return f"data: {json.dumps(data)}\n\n" if changed else chunk


def install_serving() -> None:
    global _INSTALLED
    if _INSTALLED:
        return
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    # -- completions ----------------------------------------------------------------------
    C = OpenAIServingCompletion
    orig_to_resp = C.request_output_to_completion_response

    @functools.wraps(orig_to_resp)
    def request_output_to_completion_response(self, final_res_batch, request, *args, **kwargs):
        response = orig_to_resp(self, final_res_batch, request, *args, **kwargs)
        fe = _frontend(self)
        if fe is not None:
            outputs = [o for res in final_res_batch for o in res.outputs]
            for choice, out in zip(response.choices, outputs):
                _set(choice, choice_fields(out, fe.cfg.sar))
        return response

    create_completion = _with_best_of_n(C.create_completion)

    orig_stream = C.completion_stream_generator

    @functools.wraps(orig_stream)
    def completion_stream_generator(self, request, engine_inputs, result_generator, *args, **kwargs):
        fe = _frontend(self)
        if fe is None:
            return orig_stream(self, request, engine_inputs, result_generator, *args, **kwargs)
        n = request.n or 1
        finals: dict = {}

        async def tap():
            async for i, res in result_generator:
                for o in res.outputs:
                    finals[o.index + i * n] = o
                yield i, res

        async def gen():
            async for chunk in orig_stream(self, request, engine_inputs, tap(), *args, **kwargs):
                yield _rewrite_sse(chunk, finals, lambda idx: idx, fe.cfg.sar)

        return gen()

    C.request_output_to_completion_response = request_output_to_completion_response
    C.create_completion = create_completion
    C.completion_stream_generator = completion_stream_generator

    # -- chat -----------------------------------------------------------------------------
    H = OpenAIServingChat
    orig_full = H.chat_completion_full_generator

    @functools.wraps(orig_full)
    async def chat_completion_full_generator(self, request, result_generator, *args, **kwargs):
        fe = _frontend(self)
        if fe is None:
            return await orig_full(self, request, result_generator, *args, **kwargs)
        last: list = [None]

        async def tap():
            async for res in result_generator:
                last[0] = res
                yield res

        response = await orig_full(self, request, tap(), *args, **kwargs)
        if last[0] is not None and not isinstance(response, ErrorResponse):
            by_index = {o.index: o for o in last[0].outputs}
            for choice in response.choices:
                out = by_index.get(choice.index)
                if out is not None:
                    _set(choice, choice_fields(out, fe.cfg.sar))
        return response

    create_chat_completion = _with_best_of_n(H.create_chat_completion)

    orig_chat_stream = H.chat_completion_stream_generator

    @functools.wraps(orig_chat_stream)
    def chat_completion_stream_generator(self, request, result_generator, *args, **kwargs):
        fe = _frontend(self)
        if fe is None:
            return orig_chat_stream(self, request, result_generator, *args, **kwargs)
        finals: dict = {}

        async def tap():
            async for res in result_generator:
                for o in res.outputs:
                    finals[o.index] = o
                yield res

        async def gen():
            async for chunk in orig_chat_stream(self, request, tap(), *args, **kwargs):
                yield _rewrite_sse(chunk, finals, lambda idx: idx, fe.cfg.sar)

        return gen()

    H.chat_completion_full_generator = chat_completion_full_generator
    H.create_chat_completion = create_chat_completion
    H.chat_completion_stream_generator = chat_completion_stream_generator

    # -- endpoints without scores ---------------------------------------------------------
    from vllm.entrypoints.openai.chat_completion.batch_serving import OpenAIServingChatBatch
    from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses

    OpenAIServingChatBatch.create_batch_chat_completion = _refuse_plugin_fields(
        OpenAIServingChatBatch.create_batch_chat_completion, "/v1/chat/completions/batch"
    )
    OpenAIServingResponses.create_responses = _refuse_plugin_fields(
        OpenAIServingResponses.create_responses, "/v1/responses"
    )
    _INSTALLED = True
