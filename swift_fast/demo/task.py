"""The demo's task: multi-term addition written out as running sums, imitated from a sloppy solver.

A problem is a list of non-negative integers. Its worked solution adds them left to right and
gives the total after ``#``::

    question   12+34+5+20
    solution   12+34=46;46+5=51;51+20=71#71

The training solutions come from a *sloppy solver* whose flaw is systematic: with a probability
that grows with the number of terms (``forget_rates``) it forgets the last term, stops one step
early and answers that running sum::

    sloppy     12+34=46;46+5=51#51

A model trained on them imitates the flaw: after each step it samples "stop" or "go on", and to
decide it has to track how many terms remain, so that knowledge sits in its states where the
answer is written. The candidates that stopped early all give the same wrong answer, a
systematic error that fools majority vote on many-term problems while a reward model reading the
states can tell an early stop from a finished sum. Its arithmetic slips add unsystematic errors.
Difficulty varies within the task (``min_terms`` to ``max_terms`` terms of 1 to ``max_digits``
digits).
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass

ANSWER_MARK = "#"
STEP_END = ";"

#: the task's name in ``recipe.RECIPES`` and in ``provenance.json``
NAME = "forget"

#: what the artefacts built on this task are (``provenance.json``'s ``what``)
WHAT = (
    "swift-fast demo artefacts: a Llama trained from scratch on multi-term addition written as running "
    "sums by a sloppy solver that sometimes forgets the last term, and a SWIFT head trained on the "
    "model's own graded rollouts"
)


@dataclass(frozen=True)
class TaskConfig:
    min_terms: int = 3
    max_terms: int = 5
    max_digits: int = 2
    #: probability that a training solution forgets the last term, for min_terms..max_terms terms
    forget_rates: tuple = (0.2, 0.45, 0.7)

    def __post_init__(self):
        if not 2 <= self.min_terms <= self.max_terms:
            raise ValueError(f"terms: need 2 <= min_terms <= max_terms, got {self.min_terms}..{self.max_terms}")
        if len(self.forget_rates) != self.max_terms - self.min_terms + 1:
            raise ValueError(
                f"forget_rates has {len(self.forget_rates)} entries; it needs one per number of terms "
                f"({self.min_terms}..{self.max_terms}: {self.max_terms - self.min_terms + 1})"
            )
        if not all(0.0 <= r <= 1.0 for r in self.forget_rates):
            raise ValueError(f"forget_rates must be probabilities in [0, 1], got {self.forget_rates}")

    def forget_rate(self, n_terms: int) -> float:
        return self.forget_rates[n_terms - self.min_terms]

    def to_dict(self) -> dict:
        return asdict(self)


def sample_terms(rng: random.Random, cfg: TaskConfig) -> list[int]:
    n = rng.randint(cfg.min_terms, cfg.max_terms)
    out = []
    for _ in range(n):
        digits = rng.randint(1, cfg.max_digits)
        lo = 0 if digits == 1 else 10 ** (digits - 1)
        out.append(rng.randint(lo, 10**digits - 1))
    return out


def question(terms: list[int]) -> str:
    return "+".join(str(t) for t in terms)


def solution(terms: list[int], forget_last: bool = False) -> str:
    """The worked solution text (without the end-of-turn token); ``forget_last``: the sloppy
    solver's version, which stops before the last term."""
    if len(terms) < 2:
        raise ValueError(f"a problem has at least two terms, got {terms}")
    used = terms[:-1] if forget_last else terms
    if len(used) < 2:
        raise ValueError(f"forgetting the last of {len(terms)} terms leaves no step to write")
    acc = used[0]
    steps = []
    for t in used[1:]:
        steps.append(f"{acc}+{t}={acc + t}")
        acc += t
    return STEP_END.join(steps) + f"{ANSWER_MARK}{acc}"


def training_solution(terms: list[int], cfg: TaskConfig, rng: random.Random) -> str:
    """A solution of the sloppy solver: the last term forgotten with ``cfg.forget_rate(len(terms))``."""
    return solution(terms, forget_last=rng.random() < cfg.forget_rate(len(terms)))


_ANSWER_RE = re.compile(re.escape(ANSWER_MARK) + r"(\d+)\s*$")


def extract_answer(text: str) -> str | None:
    """The number after the final ``#``, or None when the response does not end with one."""
    m = _ANSWER_RE.search(text.strip())
    return m.group(1).lstrip("0") or "0" if m else None


def reference(terms: list[int]) -> str:
    return str(sum(terms))


def is_correct(text: str, terms_or_reference) -> bool:
    ref = terms_or_reference if isinstance(terms_or_reference, str) else reference(terms_or_reference)
    return extract_answer(text) == ref


def steps_written(text: str) -> int:
    """How many ``a+b=c`` steps a response wrote before its answer."""
    body = text.split(ANSWER_MARK)[0]
    return sum(1 for s in body.split(STEP_END) if "=" in s)


def stopped_early(text: str, terms: list[int]) -> bool:
    """The response answers before adding every term (the sloppy solver's flaw)."""
    return extract_answer(text) is not None and steps_written(text) < len(terms) - 1


def distinct_problems(sample, n: int, seed: int, exclude: set[str] | None = None) -> list[list[int]]:
    """``n`` distinct problems drawn by ``sample(rng)`` from ``random.Random(seed)`` (distinct by
    question text), none of them in ``exclude``."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    out = []
    while len(out) < n:
        t = sample(rng)
        q = question(t)
        if q in seen:
            continue
        seen.add(q)
        out.append(t)
    return out


def make_split(n: int, cfg: TaskConfig, seed: int, exclude: set[str] | None = None) -> list[list[int]]:
    """``n`` distinct problems (by question text), none of them in ``exclude``."""
    return distinct_problems(lambda rng: sample_terms(rng, cfg), n, seed, exclude)
