"""Loading a supported Hugging Face model and its tokenizer for the command line."""

from __future__ import annotations

import contextlib
import sys

import torch

from .features import SUPPORTED_MODEL_TYPES, UnsupportedModelError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, config, device: torch.device) -> torch.dtype:
    """``auto``: the checkpoint's half-precision dtype on a GPU (bfloat16 for a float32 or
    unspecified checkpoint), float32 on the CPU (where bf16 matmuls are slow)."""
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected auto or one of {', '.join(DTYPES)}")
        return DTYPES[dtype]
    if device.type == "cpu":
        return torch.float32
    want = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(want, str):
        want = DTYPES.get(want)
    return want if isinstance(want, torch.dtype) and want != torch.float32 else torch.bfloat16


def check_supported_config(config, name: str) -> None:
    mt = getattr(config, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        archs = getattr(config, "architectures", None) or [type(config).__name__]
        supported = ", ".join(f"{v} ({k})" for k, v in SUPPORTED_MODEL_TYPES.items())
        raise UnsupportedModelError(
            f"unsupported architecture {archs[0]} (model_type {mt!r}) for model {name}: swift-fast's Hugging Face "
            f"integration supports {supported}"
        )


@contextlib.contextmanager
def transformers_bars(enabled: bool):
    """transformers' own progress bars (``Loading weights``...) on or off for the block, as they
    were afterwards. Off a terminal a bar's redraws land in a log file as a run of carriage
    returns, so the command line turns them off there."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def load_model(name_or_path: str, dtype: str = "auto", device: str = "auto", check: bool = True):
    """``(model, tokenizer)``: the causal LM in eval mode on ``device``; with ``check`` the
    architecture is checked from the config before any weight is read. transformers' loading bar
    is drawn only on a terminal."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(name_or_path)
    if check:
        check_supported_config(config, name_or_path)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, config, dev)
    with transformers_bars(sys.stderr.isatty()):
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dt)
    model.to(dev).eval()
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    return model, tokenizer
