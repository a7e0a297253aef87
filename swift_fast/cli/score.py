"""`swift-fast score`: add SWIFT (and optionally SAR) scores to the candidates of a rollout file, or,
without a head, the head-free values the vLLM plugin gives every candidate."""

from __future__ import annotations

import argparse
import os
import sys

from . import options

DESCRIPTION = """\
Score every candidate of a rollout file with a Hugging Face model. With --head, the SWIFT score:
each layer's state is projected onto the head as the layer runs, so no hidden state is stored and
peak memory is that of a plain forward. Without --head, the head-free values the vLLM plugin gives
every candidate, under the same names: `mean_logprob` (the mean log-prob of its tokens under the
model's own distribution), DeepConf's `confidence_lowest_group`, `confidence_tail` and
`confidence_bottom10` over --confidence-window tokens, and `num_tokens`; `swift-fast eval` then
reports the head-free selectors and DeepConf's weighted votes from them. Candidates are read as
token ids (`prompt_token_ids` plus each candidate's `token_ids`), never re-tokenised. With --sar,
also the self-aligned reward (two passes: question kept, and the prompt with only the question
removed, as `swift-fast collect` recorded it in `sar_context_token_ids`).

The output is the input with score columns added; it is written problem by problem, and a rerun
skips problems already in the output (resumable; --overwrite starts again).
"""

EXAMPLES = """\
examples:
  swift-fast score --model Qwen/Qwen2.5-7B-Instruct --head head.safetensors --rollouts test.jsonl --out scored.jsonl
  swift-fast score --model M --head H --rollouts R --out S --sar --column swift
  swift-fast score --model M --rollouts R --out S   # no head: mean log-prob and DeepConf's confidences
"""

#: the fields written without a head: the vLLM plugin's head-free values, under its names
HEAD_FREE_FIELDS = ("num_tokens", "mean_logprob", "confidence_lowest_group", "confidence_tail", "confidence_bottom10")


def add_parser(sub, name, help_):
    p = options.command(sub, name, help_, DESCRIPTION, EXAMPLES)
    p.add_argument("--model", required=True,
                   help="Hugging Face model name or path, or a .gguf file (the model the head was trained on)")
    p.add_argument("--head", help="SWIFT head: a .safetensors file, or a Hugging Face Hub repository id "
                   "org/name[@revision][:file] (file default head.safetensors); without one, the head-free values")
    p.add_argument("--rollouts", required=True, help="rollout JSONL with prompt_token_ids and candidates' token_ids")
    p.add_argument("--out", required=True, help="output JSONL (appended to and resumed when it exists)")
    p.add_argument("--column", help="candidate field for the SWIFT score (default: swift_score; with --head)")
    p.add_argument("--sar", action="store_true", help="also compute the self-aligned reward into --sar-column")
    p.add_argument("--sar-column", default="sar", help="candidate field for SAR (default: sar)")
    options.add_confidence_window(p)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per forward (default 8)")
    p.add_argument("--chunk", type=int, default=32, help="problems scored between writes (default 32)")
    options.add_dtype(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--overwrite", action="store_true",
                   help="start again: write --out anew (by default a rerun resumes it, skipping the problems "
                        "already there)")
    p.add_argument("--no-resume", dest="overwrite", action="store_true", help=argparse.SUPPRESS)  # 0.1's spelling
    options.add_no_progress(p)
    return p


def head_free_values(model, seqs, plens, window: int, batch_size: int) -> list[dict]:
    """The :data:`HEAD_FREE_FIELDS` of each ``prompt + response`` sequence (one forward per batch,
    ``swift_fast.hf.signals``; the confidences by ``swift_fast.rewards.confidence.summary``, as the
    plugin reduces them), JSON-ready: None where a value is NaN (an empty response)."""
    import math

    from ..hf.signals import candidate_signals
    from ..rewards.confidence import summary

    s = candidate_signals(model, seqs, plens, window=window, batch_size=batch_size)
    out = []
    for b in range(len(seqs)):
        a, e = int(s.cu_seqlens[b]), int(s.cu_seqlens[b + 1])
        v = {"num_tokens": int(s.num_tokens[b]), "mean_logprob": float(s.mean_logprob[b]),
             **summary(s.token_confidence[a:e].double().tolist(), window)}
        out.append({k: None if isinstance(x, float) and not math.isfinite(x) else x for k, x in v.items()})
    return out


def sar_contexts(problems) -> list[list[int]]:
    """Each problem's question-removed prompt ids, as ``swift-fast collect`` recorded them."""
    out = []
    for p in problems:
        q0 = p.extra.get("sar_context_token_ids")
        if not isinstance(q0, list) or not q0 or not all(isinstance(t, int) for t in q0):
            raise ValueError(
                f"{p.where or p.id}: --sar needs the problem's question-removed prompt ('sar_context_token_ids', "
                "token ids: its prompt with the question removed, rendered the same way), which `swift-fast "
                "collect` records; collect these rollouts again, or add the field"
            )
        out.append(q0)
    return out


def _option_error(args) -> str | None:
    """What is wrong with the options together (None: nothing)."""
    if os.path.abspath(args.out) == os.path.abspath(args.rollouts):
        return "--out must differ from --rollouts (the output is written while the input is read)"
    if args.head is None and args.column is not None:
        return ("--column names the SWIFT score's field, which needs --head; without a head `score` writes the "
                f"head-free values under their own names ({', '.join(HEAD_FREE_FIELDS)})")
    if args.head is not None and args.confidence_window is not None:
        return ("--confidence-window sets the head-free values' groups, which `score` computes without --head; drop "
                "one of the two")
    if args.confidence_window is not None and args.confidence_window < 1:
        return f"--confidence-window must be a positive number of tokens, got {args.confidence_window}"
    return None


def _score_keys(args, model, tokenizer, head, seqs_all, keys: list[int], contexts, column: str, window: int) -> None:
    """Score the candidates ``keys`` (indices into ``seqs_all``) in place: the SWIFT score under
    ``column`` with a head, else the head-free values, and with ``--sar`` SAR."""
    from ..hf.sar import sar_rewards
    from ..hf.scoring import swift_scores

    seqs = [seqs_all.sequences[k] for k in keys]
    plens = [seqs_all.prompt_lengths[k] for k in keys]
    scores = values = sar = None
    if head is not None:
        scores = swift_scores(model, head, seqs, plens, batch_size=args.batch_size)
    else:
        values = head_free_values(model, seqs, plens, window, args.batch_size)
    if args.sar:
        sar = sar_rewards(model, tokenizer, [s[:p] for s, p in zip(seqs, plens)], [s[p:] for s, p in zip(seqs, plens)],
                          contexts=[contexts[seqs_all.refs[k][0]] for k in keys], batch_size=args.batch_size)
    for j, k in enumerate(keys):
        pi, ci = seqs_all.refs[k]
        cand = seqs_all.problems[pi].candidates[ci]
        if scores is not None:
            cand[column] = float(scores[j])
        if values is not None:
            cand.update(values[j])
        if sar is not None:
            cand[args.sar_column] = float(sar[j])


def run(args) -> int:
    from ..data.datasets import DataError
    from ..data.rollouts import RolloutWriter
    from ..hf.features import UnsupportedModelError
    from ..hf.hub import resolve_head
    from ..rewards.confidence import DEFAULT_WINDOW
    from ..rewards.head import HeadError, SwiftHead

    bad = _option_error(args)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    column = args.column or "swift_score"
    window = DEFAULT_WINDOW if args.confidence_window is None else args.confidence_window
    try:
        head = SwiftHead.load(resolve_head(args.head)) if args.head is not None else None
        from ..hf.loading import load_model
        from ..hf.rollout_data import rollout_sequences
        from ..hf.scoring import check_head

        model, tokenizer = load_model(args.model, args.dtype, args.device)
        if head is not None:
            check_head(model, head)
            head.to(model.device)
        seqs_all = rollout_sequences(args.rollouts)  # every line checked before any work
        contexts = sar_contexts(seqs_all.problems) if args.sar else None
        writer = RolloutWriter(args.out, resume=not args.overwrite)
    except (DataError, HeadError, UnsupportedModelError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    todo = [i for i, p in enumerate(seqs_all.problems) if p.id not in writer.done]
    bar = None
    if not args.no_progress:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=len(seqs_all.problems), initial=len(seqs_all.problems) - len(todo), desc="score", unit="problem"
        )
    by_problem: dict[int, list[int]] = {}
    for k, (pi, _) in enumerate(seqs_all.refs):
        by_problem.setdefault(pi, []).append(k)
    try:
        step = max(1, args.chunk)
        for a in range(0, len(todo), step):
            chunk = todo[a : a + step]
            keys = [k for pi in chunk for k in by_problem.get(pi, [])]
            if keys:
                _score_keys(args, model, tokenizer, head, seqs_all, keys, contexts, column, window)
            for pi in chunk:
                writer.write(seqs_all.problems[pi])
            if bar is not None:
                bar.update(len(chunk))
    finally:
        writer.close()
        if bar is not None:
            bar.close()
    what = (f"column {column!r}" if head is not None else
            f"head-free values {', '.join(HEAD_FREE_FIELDS[1:])}, confidence window {window}")
    print(f"scored {len(todo)} problems into {args.out} ({what}{', ' + repr(args.sar_column) if args.sar else ''})")
    return 0
