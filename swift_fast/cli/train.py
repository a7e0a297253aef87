"""`swift-fast train`: train a SWIFT head on graded rollouts.

Parses and prints only: the training options are ``swift_fast.training.TrainSettings``' fields
(their defaults, choices and help come from there: ``add_settings``), the job is
``swift_fast.jobs.train`` (``plan_train`` before the model loads, ``run_train``)."""

from __future__ import annotations

import argparse
import json
import math
import sys

DESCRIPTION = """\
Train a SWIFT head (a linear map over the model's hidden states) on graded rollouts.

Two solvers (--solver; default auto: the probe for the bce loss, the epoch loop for the others):

probe -- the ungated head (the plain mean of token rewards), whose score is linear in each
candidate's states averaged over its tokens, fitted as an L2-regularised logistic regression by
L-BFGS: convex, so one optimum, no learning rate, epochs or seed. The L2 strength (--lambdas) is
chosen by cross-validation over the training problems (--folds), by how well the out-of-fold
scores rank each problem's candidates (by their loss where no problem has both kinds of
candidate, e.g. one candidate per problem); the head is measured on the validation problems and then
refitted on every problem. One pass of the model over the candidates; no feature cache needed.
On SmolLM2-135M-Instruct (800 problems x 16) it scored 41.3% held-out BoN@16 against 40.7% for
the epoch loop below and 39.3% for the paper's recipe, and it gives the same head on every run
(docs/real-model.md). Memory: one pooled vector per candidate (candidates x states x hidden size,
float32), twice that while fitting.

adamw -- the SWIFT paper's (appendix D.3): the gated head, AdamW lr 1e-4, weight decay 1e-5,
batches of 16 sequences, binary cross-entropy with logits on the score R (or --loss), an 80/20
train/validation split by problem, early stopping with patience 3 keeping the weights of the
best epoch -- with two changes measured on a real model: the states are standardised per
dimension over the training tokens and the scaling folded back into the head (--no-standardize:
raw states), and the kept epoch is the one with the best within-problem AUC on validation, the
ranking Best-of-N uses, when a validation problem has both kinds of candidate (--select loss: the
lowest validation loss, the paper's).

Both split the problems 80/20 (--val-fraction; the candidates of one problem never straddle it)
and report on the validation problems, with a head that did not see them.

Features are recomputed from the model batch by batch (no hidden states on disk); for the epoch
loop --cache-dir keeps them in a memory-mapped file for later epochs: only the head's selected states of the
response tokens, in bfloat16 (logits in float32), so the head trains on features rounded once to
bfloat16. Its size is printed before it is written, and a cache larger than the free disk is
refused. Runs are seeded (--seed): the split, the initial weights and the batch order are
reproducible.

After training, the head is set beside what needs no training, on the same validation
candidates: its AUC and Best-of-N beside those of the response length (in the direction the
validation data favours, which flatters length) and of the model's mean log-prob of the response,
random and oracle picks, then a verdict from a paired bootstrap over validation problems of the
within-problem AUC difference (how well each ranks one problem's candidates, what Best-of-N uses)
between the head and the better free baseline. The head at R > 0 is summed up
by balanced accuracy, precision and recall of "correct". The head file records model, data,
label balance, loss, best epoch, validation metrics and these baselines.

Before loading the model the labels of both splits are checked: bce and hinge need correct and
incorrect candidates in each split; dpo, infonca and nca need, in each split, a problem with both.
Rollouts that cannot teach (every candidate wrong, say) are refused with their counts; rollouts
that teach little (under 10% correct or over 90%, or fewer than 10 of a kind) get a warning.
"""

EXAMPLES = """\
examples:
  swift-fast train --model Qwen/Qwen2.5-7B-Instruct --rollouts rollouts.jsonl --out head.safetensors
  swift-fast train --model M --rollouts R --out H --layers last4 --loss dpo
  swift-fast train --model M --rollouts R --out H --solver adamw   # the paper's gated head
  swift-fast train --model M --rollouts R --out H --feature logits --no-gate --alignment emitted
"""


def _shown(value) -> str:
    """A default as a user types it: ``1e-4`` rather than ``0.0001``, strengths comma-separated."""
    if isinstance(value, (tuple, list)):
        return ",".join(f"{v:g}" for v in value)
    if isinstance(value, float):
        plain, sci = f"{value:g}", f"{value:.0e}".replace("e-0", "e-").replace("e+0", "e")
        return sci if len(sci) < len(plain) and float(sci) == value else plain
    return str(value)


def add_settings(p) -> None:
    """The ``TrainSettings`` fields as options, each with the field's default, choices and help."""
    from dataclasses import fields

    from ..training.settings import TrainSettings
    from .options import add_layers

    for f in fields(TrainSettings):
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        text = f.metadata["help"]
        if f.name == "layers":  # one syntax with import-head's: 0 8 16 or 0,8,16
            add_layers(p, f"{text}; on the command line 0 8 16 or 0,8,16 (default {f.default})", default=f.default,
                       flag=flag)
        elif f.name == "gate":  # --no-gate: gate=False; left out, None takes the solver's
            p.add_argument(flag, dest="gate", action="store_const", const=False, default=None, help=text)
        elif isinstance(f.default, bool):
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default,
                           help=f"{text} (default {'on' if f.default else 'off'})")
        else:
            # a string default goes through ``type`` as typed text would; lambdas stay text (``lambdas_of``)
            kind = type(f.default) if isinstance(f.default, (int, float)) else str
            metavar = flag.lstrip("-").replace("-", "_").upper() if "flag" in f.metadata else None
            p.add_argument(flag, dest=f.name, type=kind, default=_shown(f.default), choices=f.metadata.get("choices"),
                           metavar=metavar, help=f"{text} (default %(default)s)")


def add_parser(sub, name, help_):
    from .options import add_dtype, add_no_progress, command

    p = command(sub, name, help_, DESCRIPTION, EXAMPLES)
    p.add_argument("--model", required=True,
                   help="Hugging Face model name or path, or a .gguf file (the model that generated the rollouts)")
    p.add_argument("--rollouts", required=True,
                   help="rollout JSONL: prompt_token_ids, candidates with token_ids and correct")
    p.add_argument("--out", required=True, help="head file to write (.safetensors)")
    add_settings(p)
    p.add_argument("--cache-dir",
                   help="keep features in a memory-mapped file here: the head's states of the response tokens "
                        "in bfloat16 (logits in float32); its size is printed before it is written")
    add_dtype(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    add_no_progress(p)
    return p


def settings_of(args):
    """The ``TrainSettings`` of parsed options (``--lambdas`` parsed by ``lambdas_of``)."""
    from dataclasses import fields

    from ..training.settings import TrainSettings

    values = {f.name: getattr(args, f.name) for f in fields(TrainSettings)}
    values["lambdas"] = lambdas_of(args.lambdas)
    return TrainSettings(**values)


def run(args) -> int:
    from ..data.datasets import DataError
    from ..hf.features import UnsupportedModelError
    from ..rewards.head import HeadError

    try:
        from ..jobs.train import plan_train, run_train

        # the config and the rollout file alone decide these refusals: made before a long model load
        plan = plan_train(args.model, args.rollouts, settings_of(args), args.cache_dir)
        for note in plan.warnings:
            print(f"warning: {note}", file=sys.stderr)
        if plan.cache:
            print(plan.cache, file=sys.stderr)
        job = run_train(plan, args.out, args.dtype, args.device, progress=not args.no_progress)
    except (DataError, HeadError, UnsupportedModelError, ValueError, FloatingPointError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    _print_result(job.head_path, args.loss, job.result, job.card_path, job.head.selector)
    return 0


def _print_result(out: str, loss: str, result, card: str | None = None, selector: dict | None = None) -> None:
    from ..hf.train import finite_or_none
    from ..training.baselines import format_baselines

    vm = result.val_metrics
    threshold = "" if loss in ("bce", "hinge") else f"; the {loss} loss sets no threshold"
    if result.fit:
        f = result.fit
        how = (f"probe, L2 strength {f['lambda']:g} of {', '.join(f'{x:g}' for x in f['lambdas'])} "
               f"({f['folds']}-fold cross-validation), refitted on {f['candidates']} candidates")
    else:
        how = (f"best epoch {result.best_epoch} of {result.epochs_run}"
               f"{' (stopped early)' if result.stopped_early else ''}")
    print(
        f"wrote {out}: {how}; validation loss {vm['loss']:.4f}; "
        f"at R > 0 (predicting correct{threshold}): balanced accuracy {_fig(vm['balanced_accuracy'])}, "
        f"precision {_fig(vm['precision'])}, recall {_fig(vm['recall'])}"
    )
    print(format_baselines(result.baselines))
    if selector:
        from ..training.recommend import describe

        print(describe(selector) + "; bon, eval, serve and the plugin select by it unless --select (\"select\") "
              "says otherwise")
    if card:  # before the JSON line, which stays last
        print(f"model card: {card} (`swift-fast head info {out}` shows what the head holds; "
              "`swift-fast head push` uploads both)")
    print(json.dumps(finite_or_none(
        {"best_epoch": result.best_epoch, "fit": result.fit or None, "val": vm, "baselines": result.baselines,
         "labels": result.labels, "selector": selector}
    ), default=str))


def _fig(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"


def lambdas_of(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--lambdas takes comma-separated numbers, got {text!r}") from None
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise ValueError(f"--lambdas takes positive finite strengths, got {text!r}")
    return values
