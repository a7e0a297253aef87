"""Per-token log-probs from final hidden states and the LM head, never holding ``[T, V]`` logits.

``token_logprobs_from_hidden(hidden[T, d], lm_head[V, d], targets[T]) -> [T]`` float32.
Rows are processed in chunks: each chunk's logits ``hidden_c @ lm_head^T`` are computed in the
hidden dtype (what the model's LM head produces), reduced by :func:`.token_logprobs.token_logprobs`
and dropped, so memory is ``O(chunk * V + T)``. Used for the second SAR pass on large vocabularies.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._dispatch import same_device
from .token_logprobs import token_logprobs, token_logprobs_reference

#: Bytes of logits one chunk may hold.
CHUNK_BYTES = 256 << 20


def token_logprobs_from_hidden_reference(hidden, lm_head, targets, temperature: float = 1.0):
    """Materialising reference: full ``[T, V]`` logits, then log-softmax and gather."""
    return token_logprobs_reference(hidden @ lm_head.T, targets, temperature=temperature)


def token_logprobs_from_hidden(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_rows: Optional[int] = None,
    backend: str = "auto",
) -> torch.Tensor:
    """``log P(targets[t])`` from ``softmax(hidden[t] @ lm_head^T / temperature)``: ``[T]`` float32.

    Args:
        hidden: ``[T, d]`` final hidden states (after the final norm), any float dtype.
        lm_head: ``[V, d]`` output embedding, same dtype as ``hidden``.
        targets: int ``[T]``.
        chunk_rows: rows per chunk; default keeps a chunk's logits under 256 MiB.
        backend: of the log-prob reduction (see :mod:`swift_fast.kernels._dispatch`).
    """
    if hidden.dim() != 2 or lm_head.dim() != 2 or hidden.shape[1] != lm_head.shape[1]:
        raise ValueError(
            f"hidden must be [T, d] and lm_head [V, d] with the same d, got {tuple(hidden.shape)} and "
            f"{tuple(lm_head.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be [T={hidden.shape[0]}], got {tuple(targets.shape)}")
    same_device("token_logprobs_from_hidden", hidden=hidden, lm_head=lm_head, targets=targets)
    if hidden.dtype != lm_head.dtype:
        raise ValueError(f"hidden is {hidden.dtype}, lm_head {lm_head.dtype}: cast one so they match")
    t, v = hidden.shape[0], lm_head.shape[0]
    if chunk_rows is None:
        chunk_rows = max(1, CHUNK_BYTES // max(1, v * hidden.element_size()))
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    out = torch.empty(t, dtype=torch.float32, device=hidden.device)
    for start in range(0, t, chunk_rows):
        stop = min(start + chunk_rows, t)
        logits = hidden[start:stop] @ lm_head.T
        out[start:stop] = token_logprobs(logits, targets[start:stop], temperature=temperature, backend=backend)
        del logits
    return out
