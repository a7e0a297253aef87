"""Training a SWIFT head, model-independent: features come from a ``FeatureSource`` (the Hugging
Face one is ``swift_fast.hf.train``), one file per concern.

=============  ==================================================================================
``settings``   ``TrainSettings``: every training setting once, with its default and help text
``losses``     bce, hinge, dpo, infonca, nca on the head's score ``R`` (paper appendix E.1)
``splits``     the 80/20 split by problem, and whether a split's labels can teach (label balance)
``metrics``    AUC, the within-problem AUC, Best-of-N, oracle and random picks on flat candidates
``baselines``  the head beside length and mean log-prob, with a paired bootstrap verdict
``loop``       the epoch loop (AdamW, early stopping keeping the best epoch): ``train_head``
``probe``      the ungated head as a cross-validated logistic regression on mean states
``scaling``    standardised states for training, folded back into the head
=============  ==================================================================================

The names below are the package's API, importable from ``swift_fast.training`` as before it was
split (``probe`` and ``scaling`` are imported by their paths).
"""

from .baselines import FEW_PROBLEMS, baseline_name, format_baselines, free_baselines
from .loop import (
    FeatureSource,
    TrainResult,
    baselines_of,
    evaluate,
    head_scores,
    score_and_count,
    score_examples,
    train_head,
)
from .losses import (
    DEFAULT_ALPHA,
    GROUP_LOSSES,
    LOSSES,
    bce_loss,
    compute_loss,
    dpo_loss,
    hinge_loss,
    infonca_loss,
    nca_loss,
)
from .metrics import auc, bon_outcomes, selection_metrics, within_problem_auc
from .settings import SELECT, TrainSettings
from .splits import (
    LOW_SHARE,
    MIN_OF_A_KIND,
    Example,
    LabelBalanceError,
    LabelShareWarning,
    check_label_balance,
    describe_balance,
    label_balance,
    label_share_warning,
    split_by_problem,
    whole_balance,
)

__all__ = [
    "DEFAULT_ALPHA", "FEW_PROBLEMS", "GROUP_LOSSES", "LOSSES", "LOW_SHARE", "MIN_OF_A_KIND", "SELECT",
    "Example", "FeatureSource", "LabelBalanceError", "LabelShareWarning", "TrainResult", "TrainSettings",
    "auc", "baseline_name", "baselines_of", "bce_loss", "bon_outcomes", "check_label_balance", "compute_loss",
    "describe_balance", "dpo_loss", "evaluate", "format_baselines", "free_baselines", "head_scores", "hinge_loss",
    "infonca_loss", "label_balance", "label_share_warning", "nca_loss", "score_and_count", "score_examples",
    "selection_metrics", "split_by_problem", "train_head", "whole_balance", "within_problem_auc",
]
