"""Per-token log-probabilities ``log softmax(logits)[t, targets[t]]`` without a ``[T, V]`` log-softmax.

``token_logprobs(logits[T, V], targets[T]) -> [T]`` float32; optionally, in the same read of the
logits, the logit-feature SWIFT projection ``z = logits @ W^T + b`` (``W`` of ``[rows, V]``,
paper 5.8). ``logsumexp_rows(logits[T, V]) -> [T]`` float32 is the same reduction without a
target: a row's log-normaliser, for callers that learn the target later (``x[t, target] - lse[t]``
is then its log-prob; the vLLM plugin reads the sampled token after vLLM's sampler ran).

Triton path: online logsumexp over vocabulary blocks (one pass, one ``exp`` per logit, running
state per lane so the loop has no cross-thread reduction), float32 whatever the logits dtype.
When there are few rows, the vocabulary of each row is split over ``SPLIT`` programs that write
``(max, sum exp, ties)`` partials, and a second small kernel combines them in a fixed order, so
64 rows of a 256k vocabulary still fill the GPU. Memory: O(T * SPLIT).

Conventions (all paths):
- ``temperature``: log-probs of ``softmax(logits / temperature)``; the projection uses raw logits.
- a target outside ``[0, V)`` (e.g. an ignore index of -100) gives NaN for that row; nothing
  outside the row is read.
- NaN anywhere in a row gives NaN for that row only; a ``-inf`` logit is a zero probability
  (its target log-prob is ``-inf``); a row of all ``-inf`` is NaN (as ``torch.log_softmax``).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ._dispatch import HAVE_TRITON, device_guard, native_module, next_pow2, resolve, row_major, same_device, tl, triton

# ----------------------------------------------------------------------------------------------
# reference


def token_logprobs_reference(
    logits: torch.Tensor,
    targets: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    temperature: float = 1.0,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Materialising reference: ``log_softmax(logits.float() / temperature).gather(targets)``.

    Returns ``[T]`` float32, or ``([T], z[T, rows])`` when ``weight`` is given.
    """
    x = logits.float()
    lsm = torch.log_softmax(x / temperature if temperature != 1.0 else x, dim=-1)
    v = logits.shape[-1]
    tg = targets.long()
    valid = (tg >= 0) & (tg < v)
    lp = lsm.gather(-1, torch.where(valid, tg, 0)[:, None]).squeeze(-1)
    lp = torch.where(valid, lp, torch.full_like(lp, float("nan")))
    if weight is None:
        return lp
    z = x @ weight.float().T
    if bias is not None:
        z = z + bias.float()
    return lp, z


def check_inputs(logits: torch.Tensor, targets: torch.Tensor, weight: Optional[torch.Tensor] = None):
    if logits.dim() != 2:
        raise ValueError(
            f"logits must be [T, V], got {tuple(logits.shape)}; flatten batch and sequence first "
            "(logits.flatten(0, -2))"
        )
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a float tensor, got {logits.dtype}")
    if targets.shape != logits.shape[:1] or targets.is_floating_point():
        raise ValueError(
            f"targets must be integer [T={logits.shape[0]}], got {targets.dtype} {tuple(targets.shape)}"
        )
    same_device("token_logprobs", logits=logits, targets=targets, weight=weight)
    if weight is not None and (
        weight.dim() != 2 or weight.shape[0] not in (1, 2) or weight.shape[1] != logits.shape[1]
    ):
        raise ValueError(f"weight must be [rows in (1, 2), V={logits.shape[1]}], got {tuple(weight.shape)}")


# ----------------------------------------------------------------------------------------------
# Triton

#: Defaults (checked by compiling for sm_90: 16-byte loads, cp.async pipelining, ~64 registers);
#: ``bench/gpu_check.sh`` sweeps alternatives on the paper shape.
BLOCK_V, NUM_WARPS, NUM_STAGES = 4096, 8, 3
PROJ_BLOCK_T, PROJ_BLOCK_V = 8, 512
#: Rows per program of the kernel that combines a split row's partials.
COMBINE_BLOCK_T = 64
#: Aim for this many programs per SM before splitting rows over the vocabulary.
PROGRAMS_PER_SM = 8

if HAVE_TRITON:
    _NEG = tl.constexpr(-3.4028234663852886e38)  # -FLT_MAX

    @triton.jit
    def log1p(x):
        """``log(1 + x)`` accurate for small ``x`` (Kahan: ``log(u) * x / (u - 1)``, ``u = 1 + x``)."""
        u = 1.0 + x
        return tl.where(u == 1.0, x, tl.log(u) * (x / tl.where(u == 1.0, 1.0, u - 1.0)))

    @triton.jit
    def online_lse(x_ptr, stride_x, rows64, mask_t, v_start, v_stop, inv_temp, w_ptr, stride_w,
                   PROJ_ROWS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr,
                   NUM_STAGES: tl.constexpr):
        """Online logsumexp of ``x * inv_temp`` over ``[v_start, v_stop)`` for ``BLOCK_T`` rows.

        Returns ``(m, s, c, z0, z1)`` with ``logsumexp = m + log1p(s + c - 1)``: ``m`` the max,
        ``s`` the sum of ``exp(x - m)`` over every logit but one copy of the max (``c = 1``);
        and the projection partials ``sum x * W[j]``.

        Every lane keeps its own running ``(max, sum)``, so the loop body has one ``exp`` a
        logit and no cross-thread reduction; lanes are combined once at the end. With
        ``d = -|x - m|``: a logit below the lane max adds ``exp(d)``; one above it rescales
        the sum by ``exp(d)`` and becomes the max.
        NOTE: the lane's own max is kept out of its sum (``s`` counts the others), so
        ``log1p`` keeps near-certain tokens' log-probs (~ -1e-7) exact in float32, where
        ``log(1 + s)`` would round ``1 + s``.
        NOTE: lanes start at -FLT_MAX, not -inf: ``-inf - -inf`` would be NaN.
        """
        m = tl.full([BLOCK_T, BLOCK_V], _NEG, tl.float32)
        s = tl.zeros([BLOCK_T, BLOCK_V], dtype=tl.float32)
        p0 = tl.zeros([BLOCK_T], dtype=tl.float32)
        p1 = tl.zeros([BLOCK_T], dtype=tl.float32)
        # NOTE: num_stages > 1 streams the tiles through shared memory (cp.async): several tiles
        # in flight per program, which a one-read bandwidth kernel needs
        for v0 in tl.range(v_start, v_stop, BLOCK_V, num_stages=NUM_STAGES):
            cols = v0 + tl.arange(0, BLOCK_V)
            mv = cols < v_stop
            mask = mask_t[:, None] & mv[None, :]
            # NOTE: bf16 is loaded and cast at once; the interpreter has no bf16 arithmetic.
            raw = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=float("-inf"))
            x = raw.to(tl.float32) * inv_temp
            e = tl.exp(-tl.abs(x - m))
            s = tl.where(x > m, s * e + e, s + e)
            m = tl.maximum(m, x)
            if PROJ_ROWS > 0:
                # per-tile sums: [BLOCK_T] accumulators, not [BLOCK_T, BLOCK_V] (registers)
                xr = tl.where(mask, raw.to(tl.float32), 0.0)
                p0 += tl.sum(xr * tl.load(w_ptr + cols, mask=mv, other=0.0)[None, :], axis=1)
                if PROJ_ROWS > 1:
                    p1 += tl.sum(xr * tl.load(w_ptr + stride_w + cols, mask=mv, other=0.0)[None, :], axis=1)
        mm = tl.max(m, axis=1)
        top = m == mm[:, None]
        # lanes below the row max: their max and sum rescaled; ties with it count 1 each
        s_all = tl.sum(tl.where(top, s, (s + 1.0) * tl.exp(m - mm[:, None])), axis=1)
        s_all += tl.sum(tl.where(top, 1.0, 0.0), axis=1) - 1.0
        mm = tl.where(mm == _NEG, float("-inf"), mm)  # nothing but -inf seen
        c = tl.full([BLOCK_T], 1.0, tl.float32)
        return mm, s_all, c, p0, p1

    @triton.jit
    def target_logprob(x_ptr, stride_x, tgt_ptr, rows, rows64, mask_t, m, s, c, V, inv_temp):
        """``(x[t, target] * inv_temp - m) - log1p(s + c - 1)`` from a row's online state.

        NOTE: the max is subtracted before the log: ``x - (m + log(..))`` would round a
        near-certain token's log-prob to 0. NaN for a target outside ``[0, V)``.
        """
        tg = tl.load(tgt_ptr + rows, mask=mask_t, other=-1).to(tl.int64)
        ok = mask_t & (tg >= 0) & (tg < V)
        xt = tl.load(x_ptr + rows64 * stride_x + tg, mask=ok, other=0.0).to(tl.float32) * inv_temp
        return tl.where(ok, (xt - m) - log1p(s + (c - 1.0)), float("nan"))

    @triton.jit
    def row_lse(m, s, c):
        """A row's logsumexp from its online state (NaN for a row of all ``-inf``, as ``torch.logsumexp``
        gives ``-inf`` there but every log-prob of such a row is NaN)."""
        r = m + log1p(s + (c - 1.0))
        return tl.where(r == float("-inf"), float("nan"), r)

    @triton.jit
    def store_partial(part_ptr, rows64, sp, m, s, c, mask_t, SPLIT: tl.constexpr):
        off = (rows64 * SPLIT + sp) * 3
        tl.store(part_ptr + off, m, mask=mask_t)
        tl.store(part_ptr + off + 1, s, mask=mask_t)
        tl.store(part_ptr + off + 2, c, mask=mask_t)

    @triton.jit
    def combine_lse(part_ptr, rows64, mask_t, n_split, SPLIT: tl.constexpr):
        """A row's ``(m, s, c)`` from its ``n_split`` partials (``[rows, SPLIT, 3]``, ``SPLIT`` the
        next power of two), in a fixed order."""
        ss = tl.arange(0, SPLIT)
        offs = (rows64[:, None] * SPLIT + ss[None, :]) * 3
        mk = mask_t[:, None] & (ss < n_split)[None, :]
        # NOTE: .cg (L2) reads: the partials come from other programs, possibly of the same launch
        m = tl.load(part_ptr + offs, mask=mk, other=float("-inf"), cache_modifier=".cg")
        s = tl.load(part_ptr + offs + 1, mask=mk, other=0.0, cache_modifier=".cg")
        c = tl.load(part_ptr + offs + 2, mask=mk, other=0.0, cache_modifier=".cg")
        mm = tl.max(m, axis=1)
        mm_safe = tl.where(mm == float("-inf"), 0.0, mm)
        below = m < mm[:, None]
        s_all = tl.sum(tl.where(below, (s + c) * tl.exp(m - mm_safe[:, None]), s), axis=1)
        c_all = tl.sum(tl.where(below, 0.0, c), axis=1)
        return mm, s_all, c_all

    # NOTE: T is not specialised: the plugin calls this every step with that step's row count.
    @triton.jit(do_not_specialize=["T"])
    def _logprob_kernel(x_ptr, stride_x, tgt_ptr, out_ptr, part_ptr, w_ptr, stride_w, z_ptr,
                        T, V, V_PER_SPLIT, inv_temp,
                        SPLIT: tl.constexpr, PROJ_ROWS: tl.constexpr, LSE: tl.constexpr,
                        BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, NUM_STAGES: tl.constexpr):
        pid = tl.program_id(0)
        sp = tl.program_id(1)
        rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
        mask_t = rows < T
        rows64 = rows.to(tl.int64)
        v_start = sp * V_PER_SPLIT
        v_stop = tl.minimum(v_start + V_PER_SPLIT, V)
        m, s, c, z0, z1 = online_lse(x_ptr, stride_x, rows64, mask_t, v_start, v_stop, inv_temp, w_ptr, stride_w,
                                     PROJ_ROWS, BLOCK_T, BLOCK_V, NUM_STAGES)
        if SPLIT == 1:
            if LSE:
                lp = row_lse(m, s, c)
            else:
                lp = target_logprob(x_ptr, stride_x, tgt_ptr, rows, rows64, mask_t, m, s, c, V, inv_temp)
            tl.store(out_ptr + rows, lp, mask=mask_t)
        else:
            store_partial(part_ptr, rows64, sp, m, s, c, mask_t, SPLIT)
        if PROJ_ROWS > 0:
            # projection partials [T, SPLIT, PROJ_ROWS]; summed in order by the caller
            zo = z_ptr + (rows64 * SPLIT + sp) * PROJ_ROWS
            tl.store(zo, z0, mask=mask_t)
            if PROJ_ROWS > 1:
                tl.store(zo + 1, z1, mask=mask_t)

    @triton.jit(do_not_specialize=["T"])
    def _combine_kernel(x_ptr, stride_x, tgt_ptr, out_ptr, part_ptr, T, V, n_split, inv_temp,
                        SPLIT: tl.constexpr, LSE: tl.constexpr, BLOCK_T: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        mask_t = rows < T
        rows64 = rows.to(tl.int64)
        m, s, c = combine_lse(part_ptr, rows64, mask_t, n_split, SPLIT)
        if LSE:
            lp = row_lse(m, s, c)
        else:
            lp = target_logprob(x_ptr, stride_x, tgt_ptr, rows, rows64, mask_t, m, s, c, V, inv_temp)
        tl.store(out_ptr + rows, lp, mask=mask_t)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def choose_split(n_row_programs: int, v: int, block_v: int, device: torch.device) -> int:
    """Vocabulary splits per row so that ``rows x splits`` fills the device (power of two)."""
    want = PROGRAMS_PER_SM * _sm_count(device)
    if n_row_programs >= want:
        return 1
    split = next_pow2(triton.cdiv(want, max(n_row_programs, 1)))
    # at least one whole block a split
    return max(1, min(split, triton.cdiv(v, block_v), 256))


def token_logprobs_triton(logits, targets, weight=None, bias=None, temperature=1.0, split=None,
                          block_v=None, num_warps=None, num_stages=NUM_STAGES):
    """``targets=None``: each row's logsumexp instead of a target's log-prob (:func:`logsumexp_rows`)."""
    if targets is not None:
        check_inputs(logits, targets, weight)
    lse = targets is None
    x = row_major(logits)
    t, v = x.shape
    dev = x.device
    out = torch.empty(t, dtype=torch.float32, device=dev)
    proj = 0 if weight is None else weight.shape[0]
    w = x if weight is None else weight.to(device=dev, dtype=torch.float32).contiguous()
    block_t = 1 if proj == 0 else PROJ_BLOCK_T
    block_v = block_v or (BLOCK_V if proj == 0 else PROJ_BLOCK_V)
    num_warps = num_warps or NUM_WARPS
    n_rp = triton.cdiv(t, block_t)
    if split is None:
        split = choose_split(n_rp, v, block_v, dev)
    v_per = triton.cdiv(triton.cdiv(v, split), block_v) * block_v
    split = triton.cdiv(v, v_per) if v > 0 else 1  # no empty trailing split
    split_p2 = next_pow2(split)
    z = torch.empty(t, split_p2, proj, dtype=torch.float32, device=dev) if proj else out  # not written when 0
    if t > 0:
        if split == 1:
            part = out
        else:
            part = torch.empty(t, split_p2, 3, dtype=torch.float32, device=dev)
            if proj:
                z.zero_()
        with device_guard(dev):
            # never read in LSE mode; an int64 pointer keeps the kernel's one compiled specialisation
            tgt = torch.empty(1, dtype=torch.int64, device=dev) if lse else targets
            _logprob_kernel[(n_rp, split)](
                x_ptr=x, stride_x=x.stride(0), tgt_ptr=tgt, out_ptr=out, part_ptr=part, w_ptr=w,
                stride_w=w.stride(0), z_ptr=z, T=t, V=v, V_PER_SPLIT=v_per, inv_temp=1.0 / temperature,
                SPLIT=split_p2 if split > 1 else 1, PROJ_ROWS=proj, LSE=lse, BLOCK_T=block_t, BLOCK_V=block_v,
                NUM_STAGES=num_stages, num_warps=num_warps,
            )
            if split > 1:
                _combine_kernel[(triton.cdiv(t, COMBINE_BLOCK_T),)](
                    x_ptr=x, stride_x=x.stride(0), tgt_ptr=tgt, out_ptr=out, part_ptr=part, T=t, V=v,
                    n_split=split, inv_temp=1.0 / temperature, SPLIT=split_p2, LSE=lse, BLOCK_T=COMBINE_BLOCK_T,
                )
    if weight is None:
        return out
    zz = z.sum(dim=1) if split > 1 else z[:, 0]
    if bias is not None:
        zz = zz + bias.to(device=dev, dtype=torch.float32)
    return out, zz


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    temperature: float = 1.0,
    backend: str = "auto",
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """``log P(targets[t])`` under ``softmax(logits[t] / temperature)``: ``[T]`` float32.

    Args:
        logits: ``[T, V]`` bf16/fp16/fp32, any row stride (unit column stride, or it is copied).
        targets: int ``[T]``.
        weight, bias: optional logit-feature head (``[rows, V]``, ``[rows]``); then returns
            ``(logprobs[T], z[T, rows])`` with ``z = logits @ weight^T + bias`` from the same read.
        backend: see :mod:`swift_fast.kernels._dispatch`.
    """
    check_inputs(logits, targets, weight)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    which = resolve(backend, logits.device, "token_logprobs", logits.dtype)
    if which == "triton":
        return token_logprobs_triton(logits, targets, weight, bias, temperature)
    if which == "native" and weight is None:
        return native_module().token_logprobs(row_major(logits), targets.long().contiguous(), float(temperature))
    return token_logprobs_reference(logits, targets, weight, bias, temperature)


def logsumexp_rows_reference(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Materialising reference: ``torch.logsumexp(logits.float() / temperature, -1)`` (NaN for a row of
    all ``-inf``, where every log-prob of the row is NaN)."""
    x = logits.float()
    out = torch.logsumexp(x / temperature if temperature != 1.0 else x, dim=-1)
    return torch.where(torch.isneginf(out), float("nan"), out)


def logsumexp_rows(logits: torch.Tensor, temperature: float = 1.0, backend: str = "auto") -> torch.Tensor:
    """``logsumexp(logits[t] / temperature)`` per row: ``[T]`` float32, one read of the logits and O(T)
    memory on the Triton path (the reduction of :func:`token_logprobs`); ``x[t, j] / temperature - out[t]``
    is then the log-prob of any token ``j``.

    Args:
        logits: ``[T, V]`` bf16/fp16/fp32, any row stride.
        backend: see :mod:`swift_fast.kernels._dispatch` (no native CPU kernel: the reference there).
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [T, V], got shape {tuple(logits.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    which = resolve(backend, logits.device, "token_logprobs", logits.dtype)
    if which == "triton":
        return token_logprobs_triton(logits, None, temperature=temperature)
    return logsumexp_rows_reference(logits, temperature)
