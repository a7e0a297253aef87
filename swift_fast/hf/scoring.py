"""Offline SWIFT scores of Hugging Face models, with no hidden state stored.

Each selected state is projected onto the head's columns for it as soon as its layer has run
(forward hooks), into a float32 ``[N, 2]`` accumulator over the scored tokens; the states are
never concatenated or kept, so peak memory is that of a plain forward of the decoder stack
(less: no ``[B, T, V]`` logits are computed, and a logit-feature head computes logits for the
scored rows only, a chunk at a time). A model split over devices is projected layer by layer on
each layer's own device (:mod:`.projection`).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..kernels.streaming import finish_, scores_from_state
from ..rewards.head import SwiftHead
from .features import (
    as_token_lists,
    check_spans,
    decoder_parts,
    forward_scored_rows,
    length_batches,
    pad_id_of,
    state_indices,
)
from .projection import Projector


def check_head(model: nn.Module, head: SwiftHead) -> None:
    """Raise ``HeadError`` (naming head and model) if ``head`` cannot score ``model``."""
    config = decoder_parts(model).model.config  # unsupported architecture first: the more basic problem
    name = getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", None)
    head.check_model(config, name=name or None)


def swift_scores(
    model: nn.Module,
    head: SwiftHead,
    sequences,
    prompt_lengths: Sequence[int],
    batch_size: int = 8,
    progress: bool = False,
) -> torch.Tensor:
    """SWIFT score of each sequence's response under ``head``.

    Args:
        model: a Llama/Qwen2/Qwen3/Mistral ``...ForCausalLM`` (any dtype, any device).
        head: the SWIFT head; its ``layers``, ``alignment`` and ``feature`` decide what is read,
            its ``norm_eps`` (state norm) how each state is scaled.
        sequences: ``B`` full token-id lists (prompt + response, end-of-turn token included when
            it was generated); lists, tuples or 1-D tensors.
        prompt_lengths: ``B`` ints, where each response starts.
        batch_size: sequences per forward (grouped by length to limit padding).
    Returns:
        ``[B]`` float32 on the CPU, in input order. An empty response scores 0 (DESIGN 2).
    """
    parts = decoder_parts(model)
    check_head(model, head)
    seqs = as_token_lists(sequences)
    plens = check_spans(seqs, prompt_lengths, head.alignment, parts.vocab_size)
    indices = state_indices(head.layers, head.feature, parts.num_layers)
    device = parts.device
    projector = Projector(head.weight, head.hidden_size, device, head.norm_eps)
    bias = head.bias.detach().to(device, torch.float32)
    out = torch.zeros(len(seqs), dtype=torch.float32)
    batches = length_batches([len(s) for s in seqs], batch_size)
    bar = _bar(len(seqs), progress, "swift scores")
    pad = pad_id_of(parts.model)
    for idx in batches:
        bseqs = [seqs[i] for i in idx]
        bplens = [plens[i] for i in idx]
        n = sum(len(s) - p for s, p in zip(bseqs, bplens))
        accs = projector.new_accumulators()

        def consume(slot, x, ch, accs=accs, n=n):
            projector.project(accs, n, slot, x, ch)

        cu = forward_scored_rows(parts, bseqs, bplens, head.alignment, indices, head.feature, consume, pad)
        state = torch.zeros((len(idx), 3), dtype=torch.float32, device=device)
        if n:
            slots = torch.repeat_interleave(torch.arange(len(idx), device=device), cu[1:] - cu[:-1])
            finish_(projector.total(accs, n), bias, slots, state)
        out[torch.tensor(idx)] = scores_from_state(state).cpu()
        if bar is not None:
            bar.update(len(idx))
    if bar is not None:
        bar.close()
    return out


def _bar(total: int, progress: bool, desc: str):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="seq", dynamic_ncols=True)
