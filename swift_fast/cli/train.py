"""`swift-fast train`: train a SWIFT head on graded rollouts."""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings

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


def add_parser(sub, name, help_):
    from ..training import LOSSES
    from ..training.probe import DEFAULT_FOLDS, DEFAULT_LAMBDAS

    p = sub.add_parser(
        name, help=help_, description=DESCRIPTION, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True,
                   help="Hugging Face model name or path, or a .gguf file (the model that generated the rollouts)")
    p.add_argument("--rollouts", required=True,
                   help="rollout JSONL: prompt_token_ids, candidates with token_ids and correct")
    p.add_argument("--out", required=True, help="head file to write (.safetensors)")
    p.add_argument("--layers", default="all",
                   help="hidden states to read: all, lastN (e.g. last4) or indices 0,8,16 (default all)")
    p.add_argument("--feature", choices=("hidden", "logits"), default="hidden",
                   help="hidden states (default) or the final logits")
    p.add_argument("--no-gate", action="store_true", help="plain mean of token rewards instead of the gated average")
    p.add_argument("--alignment", choices=("predicting", "emitted"), default="predicting",
                   help="score token r_j with the state that predicted it (default) "
                        "or where it is the input (the paper's)")
    p.add_argument("--solver", choices=("auto", "probe", "adamw"), default="auto",
                   help="probe: the ungated head as a cross-validated logistic regression on mean states; adamw: "
                        "the paper's epoch loop (gated unless --no-gate; every --loss); auto (default): probe for "
                        "--loss bce, else adamw")
    p.add_argument("--lambdas", default=",".join(f"{x:g}" for x in DEFAULT_LAMBDAS),
                   help="probe: L2 strengths to choose from by cross-validation (default %(default)s)")
    p.add_argument("--folds", type=int, default=DEFAULT_FOLDS,
                   help="probe: cross-validation folds over the training problems (default %(default)s)")
    p.add_argument("--loss", choices=LOSSES, default="bce", help="training loss (default bce)")
    p.add_argument("--alpha", type=float, default=0.01, help="temperature of InfoNCA/NCA targets (default 0.01)")
    p.add_argument("--lr", type=float, default=1e-4, help="adamw: learning rate (default 1e-4)")
    p.add_argument("--weight-decay", type=float, default=1e-5, help="adamw: weight decay (default 1e-5)")
    p.add_argument("--batch-size", type=int, default=16, help="adamw: sequences per step (default 16)")
    p.add_argument("--epochs", type=int, default=20,
                   help="most epochs (default 20; early stopping usually ends sooner)")
    p.add_argument("--patience", type=int, default=3,
                   help="epochs without a better validation figure (see --select) before stopping (default 3)")
    p.add_argument("--standardize", action=argparse.BooleanOptionalAction, default=True,
                   help="train on states centred and scaled per dimension over the training tokens, folded "
                        "back into an ordinary head at the end (default: on; --no-standardize trains on raw "
                        "states, as the paper does)")
    p.add_argument("--select", choices=("auto", "pairs", "loss"), default="auto",
                   help="which epoch is kept and when to stop: pairs, the highest within-problem AUC on "
                        "validation (how well the head ranks the candidates of one problem, which is what "
                        "Best-of-N uses); loss, the lowest validation loss (the paper's); auto (default): pairs "
                        "when a validation problem has both a correct and an incorrect candidate, else loss")
    p.add_argument("--val-fraction", type=float, default=0.2,
                   help="share of problems held out for validation (default 0.2)")
    p.add_argument("--seed", type=int, default=0, help="seed of split, initial weights and batch order (default 0)")
    p.add_argument("--cache-dir",
                   help="keep features in a memory-mapped file here: the head's states of the response tokens "
                        "in bfloat16 (logits in float32); its size is printed before it is written")
    p.add_argument("--dtype", default="auto",
                   help="auto (checkpoint dtype on GPU, float32 on CPU), bfloat16, float16, float32")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run(args) -> int:
    from ..data.datasets import DataError
    from ..hf.features import UnsupportedModelError
    from ..rewards.head import HeadError

    try:
        from transformers import AutoConfig

        from ..hf.loading import check_supported_config, load_model
        from ..hf.train import check_rollouts, describe_cache, feature_cache_plan
        from ..training import LabelShareWarning, label_share_warning, whole_balance

        # the config and the rollout file alone decide these refusals: make them before a long model load
        config = AutoConfig.from_pretrained(args.model)
        check_supported_config(config, args.model)
        balance = check_rollouts(args.rollouts, args.loss, args.val_fraction, args.seed)
        notes = [label_share_warning(whole_balance(balance))]
        if solver_of(args) == "probe":
            if args.loss != "bce":
                raise ValueError(f"the probe fits the bce loss only: --solver adamw trains with --loss {args.loss}")
            lambdas_of(args.lambdas)
            if args.folds < 2:
                raise ValueError(f"--folds must be at least 2, got {args.folds}")
            from ..training.probe import check_probe_split

            notes.append(check_probe_split(balance, args.folds))
        for note in filter(None, notes):
            print(f"warning: {note}", file=sys.stderr)
        if args.cache_dir:
            plan = feature_cache_plan(args.rollouts, config, args.layers, args.feature)
            print(describe_cache(args.cache_dir, plan["rows"], plan["k"], plan["d"], plan["dtype"]), file=sys.stderr)
        model, _ = load_model(args.model, args.dtype, args.device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LabelShareWarning)  # said above, before the model load
            head, result = _train(args, model)
    except (DataError, HeadError, UnsupportedModelError, ValueError, FloatingPointError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from ..hf.train import finite_or_none
    from ..training import format_baselines

    head.save(args.out)
    vm = result.val_metrics
    threshold = "" if args.loss in ("bce", "hinge") else f"; the {args.loss} loss sets no threshold"
    if result.fit:
        f = result.fit
        how = (f"probe, L2 strength {f['lambda']:g} of {', '.join(f'{x:g}' for x in f['lambdas'])} "
               f"({f['folds']}-fold cross-validation), refitted on {f['candidates']} candidates")
    else:
        how = (f"best epoch {result.best_epoch} of {result.epochs_run}"
               f"{' (stopped early)' if result.stopped_early else ''}")
    print(
        f"wrote {args.out}: {how}; validation loss {vm['loss']:.4f}; "
        f"at R > 0 (predicting correct{threshold}): balanced accuracy {_fig(vm['balanced_accuracy'])}, "
        f"precision {_fig(vm['precision'])}, recall {_fig(vm['recall'])}"
    )
    print(format_baselines(result.baselines))
    print(json.dumps(finite_or_none(
        {"best_epoch": result.best_epoch, "fit": result.fit or None, "val": vm, "baselines": result.baselines,
         "labels": result.labels}
    ), default=str))
    return 0


def _fig(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"


def solver_of(args) -> str:
    return args.solver if args.solver != "auto" else ("probe" if args.loss == "bce" else "adamw")


def lambdas_of(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--lambdas takes comma-separated numbers, got {text!r}") from None
    if not values or any(not (v > 0 and math.isfinite(v)) for v in values):
        raise ValueError(f"--lambdas takes positive finite strengths, got {text!r}")
    return values


def _train(args, model):
    from ..hf.train import train_from_rollouts

    solver = solver_of(args)
    return train_from_rollouts(
        model,
        args.rollouts,
        solver=solver,
        lambdas=lambdas_of(args.lambdas),
        folds=args.folds,
        layers=args.layers,
        feature=args.feature,
        gate=False if args.no_gate else None,
        alignment=args.alignment,
        loss=args.loss,
        lr=args.lr,
        weight_decay=args.weight_decay,
        batch_size=args.batch_size,
        max_epochs=args.epochs,
        patience=args.patience,
        val_fraction=args.val_fraction,
        seed=args.seed,
        alpha=args.alpha,
        cache_dir=args.cache_dir,
        progress=not args.no_progress,
        model_name=args.model,
        select=args.select,
        standardize=args.standardize,
    )
