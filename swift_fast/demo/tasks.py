"""The demo's tasks, by their config type: ``module_for(cfg)`` is the module (``task`` or
``task_lag``) whose functions (``sample_terms``, ``question``, ``training_solution``,
``reference``, ``extract_answer``, ``is_correct``, ``make_split``) serve that config."""

from __future__ import annotations

from types import ModuleType

from . import task, task_lag

_MODULES = {task.TaskConfig: task, task_lag.LagConfig: task_lag}


def module_for(cfg) -> ModuleType:
    try:
        return _MODULES[type(cfg)]
    except KeyError:
        raise TypeError(
            f"no demo task for a {type(cfg).__name__} config; expected one of "
            + ", ".join(t.__name__ for t in _MODULES)
        ) from None
