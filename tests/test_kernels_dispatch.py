"""Backend choice: ``auto`` on CUDA and the CPU, explicit backends and their errors."""

import pytest
import torch

from swift_fast.kernels import _dispatch as dispatch

CPU = torch.device("cpu")


def test_auto_picks_triton_on_cuda_and_native_only_where_it_pays(monkeypatch):
    if dispatch.HAVE_TRITON:
        assert dispatch.resolve("auto", torch.device("cuda"), "token_logprobs") == "triton"
    monkeypatch.setattr(dispatch, "_native", object())  # as if built
    assert dispatch.resolve("auto", CPU, "token_logprobs", torch.bfloat16) == "native"
    assert dispatch.resolve("auto", CPU, "swift_reduce", torch.bfloat16) == "native"
    assert dispatch.resolve("auto", CPU, "swift_reduce", torch.float32) == "torch"
    assert dispatch.resolve("auto", CPU, "project_layer", torch.float16, paired=True) == "torch"
    assert dispatch.resolve("auto", CPU, "finish", torch.float32) == "torch"
    monkeypatch.setattr(dispatch, "_native", None)  # not built
    assert dispatch.resolve("auto", CPU, "token_logprobs", torch.bfloat16) == "torch"


def test_explicit_backends_explain_what_is_missing(monkeypatch):
    with pytest.raises(ValueError, match="not one of"):
        dispatch.resolve("cuda", CPU, "swift_reduce")
    monkeypatch.setattr(dispatch, "_native", None)
    with pytest.raises(RuntimeError, match="not built"):
        dispatch.resolve("native", CPU, "swift_reduce")
    with pytest.raises(RuntimeError, match="CPU kernel"):
        dispatch.resolve("native", torch.device("cuda"), "swift_reduce")
    if dispatch.HAVE_TRITON:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
            dispatch.resolve("triton", CPU, "swift_reduce")


def test_inputs_on_different_devices_are_refused_by_every_op():
    """A kernel given another device's pointers would read the wrong memory: every op names the
    inputs and their devices instead ("meta" stands in for a second device on a CPU machine)."""
    from swift_fast.kernels import (
        sar_from_logits,
        swift_reduce,
        token_logprobs,
        token_logprobs_from_hidden,
    )
    from swift_fast.kernels import streaming as st

    meta = torch.device("meta")
    acc, state = st.new_buffers(4, 2)
    cases = {
        "project_layer_": lambda: st.project_layer_(acc, torch.randn(2, 3, device=meta), None, torch.randn(2, 3)),
        "finish_": lambda: st.finish_(acc, torch.zeros(2), torch.zeros(2, dtype=torch.long, device=meta), state),
        "swift_reduce": lambda: swift_reduce([torch.randn(4, 3)], torch.randn(2, 3, device=meta), torch.zeros(2),
                                             torch.tensor([0, 4])),
        "token_logprobs": lambda: token_logprobs(torch.randn(2, 5), torch.zeros(2, dtype=torch.long, device=meta)),
        "sar_from_logits": lambda: sar_from_logits(torch.randn(2, 5), torch.randn(2, 5, device=meta),
                                                   torch.zeros(2, dtype=torch.long), torch.tensor([0, 2])),
        "token_logprobs_from_hidden": lambda: token_logprobs_from_hidden(
            torch.randn(2, 3), torch.randn(5, 3, device=meta), torch.zeros(2, dtype=torch.long)),
    }
    for op, call in cases.items():
        with pytest.raises(ValueError, match=rf"{op}: all inputs must be on one device, got .* on meta"):
            call()
