"""Worker side of SAR: the log-probs both of its perplexities need, reduced on the device.

With the question (the generation itself). A scored request that samples a token this step
reports ``log p(token)`` under the model's own distribution (no temperature, penalties or
processors: DESIGN 2). vLLM's sampler edits the logits in place, so the sampled rows' logits
are copied before it runs (:meth:`SarWorker.keep_rows`) and reduced by the fused
``token_logprobs`` once the token is known (:meth:`SarWorker.sampled_logprobs`).

Without the question (a pass the front end submitted: prompt ``q0 + answer``,
``max_tokens=1``, prefix-cache reads off). Each prefill chunk computes some positions ``p`` of
that prompt; the state at ``p`` predicts token ``p + 1``, which is an answer token when
``p + 1 >= len(q0)``. The log-probs of those tokens are summed over the chunks on the device
(:class:`PassState`, kept on vLLM's per-request state and freed with it) and reported, with
their count, on the step that completes the prefill. The logits of the answer rows are made
``SAR_LOGIT_ROWS`` rows at a time, so a long answer never holds ``[answer, V]`` floats.

Nothing here waits for the device: sums stay tensors until the step's values are copied to
the host with everything else, and the rows and tokens are uploaded through :mod:`.staging`.
"""

from __future__ import annotations

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


class PassState:
    """A question-removed pass's running answer log-prob sum (a device scalar) and count."""

    __slots__ = ("total", "count", "next")

    def __init__(self, q0_len: int, device: torch.device):
        self.total = torch.zeros((), dtype=torch.float32, device=device)
        self.count = 0
        self.next = max(q0_len - 1, 0)  # first position whose state predicts an answer token


class SarWorker:
    """SAR's share of one model runner's step (``runner``: vLLM's V1 model runner)."""

    def __init__(self, runner, max_tokens: int, max_reqs: int):
        self.runner = runner
        self.device = runner.device
        self.rows = Staging(max_reqs, torch.int64, self.device)
        self.positions = Staging(max_tokens, torch.int64, self.device)
        self.targets = Staging(max_tokens, torch.int64, self.device)

    # -- with the question --------------------------------------------------------------------
    def keep_rows(self, logits: torch.Tensor, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows on the device, a copy of those rows of logits)``, taken before the sampler
        edits the logits in place."""
        host = self.rows.host()
        host[: len(rows)] = rows
        dev_rows = self.rows.upload(len(rows))
        return dev_rows, logits.index_select(0, dev_rows)

    @staticmethod
    def sampled_logprobs(values: torch.Tensor, rows: torch.Tensor, logits: torch.Tensor, sampled: torch.Tensor):
        """Write ``log p`` of each row's sampled token (``sampled[:, 0]``) into ``values``."""
        tokens = sampled[:, 0].index_select(0, rows.to(sampled.device))
        values[rows, COL.logp] = token_logprobs(logits, tokens)
        values[rows, COL.logp_tokens] = 1.0

    # -- without the question -----------------------------------------------------------------
    def passes(self, st, values: torch.Tensor, rows: list[tuple[int, object, int, int, int, int]]) -> None:
        """Add the log-probs of the answer tokens this step's chunks predict, per pass.

        ``st``: vLLM's ``execute_model_state`` (``hidden_states`` of the step's tokens);
        ``rows``: ``(batch row i, CachedRequestState, q0_len, first token of the row in the
        batch, end, tokens computed before this step)`` per pass. Writes the pass's running
        sum and count into ``values[i]``.
        """
        pos_np, tgt_np = self.positions.host(), self.targets.host()
        segments = []
        m = 0
        for i, rs, q0_len, start, end, computed in rows:
            state = getattr(rs, "_swift_fast_pass", None)
            if state is None:
                state = rs._swift_fast_pass = PassState(q0_len, self.device)
            prompt = rs.prompt_token_ids
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
            hidden = st.hidden_states
            for c in range(0, m, SAR_LOGIT_ROWS):
                logits = self.runner.model.compute_logits(hidden.index_select(0, idx[c : c + SAR_LOGIT_ROWS]))
                lp[c : c + SAR_LOGIT_ROWS] = token_logprobs(logits, targets[c : c + SAR_LOGIT_ROWS])
        for i, state, a, b in segments:
            if b > a:
                state.total = state.total + lp[a:b].sum()
            values[i, COL.logp] = state.total
            values[i, COL.logp_tokens] = state.count

    def tensors(self) -> list[torch.Tensor]:
        return self.rows.tensors() + self.positions.tensors() + self.targets.tensors()
