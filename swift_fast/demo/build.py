"""``swift-fast demo build``: rebuild the demo artefacts from nothing, on the CPU.

1. problem splits (seeded): held-out test problems, and the training problems whose rollouts
   train the head; the model never sees either;
2. the model, trained from scratch on freshly generated worked solutions (``model.py``);
3. rollouts of the model on the training problems (transformers ``generate``, seeded), graded;
4. the SWIFT head, trained on those rollouts with the project's trainer
   (``swift_fast.hf.train_from_rollouts``);
5. ``provenance.json``: the recipe, the command, library versions, timings, metrics and the
   sha256 of every file.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time

import torch

from . import assets as A
from .backend import Sampling, hf_sample
from .model import train_model
from .recipe import DEFAULT, Recipe
from .tasks import module_for
from .tokenizer import prompt_ids


def splits(recipe: Recipe) -> tuple[list[dict], list[dict]]:
    """``(train, test)`` problem rows: ``id``, ``question``, ``reference``, ``terms``."""
    M = module_for(recipe.task)
    test = M.make_split(recipe.test_problems, recipe.task, seed=recipe.test_seed)
    train = M.make_split(
        recipe.train_problems, recipe.task, seed=recipe.train_seed, exclude={M.question(t) for t in test}
    )

    def rows(name, probs):
        return [
            {"id": f"{name}/{i}", "question": M.question(t), "reference": M.reference(t), "terms": t}
            for i, t in enumerate(probs)
        ]

    return rows("train", train), rows("test", test)


def collect_rollouts(
    model_dir: str, rows: list[dict], recipe: Recipe, path: str, progress: bool = True, batch_prompts: int = 16
) -> str:
    """Sample ``recipe.rollouts_n`` candidates per problem, grade them, write a rollout file."""
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..data.rollouts import Problem, write_rollouts
    from .run import grade

    torch.set_num_threads(recipe.train.threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    sampling = Sampling(n=recipe.rollouts_n, temperature=recipe.temperature, top_p=recipe.top_p,
                        max_new_tokens=recipe.max_new_tokens, seed=recipe.rollouts_seed)
    torch.manual_seed(sampling.seed)
    problems = []
    bar = tqdm(total=len(rows), desc="rollouts", unit="problem", disable=not progress)
    for s in range(0, len(rows), batch_prompts):
        chunk = rows[s : s + batch_prompts]
        prompts = [prompt_ids(tok, r["question"]) for r in chunk]
        for r, p, resps in zip(chunk, prompts, hf_sample(model, tok, prompts, sampling)):
            prob = Problem(id=r["id"], question=r["question"], reference=r["reference"], kind="integer",
                           prompt=tok.decode(p), prompt_token_ids=p,
                           candidates=[{"token_ids": x, "text": tok.decode(x, skip_special_tokens=True),
                                        "finish_reason": "stop" if x and x[-1] == tok.eos_token_id else "length"}
                                       for x in resps])
            grade(prob)
            problems.append(prob)
        bar.update(len(chunk))
    bar.close()
    write_rollouts(path, problems)
    return path


def train_head(
    model_dir: str, rollouts: str, recipe: Recipe, progress: bool = True, cache_dir: str | None = None, **overrides
):
    """The SWIFT head for the model, trained with ``swift_fast.hf.train_from_rollouts`` (which refuses
    rollouts whose labels cannot teach the recipe's loss with ``swift_fast.training.LabelBalanceError``)."""
    from transformers import AutoModelForCausalLM

    from ..hf.train import train_from_rollouts
    from ..training.settings import TrainSettings

    h = dict(recipe.head.__dict__, **overrides)
    torch.set_num_threads(recipe.train.threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    # the shipped demo heads were trained the paper's way (the epoch loop, the kept epoch by validation
    # loss, raw states): rebuilding them reproduces them
    settings = TrainSettings.paper(
        layers=h["layers"], feature=h["feature"], gate=h["gate"], alignment=h["alignment"], loss=h["loss"],
        lr=h["lr"], weight_decay=h["weight_decay"], batch_size=h["batch_size"], max_epochs=h["max_epochs"],
        patience=h["patience"], seed=h["seed"],
    )
    return train_from_rollouts(model, rollouts, settings, progress=progress, model_name="swift-fast-demo",
                               cache_dir=cache_dir)


def build(out: str = A.ASSETS_DIR, work: str = "demo_build", recipe: Recipe = DEFAULT, progress: bool = True,
          reuse: bool = False, log=print) -> dict:
    """Build every artefact into ``out`` (replacing what is there); intermediates go to ``work``.

    ``reuse``: keep the model and rollouts already in ``work`` (from an earlier build with the
    same recipe) and redo only the head and the files.
    """
    import transformers

    from ..hf.train import finite_or_none

    t0 = time.time()
    timings = {}
    os.makedirs(work, exist_ok=True)
    tmp = out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    train_rows, test_rows = splits(recipe)
    A.write_split(tmp, "train.jsonl", train_rows)
    A.write_split(tmp, "test.jsonl", test_rows)
    model_dir = os.path.join(work, "model")
    train_log = os.path.join(work, "model_training.json")
    rollouts = os.path.join(work, "train_rollouts.jsonl")
    if reuse and os.path.isfile(os.path.join(model_dir, "model.safetensors")) and os.path.isfile(train_log):
        log(f"reusing the model in {model_dir}")
    else:
        t = time.time()
        exclude = {r["question"] for r in train_rows + test_rows}
        rows: list = []
        train_model(model_dir, recipe.task, recipe.model, recipe.train, exclude=exclude, progress=progress, log=rows)
        with open(train_log, "w") as f:
            json.dump({"seconds": round(time.time() - t, 1), "log": rows}, f)
        if os.path.exists(rollouts):
            os.remove(rollouts)  # rollouts of an older model
    with open(train_log) as f:
        model_training = json.load(f)
    timings["model_seconds"] = model_training["seconds"]
    if reuse and os.path.isfile(rollouts):
        log(f"reusing the rollouts in {rollouts}")
    else:
        t = time.time()
        collect_rollouts(model_dir, train_rows, recipe, rollouts, progress=progress)
        timings["rollouts_seconds"] = round(time.time() - t, 1)
    t = time.time()
    head, result = train_head(
        model_dir, rollouts, recipe, progress=progress, cache_dir=os.path.join(work, "feature_cache")
    )
    timings["head_seconds"] = round(time.time() - t, 1)
    shutil.copytree(model_dir, os.path.join(tmp, A.MODEL))
    head.save(os.path.join(tmp, A.HEAD))
    prov = {
        "what": module_for(recipe.task).WHAT,
        "task": module_for(recipe.task).NAME,
        "recipe": recipe.to_dict(),
        "commands": [f"swift-fast demo build --task {module_for(recipe.task).NAME}"],
        "sar_system_prompt": recipe.sar_system_prompt,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "platform": platform.platform()},
        "timings": timings,
        "model_training_log": model_training["log"],
        "head": finite_or_none({"best_epoch": result.best_epoch, "epochs_run": result.epochs_run,
                                "val_metrics": result.val_metrics, "baselines": result.baselines,
                                "labels": result.labels}),
        "note": "Training is seeded; bit-identical weights need the same torch build and thread count.",
    }
    prov["files"] = A.fingerprints(tmp)
    with open(os.path.join(tmp, A.PROVENANCE), "w", encoding="utf-8") as f:
        json.dump(prov, f, indent=1, sort_keys=True, default=str, allow_nan=False)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    log(f"wrote {out} ({sum(v['bytes'] for v in prov['files'].values()) / 1e6:.1f} MB) in {time.time() - t0:.0f} s")
    return prov
