"""Grading: is a candidate's answer right? (SWIFT paper appendix D.5; DESIGN 2, "Answers".)

================  ===============================================================================
``answers``       the public API: ``grade``, ``grade_many``, ``judge_many``, ``extract_answer``,
                  ``extract_many``; the kinds (math, choice, boolean, literal) and the truncation
                  rule
``math_judge``    math-verify set up for this project, what a response states, the verdict
``math_workers``  math grading in persistent worker processes, each answer under a deadline
================  ===============================================================================

The names of ``answers`` are this package's (``from swift_fast.grading import grade``). Nothing
is imported until one is used: a math worker process imports ``math_workers`` through this
package and must not pay for, or register the process-wide hooks of, the rest.
"""

from __future__ import annotations

import importlib


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    value = getattr(importlib.import_module(".answers", __name__), name)
    if not name.startswith("_"):
        globals()[name] = value
    return value


def __dir__():
    return sorted(n for n in dir(importlib.import_module(".answers", __name__)) if not n.startswith("__"))
