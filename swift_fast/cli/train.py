"""`swift-fast train`: train a SWIFT head on graded rollouts."""

from __future__ import annotations

import argparse
import json
import sys

DESCRIPTION = """\
Train a SWIFT head (a gated linear map over the model's hidden states) on graded rollouts.
Defaults are the SWIFT paper's (appendix D.3): AdamW lr 1e-4, weight decay 1e-5, batches of 16
sequences, binary cross-entropy with logits on the score R, an 80/20 train/validation split by
problem (the candidates of one problem never straddle it), early stopping with patience 3 on the
validation loss, keeping the weights of the best epoch.

Features are recomputed from the model batch by batch (no hidden states on disk); --cache-dir
keeps them in a memory-mapped file for later epochs (bit-exact; suits small models). Runs are
seeded (--seed): the split, the initial weights and the batch order are reproducible.
The head file records model, data, label balance, loss, best epoch and validation metrics.

Before loading the model the labels of both splits are checked: bce and hinge need correct and
incorrect candidates in each split; dpo, infonca and nca need, in each split, a problem with both.
Rollouts that cannot teach (every candidate wrong, say) are refused with their counts.
"""

EXAMPLES = """\
examples:
  swift-fast train --model Qwen/Qwen2.5-7B-Instruct --rollouts rollouts.jsonl --out head.safetensors
  swift-fast train --model M --rollouts R --out H --layers last4 --loss dpo
  swift-fast train --model M --rollouts R --out H --feature logits --no-gate --alignment emitted
"""


def add_parser(sub, name, help_):
    from ..training import LOSSES

    p = sub.add_parser(
        name, help=help_, description=DESCRIPTION, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True,
                   help="Hugging Face model name or path (the model that generated the rollouts)")
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
    p.add_argument("--loss", choices=LOSSES, default="bce", help="training loss (default bce)")
    p.add_argument("--alpha", type=float, default=0.01, help="temperature of InfoNCA/NCA targets (default 0.01)")
    p.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4)")
    p.add_argument("--weight-decay", type=float, default=1e-5, help="AdamW weight decay (default 1e-5)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument("--epochs", type=int, default=20,
                   help="most epochs (default 20; early stopping usually ends sooner)")
    p.add_argument("--patience", type=int, default=3,
                   help="epochs without a better validation loss before stopping (default 3)")
    p.add_argument("--val-fraction", type=float, default=0.2,
                   help="share of problems held out for validation (default 0.2)")
    p.add_argument("--seed", type=int, default=0, help="seed of split, initial weights and batch order (default 0)")
    p.add_argument("--cache-dir", help="keep features in a memory-mapped file here (small models)")
    p.add_argument("--dtype", default="auto",
                   help="auto (checkpoint dtype on GPU, float32 on CPU), bfloat16, float16, float32")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run(args) -> int:
    from ..datasets import DataError
    from ..head import HeadError
    from ..hf.features import UnsupportedModelError

    try:
        from transformers import AutoConfig

        from ..hf.loading import check_supported_config, load_model
        from ..hf.train import check_rollouts, train_from_rollouts

        # the config and the rollout file alone decide these refusals: make them before a long model load
        check_supported_config(AutoConfig.from_pretrained(args.model), args.model)
        check_rollouts(args.rollouts, args.loss, args.val_fraction, args.seed)
        model, _ = load_model(args.model, args.dtype, args.device)
        head, result = train_from_rollouts(
            model,
            args.rollouts,
            layers=args.layers,
            feature=args.feature,
            gate=not args.no_gate,
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
        )
    except (DataError, HeadError, UnsupportedModelError, ValueError, FloatingPointError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    head.save(args.out)
    vm = result.val_metrics
    print(
        f"wrote {args.out}: best epoch {result.best_epoch} of {result.epochs_run}"
        f"{' (stopped early)' if result.stopped_early else ''}; validation loss {vm['loss']:.4f}, "
        f"accuracy {vm['accuracy']:.3f}, AUC {vm['auc']:.3f}, BoN@all {vm['bon']:.3f} "
        f"(random {vm['random']:.3f}, oracle {vm['oracle']:.3f})"
    )
    print(json.dumps({"best_epoch": result.best_epoch, "val": vm, "labels": result.labels}, default=str))
    return 0
