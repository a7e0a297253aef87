"""The demo's HTML page: for a few problems, each distinct candidate once (with how many of the
problem's candidates are that same text), its scores (SWIFT, SAR and the trivial selectors'
signals: length, mean token log-prob, DeepConf confidence), the candidate each selector picks
side by side, and the tokens whose gate times token reward ``g_t * r_t`` stands out coloured:
green for positive, red for negative, only where ``|g_t r_t|`` is at least :data:`MARK_FRACTION`
of the largest on the page (SWIFT paper, Table 11, marks a fixed number of tokens instead; with
a gate near 0 on most tokens, that colours tokens that weigh nothing). Token values come from the
head applied offline to the same token ids (``swift_fast.hf.extract_features`` +
``swift_fast.rewards.scoring.token_scores``)."""

from __future__ import annotations

import html
from typing import Mapping, Sequence

import torch

from ..data.rollouts import Problem
from ..reports import best_of_n as report

#: A token is coloured when ``|g r|`` is at least this fraction of the largest ``|g r|`` among the
#: tokens on the page (one scale for every problem shown, so colours compare across them).
MARK_FRACTION = 0.05

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1150px;color:#222}
h2{margin-top:2em;border-bottom:1px solid #ccc;font-size:1.25em}
table{border-collapse:collapse;font-size:13px}
table.cands{width:100%}
td,th{border-bottom:1px solid #eee;padding:4px 6px;vertical-align:top;text-align:left}
table.picks{margin-bottom:.6em}table.picks th{font-weight:normal;color:#555;font-size:12px}
table.picks td{text-align:center}
td.text{font-family:ui-monospace,monospace;word-break:break-all}
td.num{text-align:right;font-variant-numeric:tabular-nums}
span.hi{background:rgba(60,180,60,var(--a,.45))}span.lo{background:rgba(220,60,50,var(--a,.45))}
.ok{color:#176d12;font-weight:bold}.bad{color:#a11;font-weight:bold}
.meta{color:#555;margin:.3em 0 .8em}
tr.sel-swift td:first-child{border-left:4px solid #2a6ad8}
.legend span.hi,.legend span.lo{padding:1px 6px}
ul.summary{padding-left:1.2em}ul.summary li{margin:.2em 0}
"""


def token_values(model, head, prompt_ids: list[int], responses: Sequence[list[int]]) -> list[torch.Tensor]:
    """``g_t * r_t`` of every scored token of each response: float32 ``[m_i]``."""
    from ..hf.features import extract_features
    from ..rewards.scoring import token_scores

    if head.feature == "logits":
        states, cu = extract_features(model, [prompt_ids + r for r in responses], [len(prompt_ids)] * len(responses),
                                      alignment=head.alignment, feature="logits", dtype=torch.float32)
    else:
        states, cu = extract_features(model, [prompt_ids + r for r in responses], [len(prompt_ids)] * len(responses),
                                      layers=head.layers, alignment=head.alignment, dtype=torch.float32)
    g, r = token_scores(states, head)
    v = g * r
    return [v[cu[i] : cu[i + 1]] for i in range(len(responses))]


def distinct(candidates: Sequence[dict]) -> list[list[int]]:
    """The candidates grouped by their token ids: one list of indices per distinct candidate, in
    order of first appearance (identical token ids: the same text, the same scores)."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(candidates):
        groups.setdefault(tuple(c["token_ids"]), []).append(i)
    return list(groups.values())


def selector_picks(problems: Sequence[Problem], score: str = "swift_score", sar: str | None = "sar",
                   ) -> list[dict[str, int]]:
    """Per problem, the candidate each selector picks among all its candidates (``k`` = their
    number), by the report's own rules (:func:`swift_fast.reports.best_of_n.standard_choosers`:
    ties to the lowest index, a missing score never wins): the score, SAR, majority vote and the
    trivial selectors first, then the score's other rows. Every problem needs as many candidates."""
    c = report.gather(problems, [k for k in (score, sar) if k], signals=True)
    choosers = report.standard_choosers(score, sar=sar, trivial=report.trivial_choosers(c))
    first = [n for n in (report.selector_name(score), sar and report.selector_name(sar), "majority",
                         *report.TRIVIAL) if n in choosers]
    names = first + [n for n in choosers if n not in first]
    picked = {n: choosers[n](c, c.n).tolist() for n in names}
    return [{n: picked[n][i] for n in names} for i in range(len(problems))]


def _label(j: int) -> str:
    return chr(ord("A") + j) if j < 26 else f"#{j + 1}"


def _ranges(ix: list[int]) -> str:
    """``[1, 3, 4, 5]`` -> ``"1, 3&ndash;5"`` (HTML)."""
    out, start = [], ix[0]
    for a, b in zip(ix, ix[1:] + [None]):
        if b != a + 1:
            out.append(str(start) if start == a else f"{start}&ndash;{a}")
            start = b
    return ", ".join(out)


def _marked(tokens: list[str], values: torch.Tensor, threshold: float, top: float) -> str:
    """Tokens as spans: class ``hi`` (``g r >= threshold``) or ``lo`` (``g r <= -threshold``), the
    colour's strength growing with ``|g r| / top``; every other token unmarked."""
    out = []
    for i, t in enumerate(tokens):
        v = float(values[i])
        text = html.escape(t).replace("\n", "&#9166;")
        title = f' title="g*r = {v:.3f}"'
        if threshold > 0 and abs(v) >= threshold:
            alpha = 0.2 + 0.6 * min(1.0, abs(v) / top)
            out.append(f'<span class="{"hi" if v > 0 else "lo"}" style="--a:{alpha:.2f}"{title}>{text}</span>')
        else:
            out.append(f"<span{title}>{text}</span>")
    return "".join(out)


def mark_threshold(values: Sequence[Sequence[torch.Tensor]]) -> tuple[float, float]:
    """``(threshold, largest)``: :data:`MARK_FRACTION` of the largest ``|g r|`` over every token of
    ``values``, and that largest value (both 0.0 when there is no token or every value is 0)."""
    top = max((float(v.abs().max()) for vals in values for v in vals if v.numel()), default=0.0)
    return MARK_FRACTION * top, top


def render(
    problems: Sequence[Problem],
    values: Sequence[Sequence[torch.Tensor]],
    tokenizer,
    title: str,
    summary: str = "",
    picks: Sequence[Mapping[str, int]] | None = None,
) -> str:
    """The page. ``values[p][c]``: token values of candidate ``c`` of problem ``p``; ``summary``:
    lines of text shown as a list under the title (:func:`swift_fast.reports.best_of_n.summary_text`);
    ``picks[p]``: selector name -> the index of the candidate it picks (:func:`selector_picks`)."""
    threshold, top = mark_threshold(values)
    lines = [line for line in summary.splitlines() if line.strip()]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body>", f"<h1>{html.escape(title)}</h1>"]
    if lines:
        parts.append("<ul class='summary'>" + "".join(f"<li>{html.escape(x)}</li>" for x in lines) + "</ul>")
    mark = (f"<span class='hi'>g&middot;r &ge; +{threshold:.3g}</span> "
            f"<span class='lo'>g&middot;r &le; &minus;{threshold:.3g}</span> tokens coloured: "
            f"|g&middot;r| (gate &times; token reward) at least {100 * MARK_FRACTION:g}% of the largest on this page "
            f"({top:.3g}); the stronger the colour, the larger |g&middot;r|; every other token is uncoloured")
    if threshold <= 0:
        mark = "no token has a nonzero g&middot;r: none is coloured"
    parts.append(
        f"<p class='legend' data-threshold='{threshold!r}'>" + mark
        + ". Hover a token for its value; &#9166; is a newline. Each distinct candidate is shown once "
        "(<b>count</b>: how many of the problem's candidates are that same text, <b>candidates</b>: their "
        "indices in generation order). <b>Picks</b>: the candidate each selector chooses among all of the "
        "problem's candidates (ties to the lowest index); the blue bar marks SWIFT's.</p>")
    for pi, (p, vals) in enumerate(zip(problems, values)):
        groups = distinct(p.candidates)
        label = {i: _label(j) for j, g in enumerate(groups) for i in g}
        pick = dict(picks[pi]) if picks is not None else {}
        right = sum(bool(c.get("correct")) for c in p.candidates)
        parts.append(f"<h2>{html.escape(p.id)}: {html.escape(str(p.question))} = {html.escape(str(p.reference))}</h2>")
        parts.append(f"<p class='meta'>{len(p.candidates)} candidates, {len(groups)} distinct, {right} correct</p>")
        if pick:
            cells = []
            for i in pick.values():
                ok = bool(p.candidates[i].get("correct"))
                cells.append(f"<td class='{'ok' if ok else 'bad'}'>{label[i]} {'&#10003;' if ok else '&#10007;'}</td>")
            parts.append("<table class='picks'><tr><th>selector</th>"
                         + "".join(f"<th>{html.escape(n)}</th>" for n in pick) + "</tr><tr><th>picks</th>"
                         + "".join(cells) + "</tr></table>")
        parts.append("<table class='cands'><tr><th>cand.</th><th>count</th><th>candidates</th><th>SWIFT</th>"
                     "<th>SAR</th><th title='generated tokens'>len</th><th title='mean token log-prob'>mean lp</th>"
                     "<th title='DeepConf confidence: lowest group / tail'>conf low / tail</th><th>answer</th>"
                     "<th>response (tokens coloured by gate &times; reward)</th></tr>")
        swift = pick.get(report.selector_name("swift_score"))
        for g in groups:
            c, v = p.candidates[g[0]], vals[g[0]]
            toks = [tokenizer.decode([t]) for t in c["token_ids"]]
            ok = bool(c.get("correct"))
            parts.append(
                f"<tr class='{'sel-swift' if swift in g else ''}'><td>{label[g[0]]}</td>"
                f"<td class='num'>{len(g)}</td><td>{_ranges(g)}</td>"
                f"<td class='num'>{_fmt(c.get('swift_score'))}</td><td class='num'>{_fmt(c.get('sar'))}</td>"
                f"<td class='num'>{c.get('num_tokens', len(c['token_ids']))}</td>"
                f"<td class='num'>{_fmt(c.get('mean_logprob'))}</td>"
                f"<td>{_fmt(c.get('conf_lowest'), 2)} / {_fmt(c.get('conf_tail'), 2)}</td>"
                f"<td class='{'ok' if ok else 'bad'}'>{html.escape(str(c.get('answer')))} "
                f"{'&#10003;' if ok else '&#10007;'}</td>"
                f"<td class='text'>{_marked(toks, v, threshold, top)}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _fmt(x, digits: int = 3) -> str:
    return "&ndash;" if x is None else f"{x:.{digits}f}"
