"""The plugin's log lines beside vLLM's own, in every process vLLM starts.

vLLM gives its logger ``vllm`` a stream handler in each of its processes (API server, engine
core, workers): on ``VLLM_LOGGING_STREAM``, in a format that names the process and its pid, at
``VLLM_LOGGING_LEVEL``, not propagating. The plugin logs under ``swift_fast.vllm_plugin``
instead, so that a job that quiets vLLM to its errors (:func:`swift_fast.support.engine_logs.quiet_vllm_logs`)
still shows the plugin's warnings. Left alone, that logger has no handler: Python's last-resort
handler prints its warnings unformatted and drops its INFO lines -- the head, the runner and
adapter a worker installed, the surface check -- in exactly the processes a server operator reads.

:func:`configure`, called by :func:`swift_fast.vllm_plugin.register` in every process, gives
that logger a handler that writes each record as vLLM's own handler would, with its formatter
and to its stream (``(EngineCore pid=...) INFO ... [runner_adapters.py:43] swift-fast: ...``).
vLLM configures its logging after the plugins load in some processes and again later in others
(``configure_logging`` from each process's ``LoggingConfig``), so the handler looks vLLM's up
when it writes, not when it is added; while vLLM has none it writes warnings to stderr, as
Python's last resort did. The level follows ``VLLM_LOGGING_LEVEL`` but never rises above
WARNING: a job that quiets vLLM to its errors still shows the plugin's warnings, which say
something the user must act on. Like vLLM's logger it does not propagate, so an application that
configured the root logger does not print each line twice.

Left untouched: ``VLLM_CONFIGURE_LOGGING=0`` (the user configures logging, the plugin's logger
included) and a plugin logger that already has handlers. The rest of ``swift_fast`` (the CLI,
training, collection) logs as a library does, to whatever the application configured.
"""

from __future__ import annotations

import logging
import sys

LOGGER = "swift_fast.vllm_plugin"


def _vllm_handler() -> logging.StreamHandler | None:
    for h in logging.getLogger("vllm").handlers:
        if isinstance(h, logging.StreamHandler):
            return h
    return None


class _LikeVllm(logging.Handler):
    """Writes a record through the formatter and stream of vLLM's handler of the moment."""

    def emit(self, record: logging.LogRecord) -> None:
        target = _vllm_handler()
        try:
            if target is None:
                if record.levelno >= logging.WARNING:
                    sys.stderr.write(record.getMessage() + "\n")
                return
            if record.levelno < min(target.level, logging.WARNING):
                return
            if not hasattr(record, "vllm_process_name"):  # made before vLLM's record factory was installed
                record.vllm_process_name = record.processName
            target.acquire()
            try:
                target.stream.write(target.format(record) + target.terminator)
                target.flush()
            finally:
                target.release()
        except Exception:
            self.handleError(record)


def configure() -> logging.Handler | None:
    """Route the plugin's logger through vLLM's handler (see the module docstring); returns the
    handler added, or None where nothing was changed."""
    from vllm import envs

    plugin = logging.getLogger(LOGGER)
    if not envs.VLLM_CONFIGURE_LOGGING or plugin.handlers:
        return None
    level = logging.getLevelName(str(envs.VLLM_LOGGING_LEVEL).upper())
    plugin.setLevel(min(level if isinstance(level, int) else logging.INFO, logging.WARNING))
    handler = _LikeVllm()
    plugin.addHandler(handler)
    plugin.propagate = False
    return handler
