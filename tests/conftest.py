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
