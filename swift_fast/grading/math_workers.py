"""Math grading in persistent worker processes, each answer under a deadline.

math-verify bounds its own work with ``signal.alarm``, which works only on the main thread of
the main interpreter, so :mod:`swift_fast.grading.math_judge` turns those timeouts off and
:mod:`swift_fast.grading` grades math answers here instead: a few persistent worker
processes, started with ``subprocess`` rather than ``multiprocessing`` (so grading also works
inside daemonic ``multiprocessing`` workers, which may not have children, and from any
thread). A result later than ``timeout`` seconds counts as wrong (no answer), and its worker
is killed and replaced.

Kept apart from :mod:`swift_fast.grading` because importing it registers process-wide fork and
exit handlers (a forked child forgets its parent's workers; exit stops them): only code that
grades math with a deadline imports it. It judges with :mod:`swift_fast.grading.math_judge` and never
imports :mod:`swift_fast.grading`.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .math_judge import Judgement, default_workers, judge_safe, math_verify_setup, parse_pred

STARTUP_TIMEOUT = 120.0  # a worker imports sympy and math-verify (about a second) before its first answer
CHUNK = 32  # answers handed to a worker at a time; small enough to balance workers, large enough to pipeline


def serve() -> None:
    """Worker process main loop: one JSON request per stdin line, one JSON result per stdout line."""
    proto = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints from libraries go to stderr, never into the protocol stream
    sys.stdout = sys.stderr
    ppid = os.getppid()

    def watch_parent():
        # A parent killed with SIGKILL cannot stop its workers; they notice and leave.
        while os.getppid() == ppid:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    math_verify_setup()
    parse_pred("\\boxed{\\frac{1}{2}}")  # first parse builds math-verify's regexes and antlr parser
    proto.write(b'"ready"\n')
    proto.flush()
    for line in sys.stdin.buffer:
        op, response, reference = json.loads(line)
        j = judge_safe(op, response, reference)
        proto.write(json.dumps([j.status, j.correct, j.answer]).encode() + b"\n")
        proto.flush()


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from swift_fast.grading.math_workers import serve; serve()"


class _WorkerFailed(RuntimeError):
    pass


class _Worker:
    """One worker process, used by one thread at a time."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, _ROOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            # Own session: Ctrl-C in a terminal goes to the caller, which then stops its workers.
            start_new_session=True,
        )
        self.rfd = self.proc.stdout.fileno()
        self.wfd = self.proc.stdin.fileno()
        os.set_blocking(self.rfd, False)
        os.set_blocking(self.wfd, False)
        self.buf = b""
        self.ready = False

    def exchange(self, requests: list[bytes], timeout: float) -> tuple[list[list], str | None]:
        """Send the requests and read their results in order.

        Returns the results received and None, or the results received before a failure and
        "timeout" (the next result was more than ``timeout`` seconds late) or "crash". Raises
        ``_WorkerFailed`` when the worker never became ready.
        """
        data = memoryview(b"".join(requests))
        sent = 0
        got: list[list] = []
        sel = selectors.DefaultSelector()
        sel.register(self.rfd, selectors.EVENT_READ)
        if len(data):
            sel.register(self.wfd, selectors.EVENT_WRITE)
        deadline = time.monotonic() + (timeout if self.ready else STARTUP_TIMEOUT)
        try:
            while len(got) < len(requests):
                wait = deadline - time.monotonic()
                if wait <= 0:
                    if not self.ready:
                        raise _WorkerFailed(f"the math grading worker did not start within {STARTUP_TIMEOUT:.0f}s")
                    return got, "timeout"
                for key, _ in sel.select(wait):
                    if key.fd == self.wfd:
                        try:
                            sent += os.write(self.wfd, data[sent : sent + (1 << 16)])
                        except BlockingIOError:
                            continue
                        except (BrokenPipeError, OSError):
                            return self._died(got)
                        if sent == len(data):
                            sel.unregister(self.wfd)
                        continue
                    try:
                        chunk = os.read(self.rfd, 1 << 16)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        return self._died(got)
                    lines = (self.buf + chunk).split(b"\n")
                    self.buf = lines.pop()
                    for ln in lines:
                        if self.ready:
                            got.append(json.loads(ln))
                        else:
                            self.ready = True
                        deadline = time.monotonic() + timeout
        finally:
            sel.close()
        return got, None

    def _died(self, got):
        if not self.ready:
            code = self.proc.wait()
            raise _WorkerFailed(
                f"the math grading worker exited during start-up (exit code {code}); its error is above. "
                "Check that math-verify imports: python -c 'import math_verify'"
            )
        return got, "crash"

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class _Pool:
    """Persistent workers of this process; threads check one out, use it, and give it back."""

    def __init__(self):
        self.pid = os.getpid()
        self.cond = threading.Condition()
        self.idle: list[_Worker] = []
        self.live: set[_Worker] = set()

    def acquire(self, limit: int) -> _Worker:
        with self.cond:
            while not self.idle and len(self.live) >= limit:
                self.cond.wait()
            if self.idle:
                return self.idle.pop()
            h = _Worker()
            self.live.add(h)
            return h

    def release(self, h: _Worker) -> None:
        with self.cond:
            if h.proc.poll() is None and h in self.live:
                self.idle.append(h)
            else:
                self._drop(h)
            self.cond.notify()

    def discard(self, h: _Worker) -> None:
        with self.cond:
            self._drop(h)
            self.cond.notify()

    def replace(self, h: _Worker) -> _Worker:
        with self.cond:
            self._drop(h)
            new = _Worker()
            self.live.add(new)
            return new

    def _drop(self, h: _Worker) -> None:
        self.live.discard(h)
        h.kill()

    def shutdown(self) -> None:
        with self.cond:
            for h in list(self.live):
                self._drop(h)
            self.idle.clear()
            self.cond.notify_all()


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> _Pool:
    global _POOL
    p = _POOL
    if p is None or p.pid != os.getpid():
        with _POOL_LOCK:
            if _POOL is None or _POOL.pid != os.getpid():
                _POOL = _Pool()
            p = _POOL
    return p


def _after_fork_in_child() -> None:
    # The parent's workers belong to the parent: forget them (closing our copies of their pipes)
    # and start fresh ones on demand.
    global _POOL, _POOL_LOCK
    p, _POOL, _POOL_LOCK = _POOL, None, threading.Lock()
    if p is not None:
        for h in p.live:
            for f in (h.proc.stdin, h.proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass


def warm_up(n: int) -> None:
    """Start ``n`` workers now (each takes about a second to import sympy and math-verify)."""
    p = pool()
    got = [p.acquire(n) for _ in range(n)]
    for w in got:
        p.release(w)


def shutdown() -> None:
    """Stop this process's workers (also run at exit)."""
    p = _POOL
    if p is not None and p.pid == os.getpid():
        p.shutdown()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(shutdown)


def run(op: str, items: list[tuple[str, str | None]], timeout: float, workers: int) -> list[Judgement]:
    """Judge ``items`` (``(response, reference)``) with ``op`` on up to ``workers`` workers, each
    answer within ``timeout`` seconds; results in input order."""
    requests = [json.dumps([op, r, ref]).encode() + b"\n" for r, ref in items]
    results: list[Judgement | None] = [None] * len(items)
    chunks = iter(range(0, len(items), CHUNK))
    lock = threading.Lock()
    workers_pool = pool()
    limit = max(workers, default_workers())

    def drive():
        h = workers_pool.acquire(limit)
        clean = False
        try:
            while True:
                with lock:
                    start = next(chunks, None)
                if start is None:
                    clean = True
                    return
                idx = list(range(start, min(start + CHUNK, len(items))))
                while idx:
                    got, failure = h.exchange([requests[i] for i in idx], timeout)
                    for i, (status, correct, answer) in zip(idx, got):
                        results[i] = Judgement(bool(correct), answer, status)
                    if failure is None:
                        break
                    # The answer in progress is the one that failed: it gets its verdict and the
                    # rest of the chunk goes to a fresh worker.
                    results[idx[len(got)]] = Judgement(False, None, failure)
                    idx = idx[len(got) + 1 :]
                    h = workers_pool.replace(h)
        finally:
            # A worker left mid-exchange (an exception, Ctrl-C) may still answer old requests:
            # it is never handed out again.
            if clean:
                workers_pool.release(h)
            else:
                workers_pool.discard(h)

    n_threads = min(workers, (len(items) + CHUNK - 1) // CHUNK)
    if n_threads <= 1:
        drive()
    else:
        with ThreadPoolExecutor(n_threads, thread_name_prefix="swift-fast-grade") as ex:
            for f in [ex.submit(drive) for _ in range(n_threads)]:
                f.result()
    return results  # type: ignore[return-value]
