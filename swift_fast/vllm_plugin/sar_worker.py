"""Worker side of SAR: the log-probs both of its perplexities need, reduced on the device.

With the question (the generation itself). A scored request that samples a token this step
reports ``log p(token) = x[token] - logsumexp(x)`` under the model's own distribution (no
temperature, penalties or processors: DESIGN 2), with ``x`` the step's logits before vLLM's
sampler and its structured-output mask touch them. Before sampling (:meth:`SarWorker.keep_rows`)
the fused ``logsumexp_rows`` reduces every row once (O(rows) memory); after sampling
(:meth:`SarWorker.sampled_logprobs`) the sampled token's logit is read from the same tensor.
That works because neither runner's sampler scales logits of another dtype in place: the V1
sampler starts with ``logits.to(float32)``, and MRv2's ``apply_sampling_params`` copies into a
new float32 tensor before any processor, temperature or min-p. What may still write into ``x``
only masks (the structured-output bitmask; MRv2's top-k/top-p when no other processing is
needed) and never touches the token that is then sampled.
NOTE: for float32 logits V1's ``.to(float32)`` is the same tensor, and its sampler divides it by
the temperature and applies penalties in place. Those rows are then copied before sampling into a
``[max_num_seqs, vocab]`` float32 buffer allocated with the plugin at model load, before vLLM
measures memory, so it is counted when the KV cache is sized (float32 models: typically the CPU).
MRv2 gets the same copy: one rule for both runners, and nothing rests on a sampler detail
that may change.

Without the question (a pass the front end submitted: prompt ``q0 + answer``,
``max_tokens=1``, prefix-cache reads off). Each prefill chunk computes some positions ``p`` of
that prompt; the state at ``p`` predicts token ``p + 1``, which is an answer token when
``p + 1 >= len(q0)``. The log-probs of those tokens are summed over the chunks on the device
(:class:`PassState`, kept on the pass's :class:`.runner.RequestInfo` and freed with it) and reported, with
their count, on the step that completes the prefill. The logits of the answer rows are made
``SAR_LOGIT_ROWS`` rows at a time, so a long answer never holds ``[answer, V]`` floats; vLLM's
profiling run (``profile_run``) is followed by one such chunk beside a full step's
logits (:meth:`SarWorker.profile`), so the peak they reach is measured before the KV cache is
sized.

Nothing here waits for the device: sums stay tensors until the step's values are copied to
the host with everything else, and the rows and tokens are uploaded through :mod:`.staging`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .staging import Staging
from .transport import COL

#: Rows of logits materialised at once for a question-removed pass (bounds its memory to
#: ``SAR_LOGIT_ROWS x vocabulary`` floats).
SAR_LOGIT_ROWS = 256


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[t, targets[t]]`` as float32 ``[T]``, by the fused kernel (no ``[T, V]``
    log-softmax is materialised)."""
    from ..kernels.token_logprobs import token_logprobs as fused

    return fused(logits, targets.long())


def logsumexp_rows(logits: torch.Tensor) -> torch.Tensor:
    """``logsumexp(logits[t])`` as float32 ``[T]``, by the fused reduction (one read, no ``[T, V]`` copy)."""
    from ..kernels.token_logprobs import logsumexp_rows as fused

    return fused(logits)


class SampledRows(NamedTuple):
    """What a step keeps before sampling to compute its sampled tokens' log-probs afterwards."""

    rows: torch.Tensor  # device LongTensor [k]: the scored rows
    copy: torch.Tensor | None  # [k, V] float32 copy of those rows (float32 logits only)
    logits: torch.Tensor | None  # the step's logits, which the sampler leaves as they are (other dtypes)
    lse: torch.Tensor | None  # [n] float32 logsumexp of every row of ``logits``


def sampled_rows(logits: torch.Tensor, rows: torch.Tensor, buffer: torch.Tensor | None = None) -> SampledRows:
    """What :meth:`SarWorker.sampled_logprobs` needs of ``rows`` (device LongTensor) of a step's
    ``logits`` ``[n, V]``, taken before vLLM's sampler runs: the rows' log-normalisers, or for float32
    logits (which the sampler edits in place) a copy of the rows into ``buffer`` (``[>= k, V]`` float32)."""
    if logits.dtype != torch.float32:
        return SampledRows(rows, None, logits, logsumexp_rows(logits))
    out = None if buffer is None else buffer[: rows.shape[0]]
    return SampledRows(rows, torch.index_select(logits, 0, rows, out=out), None, None)


class PassState:
    """A question-removed pass's running answer log-prob sum (a device scalar) and count."""

    __slots__ = ("total", "count", "next")

    def __init__(self, q0_len: int, device: torch.device):
        self.total = torch.zeros((), dtype=torch.float32, device=device)
        self.count = 0
        self.next = max(q0_len - 1, 0)  # first position whose state predicts an answer token


class SarWorker:
    """SAR's share of one model runner's step (``runner``: either of vLLM's model runners)."""

    def __init__(self, runner, max_tokens: int, max_reqs: int):
        self.runner = runner
        self.device = runner.device
        self.max_reqs = max_reqs
        self.rows = Staging(max_reqs, torch.int64, self.device)
        self.positions = Staging(max_tokens, torch.int64, self.device)
        self.targets = Staging(max_tokens, torch.int64, self.device)
        self.copy = None
        self.profiled = False
        if runner.model_config.dtype == torch.float32:
            vocab = runner.model_config.get_vocab_size()
            self.copy = torch.empty(max_reqs, vocab, dtype=torch.float32, device=self.device)

    # -- with the question --------------------------------------------------------------------
    def keep_rows(self, logits: torch.Tensor, rows: list[int]) -> SampledRows:
        """What :meth:`sampled_logprobs` needs of ``rows`` of the step's ``logits`` (``[n, V]``),
        taken before the sampler runs."""
        host = self.rows.host()
        host[: len(rows)] = rows
        dev_rows = self.rows.upload(len(rows))
        if logits.dtype == torch.float32 and (
            self.copy is None or self.copy.shape[1] != logits.shape[1] or self.copy.shape[0] < len(rows)
        ):
            # float32 logits the start-up did not foresee (another dtype configured): allocate now
            self.copy = torch.empty(max(len(rows), self.max_reqs), logits.shape[1], dtype=torch.float32,
                                    device=logits.device)
        return sampled_rows(logits, dev_rows, self.copy)

    @staticmethod
    def sampled_logprobs(values: torch.Tensor, kept: SampledRows, sampled: torch.Tensor):
        """Write ``log p`` of each kept row's sampled token (``sampled[:, 0]``) into ``values``."""
        rows = kept.rows
        tokens = sampled[:, 0].index_select(0, rows.to(sampled.device)).long()
        if kept.copy is not None:
            lp = token_logprobs(kept.copy, tokens)
        else:
            lp = kept.logits[rows, tokens].float() - kept.lse.index_select(0, rows)
        values[rows, COL.logp] = lp
        values[rows, COL.logp_tokens] = 1.0

    def profile(self, hidden: torch.Tensor) -> None:
        """During vLLM's memory profiling: the largest SAR work of a step, a question-removed pass's
        chunk of logits beside the step's own (``hidden``: the profiling run's final states)."""
        model = self.runner.model
        with torch.no_grad():
            step = model.compute_logits(torch.rand_like(hidden))
            if step.dtype != torch.float32:
                logsumexp_rows(step)
            h = torch.rand(SAR_LOGIT_ROWS, hidden.shape[-1], dtype=hidden.dtype, device=hidden.device)
            chunk = model.compute_logits(h)
            token_logprobs(chunk, torch.zeros(SAR_LOGIT_ROWS, dtype=torch.long, device=chunk.device))
            del step, chunk
        self.profiled = True

    # -- without the question -----------------------------------------------------------------
    def passes(self, hidden: torch.Tensor, values: torch.Tensor, rows: list[tuple[int, object, int, int, int]]) -> None:
        """Add the log-probs of the answer tokens this step's chunks predict, per pass.

        ``hidden``: the step's final states ``[T, d]``; ``rows``: ``(batch row i, the pass's
        :class:`.runner.RequestInfo`, first token of the row in the batch, end, tokens computed
        before this step)`` per pass. Writes the pass's running sum and count into ``values[i]``.
        """
        pos_np, tgt_np = self.positions.host(), self.targets.host()
        segments = []
        m = 0
        for i, info, start, end, computed in rows:
            state = info.sar_pass
            if state is None:
                state = info.sar_pass = PassState(info.q0_len, self.device)
            prompt = info.prompt_token_ids
            # positions p (state predicting token p + 1) this chunk computed and not yet counted
            lo = max(computed, state.next)
            hi = min(computed + (end - start), len(prompt) - 1)  # p + 1 must be a prompt token
            k = max(hi - lo, 0)
            if k:
                pos_np[m : m + k] = np.arange(start + lo - computed, start + hi - computed)
                tgt_np[m : m + k] = prompt[lo + 1 : hi + 1]
                state.count += k
                state.next = hi
            segments.append((i, state, m, m + k))
            m += k
        if m:
            idx, targets = self.positions.upload(m), self.targets.upload(m)
            lp = torch.empty(m, dtype=torch.float32, device=self.device)
            for c in range(0, m, SAR_LOGIT_ROWS):
                logits = self.runner.model.compute_logits(hidden.index_select(0, idx[c : c + SAR_LOGIT_ROWS]))
                lp[c : c + SAR_LOGIT_ROWS] = token_logprobs(logits, targets[c : c + SAR_LOGIT_ROWS])
        for i, state, a, b in segments:
            if b > a:
                state.total = state.total + lp[a:b].sum()
            values[i, COL.logp] = state.total
            values[i, COL.logp_tokens] = state.count

    def tensors(self) -> list[torch.Tensor]:
        out = self.rows.tensors() + self.positions.tensors() + self.targets.tensors()
        return out + ([self.copy] if self.copy is not None else [])
