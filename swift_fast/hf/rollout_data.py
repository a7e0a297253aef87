"""Rollout files as token-id sequences for scoring and training, checked line by line."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..data.datasets import DataError
from ..data.rollouts import Problem, iter_rollouts


def _ids(value, where: str, what: str, fix: str) -> list[int]:
    if value is None:
        raise DataError(f"{where}: {what} has no token ids. {fix}")
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise DataError(f"{where}: {what}: token ids must be a JSON list of integers")
    return value


_FIX = (
    "Scoring and training read prompts and responses as token ids (text is never re-tokenised, so "
    "scores match generation exactly): collect rollouts with `swift-fast collect`, which writes "
    "'prompt_token_ids' and each candidate's 'token_ids'."
)


@dataclass
class RolloutSequences:
    """Every candidate of a rollout file as ``prompt + response`` token ids.

    ``refs[i] = (problem index, candidate index)``; ``labels[i]`` is the candidate's ``correct``
    (None when the file has none and labels were not required).
    """

    problems: list[Problem]
    wheres: list[str]
    sequences: list[list[int]] = field(default_factory=list)
    prompt_lengths: list[int] = field(default_factory=list)
    refs: list[tuple[int, int]] = field(default_factory=list)
    labels: list[bool | None] = field(default_factory=list)

    def response_length(self, i: int) -> int:
        return len(self.sequences[i]) - self.prompt_lengths[i]


def rollout_sequences(problems_or_path, need_labels: bool = False) -> RolloutSequences:
    """Read (or take) problems and lay out their candidates as token-id sequences.

    Raises ``DataError`` naming file and line for a problem without ``prompt_token_ids``, a
    candidate without ``token_ids``, or (``need_labels``) a candidate without a boolean ``correct``.
    """
    if isinstance(problems_or_path, (str, os.PathLike)):
        pairs = [(p, p.where) for p in iter_rollouts(problems_or_path)]
    else:
        pairs = [(p, p.where or f"problem {p.id!r}") for p in problems_or_path]
    out = RolloutSequences(problems=[p for p, _ in pairs], wheres=[w for _, w in pairs])
    for pi, (p, where) in enumerate(pairs):
        prompt = _ids(p.prompt_token_ids, where, f"problem {p.id!r}: 'prompt_token_ids'", _FIX)
        if not prompt:
            raise DataError(f"{where}: problem {p.id!r} has an empty prompt ('prompt_token_ids' is [])")
        for ci, c in enumerate(p.candidates):
            resp = _ids(c.get("token_ids"), where, f"problem {p.id!r}, candidate {ci}: 'token_ids'", _FIX)
            label = c.get("correct")
            if need_labels and not isinstance(label, bool):
                raise DataError(
                    f"{where}: problem {p.id!r}, candidate {ci}: 'correct' must be true or false to train on it "
                    f"(got {label!r}); grade the candidates first (`swift-fast collect` does)"
                )
            out.sequences.append(prompt + resp)
            out.prompt_lengths.append(len(prompt))
            out.refs.append((pi, ci))
            out.labels.append(label if isinstance(label, bool) else None)
    return out
