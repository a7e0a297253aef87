"""`swift-fast import-head`: a SWIFT paper reference checkpoint (.pt) as a swift-fast head file."""

from __future__ import annotations

import os
import sys

DESCRIPTION = """\
Convert a head trained with the SWIFT paper's code (github.com/aster2024/SWIFT,
train/extract_train.py: torch.save of a LinearRewardModel's state dict) into a swift-fast head
(.safetensors), usable by `swift-fast score`, `bon`, `serve` and the vLLM plugin.

Pass the options the checkpoint was trained with: the file records only its weights.
  --layers      the reference's --layers (default: all hidden states, embeddings included).
                Given in any order: the reference concatenates states in ascending order.
  --apply-norm  the reference's --apply_norm: the model's final RMSNorm was applied to every
                selected state; its gain is folded into the head and each state is RMS-normalised
                when scored (norm weight read from the model's safetensors files, nothing else).
  --logits      the reference's --logits_mode: the features are the final logits.
With or without gate (--disable_gate) is read from the checkpoint.

The head scores each response token with its own states (alignment "emitted", the paper's
definition). The checkpoint is read with torch.load(weights_only=True): a file that would need
to run code to unpickle is refused, as is the reference's unfinished dimension-reduction mode.
Only the model's config (and, with --apply-norm, its final norm weight) is read.
"""

EXAMPLES = """\
examples:
  swift-fast import-head reward_model_ce.pt --model meta-llama/Llama-3.2-3B-Instruct
  swift-fast import-head reward_model_ce_norm.pt --model M --apply-norm --out head.safetensors
  swift-fast import-head ckpt.pt --model M --layers 8 16 24 28     # trained with --layers 8 16 24 28
  swift-fast import-head ckpt.pt --model M --logits                # trained with --logits_mode
"""


def add_parser(sub, name, help_):
    from . import options

    p = options.command(sub, name, help_, DESCRIPTION, EXAMPLES)
    p.add_argument("checkpoint", metavar="CKPT", help="the reference checkpoint (.pt)")
    p.add_argument("--model", required=True, help="Hugging Face model name or path the checkpoint was trained on")
    options.add_layers(p, "the reference's --layers: indices (8 16 24 or 8,16,24, as `train --layers`), lastN, or "
                          "all (the default)")
    p.add_argument("--apply-norm", action="store_true", help="trained with --apply_norm (final norm on every state)")
    p.add_argument("--logits", action="store_true", help="trained with --logits_mode (features are the final logits)")
    p.add_argument("--out", help="head file to write (default: CKPT with the suffix .safetensors)")
    return p


def run(args) -> int:
    from ..hf.features import UnsupportedModelError
    from ..rewards.head import HeadError

    try:
        from transformers import AutoConfig

        from ..hf.loading import check_supported_config
        from ..hf.reference_heads import check_options, import_reference_checkpoint, read_final_norm_weight

        layers = args.layers  # one text, 8,16,24 (options.add_layers)
        check_options(layers=layers, apply_norm=args.apply_norm, logits=args.logits)
        out = args.out or os.path.splitext(args.checkpoint)[0] + ".safetensors"
        if os.path.abspath(out) == os.path.abspath(args.checkpoint):
            raise HeadError(f"--out {out} is the checkpoint itself: choose another file")
        if _looks_like_path(args.model) and not os.path.isdir(os.path.expanduser(args.model)):
            raise OSError(f"--model {args.model}: no such model folder")  # not transformers' "repo id" riddle
        config = AutoConfig.from_pretrained(args.model)
        check_supported_config(config, args.model)
        norm = read_final_norm_weight(args.model) if args.apply_norm else None
        head = import_reference_checkpoint(
            args.checkpoint, config, layers=layers, apply_norm=args.apply_norm, logits=args.logits,
            norm_weight=norm, model_name=args.model,
        )
        head.save(out)
    except (HeadError, UnsupportedModelError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    src = head.provenance["source"]
    d, k = head.hidden_size, len(head.layers)
    print(f"imported {args.checkpoint} (sha256 {src['sha256'][:16]}...) for {args.model}")
    if head.feature == "logits":
        print(f"  features   final logits, D = {d} (vocabulary)")
    else:
        print(f"  layers     {head.layers}")
        if src["D"] == k * d:
            print(f"  features   D = {src['D']} = hidden size {d} x {k} layers")
        else:  # two spellings of one state were merged (see the notes)
            print(f"  features   D = {src['D']} = hidden size {d} x {src['D'] // d} indices, {k} distinct states")
    print(f"  gate       {'yes: gated average of token rewards' if head.gate else 'no: plain mean of token rewards'}")
    print("  alignment  emitted (each response token scored with its own states, as the paper)")
    if head.norm_eps is not None:
        print(f"  norm       final RMSNorm of every state (eps {head.norm_eps:g}), gain folded into the weights")
    else:
        print("  norm       none")
    for note in head.provenance.get("notes", []):
        print(f"  note: {note}")
    print(f"wrote {out}")
    return 0


def _looks_like_path(model: str) -> bool:
    # a Hub name is "name" or "owner/name"; anything else can only be a folder
    return os.path.isabs(model) or model.startswith((".", "~")) or model.count("/") > 1
