"""`swift-fast import-model`: a GGUF checkpoint as a Hugging Face folder, converted once and checked."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Convert a GGUF checkpoint (the one-file format of llama.cpp and Ollama) into a Hugging Face
model folder that vLLM, the swift-fast plugin and the Hugging Face path all read. transformers
reads the file and dequantizes every tensor (the gguf package must be installed:
pip install 'swift-fast[gguf]'); the tokenizer and chat template are the file's own.

The conversion is checked before it is kept: the folder read back from disk must give the same
logits as the dequantized GGUF model on a chat-templated prompt (to the bit). The folder goes to
the cache (named after the file's SHA-256 under $SWIFT_FAST_CACHE/models, default
~/.cache/swift-fast/models) unless --out names one, and a second import of the same file
returns it at once. Every command that takes --model also takes a .gguf file and does this
itself on first use; this command does it ahead of time or into a folder of your choice.

Architectures: llama, mistral, qwen2, qwen3 (the families swift-fast's heads score). Quantization
types: whatever the installed gguf package dequantizes (F32, F16, BF16, Q4_0 ... Q8_0, the K
and IQ types); anything else is refused with its name before any work is done.
"""

EXAMPLES = """\
examples:
  swift-fast import-model SmolLM2-135M-Instruct.Q4_1.gguf
  swift-fast import-model model.Q4_K_M.gguf --out models/m --dtype bfloat16
  swift-fast collect --model model.Q4_K_M.gguf --data gsm8k --n 8 --out r.jsonl   # imports on first use
"""


def add_parser(sub, name, help_):
    from ..hf.gguf import DTYPES

    p = sub.add_parser(
        name, help=help_, description=DESCRIPTION, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("gguf", help="the .gguf file")
    p.add_argument("--out", help="folder to write (default: the cache folder of this file)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="what the weights are stored in (default float32: the dequantized values exactly, "
                        "4 bytes a parameter; bfloat16 halves that and rounds each weight once)")
    p.add_argument("--force", action="store_true", help="convert again even when the cache holds this file")
    return p


def run(args) -> int:
    from ..hf.gguf import GGUFError, import_gguf

    try:
        folder = import_gguf(args.gguf, out=args.out, dtype=args.dtype, force=args.force)
    except (GGUFError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(folder)
    return 0
