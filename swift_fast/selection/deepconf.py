"""DeepConf online ("Deep Think with Confidence", Fu et al. 2025, Algorithm 2): early stopping of a
group's candidates against a threshold set by its own warmup candidates, and the group's stop on
consensus. The settings, the policy as a small state machine that the vLLM plugin drives
(``swift_fast.vllm_plugin.deepconf``), and its replay on finished candidates.

The policy, for the ``n`` candidates of one request (a group):

1. **Warmup.** Candidates ``0 .. warmup-1`` run to the end and are never stopped.
2. **Threshold.** Once every warmup candidate has finished, the threshold ``s`` is the
   ``percentile`` of their final signals (``numpy.percentile``, linear): DeepConf-low keeps the top
   10% (``percentile`` 90), DeepConf-high the top 90% (``percentile`` 10). The signal is the
   lowest group confidence (:mod:`swift_fast.rewards.confidence`, ``window`` tokens a group) or,
   with a SWIFT head, the SWIFT score (``signal="swift"``).
3. **Early stop.** A later candidate stops at the first token ``t`` where its signal falls below
   ``s``: for confidence, the mean of its last ``window`` token confidences, once it has
   ``window`` tokens (as DeepConf's own logits processor: a shorter candidate is never
   stopped); for SWIFT, its running score after at least ``window`` tokens. ``t`` is the
   candidate's *crossing*. A candidate that was already past its crossing when ``s`` became known
   (it ran beside the warmup) stops at once; its crossing is the same.
4. **Waves and consensus.** The later candidates start in waves of ``wave`` once the threshold
   is known (``wave`` 0: all of them at once, beside the warmup). At each *boundary* -- the
   warmup finished, then each wave done (every candidate of it finished or stopped) -- the
   confidence-weighted vote over the finished, unstopped candidates' answers is taken (weight:
   the candidate's signal, :func:`vote_weight`); when the leading answer holds at least
   ``consensus`` of the total weight (the paper's beta >= tau), every remaining candidate stops:
   the running ones at once, the unreleased ones before they start. Consensus needs answers (an
   answer extractor); ``consensus`` None turns it off.

Why boundaries. Taking the vote only there makes every decision a function of the candidates'
own values -- the threshold of the warmup's finals, each crossing of the candidate's own tokens,
each vote of the finished waves -- never of the order in which the candidates of one wave
happen to finish in an engine, so :func:`replay` reproduces an engine's decisions exactly from
the candidates' per-token values (a traced run's ``swift_trace``). With waves that is the whole
story, and a stopped candidate generated exactly its crossing's tokens. Without waves
(``wave`` 0) one fact is the engine's: which later candidates finished before the warmup did
(they are never stopped: they cost nothing more, and they vote at the warmup's boundary); the
plugin reports them, and the replay takes them. Without waves a candidate may also run past its
crossing while the warmup is still running: waves trade latency (one more round per wave) for
generation.

Defaults (where the paper leaves room): 4 warmup candidates (the paper's 16 are for budgets of
hundreds; Best-of-N asks for 4 to 64), ``percentile`` 10 (DeepConf-high, the conservative
setting: stop a candidate only below nearly all of the warmup; 90 is DeepConf-low), the
paper's 2048-token window and 0.95 consensus, no waves (the least latency); the warmup
candidates are the group's first; stopped candidates do not vote (as the paper's online
voting); a boundary with no answer at all takes no consensus.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Hashable, Sequence

from .settings import parse_settings, settings_text

SIGNALS = ("confidence", "swift")
#: settings of a :class:`DeepConfConfig`, in the order ``--help`` and error messages list them
FIELDS = ("warmup", "percentile", "window", "consensus", "wave", "signal")
#: stop reasons
THRESHOLD, CONSENSUS = "threshold", "consensus"


class DeepConfConfigError(ValueError):
    """A DeepConf setting out of range or unknown; the message names the field."""


@dataclass(frozen=True)
class DeepConfConfig:
    """DeepConf online's settings (module docstring).

    ``warmup``: candidates run to the end to set the threshold (>= 1; a request needs more
    candidates than this); ``percentile``: where the threshold sits among the warmup's signals,
    in [0, 100] (90: DeepConf-low, 10: DeepConf-high); ``window``: tokens per confidence group,
    and the fewest tokens before a candidate may stop; ``consensus``: the share of the vote at
    which a group stops, in (0, 1], or None (off); ``wave``: later candidates started at a time
    (0: all at once); ``signal``: ``"confidence"`` or ``"swift"`` (needs a head).
    """

    warmup: int = 4
    percentile: float = 10.0
    window: int = 2048
    consensus: float | None = 0.95
    wave: int = 0
    signal: str = "confidence"

    def __post_init__(self):
        _check(self)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def parse(cls, given: Any, where: str = "deepconf",
              base: "DeepConfConfig | None" = None) -> "DeepConfConfig | None":
        """A config from ``given``: a mapping of some of :data:`FIELDS` (the rest from ``base``, else the
        defaults), ``True`` (``base`` or the defaults), ``False``/``None`` (off: None). Flat request keys
        arrive as strings ("0.9"); they are read as numbers."""
        return parse_settings(cls, given, where, base, FIELDS, _coerce, DeepConfConfigError,
                              '{"warmup": 4, "percentile": 90}')


def parse_text(text: str | None, where: str = "--deepconf") -> DeepConfConfig:
    """Settings from a command line: JSON or ``key=value`` pairs (``warmup=4,percentile=90``);
    empty: the defaults."""
    return DeepConfConfig.parse(settings_text(text, where, DeepConfConfigError, "warmup=4,percentile=90"),
                                where=where)


def _coerce(key: str, v: Any, where: str) -> Any:
    if key == "signal":
        return v
    if key == "consensus" and (v is None or (isinstance(v, str) and v.strip().lower() in ("none", "null", "off"))):
        return None
    if isinstance(v, bool):
        raise DeepConfConfigError(f"{where}.{key} must be a number, got {v!r}")
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise DeepConfConfigError(f"{where}.{key} must be a number, got {v!r}") from None
    if key in ("warmup", "window", "wave") and isinstance(v, float):
        if not v.is_integer():
            raise DeepConfConfigError(f"{where}.{key} must be a whole number, got {v!r}")
        v = int(v)
    return v


def _check(c: DeepConfConfig) -> None:
    if c.signal not in SIGNALS:
        raise DeepConfConfigError(f"signal must be one of {list(SIGNALS)}, got {c.signal!r}")
    for key, lo in (("warmup", 1), ("window", 1), ("wave", 0)):
        v = getattr(c, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise DeepConfConfigError(f"{key} must be a whole number >= {lo}, got {v!r}")
    p = c.percentile
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 100.0:
        raise DeepConfConfigError(f"percentile is where the threshold sits among the warmup's signals, in [0, 100] "
                                  f"(90: DeepConf-low, 10: DeepConf-high); got {p!r}")
    t = c.consensus
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 < t <= 1.0):
        raise DeepConfConfigError(f"consensus is the vote share at which a group stops, in (0, 1], or null; got {t!r}")


def percentile(values: Sequence[float], q: float) -> float:
    """``numpy.percentile(values, q)`` (linear interpolation) over the finite values; NaN when none."""
    v = sorted(float(x) for x in values if x is not None and math.isfinite(float(x)))
    if not v:
        return math.nan
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def crossing(signal: Sequence[float], s: float, window: int, kind: str = "confidence") -> int | None:
    """The first token count ``t`` (1-based) at which a candidate's signal falls below ``s``: for
    ``kind`` confidence ``signal`` is its token confidences and the test is the mean of the last
    ``window`` (``t >= window``); for swift ``signal[t - 1]`` is its running score after ``t``
    tokens (``t >= window``). None when it never does (or ``s`` is NaN)."""
    if s is None or math.isnan(s):
        return None
    if kind == "swift":
        for t in range(window, len(signal) + 1):
            if signal[t - 1] < s:
                return t
        return None
    c = [float(x) for x in signal]
    if len(c) < window:
        return None
    run = math.fsum(c[:window])
    if run / window < s:
        return window
    for t in range(window, len(c)):
        run += c[t] - c[t - window]
        if t % window == 0:
            run = math.fsum(c[t - window + 1 : t + 1])  # no drift on long sequences
        if run / window < s:
            return t + 1
    return None


def final_signal(signal: Sequence[float], window: int, kind: str = "confidence") -> float:
    """A finished candidate's signal for the threshold and the vote: its lowest group confidence,
    or its SWIFT score (the last running score)."""
    if kind == "swift":
        return float(signal[-1]) if len(signal) else math.nan
    from ..rewards.confidence import lowest_group

    return lowest_group(signal, window)


def vote_weight(x: float, kind: str = "confidence") -> float:
    """A candidate's weight in the consensus vote, from its final signal: a confidence as it is
    (confidences are positive), a SWIFT score through a sigmoid (the SWIFT-weighted vote)."""
    if x is None or math.isnan(x):
        return 0.0
    return 1.0 / (1.0 + math.exp(-x)) if kind == "swift" else max(float(x), 0.0)


def consensus_share(answers: Sequence[Hashable | None], weights: Sequence[float]) -> float:
    """The leading answer's share of the total weight (the paper's beta); NaN when no answer votes."""
    tally: dict = {}
    for a, w in zip(answers, weights):
        if a is not None:
            tally[a] = tally.get(a, 0.0) + float(w)
    total = math.fsum(tally.values())
    if not tally or total <= 0.0:
        return math.nan
    return max(tally.values()) / total


@dataclass
class Group:
    """The policy's state for one group of ``n`` candidates; an engine (or :func:`replay`) tells it
    what happens (:meth:`finish`, :meth:`stop_now`) and passes its boundaries (:meth:`advance`).

    ``finished[i]``: candidate i's final signal once it finished unstopped, ``answers[i]`` its
    answer; ``stopped[i]``: the reason it was stopped, ``crossings[i]`` a threshold stop's token
    count; ``early``: later candidates that finished before the threshold was known (``wave`` 0:
    they ran beside the warmup; never stopped); ``released``: candidates ``0 .. released - 1`` may
    run; ``unstarted``: those a consensus stopped before they were released.
    """

    cfg: DeepConfConfig
    n: int
    threshold: float | None = None
    finished: dict = field(default_factory=dict)
    answers: dict = field(default_factory=dict)
    stopped: dict = field(default_factory=dict)
    crossings: dict = field(default_factory=dict)
    early: set = field(default_factory=set)
    unstarted: set = field(default_factory=set)
    released: int = 0
    boundary: int = 0  # boundaries passed (0: the warmup's is still to come)
    share: float | None = None  # the vote share at the last boundary with a vote

    def __post_init__(self):
        if self.n <= self.cfg.warmup:
            raise DeepConfConfigError(
                f"DeepConf online runs warmup = {self.cfg.warmup} candidates to the end and stops later ones: a "
                f"request needs more candidates than that (it has n = {self.n}); ask for more, or lower warmup"
            )
        # waves start after the warmup, once the threshold is known; without waves all run at once
        self.released = self.n if self.cfg.wave == 0 else self.cfg.warmup

    # -- what happens --------------------------------------------------------------------------
    def finish(self, i: int, signal: float, answer: Hashable | None = None) -> None:
        """Candidate ``i`` finished by itself (not stopped), with its final ``signal`` and ``answer``."""
        if i in self.stopped or i in self.finished:
            return
        self.finished[i] = signal
        self.answers[i] = answer
        if i >= self.cfg.warmup and self.threshold is None:
            self.early.add(i)

    def done(self, i: int) -> bool:
        return i in self.finished or i in self.stopped

    def stop_now(self, i: int, signal: Sequence[float]) -> bool:
        """Whether running candidate ``i`` stops now, given its signal so far (token confidences, or
        running SWIFT scores): the threshold is known and its signal has crossed it."""
        if i < self.cfg.warmup or self.threshold is None or self.done(i):
            return False
        t = crossing(signal, self.threshold, self.cfg.window, self.cfg.signal)
        if t is None:
            return False
        self.stopped[i] = THRESHOLD
        self.crossings[i] = t
        return True

    # -- boundaries ------------------------------------------------------------------------------
    def due(self) -> bool:
        """A boundary is due: every warmup candidate finished and the threshold is unset, or (waves)
        every released candidate is done and some remain unreleased."""
        if self.boundary == 0:
            return all(i in self.finished for i in range(self.cfg.warmup))
        return self.cfg.wave > 0 and self.released < self.n and all(self.done(i) for i in range(self.released))

    def advance(self, answers: bool = True) -> tuple[list[int], list[int]]:
        """Pass the boundary that is due: set the threshold (the warmup's), take the vote over the
        finished candidates (``answers``: answers are extracted; else no vote), and say ``(stop,
        release)``: the candidates a consensus stops (every one not done: running ones, and unreleased
        ones, which never start), or the next wave to start."""
        cfg = self.cfg
        if self.boundary == 0:
            self.threshold = percentile([self.finished[i] for i in range(cfg.warmup)], cfg.percentile)
        self.boundary += 1
        if cfg.consensus is not None and answers:
            ids = sorted(self.finished)
            self.share = consensus_share([self.answers.get(i) for i in ids],
                                         [vote_weight(self.finished[i], cfg.signal) for i in ids])
            if not math.isnan(self.share) and self.share >= cfg.consensus - 1e-12:
                rest = [i for i in range(self.n) if not self.done(i)]
                for i in rest:
                    self.stopped[i] = CONSENSUS
                    if i >= self.released:
                        self.unstarted.add(i)
                self.released = self.n
                return rest, []
        if cfg.wave > 0 and self.released < self.n:
            start, self.released = self.released, min(self.n, self.released + cfg.wave)
            return [], list(range(start, self.released))
        return [], []


@dataclass
class Replay:
    """:func:`replay`'s decisions for one group: ``stopped[i]`` (None, ``"threshold"`` or
    ``"consensus"``), ``crossing[i]`` (a threshold stop's token count), ``started[i]`` (False: a
    consensus stopped it before its wave started), the threshold and the last vote share."""

    stopped: list[str | None]
    crossing: list[int | None]
    started: list[bool]
    threshold: float
    share: float | None


def replay(signals: Sequence[Sequence[float]], cfg: DeepConfConfig, answers: Sequence[Hashable | None] | None = None,
           early: Sequence[int] = ()) -> Replay:
    """Apply the policy to one group of candidates generated to the end: ``signals[i]`` is candidate
    ``i``'s per-token signal (token confidences; for ``signal="swift"`` its running SWIFT score
    after each token, :func:`swift_fast.selection.pruning.running_swift` of a trace), ``answers[i]``
    its answer (None for none; no vote without ``answers``). ``early``: the later candidates that
    finished before the warmup did (``wave`` 0 only: the one fact an engine's timing decides, which
    the plugin reports as ``deepconf["early"]``). Returns the decisions an engine takes on the same
    candidates (module docstring)."""
    n = len(signals)
    g = Group(cfg, n)
    kind = cfg.signal

    def answer(i):
        return answers[i] if answers is not None else None

    for i in list(range(cfg.warmup)) + [i for i in early if cfg.wave == 0]:
        g.finish(i, final_signal(signals[i], cfg.window, kind), answer(i))
    while g.due():
        g.advance(answers is not None)
        # every released candidate still running is judged on its own sequence: stopped at its
        # first crossing, else it finishes
        for i in range(cfg.warmup, g.released):
            if not g.done(i) and not g.stop_now(i, signals[i]):
                g.finish(i, final_signal(signals[i], cfg.window, kind), answer(i))
    return Replay([g.stopped.get(i) for i in range(n)], [g.crossings.get(i) for i in range(n)],
                  [i not in g.unstarted for i in range(n)], g.threshold, g.share)


__all__ = ["CONSENSUS", "FIELDS", "SIGNALS", "THRESHOLD", "DeepConfConfig", "DeepConfConfigError", "Group", "Replay",
           "consensus_share", "crossing", "final_signal", "percentile", "replay"]
