"""Batch Best-of-N throughput with one vLLM engine and with N data-parallel engines: same run,
model, problems and per-problem seeds.

Both set-ups are built once (the one-engine run first, with vLLM's default CPU binding; then
``data_parallel_size=N``, each engine core bound to its share of the cores), each with the
swift-fast plugin (a SWIFT head over every state, SAR on) and the collector of ``swift-fast
bon``/``collect`` (``swift_fast.jobs.collect``: render, generate, grade, write). Timed rounds
alternate between them, each writing a fresh rollout file over the same problems; the report
gives problems/s and generated tokens/s per set-up (median over rounds) and the ratio N engines /
one, per round (median and range). Engine start-up is not timed.

    python bench/bench_bon_data_parallel.py                      # 2 engines, ~31M-parameter Llama
    python bench/bench_bon_data_parallel.py --problems 32 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def build(args, root: str) -> tuple[str, str, str]:
    """The random Llama and the head of ``bench_vllm_throughput.py`` (same ``--hidden``/``--layers``/``--vocab``),
    and ``--problems`` generic arithmetic problems."""
    from bench_vllm_throughput import build as build_model_and_head

    path, hp, _ = build_model_and_head(args, root)
    data = os.path.join(root, "problems.jsonl")
    with open(data, "w") as f:
        for i in range(args.problems):
            row = {"id": f"p{i}", "prompt": f"What is {i} + {2 * i + 1}?", "answer": str(3 * i + 1)}
            f.write(json.dumps(row) + "\n")
    return path, hp, data


def timed(engine, tokenizer, examples, cfg, out: str) -> tuple[float, int]:
    from swift_fast.data.rollouts import read_rollouts
    from swift_fast.jobs.collect import collect

    t = time.perf_counter()
    collect(engine, tokenizer, examples, out, cfg, progress=False)
    dt = time.perf_counter() - t
    return dt, sum(len(c["token_ids"]) for p in read_rollouts(out) for c in p.candidates)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=512, help="the model's vocabulary size (default 512)")
    p.add_argument("--problems", type=int, default=48)
    p.add_argument("--n", type=int, default=8, help="candidates per problem")
    p.add_argument("--tokens", type=int, default=64, help="most new tokens per candidate")
    p.add_argument("--engines", type=int, default=2, help="data-parallel engines to compare with one")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per set-up (after one warm-up)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    from swift_fast.data.datasets import load_dataset
    from swift_fast.jobs.collect import CollectConfig
    from swift_fast.jobs.engine import VLLMEngine
    from swift_fast.support.engine_logs import quiet_vllm_logs

    quiet_vllm_logs()
    root = tempfile.mkdtemp(prefix="swift-fast-bench-dp-")
    path, hp, data = build(args, root)
    examples = load_dataset(data)
    cfg = CollectConfig(n=args.n, max_new_tokens=args.tokens, chunk=args.problems)
    kw = dict(dtype="bfloat16", enforce_eager=True, max_model_len=256,
              additional_config={"swift_fast": {"head": hp, "sar": True}})
    engines = {"1 engine": VLLMEngine(path, **kw)}
    engines[f"{args.engines} engines"] = VLLMEngine(path, data_parallel_size=args.engines, **kw)
    rate: dict[str, list[float]] = {k: [] for k in engines}
    toks: dict[str, list[float]] = {k: [] for k in engines}
    try:
        for r in range(args.rounds + 1):
            order = list(engines) if r % 2 == 0 else list(reversed(engines))
            for name in order:
                e = engines[name]
                out = os.path.join(root, f"{name}-{r}.jsonl".replace(" ", ""))
                dt, ntok = timed(e, e.tokenizer, examples, cfg, out)
                if r == 0:
                    continue  # warm-up
                rate[name].append(args.problems / dt)
                toks[name].append(ntok / dt)
                print(f"round {r} {name:10s} {args.problems / dt:7.2f} problems/s {ntok / dt:9.1f} tok/s", flush=True)
    finally:
        for e in engines.values():
            e.close()
    one, many = list(engines)
    paired = sorted(a / b for a, b in zip(rate[many], rate[one]))
    import torch

    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPUs, torch {torch.__version__}",
        "model": f"random Llama, hidden {args.hidden}, {args.layers} layers, bf16",
        "problems": args.problems, "n": args.n, "max_new_tokens": args.tokens, "rounds": args.rounds,
        "problems_per_s": rate, "tokens_per_s": toks,
        "median_problems_per_s": {k: statistics.median(v) for k, v in rate.items()},
        "median_tokens_per_s": {k: statistics.median(v) for k, v in toks.items()},
        "data_parallel_over_one": statistics.median(rate[many]) / statistics.median(rate[one]),
        "paired_ratio_median": statistics.median(paired), "paired_ratio_range": [paired[0], paired[-1]],
    }
    print(json.dumps({k: v for k, v in result.items() if k not in ("problems_per_s", "tokens_per_s")}, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
