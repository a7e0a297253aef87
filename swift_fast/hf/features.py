"""Exact hidden states of Hugging Face causal LMs, taken as each layer produces them.

State numbering follows ``output_hidden_states`` (DESIGN 2): index 0 is the embedding output
(the input of the first decoder layer), index i in 1..L-1 the residual stream after decoder
layer i, index L the final layer's output after the final norm. The logit feature is
``lm_head`` applied to state L, for the scored positions only.

Scored span (DESIGN 2), for a sequence of ``n`` tokens whose response starts at ``P``:
``emitted`` scores response token j (0-based) with the state at position ``P + j``;
``predicting`` with the state at ``P + j - 1`` (the last prompt token for j = 0), so it needs
``P >= 1``. Both score ``n - P`` tokens. Spans are derived from token ids alone, for any chat
template.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
from torch import nn

from ..rewards.head import ALIGNMENT, ALIGNMENTS, LOGITS_LAYER

#: ``config.model_type`` -> family name, for the architectures whose layout is checked here.
SUPPORTED_MODEL_TYPES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral"}

#: Rows converted to float32 at a time when a state is projected or gathered; bounds the
#: transient copy to about 64 MiB whatever the batch.
_CHUNK_ELEMENTS = 1 << 24


class UnsupportedModelError(ValueError):
    """A model whose layout the Hugging Face integration does not know."""


@dataclass
class DecoderParts:
    """The pieces of a decoder-only causal LM that the hooks attach to."""

    model: nn.Module  # the ...ForCausalLM
    base: nn.Module  # the decoder stack: embeddings, layers, final norm
    layers: nn.ModuleList
    norm: nn.Module
    lm_head: nn.Module
    num_layers: int
    hidden_size: int
    vocab_size: int

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device


def decoder_parts(model: nn.Module) -> DecoderParts:
    """Locate decoder stack, layers, final norm and ``lm_head`` of a supported causal LM.

    A PEFT wrapper (``get_base_model``) or a ``DistributedDataParallel``-style ``.module``
    wrapper is looked through: adapters injected into the base model's layers stay active.
    Raises ``UnsupportedModelError`` for any other architecture (the message names it and
    the supported families).
    """
    for _ in range(4):
        if callable(getattr(model, "get_base_model", None)):
            model = model.get_base_model()
        elif not hasattr(model, "config") and isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        else:
            break
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    arch = type(model).__name__
    supported = ", ".join(f"{v} ({k})" for k, v in SUPPORTED_MODEL_TYPES.items())
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"unsupported architecture {arch} (model_type {model_type!r}): swift-fast's Hugging Face "
            f"integration reads hidden states of decoder-only causal LMs of the families {supported}"
        )
    base = getattr(model, "model", None)
    lm_head = getattr(model, "lm_head", None)
    layers = getattr(base, "layers", None)
    norm = getattr(base, "norm", None)
    if base is None or lm_head is None or not isinstance(layers, nn.ModuleList) or norm is None:
        raise UnsupportedModelError(
            f"unsupported architecture {arch}: expected a ...ForCausalLM with .model.layers, .model.norm and "
            f".lm_head (load the model with AutoModelForCausalLM, not AutoModel or a wrapper)"
        )
    return DecoderParts(
        model=model,
        base=base,
        layers=layers,
        norm=norm,
        lm_head=lm_head,
        num_layers=int(config.num_hidden_layers),
        hidden_size=int(config.hidden_size),
        vocab_size=int(lm_head.weight.shape[0]),
    )


def _first_tensor(x):
    return x[0] if isinstance(x, (tuple, list)) else x


@contextlib.contextmanager
def state_hooks(
    parts: DecoderParts, indices: Sequence[int], on_state: Callable[[int, torch.Tensor], None]
) -> Iterator[None]:
    """Call ``on_state(slot, h)`` with ``h = [B, T, d]`` as state ``indices[slot]`` is produced.

    Index 0 is read as the first layer's input, 1..L-1 as the layers' outputs and L as the
    final norm's output: exactly the tensors ``output_hidden_states`` returns, without keeping
    any of them. The hooks are removed on exit, even after an error.
    """
    L = parts.num_layers
    handles = []
    try:
        for slot, idx in enumerate(indices):
            if not 0 <= idx <= L:
                raise ValueError(f"hidden-state index {idx} is out of range 0..{L}")
            if idx == 0:

                def pre(module, args, kwargs, slot=slot):
                    h = args[0] if args else kwargs["hidden_states"]
                    on_state(slot, h)

                handles.append(parts.layers[0].register_forward_pre_hook(pre, with_kwargs=True))
            else:
                module = parts.norm if idx == L else parts.layers[idx - 1]

                def post(module, args, output, slot=slot):
                    on_state(slot, _first_tensor(output))

                handles.append(module.register_forward_hook(post))
        yield
    finally:
        for h in handles:
            h.remove()


def state_indices(layers: Sequence[int], feature: str, num_layers: int) -> list[int]:
    """Hidden-state indices a head reads (the logit feature reads state L through ``lm_head``)."""
    if feature == "logits":
        return [num_layers]
    return [int(i) for i in layers]


# -- spans ---------------------------------------------------------------------------------
def as_token_lists(sequences, what: str = "sequences") -> list[list[int]]:
    """Token-id lists from lists, tuples or 1-D tensors; anything else is a clear error."""
    out = []
    for i, s in enumerate(sequences):
        if isinstance(s, str):
            raise TypeError(
                f"{what}[{i}] is a string: pass token ids (parity is defined on token ids, text is never re-tokenised)"
            )
        if isinstance(s, torch.Tensor):
            if s.dim() != 1:
                raise ValueError(f"{what}[{i}] must be a 1-D tensor of token ids, got shape {tuple(s.shape)}")
            out.append([int(t) for t in s.tolist()])
        else:
            out.append([int(t) for t in s])
    return out


def check_spans(
    sequences: list[list[int]], prompt_lengths: Sequence[int], alignment: str, vocab_size: int | None = None
) -> list[int]:
    """Validate ``prompt_lengths`` against the sequences; return them as ints."""
    if alignment not in ALIGNMENTS:
        raise ValueError(f"alignment {alignment!r}: expected one of {ALIGNMENTS}")
    need = -ALIGNMENT[alignment].state_offset  # prompt tokens before the first scored state
    plens = [int(p) for p in prompt_lengths]
    if len(plens) != len(sequences):
        raise ValueError(f"{len(sequences)} sequences but {len(plens)} prompt lengths")
    for i, (s, p) in enumerate(zip(sequences, plens)):
        if not s:
            raise ValueError(f"sequence {i} is empty: it needs at least its prompt")
        if not 0 <= p <= len(s):
            raise ValueError(f"sequence {i}: prompt length {p} is outside 0..{len(s)} (its length)")
        if p < need:
            raise ValueError(
                f"sequence {i}: the '{alignment}' alignment scores the first response token with "
                f"{ALIGNMENT[alignment].first_token_state}, so the prompt needs at least "
                f"{'one token' if need == 1 else f'{need} tokens'} (prompt length is {p})"
            )
        if vocab_size is not None:
            lo, hi = min(s), max(s)
            if lo < 0 or hi >= vocab_size:
                raise ValueError(
                    f"sequence {i} holds token id {lo if lo < 0 else hi}, outside the vocabulary 0..{vocab_size - 1}"
                )
    return plens


def scored_rows(
    lengths: Sequence[int], prompt_lengths: Sequence[int], width: int, alignment: str, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of a right-padded ``[B, width]`` batch, flattened, that score each response token.

    Returns ``(rows[N], cu_seqlens[B+1])`` (int64): sequence b's scored rows are
    ``rows[cu[b]:cu[b+1]]``, in token order.
    """
    shift = -ALIGNMENT[alignment].state_offset
    rows, cu = [], [0]
    for b, (n, p) in enumerate(zip(lengths, prompt_lengths)):
        start = b * width + p - shift
        rows.append(torch.arange(start, start + n - p))
        cu.append(cu[-1] + n - p)
    r = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
    return r.to(device), torch.tensor(cu, dtype=torch.long, device=device)


def pad_right(sequences: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids[B, T], attention_mask[B, T])`` right-padded: positions start at 0 for every row."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for b, s in enumerate(sequences):
        ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[b, : len(s)] = 1
    return ids.to(device), mask.to(device)


def pad_id_of(model: nn.Module) -> int:
    """A token id to pad with (masked out, so any valid id works)."""
    cfg = getattr(model, "config", None)
    generation_config = getattr(model, "generation_config", None)
    for cand in (getattr(cfg, "pad_token_id", None), getattr(generation_config, "pad_token_id", None)):
        if isinstance(cand, int):
            return cand
    return 0


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (longest first) to waste little padding."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def row_chunks(n: int, width: int) -> Iterator[slice]:
    step = max(1, _CHUNK_ELEMENTS // max(1, width))
    for a in range(0, n, step):
        yield slice(a, min(n, a + step))


# -- one forward over a batch, consuming scored rows ---------------------------------------
def forward_scored_rows(
    parts: DecoderParts,
    sequences: list[list[int]],
    prompt_lengths: list[int],
    alignment: str,
    indices: Sequence[int],
    feature: str,
    consume: Callable[[int, torch.Tensor, slice], None],
    pad_id: int = 0,
    on_final: Callable[[torch.Tensor, int], None] | None = None,
    prefix: int = 0,
) -> torch.Tensor:
    """One forward of the decoder stack over ``sequences`` (right-padded); for every selected
    state, ``consume(slot, rows, chunk)`` receives its scored rows ``[n, d]`` (model dtype; logits
    for the logit feature) chunk by chunk, where ``chunk`` locates them in the packed order.
    ``on_final(h, offset)``, when given, receives the final norm's output ``[B, T, d]`` of the same
    forward, whose column t is position ``offset + t`` (``T`` the longest sequence less
    ``offset``), for what else wants the last states (log-probs, say).

    ``prefix``: the first ``prefix`` tokens, the same in every sequence (the candidates of one
    prompt), run once and their keys and values repeated for each row, so the batch runs only
    what follows them (``offset = prefix``). They must end before the first scored state and the
    first predicted token: ``prefix < min(prompt_lengths)``. The states equal the full forward's
    up to the rounding of a different matmul shape.

    Returns ``cu_seqlens`` of the packed scored rows. No logits are computed beyond the scored
    rows of a logit-feature head, and no state outlives its layer.
    """
    device = parts.device
    cache = None
    if prefix:
        head = sequences[0][:prefix]
        if not 0 < prefix < min(prompt_lengths) or any(s[:prefix] != head for s in sequences):
            raise ValueError(
                f"a shared prefix of {prefix} tokens must be the same in every sequence and end before the "
                f"shortest prompt ({min(prompt_lengths)} tokens)"
            )
        with torch.no_grad():
            cache = parts.base(input_ids=torch.tensor([head], device=device), use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(sequences))
        sequences = [s[prefix:] for s in sequences]
        prompt_lengths = [p - prefix for p in prompt_lengths]
    ids, mask = pad_right(sequences, pad_id, device)
    rows, cu = scored_rows([len(s) for s in sequences], prompt_lengths, ids.shape[1], alignment, device)
    n = rows.numel()
    if prefix:
        mask = torch.cat([torch.ones((len(sequences), prefix), dtype=mask.dtype, device=device), mask], 1)

    rows_on = {rows.device: rows}  # a model split over devices: the row index on each layer's device

    def on_state(slot: int, h: torch.Tensor) -> None:
        if slot == len(indices):
            on_final(h, prefix)
            return
        if n == 0:
            return
        h2 = h.reshape(-1, h.shape[-1])
        here = rows_on.get(h2.device)
        if here is None:
            here = rows_on[h2.device] = rows.to(h2.device)
        width = parts.vocab_size if feature == "logits" else h2.shape[-1]
        for ch in row_chunks(n, width):
            x = h2.index_select(0, here[ch])
            if feature == "logits":
                x = parts.lm_head(x)
            consume(slot, x, ch)

    hooked = list(indices) + ([parts.num_layers] if on_final is not None else [])
    with torch.no_grad(), state_hooks(parts, hooked, on_state):
        if cache is None:
            parts.base(input_ids=ids, attention_mask=mask, use_cache=False)
        else:
            parts.base(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    return cu


def extract_features(
    model: nn.Module,
    sequences,
    prompt_lengths: Sequence[int],
    layers: Sequence[int] | str = "all",
    alignment: str = "predicting",
    feature: str = "hidden",
    dtype: torch.dtype | None = None,
    on_final: Callable[[torch.Tensor, int], None] | None = None,
    prefix: int = 0,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The states a head would read, for one batch, packed over scored tokens.

    Args:
        sequences: ``B`` token-id lists (prompt + response).
        prompt_lengths: where each response starts.
        layers: hidden-state indices (or ``"all"``, ``"lastN"``, ``"0,3"``); ignored for logits.
        on_final, prefix: see ``forward_scored_rows``.
    Returns:
        ``(states, cu_seqlens)``: ``k`` tensors ``[N, d]`` (the model's dtype unless ``dtype`` is
        given; ``[N, V]`` for logits) in the order of ``layers``, and int64 ``[B+1]``.
    """
    from ..rewards.head import resolve_layers

    parts = decoder_parts(model)
    seqs = as_token_lists(sequences)
    plens = check_spans(seqs, prompt_lengths, alignment, parts.vocab_size)
    if feature == "logits":
        layers = [LOGITS_LAYER]
    elif isinstance(layers, str) or layers is None:
        layers = resolve_layers(layers or "all", parts.num_layers)
    indices = state_indices(layers, feature, parts.num_layers)
    n = sum(len(s) - p for s, p in zip(seqs, plens))
    out: list[torch.Tensor | None] = [None] * len(indices)

    def consume(slot, x, ch):
        if out[slot] is None:
            out[slot] = torch.empty((n, x.shape[-1]), dtype=dtype or x.dtype, device=x.device)
        out[slot][ch] = x

    cu = forward_scored_rows(
        parts, seqs, plens, alignment, indices, feature, consume, pad_id_of(parts.model), on_final=on_final,
        prefix=prefix,
    )
    if n == 0:
        width = parts.vocab_size if feature == "logits" else parts.hidden_size
        dt = dtype or parts.lm_head.weight.dtype
        out = [torch.empty((0, width), dtype=dt, device=parts.device) for _ in indices]
    return out, cu
