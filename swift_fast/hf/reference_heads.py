"""Import the SWIFT paper's reference checkpoints (github.com/aster2024/SWIFT) as swift-fast heads.

The reference format
--------------------
``train/extract_train.py`` ends with ``torch.save(reward_model.state_dict(), output_file)``: a
bare state dict of ``utils.LinearRewardModel(feature_dim, disable_gate)``, never wrapped under a
key such as ``"state_dict"`` (``eval/get_rewards.py`` passes ``torch.load(...)`` straight to
``load_state_dict``), so a wrapped dict is refused rather than guessed at. Two shapes exist:

- with gate (default): ``fused_layer.weight [2, D]``, ``fused_layer.bias [2]``; output 0 is the gate
  logit, output 1 the reward; score ``sum(sigmoid(g~) r) / max(sum sigmoid(g~), 1e-8)`` over the
  response tokens. This is swift-fast's ``[2, k*d]`` head row for row.
- ``--disable_gate``: ``reward_layer.weight [1, D]``, ``reward_layer.bias [1]``; score = plain mean
  of the rewards: swift-fast's gate-less head.

Features (``D``): for each response token, its own ``output_hidden_states`` entries (the token is the
input at that position: alignment ``"emitted"``), concatenated in ascending index order: all
``L + 1`` entries (embeddings included) by default, or the ``--layers`` the user trained with. The
reference keeps the selected states in a dict keyed by the ``--layers`` integers as typed and
concatenates ``sorted(keys, key=int)``: a repeated index is kept once, the order typed does not
matter, and a negative index sorts *before* 0 although it names a late state. The importer
therefore sorts the integers as the reference did, maps each ``D``-slice to its state, and writes
the head with its layers in ascending state order (any order is the same head: ``W h`` is a sum
over layers); two spellings of one state (``-1`` and ``L``) carry identical features, so their
columns are added.

How each option maps
--------------------
- ``--apply_norm``: the model's final norm is applied to every selected state, the embeddings and
  state ``L`` included (state ``L`` is already the final norm's output: it is normed twice). For
  the RMSNorm families swift-fast supports, ``norm(h) . w = (h . (g * w)) / sqrt(mean(h^2) + eps)``,
  so the head gets ``norm_eps = eps`` (config ``rms_norm_eps``) and each layer's columns multiplied
  by the norm's gain ``g`` (``model.norm.weight``, read from the model's safetensors files).
- ``--logits_mode``: the features are the final logits (``D`` = vocabulary size): a
  ``feature="logits"`` head. The reference ignores ``--layers`` and ``--apply_norm`` there (its
  logits extractors take neither), so both are refused with logits: a checkpoint cannot carry them.
- Scored span: the reference scores the response tokens from the first token of the answer
  through the end-of-turn token, the span swift-fast scores from token ids.

What is refused, and why
------------------------
- Anything ``torch.load(weights_only=True)`` refuses: unpickling arbitrary objects runs code
  from the file, and a genuine checkpoint holds only tensors in a dict.
- The dimension-reduction mode (``--use_dim_reduction``: keys ``dim_reduction.*`` /
  ``base_model.*``): the reference's ``DimReduction`` and ``RewardModelWithDimReduction`` raise
  ``NotImplementedError`` in ``__init__``, so the mode was never finished and its fixed random
  projection was never saved anywhere a head could be rebuilt from.
- Unknown or missing keys, both key sets, ranks and shapes that do not fit, non-float dtypes,
  NaN or infinity, layer indices outside the model, and a ``D`` that the model and the layer
  selection do not produce (the error says what ``D`` factors into and which ``--layers`` fits).
"""

from __future__ import annotations

import json
import os
import pickle
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import torch

from ..rewards.head import HeadError, SwiftHead, model_fingerprint, resolve_layers

TOOL = "swift-fast import-head"
REFERENCE_REPO = "aster2024/SWIFT"
GATED_KEYS = ("fused_layer.weight", "fused_layer.bias")
PLAIN_KEYS = ("reward_layer.weight", "reward_layer.bias")
#: state-dict prefixes of the reference's unfinished ``RewardModelWithDimReduction``
DIM_REDUCTION_PREFIXES = ("dim_reduction.", "base_model.")
#: where the supported families (Llama, Qwen2, Qwen3, Mistral) keep the final norm's gain
FINAL_NORM_KEY = "model.norm.weight"
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass
class ReferenceLayers:
    """A reference ``--layers`` selection read the way the reference code reads it.

    ``raw``: the integers as the reference kept them (each once) in its concatenation order,
    ascending as integers; ``resolved``: ``raw[i]`` as an ``output_hidden_states`` index (a
    negative one counted from the end); ``notes``: where this differs from what was typed.
    """

    raw: list[int]
    resolved: list[int]
    notes: list[str] = field(default_factory=list)

    @property
    def head_layers(self) -> list[int]:
        """The states the imported head reads, ascending, each once."""
        return sorted(set(self.resolved))


def reference_layers(spec: str | Iterable[int] | None, num_layers: int) -> ReferenceLayers:
    """Read ``--layers`` as the reference did: ``None`` or ``"all"`` (all ``num_layers + 1`` states),
    ``"lastN"``, ``"0,4,8"`` or a list of ints (negatives count from the end, ``-1`` is ``L``).

    Raises ``HeadError`` for an index outside ``0..num_layers`` (or ``-(L+1)..-1``) or a bad spelling.
    """
    if spec is None:
        spec = "all"
    if isinstance(spec, str) and (spec.strip().lower() == "all" or spec.strip().lower().startswith("last")):
        idx = resolve_layers(spec, num_layers)
        return ReferenceLayers(raw=idx, resolved=list(idx))
    if isinstance(spec, str):
        try:
            typed = [int(x) for x in spec.replace(" ", ",").split(",") if x.strip()]
        except ValueError:
            raise HeadError(
                f"layer selection {spec!r}: use 'all', 'lastN' or the indices the checkpoint was trained with, "
                "such as '0,8,16'"
            ) from None
    else:
        typed = [int(i) for i in spec]
    if not typed:
        raise HeadError("layer selection is empty: omit it for all hidden states")
    for i in typed:
        resolve_layers([i], num_layers)  # range check, with resolve_layers' message
    notes = []
    raw = sorted(set(typed))
    repeated = sorted({i for i in typed if typed.count(i) > 1})
    if repeated:
        notes.append(
            f"--layers repeats {repeated}: the reference keys states by index, so it kept one copy of each"
        )
    if raw != list(dict.fromkeys(typed)):
        notes.append(
            f"--layers {' '.join(map(str, typed))} is not in ascending order: the reference concatenates "
            f"states in ascending index order whatever order they were given in, so D is read as {raw}"
        )
    n = num_layers + 1
    resolved = [i + n if i < 0 else i for i in raw]
    if any(i < 0 for i in raw):
        notes.append(
            f"negative indices count from the end ({', '.join(f'{i} is state {i + n}' for i in raw if i < 0)}); "
            "the reference sorted them before 0, and D is read in that order"
        )
    twins = sorted({j for j in resolved if resolved.count(j) > 1})
    if twins:
        notes.append(
            f"two indices name the same state {twins}: the reference read it twice; its two column blocks are "
            "added into one (the same features, the same scores)"
        )
    return ReferenceLayers(raw=raw, resolved=resolved, notes=notes)


def check_options(*, layers: Any = None, apply_norm: bool = False, logits: bool = False) -> None:
    """Refuse option combinations a reference checkpoint cannot have (before anything is read)."""
    if logits and apply_norm:
        raise HeadError(
            "--apply-norm with --logits: the reference ignores --apply_norm in logits mode (its logits "
            "extractor never normalises), so a logits checkpoint carries no norm: drop --apply-norm"
        )
    if logits and layers is not None:
        raise HeadError(
            "--layers with --logits: the reference ignores --layers in logits mode (the features are the "
            "final logits, one 'layer'): drop --layers"
        )


def load_reference_state_dict(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], bool]:
    """Read a reference checkpoint without running code; return ``(state_dict, gate)``.

    The state dict maps ``"fused_layer.weight"`` (``[2, D]``) and ``"fused_layer.bias"`` (``[2]``)
    with gate, or ``"reward_layer.weight"`` (``[1, D]``) and ``"reward_layer.bias"`` (``[1]``)
    without, to floating-point tensors; everything else is refused with ``HeadError``.
    """
    path = os.fspath(path)
    sd = _read_checkpoint_mapping(path)
    gate = _reference_gate(path, sd)
    want = GATED_KEYS if gate else PLAIN_KEYS
    w, b = sd[want[0]], sd[want[1]]
    _check_reference_tensors(path, want, w, b, rows=2 if gate else 1)
    return {want[0]: w, want[1]: b}, gate


def _read_checkpoint_mapping(path: str) -> Mapping:
    """The mapping that the ``.pt`` file at ``path`` holds, unpickled without running code."""
    if not os.path.isfile(path):
        raise HeadError(f"no checkpoint file at {path}")
    if path.endswith(".safetensors"):
        raise HeadError(
            f"{path} is a safetensors file; SWIFT reference checkpoints are torch.save() .pt files. "
            "A swift-fast head (.safetensors) needs no import: pass it to --head directly"
        )
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "Unsupported global" not in str(e):  # bytes that are no pickle of anything, e.g. a truncated file
            raise HeadError(f"{path} is not a readable PyTorch checkpoint{_unpickler_culprit(e)}") from None
        raise HeadError(
            f"{path}: refused: it pickles objects beyond tensors and plain containers{_unpickler_culprit(e)}, "
            "and unpickling them would run code from the file: swift-fast refuses to run code from a checkpoint "
            "(torch.load(weights_only=True)). A reference checkpoint is torch.save(model.state_dict()) and holds "
            "only tensors; if this is a whole pickled model, re-save its state_dict() where it was made"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise HeadError(f"{path} is not a readable PyTorch checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(sd, Mapping):
        raise HeadError(
            f"{path} holds a {type(sd).__name__}, not a state dict: the SWIFT reference saves "
            "torch.save(reward_model.state_dict())"
        )
    return sd


def _reference_gate(path: str, sd: Mapping) -> bool:
    """Whether ``sd`` is a gated head (``fused_layer.*``) rather than a ``--disable_gate`` one
    (``reward_layer.*``), once its keys are checked to be exactly one of the two sets."""
    keys = [str(k) for k in sd.keys()]
    for k, v in sd.items():
        if isinstance(v, Mapping):
            raise HeadError(
                f"{path}: key {k!r} holds a dict, not a tensor ({len(keys)} top-level keys: {keys[:8]}). The SWIFT "
                "reference code saves the bare state dict and never wraps it; if you wrapped it yourself, "
                f"save the inner dict (torch.save(ckpt[{k!r}], 'head.pt')) and import that"
            )
    dim = [k for k in keys if k.startswith(DIM_REDUCTION_PREFIXES)]
    if dim:
        raise HeadError(
            f"{path} is a dimension-reduction checkpoint (keys {dim[:4]}): the reference code never finished that "
            "mode (--use_dim_reduction: its DimReduction and RewardModelWithDimReduction raise "
            "NotImplementedError), so there is no defined head to import. Train without --use_dim_reduction, "
            "or with `swift-fast train`"
        )
    has_gated = any(k in keys for k in GATED_KEYS)
    has_plain = any(k in keys for k in PLAIN_KEYS)
    if has_gated and has_plain:
        raise HeadError(
            f"{path} holds both fused_layer.* (gated head) and reward_layer.* (--disable_gate head) keys; a "
            f"reference checkpoint has one set: {keys}"
        )
    gate = not has_plain
    want = GATED_KEYS if gate else PLAIN_KEYS
    unknown = [k for k in keys if k not in want]
    if unknown:
        raise HeadError(
            f"{path}: unknown key(s) {unknown}; a SWIFT reference checkpoint (LinearRewardModel) holds exactly "
            f"{list(GATED_KEYS)} (with gate) or {list(PLAIN_KEYS)} (--disable_gate)"
        )
    missing = [k for k in want if k not in keys]
    if missing:
        kind = "gated" if gate else "--disable_gate"
        raise HeadError(f"{path} lacks {missing}: a {kind} reference head has {list(want)}")
    return gate


def _check_reference_tensors(path: str, want, w, b, rows: int) -> None:
    """Refuse a weight ``w`` or bias ``b`` (keys ``want``) that is no finite floating-point tensor
    of shape ``[rows, D]`` or ``[rows]``."""
    for k, t in ((want[0], w), (want[1], b)):
        if not isinstance(t, torch.Tensor):
            raise HeadError(f"{path}: {k} is a {type(t).__name__}, not a tensor")
        if t.dtype not in _FLOATS:
            raise HeadError(f"{path}: {k} has dtype {t.dtype}; a reference head is floating point (float32)")
    if w.dim() != 2 or w.shape[0] != rows or w.shape[1] == 0:
        raise HeadError(f"{path}: {want[0]} has shape {tuple(w.shape)}, expected [{rows}, D]")
    if tuple(b.shape) != (rows,):
        raise HeadError(f"{path}: {want[1]} has shape {tuple(b.shape)}, expected [{rows}]")
    if not (torch.isfinite(w).all() and torch.isfinite(b).all()):
        raise HeadError(f"{path}: the checkpoint's weights contain NaN or infinity (a diverged training run?)")


def import_reference_checkpoint(
    path: str | os.PathLike,
    config: Any,
    *,
    layers: str | Iterable[int] | None = None,
    apply_norm: bool = False,
    logits: bool = False,
    norm_weight: torch.Tensor | None = None,
    model_name: str | None = None,
) -> SwiftHead:
    """A SWIFT reference checkpoint (``torch.save`` of a ``LinearRewardModel``) as a ``SwiftHead``.

    Args:
        path: the ``.pt`` file ``train/extract_train.py`` wrote.
        config: the model's Hugging Face config (what ``AutoConfig.from_pretrained`` returns).
        layers: the ``--layers`` the checkpoint was trained with: ``None`` (the reference default,
            all ``L + 1`` states), ``"lastN"``, ``"0,4,8"`` or ints, in any order (see ``reference_layers``).
        apply_norm: trained with ``--apply_norm``; needs ``norm_weight``.
        logits: trained with ``--logits_mode``.
        norm_weight: the final RMSNorm's gain, ``[hidden_size]`` floating point (``model.norm.weight``;
            ``read_final_norm_weight`` reads it from the model's files).
        model_name: what the head records as its model (default: the config's ``name_or_path``).
    Returns:
        A float32 head on the CPU, alignment ``"emitted"``, bound to ``config``; ``provenance``
        records the source file and its sha256, the options and any notes on how ``layers`` was read.
    """
    if layers is not None and not isinstance(layers, str):
        layers = [int(i) for i in layers]  # read twice: for the head and for its provenance
    check_options(layers=layers, apply_norm=apply_norm, logits=logits)
    if norm_weight is not None and not apply_norm:
        raise HeadError("norm_weight is only used with apply_norm=True (a checkpoint trained with --apply_norm)")
    path = os.fspath(path)
    sd, gate = load_reference_state_dict(path)
    w, b = (sd[k] for k in (GATED_KEYS if gate else PLAIN_KEYS))
    fp = model_fingerprint(config)
    d, L, V = fp["hidden_size"], fp["num_layers"], fp["vocab_size"]
    model = model_name or getattr(config, "name_or_path", None) or fp["architecture"]
    D = int(w.shape[1])
    notes: list[str] = []
    norm_eps = None
    if logits:
        if D != V:
            raise HeadError(_logits_mismatch(path, D, V, d, model))
        weight = w.double()
        width, head_layers = V, None
    else:
        sel = reference_layers(layers, L)
        notes += sel.notes
        if D != len(sel.raw) * d:
            raise HeadError(_hidden_mismatch(path, D, len(sel.raw), d, L, V, model, layers is None))
        weight, norm_eps = _merged_hidden_weight(w, sel, d, L, apply_norm, norm_weight, config, model, notes)
        width, head_layers = d, sel.head_layers
    head = SwiftHead(width, head_layers, gate=gate, alignment="emitted",
                     feature="logits" if logits else "hidden", norm_eps=norm_eps)
    w32, b32 = weight.float(), b.float()
    if not (torch.isfinite(w32).all() and torch.isfinite(b32).all()):
        raise HeadError(f"{path}: the weights overflow float32 once the norm gain is folded in")
    with torch.no_grad():
        head.weight.copy_(w32)
        head.bias.copy_(b32)
    head.bind_model(config, name=model_name)
    head.provenance = _import_provenance(path, sd, D, layers, apply_norm, logits, gate, notes)
    return head


def _merged_hidden_weight(w, sel: ReferenceLayers, d: int, L: int, apply_norm: bool, norm_weight, config,
                          model: str, notes: list[str]) -> tuple[torch.Tensor, float | None]:
    """``(weight, norm_eps)``: the reference weight ``w`` (``[rows, k * d]``, blocks in the order of
    ``sel.raw``) as the head's ``[rows, len(head_layers) * d]`` float64 weight, blocks of repeated
    states summed, the final norm's gain folded in with ``apply_norm`` (``norm_eps`` its epsilon,
    else None); appends to ``notes``. ``L``: the model's number of layers."""
    k = len(sel.raw)
    blocks = w.double().view(w.shape[0], k, d)
    head_layers = sel.head_layers
    slot = {j: n for n, j in enumerate(head_layers)}
    merged = torch.zeros(w.shape[0], len(head_layers), d, dtype=torch.float64)
    for i, j in enumerate(sel.resolved):
        merged[:, slot[j]] += blocks[:, i]
    norm_eps = None
    if apply_norm:
        g, norm_eps = _check_norm(norm_weight, config, d, model)
        merged *= g.double()
        if L in head_layers:
            notes.append(
                f"--apply_norm normalises state {L}, already the final norm's output, a second time, as the "
                "reference does: the head reproduces that"
            )
    return merged.reshape(w.shape[0], -1), norm_eps


def _import_provenance(path: str, sd: dict, D: int, layers, apply_norm: bool, logits: bool, gate: bool,
                       notes: list[str]) -> dict:
    """The provenance an imported head records: the tool, the source file, the options, ``notes``."""
    from .. import __version__
    from ..support.files import sha256_of

    return {
        "created_by": TOOL,
        "swift_fast": __version__,
        "source": {
            "format": f"{REFERENCE_REPO} LinearRewardModel state dict",
            "path": os.path.abspath(path),
            "sha256": sha256_of(path),
            "keys": sorted(sd),
            "D": D,
        },
        "options": {
            "layers": layers,
            "apply_norm": bool(apply_norm),
            "logits_mode": bool(logits),
            "disable_gate": not gate,
        },
        "notes": notes,
    }


def read_final_norm_weight(model: str | os.PathLike, key: str = FINAL_NORM_KEY) -> torch.Tensor:
    """The final norm's gain (``[hidden_size]``, the checkpoint's dtype) from a model's safetensors
    files, without loading the model: the shard that ``model.safetensors.index.json`` names for
    ``key``, or the single ``model.safetensors``. ``model`` is a local folder or a Hub name (files
    come from the Hugging Face cache, downloading only that shard when it is missing)."""
    from safetensors import SafetensorError, safe_open
    from transformers.utils import cached_file

    model = os.fspath(model)

    def find(name):
        return cached_file(model, name, _raise_exceptions_for_missing_entries=False)

    index = find("model.safetensors.index.json")
    if index:
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise HeadError(f"{index}: unreadable safetensors index ({type(e).__name__}: {e})") from None
        if key not in weight_map:
            raise HeadError(
                f"model {model}: its safetensors index has no tensor {key!r} (the final norm of a Llama, Qwen2, "
                "Qwen3 or Mistral ...ForCausalLM), which --apply-norm folds into the head"
            )
        file = find(weight_map[key])
        if not file:
            raise HeadError(f"model {model}: shard {weight_map[key]} named by its index for {key} is missing")
    else:
        file = find("model.safetensors")
        if not file:
            raise HeadError(
                f"model {model} has neither model.safetensors nor model.safetensors.index.json: --apply-norm reads "
                f"the final norm's weight ({key}) from safetensors files (pickled .bin weights are not read)"
            )
    try:
        with safe_open(file, framework="pt") as f:
            if key not in f.keys():
                raise HeadError(f"{file} has no tensor {key!r}, the final norm that --apply-norm folds into the head")
            return f.get_tensor(key)
    except (SafetensorError, OSError) as e:
        raise HeadError(f"{file}: unreadable safetensors file ({e})") from None


# -- helpers -------------------------------------------------------------------------------------


def _check_norm(norm_weight, config, d: int, model: str) -> tuple[torch.Tensor, float]:
    """``(g, eps)`` of the model's final RMSNorm, checked."""
    from .features import SUPPORTED_MODEL_TYPES

    mt = config.get("model_type") if isinstance(config, Mapping) else getattr(config, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        raise HeadError(
            f"--apply-norm folds the final RMSNorm (g * h / rms(h)) of a Llama, Qwen2, Qwen3 or Mistral model "
            f"into the head; model {model} has model_type {mt!r}"
        )
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    eps = text.get("rms_norm_eps") if isinstance(text, Mapping) else getattr(text, "rms_norm_eps", None)
    if eps is None:
        raise HeadError(f"model {model}: its config has no rms_norm_eps, the epsilon of the final norm to fold")
    if norm_weight is None:
        raise HeadError(
            f"apply_norm needs the final norm's weight (norm_weight, [{d}]): read_final_norm_weight({model!r}) "
            "reads it from the model's files"
        )
    g = norm_weight
    if not isinstance(g, torch.Tensor) or g.dtype not in _FLOATS or tuple(g.shape) != (d,):
        desc = f"{g.dtype} {tuple(g.shape)}" if isinstance(g, torch.Tensor) else type(g).__name__
        raise HeadError(f"the final norm's weight must be a floating-point [{d}] tensor (hidden size), got {desc}")
    if not torch.isfinite(g).all():
        raise HeadError(f"model {model}: its final norm's weight contains NaN or infinity")
    return g.detach().cpu(), float(eps)


def _unpickler_culprit(e: Exception) -> str:
    """`` (it needs a.b.C)`` from torch's weights-only error, whose first lines are generic advice."""
    m = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
    if m:
        return f" (it needs {m.group(1)})"
    m = re.search(r"WeightsUnpickler error: ([^\n]+)", str(e))
    return f" ({m.group(1).strip()})" if m else ""


def _hidden_mismatch(path, D, k, d, L, V, model, default) -> str:
    sel = f"all {L + 1} hidden states (the default)" if default else f"{k} layer(s)"
    msg = (
        f"{path}: the checkpoint's head reads D = {D} features, but {sel} of model {model} give "
        f"hidden size {d} x {k} layers = {k * d}"
    )
    hints = []
    if D == V:
        hints.append(f"D equals the vocabulary size {V}: a --logits_mode checkpoint? pass --logits")
    if D % d == 0 and D // d <= L + 1:
        kk = D // d
        fix = "omit --layers (all hidden states)" if kk == L + 1 else f"pass --layers with {kk} indices"
        hints.append(f"D = {kk} x {d}: {fix}, the --layers the checkpoint was trained with")
    if hints:
        return f"{msg}. {'; or '.join(hints)}"
    if D % d == 0:
        return (
            f"{msg}. D = {D // d} x {d}: more states than this model's {L + 1} (0..{L}): the checkpoint was "
            "trained on a deeper model"
        )
    return f"{msg}. D is not a multiple of the hidden size {d}: the checkpoint was trained on another model"


def _logits_mismatch(path, D, V, d, model) -> str:
    msg = f"{path}: the checkpoint's head reads D = {D} features, but the logits of model {model} have {V} (vocabulary)"
    if D % d == 0:
        return f"{msg}. D = {D // d} x {d} (hidden size): a hidden-state checkpoint: drop --logits"
    return f"{msg}: the checkpoint was trained on another model"
