"""Rollout files: JSONL, one problem per line, shared by ``collect``, ``score``, ``train``,
``bon``, ``eval`` and the demo.

A line::

    {"id": "gsm8k/17", "question": "...", "reference": "42", "kind": "math",
     "prompt": "<rendered prompt text>", "prompt_token_ids": [1, 2, ...],
     "candidates": [{"token_ids": [...], "text": "...", "answer": "42", "correct": true,
                     "finish_reason": "stop", "swift_score": 0.7, "sar": 0.1}, ...]}

Score columns (``swift_score``, ``sar``, an external reward...) live on the candidates under any
name; ``eval`` and ``bon`` are told which to use. The head-free values go under the names of the
vLLM plugin's outputs, as ``bon`` and ``score`` without a head write them: ``mean_logprob``,
``confidence_lowest_group``, ``confidence_tail``, ``confidence_bottom10`` (DeepConf's, over the
engine's window) and ``num_tokens``; older files carry ``conf_lowest`` and ``conf_tail``
(``swift_fast.reports.candidates`` reads both). ``token_ids`` are the
response as generated (end-of-turn token included when it was generated); parity between
paths is defined on them, never on re-tokenised text. Lines that ``collect`` and ``bon`` write
start with ``run_id``, the id of the run's record (``swift_fast.jobs.run_record``): a resume
checks it before it appends.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from .datasets import DataError, read_jsonl


@dataclass
class Problem:
    id: str
    candidates: list[dict]
    question: str = ""
    reference: Any = None
    kind: str = "math"
    prompt: str = ""
    prompt_token_ids: list[int] | None = None
    extra: dict = field(default_factory=dict)
    #: "file:line" the problem was read from (not written back), for error messages.
    where: str = field(default="", compare=False)

    def to_json(self) -> dict:
        d = {
            "id": self.id,
            "question": self.question,
            "reference": self.reference,
            "kind": self.kind,
            "prompt": self.prompt,
            "prompt_token_ids": self.prompt_token_ids,
            "candidates": self.candidates,
        }
        d.update(self.extra)
        return d

    @classmethod
    def from_json(cls, d: dict, where: str) -> "Problem":
        if not isinstance(d, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(d).__name__}")
        if "id" not in d:
            raise DataError(f"{where}: missing field 'id'")
        cands = d.get("candidates")
        if not isinstance(cands, list):
            raise DataError(f"{where}: missing list field 'candidates'")
        for i, c in enumerate(cands):
            if not isinstance(c, dict):
                raise DataError(f"{where}: candidate {i} is not a JSON object")
        known = {"id", "question", "reference", "kind", "prompt", "prompt_token_ids", "candidates"}
        return cls(
            id=str(d["id"]),
            candidates=cands,
            question=d.get("question", ""),
            reference=d.get("reference"),
            kind=d.get("kind", "math"),
            prompt=d.get("prompt", ""),
            prompt_token_ids=d.get("prompt_token_ids"),
            extra={k: v for k, v in d.items() if k not in known},
            where=where,
        )


def iter_rollouts(path: str | os.PathLike, skip_bad: bool = False, stats: dict | None = None) -> Iterator[Problem]:
    """Problems of a rollout file in order.

    A malformed line raises ``DataError`` naming file and line; with ``skip_bad`` it is skipped
    and counted in ``stats["skipped"]`` (with the reasons in ``stats["errors"]``).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DataError(f"no rollout file at {path}")
    yield from read_jsonl(path, lambda row, where, _: Problem.from_json(row, where), skip_bad=skip_bad, stats=stats)


def read_rollouts(path: str | os.PathLike, skip_bad: bool = False, stats: dict | None = None) -> list[Problem]:
    return list(iter_rollouts(path, skip_bad=skip_bad, stats=stats))


def _clean(x):
    # JSON has no NaN: a score that is not a number is written as null.
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


class RolloutWriter:
    """Appends problems to a rollout file, one flushed line each, so an interrupted run keeps
    every finished problem and can resume (``done_ids``). ``run_id``: written first on every line
    (the run's record, ``swift_fast.jobs.run_record``), so that lines of two runs never mix
    unnoticed; None keeps whatever ``run_id`` a problem carries."""

    def __init__(self, path: str | os.PathLike, resume: bool = True, run_id: str | None = None):
        self.path = os.fspath(path)
        self.run_id = run_id
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self.done = done_ids(self.path) if resume and os.path.exists(self.path) else set()
        if not resume and os.path.exists(self.path):
            os.remove(self.path)
        _truncate_partial_last_line(self.path)
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, problem: Problem | dict) -> None:
        d = problem.to_json() if isinstance(problem, Problem) else problem
        if self.run_id is not None:
            d = {"run_id": self.run_id, **{k: v for k, v in d.items() if k != "run_id"}}
        self._f.write(json.dumps(_clean(d), ensure_ascii=False) + "\n")
        self._f.flush()
        self.done.add(str(d["id"]))

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def done_ids(path: str | os.PathLike) -> set[str]:
    """Ids of the complete lines of a rollout file (a torn last line does not count)."""
    out = set()
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                out.add(str(json.loads(line)["id"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return out


def run_ids(path: str | os.PathLike) -> dict[str | None, int]:
    """The ``run_id`` of the complete lines of a rollout file, each with the number of the line
    it first appears on, in file order; None stands for lines without one (written before run
    records, or by a call that records none). Empty when there is no file or no complete line."""
    out: dict[str | None, int] = {}
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.endswith("\n"):
                break  # a torn last line: the writer truncates it when it resumes
            end = line.find('"', len(_RUN_ID_FIRST)) if line.startswith(_RUN_ID_FIRST) else -1
            if end > 0:  # the writer puts it first: no need to parse a long line
                out.setdefault(line[len(_RUN_ID_FIRST) : end], i)
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(d, dict) and "id" in d:
                out.setdefault(d.get("run_id"), i)
    return out


_RUN_ID_FIRST = '{"run_id": "'


def _truncate_partial_last_line(path: str) -> None:
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def write_rollouts(path: str | os.PathLike, problems: Iterable[Problem | dict]) -> None:
    with RolloutWriter(path, resume=False) as w:
        for p in problems:
            w.write(p)
