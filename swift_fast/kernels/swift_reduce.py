"""SWIFT reduction: multi-layer 2-column projection, sigmoid gate and per-segment gated average.

Math (SWIFT paper Eq. 2-4, DESIGN 2): for scored token t, ``z_t = sum_l W_l h^l_t + b``;
with gate ``g_t = sigmoid(z_t[0])``, ``r_t = z_t[1]``; without gate ``g_t = 1``, ``r_t = z_t[0]``.
Per segment ``R = sum g r / max(sum g, 1e-8)``; an empty segment scores 0.

A ``(hidden, residual)`` pair stands for the residual stream ``hidden + residual`` summed in the
input dtype (what vLLM's fused add-RMSNorm and Hugging Face's decoder layers store), then
projected in float32.

State norm (``norm_eps``, a head's ``state_norm``): with ``norm_eps`` not None each layer's partial
projection is scaled by that token's ``rsqrt(mean_d(h^2) + norm_eps)`` for that layer before it is
added across layers: ``z_t = sum_l (W_l h^l_t) / rms(h^l_t) + b``, which is ``W'_l RMSNorm(h^l_t)``
for a weight ``W_l = g * W'_l`` with the norm's gain ``g`` folded in. ``h^2`` is summed in float32
from the state as stored (the rounded pair sum), in the same read as the dot products.

NaN policy: a NaN (or inf making NaN) in a scored token's state makes that segment's three
outputs NaN; other segments are unaffected, and tokens outside ``[cu[0], cu[-1])`` are never read.

Triton path (CUDA, or the interpreter):
  1. ``_project_kernel``: per block of tokens, loop over up to 4 layers and over ``d`` (tiles
     pipelined through shared memory), accumulate the 1-2 dot products in float32 (and, with the
     state norm, the sum of squares beside them, scaling each layer's dots at its end) and write
     (or add to) ``z[T, rows]``. Each layer is read exactly once; ``z`` costs 16 bytes a token per
     launch. Layers keep their own row stride.
  2. ``_segment_partials_kernel``: grid ``(B, SPLIT)``; program ``(b, s)`` sums ``g`` and ``g r``
     over the ``s``-th slice of segment ``b`` in a fixed order (varlen via ``cu_seqlens``,
     ``bos``/``eos``), so one huge segment is still spread over ``SPLIT`` programs.
  3. ``_segment_finish_kernel``: sums the ``SPLIT`` partials of each segment in a fixed order.
No float atomics anywhere: outputs are bit-identical run to run.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch

from ..definitions import GATE_EPS
from ._dispatch import HAVE_TRITON, device_guard, native_module, next_pow2, resolve, row_major, same_device, tl, triton
from ._tl import round_code

Layer = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]


# ----------------------------------------------------------------------------------------------
# reference


def _pair(layer: Layer) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    if isinstance(layer, (tuple, list)):
        if len(layer) != 2:
            raise ValueError("a layer pair must be (hidden, residual)")
        return layer[0], layer[1]
    return layer, None


def _stream(layer: Layer) -> torch.Tensor:
    """The residual stream of one layer, float32: ``hidden`` or ``hidden + residual`` (in the input dtype)."""
    hidden, residual = _pair(layer)
    if residual is None:
        return hidden.float()
    return (hidden + residual).float()


def check_norm_eps(norm_eps: Optional[float]) -> None:
    """``norm_eps`` is None or a finite float >= 0 (``ValueError`` otherwise)."""
    if norm_eps is not None and not (math.isfinite(norm_eps) and norm_eps >= 0):
        raise ValueError(f"norm_eps must be None or a finite float >= 0, got {norm_eps!r}")


def rms_scale(stream: torch.Tensor, norm_eps: float) -> torch.Tensor:
    """``rsqrt(mean(h^2) + norm_eps)`` per row of a float32 ``[T, d]`` state: ``[T, 1]`` float32.

    NOTE: ``norm_eps = 0`` and an all-zero row give ``inf`` (and ``0 * inf = NaN`` downstream),
    exactly what the RMSNorm itself computes for that row.
    """
    return torch.rsqrt(stream.square().mean(-1, keepdim=True) + norm_eps)


def project_reference(
    layers: Sequence[Layer], weight: torch.Tensor, bias: torch.Tensor, norm_eps: Optional[float] = None
) -> torch.Tensor:
    """``z = sum_l s_l * (h_l @ W_l^T) + b`` without concatenating the layers.

    Args:
        layers: ``k`` tensors ``[T, d]`` (any float dtype) or ``(hidden, residual)`` pairs.
        weight: ``[rows, k*d]`` (rows 2 with gate, 1 without).
        bias: ``[rows]``.
        norm_eps: ``None``: ``s_l = 1``; else ``s_l = rsqrt(mean(h_l^2) + norm_eps)`` per token
            (the state norm, see the module docstring).
    Returns:
        ``[T, rows]`` float32.
    """
    check_norm_eps(norm_eps)
    k = len(layers)
    if k == 0:
        raise ValueError("swift projection needs at least one layer")
    d = weight.shape[1] // k
    if d * k != weight.shape[1]:
        raise ValueError(f"weight has {weight.shape[1]} columns, not a multiple of {k} layers")
    w = weight.float()
    z = None
    for i, layer in enumerate(layers):
        h = _stream(layer)
        if h.shape[-1] != d:
            raise ValueError(f"layer {i} has width {h.shape[-1]}, the head expects {d}")
        part = h @ w[:, i * d : (i + 1) * d].T
        if norm_eps is not None:
            part = part * rms_scale(h, norm_eps)
        z = part if z is None else z + part
    return z + bias.float()


def gate_and_reward(z: torch.Tensor, gate: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """``[T, rows]`` projections -> ``(g[T], r[T])`` float32 (``g = 1`` without gate)."""
    if gate:
        return torch.sigmoid(z[:, 0]), z[:, 1]
    return torch.ones_like(z[:, 0]), z[:, 0]


def segment_sums(values: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Per-segment sums of ``values[T]`` over ``[cu[b], cu[b+1])``: ``[B]`` float32."""
    cu = cu_seqlens.to(device=values.device, dtype=torch.long)
    lengths = cu[1:] - cu[:-1]
    if (lengths < 0).any():
        raise ValueError("cu_seqlens must be non-decreasing")
    b = lengths.numel()
    seg = torch.repeat_interleave(torch.arange(b, device=values.device), lengths)
    start = int(cu[0]) if cu.numel() else 0
    vals = values[start : start + seg.numel()].float()
    return torch.zeros(b, dtype=torch.float32, device=values.device).index_add_(0, seg, vals)


def finish_scores(weighted_sum: torch.Tensor, gate_sum: torch.Tensor) -> torch.Tensor:
    """``R = sum g r / max(sum g, 1e-8)``; 0 where nothing was scored (both sums 0)."""
    return weighted_sum / torch.clamp(gate_sum, min=GATE_EPS)


def swift_reduce_reference(
    layers: Sequence[Layer],
    weight: torch.Tensor,
    bias: torch.Tensor,
    cu_seqlens: torch.Tensor,
    norm_eps: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference SWIFT reduction.

    Args:
        layers: ``k`` tensors ``[T, d]`` or ``(hidden, residual)`` pairs; bf16/fp16/fp32.
        weight: ``[2, k*d]`` (gate) or ``[1, k*d]`` (no gate), any float dtype.
        bias: ``[2]`` or ``[1]``.
        cu_seqlens: int ``[B+1]``, segment ``b`` is tokens ``cu[b]:cu[b+1]``.
        norm_eps: ``None``, or the state norm's epsilon (each layer's partial projection scaled
            by the token's ``rsqrt(mean(h^2) + norm_eps)`` for that layer).
    Returns:
        ``(score[B], gate_sum[B], weighted_sum[B])`` float32; without gate ``gate_sum`` counts tokens.
    """
    gate = weight.shape[0] == 2
    z = project_reference(layers, weight, bias, norm_eps)
    g, r = gate_and_reward(z, gate)
    gsum = segment_sums(g, cu_seqlens)
    wsum = segment_sums(g * r, cu_seqlens)
    return finish_scores(wsum, gsum), gsum, wsum


# ----------------------------------------------------------------------------------------------
# checks shared by the fast paths


def _check_devices(pairs, weight: torch.Tensor, bias: torch.Tensor) -> None:
    """Every state, residual, weight and bias on one device (``cu_seqlens`` may stay on the CPU)."""
    tensors = {"weight": weight, "bias": bias}
    for i, (h, r) in enumerate(pairs):
        tensors[f"layer {i}"] = h
        tensors[f"layer {i} residual"] = r
    same_device("swift_reduce", **tensors)


def check_inputs(layers: Sequence[Layer], weight: torch.Tensor, bias: torch.Tensor, cu_seqlens: torch.Tensor,
                 norm_eps: Optional[float] = None):
    """Validate shapes and ``norm_eps``; returns ``(pairs, T, d, rows)``."""
    check_norm_eps(norm_eps)
    if len(layers) == 0:
        raise ValueError("swift_reduce needs at least one layer")
    if weight.dim() != 2 or weight.shape[0] not in (1, 2):
        raise ValueError(f"weight must be [2, k*d] (gate) or [1, k*d], got {tuple(weight.shape)}")
    rows = weight.shape[0]
    if bias.numel() != rows:
        raise ValueError(f"bias has {bias.numel()} values, weight has {rows} rows")
    k = len(layers)
    d = weight.shape[1] // k
    if d * k != weight.shape[1]:
        raise ValueError(f"weight has {weight.shape[1]} columns, not a multiple of {k} layers")
    pairs = [_pair(layer) for layer in layers]
    _check_devices(pairs, weight, bias)
    t = pairs[0][0].shape[0]
    for i, (h, r) in enumerate(pairs):
        if h.dim() != 2 or h.shape != (t, d):
            raise ValueError(f"layer {i} is {tuple(h.shape)}; expected [T={t}, d={d}] like layer 0 and the head")
        if not h.is_floating_point():
            raise ValueError(f"layer {i} has dtype {h.dtype}; expected a float dtype")
        if r is not None and r.shape != h.shape:
            raise ValueError(f"layer {i}: residual {tuple(r.shape)} does not match hidden {tuple(h.shape)}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or cu_seqlens.is_floating_point():
        raise ValueError("cu_seqlens must be a 1-D integer tensor [B+1]")
    if cu_seqlens.device.type == "cpu":  # cheap to check without a device sync
        cu = cu_seqlens.long()
        if cu.numel() > 1 and bool((cu[1:] < cu[:-1]).any()):
            raise ValueError("cu_seqlens must be non-decreasing")
        if cu.numel() and (int(cu[0]) < 0 or int(cu[-1]) > t):
            raise ValueError(f"cu_seqlens spans tokens {int(cu[0])}..{int(cu[-1])}, the layers have {t}")
    return pairs, t, d, rows


# ----------------------------------------------------------------------------------------------
# Triton

#: Layers one launch reads; each adds a (hidden, residual) pointer pair and two strides.
LAYERS_PER_LAUNCH = 4
#: Defaults (register use and load pipelining checked by compiling for sm_90; timings by the
#: sweep in ``bench/gpu_check.sh``): 16 x 256 tiles, 8 warps, 3 tiles in flight, ~61 registers.
BLOCK_T, BLOCK_D, NUM_WARPS, NUM_STAGES = 16, 256, 8, 3
#: Tokens a segment program reads per loop iteration; segments per finishing program.
SEGMENT_BLOCK, SEGMENT_BLOCK_B = 1024, 64

if HAVE_TRITON:
    from ._tl import round_to

    @triton.jit
    def _layer_dot(acc0, acc1, h_ptr, r_ptr, stride_h, stride_r, w_ptr, stride_w, rows64, mask_t, D, norm_eps,
                   HAS_RES: tl.constexpr, ROUND: tl.constexpr, ROWS: tl.constexpr, NORM: tl.constexpr,
                   BLOCK_D: tl.constexpr, NUM_STAGES: tl.constexpr):
        if NORM:
            # this layer's dots are scaled by its own rms: they need accumulators of their own
            p0 = tl.zeros_like(acc0)
            p1 = tl.zeros_like(acc1)
            ss = tl.zeros_like(acc0)
        else:
            # NOTE: without the norm the dots add straight into the running sums, in exactly the
            # order heads without a state norm always had (their results stay bit-identical)
            p0 = acc0
            p1 = acc1
        # NOTE: tl.range with num_stages > 1 streams the tiles through shared memory (cp.async),
        # keeping several tiles in flight per program: this kernel is pure bandwidth.
        for d0 in tl.range(0, D, BLOCK_D, num_stages=NUM_STAGES):
            cols = d0 + tl.arange(0, BLOCK_D)
            mask_d = cols < D
            m = mask_t[:, None] & mask_d[None, :]
            # NOTE: bf16 is loaded and cast at once; the interpreter has no bf16 arithmetic.
            h = tl.load(h_ptr + rows64[:, None] * stride_h + cols[None, :], mask=m, other=0.0).to(tl.float32)
            if HAS_RES:
                r = tl.load(r_ptr + rows64[:, None] * stride_r + cols[None, :], mask=m, other=0.0).to(tl.float32)
                h = round_to(h + r, ROUND)
            # per-tile sums keep the accumulators at BLOCK_T values (registers -> occupancy)
            w0 = tl.load(w_ptr + cols, mask=mask_d, other=0.0)
            p0 += tl.sum(h * w0[None, :], axis=1)
            if ROWS == 2:
                w1 = tl.load(w_ptr + stride_w + cols, mask=mask_d, other=0.0)
                p1 += tl.sum(h * w1[None, :], axis=1)
            if NORM:
                ss += tl.sum(h * h, axis=1)  # masked columns loaded as 0 add nothing
        if NORM:
            # NOTE: masked rows (t >= T) have ss = 0: with norm_eps = 0 their scale is inf and
            # their dots NaN, never stored
            scale = tl.rsqrt(ss / D + norm_eps)
            acc0 += p0 * scale
            acc1 += p1 * scale
        else:
            acc0 = p0
            acc1 = p1
        return acc0, acc1

    # NOTE: T changes every step (decode batches, prefill chunks): not specialised, so a new
    # batch size never triggers a recompile (vLLM's own per-step kernels do the same).
    @triton.jit(do_not_specialize=["T"])
    def _project_kernel(
        z_ptr, stride_z, w_ptr, stride_w, T, D, norm_eps,
        h0, r0, sh0, sr0, h1, r1, sh1, sr1, h2, r2, sh2, sr2, h3, r3, sh3, sr3,
        NUM_LAYERS: tl.constexpr, HAS_RES: tl.constexpr, ROUND: tl.constexpr, ROWS: tl.constexpr,
        NORM: tl.constexpr, ACCUMULATE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
        NUM_STAGES: tl.constexpr,
    ):
        pid = tl.program_id(0)
        rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
        mask_t = rows < T
        rows64 = rows.to(tl.int64)  # NOTE: T * stride overflows int32 at a few million tokens
        z0 = tl.zeros([BLOCK_T], dtype=tl.float32)
        z1 = tl.zeros([BLOCK_T], dtype=tl.float32)
        z0, z1 = _layer_dot(z0, z1, h0, r0, sh0, sr0, w_ptr, stride_w, rows64, mask_t, D, norm_eps,
                            HAS_RES, ROUND, ROWS, NORM, BLOCK_D, NUM_STAGES)
        if NUM_LAYERS > 1:
            z0, z1 = _layer_dot(z0, z1, h1, r1, sh1, sr1, w_ptr + D, stride_w, rows64, mask_t, D, norm_eps,
                                HAS_RES, ROUND, ROWS, NORM, BLOCK_D, NUM_STAGES)
        if NUM_LAYERS > 2:
            z0, z1 = _layer_dot(z0, z1, h2, r2, sh2, sr2, w_ptr + 2 * D, stride_w, rows64, mask_t, D, norm_eps,
                                HAS_RES, ROUND, ROWS, NORM, BLOCK_D, NUM_STAGES)
        if NUM_LAYERS > 3:
            z0, z1 = _layer_dot(z0, z1, h3, r3, sh3, sr3, w_ptr + 3 * D, stride_w, rows64, mask_t, D, norm_eps,
                                HAS_RES, ROUND, ROWS, NORM, BLOCK_D, NUM_STAGES)
        if ACCUMULATE:
            z0 += tl.load(z_ptr + rows64 * stride_z, mask=mask_t, other=0.0)
        tl.store(z_ptr + rows64 * stride_z, z0, mask=mask_t)
        if ROWS == 2:
            if ACCUMULATE:
                z1 += tl.load(z_ptr + rows64 * stride_z + 1, mask=mask_t, other=0.0)
            tl.store(z_ptr + rows64 * stride_z + 1, z1, mask=mask_t)

    @triton.jit
    def _segment_partials_kernel(z_ptr, stride_z, bias_ptr, cu_ptr, part_ptr,
                                 SPLIT: tl.constexpr, GATE: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        s = tl.program_id(1)
        bos = tl.load(cu_ptr + b).to(tl.int64)
        eos = tl.load(cu_ptr + b + 1).to(tl.int64)
        # equal slices rounded up to whole blocks, so the block grid does not depend on s
        per = tl.cdiv(tl.cdiv(eos - bos, SPLIT), BLOCK) * BLOCK
        start = bos + s * per
        stop = tl.minimum(start + per, eos)
        b0 = tl.load(bias_ptr)
        if GATE:
            b1 = tl.load(bias_ptr + 1)
        acc_w = tl.zeros([BLOCK], dtype=tl.float32)
        acc_g = tl.zeros([BLOCK], dtype=tl.float32)
        for t0 in range(start, stop, BLOCK):
            t = t0 + tl.arange(0, BLOCK)
            m = t < stop
            z0 = tl.load(z_ptr + t * stride_z, mask=m, other=0.0) + b0
            if GATE:
                z1 = tl.load(z_ptr + t * stride_z + 1, mask=m, other=0.0) + b1
                g = tl.sigmoid(z0)
                gr = g * z1
            else:
                g = tl.full([BLOCK], 1.0, tl.float32)
                gr = z0
            # NOTE: where, not a multiply by the mask: 0 * NaN would leak nothing here, but
            # masked lanes must contribute exactly 0 for bit-stable sums.
            acc_g += tl.where(m, g, 0.0)
            acc_w += tl.where(m, gr, 0.0)
        out = part_ptr + (b * SPLIT + s) * 2
        tl.store(out, tl.sum(acc_w, axis=0))
        tl.store(out + 1, tl.sum(acc_g, axis=0))

    @triton.jit
    def _segment_finish_kernel(part_ptr, score_ptr, gsum_ptr, wsum_ptr, B, EPS,
                               SPLIT: tl.constexpr, BLOCK_B: tl.constexpr):
        bs = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
        mb = bs < B
        ss = tl.arange(0, SPLIT)
        base = part_ptr + (bs[:, None] * SPLIT + ss[None, :]) * 2
        w = tl.sum(tl.load(base, mask=mb[:, None], other=0.0), axis=1)
        g = tl.sum(tl.load(base + 1, mask=mb[:, None], other=0.0), axis=1)
        den = tl.where(g < EPS, EPS, g)  # keeps NaN, like torch.clamp
        tl.store(score_ptr + bs, w / den, mask=mb)
        tl.store(gsum_ptr + bs, g, mask=mb)
        tl.store(wsum_ptr + bs, w, mask=mb)


def project_triton(
    pairs: Sequence[Tuple[torch.Tensor, Optional[torch.Tensor]]],
    weight: torch.Tensor,
    z: torch.Tensor,
    accumulate: bool,
    block_t: int = BLOCK_T,
    block_d: int = BLOCK_D,
    num_warps: int = NUM_WARPS,
    num_stages: int = NUM_STAGES,
    norm_eps: Optional[float] = None,
) -> None:
    """``z[:T, :rows] (+)= sum_l s_l * (stream_l @ W_l^T)`` with the Triton kernel, in place.

    Args:
        pairs: ``(hidden[T, d], residual[T, d] or None)`` per layer; any row stride.
        weight: ``[rows, k*d]`` float32, contiguous.
        z: float32 ``[N >= T, >= rows]`` with unit column stride.
        accumulate: add to ``z`` (else the first launch overwrites it).
        norm_eps: ``None`` (``s_l = 1``) or the state norm's epsilon
            (``s_l = rsqrt(mean(stream_l^2) + norm_eps)`` per token).
    """
    t = pairs[0][0].shape[0]
    d = pairs[0][0].shape[1]
    rows = weight.shape[0]
    if t == 0:
        return
    grid = (triton.cdiv(t, block_t),)

    def kind(p):
        return p[0].dtype, None if p[1] is None else p[1].dtype

    i = 0
    first = True
    with device_guard(z.device):
        while i < len(pairs):
            h, r = pairs[i]
            # one launch reads up to LAYERS_PER_LAUNCH consecutive layers of one kind
            group = [pairs[i]]
            while (len(group) < LAYERS_PER_LAUNCH and i + len(group) < len(pairs)
                   and kind(pairs[i + len(group)]) == kind(pairs[i])):
                group.append(pairs[i + len(group)])
            layer_args = {}
            for j in range(LAYERS_PER_LAUNCH):
                # unused slots repeat the group's last layer: valid pointers, never read
                gh, gr = group[min(j, len(group) - 1)]
                gh = row_major(gh)
                gr = gh if gr is None else row_major(gr)
                layer_args.update({f"h{j}": gh, f"r{j}": gr, f"sh{j}": gh.stride(0), f"sr{j}": gr.stride(0)})
            has_res = r is not None
            rdt = torch.promote_types(h.dtype, r.dtype) if has_res else h.dtype
            _project_kernel[grid](
                z_ptr=z, stride_z=z.stride(0), w_ptr=weight[:, i * d :], stride_w=weight.stride(0), T=t, D=d,
                norm_eps=0.0 if norm_eps is None else float(norm_eps), **layer_args,
                NUM_LAYERS=len(group), HAS_RES=has_res, ROUND=round_code(rdt), ROWS=rows,
                NORM=norm_eps is not None, ACCUMULATE=accumulate or not first, BLOCK_T=block_t, BLOCK_D=block_d,
                NUM_STAGES=num_stages,
                num_warps=num_warps,
            )
            first = False
            i += len(group)


def _split_for(t: int, b: int) -> int:
    # enough programs per segment that one huge segment is not one long serial loop, few
    # enough that many short segments do not launch millions of idle programs
    return next_pow2(max(1, min(64, triton.cdiv(t, 8192), max(1, 65536 // max(b, 1)))))


def segment_reduce_triton(z: torch.Tensor, bias: torch.Tensor, cu_seqlens: torch.Tensor, gate: bool,
                          split: Optional[int] = None, block: int = SEGMENT_BLOCK, block_b: int = SEGMENT_BLOCK_B):
    """Stage 2-3: ``z[T, rows]`` (without bias) -> ``(score, gate_sum, weighted_sum)`` float32 ``[B]``.

    ``split`` (programs per segment, a power of two; default from the sizes), ``block`` (tokens a
    program reads per iteration) and ``block_b`` (segments per finishing program) are launch
    settings; tests set them small so that every loop runs several tiles.
    """
    b = cu_seqlens.numel() - 1
    dev = z.device
    out = torch.empty(3, b, dtype=torch.float32, device=dev)
    if b == 0:
        return out[0], out[1], out[2]
    split = split or _split_for(z.shape[0], b)
    part = torch.empty(b, split, 2, dtype=torch.float32, device=dev)
    cu = cu_seqlens.to(device=dev)
    with device_guard(dev):
        _segment_partials_kernel[(b, split)](
            z_ptr=z, stride_z=z.stride(0), bias_ptr=bias, cu_ptr=cu, part_ptr=part, SPLIT=split, GATE=gate, BLOCK=block,
        )
        _segment_finish_kernel[(triton.cdiv(b, block_b),)](
            part_ptr=part, score_ptr=out[0], gsum_ptr=out[1], wsum_ptr=out[2], B=b, EPS=GATE_EPS,
            SPLIT=split, BLOCK_B=block_b,
        )
    return out[0], out[1], out[2]


def swift_reduce_triton(layers, weight, bias, cu_seqlens, split=None, block=SEGMENT_BLOCK,
                        block_b=SEGMENT_BLOCK_B, norm_eps=None, **project_config):
    """The Triton path of :func:`swift_reduce`; ``project_config`` goes to :func:`project_triton`,
    the rest to :func:`segment_reduce_triton`."""
    pairs, t, d, rows = check_inputs(layers, weight, bias, cu_seqlens, norm_eps)
    w = weight.detach().to(torch.float32).contiguous()
    bvec = bias.detach().to(device=w.device, dtype=torch.float32).contiguous()
    # the first launch writes z, the next ones add to it
    z = torch.empty(t, rows, dtype=torch.float32, device=w.device) if t else torch.zeros(1, rows, device=w.device)
    project_triton(pairs, w, z, accumulate=False, norm_eps=norm_eps, **project_config)
    return segment_reduce_triton(z, bvec, cu_seqlens, rows == 2, split=split, block=block, block_b=block_b)


#: dtypes the native kernels read (others, float64 included, take the torch reference)
NATIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def native_fits(hidden: torch.Tensor, residual: Optional[torch.Tensor]) -> bool:
    """The native kernels take float32/bf16/fp16 with unit column stride and a residual of the hidden dtype."""
    return hidden.dtype in NATIVE_DTYPES and hidden.stride(-1) == 1 and (
        residual is None or (residual.dtype == hidden.dtype and residual.stride(-1) == 1)
    )


def swift_reduce_native(layers, weight, bias, cu_seqlens, norm_eps=None):
    """The native CPU path of :func:`swift_reduce` (the reference where the layouts do not fit)."""
    pairs, t, d, rows = check_inputs(layers, weight, bias, cu_seqlens, norm_eps)
    if not all(native_fits(h, r) for h, r in pairs):
        return swift_reduce_reference(layers, weight, bias, cu_seqlens, norm_eps)
    out = native_module().swift_reduce(
        [p[0] for p in pairs], [p[1] for p in pairs], weight.detach().float().contiguous(),
        bias.detach().float().contiguous(), cu_seqlens.long().contiguous(),
        -1.0 if norm_eps is None else float(norm_eps),  # the C++ side reads a negative eps as "no norm"
    )
    return tuple(out)


def swift_reduce(
    layers: Sequence[Layer],
    weight: torch.Tensor,
    bias: torch.Tensor,
    cu_seqlens: torch.Tensor,
    backend: str = "auto",
    norm_eps: Optional[float] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SWIFT reduction; see :func:`swift_reduce_reference` for shapes, dtypes and ``norm_eps``
    (a head's state norm: each layer's partial projection scaled by its rsqrt(mean(h^2) + eps)).

    ``backend``: see :mod:`swift_fast.kernels._dispatch`. The Triton path reads each layer
    once, never concatenates, and is deterministic (no float atomics).
    """
    if len(layers) == 0:
        raise ValueError("swift_reduce needs at least one layer")
    pairs = [_pair(layer) for layer in layers]
    first = pairs[0][0]
    paired = any(r is not None for _, r in pairs)
    which = resolve(backend, first.device, "swift_reduce", first.dtype, paired)
    if which == "triton":
        return swift_reduce_triton(layers, weight, bias, cu_seqlens, norm_eps=norm_eps)
    if which == "native":
        return swift_reduce_native(layers, weight, bias, cu_seqlens, norm_eps)
    _check_devices(pairs, weight, bias)  # the fast paths check in check_inputs
    return swift_reduce_reference(layers, weight, bias, cu_seqlens, norm_eps)
