"""Answer grading and answer extraction (SWIFT paper appendix D.5; DESIGN 2, "Answers").

Kinds of answer:

- ``math``: math-verify, gold first: ``verify(parse(reference), parse(response))``, with the
  project's rules around it (:mod:`swift_fast.grading.math_judge`): a ``\\boxed{}`` answer wins over
  other expressions in the response (the last one; boxes listed together, "\\boxed{3},
  \\boxed{5}", are one set of answers to math-verify); plain-text answers ("The answer is
  1,000") are read too. Thousands separators (``1,000``, ``1\\,000``) are understood. The
  stated result of a chain of equalities is its last side ("1320 - 51 = 1321" answers 1321).
  Placeholders copied from a prompt (``\\boxed{Your Answer}``) and words read as math
  ("sarah has 17") are no answer. Used for GSM8K and MATH.
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

No answer (None) is never correct and is out of every vote.

Truncation. A response that stopped because it hit a limit rather than ending by itself
(finish reason "length", "abort", or "pruned" by the pruning policy: :data:`CUT_OFF_REASONS`)
may end inside its answer: "... 2960 * 2 = 59" cut mid-number must not be credited for 59.
The rule, ``truncation="strict"`` (the default): such a response counts only if it holds a
complete final answer statement, meaning a closed ``\\boxed{...}`` that is not a placeholder,
or an answer phrase ("the answer is 12.", "Final answer: 12", "Answer: (C)", "#### 12"; for
literals "output is ..." and the like) whose value is followed by something (a space, a
newline, punctuation, a closing ``$`` or bracket). A value at the very end of the text could
itself be cut ("The answer is 12" may have been "125"), so it does not count; a full stop does
("The answer is 12." counts). Otherwise the response is wrong with answer None and status
"truncated" (counted in ``stats["truncated"]``). With a complete statement it is graded as it
is. ``truncation="lenient"`` grades every response as it is. :func:`cut_off` says whether a
response counts as truncated under the strict rule. Responses with no finish reason (None)
are never cut off.

Timeouts. math-verify bounds its own work with ``signal.alarm``, which only works on the main
thread of the main interpreter. Here those timeouts are always off (``parsing_timeout=None``,
``timeout_seconds=None``) and math answers are graded in a few persistent worker processes
instead (:mod:`swift_fast.grading.math_workers`): a result that is later than ``timeout`` seconds counts
as wrong (no answer), and the worker is killed and replaced. ``timeout=None`` grades in the
calling process with no limit. The other kinds are plain text rules and run in-process.
"""

from __future__ import annotations

import ast
import logging
import re
import sys
import time
from typing import Any, Sequence

from ..definitions import CHOICE_LETTERS, KINDS
from .math_judge import Judgement, boxed_spans, default_workers, is_placeholder, judge_safe, unwrap_text

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0  # seconds per math answer, math-verify's own default


# --------------------------------------------------------------------------------------------
# public API


def grade(
    response: str,
    reference: Any,
    kind: str = "math",
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    finish_reason: str | None = None,
    truncation: str = "strict",
) -> bool:
    """Whether ``response`` gives the answer ``reference`` (see the module docstring for kinds
    and for the truncation rule that ``finish_reason`` and ``truncation`` select)."""
    return judge_many(
        [response], [reference], kind, timeout=timeout, workers=1, finish_reasons=[finish_reason], truncation=truncation
    )[0].correct


def extract_answer(
    response: str,
    kind: str = "math",
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    finish_reason: str | None = None,
    truncation: str = "strict",
) -> str | None:
    """The final answer of ``response`` as a canonical, hashable string, or None.

    Equal strings mean the same answer (majority vote keys): math answers go through
    math-verify's parse and are put in one form where that is cheap (``\\frac{6}{5}``, ``6/5``
    and ``1.2`` all give ``"6/5"``; ``1,000`` and ``1000`` give ``"1000"``; ``x = 5`` and
    ``2 + 3 = 5`` give ``"5"``); letters are upper case; booleans are ``"yes"`` / ``"no"``.
    Placeholders and words read as math give None (:mod:`swift_fast.grading.math_judge`).
    """
    return extract_many(
        [response], kind, timeout=timeout, workers=1, finish_reasons=[finish_reason], truncation=truncation
    )[0]


def grade_many(
    responses: Sequence[str],
    references: Sequence[Any],
    kind: str | Sequence[str] = "math",
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    workers: int | None = None,
    stats: dict | None = None,
    finish_reasons: Sequence[str | None] | None = None,
    truncation: str = "strict",
) -> list[bool]:
    """``grade`` over many responses at once, math answers spread over ``workers`` worker processes.

    ``kind`` is one kind for all or one per response. ``finish_reasons`` is None (no response
    was cut off) or one per response (``"stop"``, ``"length"``, ...; None where unknown);
    ``truncation`` is "strict" or "lenient" (module docstring). Identical (response, reference,
    kind) triples are graded once. ``stats`` (a dict) receives counts: "graded", "truncated",
    "timeouts", "crashes", "errors", "seconds".
    """
    return [
        j.correct
        for j in _batch("grade", responses, references, kind, timeout, workers, stats, finish_reasons, truncation)
    ]


def extract_many(
    responses: Sequence[str],
    kind: str | Sequence[str] = "math",
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    workers: int | None = None,
    stats: dict | None = None,
    finish_reasons: Sequence[str | None] | None = None,
    truncation: str = "strict",
) -> list[str | None]:
    """``extract_answer`` over many responses at once (arguments as for :func:`grade_many`)."""
    return [
        j.answer for j in _batch("extract", responses, None, kind, timeout, workers, stats, finish_reasons, truncation)
    ]


def judge_many(
    responses: Sequence[str],
    references: Sequence[Any],
    kind: str | Sequence[str] = "math",
    *,
    timeout: float | None = DEFAULT_TIMEOUT,
    workers: int | None = None,
    stats: dict | None = None,
    finish_reasons: Sequence[str | None] | None = None,
    truncation: str = "strict",
) -> list[Judgement]:
    """Correctness and extracted answer of each response in one pass (math answers are parsed
    once); arguments as for :func:`grade_many`. A response the truncation rule rejects gets
    ``Judgement(False, None, "truncated")``."""
    return _batch("judge", responses, references, kind, timeout, workers, stats, finish_reasons, truncation)


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
# truncation

TRUNCATION_RULES = ("strict", "lenient")
# Finish reasons of a response that did not end by itself: vLLM's "length" (max_tokens) and
# "abort", the pruning policy's "pruned" (stopped early by its score).
CUT_OFF_REASONS = frozenset({"length", "pruned", "abort"})

_ANSWER_PHRASE = re.compile(
    r"(?i:\banswer\b)[*_\s]*(?:(?i:is|would be|will be|should be)\b[\s*_]*:?|[:：=])|####"
    r"|(?i:\bfinal answer\b)[^\n.]{0,50}?\b(?i:is)\b[\s*_]*:?"
)
_LITERAL_PHRASE = re.compile(r"(?i:\b(?:answer|output|result))\s*(?:(?i:is)\b\s*:*|:|=)")
_VALUE_OPENER = re.compile(r"[\s*_]*(?:\\\(|\\\[|\$\$?|\(|\[)?[\s*_]*")
_VALUE_START = {
    "math": re.compile(r"[-+−]?(?:\d|\.\d|\\[A-Za-z$])"),
    "choice": re.compile(rf"[{CHOICE_LETTERS}{CHOICE_LETTERS.lower()}](?![A-Za-z])"),
    "boolean": re.compile(r"(?i:yes|no|true|false)(?![A-Za-z])"),
}


_CONTINUES = re.compile(r"\s*(?:[-+*/×÷=^·<>]|\\(?:cdot|times|div)(?![A-Za-z])|x(?=\s))\s*")


def _value_ends(text: str, start: int, kind: str) -> bool:
    """Whether an answer phrase ending at ``start`` is followed by a value and then by something
    that shows the value ended (a space, a newline, punctuation, a closing ``$`` or bracket). A
    value that goes on with an operator or "=" ("1320 - 51 = 1321") ends where its last side does."""
    i = _VALUE_OPENER.match(text, start).end()
    if not _VALUE_START[kind].match(text, i):
        return False
    n = len(text)
    while True:
        j, depth = i, 0
        while j < n:
            c = text[j]
            if c == "{":
                depth += 1
            elif c == "}":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0:
                if c.isspace() or c in "$;!?)]*=":
                    break
                # "12.5" and "1,000" go on; "12." and "12, ..." end the value.
                if c in ".," and not (j + 1 < n and text[j + 1].isdigit()):
                    break
            j += 1
        if depth or j == i or j >= n:
            return False
        more = _CONTINUES.match(text, j) if kind == "math" else None
        if more is None:
            return True
        i = more.end()


def has_final_statement(text: str, kind: str = "math") -> bool:
    """Whether ``text`` holds a complete final answer statement: a closed ``\\boxed{...}`` that is
    not a placeholder, or an answer phrase ("the answer is X", "final answer: X", "Answer: (C)",
    "#### X"; for literals also "output is X", "result = X") whose value is followed by
    something, so it cannot have been cut mid-value."""
    if kind not in KINDS:
        raise ValueError(f"unknown answer kind {kind!r}; expected one of {', '.join(KINDS)}")
    for _, end, content in boxed_spans(text):
        braced = text[end - 1] == "}"
        if (braced or end < len(text)) and not is_placeholder(content):
            return True
    if kind == "literal":
        return any(re.match(r"\s*\S[^\n]*\n", text[m.end() :]) for m in _LITERAL_PHRASE.finditer(text))
    return any(_value_ends(text, m.end(), kind) for m in _ANSWER_PHRASE.finditer(text))


def cut_off(text: str, finish_reason: str | None, kind: str = "math") -> bool:
    """Whether a response counts as truncated under the strict rule: it stopped for a reason in
    :data:`CUT_OFF_REASONS` and holds no complete final answer statement
    (:func:`has_final_statement`)."""
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise TypeError(f"finish_reason must be a str or None, got {type(finish_reason).__name__}")
    return finish_reason in CUT_OFF_REASONS and not has_final_statement(text, kind)


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


def _batch(op, responses, references, kind, timeout, workers, stats, finish_reasons, truncation) -> list[Judgement]:
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
    reasons = _finish_reasons(finish_reasons, n)
    if truncation not in TRUNCATION_RULES:
        raise ValueError(
            f"truncation must be 'strict' (a cut-off response without a complete final answer statement is wrong) "
            f"or 'lenient' (grade the text as it is), got {truncation!r}"
        )
    strict = truncation == "strict"

    out: list[Judgement | None] = [None] * n
    math_items: dict[tuple, list[int]] = {}
    truncated = 0
    for i, (r, ref, k, why) in enumerate(zip(responses, references, kinds, reasons)):
        _check_text(r, "response", i)
        if op != "extract":
            ref = _reference(ref, k, i)
        if strict and cut_off(r, why, k):
            out[i] = Judgement(False, None, "truncated")
            truncated += 1
        elif k == "math":
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
        stats["truncated"] = stats.get("truncated", 0) + truncated
        for k, v in counts.items():
            stats[k] = stats.get(k, 0) + v
        stats["seconds"] = stats.get("seconds", 0.0) + time.perf_counter() - t0
    return out  # type: ignore[return-value]


def _finish_reasons(finish_reasons, n: int) -> list[str | None]:
    if finish_reasons is None:
        return [None] * n
    if isinstance(finish_reasons, str):
        raise TypeError("finish_reasons must be a sequence with one finish reason per response (or None), not a str")
    reasons = list(finish_reasons)
    if len(reasons) != n:
        raise ValueError(f"got {len(reasons)} finish reasons for {n} responses; pass one per response or None")
    for i, why in enumerate(reasons):
        if why is not None and not isinstance(why, str):
            raise TypeError(f"finish reason {i} must be a str or None, got {type(why).__name__}")
    return reasons


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
    """Contents of every closed ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces allowed) and of the
    brace-less form ``\\boxed 5``, in order of appearance."""
    return [content for _, _, content in boxed_spans(text)]




_LETTER = re.compile(rf"^[\s(\[{{]*([{CHOICE_LETTERS}])(?:[\s).\]:,}}]|$)", re.IGNORECASE)
_CHOICE_PROSE = re.compile(
    r"(?i:answer|option|choice)[*_]*\s*(?:(?i:is|would be|should be|will be)\b|[:：=])\s*(?:(?i:option|choice)\s*)?"
    rf"[*_\s]*[(\[]?([{CHOICE_LETTERS}])[)\]]?(?![A-Za-z0-9])"
)
# A last line that is only a letter, "(C)", "[C]" or "C) ..." / "C. ..." / "C: ..." (not "A total of ...").
_CHOICE_LAST_LINE = re.compile(rf"^(?:[(\[]([{CHOICE_LETTERS}])[)\]]|([{CHOICE_LETTERS}])(?:[).:\]]|$))")


def _letter_of(s: str) -> str | None:
    m = _LETTER.match(unwrap_text(s))
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
    w = unwrap_text(s).strip(" \t\n.!?,;:'\"_").lower()
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
# math answers (rules in swift_fast.grading.math_judge)


def _run_math(op: str, items: list[tuple[str, str | None]], timeout: float | None, workers: int) -> list[Judgement]:
    if timeout is None:
        return [judge_safe(op, r, ref) for r, ref in items]
    from . import math_workers

    return math_workers.run(op, items, timeout, workers)
