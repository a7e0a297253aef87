"""swift-fast: SWIFT and SAR intrinsic rewards computed from a model's own internals.

Importing the package is light: submodules load on first use of a name below.
"""

from __future__ import annotations

import importlib

from . import _compat

__version__ = "0.1.0"

_EXPORTS = {
    # head
    "SwiftHead": "rewards.head",
    "HeadError": "rewards.head",
    "model_fingerprint": "rewards.head",
    "resolve_layers": "rewards.head",
    # reference scoring
    "swift_score": "rewards.scoring",
    "token_scores": "rewards.scoring",
    # SAR
    "perplexity": "rewards.sar",
    "sar_reward": "rewards.sar",
    "rl_reward": "rewards.sar",
    "sar_from_logits": "rewards.sar",
    "sar_from_hidden": "rewards.sar",
    "token_logprobs": "rewards.sar",
    "DEFAULT_SYSTEM_PROMPT": "rewards.sar",
    # Best-of-N
    "bon_select": "selection.bon",
    "best_output": "selection.bon",
    "bon_accuracy": "selection.bon",
    "majority_vote": "selection.bon",
    "weighted_vote": "selection.bon",
    "oracle_accuracy": "selection.bon",
    "combine_rank": "selection.bon",
    "combine_scaled": "selection.bon",
    # grading and data
    "grade": "grading",
    "grade_many": "grading",
    "judge_many": "grading",
    "extract_answer": "grading",
    "extract_many": "grading",
    "Judgement": "grading",
    "load_dataset": "data.datasets",
    "Example": "data.datasets",
    "DataError": "data.datasets",
    "render_prompt": "data.templates",
    "TEMPLATES": "data.templates",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

_compat.install()


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'swift_fast' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
