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
