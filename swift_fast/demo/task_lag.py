"""A demo task: running sums imitated from a solver that loses its place at the first step.

A problem is a list of one-digit numbers (1 to 9). Its worked solution adds them left to right,
exactly as in the first task (``task.py``)::

    question   4+7+2+9+5
    solution   4+7=11;11+2=13;13+9=22;22+5=27#27

The training solutions come from a *lagging solver*: with a probability that grows with the
number of terms (``lag_rates``) it reads the first term twice, stays one term behind from then
on, and so writes as many steps as the correct solution but never adds the last term::

    lagging    4+4=8;8+7=15;15+2=17;17+9=26#26

The flaw shows at the first step's second operand (the third response token) and the candidate
goes on for every later step; its length is the correct one's (up to a digit where a running sum
crosses 10), its continuation is deterministic once the branch is drawn, and every lagging
candidate of a problem gives the same wrong total (the total minus the last term plus the first),
so majority vote is wrong where the lag rate exceeds one half. To stay one term behind and stop
after the right number of steps, the model has to carry a term pointer that is off by one: the
same count-like "where am I in the question" feature the first task's head reads.
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass

# the answer format, grading and problem text are the first task's
from .task import ANSWER_MARK, STEP_END, distinct_problems, extract_answer, is_correct, question, reference  # noqa: F401

NAME = "lag"
WHAT = (
    "swift-fast demo artefacts: a Llama trained from scratch on multi-term addition written as running "
    "sums by a solver that sometimes reads the first term twice and stays one term behind, and a SWIFT "
    "head trained on the model's own graded rollouts"
)


@dataclass(frozen=True)
class LagConfig:
    min_terms: int = 5
    max_terms: int = 8
    #: probability that a training solution lags, for min_terms..max_terms terms
    lag_rates: tuple = (0.2, 0.4, 0.6, 0.8)

    def __post_init__(self):
        if not 3 <= self.min_terms <= self.max_terms:
            raise ValueError(f"terms: need 3 <= min_terms <= max_terms, got {self.min_terms}..{self.max_terms}")
        if len(self.lag_rates) != self.max_terms - self.min_terms + 1:
            raise ValueError(f"lag_rates needs one entry per number of terms ({self.min_terms}..{self.max_terms})")
        if not all(0.0 <= r <= 1.0 for r in self.lag_rates):
            raise ValueError(f"lag_rates must be probabilities in [0, 1], got {self.lag_rates}")

    def lag_rate(self, n_terms: int) -> float:
        return self.lag_rates[n_terms - self.min_terms]

    def to_dict(self) -> dict:
        return asdict(self)


def sample_terms(rng: random.Random, cfg: LagConfig) -> list[int]:
    """One-digit terms; the second and the last differ from the first, so a lag shows at once and
    changes the total."""
    n = rng.randint(cfg.min_terms, cfg.max_terms)
    while True:
        out = [rng.randint(1, 9) for _ in range(n)]
        if out[1] != out[0] and out[-1] != out[0]:
            return out


def operands(terms: list[int], lag: bool = False) -> list[int]:
    return [terms[0]] + terms[:-1] if lag else list(terms)


def solution(terms: list[int], lag: bool = False) -> str:
    if len(terms) < 2:
        raise ValueError(f"a problem has at least two terms, got {terms}")
    ops = operands(terms, lag)
    acc = ops[0]
    steps = []
    for t in ops[1:]:
        steps.append(f"{acc}+{t}={acc + t}")
        acc += t
    return STEP_END.join(steps) + f"{ANSWER_MARK}{acc}"


def training_solution(terms: list[int], cfg: LagConfig, rng: random.Random) -> str:
    return solution(terms, lag=rng.random() < cfg.lag_rate(len(terms)))


def lagged(text: str, terms: list[int]) -> bool:
    """The response's first step adds the first term to itself (the solver's flaw)."""
    m = re.match(r"(\d+)\+(\d+)=", text)
    return bool(m) and int(m.group(1)) == terms[0] and int(m.group(2)) == terms[0]


def make_split(n: int, cfg: LagConfig, seed: int, exclude: set[str] | None = None) -> list[list[int]]:
    """``n`` distinct problems (by question text), none of them in ``exclude``."""
    return distinct_problems(lambda rng: sample_terms(rng, cfg), n, seed, exclude)
