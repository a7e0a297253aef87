"""The embedded default: a small Llama that adds numbers as running sums, imitating a sloppy
solver that sometimes forgets the last term, and a SWIFT head trained on its own rollouts that
reads from the model's states whether an answer came too early; shipped in
``swift_fast/assets/demo``.

``swift-fast demo`` runs Best-of-N with them (``run.py``); ``swift-fast demo build`` rebuilds them
(``build.py``, settings in ``recipe.py``); ``swift-fast demo ablations`` retrains head variants
(``ablations.py``).
"""
