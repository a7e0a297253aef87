"""The demo's task: multi-term addition written out step by step, then checked.

A problem is a list of non-negative integers. Its worked solution adds them left to right
(running sums), then checks the total by adding them again right to left, states whether the
two totals agree (``ok`` / ``no``) and gives the forward total after ``#``::

    question   47+8+315
    solution   47+8=55;55+315=370;check;315+8=323;323+47=370;ok#370

Training solutions include *flawed* ones (``flaw_rate``): one forward step's result is
perturbed as a slip would perturb it, the following steps carry the wrong value on, the check
(done right) disagrees and the verdict is ``no``; the answer is still the forward total. A
model trained on them learns to check its work, so its own slips show up in its states at the
check, where a SWIFT head can read them. Difficulty varies within the task (2 to
``max_terms`` terms of 1 to ``max_digits`` digits).
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass

ANSWER_MARK = "#"
CHECK_WORD = "check"
VERSUS = "vs"
VERDICT_OK = "ok"
VERDICT_NO = "no"


@dataclass(frozen=True)
class TaskConfig:
    min_terms: int = 2
    max_terms: int = 4
    max_digits: int = 3
    #: fraction of training solutions with one slipped forward step (and verdict ``no``)
    flaw_rate: float = 0.25
    #: write the check pass and verdict (False: forward sums and answer only)
    check: bool = True

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


def _slip(value: int, rng: random.Random) -> int:
    """A plausible wrong result: one digit off by one or two, or a dropped/extra carry."""
    s = str(value)
    while True:
        pos = rng.randrange(len(s))
        delta = rng.choice((-2, -1, 1, 2)) * 10 ** (len(s) - 1 - pos)
        new = value + delta
        if new >= 0 and new != value:
            return new


def _chain(terms: list[int], slip_at: int | None, rng: random.Random) -> tuple[list[str], int]:
    acc = terms[0]
    steps = []
    for i, t in enumerate(terms[1:]):
        res = acc + t
        if i == slip_at:
            res = _slip(res, rng)
        steps.append(f"{acc}+{t}={res};")
        acc = res
    return steps, acc


def solution(terms: list[int], cfg: TaskConfig, rng: random.Random | None = None, flawed: bool = False) -> str:
    """The worked solution text (without the end-of-turn token)."""
    if flawed and rng is None:
        raise ValueError("a flawed solution needs a random generator")
    slip_at = rng.randrange(len(terms) - 1) if flawed else None
    fwd, total = _chain(terms, slip_at, rng)
    text = "".join(fwd)
    if cfg.check:
        back, check_total = _chain(terms[::-1], None, rng)
        verdict = VERDICT_OK if check_total == total else VERDICT_NO
        # both totals side by side, so the verdict compares neighbouring digits
        text += f"{CHECK_WORD};" + "".join(back) + f"{total}{VERSUS}{check_total};" + verdict
    return text + f"{ANSWER_MARK}{total}"


def training_solution(terms: list[int], cfg: TaskConfig, rng: random.Random) -> str:
    flawed = cfg.check and cfg.flaw_rate > 0 and rng.random() < cfg.flaw_rate
    return solution(terms, cfg, rng, flawed=flawed)


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


def verdict(text: str) -> str | None:
    """``ok`` / ``no`` as written by the solution, None when it has no verdict."""
    m = re.search(r"(ok|no)" + re.escape(ANSWER_MARK), text)
    return m.group(1) if m else None


def make_split(n: int, cfg: TaskConfig, seed: int, exclude: set[str] | None = None) -> list[list[int]]:
    """``n`` distinct problems (by question text), none of them in ``exclude``."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    out = []
    while len(out) < n:
        t = sample_terms(rng, cfg)
        q = question(t)
        if q in seen:
            continue
        seen.add(q)
        out.append(t)
    return out
