"""Per-candidate intrinsic signals that need no head: the trivial Best-of-N selectors that SWIFT
is reported beside (generated length, mean token log-prob, DeepConf confidence).

For each candidate (prompt token ids ``p`` + response token ids ``r_1..r_m``, parity on token
ids, text never re-tokenised), one forward of the model's decoder stack per batch gives the
final states that *predict* each response token (position of ``r_{j-1}``, or of the last prompt
token for ``j = 1``: the distribution ``r_j`` was sampled from). They go through ``lm_head``
``row_chunks`` at a time, so at most one ``[chunk, V]`` block of float32 logits exists at once:

- ``log P(r_j)`` under the model's own distribution (no temperature), averaged per candidate;
- DeepConf's token confidence ``C_j`` (``swift_fast.rewards.confidence.token_confidence``, top ``k``),
  reduced per candidate to the lowest group and the tail over ``window`` tokens
  (``swift_fast.rewards.confidence.lowest_group`` / ``tail``).

A candidate without response tokens has ``num_tokens`` 0 and NaN for the other three (recorded
as ``None``, JSON ``null``, on rollout candidates): a missing value is never a plausible number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from ..data.rollouts import Problem
from ..rewards import confidence
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

#: the candidate fields :func:`record_signals` writes (read by ``swift_fast.reports.best_of_n``)
FIELDS = ("num_tokens", "mean_logprob", "conf_lowest", "conf_tail")


@dataclass
class Signals:
    """Signals of ``B`` candidates (all on the CPU).

    ``num_tokens`` int64 ``[B]``; ``mean_logprob``, ``conf_lowest``, ``conf_tail`` float64 ``[B]``
    (NaN for an empty response); ``token_logprobs`` and ``token_confidence`` float32 ``[T]``
    packed, candidate ``b``'s tokens at ``[cu_seqlens[b]:cu_seqlens[b+1]]`` (int64 ``[B+1]``);
    ``window`` and ``top_k`` the confidence settings used.
    """

    num_tokens: torch.Tensor
    mean_logprob: torch.Tensor
    conf_lowest: torch.Tensor
    conf_tail: torch.Tensor
    token_logprobs: torch.Tensor
    token_confidence: torch.Tensor
    cu_seqlens: torch.Tensor
    window: int
    top_k: int

    def fields(self, b: int) -> dict:
        """Candidate ``b``'s :data:`FIELDS` as JSON-ready numbers (``None`` where NaN)."""
        def num(x: float):
            return None if not math.isfinite(x) else float(x)

        return {
            "num_tokens": int(self.num_tokens[b]),
            "mean_logprob": num(float(self.mean_logprob[b])),
            "conf_lowest": num(float(self.conf_lowest[b])),
            "conf_tail": num(float(self.conf_tail[b])),
        }


def candidate_signals(
    model: nn.Module,
    sequences,
    prompt_lengths: Sequence[int],
    *,
    window: int,
    top_k: int = confidence.TOP_K,
    batch_size: int = 16,
) -> Signals:
    """Length, mean token log-prob and DeepConf confidences of every candidate.

    Args:
        model: a supported Hugging Face causal LM (``swift_fast.hf.decoder_parts``), in the mode
            the caller wants (``eval()`` for scoring); run under no grad here.
        sequences: ``B`` token-id lists (or 1-D tensors), prompt + response.
        prompt_lengths: where each response starts (a prompt needs at least one token).
        window: DeepConf's group size ``W`` in tokens (the lowest group and the tail); choose it
            for the answers' lengths (the paper's 2048 is for reasoning traces).
        top_k: tokens a token confidence averages (the paper's 20; capped at the vocabulary).
        batch_size: sequences per forward (grouped by length).
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive number of tokens, got {window!r}")
    parts = decoder_parts(model)
    seqs = as_token_lists(sequences)
    plens = check_spans(seqs, prompt_lengths, "predicting", parts.vocab_size)
    counts = [len(s) - p for s, p in zip(seqs, plens)]
    cu = torch.zeros(len(seqs) + 1, dtype=torch.long)
    cu[1:] = torch.tensor(counts, dtype=torch.long).cumsum(0)
    logp = torch.zeros(int(cu[-1]), dtype=torch.float32)
    conf = torch.zeros(int(cu[-1]), dtype=torch.float32)
    device = parts.device
    pad = pad_id_of(parts.model)
    vocab = parts.vocab_size
    for idx in length_batches([len(s) for s in seqs], batch_size):
        bseqs = [seqs[i] for i in idx]
        bplens = [plens[i] for i in idx]
        if sum(len(s) - p for s, p in zip(bseqs, bplens)) == 0:
            continue
        ids, mask = pad_right(bseqs, pad, device)
        rows, _ = scored_rows([len(s) for s in bseqs], bplens, ids.shape[1], "predicting", device)
        targets = ids.reshape(-1).index_select(0, rows + 1)
        lp = torch.empty(rows.numel(), dtype=torch.float32, device=device)
        cf = torch.empty(rows.numel(), dtype=torch.float32, device=device)
        with torch.no_grad():
            last = parts.base(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            h = last.reshape(-1, last.shape[-1]).index_select(0, rows)
            del last
            for ch in row_chunks(h.shape[0], vocab):
                logits = parts.lm_head(h[ch]).float()  # [chunk, V], dropped after this chunk
                lp[ch] = logits.gather(1, targets[ch, None]).squeeze(1) - torch.logsumexp(logits, dim=1)
                cf[ch] = confidence.token_confidence(logits, top_k)
        lp, cf = lp.cpu(), cf.cpu()
        a = 0
        for i, s, p in zip(idx, bseqs, bplens):
            m = len(s) - p
            logp[int(cu[i]) : int(cu[i]) + m] = lp[a : a + m]
            conf[int(cu[i]) : int(cu[i]) + m] = cf[a : a + m]
            a += m
    nan = float("nan")
    mean, lowest, tail_ = [], [], []
    for b in range(len(seqs)):
        a, e = int(cu[b]), int(cu[b + 1])
        c = conf[a:e].tolist()
        mean.append(logp[a:e].double().mean().item() if e > a else nan)
        lowest.append(confidence.lowest_group(c, window))
        tail_.append(confidence.tail(c, window))
    f64 = dict(dtype=torch.float64)
    return Signals(
        num_tokens=torch.tensor(counts, dtype=torch.long),
        mean_logprob=torch.tensor(mean, **f64),
        conf_lowest=torch.tensor(lowest, **f64),
        conf_tail=torch.tensor(tail_, **f64),
        token_logprobs=logp,
        token_confidence=conf,
        cu_seqlens=cu,
        window=window,
        top_k=min(int(top_k), vocab),
    )


def record_signals(
    model: nn.Module,
    problems: Sequence[Problem],
    *,
    window: int,
    top_k: int = confidence.TOP_K,
    batch_size: int = 16,
) -> Signals:
    """:func:`candidate_signals` of every candidate of ``problems`` (``prompt_token_ids`` +
    candidate ``token_ids``), written onto each candidate dict as :data:`FIELDS`. Returns the
    signals, candidates in problem order."""
    seqs, plens, slots = [], [], []
    for p in problems:
        if not p.prompt_token_ids:
            raise ValueError(f"problem {p.id!r} has no prompt_token_ids: the signals are computed on token ids")
        for i, c in enumerate(p.candidates):
            if "token_ids" not in c:
                raise ValueError(f"problem {p.id!r} candidate {i} has no token_ids")
            seqs.append(list(p.prompt_token_ids) + [int(t) for t in c["token_ids"]])
            plens.append(len(p.prompt_token_ids))
            slots.append(c)
    s = candidate_signals(model, seqs, plens, window=window, top_k=top_k, batch_size=batch_size)
    for b, c in enumerate(slots):
        c.update(s.fields(b))
    return s
