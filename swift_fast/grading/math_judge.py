"""Math answers: math-verify set up for this project, what a response states, and the verdict.

:mod:`swift_fast.grading` (the public API, in-process grading) and :mod:`swift_fast.grading.math_workers`
(the deadline-bound worker processes) both judge math answers with this module; it imports
neither of them.

The verdict is math-verify's, gold first: ``verify(parse(reference), parse(response))``, with
its signal-based timeouts off (the caller bounds the time). Around it, these rules decide what
a response states:

- Boxes. The last ``\\boxed{}`` wins (boxes listed together, "\\boxed{3}, \\boxed{5}", are one
  set of answers). A box holding a placeholder copied from a prompt template
  (``\\boxed{Your Answer}``, ``\\boxed{answer}``, ``\\boxed{...}``, an empty box) states nothing
  and is set aside; a response whose boxes are all placeholders has no answer.
- Units. A box holding a number followed by words (``18 eggs``, ``18 km/h``, ``\\$18 dollars``)
  answers the number.
- Chains of equalities. The stated result of ``a = b = c`` is its last side:
  "1320 - 51 = 1321" answers 1321, in prose, in ``$...$`` and in a box alike; ``x = 5`` and
  ``\\text{Total} = 5`` answer 5. A two-sided equation whose left side is neither a number nor
  a name ("2x = 10", "y - 1 = 2x") stays an equation. A list ("x = 1, y = 2") is left to
  math-verify. Against a reference that is itself an equation, the equation as written is judged.
- Text is no value. LaTeX reads a word as a product of letters ("sarah has 17" as
  ``s*a*r*a*h*h*a*s*17``). An answer whose text mixes words (three letters or more, outside
  ``\\text{}`` and LaTeX commands) with digits is no answer. Words alone ("Evelyn") are a text
  answer, keyed by their lowercase letters as ``\\text{Evelyn}`` is. Judged against a reference
  without free symbols (a number, an interval, a tuple), an answer with free symbols ("2x",
  "n + 1", "Evelyn") is no answer: it names no value of the kind asked for.

"No answer" means ``answer`` None and never correct, so it is out of every vote.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from functools import lru_cache

import regex


@dataclass(frozen=True)
class Judgement:
    """Outcome of grading one response.

    ``answer`` is the extracted final answer in canonical string form (None when none was
    found); ``status`` is "ok", "truncated" (cut off with no complete final answer statement:
    see :func:`swift_fast.grading.cut_off`), "timeout" (the math worker ran past the limit),
    "crash" (it died) or "error: ..." (an unexpected exception; ``correct`` is False).
    """

    correct: bool
    answer: str | None
    status: str = "ok"


def default_workers() -> int:
    """Math grading worker processes used when the caller names no count."""
    return max(1, min(4, os.cpu_count() or 1))


# --------------------------------------------------------------------------------------------
# text helpers shared with the other answer kinds


_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*(\{)?")
_BARE_BOX = re.compile(r"\s*([^\s$\\{}]+)")


def boxed_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, content)`` of every closed ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces
    allowed) and of the brace-less form ``\\boxed 5``, in order; ``text[start:end]`` is the whole
    box. A box whose braces never close (text cut off inside it) is not listed."""
    out = []
    closing = None
    for m in _BOX.finditer(text):
        if m.group(1):
            if closing is None:
                closing = _closing_braces(text)
            end = closing.get(m.start(1))
            if end is not None:
                out.append((m.start(), end + 1, text[m.end() : end]))
        else:
            t = _BARE_BOX.match(text, m.end())
            if t:
                out.append((m.start(), t.end(), t.group(1)))
    return out


def _closing_braces(text: str) -> dict[int, int]:
    """Position of the brace that closes each ``{`` that is closed (one pass, so a text full of
    unclosed boxes costs linear time)."""
    out, stack, i, n = {}, [], 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            # An escaped brace is a literal brace, not a group delimiter.
            i += 2
            continue
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            out[stack.pop()] = i
        i += 1
    return out


_WRAPPERS = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}"
)


def _unwrap_wrappers(s: str) -> str:
    prev = None
    while prev != s:
        prev, s = s, _WRAPPERS.sub(r"\1", s)
    return s


def unwrap_text(s: str) -> str:
    """``s`` without ``\\text{}``-like wrappers (their content kept), ``$`` and ``*``."""
    return _unwrap_wrappers(s).replace("$", "").replace("*", "").strip()


# --------------------------------------------------------------------------------------------
# math-verify

_MV = None


def math_verify_setup():
    """``(math_verify, prediction config, reference config)`` with math-verify's signal-based
    timeouts off (they only work on the main thread; the caller bounds the time instead)."""
    global _MV
    if _MV is None:
        import math_verify
        from math_verify import ExprExtractionConfig, LatexExtractionConfig

        # With timeouts off, math-verify warns once that the caller must bound the time itself:
        # the callers of this module do.
        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(lambda r: "Timeout is disabled" not in r.getMessage())
        pred_cfg = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
        gold_cfg = [LatexExtractionConfig(), ExprExtractionConfig()]
        _MV = (math_verify, pred_cfg, gold_cfg)
    return _MV


_THOUSANDS_PLAIN = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
# "1\,000" and "1\!000": LaTeX thin-space thousands separators that math-verify reads as two numbers.
_THOUSANDS_LATEX = re.compile(r"(?<=\d)\\[,!](?=\d{3}(?!\d))")
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


@lru_cache(maxsize=8192)
def parse_gold(reference: str) -> list:
    """math-verify's reading of a reference answer (bare text is read as math)."""
    mv, _, gold_cfg = math_verify_setup()
    s = reference.strip()
    if _THOUSANDS_PLAIN.fullmatch(s):
        s = s.replace(",", "")
    if "\\boxed" not in s and not s.startswith("$"):
        s = f"${s}$"
    return mv.parse(s, gold_cfg, parsing_timeout=None)


# --------------------------------------------------------------------------------------------
# what a response states: rewrites before math-verify reads it

_PLACEHOLDERS = frozenset(
    {
        "", "answer", "youranswer", "finalanswer", "yourfinalanswer", "theanswer", "thefinalanswer",
        "answerhere", "youranswerhere", "insertanswer", "insertanswerhere", "answergoeshere",
    }
)
_ELLIPSES = re.compile(r"\\(?:ldots|cdots|dots|dotsc|vdots)(?![A-Za-z])|…")


def is_placeholder(content: str) -> bool:
    """Whether box content is template text standing in for an answer ("Your Answer", "...")."""
    s = unwrap_text(_ELLIPSES.sub("", content)).lower()
    return re.sub(r"[\s.,:;?!\[\]<>()'\"_~\\]+", "", s) in _PLACEHOLDERS


_NUMBER = r"-?\d+(?:,\d{3})*(?:\.\d+)?"
# A number and then unit words only: "18 eggs", "\$18 dollars", "18 km/h", "\text{18}" (two letters
# at least, so "2 k" stays the product 2k).
_NUMBER_WITH_UNITS = re.compile(
    rf"\s*(?:\\?\$)?\s*({_NUMBER})\s*((?<=\s)[A-Za-z]+(?:\^\{{?\d\}}?)?"
    r"(?:\s*(?:/|\s|\\cdot|\\,)\s*[A-Za-z]+(?:\^\{?\d\}?)?)*)?\s*\.?\s*"
)


def _number_with_units(content: str) -> str | None:
    """The number a box states when it holds only a number with unit words or in ``\\text{}``."""
    bare = _unwrap_wrappers(content)
    m = _NUMBER_WITH_UNITS.fullmatch(bare)
    if m is None:
        return None
    units = m.group(2) or ""
    if units and sum(c.isalpha() for c in units) < 2:
        return None
    return m.group(1) if units or bare != content else None


# Plain-text chains of numeric equalities ("1320 - 51 = 1321", "$12 * 3 = $36", "18 eggs * 2 = 36").
# Atomic groups, possessive digits and a bound on the terms of a side keep this linear in the
# text's length (a long run of digits or of "1 + 1 + ..." would otherwise cost quadratic time).
# NOTE: the standard library's ``re`` has atomic groups and possessive quantifiers only from
# Python 3.11; the ``regex`` package (which transformers requires too) has them on every Python
# the project supports.
_TERM = r"(?>\(?[-−]?(?:\\?\$)?(?<![\d.,])\d++(?:,\d{3})*+(?:\.\d+)?+%?\)?)"
_TERM_UNIT = rf"{_TERM}(?:\s+[A-Za-z]{{2,12}}(?=\s*(?:[-−+*/×÷=]|x\s)))?"
_OP = r"\s*[-−+*/×÷]\s*|\s+x\s+"
_SIDE = rf"(?>{_TERM_UNIT}(?:(?:{_OP}){_TERM_UNIT}){{0,24}})"
_CHAIN = regex.compile(rf"{_SIDE}(?:\s*=\s*{_SIDE})+")
_LAST_SIDE = regex.compile(rf"=\s*({_SIDE})$")
_BEFORE_CHAIN_OK = re.compile(r"(?:^|[\s(\[:=,$])$")
_OPERATOR_BEFORE = re.compile(r"(?:[-−+*/×÷^_=<>·]|\\[A-Za-z]+)\s*$")


def _last_sides(text: str) -> str:
    """Each plain-text chain of numeric equalities replaced by its last side."""

    def repl(m: regex.Match) -> str:
        before = text[max(0, m.start() - 32) : m.start()]
        after = text[m.end() : m.end() + 1]
        if not _BEFORE_CHAIN_OK.search(before[-1:] if before else "") or _OPERATOR_BEFORE.search(before):
            return m.group(0)
        if after and (after.isalnum() or after in "^_{\\"):
            return m.group(0)
        last = _LAST_SIDE.search(m.group(0))
        return last.group(1).replace("−", "-") if last else m.group(0)

    return _CHAIN.sub(repl, text)


def _rewrite(response: str) -> str | None:
    """The response as math-verify should read it, or None when its boxes state no answer."""
    boxes = boxed_spans(response)
    if boxes:
        parts, at, real = [], 0, 0
        for start, end, content in boxes:
            if start < at:
                continue  # a box inside a box already taken whole
            parts.append(response[at:start])
            at = end
            if is_placeholder(content):
                parts.append(" ")
                continue
            real += 1
            number = _number_with_units(content)
            parts.append(f"\\boxed{{{number}}}" if number else response[start:end])
        if not real:
            return None
        parts.append(response[at:])
        response = "".join(parts)
    return _THOUSANDS_LATEX.sub("", _last_sides(response))


def parse_pred(response: str) -> list:
    """math-verify's reading of a response after the rewrites above ([] when it states no answer)."""
    text = _rewrite(response)
    if text is None:
        return []
    mv, pred_cfg, _ = math_verify_setup()
    return mv.parse(text, pred_cfg, parsing_timeout=None)


# --------------------------------------------------------------------------------------------
# what a response states: reading math-verify's result

_EQUALS = re.compile(r"(?<![<>!\\:])=(?!=)")
_NAME = re.compile(
    r"\s*(?:\\(?:text|textbf|mathrm|operatorname|mathit)\s*\{[^{}]*\}|[A-Za-z][A-Za-z ]*|\\[A-Za-z]+)"
    r"(?:_\{?\w+\}?)?\s*"
)
_FUNCTIONS = re.compile(
    r"\\[A-Za-z]+|(?:arc)?(?:sin|cos|tan|cot|sec|csc)h?|log|ln|exp|sqrt|max|min|gcd|lcm|mod|det|infty|inf"
)
_WORD = re.compile(r"[A-Za-z]{3,}")


@dataclass(frozen=True)
class Stated:
    """A response's answer: ``value`` (a sympy object or math-verify's string) with ``parsed``
    (the list handed to ``verify``), ``as_written`` (math-verify's own reading, for references
    that are equations) and ``text`` (the answer's source text)."""

    value: object
    parsed: list
    as_written: list
    text: str


def _free_symbols(v) -> set:
    return set(getattr(v, "free_symbols", ()) or ())


def _is_number(v) -> bool:
    import sympy

    return isinstance(v, sympy.Expr) and not v.free_symbols


def _last_side(s: str, parsed: list) -> tuple[object, str] | None:
    """The stated result of a chain of equalities written ``s``, or None when ``s`` is not one."""
    plain = _THOUSANDS_COMMA.sub("", s)
    if not _EQUALS.search(plain) or re.search(r"[,;]", plain):
        return None
    sides = [x.strip() for x in _EQUALS.split(plain)]
    sides = [x for x in sides if x]
    if not sides:
        return None
    if len(sides) == 2:
        lhs = sides[0]
        lhs_value = parse_gold(lhs)
        named = bool(_NAME.fullmatch(lhs)) or (lhs_value and getattr(lhs_value[0], "is_Symbol", False))
        if not named and not (lhs_value and _is_number(lhs_value[0])):
            return None
    last = sides[-1]
    got = parse_gold(last)
    if not got:
        return None
    return got[0], last


def _has_words(s: str) -> tuple[bool, bool]:
    """(has a word of three letters or more outside ``\\text{}`` and commands, has a digit there)."""
    bare = _FUNCTIONS.sub(" ", _WRAPPERS.sub(" ", s))
    return bool(_WORD.search(bare)), bool(re.search(r"\d", bare))


def stated(response: str) -> Stated | None:
    """What ``response`` states as its final answer, by the rules in the module docstring."""
    parsed = parse_pred(response)
    if not parsed:
        return None
    value = parsed[0]
    text = parsed[1] if len(parsed) > 1 and isinstance(parsed[1], str) else (value if isinstance(value, str) else "")
    if is_placeholder(text):
        return None
    reduced = _last_side(text, parsed)
    out = parsed
    if reduced is not None:
        value, text = reduced
        out = [value, text]
    elif getattr(value, "is_Equality", False) and getattr(value.lhs, "is_Symbol", False):
        value = value.rhs  # "x \in [-2, 7]": a named answer math-verify reads as Eq(x, ...)
        out = [value, text]
    if _free_symbols(value):
        words, digits = _has_words(text)
        if words and digits:
            return None
    return Stated(value, out, parsed, text)


def answer_key(s: Stated | None) -> str | None:
    """A canonical string for ``s`` (equal strings mean the same answer: majority vote keys)."""
    if s is None:
        return None
    e = s.value
    if isinstance(e, str):
        return e.strip() or None
    import sympy

    if _free_symbols(e):
        words, _ = _has_words(s.text)
        if words:
            return re.sub(r"[^a-z]", "", unwrap_text(s.text).lower()) or None
    try:
        if isinstance(e, sympy.Basic) and e.is_number:
            if e.has(sympy.Float):
                e = sympy.nsimplify(e, rational=True)
            if not e.is_Rational:
                e = sympy.simplify(e)
    except Exception:  # canonical form is best effort; the parsed form stands
        pass
    return str(e)


def _relation(v) -> bool:
    import sympy

    return isinstance(v, (sympy.Rel, sympy.And))


def judge(op: str, response: str, reference: str | None) -> tuple[bool, str | None]:
    """``(correct, answer key)`` of a math response; ``op`` is "grade", "extract" or "judge"
    (``correct`` is False for "extract", the key None for "grade")."""
    mv = math_verify_setup()[0]
    s = stated(response)
    correct = False
    if op != "extract" and s is not None:
        gold = parse_gold(reference)
        if gold and not isinstance(gold[0], str) and not _free_symbols(gold[0]) and _free_symbols(s.value):
            s = None  # an expression in unknowns where a value is asked for states no value
        elif gold:
            pred = s.as_written if _relation(gold[0]) else s.parsed
            correct = bool(mv.verify(gold, pred, timeout_seconds=None))
    answer = answer_key(s) if op != "grade" else None
    return correct, answer


def judge_safe(op: str, response: str, reference: str | None) -> Judgement:
    """:func:`judge` that turns an unexpected exception into a wrong answer with an error status."""
    try:
        return Judgement(*judge(op, response, reference))
    except Exception as e:  # one bad answer must not stop a batch
        return Judgement(False, None, f"error: {type(e).__name__}: {str(e)[:200]}")
