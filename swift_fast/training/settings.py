"""Every setting of head training, declared once: ``TrainSettings``.

One frozen dataclass holds what decides a trained head: the states it reads, the solver and its
loss, the epoch loop's and the probe's knobs, the split. Each field carries its default and its
help text (``metadata["help"]``), and three places read them from here rather than repeating
them: ``swift_fast.training.train_head`` (the epoch loop's fields), ``swift_fast.hf.train_from_rollouts``
(all of them) and ``swift-fast train``, whose options take their defaults, choices and help from
the fields (``metadata["flag"]`` where the option is not ``--`` plus the field's name).

Both functions keep their keyword forms: ``train_head(head, source, train, val, lr=1e-3)`` is
``train_head(..., settings=TrainSettings.paper(lr=1e-3))``, and a keyword that is no setting is a
``TypeError`` naming it (``with_overrides``).

The defaults are the ones measured on a real model (docs/training.md): the solver ``auto`` (the
probe for bce, the epoch loop for the other losses), and for the epoch loop standardised states
and the kept epoch by within-problem AUC. ``TrainSettings.paper()`` is the SWIFT paper's recipe
(appendix D.3: the gated head by AdamW, kept epoch by validation loss, raw states), which is what
``train_head`` runs when given no settings.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields, replace
from typing import Iterable, Sequence

from .losses import DEFAULT_ALPHA, LOSSES, check_loss

#: what picks the kept epoch (``train_head``'s ``select``)
SELECT = ("auto", "pairs", "loss")
#: how a head is fitted: ``auto`` takes the probe for bce and the epoch loop for the other losses
SOLVERS = ("auto", "probe", "adamw")
#: L2 strengths the probe tries (on the mean BCE of standardised pooled states), strongest first
DEFAULT_LAMBDAS = (1.0, 0.3, 0.1, 3e-2, 1e-2, 3e-3, 1e-3)
#: folds of the cross-validation that picks the probe's strength
DEFAULT_FOLDS = 3


def _setting(default, help: str, loop: bool = False, **more):
    """A field with its default and its help; ``loop``: one of the epoch loop's (``train_head``'s)."""
    return field(default=default, metadata={"help": help, "loop": loop, **more})


@dataclass(frozen=True)
class TrainSettings:
    """What decides a trained head. ``fields(TrainSettings)`` gives each one's default and help."""

    # what the head reads
    layers: str | Sequence[int] = _setting(
        "all", "hidden states to read: all, lastN (e.g. last4), indices 0,8,16 or a list of them")
    feature: str = _setting("hidden", "hidden states or the final logits (the paper's 5.8)",
                            choices=("hidden", "logits"))
    gate: bool | None = _setting(
        None, "plain mean of token rewards instead of the gated average (gate=False; the default, None, takes "
        "the solver's: gated for adamw, ungated for the probe)", flag="--no-gate")
    alignment: str = _setting(
        "predicting", "score token r_j with the state that predicted it (predicting, free during generation) or "
        "where it is the input (emitted, the paper's)", choices=("predicting", "emitted"))
    # how it is fitted: the solver, the probe's strengths, the loss, the epoch loop
    solver: str = _setting(
        "auto", "probe: the ungated head as a cross-validated logistic regression on mean states; adamw: the "
        "paper's epoch loop (gated unless --no-gate; every --loss); auto: probe for --loss bce, else adamw, "
        "which also fits a head asked to be gated (gate=True)",
        choices=SOLVERS)
    lambdas: tuple[float, ...] = _setting(DEFAULT_LAMBDAS, "probe: L2 strengths to choose from by cross-validation")
    folds: int = _setting(DEFAULT_FOLDS, "probe: cross-validation folds over the training problems")
    loss: str = _setting("bce", "training loss (the probe fits bce only)", loop=True, choices=LOSSES)
    alpha: float = _setting(DEFAULT_ALPHA, "temperature of InfoNCA/NCA targets", loop=True)
    lr: float = _setting(1e-4, "adamw: learning rate", loop=True)
    weight_decay: float = _setting(1e-5, "adamw: weight decay", loop=True)
    batch_size: int = _setting(16, "adamw: sequences per step", loop=True)
    max_epochs: int = _setting(20, "adamw: most epochs (early stopping usually ends sooner)", loop=True,
                               flag="--epochs")
    patience: int = _setting(3, "adamw: epochs without a better validation figure (see --select) before stopping",
                             loop=True)
    standardize: bool = _setting(
        True, "adamw: train on states centred and scaled per dimension over the training tokens, folded back "
        "into an ordinary head at the end (--no-standardize, False: raw states, as the paper does)", loop=True)
    select: str = _setting(
        "auto", "adamw: which epoch is kept and when to stop: pairs, the highest within-problem AUC on validation "
        "(how well the head ranks the candidates of one problem, which is what Best-of-N uses); loss, the lowest "
        "validation loss (the paper's); auto: pairs when a validation problem has both a correct and an incorrect "
        "candidate, else loss", loop=True, choices=SELECT)
    # the data
    val_fraction: float = _setting(0.2, "share of problems held out for validation")
    seed: int = _setting(0, "seed of the split, the probe's folds, and the epoch loop's initial weights and batch "
                         "order", loop=True)

    def __post_init__(self):
        check_loss(self.loss)
        if self.select not in SELECT:
            raise ValueError(f"unknown select {self.select!r}; expected one of {', '.join(SELECT)}")
        if self.solver not in SOLVERS:
            raise ValueError(f"unknown solver {self.solver!r}; expected one of {', '.join(SOLVERS)}")
        # NOTE: None meant "the default" in train_from_rollouts' keywords; a list is kept as a tuple so
        # the settings stay comparable
        object.__setattr__(self, "lambdas", tuple(self.lambdas or DEFAULT_LAMBDAS))
        object.__setattr__(self, "folds", DEFAULT_FOLDS if self.folds is None else self.folds)

    @classmethod
    def paper(cls, **overrides) -> TrainSettings:
        """The SWIFT paper's recipe (appendix D.3): the gated head by the epoch loop, the kept epoch by
        validation loss, raw states; ``overrides`` on top."""
        return cls(**{"solver": "adamw", "select": "loss", "standardize": False, **overrides})

    @property
    def resolved_solver(self) -> str:
        """The solver ``auto`` stands for: the probe for bce, the epoch loop (``adamw``) otherwise and
        for a head asked to be gated (``gate=True``, which the probe cannot fit)."""
        if self.solver != "auto":
            return self.solver
        return "probe" if self.loss == "bce" and not self.gate else "adamw"

    @property
    def gated(self) -> bool:
        """Whether the head has a gate: ``gate``, or the solver's (gated for adamw) when it is None."""
        return (self.resolved_solver == "adamw") if self.gate is None else bool(self.gate)


#: the fields of the epoch loop, the ones ``train_head`` takes
LOOP_FIELDS = tuple(f.name for f in fields(TrainSettings) if f.metadata["loop"])


def with_overrides(
    settings: TrainSettings | None, overrides: dict, base: TrainSettings, caller: str,
    allowed: Iterable[str] | None = None,
) -> TrainSettings:
    """``settings`` (``base`` when None) with ``overrides`` replaced; a ``TypeError`` naming a
    keyword that is not one of the ``allowed`` settings (default: every field)."""
    names = tuple(allowed) if allowed is not None else tuple(f.name for f in fields(TrainSettings))
    for key in overrides:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"{caller}() got an unknown keyword {key!r}{hint}; its settings are {', '.join(names)}")
    return replace(settings if settings is not None else base, **overrides)
