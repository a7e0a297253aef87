"""swift-fast: SWIFT and SAR intrinsic rewards computed from a model's own internals.

Importing the package is light: submodules load on first use of a name below.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    # head
    "SwiftHead": "head",
    "HeadError": "head",
    "model_fingerprint": "head",
    "resolve_layers": "head",
    # reference scoring
    "swift_score": "scoring",
    "token_scores": "scoring",
    # SAR
    "perplexity": "sar",
    "sar_reward": "sar",
    "rl_reward": "sar",
    "sar_from_logits": "sar",
    "sar_from_hidden": "sar",
    "token_logprobs": "sar",
    "DEFAULT_SYSTEM_PROMPT": "sar",
    # Best-of-N
    "bon_select": "bon",
    "bon_accuracy": "bon",
    "majority_vote": "bon",
    "weighted_vote": "bon",
    "oracle_accuracy": "bon",
    "combine_rank": "bon",
    "combine_scaled": "bon",
    # grading and data
    "grade": "grading",
    "grade_many": "grading",
    "judge_many": "grading",
    "extract_answer": "grading",
    "extract_many": "grading",
    "Judgement": "grading",
    "load_dataset": "datasets",
    "Example": "datasets",
    "DataError": "datasets",
    "render_prompt": "templates",
    "TEMPLATES": "templates",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'swift_fast' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
