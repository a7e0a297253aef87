"""File digests, shared by head provenance, the vLLM compile-cache key and the demo assets."""

from __future__ import annotations

import hashlib
import os


def sha256_of(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
