import os

# Triton kernels run through the interpreter on machines without CUDA; it must be set before
# triton is first imported.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(REPO, "..", "shared", "data")


@pytest.fixture(scope="session")
def shared_data():
    """Path of the read-only benchmark sets beside the checkout; skips when absent."""
    if not os.path.isdir(SHARED_DATA):
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


def _streaming_backends() -> list[str]:
    """What can run the streaming ops on the CPU here: torch always, Triton through the
    interpreter, the native extension when it is built."""
    from swift_fast.kernels._dispatch import HAVE_TRITON, interpreting, native_module

    out = ["torch"]
    if HAVE_TRITON and interpreting():
        out.append("triton")
    if native_module() is not None:
        out.append("native")
    return out


@pytest.fixture(params=_streaming_backends())
def cpu_backend(request):
    """Each CPU backend of the streaming ops in turn (``set_cpu_backend``), restored afterwards."""
    from swift_fast.kernels import streaming as st

    prev = st.set_cpu_backend(request.param)
    yield request.param
    st.set_cpu_backend(prev)


@pytest.fixture
def plugin_caplog(caplog, monkeypatch):
    """``caplog`` for the plugin's logger: once vLLM has configured a process the plugin's logger
    stops propagating (``swift_fast.vllm_plugin.logs``), which would keep its records from
    pytest's handler on the root logger; for the test it propagates, and an engine built inside
    leaves it as it is."""
    import logging

    from swift_fast.vllm_plugin import logs

    monkeypatch.setattr(logging.getLogger(logs.LOGGER), "propagate", True)
    monkeypatch.setattr(logs, "configure", lambda: None)
    return caplog


@pytest.fixture
def vllm_logs_restored(monkeypatch):
    """A command run in this process quiets vLLM (``swift_fast.support.engine_logs``: environment, logger
    levels); what it changes is put back after the test."""
    import logging

    for key in ("VLLM_LOGGING_LEVEL", "PYTHONWARNINGS"):
        if key in os.environ:
            monkeypatch.setenv(key, os.environ[key])
        else:  # recorded as absent, so removed again afterwards
            monkeypatch.setenv(key, "")
            monkeypatch.delenv(key)
    loggers = [logging.getLogger(name) for name in ("vllm", "vllm.triton_utils.importing")]
    levels = [lg.level for lg in loggers]
    yield
    for lg, level in zip(loggers, levels):
        lg.setLevel(level)
