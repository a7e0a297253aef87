"""A GRPO step with SAR: SAR from a second Hugging Face pass against SAR from the plugin's rollouts.

TRL's ``GRPOTrainer`` on one model, dataset, batch and seed, three ways, in one run:

- ``trl_generate+hf_sar``: TRL's own generation (transformers ``generate``, what TRL does
  without its ``vllm`` extra) and ``swift_fast.hf.trl_sar_reward`` (both SAR passes again with
  the policy, after generation);
- ``plugin+hf_sar``: rollouts from a vLLM engine with the plugin (``swift_fast.rl.PluginRollouts``,
  SAR off) and the same ``trl_sar_reward``: what vLLM generation alone saves;
- ``plugin+plugin_sar``: the same rollouts with SAR on, read by ``swift_fast.rl.plugin_sar_reward``:
  SAR computed during generation.

Every variant has the verifiable reward too (math-verify on the task's answers, the RL recipe's
``accuracy_reward``). Each variant trains ``--warmup`` steps, then ``--steps`` timed steps; a
callback times each optimizer step, and wrappers time each generation (the rollout function, or
TRL's ``_generate_single_turn``) and each reward function inside it, so the report splits a step
into generation, SAR, the verifier and the rest (the policy's forward and backward, the optimizer,
TRL's bookkeeping). Medians over the timed steps; ratios against ``trl_generate+hf_sar``.

The variants run one after the other (a trainer's steps cannot interleave with another's); the
load of other processes falls on them unevenly, so compare ratios from one quiet run.

    python bench/bench_grpo_sar.py --json bench/results/DATE-cpu-grpo-sar.json   # SmolLM2-135M (fetched once)
    python bench/bench_grpo_sar.py --model PATH                                  # any Llama-family folder

The measurement of 2026-12-06 (``bench/results/2026-12-06-cpu-grpo-sar.json``) ran::

    .venv/bin/python bench/bench_grpo_sar.py --json bench/results/2026-12-06-cpu-grpo-sar.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

VARIANTS = ("trl_generate+hf_sar", "plugin+hf_sar", "plugin+plugin_sar")


def _timed(fn, bucket: list, name: str | None = None):
    def wrapped(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            bucket.append(time.perf_counter() - t)

    if name:
        wrapped.__name__ = wrapped.__qualname__ = name
    return wrapped


def run_variant(name: str, model_dir: str, rows: list[dict], a) -> dict:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from swift_fast.demo.real_rl import _row_prompt, accuracy_reward
    from swift_fast.hf import trl_sar_reward
    from swift_fast.rl import PluginRollouts, plugin_sar_reward

    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    times = {"step": [], "generation": [], "sar": [], "verifier": []}
    rollouts = None
    if name.startswith("plugin"):
        rollouts = PluginRollouts(model_dir, sar=name.endswith("plugin_sar"), dtype="float32", seed=a.seed,
                                  max_model_len=1024, kv_cache_memory_bytes=1 << 30)
        rollout_func = _timed(rollouts, times["generation"])
    else:
        rollout_func = None
    sar = plugin_sar_reward() if name.endswith("plugin_sar") else trl_sar_reward(model, tok)
    rewards = [_timed(accuracy_reward, times["verifier"], "accuracy_reward"), _timed(sar, times["sar"], "sar")]

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times["step"].append(time.perf_counter() - self.t)

    ds = datasets.Dataset.from_list([{"prompt": _row_prompt(x), "answer": x["answer"]} for x in rows])
    cfg = GRPOConfig(
        output_dir=os.path.join(a.work, name), max_steps=a.warmup + a.steps,
        per_device_train_batch_size=a.prompts * a.generations, num_generations=a.generations,
        max_completion_length=a.max_tokens, temperature=0.7, top_p=0.9, learning_rate=1e-5, seed=a.seed,
        logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False, disable_tqdm=True,
        log_level="warning", reward_weights=[1.0, 0.2],
    )
    trainer = GRPOTrainer(model=model, reward_funcs=rewards, args=cfg, train_dataset=ds, processing_class=tok,
                          rollout_func=rollout_func, callbacks=[StepTimer()])
    trainer.remove_callback(PrinterCallback)
    if rollout_func is None:  # TRL's own generation, timed where it happens
        trainer._generate_single_turn = _timed(trainer._generate_single_turn, times["generation"])
    try:
        trainer.train()
    finally:
        if rollouts is not None:
            rollouts.close()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    keep = slice(a.warmup, None)
    med = {k: statistics.median(v[keep]) for k, v in times.items()}
    med["rest"] = med["step"] - med["generation"] - med["sar"] - med["verifier"]
    return {"median_s": med, "per_step_s": times, "mean_length": lengths}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M-Instruct, fetched once)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (default 4)")
    p.add_argument("--generations", type=int, default=8, help="completions per prompt (default 8)")
    p.add_argument("--max-tokens", type=int, default=96, help="max new tokens (default 96)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per variant (default 1)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per variant (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default="/tmp/bench_grpo_sar", help="trainer output folders")
    p.add_argument("--json", default=None, help="write the results here")
    a = p.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from swift_fast.support.engine_logs import quiet_vllm_logs

    quiet_vllm_logs()
    from swift_fast.demo import arithmetic

    if a.model is None:
        from swift_fast.demo.real_model import fetch_gguf
        from swift_fast.hf.gguf import import_gguf

        a.model = import_gguf(fetch_gguf())
    rows, _ = arithmetic.make_splits(800, 300, seed=0)
    result = {"model": a.model, "settings": {k: v for k, v in vars(a).items() if k not in ("json", "work")},
              "variants": {}}
    for name in VARIANTS:
        print(f"{name} ...", file=sys.stderr, flush=True)
        result["variants"][name] = run_variant(name, a.model, rows, a)
    base = result["variants"][VARIANTS[0]]["median_s"]
    print(f"median seconds per GRPO step ({a.prompts} prompts x {a.generations}, at most {a.max_tokens} tokens); "
          f"ratio of the step to {VARIANTS[0]}'s")
    print(f"{'variant':<22}{'step':>8}{'ratio':>8}{'generation':>12}{'SAR':>8}{'verifier':>10}{'rest':>8}{'length':>8}")
    for name, v in result["variants"].items():
        m = v["median_s"]
        length = statistics.mean(v["mean_length"][a.warmup:])
        v["step_ratio"] = m["step"] / base["step"]
        print(f"{name:<22}{m['step']:>8.2f}{v['step_ratio']:>8.2f}{m['generation']:>12.2f}{m['sar']:>8.2f}"
              f"{m['verifier']:>10.2f}{m['rest']:>8.2f}{length:>8.1f}")
    if a.json:
        os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
