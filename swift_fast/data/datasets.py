"""Benchmark loaders (GSM8K, MATH-500, AQuA, generic JSONL).

Each loader reads a JSONL file (one JSON object per line) into ``Example`` records with the
question text, the reference answer in the form ``swift_fast.grading`` compares against, and
the grading kind. Formats (detected from the first row's fields, or named with ``format=``):

===========  ===========================================  ================================
format       fields of a row                              reference, kind
===========  ===========================================  ================================
``gsm8k``    ``question``, ``answer`` ending ``#### N``   N without thousands commas, math
``math500``  ``problem``, ``answer`` (LaTeX), optional    ``answer``, math
             ``solution``, ``subject``, ``level``,
             ``unique_id``
``aqua``     ``question``, ``options`` (5 x "A)..."),     ``correct`` (a letter), choice
             ``correct``, optional ``rationale``
``generic``  ``prompt`` (or ``question``), ``answer``,    ``answer``; kind from the row, the
             optional ``id``, ``kind``, ``dataset``       ``kind=`` argument, else math
===========  ===========================================  ================================

A malformed row raises ``DataError`` naming the file and line, what is wrong and how to fix it;
with ``skip_bad=True`` it is skipped and counted in ``stats["skipped"]`` (reasons in
``stats["errors"]``), as ``swift_fast.data.rollouts`` does for rollout files.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypeVar

from ..definitions import CHOICE_LETTERS, KINDS

T = TypeVar("T")


class DataError(ValueError):
    """A data file that cannot be used as given; the message names file and line."""


@dataclass
class Example:
    """One benchmark problem.

    ``id`` is stable for a file: ``"<dataset>/<i>"`` with ``i`` the 0-based line index; files
    other than ``test.jsonl`` add their name: ``"aqua-dev/3"``. Generic files use a row's own
    ``id`` when it has one, else ``"<file name>/<i>"``. ``question`` is the text the prompt
    templates wrap (for AQuA the question followed by its options, as the SWIFT paper's
    preprocessing lays them out).
    """

    id: str
    question: str
    reference: Any
    kind: str
    dataset: str
    extra: dict = field(default_factory=dict)


FORMATS = ("gsm8k", "math500", "aqua", "generic")
DATA_ENV = "SWIFT_FAST_DATA"


def _need_str(row: dict, key: str, hint: str) -> str:
    if key not in row:
        raise _RowError(f"missing field {key!r} ({hint})")
    v = row[key]
    if not isinstance(v, str):
        raise _RowError(f"field {key!r} must be a string, got {type(v).__name__} ({hint})")
    if not v.strip():
        raise _RowError(f"field {key!r} is empty ({hint})")
    return v


class _RowError(Exception):
    pass


_GSM8K_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_GSM8K_HINT = "a GSM8K row is {\"question\": ..., \"answer\": \"<solution>\\n#### <number>\"}"


def _gsm8k(row: dict) -> tuple[str, str, str, dict]:
    q = _need_str(row, "question", _GSM8K_HINT)
    a = _need_str(row, "answer", _GSM8K_HINT)
    if "####" not in a:
        raise _RowError(f"field 'answer' has no '#### <number>' line with the final answer ({_GSM8K_HINT})")
    final = a.rsplit("####", 1)[1].strip()
    if not _GSM8K_NUMBER.fullmatch(final):
        raise _RowError(f"the final answer after '####' must be a number, got {final!r} ({_GSM8K_HINT})")
    return q, final.replace(",", ""), "math", {"solution": a.rsplit("####", 1)[0].strip()}


_MATH_HINT = "a MATH-500 row is {\"problem\": ..., \"answer\": \"<LaTeX>\", ...}"


def _math500(row: dict) -> tuple[str, str, str, dict]:
    q = _need_str(row, "problem", _MATH_HINT)
    a = _need_str(row, "answer", _MATH_HINT)
    extra = {k: row[k] for k in ("solution", "subject", "level", "unique_id") if k in row}
    return q, a.strip(), "math", extra


_AQUA_HINT = (
    "an AQuA row is {\"question\": ..., \"options\": [\"A)...\", \"B)...\", \"C)...\", \"D)...\", \"E)...\"], "
    "\"correct\": \"A\"..\"E\"}"
)
_OPTION = re.compile(r"\s*\(?([A-Z])\)")


def _aqua(row: dict) -> tuple[str, str, str, dict]:
    q = _need_str(row, "question", _AQUA_HINT)
    opts = row.get("options")
    if not isinstance(opts, list) or not opts or not all(isinstance(o, str) for o in opts):
        raise _RowError(f"field 'options' must be a non-empty list of strings ({_AQUA_HINT})")
    letters = []
    for o in opts:
        m = _OPTION.match(o)
        if not m:
            raise _RowError(f"option {o[:40]!r} does not start with its letter, as in 'A)...' ({_AQUA_HINT})")
        letters.append(m.group(1))
    if letters != list(CHOICE_LETTERS[: len(letters)]):
        raise _RowError(
            f"options are lettered {''.join(letters)}, "
            f"expected {CHOICE_LETTERS[: len(letters)]} in order ({_AQUA_HINT})"
        )
    c = _need_str(row, "correct", _AQUA_HINT).strip().upper()
    if c not in letters:
        raise _RowError(
            f"field 'correct' is {row['correct']!r}, not one of the options {''.join(letters)} ({_AQUA_HINT})"
        )
    # The SWIFT paper's preprocessing: the question, a newline, the options joined by spaces.
    question = q + "\n" + " ".join(opts)
    extra = {"options": opts}
    if "rationale" in row:
        extra["rationale"] = row["rationale"]
    return question, c, "choice", extra


_GENERIC_HINT = "a generic row is {\"prompt\": ..., \"answer\": ...} with optional \"id\", \"kind\", \"dataset\""
_GENERIC_KNOWN = {"prompt", "question", "answer", "id", "kind", "dataset"}


def _generic(row: dict) -> tuple[str, Any, str | None, dict]:
    key = "prompt" if "prompt" in row else "question"
    q = _need_str(row, key, _GENERIC_HINT)
    if "answer" not in row or row["answer"] is None:
        raise _RowError(f"missing field 'answer' ({_GENERIC_HINT})")
    a = row["answer"]
    if isinstance(a, str):
        if not a.strip():
            raise _RowError(f"field 'answer' is empty ({_GENERIC_HINT})")
        a = a.strip()
    kind = row.get("kind")
    if kind is not None and kind not in KINDS:
        raise _RowError(f"field 'kind' is {kind!r}; expected one of {', '.join(KINDS)}")
    return q, a, kind, {k: v for k, v in row.items() if k not in _GENERIC_KNOWN}


_PARSERS: dict[str, Callable[[dict], tuple]] = {
    "gsm8k": _gsm8k,
    "math500": _math500,
    "aqua": _aqua,
    "generic": _generic,
}


def detect_format(row: dict) -> str | None:
    """The format a row's fields match, or None."""
    if "options" in row and "correct" in row and "question" in row:
        return "aqua"
    if "problem" in row and "answer" in row:
        return "math500"
    if "question" in row and isinstance(row.get("answer"), str) and "####" in row["answer"]:
        return "gsm8k"
    if ("prompt" in row or "question" in row) and "answer" in row:
        return "generic"
    return None


def resolve_path(path_or_name: str | os.PathLike) -> str:
    """A JSONL path from a path, a folder holding ``test.jsonl``, or a name.

    Names are ``gsm8k``, ``math500``, ``aqua`` (``aqua:dev`` for another split) and are looked
    up as ``<root>/<name>/<split>.jsonl`` under ``$SWIFT_FAST_DATA``.
    """
    p = os.fspath(path_or_name)
    if os.path.isfile(p):
        return p
    if os.path.isdir(p):
        cand = os.path.join(p, "test.jsonl")
        if os.path.isfile(cand):
            return cand
        raise DataError(f"{p} is a folder without test.jsonl; pass the JSONL file itself")
    name, _, split = p.partition(":")
    if re.fullmatch(r"[A-Za-z0-9_\-]+", name) and not p.endswith(".jsonl"):
        root = os.environ.get(DATA_ENV)
        if not root:
            raise DataError(
                f"no file {p!r}; to load a benchmark by name, set {DATA_ENV} to a folder holding "
                f"<name>/<split>.jsonl (e.g. {DATA_ENV}=../shared/data), or pass the file's path"
            )
        cand = os.path.join(root, name, f"{split or 'test'}.jsonl")
        if os.path.isfile(cand):
            return cand
        raise DataError(f"no file {cand} for dataset {p!r} (looked under {DATA_ENV}={root})")
    raise DataError(f"no data file at {p}")


def load_dataset(
    path_or_name: str | os.PathLike,
    kind: str | None = None,
    limit: int | None = None,
    skip_bad: bool = False,
    stats: dict | None = None,
    format: str | None = None,
    name: str | None = None,
) -> list[Example]:
    """Examples of a benchmark file (see the module docstring for formats and names).

    ``kind`` overrides the grading kind of every example; ``limit`` keeps the first ``limit``
    examples; ``format`` skips detection; ``name`` sets the dataset name (default: the format,
    or for generic files the row's ``dataset`` field, else the file's folder or stem).
    ``stats`` (a dict) receives "loaded", "skipped" and "errors".
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    path = resolve_path(path_or_name)
    stem = os.path.splitext(os.path.basename(path))[0]
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))

    out: list[Example] = []
    st: dict = {} if stats is None else stats
    skipped_before = st.get("skipped", 0)
    fmt = format
    seen_ids: set[str] = set()

    def parse(row: dict, where: str, lineno: int) -> Example:
        nonlocal fmt
        if fmt is None:
            fmt = detect_format(row)
            if fmt is None:
                raise DataError(
                    f"{where}: cannot tell the format from the fields {sorted(row)}; expected GSM8K "
                    "(question, answer with '#### N'), MATH-500 (problem, answer), AQuA (question, options, "
                    "correct) or generic (prompt, answer); or pass format="
                )
        try:
            question, reference, row_kind, extra = _PARSERS[fmt](row)
        except _RowError as e:
            raise DataError(f"{where}: {e}") from None
        ds = name or (row.get("dataset") if fmt == "generic" and isinstance(row.get("dataset"), str) else None)
        ds = ds or (fmt if fmt != "generic" else (folder if stem == "test" else stem))
        if fmt == "generic":
            prefix = name or (folder if stem == "test" else stem)
        else:
            prefix = ds if stem in ("test", ds) else f"{ds}-{stem}"
        if fmt == "generic" and row.get("id") is not None:
            ex_id = str(row["id"])
        else:
            ex_id = f"{prefix}/{lineno - 1}"
        if ex_id in seen_ids:
            raise DataError(f"{where}: duplicate id {ex_id!r}; ids must be unique within a file")
        seen_ids.add(ex_id)
        return Example(
            id=ex_id, question=question, reference=reference, kind=kind or row_kind or "math", dataset=ds, extra=extra
        )

    if limit != 0:
        for ex in read_jsonl(path, parse, skip_bad=skip_bad, stats=st):
            out.append(ex)
            if limit is not None and len(out) >= limit:
                break
    skipped = st.get("skipped", 0) - skipped_before
    if not out and limit != 0:
        raise DataError(f"{path}: no usable examples" + (f" ({skipped} malformed rows skipped)" if skipped else ""))
    st["loaded"] = st.get("loaded", 0) + len(out)
    return out


def read_jsonl(
    path: str,
    parse: Callable[[dict, str, int], T],
    skip_bad: bool = False,
    stats: dict | None = None,
) -> Iterator[T]:
    """``parse(row, "file:line", lineno)`` for each JSON-object line of ``path``, in order.

    A line that is not a JSON object, or whose ``parse`` raises ``DataError``, stops the read
    with that error; with ``skip_bad`` it is skipped and counted in ``stats["skipped"]`` (the
    messages in ``stats["errors"]``). Blank lines are ignored.
    """
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(
                        f"{where}: invalid JSON ({e.msg} at column {e.colno}); each line must be one JSON object"
                    ) from None
                if not isinstance(row, dict):
                    raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
                yield parse(row, where, lineno)
            except DataError as e:
                if not skip_bad:
                    raise
                if stats is not None:
                    stats["skipped"] = stats.get("skipped", 0) + 1
                    stats.setdefault("errors", []).append(str(e))
