"""The demo's HTML page: for a few problems, every candidate with its scores (SWIFT, SAR and the
trivial selectors' signals: length, mean token log-prob, DeepConf confidence), and its tokens
coloured by ``g_t * r_t`` (gate times token reward), the ten highest in green and the ten lowest
in red (SWIFT paper, Table 11). Token values come from the head applied offline to the same
token ids (``swift_fast.hf.extract_features`` + ``swift_fast.rewards.scoring.token_scores``)."""

from __future__ import annotations

import html
from typing import Sequence

import torch

from ..data.rollouts import Problem

TOP = 10

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
h2{margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;width:100%;font-size:13px}
td,th{border-bottom:1px solid #eee;padding:4px 6px;vertical-align:top;text-align:left}
td.text{font-family:ui-monospace,monospace;word-break:break-all}
.hi{background:#b7f0b1}.lo{background:#f7b9b4}
.ok{color:#176d12;font-weight:bold}.bad{color:#a11;font-weight:bold}
tr.sel-swift td:first-child{border-left:4px solid #2a6ad8}
.legend span{padding:1px 6px;margin-right:8px}
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


def _marked(tokens: list[str], values: torch.Tensor) -> str:
    n = len(tokens)
    k = min(TOP, n // 2)
    order = torch.argsort(values, descending=True, stable=True).tolist()
    hi, lo = set(order[:k]), set(order[n - k :]) if k else set()
    out = []
    for i, t in enumerate(tokens):
        cls = "hi" if i in hi else "lo" if i in lo else None
        title = f' title="g*r = {float(values[i]):.3f}"'
        text = html.escape(t).replace("\n", "&#9166;")
        out.append(f'<span class="{cls}"{title}>{text}</span>' if cls else f"<span{title}>{text}</span>")
    return "".join(out)


def render(
    problems: Sequence[Problem], values: Sequence[Sequence[torch.Tensor]], tokenizer, title: str, summary_html: str = ""
) -> str:
    """The page. ``values[p][c]``: token values of candidate ``c`` of problem ``p``."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>", summary_html,
             "<p class='legend'><span class='hi'>ten highest g&middot;r tokens</span>"
             "<span class='lo'>ten lowest g&middot;r tokens</span> hover a token for its value; "
             "the blue bar marks the candidate SWIFT selects.</p>"]
    for p, vals in zip(problems, values):
        scores = [c.get("swift_score") for c in p.candidates]
        finite = [s if s is not None else float("-inf") for s in scores]
        chosen = max(range(len(finite)), key=lambda i: (finite[i], -i))
        parts.append(f"<h2>{html.escape(p.id)}: {html.escape(p.question)} = {html.escape(str(p.reference))}</h2>")
        parts.append("<table><tr><th>#</th><th>SWIFT</th><th>SAR</th><th title='generated tokens'>len</th>"
                     "<th title='mean token log-prob'>mean lp</th>"
                     "<th title='DeepConf confidence: lowest group / tail'>conf low / tail</th><th>answer</th>"
                     "<th>response (tokens coloured by gate &times; reward)</th></tr>")
        for i, (c, v) in enumerate(zip(p.candidates, vals)):
            toks = [tokenizer.decode([t]) for t in c["token_ids"]]
            mark = "ok" if c.get("correct") else "bad"
            sar = c.get("sar")
            parts.append(
                f"<tr class='{'sel-swift' if i == chosen else ''}'><td>{i}</td><td>{_fmt(c.get('swift_score'))}</td>"
                f"<td>{_fmt(sar)}</td><td>{c.get('num_tokens', len(c['token_ids']))}</td>"
                f"<td>{_fmt(c.get('mean_logprob'))}</td>"
                f"<td>{_fmt(c.get('conf_lowest'), 2)} / {_fmt(c.get('conf_tail'), 2)}</td>"
                f"<td class='{mark}'>{html.escape(str(c.get('answer')))} "
                f"{'&#10003;' if c.get('correct') else '&#10007;'}</td>"
                f"<td class='text'>{_marked(toks, v)}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _fmt(x, digits: int = 3) -> str:
    return "&ndash;" if x is None else f"{x:.{digits}f}"
