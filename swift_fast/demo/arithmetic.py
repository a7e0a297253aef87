"""Arithmetic questions for small real models, asked in words, with disjoint training and
held-out problem sets. Two tasks (``TASKS``):

- ``one-step``: sums, differences, products and exact quotients of small numbers ("What is 27
  plus 8?");
- ``two-step``: two sums or differences in a row, read left to right ("What is 14 plus 5 minus
  3?"; plus and minus only, so the reading order is the arithmetic's and no precedence rule
  decides the answer).

A 135M instruction model (SmolLM2-135M-Instruct) solves about a quarter of the one-step problems
in one sample at temperature 0.7 when asked for a short answer, about 7% of the two-step ones,
and far fewer of GSM8K's multi-step word problems (a few percent), so both tasks give a head both
kinds of candidate to learn from: the first with plenty of correct candidates, the second with
few. Every
problem is one question with a unique integer answer, graded by math-verify like any math row.

The problem space is enumerated, not sampled with replacement: ``problems()`` lists every
(operation, a, b) once, shuffles it with a seed and cuts it into the splits, so a held-out
question never appears in the training rows (checked by ``make_splits``). A problem's id
(``plus-12-7``, ``plus-minus-14-5-3``) names its question, so rollouts written for one split are
found again by id.
"""

from __future__ import annotations

import random

#: operation -> (phrasing, value, blocks of (range of a, range of b)); ranges inclusive. The
#: second blocks add two-digit second operands where the model still solves some (small first
#: operands for sums, a result of at least 1 for differences); quotients are exact.
OPERATIONS = {
    "plus": ("What is {a} plus {b}?", lambda a, b: a + b, (((2, 39), (2, 9)), ((2, 19), (10, 19)))),
    "minus": ("What is {a} minus {b}?", lambda a, b: a - b, (((10, 39), (2, 9)), ((20, 39), (10, 19)))),
    "times": ("What is {a} times {b}?", lambda a, b: a * b, (((2, 12), (2, 12)),)),
    "divided": ("What is {a} divided by {b}?", lambda a, b: a // b, (((2, 12), (2, 9)),)),
}


def _operands(op: str, a: int, b: int) -> tuple[int, int]:
    # a quotient's block lists (quotient, divisor): the question divides their product
    return (a * b, b) if op == "divided" else (a, b)


def space_size(task: str = "one-step") -> int:
    """How many problems ``problems(task=task)`` lists."""
    if task != "one-step":
        return len(problems(0, task))
    return sum((a1 - a0 + 1) * (b1 - b0 + 1)
               for _, _, blocks in OPERATIONS.values() for (a0, a1), (b0, b1) in blocks)


#: the instruction after each question: a short answer keeps candidates at tens of tokens
TEMPLATE = "{question} Answer briefly and put the final number in \\boxed{}."


#: the two-step task's operands: a first number, then two more, each step plus or minus
TWO_STEP_RANGES = ((2, 20), (2, 9), (2, 9))
_STEP = {"plus": lambda x, y: x + y, "minus": lambda x, y: x - y}


def _two_step_rows() -> list[dict]:
    (a0, a1), (b0, b1), (c0, c1) = TWO_STEP_RANGES
    rows = []
    for o1, f1 in _STEP.items():
        for o2, f2 in _STEP.items():
            for a in range(a0, a1 + 1):
                for b in range(b0, b1 + 1):
                    for c in range(c0, c1 + 1):
                        value = f2(f1(a, b), c)
                        if value < 1:  # a positive whole answer, as in the one-step task
                            continue
                        rows.append({"id": f"{o1}-{o2}-{a}-{b}-{c}", "prompt": f"What is {a} {o1} {b} {o2} {c}?",
                                     "answer": str(value), "kind": "math", "dataset": "arithmetic-two-step",
                                     "operation": f"{o1}-{o2}"})
    return rows


def _one_step_rows() -> list[dict]:
    rows = []
    for op, (text, value, blocks) in OPERATIONS.items():
        for (a0, a1), (b0, b1) in blocks:
            for x in range(a0, a1 + 1):
                for y in range(b0, b1 + 1):
                    a, b = _operands(op, x, y)
                    rows.append({"id": f"{op}-{a}-{b}", "prompt": text.format(a=a, b=b), "answer": str(value(a, b)),
                                 "kind": "math", "dataset": "arithmetic", "operation": op})
    return rows


#: task name -> its problems in a fixed order (``problems`` shuffles them)
TASKS = {"one-step": _one_step_rows, "two-step": _two_step_rows}


def problems(seed: int = 0, task: str = "one-step") -> list[dict]:
    """Every problem of ``task`` once, shuffled with ``seed``: generic rows ``{"id", "prompt",
    "answer", "kind": "math", "dataset", "operation"}``."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")
    rows = TASKS[task]()
    random.Random(seed).shuffle(rows)
    return rows


def make_splits(train: int, test: int, seed: int = 0, task: str = "one-step") -> tuple[list[dict], list[dict]]:
    """``(train rows, test rows)``: the first ``train`` and the next ``test`` problems of
    ``problems(seed, task)``; disjoint by construction, and a ValueError when the space is too small."""
    rows = problems(seed, task)
    if train < 1 or test < 1 or train + test > len(rows):
        raise ValueError(f"need 1 <= train, test and train + test <= {len(rows)} problems, got {train} + {test}")
    a, b = rows[:train], rows[train : train + test]
    assert not {r["prompt"] for r in a} & {r["prompt"] for r in b}
    return a, b
