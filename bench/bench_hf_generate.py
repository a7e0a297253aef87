"""Cost of SWIFT scoring inside Hugging Face ``generate``: the same generation with and without
the scorer, in one run, repetitions interleaved.

Compared per configuration (median wall time over ``--reps``, and median process CPU time, which
a machine shared with other jobs distorts less; ratios are to plain generate):

- ``plain``      ``model.generate``
- ``step``       the same with ``swift_fast.hf.GenerationScorer`` attached (all states, gate;
                 the default ``projection="step"``: one projection per step)
- ``layer``      the scorer with ``projection="layer"``: the fused op once per layer
- ``naive``      per-step hooks that keep every selected state of the step, ``torch.cat`` them
                 and apply a ``Linear`` (a straightforward hook; the prefill's full states are
                 kept alive through views; DESIGN 6's +4.5%)

Greedy decoding with ``min_new_tokens = max_new_tokens`` so every variant runs the same number
of steps. Without ``--model`` a random-weight Llama of the given shape is built in a temporary
folder (``swift_fast.testing``).

    python bench/bench_hf_generate.py                       # CPU, tiny model
    python bench/bench_hf_generate.py --device cuda --hidden 4096 --layers 32 --batch 64 --new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from swift_fast.hf import GenerationScorer
from swift_fast.hf.features import decoder_parts, state_hooks
from swift_fast.rewards.head import SwiftHead


class NaiveScorer:
    """Per-step hooks that keep the step's states, concatenate them and apply a Linear."""

    def __init__(self, model, head):
        self.parts = decoder_parts(model)
        self.head = head
        self.linear = torch.nn.Linear(head.num_features, head.weight.shape[0]).to(self.parts.device)
        self.buf = [None] * len(head.layers)
        self.out = []

    def __enter__(self):
        def on_state(slot, h):
            self.buf[slot] = h[:, -1, :]
            if slot == len(self.buf) - 1:
                self.out.append(self.linear(torch.cat(self.buf, -1).float()))

        self._ctx = state_hooks(self.parts, self.head.layers, on_state)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model path (default: a random Llama of the shape below)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16" if torch.cuda.is_available() else "float32")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, LlamaConfig

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
        desc = args.model
    elif args.hidden * args.layers <= 4096 * 4:
        from swift_fast.testing import build_tiny_model

        path = build_tiny_model("llama",
                                os.path.join(tempfile.gettempdir(), f"swift-bench-llama-{args.layers}-{args.hidden}"),
                                num_layers=args.layers, hidden_size=args.hidden, vocab_size=args.vocab)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        desc = f"random Llama L={args.layers} d={args.hidden}"
    else:  # large shapes: random weights straight on the device, no files
        cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=int(args.hidden * 3.5),
                          num_hidden_layers=args.layers, num_attention_heads=args.hidden // 128,
                          num_key_value_heads=8, vocab_size=args.vocab)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        desc = f"random Llama L={args.layers} d={args.hidden} V={args.vocab}"
    model.to(device).eval()
    L = model.config.num_hidden_layers
    head = SwiftHead(model.config.hidden_size, list(range(L + 1))).to(device)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (args.batch, args.prompt), generator=g).to(device)
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=args.new_tokens,
              min_new_tokens=args.new_tokens, pad_token_id=0)
    step = GenerationScorer(model, head, projection="step")
    layer = GenerationScorer(model, head, projection="layer")
    naive = NaiveScorer(model, head)

    def plain():
        return model.generate(**kw)

    def naive_run():
        with naive:
            return model.generate(**kw)

    variants = {
        "plain": plain,
        "step": lambda: step.generate(**kw),
        "layer": lambda: layer.generate(**kw),
        "naive": naive_run,
    }
    with torch.no_grad():
        for f in variants.values():  # warm-up
            f()
        times = {k: [] for k in variants}
        cpu = {k: [] for k in variants}
        for _ in range(args.reps):
            for k, f in variants.items():
                _sync(device)
                t, c = time.perf_counter(), time.process_time()
                f()
                _sync(device)
                times[k].append(time.perf_counter() - t)
                cpu[k].append(time.process_time() - c)
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    # each repetition runs the variants back to back: the ratio within a repetition shares the
    # machine's load of that moment, so the median of those ratios is the steadier estimate
    paired = {k: statistics.median(t / p for t, p in zip(times[k], times["plain"])) for k in times}
    paired_cpu = {k: statistics.median(t / p for t, p in zip(cpu[k], cpu["plain"])) for k in cpu}
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
        if device.type == "cpu" else torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": desc,
        "dtype": args.dtype,
        "batch": args.batch,
        "prompt": args.prompt,
        "new_tokens": args.new_tokens,
        "states": L + 1,
        "reps": args.reps,
        "median_s": med,
        "ratio_to_plain": {k: med[k] / med["plain"] for k in med},
        "paired_ratio": paired,
        "paired_cpu_ratio": paired_cpu,
        "median_cpu_s": med_cpu,
        "cpu_ratio_to_plain": {k: med_cpu[k] / med_cpu["plain"] for k in med_cpu},
        "all_s": times,
        "all_cpu_s": cpu,
    }
    print(f"{desc}, {args.dtype}, {device}, batch {args.batch}, {args.prompt}+{args.new_tokens} tokens, "
          f"{L + 1} states, {args.reps} reps")
    print("  variant   wall median   (min, max)            paired ratio   CPU median   paired CPU ratio")
    for k in variants:
        print(f"  {k:6s} {med[k] * 1e3:10.1f} ms   ({min(times[k]) * 1e3:.1f}, {max(times[k]) * 1e3:.1f})   "
              f"x{paired[k]:.4f}      {med_cpu[k] * 1e3:8.1f} ms   x{paired_cpu[k]:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
