"""Projecting a head's states when they live on different devices.

A model split over devices (``device_map="auto"``, pipeline-style placement) produces each
layer's state on that layer's device, and the fused ops refuse inputs from two devices (a kernel
launched with another device's pointers reads the wrong memory). So each state is projected on
its own device, with the head's columns for it copied there once, into an accumulator on that
device; the accumulators are added on one device, the *home* (the LM head's), only when the
scores are finished. With every state on one device this is one accumulator and no copy: what
the single-device path always did.

Shapes: the head's ``weight`` is ``[rows, k*d]`` (rows 2 with gate, 1 without), slot ``i`` (the
i-th selected state) owns columns ``i*d:(i+1)*d``; accumulators are float32 ``[n, 2]``.

A head with a state norm (``norm_eps``) has every row of every state projected as
``(x @ W_i^T) * rsqrt(mean(x^2) + norm_eps)``, the rms taken per row in float32: rows may be
split into chunks of whole rows, never of columns.
"""

from __future__ import annotations

import torch

from ..kernels.streaming import project_layer_
from ..kernels.swift_reduce import rms_scale


class Projector:
    """The head's weight split by state and by device, and per-device accumulators.

    Args:
        weight: ``[rows, k*d]`` float (any device); columns of slot ``i`` are ``i*d:(i+1)*d``.
        d: the width of one state.
        home: the device where accumulators are added up and scores finished.
        norm_eps: the head's state norm (``SwiftHead.norm_eps``); None: none.
    """

    def __init__(self, weight: torch.Tensor, d: int, home: torch.device, norm_eps: float | None = None):
        self.d = d
        self.home = torch.device(home)
        self.norm_eps = norm_eps
        self._weight = weight.detach().to(self.home, torch.float32)
        self._columns: dict[tuple[int, torch.device], torch.Tensor] = {}
        self._transposed: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}

    def columns(self, slot: int, device: torch.device) -> torch.Tensor:
        """``[rows, d]`` float32 contiguous columns of ``slot`` on ``device`` (copied once)."""
        key = (slot, device)
        w = self._columns.get(key)
        if w is None:
            w = self._weight[:, slot * self.d : (slot + 1) * self.d].to(device).contiguous()
            self._columns[key] = w
        return w

    # -- streaming into accumulators ----------------------------------------------------------
    def new_accumulators(self) -> dict:
        """Empty per-device accumulators (filled by :meth:`project`)."""
        return {}

    def project(self, accs: dict, n: int, slot: int, x: torch.Tensor, rows: slice | None = None) -> None:
        """Add ``x[m, d] @ columns(slot)^T`` (scaled per row by the state norm, if any) into rows
        ``rows`` (all ``n`` when None) of the accumulator on ``x``'s device (created zeroed,
        ``[n, 2]``, on first use)."""
        acc = accs.get(x.device)
        if acc is None:
            acc = accs[x.device] = torch.zeros((max(n, 1), 2), dtype=torch.float32, device=x.device)
        project_layer_(acc if rows is None else acc[rows], x, None, self.columns(slot, x.device), self.norm_eps)

    def total(self, accs: dict, n: int) -> torch.Tensor:
        """The accumulators added on the home device: float32 ``[n, 2]`` (zeros when empty)."""
        out = accs.get(self.home)
        for device, acc in accs.items():
            if device != self.home:
                out = acc.to(self.home) if out is None else out + acc.to(self.home)
        if out is None:
            out = torch.zeros((max(n, 1), 2), dtype=torch.float32, device=self.home)
        return out

    # -- one matmul per device ----------------------------------------------------------------
    def project_rows(self, rows: list[torch.Tensor]) -> torch.Tensor:
        """``sum_i rows[i] @ columns(i)^T`` for one row per slot (``[B, d]`` each, any devices):
        the rows of each device are concatenated and multiplied at once on that device, then the
        per-device results are added on the home device. With the state norm each row is first
        divided by its rms (float32), which is the same product. Returns float32 ``[B, rows_of_head]``."""
        if self.norm_eps is not None:
            rows = [x.float() * rms_scale(x.float(), self.norm_eps) for x in rows]
        by_device: dict[torch.device, list[int]] = {}
        for slot, x in enumerate(rows):
            by_device.setdefault(x.device, []).append(slot)
        out = None
        for device, slots in by_device.items():
            xs = rows[slots[0]] if len(slots) == 1 else torch.cat([rows[s] for s in slots], dim=-1)
            part = torch.mm(xs.float(), self._transposed_columns(tuple(slots), device))
            part = part.to(self.home)
            out = part if out is None else out + part
        return out

    def _transposed_columns(self, slots: tuple[int, ...], device: torch.device) -> torch.Tensor:
        key = (slots, device)
        wt = self._transposed.get(key)
        if wt is None:
            wt = torch.cat([self.columns(s, device) for s in slots], dim=1).T.contiguous()
            self._transposed[key] = wt
        return wt
