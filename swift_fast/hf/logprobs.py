"""Log-probabilities of response tokens under a Hugging Face causal LM, without ``[T, V]`` logits.

The decoder stack runs without ``lm_head``; the final states of the positions that predict
response tokens are gathered and reduced to ``log P(token)`` by the fused kernel
(``swift_fast.kernels.token_logprobs_from_hidden``); any other LM head (a bias, another dtype than
the states, a LoRA or quantised wrapper) goes through its own forward in a chunked path that
holds at most one ``[chunk, V]`` block of logits.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..kernels.token_logprobs_from_hidden import token_logprobs_from_hidden
from .features import (
    as_token_lists,
    check_spans,
    decoder_parts,
    length_batches,
    pad_id_of,
    pad_right,
    row_chunks,
    scored_rows,
)


def logprobs_from_hidden(
    hidden: torch.Tensor, lm_head: nn.Module, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``log softmax(lm_head(hidden) / temperature)[targets]``: ``hidden [N, d]``, ``targets [N]``
    -> ``[N]`` float32."""
    # NOTE: the fused path reads ``lm_head.weight`` itself, so only a plain ``nn.Linear`` may take
    # it: a LoRA-wrapped or quantised head computes something else than ``hidden @ weight^T``.
    plain = isinstance(lm_head, nn.Linear) and type(lm_head).forward is nn.Linear.forward
    if plain and lm_head.bias is None and hidden.dtype == lm_head.weight.dtype:
        return token_logprobs_from_hidden(hidden, lm_head.weight, targets, temperature=temperature)
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    for ch in row_chunks(hidden.shape[0], lm_head.weight.shape[0]):
        logits = lm_head(hidden[ch]).float()
        if temperature != 1.0:
            logits = logits / temperature
        out[ch] = logits.gather(1, targets[ch, None]).squeeze(1) - torch.logsumexp(logits, dim=1)
    return out


def response_logprobs(
    model: nn.Module,
    sequences,
    prompt_lengths: Sequence[int],
    batch_size: int = 8,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log P(r_j | prefix)`` of every response token, packed.

    Args:
        sequences: ``B`` token-id lists (prompt + response); prompts need at least one token.
        prompt_lengths: where each response starts.
        temperature: divides the logits (1.0: the model's own distribution).
    Returns:
        ``(logprobs[T], cu_seqlens[B+1])``: float32 on the CPU; sequence b's tokens are
        ``logprobs[cu[b]:cu[b+1]]``.
    """
    parts = decoder_parts(model)
    seqs = as_token_lists(sequences)
    plens = check_spans(seqs, prompt_lengths, "predicting", parts.vocab_size)
    counts = [len(s) - p for s, p in zip(seqs, plens)]
    cu = torch.zeros(len(seqs) + 1, dtype=torch.long)
    cu[1:] = torch.tensor(counts, dtype=torch.long).cumsum(0)
    out = torch.zeros(int(cu[-1]), dtype=torch.float32)
    device = parts.device
    pad = pad_id_of(parts.model)
    for idx in length_batches([len(s) for s in seqs], batch_size):
        bseqs = [seqs[i] for i in idx]
        bplens = [plens[i] for i in idx]
        if sum(len(s) - p for s, p in zip(bseqs, bplens)) == 0:
            continue
        ids, mask = pad_right(bseqs, pad, device)
        rows, _ = scored_rows([len(s) for s in bseqs], bplens, ids.shape[1], "predicting", device)
        targets = ids.reshape(-1).index_select(0, rows + 1)
        with torch.no_grad():
            last = parts.base(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            h = last.reshape(-1, last.shape[-1]).index_select(0, rows)
            lp = logprobs_from_hidden(h, parts.lm_head, targets, temperature).cpu()
        a = 0
        for i, s, p in zip(idx, bseqs, bplens):
            m = len(s) - p
            out[int(cu[i]) : int(cu[i]) + m] = lp[a : a + m]
            a += m
    return out, cu
