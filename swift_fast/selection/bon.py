"""Best-of-N selection and its companions (SWIFT paper section 3 and appendix C; DESIGN 2).

Every selector looks at the first ``k`` candidates of each problem, in generation order, and
returns the index of the chosen one (``LongTensor[P]``). Ties go to the lowest index. A NaN
score never wins over a number (it ranks as ``-inf``).

The rules live here once, and every figure that needs one takes it from here: the pick
(:func:`bon_select`), pass@k (:func:`oracle`) and the expectation of a random pick
(:func:`random_pick`), each honouring the candidates stopped during generation (``pruned``).
Data held flat, one entry per candidate with a problem id (training's validation candidates),
is laid out as matrices by :func:`by_problem`, whose padding is marked pruned so that no rule
ever counts it. A score row may hold ``None`` (a value the engine did not compute): it counts as NaN.

:func:`best_output` is the same pick over one vLLM ``RequestOutput`` (or any list of completions
with value attributes): duck-typed, so this module never imports vLLM.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import torch


def _none_as_nan(x):
    """Nested lists with ``None`` (a score the engine did not compute: vLLM's ``swift_score`` of an
    unscored candidate, a pruned candidate's ``sar``) as NaN, which every rule here already ranks last."""
    if x is None:
        return math.nan
    if isinstance(x, (list, tuple)):
        return [_none_as_nan(v) for v in x]
    return x


def _scores(x, k: int | None = None) -> torch.Tensor:
    try:
        t = torch.as_tensor(x, dtype=torch.float64)
    except TypeError:
        t = torch.as_tensor(_none_as_nan(x), dtype=torch.float64)
    if t.dim() != 2:
        raise ValueError(f"scores must be [problems, candidates], got shape {tuple(t.shape)}")
    # NOTE: not nan_to_num, which would also turn +-inf into the largest finite numbers.
    t = torch.where(torch.isnan(t), float("-inf"), t)
    if k is not None:
        if not 1 <= k <= t.shape[1]:
            raise ValueError(f"k={k} but there are {t.shape[1]} candidates per problem")
        t = t[:, :k]
    return t


def _first_argmax(t: torch.Tensor) -> torch.Tensor:
    # torch.argmax returns the first maximal index, which is the tie rule.
    return torch.argmax(t, dim=1)


def eligible(pruned, k: int) -> torch.Tensor:
    """``[P, k]`` bool: the candidates a selection may pick. A candidate stopped during generation
    (``pruned[p, i]``) only when every one of the problem's first ``k`` was stopped."""
    p = torch.as_tensor(pruned, dtype=torch.bool)[:, :k]
    return ~p | p.all(1, keepdim=True)


def exclude_pruned(scores, pruned, k: int) -> torch.Tensor:
    """The first ``k`` scores with those of ineligible (pruned) candidates set to NaN (:func:`eligible`)."""
    return torch.where(eligible(pruned, k), _scores(scores, k), float("nan"))


def bon_select(scores, k: int, pruned=None) -> torch.Tensor:
    """Index of the highest-scoring candidate among the first ``k`` (ties: lowest index). With
    ``pruned`` (bool ``[P, n]``), never a pruned candidate while the problem has another one, even
    one without a score."""
    t = _scores(scores, k)
    if pruned is None:
        return _first_argmax(t)
    ok = eligible(pruned, k)
    idx = _first_argmax(torch.where(ok, t, float("-inf")))
    # every eligible score NaN: argmax fell on index 0, which may be pruned
    first_ok = torch.argmax(ok.to(torch.uint8), dim=1)
    return torch.where(ok.gather(1, idx.view(-1, 1)).squeeze(1), idx, first_ok)


_NO_DEFAULT = object()


def _candidates(request_output_or_outputs) -> list:
    """The completions of a vLLM ``RequestOutput`` (``.outputs``), of an OpenAI response object or
    its parsed JSON (``.choices``, ``["choices"]``), or a list of them as given."""
    for name in ("outputs", "choices"):
        inner = _field(request_output_or_outputs, name)
        if inner is not None:
            return list(inner)
    if isinstance(request_output_or_outputs, Mapping):
        raise TypeError("best_output takes a RequestOutput, a response with choices or a list of candidates, got one "
                        "mapping without 'choices': pass [candidate] for a single one")
    return list(request_output_or_outputs)


def _field(c, name: str, default=None):
    if isinstance(c, Mapping):
        return c.get(name, default)
    return getattr(c, name, default)


def _value(c, by: str, i: int) -> float:
    v = _field(c, by)
    if v is None:
        return math.nan
    # NOTE: bool is a number to Python; a True score is a bug upstream, not a 1.0
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"candidate {i}: {by} = {v!r} is not a number: choose a value attribute with by=")
    return float(v)


def best_output(request_output_or_outputs, by: str = "swift_score", default: Any = _NO_DEFAULT):
    """The candidate with the highest ``by`` among the completions of one request: a vLLM
    ``RequestOutput`` (its ``outputs``), an OpenAI response (its ``choices``), or a list of
    candidates (objects with attributes, or mappings). Duck-typed: vLLM is never imported.

    ``by``: any value attribute the candidates carry (``"swift_score"``, ``"sar"``, ...); higher
    is better, and ties go to the lowest candidate index (``c.index`` when every candidate has
    one, else the list order), as :func:`bon_select` rules. A candidate whose value is ``None``
    or NaN, or that was stopped during generation (``swift_pruned``), is never picked.

    When no candidate is left, returns ``default`` if one is given (``best_output(out,
    default=None)``, as ``max`` takes it), else raises ``ValueError`` saying why: no candidates,
    none with a value, or every valued one pruned.
    """
    cands = _candidates(request_output_or_outputs)
    if all(isinstance(_field(c, "index"), int) for c in cands):
        cands = sorted(cands, key=lambda c: _field(c, "index"))
    if cands and all(_field(c, by, _NO_DEFAULT) is _NO_DEFAULT for c in cands):
        # a name no candidate has is a typo or a signal the engine was not asked for, not "no value"
        raise ValueError(
            f"no candidate has a {by!r} value: check the name (swift_score, sar, ...); sar needs the plugin's "
            '"sar": true'
        )
    values = [_value(c, by, i) for i, c in enumerate(cands)]
    pruned = [bool(_field(c, "swift_pruned", False)) for c in cands]
    usable = [not p and not math.isnan(v) for v, p in zip(values, pruned)]
    if not any(usable):
        if default is not _NO_DEFAULT:
            return default
        missing = sum(math.isnan(v) for v in values)
        why = ("there are no candidates" if not cands else
               f"of {len(cands)} candidates, {missing} without a {by} value (None or NaN) and {sum(pruned)} pruned")
        raise ValueError(f"no candidate to pick by {by}: {why}; pass default= to get a value instead of this error")
    # the one rule: bon_select over one problem, the unusable candidates marked as pruned
    i = int(bon_select([values], len(values), pruned=[[not u for u in usable]])[0])
    return cands[i]


def ranks(scores, k: int) -> torch.Tensor:
    """Rank of each of the first ``k`` candidates, 0 best, by a stable descending sort: ``[P, k]``."""
    t = _scores(scores, k)
    order = torch.sort(t, dim=1, descending=True, stable=True).indices
    r = torch.empty_like(order)
    r.scatter_(1, order, torch.arange(t.shape[1]).expand_as(order).contiguous())
    return r


def combine_rank(a, b, k: int) -> torch.Tensor:
    """Rank combination: ``rank_rel = max(rank_a, rank_b)``, lowest wins (ties: lowest index)."""
    rel = torch.maximum(ranks(a, k), ranks(b, k))
    return torch.argmin(rel, dim=1)


def minmax(scores, k: int) -> torch.Tensor:
    """Min-max scaling of the first ``k`` scores of each problem to ``[0, 1]`` (all equal -> 1)."""
    t = _scores(scores, k)
    finite = torch.isfinite(t)
    lo = torch.where(finite, t, float("inf")).amin(1, keepdim=True)
    hi = torch.where(finite, t, float("-inf")).amax(1, keepdim=True)
    span = hi - lo
    ok = span > 0
    out = torch.where(ok, (t - lo) / torch.where(ok, span, 1.0), 1.0)
    out = torch.where(t == float("-inf"), 0.0, out)
    return torch.where(t == float("inf"), 1.0, out)


def combine_scaled(a, b, k: int) -> torch.Tensor:
    """Scaled combination: min-max each score over the ``k`` candidates, average, highest wins."""
    return _first_argmax((minmax(a, k) + minmax(b, k)) / 2)


def majority_vote(answers: Sequence[Sequence[Hashable | None]], k: int) -> torch.Tensor:
    """Pick a candidate holding the most frequent answer among the first ``k``.

    ``None`` answers (nothing extracted) do not vote. Ties between answers go to the one whose
    first occurrence is earliest; the selected index is that first occurrence. A problem with no
    answer at all selects candidate 0.
    """
    return weighted_vote(answers, None, k)


def weighted_vote(
    answers: Sequence[Sequence[Hashable | None]],
    scores,
    k: int,
    weight: Callable[[torch.Tensor], torch.Tensor] = torch.sigmoid,
) -> torch.Tensor:
    """Vote where each candidate adds ``weight(score)`` to its answer (plain count when ``scores`` is None).

    With SWIFT scores and the default sigmoid this is the SWIFT-weighted vote.
    """
    w = None if scores is None else weight(_scores(scores, k))
    out = []
    for p, row in enumerate(answers):
        if len(row) < k:
            raise ValueError(f"problem {p} has {len(row)} candidates, fewer than k={k}")
        tally: dict = {}
        first: dict = {}
        for i, a in enumerate(row[:k]):
            if a is None:
                continue
            tally[a] = tally.get(a, 0.0) + (1.0 if w is None else float(w[p, i]))
            first.setdefault(a, i)
        if not tally:
            out.append(0)
            continue
        best = max(tally, key=lambda a: (tally[a], -first[a]))
        out.append(first[best])
    return torch.tensor(out, dtype=torch.long)


def selection_accuracy(selected: torch.Tensor, correct) -> float:
    """Fraction of problems whose selected candidate is correct."""
    c = torch.as_tensor(correct, dtype=torch.bool)
    if c.shape[0] == 0:
        return float("nan")
    return c.gather(1, selected.view(-1, 1)).float().mean().item()


def bon_accuracy(scores, correct, ks: Iterable[int]) -> dict[int, float]:
    """Best-of-N accuracy for each ``k``: ``{k: accuracy}``."""
    return {k: selection_accuracy(bon_select(scores, k), correct) for k in ks}


def _eligible(correct: torch.Tensor, k: int, pruned) -> torch.Tensor:
    return torch.ones_like(correct[:, :k]) if pruned is None else eligible(pruned, k)


def oracle(correct, k: int | None = None, pruned=None) -> torch.Tensor:
    """pass@k per problem, float64 ``[P]``: 1.0 where one of the first ``k`` candidates (default
    all) is correct, counting a pruned one only when every one of them was pruned (:func:`eligible`)."""
    c = torch.as_tensor(correct, dtype=torch.bool)
    k = c.shape[1] if k is None else k
    return (c[:, :k] & _eligible(c, k, pruned)).any(1).double()


def random_pick(correct, k: int | None = None, pruned=None) -> torch.Tensor:
    """Expected correctness of a uniformly random pick among the first ``k`` candidates (default
    all) that may be picked (:func:`eligible`), per problem: float64 ``[P]``."""
    c = torch.as_tensor(correct, dtype=torch.bool)
    k = c.shape[1] if k is None else k
    ok = _eligible(c, k, pruned)
    return (c[:, :k] & ok).double().sum(1) / ok.double().sum(1)


def oracle_accuracy(correct, ks: Iterable[int]) -> dict[int, float]:
    """pass@k: fraction of problems with a correct candidate among the first ``k``."""
    c = torch.as_tensor(correct, dtype=torch.bool)
    out = {}
    for k in ks:
        if not 1 <= k <= c.shape[1]:
            raise ValueError(f"k={k} but there are {c.shape[1]} candidates per problem")
        # NOTE: averaged in float32, as this figure always was (0/1 outcomes convert exactly)
        out[k] = oracle(c, k).float().mean().item()
    return out


def by_problem(groups, *columns) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Flat per-candidate ``columns`` (each ``[N]``) laid out as ``[P, n]`` matrices: one row per
    problem, problems in sorted order of their ids ``groups`` ``[N]``, a problem's candidates in
    their order in the columns (generation order), ``n`` the most candidates any problem has.

    Returns ``(matrices, padding)``. ``padding`` bool ``[P, n]`` marks the cells past a problem's
    last candidate, filled with NaN (floating columns), False (bool) or 0. Passed as ``pruned`` it
    keeps the padding out of every rule here while the problem has a candidate, which it always
    has: :func:`bon_select` never picks it, :func:`oracle` and :func:`random_pick` never count it.
    """
    g = torch.as_tensor(groups).flatten()
    uniq, inverse, counts = torch.unique(g, sorted=True, return_inverse=True, return_counts=True)
    n = int(counts.max()) if len(uniq) else 0
    order = torch.sort(inverse, stable=True).indices  # by problem, generation order within one
    row = inverse[order]
    col = torch.arange(len(g)) - (counts.cumsum(0) - counts)[row]
    padding = torch.ones(len(uniq), n, dtype=torch.bool)
    padding[row, col] = False
    out = []
    for c in columns:
        t = torch.as_tensor(c).flatten()
        fill = float("nan") if t.is_floating_point() else (False if t.dtype == torch.bool else 0)
        m = torch.full((len(uniq), n), fill, dtype=t.dtype)
        m[row, col] = t[order]
        out.append(m)
    return out, padding


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to ``n`` (and ``n`` itself when it is not a power of two)."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks
