"""vLLM's own output, kept out of the output of the jobs that run it (``demo``, ``bon``,
``collect``, ``serve`` start-up, the benchmarks).

Two sources, handled apart:

- vLLM's Python logs in this process: :func:`quiet_vllm_logs` sets ``VLLM_LOGGING_LEVEL``
  before vLLM is imported (also read by the engine processes it spawns), so only errors show.
- Everything the engine processes and native code print: NUMA-binding warnings from C++,
  "Loading safetensors checkpoint shards" bars, a Triton warning logged before vLLM's logging
  is configured. None of it passes through this process's logging, so :func:`engine_output_to`
  sends file descriptors 1 and 2 to a log file while this process's own ``sys.stdout`` and
  ``sys.stderr`` keep writing to the terminal; processes started inside inherit the log file.

Both change process-wide state (the environment, file descriptors): jobs call them, a library
call never does. ``--verbose`` on each command skips both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings


def quiet_vllm_logs(level: str = "ERROR") -> None:
    """Only vLLM's errors from its loggers, here and in the engine processes it starts (the
    plugin's own warnings, logger ``swift_fast``, still show). The user's ``VLLM_LOGGING_LEVEL``
    stands when set. A vLLM imported earlier gets its logger's level set."""
    if "VLLM_LOGGING_LEVEL" in os.environ:
        return
    os.environ["VLLM_LOGGING_LEVEL"] = level
    if "vllm" in sys.modules:
        logging.getLogger("vllm").setLevel(level)
    # NOTE: vLLM logs its "no Triton CPU backend" warning while it is imported, before its logging is
    # configured; a level set on that logger now holds it back (in this process). Its FutureWarnings
    # about torch.distributed come from its own code, here and in the engine processes it spawns.
    logging.getLogger("vllm.triton_utils.importing").setLevel(level)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")


def _flush() -> None:
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()


def _point_fds_at(path: str, mode: int) -> None:
    """Descriptors 1 and 2 onto ``path`` (``mode``: ``os.O_APPEND`` or ``os.O_TRUNC``)."""
    log = os.open(path, os.O_WRONLY | os.O_CREAT | mode, 0o644)
    try:
        for fd in (1, 2):
            os.dup2(log, fd)
    finally:
        os.close(log)


def _fd_backed(stream, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError):  # a StringIO, pytest's capsys, a closed stream
        return False


@contextlib.contextmanager
def engine_output_to(path: str | os.PathLike):
    """Within the block, whatever is written to file descriptors 1 and 2 (by native code, by
    processes started here) is appended to ``path``; ``sys.stdout`` and ``sys.stderr`` keep
    writing where they wrote before (when they are the process's descriptors 1 and 2; a
    replaced stream, such as a test's capture, is left as it is).

    NOTE: engine processes started inside keep the log file as their output after the block:
    an engine that outlives it still logs there, never onto the terminal mid-table."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    swapped = {}
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if _fd_backed(stream, fd):
            own = os.fdopen(os.dup(saved[fd]), "w", buffering=1, encoding=getattr(stream, "encoding", None),
                            errors=getattr(stream, "errors", None))
            swapped[name] = (stream, own)
    _point_fds_at(path, os.O_APPEND)
    for name, (_, own) in swapped.items():
        setattr(sys, name, own)
    _ACTIVE.append(path)
    try:
        yield path
    finally:
        _ACTIVE.pop()
        for name, (orig, own) in swapped.items():
            with contextlib.suppress(Exception):
                own.flush()
            setattr(sys, name, orig)
            with contextlib.suppress(Exception):
                own.close()
        for fd, dup in saved.items():
            os.dup2(dup, fd)
            os.close(dup)


_ACTIVE: list[str] = []  # the log files of the engine_output_to blocks open now, innermost last


@contextlib.contextmanager
def engine_starting():
    """Around an engine's (or a model's) start-up in library code: inside an
    :func:`engine_output_to` block, this process's own ``sys.stdout`` and ``sys.stderr`` go to
    the log file too, so the loading bars vLLM and transformers draw from this process (an
    in-process engine core, a model loaded for a report) join the engine processes' output;
    elsewhere it does nothing."""
    if not _ACTIVE:
        yield
        return
    _flush()
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        with contextlib.suppress(Exception):
            out.close()


@contextlib.contextmanager
def quiet_engine(log_path: str | os.PathLike | None, verbose: bool = False):
    """What a job wraps its vLLM work in: with ``verbose``, nothing changes; else vLLM's logs are
    quieted and the engine's own output goes to ``log_path`` (None: to nowhere)."""
    if verbose:
        yield None
        return
    quiet_vllm_logs()
    try:
        with engine_output_to(log_path or os.devnull):
            yield None if log_path is None else os.fspath(log_path)
    except BaseException:
        if log_path is not None and os.path.getsize(log_path) > 0:
            print(f"vLLM's own output of this run: {os.fspath(log_path)}", file=sys.stderr)
        raise


class StartupOutput:
    """A server's start-up output held in a log file until it is ready (:meth:`release`).

    Unlike :func:`engine_output_to`, this process's own Python output goes to the file too
    (vLLM's loggers hold the streams they were configured with); :attr:`console` writes to the
    terminal meanwhile. After :meth:`release`, descriptors 1 and 2 are the terminal again, so the
    running server logs as ``vllm serve`` does; the engine processes started meanwhile keep the
    file."""

    def __init__(self, path: str):
        self.path = path
        _flush()
        self._saved = {fd: os.dup(fd) for fd in (1, 2)}
        self.console = os.fdopen(os.dup(self._saved[2]), "w", buffering=1, encoding="utf-8", errors="replace")
        _point_fds_at(path, os.O_TRUNC)
        self._held = True

    @property
    def held(self) -> bool:
        """Whether descriptors 1 and 2 still go to the log file (not yet released)."""
        return self._held

    def release(self) -> None:
        """The terminal back on descriptors 1 and 2 (once; later calls do nothing)."""
        if not self._held:
            return
        self._held = False
        _flush()
        for fd, dup in self._saved.items():
            os.dup2(dup, fd)
            os.close(dup)

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of what start-up wrote (carriage-return redraws collapsed)."""
        try:
            with open(self.path, encoding="utf-8", errors="replace", newline="") as f:
                text = f.read()
        except OSError:
            return ""
        rows = [r.rsplit("\r", 1)[-1] for r in text.split("\n")]  # a redrawn bar: its last state
        rows = [r for r in rows if r.strip()]
        return "\n".join(rows[-lines:])
