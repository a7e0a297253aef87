"""The RL recipe: GRPO on a real model with rollouts from the plugin, with and without SAR.

``swift-fast demo rl`` (``make real-rl``) trains SmolLM2-135M-Instruct (the real-model recipe's
model, :mod:`.real_model`) with TRL's ``GRPOTrainer`` on the real-model recipe's arithmetic task,
twice from the same start, same seeds, steps and data:

- ``rvr``: the verifiable reward alone, ``R_VR`` (1 when math-verify accepts the answer);
- ``rvr_sar``: ``R_VR + 0.2 R_SA``, the SAR paper's reward.

Both arms generate through :class:`swift_fast.rl.PluginRollouts` (vLLM with the plugin, SAR on,
in this process), so both log SAR; only its weight differs (0 in ``rvr``). Held-out accuracy and
mean response length are measured before training and every ``eval_every`` steps on the same
held-out problems with the same seeds (``eval_n`` samples each at the training temperature).

Each arm resumes: its trainer checkpoints every ``eval_every`` steps (``<out>/<arm>/checkpoints``,
the last one kept) and each evaluation is a file (``<out>/<arm>/eval/step_NNNN.json``) that is
not computed again. ``<out>/report.md`` and ``<out>/rl.png`` then give the curves (reward, SAR,
length and held-out accuracy against steps) and the before/after table with paired 95% intervals
(bootstrap over problems): after minus before in each arm, and ``rvr_sar`` minus ``rvr`` after.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass

from . import arithmetic

#: arm -> weight of R_SA (the SAR paper's alpha is 0.2)
ARMS = {"rvr": 0.0, "rvr_sar": 0.2}


@dataclass
class RLRecipe:
    #: the real-model recipe's splits (the same seed): training prompts are drawn from the first
    #: ``train_problems``, held-out accuracy is measured on the first ``test_problems`` of its test split
    train_problems: int = 800
    test_problems: int = 100
    steps: int = 60
    #: prompts per optimizer step, each sampled ``generations`` times (GRPO's group)
    prompts_per_step: int = 4
    generations: int = 8
    learning_rate: float = 1e-5
    temperature: float = 0.7
    top_p: float = 0.9
    max_completion_length: int = 96
    eval_every: int = 20
    eval_n: int = 4
    seed: int = 0


def _row_prompt(row: dict) -> list[dict]:
    from ..data.templates import render_prompt

    return render_prompt(row, arithmetic.TEMPLATE)


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands commas dropped), or None."""
    found = _NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def answered(texts: list[str], answers: list[str], finish_reasons=None) -> list[bool]:
    """Whether each text answers its problem: math-verify accepts its final answer and the last
    number written in it is the reference (a text cut off at the token limit is wrong).

    NOTE: math-verify evaluates an expression, so "7 + 11" is accepted for 18. A policy rewarded
    by math-verify alone can learn to restate the question as its answer, and with SAR, which
    rewards answers that the question makes likely, it did within 20 steps (docs/rl-run.md): the
    answer has to be written out."""
    from ..grading import grade_many

    ok = grade_many(texts, answers, "math", finish_reasons=finish_reasons)
    return [g and last_number(t) == float(a) for g, t, a in zip(ok, texts, answers)]


def accuracy_reward(completions, answer, finish_reason=None, **kwargs) -> list[float]:
    """``R_VR``: 1.0 when the completion answers its problem (:func:`answered`), else 0.0."""
    from ..hf.rl_adapters import completion_text

    return [float(x) for x in answered([completion_text(c) for c in completions], answer, finish_reason)]


def _evaluate(rollouts, trainer, rows: list[dict], r: RLRecipe) -> dict:
    """Held-out accuracy and length of the policy as it is now: ``eval_n`` samples per problem
    with fixed seeds (the same in every arm and at every step)."""
    from vllm import SamplingParams

    from ..hf.sar import prompt_token_ids

    rollouts.sync(trainer)
    tok = rollouts.tokenizer
    ids = prompt_token_ids(tok, [_row_prompt(x) for x in rows])
    params = [SamplingParams(n=r.eval_n, temperature=r.temperature, top_p=r.top_p,
                             max_tokens=r.max_completion_length, seed=10_000 + i,
                             extra_args={"swift_fast": {"score": False}}) for i in range(len(rows))]
    outs = rollouts.llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
    texts, refs, reasons, lengths = [], [], [], []
    for row, o in zip(rows, outs):
        for c in sorted(o.outputs, key=lambda c: c.index):
            texts.append(tok.decode(list(c.token_ids), skip_special_tokens=True))
            refs.append(row["answer"])
            reasons.append(c.finish_reason)
            lengths.append(len(c.token_ids))
    ok = answered(texts, refs, reasons)
    n = r.eval_n
    return {"step": int(trainer.state.global_step), "ids": [x["id"] for x in rows],
            "examples": [{"question": x["prompt"], "answer": x["answer"], "response": texts[i * n],
                          "correct": ok[i * n]} for i, x in enumerate(rows[:8])],
            "accuracy": [sum(ok[i * n:(i + 1) * n]) / n for i in range(len(rows))],
            "length": [sum(lengths[i * n:(i + 1) * n]) / n for i in range(len(rows))]}


def _callback(arm: str, out: str, rollouts, rows, r: RLRecipe, log):
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        """Evaluations at step 0, every ``eval_every`` steps and at the end; one line a step."""

        trainer = None

        def _eval(self, step: int) -> None:
            path = os.path.join(out, "eval", f"step_{step:04d}.json")
            if os.path.exists(path):
                return
            t = time.perf_counter()
            res = _evaluate(rollouts, self.trainer, rows, r)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path + ".partial", "w") as f:
                json.dump(res, f)
            os.replace(path + ".partial", path)
            acc = 100 * sum(res["accuracy"]) / len(rows)
            log(f"    {arm} step {step:3d}: held-out accuracy {acc:.1f}%, mean length "
                f"{sum(res['length']) / len(rows):.1f} tokens ({time.perf_counter() - t:.0f} s)")

        def on_train_begin(self, args, state, control, **kw):
            if state.global_step == 0:
                self._eval(0)
            self.t = time.perf_counter()
            self.first = state.global_step

        def on_log(self, args, state, control, logs=None, **kw):
            if not logs or "reward" not in logs:
                return
            done = state.global_step - self.first
            rate = (time.perf_counter() - self.t) / max(done, 1)
            log(f"    {arm} step {state.global_step:3d}/{r.steps}: reward {logs['reward']:.3f}, "
                f"R_VR {logs.get('rewards/accuracy_reward/mean', float('nan')):.3f}, "
                f"SAR {logs.get('rewards/sar/mean', float('nan')):+.4f}, "
                f"length {logs.get('completions/mean_length', float('nan')):.1f} ({rate:.0f} s/step)")

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % r.eval_every == 0 or state.global_step == r.steps:
                self._eval(state.global_step)

    return Progress()


def run_arm(arm: str, out: str, model_dir: str, train_rows: list[dict], test_rows: list[dict],
            r: RLRecipe, log=print) -> dict:
    """Train one arm into ``out`` (resuming from its last checkpoint); returns its log history."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from ..rl import PluginRollouts, plugin_sar_reward

    done = os.path.join(out, "history.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    os.makedirs(out, exist_ok=True)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.manual_seed(r.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    rollouts = PluginRollouts(model_dir, dtype="float32", seed=r.seed,
                              max_model_len=1024, kv_cache_memory_bytes=1 << 30)
    ds = datasets.Dataset.from_list([{"prompt": _row_prompt(x), "answer": x["answer"]} for x in train_rows])
    ckpt = os.path.join(out, "checkpoints")
    cfg = GRPOConfig(
        output_dir=ckpt, max_steps=r.steps, per_device_train_batch_size=r.prompts_per_step * r.generations,
        num_generations=r.generations, max_completion_length=r.max_completion_length,
        temperature=r.temperature, top_p=r.top_p, learning_rate=r.learning_rate, seed=r.seed,
        logging_steps=1, save_strategy="steps", save_steps=r.eval_every, save_total_limit=1,
        report_to=[], use_cpu=True, bf16=False, disable_tqdm=True, log_level="warning",
        reward_weights=[1.0, ARMS[arm]],
    )
    sar = plugin_sar_reward()
    cb = _callback(arm, out, rollouts, test_rows, r, log)
    trainer = GRPOTrainer(model=model, reward_funcs=[accuracy_reward, sar], args=cfg, train_dataset=ds,
                          processing_class=tok, rollout_func=rollouts, callbacks=[cb])
    for c in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(c)
    cb.trainer = trainer
    resume = any(d.startswith("checkpoint-") for d in os.listdir(ckpt)) if os.path.isdir(ckpt) else False
    try:
        trainer.train(resume_from_checkpoint=True if resume else None)
    finally:
        rollouts.close()
    history = {"arm": arm, "sar_weight": ARMS[arm], "log_history": trainer.state.log_history}
    with open(done, "w") as f:
        json.dump(history, f)
    return history


def run_rl(out: str = "rl_out", recipe: RLRecipe | None = None, log=print) -> str:
    """Both arms (module docstring) into ``out``; returns the report's path."""
    from ..hf.gguf import import_gguf
    from .real_model import fetch_gguf

    r = recipe or RLRecipe()
    os.makedirs(out, exist_ok=True)
    log("[1] the model")
    folder = import_gguf(fetch_gguf(log))
    train_rows, test_rows = arithmetic.make_splits(r.train_problems, 300, seed=r.seed)
    test_rows = test_rows[: r.test_problems]
    with open(os.path.join(out, "recipe.json"), "w") as f:
        json.dump({"recipe": asdict(r), "model": folder, "arms": ARMS}, f, indent=1)
    log(f"[2] the task: {len(train_rows)} training prompts, {len(test_rows)} held-out problems x {r.eval_n}")
    for i, arm in enumerate(ARMS, start=3):
        log(f"[{i}] GRPO, {arm}: reward R_VR" + (f" + {ARMS[arm]} R_SA" if ARMS[arm] else "") +
            f", {r.steps} steps of {r.prompts_per_step} prompts x {r.generations}")
        t = time.perf_counter()
        run_arm(arm, os.path.join(out, arm), folder, train_rows, test_rows, r, log)
        log(f"    {arm} done in {(time.perf_counter() - t) / 60:.1f} min")
    from .real_rl_report import write_report

    path = write_report(out)
    log(f"[{len(ARMS) + 3}] report: {path}")
    return path
