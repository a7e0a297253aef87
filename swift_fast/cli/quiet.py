"""The command line's view of vLLM's logging."""

from __future__ import annotations


def quiet_vllm_logs(level: str = "ERROR") -> None:
    """Keep vLLM's INFO lines and its start-up warnings about the CPU build (no Triton, no tcmalloc,
    the V1 runner) out of the output of the commands that run an engine (``demo``, ``bon``,
    ``collect``), where they break up the progress bars and say nothing about the job; vLLM's
    errors and the plugin's own warnings (logger ``swift_fast``) still show.

    ``VLLM_LOGGING_LEVEL`` is read when vLLM is imported, in this process and in the engine
    process it spawns, so it is set before the import (unless the user set it); a vLLM imported
    earlier gets its logger's level set. It changes this process's environment: only the
    command line calls it."""
    import logging
    import os
    import sys
    import warnings

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
