"""One-step arithmetic questions for small real models: sums, differences, products and exact
quotients of small numbers, asked in words, with disjoint training and held-out problem sets.

A 135M instruction model (SmolLM2-135M-Instruct) solves about a quarter of these in one sample at
temperature 0.7 when asked for a short answer, and far fewer of GSM8K's multi-step word problems
(a few percent), so these problems give a head both kinds of candidate to learn from. Every
problem is one question with a unique integer answer, graded by math-verify like any math row.

The problem space is enumerated, not sampled with replacement: ``problems()`` lists every
(operation, a, b) once, shuffles it with a seed and cuts it into the splits, so a held-out
question never appears in the training rows (checked by ``make_splits``). A problem's id
(``plus-12-7``) names its question, so rollouts written for one split are found again by id.
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


def space_size() -> int:
    """How many problems ``problems()`` lists."""
    return sum((a1 - a0 + 1) * (b1 - b0 + 1)
               for _, _, blocks in OPERATIONS.values() for (a0, a1), (b0, b1) in blocks)


#: the instruction after each question: a short answer keeps candidates at tens of tokens
TEMPLATE = "{question} Answer briefly and put the final number in \\boxed{}."


def problems(seed: int = 0) -> list[dict]:
    """Every problem once, shuffled with ``seed``: generic rows ``{"id", "prompt", "answer",
    "kind": "math", "dataset": "arithmetic", "operation"}``."""
    rows = []
    for op, (text, value, blocks) in OPERATIONS.items():
        for (a0, a1), (b0, b1) in blocks:
            for x in range(a0, a1 + 1):
                for y in range(b0, b1 + 1):
                    a, b = _operands(op, x, y)
                    rows.append({"id": f"{op}-{a}-{b}", "prompt": text.format(a=a, b=b), "answer": str(value(a, b)),
                                 "kind": "math", "dataset": "arithmetic", "operation": op})
    random.Random(seed).shuffle(rows)
    return rows


def make_splits(train: int, test: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """``(train rows, test rows)``: the first ``train`` and the next ``test`` problems of
    ``problems(seed)``; disjoint by construction, and a ValueError when the space is too small."""
    rows = problems(seed)
    if train < 1 or test < 1 or train + test > len(rows):
        raise ValueError(f"need 1 <= train, test and train + test <= {len(rows)} problems, got {train} + {test}")
    a, b = rows[:train], rows[train : train + test]
    assert not {r["prompt"] for r in a} & {r["prompt"] for r in b}
    return a, b
