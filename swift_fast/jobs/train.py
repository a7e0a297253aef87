"""The job behind ``swift-fast train``: graded rollouts in, a head file out.

Two steps, so that a command can speak between them. :func:`plan_train` makes every refusal that
needs no model -- the model's config (an unsupported architecture), the rollout file's labels
(``check_rollouts``: data that cannot teach the loss), the probe's settings and split -- and
gathers what to say before the model loads, which can take minutes: the warnings (data that
teaches little, a probe whose strength will follow the loss) and where the feature cache goes
with its size. :func:`run_train` then loads the model, trains (``swift_fast.hf.train_from_rollouts``)
and writes the head with its model card beside it (``<head stem>.md``, made from the head's own
metadata and provenance by ``swift_fast.hf.hub.model_card``: ``swift-fast head push`` publishes the
two). The command line parses its options into a ``TrainSettings`` and prints what these return.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from ..hf.hub import write_card
from ..hf.train import check_rollouts, describe_cache, feature_cache_plan
from ..rewards.head import SwiftHead
from ..training.loop import TrainResult
from ..training.settings import TrainSettings
from ..training.splits import LabelShareWarning, label_share_warning, whole_balance


@dataclass
class TrainPlan:
    """A training job checked before its model loads (:func:`plan_train`)."""

    model: str
    rollouts: str
    settings: TrainSettings
    cache_dir: str | None = None
    #: sentences to show before the model loads (data that teaches little, the probe's strength
    #: following the loss); training does not repeat them
    warnings: list[str] = field(default_factory=list)
    #: where the feature cache goes and its size (``describe_cache``); None without a cache
    cache: str | None = None


@dataclass
class TrainJob:
    """A finished training job (:func:`run_train`): the head written at ``head_path``, its model
    card at ``card_path``."""

    head_path: str
    head: SwiftHead
    result: TrainResult
    warnings: list[str]
    cache: str | None
    #: the model card beside the head (``<head stem>.md``: ``swift_fast.hf.hub.model_card``), which
    #: ``swift-fast head push`` publishes with it
    card_path: str | None = None


def _check_probe(settings: TrainSettings, balance: dict) -> str | None:
    """Refuse probe settings that cannot fit; the probe split's warning, or None."""
    from ..training.probe import check_probe_split

    if settings.loss != "bce":
        raise ValueError(f"the probe fits the bce loss only: --solver adamw trains with --loss {settings.loss}")
    if settings.folds < 2:
        raise ValueError(f"--folds must be at least 2, got {settings.folds}")
    return check_probe_split(balance, settings.folds)


def plan_train(model: str, rollouts: str, settings: TrainSettings | None = None,
               cache_dir: str | None = None) -> TrainPlan:
    """Check a training job without loading its model: ``model`` (a Hugging Face name or path)
    must be a supported architecture and the split of ``rollouts`` that ``settings`` makes must
    teach its loss (``LabelBalanceError`` otherwise); for the probe, the folds must fit the
    training problems. Returns the plan with the warnings and the cache's description to show."""
    from transformers import AutoConfig

    from ..hf.loading import check_supported_config

    s = settings if settings is not None else TrainSettings()
    config = AutoConfig.from_pretrained(model)
    check_supported_config(config, model)
    balance = check_rollouts(rollouts, s.loss, s.val_fraction, s.seed)
    notes = [label_share_warning(whole_balance(balance))]
    if s.resolved_solver == "probe":
        notes.append(_check_probe(s, balance))
    cache = None
    if cache_dir:
        plan = feature_cache_plan(rollouts, config, s.layers, s.feature)
        cache = describe_cache(cache_dir, plan["rows"], plan["k"], plan["d"], plan["dtype"])
    return TrainPlan(model, rollouts, s, cache_dir, [n for n in notes if n], cache)


def run_train(plan: TrainPlan, out: str, dtype: str = "auto", device: str = "auto",
              progress: bool = True) -> TrainJob:
    """Load the plan's model (``dtype``, ``device`` as ``swift_fast.hf.loading.load_model`` takes
    them), train a head on its rollouts and write it to ``out``, its model card beside it."""
    from ..hf.loading import load_model
    from ..hf.train import train_from_rollouts

    model, _ = load_model(plan.model, dtype, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LabelShareWarning)  # the plan's warnings said it, before the model load
        head, result = train_from_rollouts(model, plan.rollouts, plan.settings, cache_dir=plan.cache_dir,
                                           progress=progress, model_name=plan.model)
    head.save(out)
    return TrainJob(out, head, result, plan.warnings, plan.cache, write_card(out, head))
