"""The feature cache of ``train``: the states a head reads, kept on disk so that later epochs read
instead of recompute.

``cache_dir`` keeps those states in a memory-mapped file (``FeatureCache``), filled before the first
epoch one prompt at a time: its candidates' forward runs the shared prompt once
(``extract_features(prefix=...)``), cut by length into runs that pad least (``padding_runs``). It
holds only the head's selected states of the response tokens, hidden states in bfloat16 (logits in
float32), ``tokens x layers x d x 2`` bytes, said before the cache is written (``describe_cache``,
``feature_cache_plan``). Every epoch, the first included, reads the cached values, so a cached run
trains on the features rounded once to bfloat16 (``cache_dtype``). Without a cache every epoch costs
as much as the first: the progress output names the cache with its size when that size suits the
disk (``CACHE_HINT_MAX_BYTES``, half the free space of the working directory's disk at most).

Apart from :mod:`swift_fast.hf.train` because the on-disk layout, its reuse rules and its size
checks are one concern, separate from feeding a training loop; ``train`` re-exports every public
name here."""

from __future__ import annotations

import json
import os
import shutil
from typing import Sequence

import numpy as np
import torch

from ..rewards.head import resolve_layers
from .rollout_data import rollout_sequences

_INT_OF_SIZE = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_TORCH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

#: largest feature cache the progress output suggests; past it, reading the cache back every epoch
#: stops being an obvious win over recomputing
CACHE_HINT_MAX_BYTES = 64 * 2**30

#: what a feature cache stores hidden states in: half the bytes of float32 and the exponent range
#: of any model dtype; a head reads states in float32 and learns a direction, not the last bits
CACHE_HIDDEN_DTYPE = torch.bfloat16


def cache_dtype(feature: str) -> torch.dtype:
    """The dtype a feature cache stores ``feature`` in: bfloat16 hidden states, float32 logits
    (the logit feature's values span a range where bfloat16's 8 bits of mantissa lose the ranking
    of close tokens)."""
    return torch.float32 if feature == "logits" else CACHE_HIDDEN_DTYPE


def format_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def describe_cache(path: str, rows: int, k: int, d: int, dtype: torch.dtype) -> str:
    """One sentence: where a feature cache goes and how much disk it takes."""
    size = rows * k * d * torch.empty((), dtype=dtype).element_size()
    return (
        f"feature cache {path}: about {format_bytes(size)} on disk ({rows} scored tokens x {k} x {d} values in "
        f"{str(dtype).removeprefix('torch.')})"
    )


def feature_cache_plan(rollouts, config, layers: str | Sequence[int] = "all", feature: str = "hidden") -> dict:
    """What ``train_from_rollouts(cache_dir=...)`` would write for ``rollouts`` and a model with
    ``config``, known before the model is loaded: ``rows`` (scored tokens), ``k`` (states per
    token), ``d``, ``dtype``, ``bytes``."""
    seqs = rollout_sequences(rollouts, need_labels=True)
    rows = sum(seqs.response_length(i) for i in range(len(seqs.sequences)))
    if feature == "logits":
        k, d = 1, int(config.vocab_size)
    else:
        k, d = len(resolve_layers(layers, int(config.num_hidden_layers))), int(config.hidden_size)
    dtype = cache_dtype(feature)
    return {"rows": rows, "k": k, "d": d, "dtype": dtype,
            "bytes": rows * k * d * torch.empty((), dtype=dtype).element_size()}


class FeatureCache:
    """States of scored tokens on disk: ``states.bin`` ``[rows, k, d]`` holding the raw bits of
    ``dtype`` (bfloat16 for hidden states: ``cache_dtype``), only the head's selected states of the
    response tokens; ``filled.npy`` (which sequences are written), ``mean_logprob.npy`` (the model's
    mean log-prob of each response, NaN where not computed) and ``meta.json`` (what was cached). A
    cache made for other data, model, layers or dtype is discarded, never reused. A new cache larger
    than the free space of its disk is refused before anything is written (a memory map that runs
    out of disk kills the process)."""

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
        lp_path = os.path.join(path, "mean_logprob.npy")
        old = None
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                old = json.load(f)
        shape = (max(1, int(self.offsets[-1])), k, d)
        #: True when an earlier run's cache for the same data is read back
        self.reused = old == meta and os.path.exists(bin_path) and os.path.exists(filled_path)
        if self.reused:
            self.filled = np.load(filled_path)
            self.mean_logprob = np.load(lp_path) if os.path.exists(lp_path) else np.full(len(row_counts), np.nan)
            self.data = np.memmap(bin_path, dtype=_INT_OF_SIZE[self.size], mode="r+", shape=shape)
        else:
            for p in (meta_path, bin_path, filled_path, lp_path):
                if os.path.exists(p):
                    os.remove(p)
            need = shape[0] * k * d * self.size
            free = shutil.disk_usage(path).free
            if need > free:
                raise OSError(
                    f"the feature cache in {path} needs about {format_bytes(need)} but its disk has "
                    f"{format_bytes(free)} free: "
                    "free some space, put the cache on another disk, select fewer layers (--layers lastN), or "
                    "train without a cache (features recomputed every epoch)"
                )
            self.filled = np.zeros(len(row_counts), dtype=bool)
            self.mean_logprob = np.full(len(row_counts), np.nan)
            self.data = np.memmap(bin_path, dtype=_INT_OF_SIZE[self.size], mode="w+", shape=shape)
            with open(meta_path, "w") as f:
                json.dump(meta, f)
        self._filled_path = filled_path
        self._lp_path = lp_path

    def missing(self, keys: Sequence[int]) -> list[int]:
        return [k for k in keys if not self.filled[k]]

    def write(self, keys: Sequence[int], states: list[torch.Tensor], cu: torch.Tensor) -> None:
        # the one rounding to the cache dtype: every epoch reads these same values back
        stacked = torch.stack([s.detach().to("cpu", self.dtype) for s in states], 1)  # [N, k, d]
        raw = stacked.view(_TORCH_INT[self.size]).numpy()
        for j, key in enumerate(keys):
            a, b = int(cu[j]), int(cu[j + 1])
            self.data[self.offsets[key] : self.offsets[key] + (b - a)] = raw[a:b]
            self.filled[key] = True
        self.data.flush()
        np.save(self._filled_path, self.filled)
        self.save_logprobs()

    def save_logprobs(self) -> None:
        np.save(self._lp_path, self.mean_logprob)

    def read(self, keys: Sequence[int], device) -> tuple[list[torch.Tensor], torch.Tensor]:
        parts = [np.asarray(self.data[self.offsets[k] : self.offsets[k + 1]]) for k in keys]
        raw = torch.from_numpy(
            np.concatenate(parts, 0) if parts else np.zeros((0, self.k, self.d), _INT_OF_SIZE[self.size])
        )
        x = raw.view(self.dtype).to(device)
        cu = torch.zeros(len(keys) + 1, dtype=torch.long)
        cu[1:] = torch.tensor([int(self.offsets[k + 1] - self.offsets[k]) for k in keys], dtype=torch.long).cumsum(0)
        return [x[:, i] for i in range(self.k)], cu


def padding_runs(lengths: Sequence[int], fixed: int, most: int) -> list[tuple[int, int]]:
    """Cut ``lengths`` (ascending) into runs ``[a, b)`` of at most ``most`` that minimise the
    tokens a right-padded forward of each run computes: ``(b - a) * lengths[b - 1]`` plus
    ``fixed`` per run (its shared prefix, run once). One long answer then pads only the run it
    ends, not all its prompt's candidates. Exact, by dynamic programming over the cut points."""
    n = len(lengths)
    best = [0] + [None] * n  # best[b]: least cost of lengths[:b]
    cut = [0] * (n + 1)
    for b in range(1, n + 1):
        for a in range(max(0, b - most), b):
            c = best[a] + fixed + (b - a) * lengths[b - 1]
            if best[b] is None or c < best[b]:
                best[b], cut[b] = c, a
    runs, b = [], n
    while b > 0:
        runs.append((cut[b], b))
        b = cut[b]
    return runs[::-1]
