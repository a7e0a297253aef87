"""Tiny Hugging Face models for the Hugging Face integration tests, built once per session.

Imported by the ``test_hf_*`` modules; the models live under pytest's base temporary folder
and ``build_tiny_model`` reuses a folder that already holds the same build.
"""

from __future__ import annotations

import json
import os

import torch

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


def tiny_model_dir(tmp_path_factory, family: str, num_layers: int = 3) -> str:
    from swift_fast.testing import build_tiny_model

    base = tmp_path_factory.getbasetemp() / "hf-tiny"
    return build_tiny_model(family, str(base / f"{family}-{num_layers}"), num_layers=num_layers)


def eos_prone_model_dir(tmp_path_factory, eos_logit: float = 4.0) -> str:
    """A tiny Llama whose end-of-turn token has a few percent probability at every position, so
    sampled responses end at different lengths (a random model almost never emits it).

    Every embedding gets a constant offset in coordinate 0, which survives the final norm as a
    large positive feature; the end-of-turn row of ``lm_head`` reads that feature.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = tiny_model_dir(tmp_path_factory, "llama", num_layers=2)
    dst = str(tmp_path_factory.getbasetemp() / "hf-tiny" / f"llama-eos-{eos_logit}")
    stamp = os.path.join(dst, "eos_prone.json")
    if os.path.exists(stamp):
        return dst
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src)
    eos = tok.eos_token_id
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] += 2.0
        model.lm_head.weight[:, 0] = 0.0
        probe = torch.arange(8, 72).view(4, 16)
        h0 = model.model(input_ids=probe).last_hidden_state[..., 0].mean()
        model.lm_head.weight[eos, 0] = eos_logit / h0
    model.save_pretrained(dst)
    tok.save_pretrained(dst)
    with open(stamp, "w") as f:
        json.dump({"eos_logit": eos_logit}, f)
    return dst


def random_head(width: int, layers, alignment: str, feature: str = "hidden", gate: bool = True, seed: int = 0):
    """A SWIFT head with seeded random weights (std 0.3) and bias, so scores are far from trivial."""
    from swift_fast.rewards.head import SwiftHead

    head = SwiftHead(width, layers, gate=gate, alignment=alignment, feature=feature)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=g) * 0.3)
        head.bias.copy_(torch.randn(head.bias.shape, generator=g))
    return head
