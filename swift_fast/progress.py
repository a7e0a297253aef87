"""Progress of long work: one bar per phase on a terminal, one line per phase elsewhere.

A bar that redraws in place is right on a terminal; captured in a log or CI output, each redraw
becomes one more carriage-return update (tens of kilobytes for one run). :func:`phase` therefore
draws a tqdm bar when the stream is a terminal, and otherwise prints one line when the phase
ends, with the figures it reached.

:func:`vllm_progress` adapts a phase to vLLM's ``LLM.generate(use_tqdm=...)``, which accepts a
tqdm factory: vLLM reports each request as it finishes (``update(n)`` with its ``n``
candidates), so the phase counts candidates as they finish, not chunks of problems, and the
bars vLLM would draw itself ("Rendering prompts", "Processed prompts") never appear.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable


class _Line:
    """The non-terminal stand-in for a tqdm bar: counts, and prints one line at ``close``."""

    def __init__(self, total: int | None, desc: str, unit: str, file):
        self.total, self.desc, self.unit, self.file = total, desc, unit, file
        self.n = 0
        self.postfix: dict[str, Any] = {}
        self.t0 = time.perf_counter()
        self.closed = False

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, **kw) -> None:
        self.postfix.update(kw)

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        dt = time.perf_counter() - self.t0
        of = f"/{self.total}" if self.total is not None else ""
        rate = f", {self.n / dt:.1f} {self.unit}/s" if dt > 0 and self.n else ""
        extra = "".join(f", {k} {v}" for k, v in self.postfix.items())
        print(f"{self.desc}: {self.n}{of} {self.unit}s in {dt:.1f} s{rate}{extra}", file=self.file, flush=True)


def phase(desc: str, total: int | None = None, unit: str = "it", enabled: bool = True, file=None):
    """A progress bar for one phase of a job (``update``, ``set_postfix``, ``close``): tqdm on a
    terminal, one summary line otherwise, nothing when not ``enabled``."""
    file = file or sys.stderr
    if not enabled:
        from tqdm.auto import tqdm

        return tqdm(total=total, disable=True)
    if getattr(file, "isatty", lambda: False)():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=file, dynamic_ncols=True)
    return _Line(total, desc, unit, file)


class _VllmBar:
    """What vLLM's ``_run_engine`` reads and writes of a tqdm bar (``n``, ``postfix``,
    ``format_dict["elapsed"]``, ``update``, ``refresh``, ``close``), forwarding finished
    candidates to a phase's bar; vLLM's own speed postfix is dropped."""

    def __init__(self, outer):
        self.outer = outer
        self.n = 0
        self.postfix = ""
        self.t0 = time.perf_counter()

    @property
    def format_dict(self) -> dict:
        return {"elapsed": max(time.perf_counter() - self.t0, 1e-9)}

    def update(self, n: int = 1) -> None:
        self.n += n
        self.outer.update(n)

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


def vllm_progress(bar) -> Callable[..., Any]:
    """A ``use_tqdm`` value for vLLM's ``LLM.generate`` that counts finished candidates into
    ``bar`` (a :func:`phase`); vLLM's own prompt-rendering pass gets no bar."""

    def factory(iterable=None, *args, **kwargs):
        if iterable is not None:  # "Rendering prompts": a plain pass over the prompts
            return iterable
        return _VllmBar(bar)

    return factory
