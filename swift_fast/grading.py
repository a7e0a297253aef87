"""Answer grading and answer extraction (SWIFT paper appendix D.5; DESIGN 2, "Answers").

Kinds of answer:

- ``math``: math-verify, gold first: ``verify(parse(reference), parse(response))``. A
  ``\\boxed{}`` answer wins over other expressions in the response (the last one; boxes listed
  together, "\\boxed{3}, \\boxed{5}", are one set of answers to math-verify); plain-text answers
  ("The answer is 1,000") are read too. Thousands separators (``1,000``, ``1\\,000``) are
  understood. Used for GSM8K and MATH.
- ``choice``: a letter A-E (AQuA, HellaSwag), read from ``\\boxed{C}``, "The answer is (C)",
  "Answer: C" or a last line such as "C) 12".
- ``boolean``: yes / no (CoinFlip), read from ``\\boxed{Yes}`` or a Yes/No ending the response.
- ``literal``: a Python literal (Imbue code comprehension), the paper's rules: the last
  ``\\boxed{}`` (nested braces allowed), else the text after "answer is", "answer:", "output
  is", "output:", "result is", "result:", "result =", else the whole response; ``\\text{}``,
  escaped braces and code fences removed; compared with ``ast.literal_eval`` on both sides, and
  as unquoted strings when either side is not a literal.

The paper's code reads a boxed letter for multiple choice and a boxed Yes/No, then a Yes/No
ending the response, for booleans; the further fallbacks above (answer phrases, a last line
"C) ...") are this project's, for models that do not box their answer.

Timeouts. math-verify bounds its own work with ``signal.alarm``, which only works on the main
thread of the main interpreter. Here those timeouts are always off (``parsing_timeout=None``,
``timeout_seconds=None``) and math answers are graded in a few persistent worker processes
instead (:mod:`swift_fast.math_workers`): a result that is later than ``timeout`` seconds counts
as wrong (no answer), and the worker is killed and replaced. ``timeout=None`` grades in the
calling process with no limit. The other kinds are plain text rules and run in-process.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from .definitions import CHOICE_LETTERS, KINDS

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0  # seconds per math answer, math-verify's own default
STARTUP_TIMEOUT = 120.0  # a worker imports sympy and math-verify (about a second) before its first answer
CHUNK = 32  # answers handed to a worker at a time; small enough to balance workers, large enough to pipeline


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True)
class Judgement:
    """Outcome of grading one response.

    ``answer`` is the extracted final answer in canonical string form (None when none was
    found); ``status`` is "ok", "timeout" (the math worker ran past the limit), "crash" (it
    died) or "error: ..." (an unexpected exception; ``correct`` is False).
    """

    correct: bool
    answer: str | None
    status: str = "ok"


# --------------------------------------------------------------------------------------------
# public API


def grade(response: str, reference: Any, kind: str = "math", *, timeout: float | None = DEFAULT_TIMEOUT) -> bool:
    """Whether ``response`` gives the answer ``reference`` (see the module docstring for kinds)."""
    return judge_many([response], [reference], kind, timeout=timeout, workers=1)[0].correct


def extract_answer(response: str, kind: str = "math", *, timeout: float | None = DEFAULT_TIMEOUT) -> str | None:
    """The final answer of ``response`` as a canonical, hashable string, or None.

    Equal strings mean the same answer (majority vote keys): math answers go through
    math-verify's parse and are put in one form where that is cheap (``\\frac{6}{5}``, ``6/5``
    and ``1.2`` all give ``"6/5"``; ``1,000`` and ``1000`` give ``"1000"``; ``x = 5`` gives
    ``"5"``); letters are upper case; booleans are ``"yes"`` / ``"no"``.
    """
    return extract_many([response], kind, timeout=timeout, workers=1)[0]


def grade_many(
    responses: Sequence[str],
    references: Sequence[Any],
    kind: str | Sequence[str] = "math",
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    workers: int | None = None,
    stats: dict | None = None,
) -> list[bool]:
    """``grade`` over many responses at once, math answers spread over ``workers`` worker processes.

    ``kind`` is one kind for all or one per response. Identical (response, reference, kind)
    triples are graded once. ``stats`` (a dict) receives counts: "graded", "timeouts",
    "crashes", "errors", "seconds".
    """
    return [j.correct for j in _batch("grade", responses, references, kind, timeout, workers, stats)]


def extract_many(
    responses: Sequence[str],
    kind: str | Sequence[str] = "math",
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    workers: int | None = None,
    stats: dict | None = None,
) -> list[str | None]:
    """``extract_answer`` over many responses at once."""
    return [j.answer for j in _batch("extract", responses, None, kind, timeout, workers, stats)]


def judge_many(
    responses: Sequence[str],
    references: Sequence[Any],
    kind: str | Sequence[str] = "math",
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    workers: int | None = None,
    stats: dict | None = None,
) -> list[Judgement]:
    """Correctness and extracted answer of each response in one pass (math answers are parsed once)."""
    return _batch("judge", responses, references, kind, timeout, workers, stats)


def warm_up(workers: int | None = None) -> None:
    """Start the math workers now (each takes about a second to import sympy and math-verify)."""
    from . import math_workers

    math_workers.warm_up(workers or default_workers())


def shutdown() -> None:
    """Stop the math workers of this process (they are also stopped at exit)."""
    workers = sys.modules.get(f"{__package__}.math_workers")  # never started: nothing to stop
    if workers is not None:
        workers.shutdown()


# --------------------------------------------------------------------------------------------
# argument checks and batching


def _kinds(kind, n: int) -> list[str]:
    ks = [kind] * n if isinstance(kind, str) else list(kind)
    if len(ks) != n:
        raise ValueError(f"got {len(ks)} kinds for {n} responses; pass one kind or one per response")
    for k in set(ks):
        if k not in KINDS:
            raise ValueError(f"unknown answer kind {k!r}; expected one of {', '.join(KINDS)}")
    return ks


def _check_text(x, what: str, i: int) -> str:
    if not isinstance(x, str):
        raise TypeError(f"{what} {i} must be a str, got {type(x).__name__}")
    return x


def _batch(op, responses, references, kind, timeout, workers, stats) -> list[Judgement]:
    t0 = time.perf_counter()
    if isinstance(responses, str):
        raise TypeError("responses must be a sequence of strings; for a single response use grade()/extract_answer()")
    responses = list(responses)
    n = len(responses)
    kinds = _kinds(kind, n)
    if references is None:
        references = [None] * n
    else:
        references = list(references)
        if len(references) != n:
            raise ValueError(f"got {len(references)} references for {n} responses")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None (no limit), got {timeout!r}")
    workers = default_workers() if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")

    out: list[Judgement | None] = [None] * n
    math_items: dict[tuple, list[int]] = {}
    for i, (r, ref, k) in enumerate(zip(responses, references, kinds)):
        _check_text(r, "response", i)
        if op != "extract":
            ref = _reference(ref, k, i)
        if k == "math":
            math_items.setdefault((r, ref), []).append(i)
        else:
            out[i] = _judge_text(op, k, r, ref)

    counts = {"timeouts": 0, "crashes": 0, "errors": 0}
    if math_items:
        keys = list(math_items)
        results = _run_math(op, keys, timeout, workers)
        for key, j in zip(keys, results):
            if j.status == "timeout":
                counts["timeouts"] += 1
            elif j.status == "crash":
                counts["crashes"] += 1
            elif j.status != "ok":
                counts["errors"] += 1
            for i in math_items[key]:
                out[i] = j
        bad = counts["timeouts"] + counts["crashes"] + counts["errors"]
        if bad:
            first = next(j.status for j in results if j.status != "ok")
            log.warning(
                "%d of %d math answers could not be graded within %ss and count as wrong "
                "(timeouts %d, crashes %d, errors %d; first: %s)",
                bad, len(keys), timeout, counts["timeouts"], counts["crashes"], counts["errors"], first,
            )
    if stats is not None:
        stats["graded"] = stats.get("graded", 0) + n
        for k, v in counts.items():
            stats[k] = stats.get(k, 0) + v
        stats["seconds"] = stats.get("seconds", 0.0) + time.perf_counter() - t0
    return out  # type: ignore[return-value]


def _reference(ref, kind: str, i: int):
    """A reference in the form the kind's rules compare against; a clear error when unusable."""
    if ref is None:
        raise ValueError(f"reference {i} is missing (None); every graded response needs its reference answer")
    if kind == "math":
        if isinstance(ref, bool) or not isinstance(ref, (str, int, float)):
            raise TypeError(f"math reference {i} must be a str or a number, got {type(ref).__name__}")
        s = str(ref).strip()
        if not s:
            raise ValueError(f"math reference {i} is empty")
        return s
    if kind == "choice":
        s = _letter_of(str(ref)) if isinstance(ref, str) else None
        if s is None:
            raise ValueError(
                f"choice reference {i} must be a letter {CHOICE_LETTERS[0]}-{CHOICE_LETTERS[-1]}, got {ref!r}"
            )
        return s
    if kind == "boolean":
        b = ("yes" if ref else "no") if isinstance(ref, bool) else _yes_no(str(ref))
        if b is None:
            raise ValueError(f"boolean reference {i} must be yes/no/true/false, got {ref!r}")
        return b
    return ref  # literal: a Python literal as text, or the value itself


# --------------------------------------------------------------------------------------------
# text rules: choice, boolean, literal


def boxed_contents(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces allowed) and of the
    brace-less form ``\\boxed 5``, in order of appearance."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)(?![A-Za-z])\s*(\{)?", text):
        if m.group(1):
            depth, i = 1, m.end()
            while i < len(text) and depth:
                c = text[i]
                if c == "\\" and i + 1 < len(text):
                    # An escaped brace still opens/closes in LaTeX's eyes only as a literal; skip it.
                    i += 2
                    continue
                depth += (c == "{") - (c == "}")
                i += 1
            if depth == 0:
                out.append(text[m.end() : i - 1])
        else:
            t = re.match(r"\s*([^\s$\\{}]+)", text[m.end() :])
            if t:
                out.append(t.group(1))
    return out


_WRAPPERS = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}"
)


def _unwrap(s: str) -> str:
    prev = None
    while prev != s:
        prev, s = s, _WRAPPERS.sub(r"\1", s)
    return s.replace("$", "").replace("*", "").strip()


_LETTER = re.compile(rf"^[\s(\[{{]*([{CHOICE_LETTERS}])(?:[\s).\]:,}}]|$)", re.IGNORECASE)
_CHOICE_PROSE = re.compile(
    r"(?i:answer|option|choice)[*_]*\s*(?:(?i:is|would be|should be|will be)\b|[:：=])\s*(?:(?i:option|choice)\s*)?"
    rf"[*_\s]*[(\[]?([{CHOICE_LETTERS}])[)\]]?(?![A-Za-z0-9])"
)
# A last line that is only a letter, "(C)", "[C]" or "C) ..." / "C. ..." / "C: ..." (not "A total of ...").
_CHOICE_LAST_LINE = re.compile(rf"^(?:[(\[]([{CHOICE_LETTERS}])[)\]]|([{CHOICE_LETTERS}])(?:[).:\]]|$))")


def _letter_of(s: str) -> str | None:
    m = _LETTER.match(_unwrap(s))
    return m.group(1).upper() if m else None


def extract_choice(response: str) -> str | None:
    """The chosen letter: the last ``\\boxed{}`` holding a letter, else the last "answer is (C)" /
    "Answer: C" / "option C", else a last line that starts with the letter ("C", "(C)", "C) 12")."""
    for box in reversed(boxed_contents(response)):
        letter = _letter_of(box)
        if letter:
            return letter
    found = _CHOICE_PROSE.findall(response)
    if found:
        return found[-1]
    lines = [ln for ln in response.strip().splitlines() if ln.strip()]
    if lines:
        m = _CHOICE_LAST_LINE.match(lines[-1].strip().strip("*#>_ \t$"))
        if m:
            return m.group(1) or m.group(2)
    return None


def _yes_no(s: str) -> str | None:
    w = _unwrap(s).strip(" \t\n.!?,;:'\"_").lower()
    if w in ("yes", "true"):
        return "yes"
    if w in ("no", "false"):
        return "no"
    return None


_BOOL_TAIL = re.compile(r"\b(yes|no)\b[\s*_.!?,\"']*$", re.IGNORECASE)
_BOOL_PROSE = re.compile(r"(?i:answer)\s*(?:(?i:is)\b)?\s*[:：]?[\s*_\"']*(yes|no|true|false)\b", re.IGNORECASE)


def extract_boolean(response: str) -> str | None:
    """"yes" / "no": the last ``\\boxed{}`` holding yes/no/true/false, else a Yes/No ending the
    response (the paper's rule), else the last "answer is yes" / "Answer: No"."""
    for box in reversed(boxed_contents(response)):
        b = _yes_no(box)
        if b:
            return b
    m = _BOOL_TAIL.search(response.strip())
    if m:
        return m.group(1).lower()
    found = _BOOL_PROSE.findall(response)
    if found:
        return _yes_no(found[-1])
    return None


_LITERAL_FALLBACKS = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"answer\s*is\s*:*\s*(.*)",
        r"answer:\s*(.*)",
        r"output\s*is\s*:*\s*(.*)",
        r"output:\s*(.*)",
        r"result\s*is\s*:*\s*(.*)",
        r"result:\s*(.*)",
        r"result = \s*:*\s*(.*)",
        r"result=\s*(.*)",
    )
]


def _literal_text(response: str) -> str:
    """The candidate text of a literal answer, by the paper's rules (see the module docstring)."""
    cand = None
    boxes = boxed_contents(response)
    if boxes:
        cand = boxes[-1].strip()
    if not cand:
        for pat in _LITERAL_FALLBACKS:
            found = pat.findall(response)
            if found:
                cand = found[-1].strip()
                break
    if not cand:
        cand = response.strip()
    cand = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", cand)
    cand = cand.replace("\\{", "{").replace("\\}", "}")
    cand = re.sub(r"```(?:python)?\s*(.*?)\s*```", r"\1", cand, flags=re.DOTALL)
    return cand.strip()


def _unquote(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    return s


def _literal(s: str) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(s)
    except Exception:  # any unparsable text falls back to string comparison
        return False, None


def _literal_key(text: str) -> str | None:
    if not text:
        return None
    ok, v = _literal(text)
    if not ok:
        return _unquote(text)
    if isinstance(v, str):
        return v
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return repr(v)


def _literal_correct(text: str, reference) -> bool:
    ok, v = _literal(text)
    if isinstance(reference, str):
        ok_ref, ref_v = _literal(reference)
    else:
        ok_ref, ref_v = True, reference
    if ok and ok_ref:
        try:
            return bool(v == ref_v)
        except Exception:  # a comparison that raises (arrays, odd types) is no match
            return False
    ref_s = reference if isinstance(reference, str) else repr(reference)
    return _unquote(text) == _unquote(ref_s)


def _judge_text(op: str, kind: str, response: str, ref) -> Judgement:
    if kind == "literal":
        text = _literal_text(response)
        answer = _literal_key(text) if op != "grade" else None
        correct = _literal_correct(text, ref) if op != "extract" else False
        return Judgement(correct, answer)
    answer = extract_choice(response) if kind == "choice" else extract_boolean(response)
    return Judgement(op != "extract" and answer is not None and answer == ref, answer)


# --------------------------------------------------------------------------------------------
# math rules (run inside the worker processes, or in-process with timeout=None)

_MV = None


def _math_verify():
    """math-verify with its signal-based timeouts off (they are enforced by the caller)."""
    global _MV
    if _MV is None:
        import math_verify
        from math_verify import ExprExtractionConfig, LatexExtractionConfig

        # With timeouts off, math-verify warns once that the caller must bound the time itself:
        # that is what this module does.
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(lambda r: "Timeout is disabled" not in r.getMessage())
        pred_cfg = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
        gold_cfg = [LatexExtractionConfig(), ExprExtractionConfig()]
        _MV = (math_verify, pred_cfg, gold_cfg)
    return _MV


_THOUSANDS_PLAIN = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
# "1\,000" and "1\!000": LaTeX thin-space thousands separators that math-verify reads as two numbers.
_THOUSANDS_LATEX = re.compile(r"(?<=\d)\\[,!](?=\d{3}(?!\d))")


@lru_cache(maxsize=8192)
def _parse_gold(reference: str):
    mv, _, gold_cfg = _math_verify()
    s = reference.strip()
    if _THOUSANDS_PLAIN.fullmatch(s):
        s = s.replace(",", "")
    if "\\boxed" not in s and not s.startswith("$"):
        s = f"${s}$"
    return mv.parse(s, gold_cfg, parsing_timeout=None)


def _parse_pred(response: str):
    mv, pred_cfg, _ = _math_verify()
    return mv.parse(_THOUSANDS_LATEX.sub("", response), pred_cfg, parsing_timeout=None)


def _math_key(parsed) -> str | None:
    if not parsed:
        return None
    e = parsed[0]
    if isinstance(e, str):
        return e.strip() or None
    import sympy

    try:
        if isinstance(e, sympy.Eq) and isinstance(e.lhs, sympy.Symbol):
            e = e.rhs  # "x = 5" answers 5
        if isinstance(e, sympy.Basic) and e.is_number:
            if e.has(sympy.Float):
                e = sympy.nsimplify(e, rational=True)
            if not e.is_Rational:
                e = sympy.simplify(e)
    except Exception:  # canonical form is best effort; the parsed form stands
        pass
    return str(e)


def _judge_math(op: str, response: str, reference: str | None) -> tuple[bool, str | None]:
    mv = _math_verify()[0]
    pred = _parse_pred(response)
    correct = False
    if op != "extract":
        gold = _parse_gold(reference)
        correct = bool(gold) and bool(pred) and bool(mv.verify(gold, pred, timeout_seconds=None))
    answer = _math_key(pred) if op != "grade" else None
    return correct, answer


def _judge_math_safe(op, response, reference) -> Judgement:
    try:
        return Judgement(*_judge_math(op, response, reference))
    except Exception as e:  # one bad answer must not stop a batch
        return Judgement(False, None, f"error: {type(e).__name__}: {str(e)[:200]}")


def _run_math(op: str, items: list[tuple[str, str | None]], timeout: float | None, workers: int) -> list[Judgement]:
    if timeout is None:
        return [_judge_math_safe(op, r, ref) for r, ref in items]
    from . import math_workers

    return math_workers.run(op, items, timeout, workers)
