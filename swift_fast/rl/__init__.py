"""Reinforcement learning with the plugin's values: rollouts that a vLLM engine running the
plugin generates for TRL's ``GRPOTrainer``, with SAR (and SWIFT with a head) computed during
generation, and the rewards that read them.

===================  ============================================================================
``rollouts``         ``PluginRollouts``: a TRL ``rollout_func`` (weights synced and labelled before
                     each generation step); ``plugin_sar_reward``: ``R_SA`` from the rollouts,
                     dropped for a candidate whose values span two weight versions
===================  ============================================================================

SAR through a second Hugging Face pass (no vLLM): ``swift_fast.hf.rl_adapters.trl_sar_reward``;
VERL's hook lives there too. ``docs/rl.md`` says which to use when.
"""

from __future__ import annotations

_LAZY = {"PluginRollouts": "rollouts", "plugin_sar_reward": "rollouts", "load_policy_weights": "rollouts"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
