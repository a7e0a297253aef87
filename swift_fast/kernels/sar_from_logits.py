"""Self-aligned reward straight from the two passes' logits, in one launch.

``sar_from_logits(logits_with_q[T, V], logits_without_q[T, V], targets[T], cu_seqlens[B+1]) -> [B]``:
row ``j`` of each logits tensor predicts ``targets[j]`` (the answer tokens, packed; segment ``b`` is
rows ``cu[b]:cu[b+1]``). Per answer, ``m_q`` and ``m_0`` are the mean target log-probs under
each pass and ``R_SA = clip(-expm1(m_0 - m_q), -1, 1)`` (SAR paper Eq. 8-9; the same value as
``(ppl(a) - ppl(a|q)) / ppl(a)``). An empty answer gives 0. NaN in a segment's rows gives NaN
for that answer only. Conventions of :mod:`.token_logprobs` apply (temperature, bad targets).

Triton path, one kernel launch (plus the memset of the output and counters):
  grid ``(T, SPLIT, 2)``: program ``(j, s, p)`` runs the online logsumexp over vocabulary slice
  ``s`` of row ``j`` of pass ``p`` and writes its partial (or, unsplit, the row's log-prob);
  then it counts itself done on its segment's counter. The program that completes a segment
  (the last of ``2 * SPLIT * len`` arrivals) reduces that segment's rows in a fixed order and
  writes ``R_SA``. Who finishes varies run to run, what is summed and in which order does not,
  so outputs are bit-identical. Rows outside ``[cu[0], cu[B])`` are never read.
``fused=False`` runs the same reduction as a second kernel instead of the counters.
"""

from __future__ import annotations

import torch

from ._dispatch import HAVE_TRITON, device_guard, native_module, next_pow2, resolve, row_major, same_device, tl, triton
from .swift_reduce import segment_sums
from .token_logprobs import BLOCK_V, NUM_STAGES, NUM_WARPS, check_inputs, choose_split, token_logprobs_reference

#: Rows of a segment reduced per iteration when its answer's SAR is combined.
BLOCK_R = 256

# ----------------------------------------------------------------------------------------------
# reference


def mean_logprob(token_logprobs: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Per-segment mean of ``token_logprobs[T]`` (float32 ``[B]``; 0 for an empty segment)."""
    cu = cu_seqlens.to(device=token_logprobs.device, dtype=torch.long)
    n = (cu[1:] - cu[:-1]).to(torch.float32)
    return segment_sums(token_logprobs.float(), cu) / n.clamp(min=1)


def sar_from_means(mean_with_question: torch.Tensor, mean_without_question: torch.Tensor) -> torch.Tensor:
    """``R_SA`` from the two per-answer mean log-probs.

    ``(ppl(a) - ppl(a|q)) / ppl(a) = 1 - exp(m0 - mq)``, computed with ``expm1`` so that large
    perplexities neither overflow nor cancel.
    """
    r = -torch.expm1(mean_without_question.float() - mean_with_question.float())
    return r.clamp(-1.0, 1.0)


def sar_reference(logp_with_q: torch.Tensor, logp_without_q: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``R_SA`` per segment from per-token log-probs (float32 ``[B]``; 0 for an empty segment)."""
    return sar_from_means(mean_logprob(logp_with_q, cu_seqlens), mean_logprob(logp_without_q, cu_seqlens))


def sar_from_logits_reference(logits_with_q, logits_without_q, targets, cu_seqlens, temperature: float = 1.0):
    """Materialising reference: two log-softmax passes, then :func:`sar_reference`."""
    lq = token_logprobs_reference(logits_with_q, targets, temperature=temperature)
    l0 = token_logprobs_reference(logits_without_q, targets, temperature=temperature)
    return sar_reference(lq, l0, cu_seqlens)


def _check(logits_with_q, logits_without_q, targets, cu_seqlens):
    check_inputs(logits_with_q, targets)
    if logits_without_q.shape != logits_with_q.shape:
        raise ValueError(
            f"both passes must score the same rows: {tuple(logits_with_q.shape)} vs {tuple(logits_without_q.shape)}"
        )
    same_device("sar_from_logits", logits_with_q=logits_with_q, logits_without_q=logits_without_q, targets=targets)
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or cu_seqlens.is_floating_point():
        raise ValueError("cu_seqlens must be a 1-D integer tensor [B+1]")
    if cu_seqlens.device.type == "cpu":
        cu = cu_seqlens.long()
        if cu.numel() > 1 and bool((cu[1:] < cu[:-1]).any()):
            raise ValueError("cu_seqlens must be non-decreasing")
        if int(cu[0]) < 0 or int(cu[-1]) > logits_with_q.shape[0]:
            raise ValueError(
                f"cu_seqlens spans rows {int(cu[0])}..{int(cu[-1])}, the logits have {logits_with_q.shape[0]}"
            )


# ----------------------------------------------------------------------------------------------
# Triton

if HAVE_TRITON:
    from .token_logprobs import combine_lse, online_lse, store_partial, target_logprob

    @triton.jit
    def expm1(x):
        """``exp(x) - 1`` accurate for small ``x`` (Kahan: ``(u - 1) * x / log(u)``)."""
        u = tl.exp(x)
        um1 = u - 1.0
        r = tl.where(um1 == 0.0, x, um1 * x / tl.log(tl.where(um1 == 0.0, 2.0, u)))
        r = tl.where(um1 == -1.0, -1.0, r)
        return tl.where(u == float("inf"), float("inf"), r)

    @triton.jit
    def _sar_segment(b, xq_ptr, sq, x0_ptr, s0, tgt_ptr, cu_ptr, part_ptr, lp_ptr, out_ptr, T, V, n_split, inv_temp,
                     SPLIT: tl.constexpr, BLOCK_R: tl.constexpr):
        bos = tl.load(cu_ptr + b).to(tl.int64)
        eos = tl.load(cu_ptr + b + 1).to(tl.int64)
        acc_q = tl.zeros([BLOCK_R], dtype=tl.float32)
        acc_0 = tl.zeros([BLOCK_R], dtype=tl.float32)
        for r0 in range(bos, eos, BLOCK_R):
            rows = r0 + tl.arange(0, BLOCK_R)
            mr = rows < eos
            if SPLIT == 1:
                # NOTE: .cg reads from L2: these values were written by other programs
                lq = tl.load(lp_ptr + rows, mask=mr, other=0.0, cache_modifier=".cg")
                l0 = tl.load(lp_ptr + T + rows, mask=mr, other=0.0, cache_modifier=".cg")
            else:
                mq, sq_, cq = combine_lse(part_ptr, rows, mr, n_split, SPLIT)
                m0, s0_, c0 = combine_lse(part_ptr + T * SPLIT * 3, rows, mr, n_split, SPLIT)
                lq = target_logprob(xq_ptr, sq, tgt_ptr, rows, rows, mr, mq, sq_, cq, V, inv_temp)
                l0 = target_logprob(x0_ptr, s0, tgt_ptr, rows, rows, mr, m0, s0_, c0, V, inv_temp)
            acc_q += tl.where(mr, lq, 0.0)
            acc_0 += tl.where(mr, l0, 0.0)
        n = tl.maximum(eos - bos, 1).to(tl.float32)
        r = -expm1(tl.sum(acc_0, axis=0) / n - tl.sum(acc_q, axis=0) / n)
        r = tl.where(r > 1.0, 1.0, tl.where(r < -1.0, -1.0, r))  # keeps NaN
        tl.store(out_ptr + b, r)

    @triton.jit
    def _sar_kernel(xq_ptr, sq, x0_ptr, s0, tgt_ptr, cu_ptr, part_ptr, lp_ptr, cnt_ptr, out_ptr,
                    T, V, B, V_PER_SPLIT, N_SPLIT, inv_temp,
                    SPLIT: tl.constexpr, LOG_STEPS: tl.constexpr, FUSED: tl.constexpr,
                    BLOCK_V: tl.constexpr, BLOCK_R: tl.constexpr, NUM_STAGES: tl.constexpr):
        row = tl.program_id(0)
        sp = tl.program_id(1)
        which = tl.program_id(2)
        first = tl.load(cu_ptr)
        last = tl.load(cu_ptr + B)
        if (row >= first) & (row < last):
            # segment of this row: the largest b with cu[b] <= row (empty segments share starts)
            lo = row * 0  # tensors from the start: the unrolled loop reassigns them
            hi = row * 0 + (B - 1)
            for _ in tl.static_range(LOG_STEPS):
                mid = (lo + hi + 1) // 2
                go = tl.load(cu_ptr + mid) <= row
                lo = tl.where(go, mid, lo)
                hi = tl.where(go, hi, mid - 1)
            b = lo
            rows = row + tl.arange(0, 1)
            rows64 = rows.to(tl.int64)
            mask_t = rows < T
            v_start = sp * V_PER_SPLIT
            v_stop = tl.minimum(v_start + V_PER_SPLIT, V)
            if which == 0:
                m, s, c, _z0, _z1 = online_lse(xq_ptr, sq, rows64, mask_t, v_start, v_stop, inv_temp, xq_ptr, 0,
                                            0, 1, BLOCK_V, NUM_STAGES)
            else:
                m, s, c, _z0, _z1 = online_lse(x0_ptr, s0, rows64, mask_t, v_start, v_stop, inv_temp, x0_ptr, 0,
                                            0, 1, BLOCK_V, NUM_STAGES)
            if SPLIT == 1:
                if which == 0:
                    lp = target_logprob(xq_ptr, sq, tgt_ptr, rows, rows64, mask_t, m, s, c, V, inv_temp)
                else:
                    lp = target_logprob(x0_ptr, s0, tgt_ptr, rows, rows64, mask_t, m, s, c, V, inv_temp)
                tl.store(lp_ptr + which * T + rows64, lp)
            else:
                store_partial(part_ptr + which * T * SPLIT * 3, rows64, sp, m, s, c, mask_t, SPLIT)
            if FUSED:
                # NOTE: every thread's stores must be issued before the release on the counter;
                # the program that sees the last arrival then reads them all (acquire).
                tl.debug_barrier()
                seg_len = tl.load(cu_ptr + b + 1) - tl.load(cu_ptr + b)
                done = tl.atomic_add(cnt_ptr + b, 1, sem="acq_rel", scope="gpu")
                if done == seg_len * N_SPLIT * 2 - 1:
                    tl.debug_barrier()
                    _sar_segment(b, xq_ptr, sq, x0_ptr, s0, tgt_ptr, cu_ptr, part_ptr, lp_ptr, out_ptr,
                                 T, V, N_SPLIT, inv_temp, SPLIT, BLOCK_R)

    @triton.jit
    def _sar_finish_kernel(xq_ptr, sq, x0_ptr, s0, tgt_ptr, cu_ptr, part_ptr, lp_ptr, out_ptr, T, V, n_split,
                           inv_temp, SPLIT: tl.constexpr, BLOCK_R: tl.constexpr):
        _sar_segment(tl.program_id(0), xq_ptr, sq, x0_ptr, s0, tgt_ptr, cu_ptr, part_ptr, lp_ptr, out_ptr,
                     T, V, n_split, inv_temp, SPLIT, BLOCK_R)


def sar_from_logits_triton(logits_with_q, logits_without_q, targets, cu_seqlens, temperature=1.0,
                           fused=True, split=None, block_v=None, num_warps=None, block_r=BLOCK_R):
    """The Triton path of :func:`sar_from_logits`. ``fused``: one launch (counters) or a second
    kernel for the per-answer reduction; ``split``, ``block_v``, ``num_warps``, ``block_r`` are
    launch settings (tests set them small so that every loop runs several tiles)."""
    _check(logits_with_q, logits_without_q, targets, cu_seqlens)
    xq, x0 = row_major(logits_with_q), row_major(logits_without_q)
    t, v = xq.shape
    dev = xq.device
    b = cu_seqlens.numel() - 1
    block_v = block_v or BLOCK_V
    if split is None:
        split = choose_split(2 * t, v, block_v, dev)
    v_per = triton.cdiv(triton.cdiv(v, split), block_v) * block_v
    split = max(1, triton.cdiv(v, v_per))
    split_p2 = next_pow2(split) if split > 1 else 1
    # output and counters in one zeroed buffer (float 0.0 and int 0 share their bits)
    zb = torch.zeros(2 * max(b, 1), dtype=torch.int32, device=dev)
    out = zb[:b].view(torch.float32)
    cnt = zb[max(b, 1) :]
    if b == 0:
        return out
    cu = cu_seqlens.to(device=dev)
    tg = targets
    if split == 1:
        part = out
        lp = torch.empty(2, t, dtype=torch.float32, device=dev)
    else:
        part = torch.empty(2, t, split_p2, 3, dtype=torch.float32, device=dev)
        lp = out
    inv_temp = 1.0 / temperature
    common = dict(xq_ptr=xq, sq=xq.stride(0), x0_ptr=x0, s0=x0.stride(0), tgt_ptr=tg, cu_ptr=cu, part_ptr=part,
                  lp_ptr=lp, out_ptr=out, T=t, V=v, inv_temp=inv_temp, SPLIT=split_p2, BLOCK_R=block_r)
    with device_guard(dev):
        if t > 0:
            _sar_kernel[(t, split, 2)](
                **common, cnt_ptr=cnt, B=b, V_PER_SPLIT=v_per, N_SPLIT=split,
                LOG_STEPS=max(1, int(b).bit_length()), FUSED=fused, BLOCK_V=block_v, NUM_STAGES=NUM_STAGES,
                num_warps=num_warps or NUM_WARPS,
            )
        if not fused or t == 0:
            _sar_finish_kernel[(b,)](**common, n_split=split)
    return out


def sar_from_logits(
    logits_with_q: torch.Tensor,
    logits_without_q: torch.Tensor,
    targets: torch.Tensor,
    cu_seqlens: torch.Tensor,
    temperature: float = 1.0,
    backend: str = "auto",
) -> torch.Tensor:
    """``R_SA`` per answer from both passes' logits: ``[B]`` float32 in ``[-1, 1]``.

    Args:
        logits_with_q: ``[T, V]``; row ``j`` is the distribution that predicts ``targets[j]``
            with the question in the prompt.
        logits_without_q: ``[T, V]``, the same answer tokens after the prompt without question.
        targets: int ``[T]`` answer token ids, answers packed.
        cu_seqlens: int ``[B+1]`` answer boundaries.
        backend: see :mod:`swift_fast.kernels._dispatch`.
    """
    _check(logits_with_q, logits_without_q, targets, cu_seqlens)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    which = resolve(backend, logits_with_q.device, "sar_from_logits", logits_with_q.dtype)
    if which == "triton":
        return sar_from_logits_triton(logits_with_q, logits_without_q, targets, cu_seqlens, temperature)
    if which == "native":
        nat = native_module()
        return nat.sar_from_logits(
            row_major(logits_with_q), row_major(logits_without_q), targets.long().contiguous(),
            cu_seqlens.long().contiguous(), float(temperature),
        )
    return sar_from_logits_reference(logits_with_q, logits_without_q, targets, cu_seqlens, temperature)
