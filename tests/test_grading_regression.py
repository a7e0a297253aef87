"""Grading regression set: model outputs that were graded wrongly once, and adversarial cases.

tests/data/grading_regression.jsonl, one case a line: ``response``, ``reference``, ``kind``,
``finish_reason``, ``expected_correct``, ``expected_answer`` (the canonical key, or null for no
answer), ``note`` (why the case is here) and optionally ``truncation`` ("strict" when absent).
The expected values are written by hand from the rules in swift_fast.grading and
swift_fast.grading.math_judge. Every case runs through the worker processes and through the
in-process path.
"""

import json
import os

import pytest

from swift_fast.grading import TRUNCATION_RULES, cut_off, judge_many

DATA = os.path.join(os.path.dirname(__file__), "data", "grading_regression.jsonl")
FIELDS = {"response", "reference", "kind", "finish_reason", "expected_correct", "expected_answer", "note"}


def _cases() -> list[dict]:
    with open(DATA, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _judge(cases: list[dict], timeout) -> list:
    """Verdicts in case order; one judge_many call per truncation rule."""
    out = [None] * len(cases)
    for rule in TRUNCATION_RULES:
        idx = [i for i, c in enumerate(cases) if c.get("truncation", "strict") == rule]
        if not idx:
            continue
        got = judge_many(
            [cases[i]["response"] for i in idx],
            [cases[i]["reference"] for i in idx],
            [cases[i]["kind"] for i in idx],
            finish_reasons=[cases[i]["finish_reason"] for i in idx],
            truncation=rule,
            timeout=timeout,
        )
        for i, j in zip(idx, got):
            out[i] = j
    return out


def _failures(cases, verdicts) -> list[str]:
    bad = []
    for n, (c, j) in enumerate(zip(cases, verdicts), 1):
        if (j.correct, j.answer) != (c["expected_correct"], c["expected_answer"]):
            bad.append(
                f"line {n} ({c['note']}): {c['response']!r} vs {c['reference']!r} [{c['finish_reason']}, "
                f"{c.get('truncation', 'strict')}] gave correct={j.correct} answer={j.answer!r} status={j.status}, "
                f"expected correct={c['expected_correct']} answer={c['expected_answer']!r}"
            )
    return bad


def test_the_set_is_well_formed():
    cases = _cases()
    assert len(cases) >= 40
    for n, c in enumerate(cases, 1):
        assert FIELDS <= set(c), f"line {n} lacks {FIELDS - set(c)}"
        assert c.get("truncation", "strict") in TRUNCATION_RULES, f"line {n}"
        assert isinstance(c["expected_correct"], bool), f"line {n}"
        assert c["note"], f"line {n} says nothing about why it is here"
        # a correct answer has a key; no answer is never correct
        assert not (c["expected_correct"] and c["expected_answer"] is None), f"line {n}"
    # the cases are here verbatim
    responses = {c["response"] for c in cases}
    assert "So the final answer, which is 1320 - 51 = 1321." in responses
    assert any("\\boxed{Your Answer}" in r for r in responses)
    assert any(r.endswith("2960 * 2 = 59") for r in responses)


@pytest.mark.parametrize("path, timeout", [("worker processes", 5.0), ("in-process", None)])
def test_regression_set(path, timeout):
    cases = _cases()
    verdicts = _judge(cases, timeout)
    bad = _failures(cases, verdicts)
    for line in bad:
        print(line)
    assert not bad, f"{len(bad)} of {len(cases)} cases fail ({path}):\n" + "\n".join(bad)


def test_truncated_status_and_cut_off_agree():
    """Under the strict rule a case is rejected as truncated exactly when cut_off says so."""
    cases = [c for c in _cases() if c.get("truncation", "strict") == "strict"]
    verdicts = _judge(cases, None)
    for c, j in zip(cases, verdicts):
        truncated = cut_off(c["response"], c["finish_reason"], c["kind"])
        assert (j.status == "truncated") == truncated, c["note"]
        if truncated:
            assert (j.correct, j.answer) == (False, None), c["note"]
