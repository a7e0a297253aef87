"""Forward side: each selected hidden state is projected onto the head as the model produces it.

The decoder's modules keep their names, parameters and classes' behaviour; each module that
produces a selected state gets a subclass (``__class__`` swapped in place) whose ``forward``
calls the original and then ``torch.ops.swift_fast.project_layer_`` on the state:

==========================  ======================================================
hidden state (HF numbering)  where it is read
==========================  ======================================================
0 (embeddings)              input of decoder layer 0 (before the layer runs)
i = 1 .. L-1                second output of decoder layer i's input norm: the
                            residual stream ``hidden + residual`` of layer i-1,
                            which its fused add-RMSNorm computes anyway
L (after the final norm)    first output of the decoder's final norm
==========================  ======================================================

Why the input norm's residual and not layer i-1's ``(hidden, residual)`` output. Under tensor
parallelism ``hidden`` is the all-reduced output of the layer's MLP, and vLLM's compile pass
``AllReduceFusedAddRMSNormPattern`` (``compilation/passes/fusion/allreduce_rms_fusion.py``,
``fuse_allreduce_rms``) replaces ``all_reduce(x)`` followed by the next norm's
``fused_add_rms_norm`` with one FlashInfer kernel. Inductor's pattern matcher accepts a match
only when every node inside the pattern has exactly the users the pattern has
(``_match_users``); only the pattern's outputs -- the normed states and the new residual -- may
have others. A projection of the all-reduce's output would be a second user of an inner node
and would cost that fusion at every scored layer; the new residual is an output, so reading it
leaves the pattern whole (the same holds for the final norm's output, state L). The values are
the same: the fused add rounds ``hidden + residual`` to the model dtype once, as the sum of the
pair does. (Measured on no GPU here: the fusion needs FlashInfer on CUDA; the CPU tests check
that every state is still read exactly.)

Under pipeline parallelism a worker holds decoder layers ``[start, end)`` (vLLM puts a
``PPMissingLayer`` in place of the others and of a final norm it does not hold) and hooks only
the states it produces (:meth:`DecoderParts.owns`): every state belongs to exactly one stage,
and :mod:`.pipeline` carries the partial sums downstream.

The projection is read at once: fused add-RMSNorm kernels update their residual in place in the
next norm. All partial projections add into one float32 accumulator ``acc[N, 2]``
(N = the engine's ``max_num_batched_tokens``) and each layer's weight columns ``W_l[rows, d]``;
both are registered as (non-persistent) buffers on the hooked modules, which is how state that
compiled code mutates reaches vLLM's ``torch.compile`` graph (a global tensor does not). The
addresses never change, so a captured CUDA graph replays into the same buffers. A head's state
norm (``norm_eps``) is a plain float attribute of each hooked module, passed to every
``project_layer_`` call: ``torch.compile`` reads it as a constant of the graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..rewards.head import HeadError, SwiftHead

ACC = "_swift_fast_acc"
W_IN = "_swift_fast_w_in"
W_OUT = "_swift_fast_w_out"
#: the head's ``norm_eps`` (None or a float), a plain attribute: not a tensor, so not a buffer
NORM_EPS = "_swift_fast_norm_eps"


def _project(acc: torch.Tensor, hidden: torch.Tensor, residual, weight: torch.Tensor, norm_eps) -> None:
    torch.ops.swift_fast.project_layer_(acc, hidden, residual, weight, norm_eps)


class _ScoredLayer:
    """Mixin put in front of decoder layer 0's class: projects its input (state 0).
    ``forward(positions, hidden_states, residual, ...)`` as vLLM's decoder layers (Llama, Qwen2,
    Mistral, ...)."""

    def forward(self, positions, hidden_states, residual, *args, **kwargs):
        _project(getattr(self, ACC), hidden_states, residual, getattr(self, W_IN), getattr(self, NORM_EPS))
        return super().forward(positions, hidden_states, residual, *args, **kwargs)


class _ScoredResidual:
    """Mixin put in front of the class of decoder layer i's input norm (i >= 1): projects the
    residual stream it returns with the normed states, ``norm(hidden, residual) -> (normed,
    hidden + residual)``: state i."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if isinstance(out, tuple):
            _project(getattr(self, ACC), out[1], None, getattr(self, W_OUT), getattr(self, NORM_EPS))
        return out


class _ScoredNorm:
    """Mixin put in front of the final norm's class: projects its (first) output, state L."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        first = out[0] if isinstance(out, tuple) else out
        _project(getattr(self, ACC), first, None, getattr(self, W_OUT), getattr(self, NORM_EPS))
        return out


_SUBCLASSES: dict[tuple[type, type], type] = {}


def _swap_class(module: nn.Module, mixin: type) -> None:
    cls = type(module)
    if issubclass(cls, mixin):
        return
    key = (mixin, cls)
    sub = _SUBCLASSES.get(key)
    if sub is None:
        sub = type(f"SwiftScored{cls.__name__}", (mixin, cls), {"__module__": __name__})
        _SUBCLASSES[key] = sub
    module.__class__ = sub


def _set_buffer(module: nn.Module, name: str, value) -> None:
    if name in module._buffers:
        module._buffers[name] = value
    else:
        module.register_buffer(name, value, persistent=False)


@dataclass
class DecoderParts:
    layers: nn.ModuleList
    norm: nn.Module
    num_layers: int
    #: decoder layers ``[start, end)`` live in this worker (all of them without pipeline parallelism)
    start: int = 0
    end: int = -1
    #: the final norm lives in this worker (the last pipeline stage)
    has_norm: bool = True

    def __post_init__(self):
        if self.end < 0:
            self.end = self.num_layers

    def owns(self, state: int) -> bool:
        """Whether hidden state ``state`` (HF numbering) is produced in this worker: state 0 by
        decoder layer 0, state i (1..L-1) by layer i's input norm, state L by the final norm."""
        if state == 0:
            return self.start == 0 < self.end
        if state < self.num_layers:
            return self.start <= state < self.end
        return self.has_norm


def _missing(module: nn.Module) -> bool:
    """vLLM's stand-in for a layer another pipeline stage holds."""
    try:
        from vllm.model_executor.models.utils import PPMissingLayer
    except ImportError:
        return False
    return isinstance(module, PPMissingLayer)


def decoder_parts(model: nn.Module, architecture: str = "") -> DecoderParts:
    """The decoder layers and final norm of a vLLM causal LM (``model.model.layers`` / ``.norm``),
    and which of them this worker holds (a pipeline stage holds layers ``[start_layer, end_layer)``;
    vLLM puts a ``PPMissingLayer`` in place of every other layer and of a norm it does not hold)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    norm = getattr(inner, "norm", None)
    if not isinstance(layers, nn.ModuleList) or not isinstance(norm, nn.Module):
        raise HeadError(
            f"swift-fast cannot find the decoder layers of {architecture or type(model).__name__} "
            f"({type(model).__name__}): it expects model.model.layers and model.model.norm as in vLLM's "
            "Llama, Qwen2, Qwen3 and Mistral implementations"
        )
    start = int(getattr(inner, "start_layer", 0))
    end = int(getattr(inner, "end_layer", len(layers)))
    return DecoderParts(layers=layers, norm=norm, num_layers=len(layers), start=start, end=end,
                        has_norm=not _missing(norm))


@dataclass
class ForwardScoring:
    """What :func:`install` attached: the shared accumulator and the hooked modules."""

    acc: torch.Tensor  # float32 [N, 2]
    bias: torch.Tensor  # float32 [rows]
    modules: list = field(default_factory=list)
    #: the head's states projected in this worker (a pipeline stage projects those of its own layers)
    states: list = field(default_factory=list)


def install(
    model: nn.Module, head: SwiftHead, max_tokens: int, device: torch.device, architecture: str = ""
) -> ForwardScoring:
    """Hook ``head``'s hidden states into ``model`` (a logit-feature head hooks nothing here).

    Args:
        model: the loaded vLLM model (``runner.model``).
        head: a ``feature="hidden"`` head already checked against the model.
        max_tokens: rows of the accumulator, at least the largest forward's token count.
    """
    acc = torch.zeros(max_tokens, 2, dtype=torch.float32, device=device)
    bias = head.bias.detach().to(device=device, dtype=torch.float32).contiguous()
    fs = ForwardScoring(acc=acc, bias=bias)
    if head.feature != "hidden":
        return fs
    parts = decoder_parts(model, architecture)
    L = parts.num_layers
    w_in = w_norm = None
    w_res: dict[int, torch.Tensor] = {}  # decoder layer index -> columns of the state its input norm returns
    for i, state in enumerate(head.layers):
        if state > L:
            raise HeadError(f"head layer {state} does not exist: the model has hidden states 0..{L}")
        if not parts.owns(state):
            continue  # another pipeline stage projects it
        fs.states.append(state)
        w = head.layer_weight(i).detach().to(device=device, dtype=torch.float32).contiguous()
        if state == 0:
            w_in = w
        elif state < L:
            w_res[state] = w
        else:
            w_norm = w
    if w_in is not None:
        layer = parts.layers[0]
        _swap_class(layer, _ScoredLayer)
        _set_buffer(layer, ACC, acc)
        _set_buffer(layer, W_IN, w_in)
        setattr(layer, NORM_EPS, head.norm_eps)
        fs.modules.append(layer)
    for idx, w in sorted(w_res.items()):
        norm = getattr(parts.layers[idx], "input_layernorm", None)
        if not isinstance(norm, nn.Module):
            raise HeadError(
                f"swift-fast reads hidden state {idx} from decoder layer {idx}'s input_layernorm, which "
                f"{architecture or type(model).__name__} does not have (expected as in vLLM's Llama, Qwen2, Qwen3 "
                "and Mistral)"
            )
        _swap_class(norm, _ScoredResidual)
        _set_buffer(norm, ACC, acc)
        _set_buffer(norm, W_OUT, w)
        setattr(norm, NORM_EPS, head.norm_eps)
        fs.modules.append(norm)
    if w_norm is not None:
        _swap_class(parts.norm, _ScoredNorm)
        _set_buffer(parts.norm, ACC, acc)
        _set_buffer(parts.norm, W_OUT, w_norm)
        setattr(parts.norm, NORM_EPS, head.norm_eps)
        fs.modules.append(parts.norm)
    return fs
