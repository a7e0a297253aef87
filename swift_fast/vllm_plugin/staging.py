"""Worker side: persistent host -> device buffers for the small index arrays of each step.

The step's bookkeeping uploads a few index arrays (which token scores which request, which
rows SAR reads, a question-removed pass's positions and answer tokens). Building a fresh numpy
array and tensor for each, and copying from pageable memory, costs allocations and a staged,
effectively synchronous copy every step. A :class:`Staging` buffer is allocated once, at the
largest size a step can need (vLLM's ``CpuGpuBuffer`` pattern): the host side is pinned, filled
through a numpy view, and copied with ``non_blocking=True``. On the CPU the device side *is*
the host buffer: nothing is copied.

NOTE: a non-blocking copy reads the pinned buffer when the GPU reaches it, so the buffer must
not be rewritten before then. Each upload records an event; :meth:`Staging.host` waits for it
before handing the buffer out again. That event was recorded a whole step earlier (vLLM
synchronises on the step's sampled tokens, or, with async scheduling, on its own
``prepare_inputs_event``, in between), so the wait returns at once: it is the guard vLLM's
runner also keeps for its own pinned buffers, not a stall in the step.
"""

from __future__ import annotations

import numpy as np
import torch


class Staging:
    """One persistent 1-D buffer of ``size`` elements of ``dtype``, on the host and on ``device``."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device):
        device = torch.device(device)
        self.on_device = device.type != "cpu"
        pin = device.type == "cuda"
        self._host = torch.zeros(max(int(size), 1), dtype=dtype, pin_memory=pin)
        self._np = self._host.numpy()
        self._device = torch.empty_like(self._host, device=device) if self.on_device else self._host
        self._event = torch.cuda.Event() if pin else None
        self._pending = False

    def host(self) -> np.ndarray:
        """The host buffer to fill (numpy view), once the previous upload from it has been read."""
        if self._pending:
            self._event.synchronize()  # recorded a step ago: already complete (see the module notes)
            self._pending = False
        return self._np

    def upload(self, n: int) -> torch.Tensor:
        """The first ``n`` elements on the device (a view of the persistent device buffer)."""
        if not self.on_device:
            return self._host[:n]
        out = self._device[:n].copy_(self._host[:n], non_blocking=True)
        if self._event is not None:
            self._event.record()
            self._pending = True
        return out

    def tensors(self) -> list[torch.Tensor]:
        """What this buffer holds (for memory accounting)."""
        return [self._host] if not self.on_device else [self._host, self._device]
