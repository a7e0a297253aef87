"""Deep import paths of swift-fast 0.1 that moved when the package was grouped into folders
(``rewards``, ``selection``, ``training``, ``data``, ``grading``, ``reports``, ``jobs``,
``support``). They keep working for one release: importing an old path gives the module at its
new path, the same object, with a ``DeprecationWarning`` that names the new path.

NOTE: the old names are served by a finder on ``sys.meta_path`` rather than by stub files, so
the folders hold only the code that lives there. The module object is shared, so a monkeypatch
through either name is seen through both.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

#: old module path -> new module path
MOVED = {
    "swift_fast.bon": "swift_fast.selection.bon",
    "swift_fast.confidence": "swift_fast.rewards.confidence",
    "swift_fast.datasets": "swift_fast.data.datasets",
    "swift_fast.engine_logs": "swift_fast.support.engine_logs",
    "swift_fast.feature_scaling": "swift_fast.training.scaling",
    "swift_fast.files": "swift_fast.support.files",
    "swift_fast.head": "swift_fast.rewards.head",
    "swift_fast.hf.adapters": "swift_fast.hf.rl_adapters",
    "swift_fast.hf.collect": "swift_fast.jobs.collect",
    "swift_fast.hf.data_parallel": "swift_fast.jobs.data_parallel",
    "swift_fast.math_judge": "swift_fast.grading.math_judge",
    "swift_fast.math_workers": "swift_fast.grading.math_workers",
    "swift_fast.plotting": "swift_fast.reports.plotting",
    "swift_fast.probe": "swift_fast.training.probe",
    "swift_fast.progress": "swift_fast.support.progress",
    "swift_fast.prune_report": "swift_fast.reports.pruning",
    "swift_fast.pruning": "swift_fast.selection.pruning",
    "swift_fast.reference_heads": "swift_fast.hf.reference_heads",
    "swift_fast.report": "swift_fast.reports.best_of_n",
    "swift_fast.rollouts": "swift_fast.data.rollouts",
    "swift_fast.sar": "swift_fast.rewards.sar",
    "swift_fast.sar_context": "swift_fast.rewards.sar_context",
    "swift_fast.scoring": "swift_fast.rewards.scoring",
    "swift_fast.templates": "swift_fast.data.templates",
    "swift_fast.vllm_plugin.adapters": "swift_fast.vllm_plugin.runner_adapters",
}


def moved_warning(old: str, new: str) -> None:
    # stacklevel 3 lands on the importer: the warnings module skips importlib's own frames
    warnings.warn(f"{old} moved to {new}; the old path is removed in the next release", DeprecationWarning,
                  stacklevel=3)


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new path (the same object)."""

    def __init__(self, old: str, new: str):
        self.old, self.new = old, new
        self.spec = None

    def create_module(self, spec):
        moved_warning(self.old, self.new)
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        # NOTE: the import system has just written the old path's spec onto the shared module
        module.__spec__ = self.spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(fullname, _Alias(fullname, new))


def install() -> None:
    """Serve the old paths (idempotent)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
