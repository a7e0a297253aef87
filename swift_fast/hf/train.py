"""Training a SWIFT head on rollouts with a Hugging Face model: features recomputed batch by batch.

The states a head reads are recomputed from the model for each training batch (one forward of
the decoder stack over the batch's sequences, keeping only the selected states of the scored
tokens for the duration of the step): nothing is written to disk unless a cache is asked for.
``cache_dir`` keeps those states on disk so later epochs read instead of recompute
(:mod:`swift_fast.hf.feature_cache`, whose names are re-exported here). Without a cache every
epoch costs as much as the first (validation included): the progress output says so.

The labels are checked before anything is computed (``swift_fast.training.splits.check_label_balance``);
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

from ..rewards.head import SwiftHead, resolve_layers
from ..support.files import sha256_of
from ..training.loop import TrainResult, train_head
from ..training.losses import GROUP_LOSSES
from ..training.settings import SOLVERS as SOLVERS  # how a head is fitted; swift-fast 0.1 named them here
from ..training.settings import TrainSettings, with_overrides
from ..training.splits import Example, check_label_balance, split_by_problem
from .feature_cache import CACHE_HIDDEN_DTYPE as CACHE_HIDDEN_DTYPE
from .feature_cache import CACHE_HINT_MAX_BYTES, FeatureCache, cache_dtype, describe_cache, format_bytes, padding_runs
from .feature_cache import feature_cache_plan as feature_cache_plan
from .features import decoder_parts, extract_features
from .logprobs import logprobs_from_hidden
from .rollout_data import RolloutSequences, rollout_sequences


class HFFeatureSource:
    """``FeatureSource`` over token-id sequences: the head's states, recomputed by the model, and
    the model's mean log-prob of each response (``mean_logprobs``), taken from the same forward.

    ``logprob_keys``: the sequences whose log-probs are wanted (None: all); the others skip the
    ``lm_head`` pass a log-prob costs."""

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
        logprob_keys: Sequence[int] | None = None,
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
        dtype = cache_dtype(feature)
        counts = [len(s) - p for s, p in zip(sequences, prompt_lengths)]
        #: bytes a feature cache of these sequences takes on disk
        self.cache_bytes = sum(counts) * len(layers) * d * torch.empty((), dtype=dtype).element_size()
        self.logprob_keys = None if logprob_keys is None else set(int(k) for k in logprob_keys)
        self._mean_lp = np.full(len(sequences), np.nan)
        self.cache_note = None
        if cache_dir:
            self.cache_note = describe_cache(cache_dir, sum(counts), len(layers), d, dtype)
            self.cache = FeatureCache(cache_dir, spec or {}, counts, len(layers), d, dtype)
            self._mean_lp = self.cache.mean_logprob
            self.cache_note += (
                ", read back from an earlier run" if self.cache.reused
                else ", written before the first epoch and read back afterwards"
            )
        self.recomputes = self.cache is None
        self.progress_note = self._note() if self.recomputes else self.cache_note

    def _note(self) -> str:
        text = "features are recomputed by the model for every batch of every epoch, validation included"
        try:
            free = shutil.disk_usage(os.getcwd()).free
        except OSError:
            free = 0
        if self.cache_bytes <= min(CACHE_HINT_MAX_BYTES, free // 2):
            text += (
                f"; a feature cache computes them once and reads them back afterwards: --cache-dir DIR "
                f"(cache_dir= in Python), about {format_bytes(self.cache_bytes)} on disk here"
            )
        return text

    def _prompt_key(self, k: int) -> tuple:
        return tuple(self.sequences[k][: self.prompt_lengths[k]])

    def _compute(self, keys: Sequence[int]):
        """States of ``keys`` (packed in their order) and their mean log-probs. The candidates of
        one prompt run as one forward whose prompt runs once (``extract_features(prefix=...)``):
        a prompt is often longer than its short answers, so this runs far fewer tokens than a
        forward of every whole sequence."""
        groups: dict[tuple, list[int]] = {}
        for j, k in enumerate(keys):
            groups.setdefault(self._prompt_key(k), []).append(j)
        parts = [self._compute_group([keys[j] for j in g]) for g in groups.values()]
        if len(parts) == 1:
            return parts[0]
        # back to the order of ``keys``: row ranges of each key in the groups' packed order
        spans: list[torch.Tensor] = [None] * len(keys)  # type: ignore[list-item]
        base = 0
        for (_, cu), g in zip(parts, groups.values()):
            for i, j in enumerate(g):
                spans[j] = torch.arange(base + int(cu[i]), base + int(cu[i + 1]))
            base += int(cu[-1])
        index = torch.cat(spans).to(parts[0][0][0].device) if spans else torch.zeros(0, dtype=torch.long)
        counts = torch.tensor([len(x) for x in spans], dtype=torch.long)
        cu = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
        states = [torch.cat([p[0][slot] for p in parts]).index_select(0, index) for slot in range(len(parts[0][0]))]
        return states, cu

    def _compute_group(self, keys: Sequence[int]):
        want = [
            j for j, k in enumerate(keys)
            if np.isnan(self._mean_lp[k]) and (self.logprob_keys is None or k in self.logprob_keys)
        ]
        on_final = self._logprob_hook(keys, want) if want else None
        plen = self.prompt_lengths[keys[0]]
        out = extract_features(
            self.model,
            [self.sequences[k] for k in keys],
            [self.prompt_lengths[k] for k in keys],
            layers=self.layers,
            alignment=self.alignment,
            feature=self.feature,
            dtype=torch.float32 if self.feature == "logits" else None,
            on_final=on_final,
            prefix=plen - 1 if len(keys) > 1 and plen > 1 else 0,
        )
        return out

    def _logprob_hook(self, keys: Sequence[int], want: list[int]):
        """A hook for ``extract_features(on_final=...)`` that stores the mean log-prob of the
        responses ``keys[j]`` for ``j`` in ``want`` (sequences whose prompt is empty have no state
        predicting their first token: they stay NaN)."""
        seqs = [self.sequences[keys[j]] for j in want]
        plens = [self.prompt_lengths[keys[j]] for j in want]
        ok = [p >= 1 and len(s) > p for s, p in zip(seqs, plens)]

        def on_final(h: torch.Tensor, offset: int) -> None:
            # log P(r_j | prefix) comes from the logits at the position before r_j: the 'predicting' rows
            # (column t of h is position offset + t; the shared prefix ends before any of them)
            lengths = [len(s) - offset if good else 1 for s, good in zip(seqs, ok)]
            starts = [p - offset if good else 1 for p, good in zip(plens, ok)]
            width = h.shape[1]
            rows = []
            for row, j in enumerate(want):
                b = j  # row of the batch the forward ran: sequences keep their order in ``keys``
                rows.append(torch.arange(b * width + starts[row] - 1, b * width + lengths[row] - 1))
            rows_t = torch.cat(rows).to(h.device)
            targets = torch.tensor(
                [t for s, p, good in zip(seqs, plens, ok) if good for t in s[p:]], dtype=torch.long
            )
            hidden = h.reshape(-1, h.shape[-1]).index_select(0, rows_t).to(self.parts.lm_head.weight.device)
            lp = logprobs_from_hidden(hidden, self.parts.lm_head, targets.to(hidden.device)).double().cpu()
            a = 0
            for row, j in enumerate(want):
                m = lengths[row] - starts[row]
                if ok[row]:
                    self._mean_lp[keys[j]] = float(lp[a : a + m].mean())
                a += m

        return on_final

    def runs(self, keys: Sequence[int], batch_size: int = 32) -> list[list[int]]:
        """``keys`` in the batches that compute them fastest: one prompt's candidates together (the
        prompt runs once), shortest first, cut by ``padding_runs``. Every key once."""
        groups: dict[tuple, list[int]] = {}
        for k in sorted(keys, key=lambda k: len(self.sequences[k])):
            groups.setdefault(self._prompt_key(k), []).append(k)
        out = []
        for group in groups.values():
            lengths = [len(self.sequences[k]) - self.prompt_lengths[k] + 1 for k in group]
            out += [group[a:b] for a, b in padding_runs(lengths, self.prompt_lengths[group[0]] - 1, batch_size)]
        return out

    def fill(self, batch_size: int = 32, progress: bool = True) -> int:
        """Compute every sequence the cache lacks, in batches of similar length (a batch is padded
        to its longest sequence, so batches in the training's random order pad about twice as
        many tokens as these); returns how many were computed. Without a cache, nothing."""
        if self.cache is None:
            return 0
        from ..support.progress import phase

        todo = self.cache.missing(range(len(self.sequences)))
        if not todo:
            return 0
        bar = phase("features", total=len(todo), unit="candidate", enabled=progress)
        for keys in self.runs(todo, batch_size):
            states, cu = self._compute(keys)
            self.cache.write(keys, states, cu)
            bar.update(len(keys))
        bar.close()
        return len(todo)

    def features(self, keys: Sequence[int]):
        if self.cache is None:
            return self._compute(keys)
        missing = self.cache.missing(keys)
        if missing:
            states, cu = self._compute(missing)
            self.cache.write(missing, states, cu)
        return self.cache.read(keys, self.parts.device)

    def mean_logprobs(self, keys: Sequence[int]) -> torch.Tensor:
        """Mean ``log P(r_j | prompt, r_<j)`` of each response ``keys`` under the model (no
        temperature), float64 ``[len(keys)]``; computed with the features when they were, here
        otherwise. NaN for a sequence with an empty prompt or an empty response."""
        todo = [k for k in keys if np.isnan(self._mean_lp[k]) and self.prompt_lengths[k] >= 1
                and len(self.sequences[k]) > self.prompt_lengths[k]]
        if todo:
            wanted, self.logprob_keys = self.logprob_keys, None
            try:
                for a in range(0, len(todo), 16):
                    self._compute(todo[a : a + 16])
            finally:
                self.logprob_keys = wanted
            if self.cache is not None:
                self.cache.save_logprobs()
        return torch.tensor([self._mean_lp[k] for k in keys], dtype=torch.float64)


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


def check_rollouts(rollouts, loss: str = TrainSettings.loss, val_fraction: float = TrainSettings.val_fraction,
                   seed: int = TrainSettings.seed) -> dict:
    """The label balance of the split ``train_from_rollouts`` would make of ``rollouts`` (a path or
    ``Problem`` list) with these settings (their defaults: ``TrainSettings``'s), ``{"train": counts,
    "val": counts}``; raises ``swift_fast.training.LabelBalanceError`` when that split cannot teach
    ``loss``. No model needed, so a command can refuse before loading one."""
    sp = _split(rollouts, val_fraction, seed)
    return check_label_balance(sp.train, sp.val, loss)


def _check_solver(s: TrainSettings) -> None:
    """Refuse what the probe cannot fit, before anything is computed."""
    if s.resolved_solver != "probe":
        return
    if s.loss != "bce":
        raise ValueError(f"the probe fits binary cross-entropy only: train with the {s.loss} loss by the epoch "
                         "loop (solver='adamw', --solver adamw)")
    if s.gate:
        raise ValueError("the probe fits an ungated head: a gated head is trained by the epoch loop "
                         "(solver='adamw', --solver adamw)")


def _bound_head(parts, s: TrainSettings, model_name: str | None) -> SwiftHead:
    """A fresh head for the model of ``parts``, bound to it (its fingerprint and name) and on its device."""
    if s.feature == "logits":
        sel, width = None, parts.vocab_size
    else:
        sel, width = resolve_layers(s.layers, parts.num_layers), parts.hidden_size
    head = SwiftHead(width, sel, gate=s.gated, alignment=s.alignment, feature=s.feature)
    config = parts.model.config
    name = model_name or getattr(config, "name_or_path", "") or getattr(config, "_name_or_path", "")
    head.bind_model(config, name=name or None)
    return head.to(parts.device)


def _source(model, parts, head: SwiftHead, sp: _Split, cache_dir: str | None) -> HFFeatureSource:
    """The head's states of every candidate, with a cache made for this data, model and head only."""
    spec = {
        "model": head.model_name,
        "fingerprint": head.model_fingerprint,
        "dtype": str(parts.lm_head.weight.dtype),
        "layers": head.layers,
        "alignment": head.alignment,
        "feature": head.feature,
        "data": _data_digest(sp.seqs),
    }
    return HFFeatureSource(
        model, sp.seqs.sequences, sp.seqs.prompt_lengths, head.layers, head.alignment, head.feature, cache_dir, spec,
        # every candidate: the selector's evidence (``_recommend``) measures the mean log-prob beside the head
        logprob_keys=sp.keep,
    )


def train_from_rollouts(
    model: nn.Module,
    rollouts,
    settings: TrainSettings | None = None,
    *,
    cache_dir: str | None = None,
    progress: bool = True,
    model_name: str | None = None,
    on_epoch: Callable | None = None,
    **overrides,
) -> tuple[SwiftHead, TrainResult]:
    """Train a SWIFT head for ``model`` on graded rollouts (a rollout file path or ``Problem`` list).

    ``settings``: a ``swift_fast.training.TrainSettings`` (default ``TrainSettings()``, the
    defaults of ``swift-fast train``); ``overrides``: any of its fields by keyword on top
    (``train_from_rollouts(model, rollouts, layers="last4", loss="dpo")``); a keyword that is
    none of them is a ``TypeError`` naming it. ``cache_dir``: keep the features in a
    memory-mapped file there (``FeatureCache``); ``model_name``: the name the head records
    (default: the model's ``name_or_path``); ``on_epoch``: as ``train_head`` takes it.

    ``solver``: ``"adamw"``, the paper's epoch loop (``swift_fast.training.train_head``: every
    loss, gated or not); ``"probe"``, the ungated head fitted as a logistic regression on mean
    states (``swift_fast.training.probe``: BCE only, strength from ``lambdas`` by ``folds``-fold
    cross-validation over the training problems, then refitted on training and validation
    candidates); ``"auto"`` (the default), the probe for bce unless ``gate=True``, the epoch loop
    otherwise. ``gate``: None takes the solver's (gated for adamw, ungated for the probe).

    Candidates with an empty response carry no scored token and are left out (counted in the
    head's provenance as ``skipped_empty``). Returns ``(head, result)``; the head is bound to
    the model and its ``provenance`` records data, label balance per split, loss, optimiser,
    best epoch, validation metrics and ``baselines`` (``result.baselines``: the head's validation
    AUC and Best-of-N beside those of response length and of the model's mean log-prob, computed
    in the forward passes that give the features, and a verdict; ``free_baselines``).

    Raises ``swift_fast.training.LabelBalanceError`` before computing any feature when a split
    cannot teach the loss (a single class for bce/hinge; no problem with both a correct and an
    incorrect candidate for dpo/infonca/nca), with the counts and what to change.
    """
    s = with_overrides(settings, overrides, TrainSettings(), "train_from_rollouts")
    _check_solver(s)
    parts = decoder_parts(model)
    sp = _split(rollouts, s.val_fraction, s.seed)
    # before the head, the source and a cache file exist: a refusal costs nothing
    check_label_balance(sp.train, sp.val, s.loss)
    head = _bound_head(parts, s, model_name)
    source = _source(model, parts, head, sp, cache_dir)
    if s.resolved_solver == "probe":
        from ..training.probe import train_probe

        # one pass over the features: a cache is filled only when asked for, in the same pass
        result = train_probe(head, source, sp.train, sp.val, lams=s.lambdas, folds=s.folds, seed=s.seed,
                             progress=progress)
    else:
        result = _epochs(head, source, sp, s, progress, on_epoch)
    data_path = os.fspath(rollouts) if isinstance(rollouts, (str, os.PathLike)) else None
    head.selector = _recommend(result, sp, source, s.seed)
    return head, _provenance(head, result, sp, data_path, s, model)


def _recommend(result: TrainResult, sp: _Split, source: HFFeatureSource, seed: int) -> dict | None:
    """The selector the head is recommended with (``swift_fast.training.recommend``), from the
    fit's evidence: its scores of unseen problems, the rollouts' graded answers, the mean log-probs."""
    from ..training.recommend import recommend

    ev = result.evidence
    if not ev or not len(ev["keys"]):
        return None
    keys = list(ev["keys"])
    refs = [sp.seqs.refs[k] for k in keys]
    answers = [sp.seqs.problems[p].candidates[c].get("answer") for p, c in refs]
    rec = recommend(ev["scores"], [bool(sp.seqs.labels[k]) for k in keys], [sp.seqs.problems[p].id for p, _ in refs],
                    answers, {"mean_logprob": source.mean_logprobs(keys)}, evidence=ev["how"], seed=seed)
    return finite_or_none(rec)


def _epochs(head, source, sp: _Split, s: TrainSettings, progress: bool, on_epoch) -> TrainResult:
    # a cache is filled in batches of similar length before the first epoch, not in its random order
    source.fill(progress=progress)
    return train_head(head, source, sp.train, sp.val, s, progress=progress, on_epoch=on_epoch)


def _how(result: TrainResult, s: TrainSettings) -> dict:
    """The provenance's record of how the head was fitted."""
    if result.fit:
        return {"solver": "probe", **result.fit, "standardize": True}
    return {
        "solver": "adamw",
        "optimizer": {"name": "AdamW", "lr": s.lr, "weight_decay": s.weight_decay},
        "batch_size": s.batch_size,
        "max_epochs": s.max_epochs,
        "patience": s.patience,
        "select": result.select,
        "standardize": s.standardize,
        "epochs_run": result.epochs_run,
        "best_epoch": result.best_epoch,
        "stopped_early": result.stopped_early,
    }


def _provenance(head: SwiftHead, result: TrainResult, sp: _Split, data_path: str | None,
                s: TrainSettings, model: nn.Module) -> TrainResult:
    labels = [bool(sp.seqs.labels[i]) for i in sp.keep]
    from .. import __version__
    from .model_identity import model_revision

    head.provenance = finite_or_none({
        "swift_fast": __version__,
        # which model, at which version: a head fits one set of weights, not only one shape
        "model": {"name": head.model_name or None, **model_revision(model.config),
                  "dtype": str(getattr(model, "dtype", "")).removeprefix("torch.") or None},
        # the settings as asked (``layers="last4"``); the head's metadata has them resolved
        "settings": {"layers": s.layers, "feature": s.feature, "alignment": s.alignment, "gate": s.gate,
                     "solver": s.solver},
        "data": {
            "path": data_path,
            "sha256": sha256_of(data_path) if data_path else None,
            "bytes": os.path.getsize(data_path) if data_path else None,
            "problems": len(set(sp.pid)),
            "candidates": len(sp.keep),
            "skipped_empty": len(sp.seqs.sequences) - len(sp.keep),
            "positive_rate": sum(labels) / len(labels),
            "train_problems": len(sp.train_ids),
            "val_problems": len(sp.val_ids),
            "labels": result.labels,
            "split": {"by": "problem", "val_fraction": s.val_fraction, "seed": s.seed},
        },
        "loss": s.loss,
        **({"alpha": s.alpha} if s.loss in GROUP_LOSSES else {}),
        **_how(result, s),
        "seed": s.seed,
        "val_metrics": result.val_metrics,
        "baselines": result.baselines,
        "history": result.history,
    })
    return result


def finite_or_none(x):
    """NaN and infinity (an AUC without both classes, say) become null: the metadata stays strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    return x
