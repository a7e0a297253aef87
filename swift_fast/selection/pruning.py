"""Pruning Best-of-N candidates while they are generated: the settings, the one policy every
signal goes through, and a replay of that policy on finished candidates.

Why. Best-of-N pays for N full generations, yet a group's weakest candidates are often ranked
last long before they finish. Stopping them frees their KV cache and compute for the rest. The
vLLM plugin (``swift_fast.vllm_plugin.pruning``) applies this policy inside the engine; the
replay (:func:`replay`) applies the same code to finished candidates' per-token signals, which is
how a sweep of settings is measured without one engine run per setting.

Signals (higher is better):

``swift``
    the candidate's running SWIFT score: the head's gated mean over the tokens generated so far
    (DESIGN 2, the same sums as the final score, which it becomes when the candidate finishes).
``confidence``
    DeepConf's lowest group confidence so far (:mod:`swift_fast.rewards.confidence`): the minimum over
    sliding windows of ``window`` tokens of the mean top-20 token confidence; the baseline.
``combined``
    both, by the SWIFT paper's rank combination: each candidate's rank under either signal (0
    best), the larger of the two ranks it, lowest first.

Policy. A group is the candidates of one request (``n > 1`` or a server ``best_of_n``). Its
*running* candidates are those neither finished nor pruned. Decision ``d`` (0, 1, 2, ...) is
taken once every running candidate has generated ``warmup + d * every`` tokens (one decision
only when ``every`` is 0): the running candidates are ranked by the signal (stable: ties keep
the lower index; NaN ranks last) and the first ``max(ceil(keep * running), min_keep -
others)`` stay, ``others`` being the group's finished candidates; the rest are pruned. Finished
candidates are never pruned and do not take part in the ranking (they cost nothing more). In an
engine the candidates of a group advance in lock step, so a decision falls on the step where they
reach the threshold. A candidate the scheduler has not started yet (no room in the KV cache) is
neither ranked nor pruned and counts among ``others``: it must not hold back the decision that
frees room for it. One that started late or was preempted delays its group's decisions until it
catches up.

Choices, where the literature leaves room: one rank-based policy for both signals (DeepConf
stops a trace when its window confidence falls below a threshold set on warm-up traces; a
per-group rank makes the two signals comparable at equal token budgets, needs no warm-up
traces, and cannot stop a whole group); ``min_keep`` counts finished candidates, so a group that
already has enough answers can prune all its stragglers down to the one that ``ceil`` keeps.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from ..definitions import GATE_EPS
from .settings import parse_settings, settings_text

SIGNALS = ("swift", "confidence", "combined")
#: settings of a :class:`PruneConfig`, in the order ``--help`` and error messages list them
FIELDS = ("signal", "warmup", "every", "keep", "min_keep", "window")


class PruneConfigError(ValueError):
    """A pruning setting out of range or unknown; the message names the field."""


@dataclass(frozen=True)
class PruneConfig:
    """How a group's candidates are pruned (see the module docstring for the policy).

    ``signal``: ``"swift"``, ``"confidence"`` or ``"combined"``; ``warmup``: tokens every running candidate has
    generated before the first decision (>= 1); ``every``: tokens between decisions (0: one
    decision); ``keep``: fraction of the running candidates kept at each decision, in (0, 1];
    ``min_keep``: fewest unpruned candidates a group keeps (>= 1); ``window``: tokens per
    confidence group (signals ``confidence`` and ``combined``).
    """

    signal: str = "swift"
    warmup: int = 16
    every: int = 16
    keep: float = 0.5
    min_keep: int = 2
    window: int = 16

    def __post_init__(self):
        _check(self)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def parse(cls, given: Any, where: str = "prune", base: "PruneConfig | None" = None) -> "PruneConfig | None":
        """A config from ``given``: a mapping of some of :data:`FIELDS` (the rest from ``base``, else
        the defaults), ``True`` (``base`` or the defaults), or ``False``/``None`` (no pruning: None).
        ``where`` names the setting in error messages (e.g. ``extra_args["swift_fast"]["prune"]``)."""
        return parse_settings(cls, given, where, base, FIELDS, _coerce, PruneConfigError,
                              '{"signal": "swift", "keep": 0.5}')


def parse_text(text: str | None, where: str = "--prune") -> PruneConfig:
    """Settings from a command line: JSON (``'{"keep": 0.5}'``) or ``key=value`` pairs separated
    by commas (``signal=swift,keep=0.5``); empty: the defaults."""
    return PruneConfig.parse(settings_text(text, where, PruneConfigError, "signal=swift,keep=0.5"), where=where)


def _coerce(key: str, v: Any, where: str) -> Any:
    # flat request keys arrive as strings ("0.5"); JSON bodies as numbers
    if key == "signal":
        return v
    if isinstance(v, bool):
        raise PruneConfigError(f"{where}.{key} must be a number, got {v!r}")
    if isinstance(v, str):
        try:
            v = float(v) if key == "keep" else int(v)
        except ValueError:
            raise PruneConfigError(f"{where}.{key} must be a number, got {v!r}") from None
    if key != "keep" and isinstance(v, float):
        if not v.is_integer():
            raise PruneConfigError(f"{where}.{key} must be a whole number of tokens, got {v!r}")
        v = int(v)
    return v


def _check(c: PruneConfig) -> None:
    if c.signal not in SIGNALS:
        raise PruneConfigError(f"signal must be one of {list(SIGNALS)}, got {c.signal!r}")
    for key, lo in (("warmup", 1), ("every", 0), ("min_keep", 1), ("window", 1)):
        v = getattr(c, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise PruneConfigError(f"{key} must be a whole number >= {lo}, got {v!r}")
    k = c.keep
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not (0.0 < k <= 1.0) or math.isnan(k):
        raise PruneConfigError(f"keep is the fraction of running candidates kept, in (0, 1]; got {k!r}")


def threshold(cfg: PruneConfig, decision: int) -> int | None:
    """Tokens every running candidate must have generated before decision ``decision`` (0-based);
    None when there is no such decision (``every`` = 0 after the first)."""
    if decision > 0 and cfg.every == 0:
        return None
    return cfg.warmup + decision * cfg.every


def _ranks(values: Sequence[float]) -> list[int]:
    """Rank of each value, 0 the highest (NaN ranks last; ties: the lower index first)."""
    key = [(-math.inf if v is None or math.isnan(v) else float(v)) for v in values]
    order = sorted(range(len(key)), key=lambda i: (-key[i], i))
    r = [0] * len(key)
    for pos, i in enumerate(order):
        r[i] = pos
    return r


def to_prune(values: Sequence, cfg: PruneConfig, others: int = 0) -> list[int]:
    """Positions in ``values`` (the ranked candidates' signals, in candidate order; for
    ``combined``, ``(swift, confidence)`` pairs) that a decision prunes; ``others``: the group's
    unpruned candidates outside the ranking (finished, or not started)."""
    m = len(values)
    if m == 0:
        return []
    kept = max(math.ceil(cfg.keep * m - 1e-9), cfg.min_keep - others)
    if kept >= m:
        return []
    if cfg.signal == "combined":
        ra, rb = _ranks([v[0] for v in values]), _ranks([v[1] for v in values])
        rank = [max(a, b) for a, b in zip(ra, rb)]
    else:
        rank = _ranks(values)
    order = sorted(range(m), key=lambda i: (rank[i], i))  # best first, ties: lower index
    return sorted(order[kept:])


def running_swift(gate_reward: Sequence[float], gate: Sequence[float], eps: float = GATE_EPS) -> list[float]:
    """The running SWIFT score after each token, from per-token ``g_t r_t`` and ``g_t`` (a traced
    request's ``swift_trace``): ``sum_{s<=t} g_s r_s / max(sum_{s<=t} g_s, eps)`` in float64, the
    sums the plugin keeps."""
    out, w, g = [], 0.0, 0.0
    for wi, gi in zip(gate_reward, gate):
        w += float(wi)
        g += float(gi)
        out.append(w / max(g, eps))
    return out


def running_confidence(conf: Sequence[float], window: int) -> list[float]:
    """The lowest group confidence after each token (:class:`swift_fast.rewards.confidence.RunningConfidence`)."""
    from ..rewards.confidence import RunningConfidence

    r = RunningConfidence(window)
    out = []
    for c in conf:
        r.push(c)
        out.append(r.value())
    return out


@dataclass
class Replay:
    """The policy replayed on one group: ``pruned[i]`` and the tokens candidate ``i`` generated
    (its full length, or the decision threshold at which it was pruned)."""

    pruned: list[bool]
    tokens: list[int]


def signal_lag(cfg: PruneConfig, alignment: str = "predicting") -> int:
    """Tokens a candidate has generated past ``t`` when its signal over ``t`` tokens is known: 1 for
    the SWIFT score of an ``emitted`` head (a token's states come with the next token) in the
    ``swift`` and ``combined`` signals, else 0."""
    from ..rewards.head import ALIGNMENT

    return int(ALIGNMENT[alignment].extra_forward and cfg.signal != "confidence")


def replay(signals: Sequence[Sequence[float]], cfg: PruneConfig, lag: int = 0) -> Replay:
    """Apply the policy to one group of finished candidates, as an engine advancing them in lock
    step would: ``signals[i][t]`` is candidate ``i``'s signal after ``t + 1`` tokens (its length is
    the candidate's length). ``lag`` (:func:`signal_lag`): the decision at ``t`` is taken once the
    candidates have ``t + lag`` tokens, so one with ``t + lag`` or fewer has finished by then, and a
    pruned one has generated ``t + lag``. Used to sweep settings over rollouts generated without
    pruning; the plugin runs the same :func:`to_prune` on the same running values."""
    lengths = [len(s) for s in signals]
    pruned = [False] * len(signals)
    tokens = list(lengths)
    d = 0
    while True:
        t = threshold(cfg, d)
        if t is None:
            break
        running = [i for i, n in enumerate(lengths) if n > t + lag and not pruned[i]]
        if not running:
            break
        finished = sum(1 for i, n in enumerate(lengths) if n <= t + lag and not pruned[i])
        for j in to_prune([signals[i][t - 1] for i in running], cfg, finished):
            pruned[running[j]] = True
            tokens[running[j]] = t + lag
        d += 1
    return Replay(pruned, tokens)
