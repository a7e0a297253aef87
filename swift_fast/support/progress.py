"""Progress of long work: one bar per phase on a terminal, one line per phase elsewhere.

A bar that redraws in place is right on a terminal; captured in a log or CI output, each redraw
becomes one more carriage-return update (tens of kilobytes for one run). :func:`phase` therefore
draws a tqdm bar when the stream is a terminal, and otherwise prints whole lines: one when the
phase ends, with the figures it reached, and while it runs one each time another tenth of the
total is done or ``HEARTBEAT_S`` seconds have passed since the last line, with the count, the
rate and an estimate of the time left. The time-based line comes from a timer thread, so a phase
whose counter does not move (vLLM reports a request only when all its candidates are done) still
says it is alive; a phase that ends within ``HEARTBEAT_S`` prints only its closing line.

:func:`vllm_progress` adapts a phase to vLLM's ``LLM.generate(use_tqdm=...)``, which accepts a
tqdm factory: vLLM reports each request as it finishes (``update(n)`` with its ``n``
candidates), so the phase counts candidates as they finish, not chunks of problems, and the
bars vLLM would draw itself ("Rendering prompts", "Processed prompts") never appear.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

#: most seconds between two lines of a running phase off a terminal
HEARTBEAT_S = 30.0


def _duration(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _plural(unit: str) -> str:
    return unit + ("es" if unit.endswith(("s", "sh", "ch", "x")) else "s")


class _Line:
    """The non-terminal stand-in for a tqdm bar: counts, prints a line at each tenth of the total
    and at least every ``heartbeat`` seconds while it runs, and one line at ``close``."""

    def __init__(self, total: int | None, desc: str, unit: str, file, heartbeat: float = HEARTBEAT_S,
                 tenths: bool = True):
        self.total, self.desc, self.unit, self.file = total, desc, unit, file
        self.tenths = tenths
        self.n = 0
        self.postfix: dict[str, Any] = {}
        self.t0 = time.perf_counter()
        self.closed = False
        self._lock = threading.Lock()
        self._last = self.t0
        self._tenth = 0
        self._stop = threading.Event()
        self.heartbeat = heartbeat
        self._timer = None
        if heartbeat and heartbeat > 0:
            self._timer = threading.Thread(target=self._beat, name="swift-fast-progress", daemon=True)
            self._timer.start()

    def _beat(self) -> None:
        while not self._stop.wait(min(self.heartbeat, max(0.05, self._last + self.heartbeat - time.perf_counter()))):
            with self._lock:
                if not self.closed and time.perf_counter() - self._last >= self.heartbeat:
                    self._running_line()

    def _running_line(self) -> None:
        now = time.perf_counter()
        self._last = now
        dt = now - self.t0
        of = f"/{self.total}" if self.total is not None else ""
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = _rate(self.n, dt, self.unit)
        if self.total and self.n and self.n < self.total:
            left = f", about {_duration((self.total - self.n) * dt / self.n)} left"
        elif self.total and not self.n:
            left = ", no estimate yet"
        else:
            left = ""
        print(f"{self.desc}: {self.n}{of} {_plural(self.unit)}{pct} after {_duration(dt)}{rate}{left}",
              file=self.file, flush=True)

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.n += n
            if self.tenths and self.total and not self.closed:
                tenth = min(10, 10 * self.n // self.total)
                if tenth > self._tenth:
                    self._tenth = tenth
                    if self.n < self.total:  # the closing line reports the last tenth
                        self._running_line()

    def set_postfix(self, refresh: bool = True, **kw) -> None:
        self.postfix.update(kw)

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._stop.set()
        dt = time.perf_counter() - self.t0
        of = f"/{self.total}" if self.total is not None else ""
        rate = _rate(self.n, dt, self.unit)
        extra = "".join(f", {k} {v}" for k, v in self.postfix.items())
        print(f"{self.desc}: {self.n}{of} {_plural(self.unit)} in {dt:.1f} s{rate}{extra}", file=self.file, flush=True)


def _rate(n: int, dt: float, unit: str) -> str:
    """``", 14.4 candidate/s"``: three significant digits however slow the work (0.135 fit/s)."""
    if dt <= 0 or not n:
        return ""
    v = n / dt
    if v < 1:
        return f", {v:.3g} {unit}/s"
    return f", {v:.{0 if v >= 100 else 1 if v >= 10 else 2}f} {unit}/s"


def phase(desc: str, total: int | None = None, unit: str = "it", enabled: bool = True, file=None,
          heartbeat: float = HEARTBEAT_S, tenths: bool = True, leave: bool = True):
    """A progress bar for one phase of a job (``update``, ``set_postfix``, ``close``): tqdm on a
    terminal; otherwise whole lines, one per tenth of ``total`` (unless not ``tenths``), one at
    least every ``heartbeat`` seconds (0: none) and a summary at the end; nothing when not
    ``enabled``. ``leave``: a terminal bar stays on screen when closed."""
    file = file or sys.stderr
    if not enabled:
        from tqdm.auto import tqdm

        return tqdm(total=total, disable=True)
    if getattr(file, "isatty", lambda: False)():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=file, dynamic_ncols=True, leave=leave)
    return _Line(total, desc, unit, file, heartbeat=heartbeat, tenths=tenths)


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
