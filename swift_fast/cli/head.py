"""`swift-fast head`: what a head holds and what it was trained on (``info``), and publishing it
on the Hugging Face Hub (``push``). The work is ``swift_fast.hf.hub``'s; this module parses and prints."""

from __future__ import annotations

import json
import sys

DESCRIPTION = """\
A head is named by a file, a folder holding head.safetensors, or a Hugging Face Hub repository
id: org/name, org/name@REVISION (a branch, tag or commit) and org/name:FILE or
org/name@REVISION:FILE for a file other than head.safetensors. A path that exists wins over a
repository id. A Hub head is fetched into the Hugging Face cache once; with HF_HUB_OFFLINE=1 only
the cache is read. --head of `bon`, `serve` and `score` and the plugin's "head" take the same.

  info   what the head holds (format, model and fingerprint, hidden size, layers, gate,
         alignment, feature, parameter count) and what it was trained on (data, sizes, solver
         and its strength or epochs, validation figures, the verdict against the free baselines)
  push   publish the head as a Hub repository: head.safetensors and a model card (README.md);
         --to-folder writes that repository into a folder instead of uploading it
"""

EXAMPLES = """\
examples:
  swift-fast head info head.safetensors
  swift-fast head info org/name@v1 --json
  swift-fast head push head.safetensors org/qwen2.5-7b-gsm8k-swift --private
  swift-fast head push head.safetensors org/name --to-folder repo/   # the repository, written locally
"""


def add_parser(sub, name, help_):
    from .options import command

    p = command(sub, name, help_, DESCRIPTION, EXAMPLES)
    inner = p.add_subparsers(dest="head_command", metavar="SUBCOMMAND", required=True)
    info = inner.add_parser("info", help="what a head holds and what it was trained on",
                            description="Print what a head holds and what it was trained on.")
    info.add_argument("head", metavar="FILE|REPO", help="head file, folder, or org/name[@revision][:file]")
    info.add_argument("--json", action="store_true", help="everything as JSON (the provenance in full)")
    push = inner.add_parser(
        "push", help="publish a head and its model card on the Hugging Face Hub",
        description="Upload HEAD as the Hub repository REPO: head.safetensors and README.md, a model card made "
        "from the head's metadata (the card `swift-fast train` wrote beside the head, <head stem>.md, "
        "when it was edited). Needs a Hub token (huggingface-cli login or HF_TOKEN).",
    )
    push.add_argument("head", metavar="HEAD", help="head file, folder, or org/name[@revision][:file]")
    push.add_argument("repo", metavar="REPO", help="the repository to publish to: org/name")
    push.add_argument("--revision", help="branch to commit to (created when missing; default main)")
    push.add_argument("--private", action="store_true", help="create the repository private")
    push.add_argument("--to-folder", metavar="DIR",
                      help="write the repository's files into DIR instead of uploading (an empty or new folder)")
    return p


def run(args) -> int:
    from ..hf.hub import HubHeadError
    from ..rewards.head import HeadError

    try:
        return _info(args) if args.head_command == "info" else _push(args)
    except (HubHeadError, HeadError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _info(args) -> int:
    from ..hf.hub import format_head_info, head_summary, locate_head
    from ..rewards.head import SwiftHead

    loc = locate_head(args.head)
    summary = head_summary(SwiftHead.load(loc.path), loc)
    print(json.dumps(summary, indent=2, default=str) if args.json else format_head_info(summary))
    return 0


def _push(args) -> int:
    from ..hf.hub import push_head, write_repo_folder

    if args.to_folder:
        done = write_repo_folder(args.head, args.repo, args.to_folder)
        print(f"wrote the repository {args.repo} into {done['folder']}: {done['head']} (sha256 "
              f"{done['sha256'][:16]}...) and {done['card']} (card {done['card_source']}); upload it with "
              f"`swift-fast head push {args.head} {args.repo}`")
        return 0
    done = push_head(args.head, args.repo, revision=args.revision, private=args.private)
    where = args.repo + (f"@{args.revision}" if args.revision else "")
    print(f"pushed {args.head} to {where} (card {done['card_source']}): {done['url']}\nuse it with --head {where}")
    return 0
