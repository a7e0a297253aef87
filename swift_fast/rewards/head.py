"""The SWIFT head: a gated linear map over the concatenation of selected hidden states.

File format (``swift_fast.head/1``, safetensors, no pickle): tensors ``weight`` ``[2, k*d]``
(row 0 gate, row 1 reward; ``[1, k*d]`` without gate) and ``bias`` ``[2]`` / ``[1]``, float32;
string metadata ``format``, ``hidden_size``, ``layers`` (JSON), ``gate``, ``alignment``,
``feature``, ``model``, ``model_fingerprint`` (JSON), ``provenance`` (JSON), ``state_norm`` and
``selector``.

``state_norm`` (JSON): ``null`` (no normalisation), or ``{"type": "rms", "eps": <float>}``: each
selected state ``h`` (``[d]``, the residual stream as stored, squared and averaged in float32) is
divided by ``sqrt(mean(h^2) + eps)`` before the projection, as the SWIFT code's ``--apply_norm``
does with the model's final RMSNorm; the norm's gain ``g`` is already folded into ``weight``
(``weight[:, l*d:(l+1)*d] = g * w_l``), so scoring needs only each token's rms per state.
Files without the key (written before it existed) load as ``null``.

``selector`` (JSON): ``null``, or the selector ``swift-fast train`` recommends using the head with,
measured on its validation evidence (``swift_fast.training.recommend``): ``{"select":
"vote:swift@0.5", "accuracy": {...}, ...}``. ``bon``, ``eval``, the reports and the plugin select
by ``select`` unless told otherwise; a head without one (written before the key existed, or by
other code) selects by its highest score, as it always did.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import torch
from torch import nn

FORMAT = "swift_fast.head/1"


@dataclass(frozen=True)
class Alignment:
    """Which states score a response token under one alignment (DESIGN 2), and what that costs.

    Response token ``r_j`` sits at position ``P + j`` (``P`` = prompt length) and is scored with
    the states at position ``P + j + state_offset``. Every path reads this table instead of
    testing alignment names.
    """

    #: -1: the state whose logits produced ``r_j``; 0: the state where ``r_j`` is the input
    state_offset: int
    #: generation never computes the state of its last token as an input: scoring needs one
    #: more forward of that token per sequence (the vLLM plugin's last-state pass)
    extra_forward: bool
    #: what scores the first response token, in words (for error messages)
    first_token_state: str


ALIGNMENT = {
    "predicting": Alignment(state_offset=-1, extra_forward=False,
                            first_token_state="the state of the last prompt token"),
    "emitted": Alignment(state_offset=0, extra_forward=True, first_token_state="its own state"),
}
ALIGNMENTS = tuple(ALIGNMENT)
FEATURES = ("hidden", "logits")
#: ``layers`` value of a logit-feature head: the final logits are its one "layer".
LOGITS_LAYER = -1


class HeadError(ValueError):
    """A head file that cannot be read, or a head that does not fit what it is used with."""


def model_fingerprint(config: Any) -> dict:
    """What identifies a model's shape: architecture, hidden size, layer count, vocabulary size.

    ``config`` is a Hugging Face ``PretrainedConfig`` (multimodal configs use their text config),
    a vLLM ``ModelConfig`` (its ``hf_config`` is read) or a plain mapping with the same keys.
    """
    if isinstance(config, Mapping):
        fp = {k: config.get(k) for k in ("architecture", "hidden_size", "num_layers", "vocab_size")}
        return fp
    hf = getattr(config, "hf_config", config)
    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    archs = getattr(hf, "architectures", None) or [type(hf).__name__]
    return {
        "architecture": archs[0],
        "hidden_size": int(text.hidden_size),
        "num_layers": int(text.num_hidden_layers),
        "vocab_size": int(text.vocab_size),
    }


def resolve_layers(spec: str | Iterable[int], num_layers: int) -> list[int]:
    """Hidden-state indices from ``"all"``, ``"lastN"`` (e.g. ``"last4"``), ``"0,4,8"`` or a list.

    Indices follow ``output_hidden_states``: 0 embeddings, 1..L-1 layer outputs, L final norm.
    Negative integers count from the end (``-1`` is L).
    """
    n = num_layers + 1
    if isinstance(spec, str):
        s = spec.strip().lower()
        if s == "all":
            return list(range(n))
        if s.startswith("last"):
            try:
                k = int(s[4:])
            except ValueError:
                raise HeadError(f"layer selection {spec!r}: expected 'lastN' with N a number, e.g. 'last4'") from None
            if not 1 <= k <= n:
                raise HeadError(f"layer selection {spec!r}: the model has {n} hidden states (0..{num_layers})")
            return list(range(n - k, n))
        try:
            spec = [int(x) for x in s.split(",") if x.strip()]
        except ValueError:
            raise HeadError(
                f"layer selection {spec!r}: use 'all', 'lastN' or comma-separated indices such as '0,8,16'"
            ) from None
    out = []
    for i in spec:
        j = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= j < n:
            raise HeadError(f"layer index {i} is out of range: the model has hidden states 0..{num_layers}")
        out.append(j)
    if not out:
        raise HeadError("layer selection is empty")
    if len(set(out)) != len(out):
        raise HeadError(f"layer selection {out} repeats an index")
    return out


class SwiftHead(nn.Module):
    """Gated linear reward head (SWIFT paper Eq. 2-4).

    Args:
        hidden_size: ``d``, the width of each selected state (the vocabulary size for
            ``feature="logits"``).
        layers: hidden-state indices in ``output_hidden_states`` numbering, concatenated
            layer-major in this order. For ``feature="logits"`` leave it ``None`` (stored as ``[-1]``).
        gate: with gate, ``weight`` is ``[2, k*d]`` (gate row, reward row); without, ``[1, k*d]``
            and the score is the plain mean of the token rewards.
        alignment: ``"predicting"`` (the state whose logits produced the token) or ``"emitted"``
            (the state where the token is the input; the paper's definition).
        feature: ``"hidden"`` or ``"logits"``.
        norm_eps: ``None`` (no state norm), or ``eps >= 0``: each selected state is divided by
            ``sqrt(mean(h^2) + eps)`` (per token, per state, float32) before the projection; any
            norm gain is already folded into ``weight``. Hidden-state heads only.
    """

    def __init__(
        self,
        hidden_size: int,
        layers: Sequence[int] | None = None,
        gate: bool = True,
        alignment: str = "predicting",
        feature: str = "hidden",
        norm_eps: float | None = None,
    ):
        super().__init__()
        if alignment not in ALIGNMENTS:
            raise HeadError(f"alignment {alignment!r}: expected one of {ALIGNMENTS}")
        if feature not in FEATURES:
            raise HeadError(f"feature {feature!r}: expected one of {FEATURES}")
        if feature == "logits":
            if layers is not None and list(layers) != [LOGITS_LAYER]:
                raise HeadError("a logit-feature head has a single 'layer', the final logits: pass layers=None")
            layers = [LOGITS_LAYER]
        elif layers is None or len(layers) == 0:
            raise HeadError("a hidden-state head needs a non-empty list of layer indices")
        elif len(set(int(i) for i in layers)) != len(layers):
            raise HeadError(f"layer selection {list(layers)} repeats an index")
        if int(hidden_size) <= 0:
            raise HeadError(f"hidden_size must be positive, got {hidden_size}")
        norm_eps = _check_norm_eps(norm_eps, feature)
        self.hidden_size = int(hidden_size)
        self.layers = [int(i) for i in layers]
        self.gate = bool(gate)
        self.alignment = alignment
        self.feature = feature
        #: ``None`` or the epsilon of the per-token RMS normalisation of each selected state
        self.norm_eps: float | None = norm_eps
        rows = 2 if gate else 1
        self.weight = nn.Parameter(torch.zeros(rows, len(self.layers) * self.hidden_size))
        self.bias = nn.Parameter(torch.zeros(rows))
        nn.init.normal_(self.weight, std=1.0 / (len(self.layers) * self.hidden_size) ** 0.5)
        #: free-form strings carried in the file: ``model``, ``model_fingerprint``, ``provenance``.
        self.model_name: str = ""
        self.model_fingerprint: dict | None = None
        self.provenance: dict = {}
        #: the recommended selector and its evidence (module docstring), or None
        self.selector: dict | None = None

    @property
    def recommended_select(self) -> str | None:
        """The selector this head's training recommends (``"vote:swift@0.5"``), None without one."""
        return (self.selector or {}).get("select")

    @property
    def num_features(self) -> int:
        return len(self.layers) * self.hidden_size

    def layer_weight(self, i: int) -> torch.Tensor:
        """Columns of ``weight`` for the ``i``-th selected layer: ``[rows, d]`` (a view)."""
        d = self.hidden_size
        return self.weight[:, i * d : (i + 1) * d]

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, layers={self.layers}, gate={self.gate}, "
            f"alignment={self.alignment!r}, feature={self.feature!r}, norm_eps={self.norm_eps!r}"
        )

    # -- model fit -------------------------------------------------------------------------
    def check_model(self, config: Any, name: str | None = None) -> None:
        """Raise ``HeadError`` naming head and model when this head cannot score that model."""
        fp = model_fingerprint(config)
        model = (
            name or getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", None)
            or fp["architecture"]
        )
        head_desc = f"head trained on {self.model_name or 'an unnamed model'} ({_fp_str(self.model_fingerprint)})"
        problems = []
        if self.feature == "logits":
            if self.hidden_size != fp["vocab_size"]:
                problems.append(f"logit head width {self.hidden_size} != vocabulary size {fp['vocab_size']}")
        else:
            if self.hidden_size != fp["hidden_size"]:
                problems.append(f"hidden size {self.hidden_size} != model hidden size {fp['hidden_size']}")
            bad = [i for i in self.layers if not 0 <= i <= fp["num_layers"]]
            if bad:
                problems.append(f"layers {bad} do not exist (the model has hidden states 0..{fp['num_layers']})")
        if self.model_fingerprint and not problems:
            for key in ("architecture", "hidden_size", "num_layers", "vocab_size"):
                want, got = self.model_fingerprint.get(key), fp.get(key)
                if want is not None and got is not None and want != got:
                    problems.append(f"{key} {want} != {got}")
        if problems:
            raise HeadError(
                f"this SWIFT head does not fit model {model} ({_fp_str(fp)}): {'; '.join(problems)}. "
                f"It is a {head_desc}. Train a head for this model with `swift-fast train --model {model}`."
            )

    def bind_model(self, config: Any, name: str | None = None) -> "SwiftHead":
        """Record the model this head belongs to (name and fingerprint), for the file's metadata."""
        self.model_fingerprint = model_fingerprint(config)
        self.model_name = name or getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", "") or ""
        return self

    # -- file ------------------------------------------------------------------------------
    def metadata(self) -> dict[str, str]:
        return {
            "format": FORMAT,
            "hidden_size": str(self.hidden_size),
            "layers": json.dumps(self.layers),
            "gate": json.dumps(self.gate),
            "alignment": self.alignment,
            "feature": self.feature,
            "model": self.model_name or "",
            "model_fingerprint": json.dumps(self.model_fingerprint),
            "provenance": json.dumps(self.provenance, sort_keys=True, default=str),
            "state_norm": json.dumps(None if self.norm_eps is None else {"type": "rms", "eps": self.norm_eps}),
            "selector": json.dumps(self.selector, sort_keys=True, default=str),
        }

    def save(self, path: str | os.PathLike) -> None:
        from safetensors.torch import save_file

        tensors = {
            "weight": self.weight.detach().to("cpu", torch.float32).contiguous(),
            "bias": self.bias.detach().to("cpu", torch.float32).contiguous(),
        }
        tmp = f"{os.fspath(path)}.tmp"
        save_file(tensors, tmp, metadata=self.metadata())
        os.replace(tmp, path)  # a crash mid-write never leaves a truncated head behind

    @classmethod
    def load(cls, path: str | os.PathLike, map_location: str | torch.device = "cpu") -> "SwiftHead":
        from safetensors import SafetensorError, safe_open

        path = os.fspath(path)
        if not os.path.isfile(path):
            raise HeadError(f"no head file at {path}")
        try:
            with safe_open(path, framework="pt") as f:
                meta = f.metadata() or {}
                keys = set(f.keys())
                tensors = {k: f.get_tensor(k) for k in keys}
        except (SafetensorError, OSError, ValueError) as e:
            raise HeadError(f"{path} is not a readable safetensors head file ({e})") from e
        fmt = meta.get("format")
        if fmt != FORMAT:
            if fmt and fmt.startswith("swift_fast.head/"):
                raise HeadError(f"{path} has head format {fmt}; this swift-fast reads {FORMAT}: upgrade swift-fast")
            raise HeadError(f"{path} is not a swift-fast head (format {fmt!r}, expected {FORMAT!r})")
        missing = {"weight", "bias"} - keys
        if missing:
            raise HeadError(f"{path} lacks tensor(s) {sorted(missing)}")
        try:
            layers = json.loads(meta["layers"])
            head = cls(
                hidden_size=int(meta["hidden_size"]),
                layers=None if meta.get("feature") == "logits" else layers,
                gate=json.loads(meta.get("gate", "true")),
                alignment=meta.get("alignment", "predicting"),
                feature=meta.get("feature", "hidden"),
                norm_eps=_norm_eps_from_meta(meta.get("state_norm", "null")),
            )
            head.model_name = meta.get("model", "")
            head.model_fingerprint = json.loads(meta.get("model_fingerprint", "null"))
            head.provenance = json.loads(meta.get("provenance", "{}"))
            head.selector = _selector_from_meta(meta.get("selector", "null"))
        except (KeyError, ValueError, TypeError) as e:
            raise HeadError(f"{path}: malformed head metadata ({type(e).__name__}: {e})") from e
        w, b = tensors["weight"], tensors["bias"]
        if tuple(w.shape) != tuple(head.weight.shape) or tuple(b.shape) != tuple(head.bias.shape):
            raise HeadError(
                f"{path}: tensor shapes weight {tuple(w.shape)}, bias {tuple(b.shape)} do not match its metadata "
                f"(expected {tuple(head.weight.shape)}, {tuple(head.bias.shape)})"
            )
        if not (torch.isfinite(w).all() and torch.isfinite(b).all()):
            raise HeadError(f"{path}: the head's weights contain NaN or infinity")
        with torch.no_grad():
            head.weight.copy_(w.float())
            head.bias.copy_(b.float())
        return head.to(map_location)


def _check_norm_eps(norm_eps, feature: str) -> float | None:
    if norm_eps is None:
        return None
    if feature == "logits":
        raise HeadError(
            "a logit-feature head cannot have a state norm (norm_eps): the RMS normalisation applies to "
            "hidden states, and the logits come after the model's own final norm; pass norm_eps=None"
        )
    # NOTE: bool is an int: True would silently mean eps = 1
    if isinstance(norm_eps, bool) or not isinstance(norm_eps, numbers.Real):
        raise HeadError(f"norm_eps must be a float or None, got {type(norm_eps).__name__} {norm_eps!r}")
    eps = float(norm_eps)
    if not (math.isfinite(eps) and eps >= 0.0):
        raise HeadError(f"norm_eps must be finite and >= 0, got {norm_eps!r}")
    return eps


def _selector_from_meta(text: str) -> dict | None:
    """``selector`` metadata -> the record, None for ``null``; a ValueError for anything else than a
    record with a string ``select`` (the caller names the file)."""
    rec = json.loads(text)
    if rec is None:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("select"), str):
        raise ValueError(f"selector must be null or a record with a 'select' string, got {text[:120]!r}")
    return rec


def read_selector(path: str | os.PathLike) -> dict | None:
    """The ``selector`` record of the head file at ``path`` (metadata only: no tensor is read),
    None when it has none. Raises ``HeadError`` for a file that is not a readable head."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(os.fspath(path), framework="pt") as f:
            meta = f.metadata() or {}
        return _selector_from_meta(meta.get("selector", "null"))
    except (SafetensorError, OSError) as e:
        raise HeadError(f"{path} is not a readable safetensors head file ({e})") from e
    except ValueError as e:
        raise HeadError(f"{path}: malformed head metadata ({e})") from e


def _norm_eps_from_meta(text: str) -> float | None:
    """``state_norm`` metadata (JSON ``null`` or ``{"type": "rms", "eps": e}``) -> ``norm_eps``."""
    spec = json.loads(text)
    if spec is None:
        return None
    if not isinstance(spec, dict) or spec.get("type") != "rms" or "eps" not in spec:
        raise HeadError(
            f"state_norm {text!r}: expected null or {{\"type\": \"rms\", \"eps\": <float>}} "
            "(a newer swift-fast may know this norm: upgrade swift-fast)"
        )
    return spec["eps"]


def _fp_str(fp: dict | None) -> str:
    if not fp:
        return "no fingerprint"
    return ", ".join(f"{k}={v}" for k, v in fp.items())
