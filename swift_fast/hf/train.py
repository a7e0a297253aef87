"""Training a SWIFT head on rollouts with a Hugging Face model: features recomputed batch by batch.

The states a head reads are recomputed from the model for each training batch (one forward of
the decoder stack over the batch's sequences, keeping only the selected states of the scored
tokens for the duration of the step): nothing is written to disk unless a cache is asked for.
``cache_dir`` keeps those states in a memory-mapped file, bit-exact in the model's dtype, so
later epochs read instead of recompute; its size is ``tokens x layers x d x bytes``, which suits
small models. Without a cache every epoch costs as much as the first (validation included): the
progress output says so, and names the cache with its size when that size suits the disk
(``CACHE_HINT_MAX_BYTES``, half the free space of the working directory's disk at most).

The labels are checked before anything is computed (``swift_fast.training.check_label_balance``);
``check_rollouts`` runs the same check on a rollout file without a model.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..files import sha256_of
from ..head import SwiftHead, model_fingerprint, resolve_layers
from ..training import (
    DEFAULT_ALPHA,
    GROUP_LOSSES,
    LOSSES,
    Example,
    TrainResult,
    check_label_balance,
    split_by_problem,
    train_head,
)
from .features import decoder_parts, extract_features
from .rollout_data import RolloutSequences, rollout_sequences

_INT_OF_SIZE = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_TORCH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: largest feature cache the progress output suggests; past it, reading the cache back every epoch
#: stops being an obvious win over recomputing
CACHE_HINT_MAX_BYTES = 64 * 2**30


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class FeatureCache:
    """States of scored tokens on disk: ``states.bin`` ``[rows, k, d]`` holding the model dtype's raw
    bits, ``filled.npy`` (which sequences are written) and ``meta.json`` (what was cached). A cache
    made for other data, model or layers is discarded, never reused."""

    def __init__(self, path: str, spec: dict, row_counts: Sequence[int], k: int, d: int, dtype: torch.dtype):
        self.path = path
        os.makedirs(path, exist_ok=True)
        self.dtype = dtype
        self.size = torch.empty((), dtype=dtype).element_size()
        self.k, self.d = k, d
        self.offsets = np.zeros(len(row_counts) + 1, dtype=np.int64)
        self.offsets[1:] = np.cumsum(row_counts)
        meta = dict(spec, rows=int(self.offsets[-1]), k=k, d=d, dtype=str(dtype))
        meta_path = os.path.join(path, "meta.json")
        bin_path = os.path.join(path, "states.bin")
        filled_path = os.path.join(path, "filled.npy")
        old = None
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                old = json.load(f)
        shape = (max(1, int(self.offsets[-1])), k, d)
        if old == meta and os.path.exists(bin_path) and os.path.exists(filled_path):
            self.filled = np.load(filled_path)
            self.data = np.memmap(bin_path, dtype=_INT_OF_SIZE[self.size], mode="r+", shape=shape)
        else:
            for p in (meta_path, bin_path, filled_path):
                if os.path.exists(p):
                    os.remove(p)
            self.filled = np.zeros(len(row_counts), dtype=bool)
            self.data = np.memmap(bin_path, dtype=_INT_OF_SIZE[self.size], mode="w+", shape=shape)
            with open(meta_path, "w") as f:
                json.dump(meta, f)
        self._filled_path = filled_path

    def missing(self, keys: Sequence[int]) -> list[int]:
        return [k for k in keys if not self.filled[k]]

    def write(self, keys: Sequence[int], states: list[torch.Tensor], cu: torch.Tensor) -> None:
        stacked = torch.stack([s.detach().to("cpu", self.dtype) for s in states], 1)  # [N, k, d]
        raw = stacked.view(_TORCH_INT[self.size]).numpy()
        for j, key in enumerate(keys):
            a, b = int(cu[j]), int(cu[j + 1])
            self.data[self.offsets[key] : self.offsets[key] + (b - a)] = raw[a:b]
            self.filled[key] = True
        self.data.flush()
        np.save(self._filled_path, self.filled)

    def read(self, keys: Sequence[int], device) -> tuple[list[torch.Tensor], torch.Tensor]:
        parts = [np.asarray(self.data[self.offsets[k] : self.offsets[k + 1]]) for k in keys]
        raw = torch.from_numpy(
            np.concatenate(parts, 0) if parts else np.zeros((0, self.k, self.d), _INT_OF_SIZE[self.size])
        )
        x = raw.view(self.dtype).to(device)
        cu = torch.zeros(len(keys) + 1, dtype=torch.long)
        cu[1:] = torch.tensor([int(self.offsets[k + 1] - self.offsets[k]) for k in keys], dtype=torch.long).cumsum(0)
        return [x[:, i] for i in range(self.k)], cu


class HFFeatureSource:
    """``FeatureSource`` over token-id sequences: the head's states, recomputed by the model."""

    def __init__(
        self,
        model: nn.Module,
        sequences: list[list[int]],
        prompt_lengths: list[int],
        layers: list[int],
        alignment: str,
        feature: str,
        cache_dir: str | None = None,
        spec: dict | None = None,
    ):
        self.model = model
        self.parts = decoder_parts(model)
        self.sequences = sequences
        self.prompt_lengths = prompt_lengths
        self.layers = layers
        self.alignment = alignment
        self.feature = feature
        self.cache = None
        d = self.parts.vocab_size if feature == "logits" else self.parts.hidden_size
        dtype = torch.float32 if feature == "logits" else self.parts.lm_head.weight.dtype
        counts = [len(s) - p for s, p in zip(sequences, prompt_lengths)]
        #: bytes a feature cache of these sequences takes on disk
        self.cache_bytes = sum(counts) * len(layers) * d * torch.empty((), dtype=dtype).element_size()
        if cache_dir:
            self.cache = FeatureCache(cache_dir, spec or {}, counts, len(layers), d, dtype)
        self.recomputes = self.cache is None
        self.progress_note = self._note() if self.recomputes else None

    def _note(self) -> str:
        text = "features are recomputed by the model for every batch of every epoch, validation included"
        try:
            free = shutil.disk_usage(os.getcwd()).free
        except OSError:
            free = 0
        if self.cache_bytes <= min(CACHE_HINT_MAX_BYTES, free // 2):
            text += (
                f"; a feature cache computes them once and reads them back afterwards: --cache-dir DIR "
                f"(cache_dir= in Python), about {_bytes(self.cache_bytes)} on disk here"
            )
        return text

    def _compute(self, keys: Sequence[int]):
        return extract_features(
            self.model,
            [self.sequences[k] for k in keys],
            [self.prompt_lengths[k] for k in keys],
            layers=self.layers,
            alignment=self.alignment,
            feature=self.feature,
            dtype=torch.float32 if self.feature == "logits" else None,
        )

    def features(self, keys: Sequence[int]):
        if self.cache is None:
            return self._compute(keys)
        missing = self.cache.missing(keys)
        if missing:
            states, cu = self._compute(missing)
            self.cache.write(missing, states, cu)
        return self.cache.read(keys, self.parts.device)


def _data_digest(seqs: RolloutSequences) -> str:
    h = hashlib.sha256()
    for s, p in zip(seqs.sequences, seqs.prompt_lengths):
        h.update(json.dumps([p, s]).encode())
    return h.hexdigest()


@dataclass
class _Split:
    seqs: RolloutSequences
    keep: list[int]  # candidates with a response, the ones trained on
    pid: list[str]  # problem id of each kept candidate
    train_ids: list[str]
    val_ids: list[str]
    train: list[Example]
    val: list[Example]


def _split(rollouts, val_fraction: float, seed: int) -> _Split:
    seqs = rollout_sequences(rollouts, need_labels=True)
    keep = [i for i in range(len(seqs.sequences)) if seqs.response_length(i) > 0]
    if not keep:
        raise ValueError("every candidate has an empty response: nothing to train on")
    pid = [seqs.problems[seqs.refs[i][0]].id for i in keep]
    train_ids, val_ids = split_by_problem(pid, val_fraction, seed)
    val_set = set(val_ids)
    examples: dict[bool, list[Example]] = {True: [], False: []}
    for i, p in zip(keep, pid):
        examples[p in val_set].append(Example(key=i, problem=p, label=bool(seqs.labels[i])))
    return _Split(seqs, keep, pid, train_ids, val_ids, examples[False], examples[True])


def check_rollouts(rollouts, loss: str = "bce", val_fraction: float = 0.2, seed: int = 0) -> dict:
    """The label balance of the split ``train_from_rollouts`` would make of ``rollouts`` (a path or
    ``Problem`` list) with these arguments, ``{"train": counts, "val": counts}``; raises
    ``swift_fast.training.LabelBalanceError`` when that split cannot teach ``loss``. No model needed,
    so a command can refuse before loading one."""
    sp = _split(rollouts, val_fraction, seed)
    return check_label_balance(sp.train, sp.val, loss)


def train_from_rollouts(
    model: nn.Module,
    rollouts,
    layers: str | Sequence[int] = "all",
    feature: str = "hidden",
    gate: bool = True,
    alignment: str = "predicting",
    loss: str = "bce",
    lr: float = 1e-4,
    weight_decay: float = 1e-5,
    batch_size: int = 16,
    max_epochs: int = 20,
    patience: int = 3,
    val_fraction: float = 0.2,
    seed: int = 0,
    alpha: float = DEFAULT_ALPHA,
    cache_dir: str | None = None,
    progress: bool = True,
    model_name: str | None = None,
    on_epoch: Callable | None = None,
) -> tuple[SwiftHead, TrainResult]:
    """Train a SWIFT head for ``model`` on graded rollouts (a rollout file path or ``Problem`` list).

    Candidates with an empty response carry no scored token and are left out (counted in the
    head's provenance as ``skipped_empty``). Returns ``(head, result)``; the head is bound to
    the model and its ``provenance`` records data, label balance per split, loss, optimiser,
    best epoch and validation metrics.

    Raises ``swift_fast.training.LabelBalanceError`` before computing any feature when a split
    cannot teach the loss (a single class for bce/hinge; no problem with both a correct and an
    incorrect candidate for dpo/infonca/nca), with the counts and what to change.
    """
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; expected one of {', '.join(LOSSES)}")
    parts = decoder_parts(model)
    sp = _split(rollouts, val_fraction, seed)
    seqs, keep, pid, train_ids, val_ids = sp.seqs, sp.keep, sp.pid, sp.train_ids, sp.val_ids
    skipped = len(seqs.sequences) - len(keep)
    # before the head, the source and a cache file exist: a refusal costs nothing
    check_label_balance(sp.train, sp.val, loss)
    if feature == "logits":
        sel, width = None, parts.vocab_size
    else:
        sel, width = resolve_layers(layers, parts.num_layers), parts.hidden_size
    head = SwiftHead(width, sel, gate=gate, alignment=alignment, feature=feature)
    config = parts.model.config
    name = model_name or getattr(config, "name_or_path", "") or getattr(config, "_name_or_path", "")
    head.bind_model(config, name=name or None)
    head.to(parts.device)
    data_path = os.fspath(rollouts) if isinstance(rollouts, (str, os.PathLike)) else None
    spec = {
        "model": name,
        "fingerprint": model_fingerprint(config),
        "dtype": str(parts.lm_head.weight.dtype),
        "layers": head.layers,
        "alignment": alignment,
        "feature": feature,
        "data": _data_digest(seqs),
    }
    source = HFFeatureSource(
        model, seqs.sequences, seqs.prompt_lengths, head.layers, alignment, feature, cache_dir, spec
    )
    result = train_head(
        head,
        source,
        sp.train,
        sp.val,
        loss=loss,
        lr=lr,
        weight_decay=weight_decay,
        batch_size=batch_size,
        max_epochs=max_epochs,
        patience=patience,
        seed=seed,
        alpha=alpha,
        progress=progress,
        on_epoch=on_epoch,
    )
    labels = [bool(seqs.labels[i]) for i in keep]
    from .. import __version__

    head.provenance = _finite_or_none({
        "swift_fast": __version__,
        "data": {
            "path": data_path,
            "sha256": sha256_of(data_path) if data_path else None,
            "problems": len(set(pid)),
            "candidates": len(keep),
            "skipped_empty": skipped,
            "positive_rate": sum(labels) / len(labels),
            "train_problems": len(train_ids),
            "val_problems": len(val_ids),
            "labels": result.labels,
            "split": {"by": "problem", "val_fraction": val_fraction, "seed": seed},
        },
        "loss": loss,
        **({"alpha": alpha} if loss in GROUP_LOSSES else {}),
        "optimizer": {"name": "AdamW", "lr": lr, "weight_decay": weight_decay},
        "batch_size": batch_size,
        "max_epochs": max_epochs,
        "patience": patience,
        "seed": seed,
        "epochs_run": result.epochs_run,
        "best_epoch": result.best_epoch,
        "stopped_early": result.stopped_early,
        "val_metrics": result.val_metrics,
        "history": result.history,
    })
    return head, result


def _finite_or_none(x):
    """NaN and infinity (an AUC without both classes, say) become null: the metadata stays strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    return x
