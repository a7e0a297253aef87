"""The embedded default: a small Llama that adds numbers step by step and checks its work, and a
SWIFT head trained on its own rollouts, shipped in ``swift_fast/assets/demo``.

``swift-fast demo`` runs Best-of-N with them (``run.py``); ``swift-fast demo build`` rebuilds them
(``build.py``, settings in ``recipe.py``).
"""
