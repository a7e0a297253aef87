"""The shipped demo artefacts and their fingerprints.

One folder per task (:data:`TASK_DIRS`): ``swift_fast/assets/demo`` (``forget``: the solver
forgets the last term) and ``swift_fast/assets/demo_lag`` (``lag``: it reads the first term twice
and stays one term behind). Layout of each (or of any folder ``swift-fast demo build`` wrote)::

    model/             Llama weights (safetensors), config, generation config, tokenizer
    head.safetensors   the SWIFT head trained on the model's rollouts (``predicting``)
    train.jsonl        the problems whose rollouts trained the head
    test.jsonl         the held-out problems the demo runs on
    provenance.json    recipe, seeds, commands, metrics and the sha256 of every file above
"""

from __future__ import annotations

import json
import os

from ..support.files import sha256_of

_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
ASSETS_DIR = os.path.join(_ROOT, "demo")
#: each demo task's shipped artefacts, in the order the demo runs them
TASK_DIRS = {"forget": ASSETS_DIR, "lag": os.path.join(_ROOT, "demo_lag")}
PROVENANCE = "provenance.json"
HEAD = "head.safetensors"
MODEL = "model"
SPLITS = ("train.jsonl", "test.jsonl")


class AssetError(RuntimeError):
    """The demo artefacts are missing or do not match their recorded fingerprints."""


def artefact_files(root: str) -> list[str]:
    """Every fingerprinted file under ``root`` (relative paths, sorted); provenance excluded."""
    out = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            if rel != PROVENANCE and not f.startswith("."):
                out.append(rel.replace(os.sep, "/"))
    return sorted(out)


def fingerprints(root: str) -> dict[str, dict]:
    return {rel: {"sha256": sha256_of(os.path.join(root, rel)), "bytes": os.path.getsize(os.path.join(root, rel))}
            for rel in artefact_files(root)}


def read_provenance(root: str = ASSETS_DIR) -> dict:
    path = os.path.join(root, PROVENANCE)
    if not os.path.isfile(path):
        raise AssetError(
            f"no demo artefacts at {root} ({PROVENANCE} is missing): "
            f"rebuild them with `swift-fast demo build --out {root}`"
        )
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def verify(root: str = ASSETS_DIR) -> dict:
    """Check every file recorded in the provenance against its sha256; return the provenance.

    Raises ``AssetError`` naming each missing, extra or changed file.
    """
    prov = read_provenance(root)
    want = prov.get("files") or {}
    have = set(artefact_files(root))
    problems = []
    for rel, rec in sorted(want.items()):
        path = os.path.join(root, rel)
        if rel not in have:
            problems.append(f"{rel} is missing")
        elif sha256_of(path) != rec["sha256"]:
            problems.append(f"{rel} has sha256 {sha256_of(path)[:12]}..., provenance records {rec['sha256'][:12]}...")
    extra = sorted(have - set(want))
    problems += [f"{rel} is not recorded in {PROVENANCE}" for rel in extra]
    if problems:
        raise AssetError(
            f"demo artefacts at {root} do not match {PROVENANCE}: " + "; ".join(problems)
            + ". Rebuild them with `swift-fast demo build` (or restore the shipped files)."
        )
    return prov


def read_split(root: str, name: str) -> list[dict]:
    path = os.path.join(root, name)
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise AssetError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
    return out


def write_split(root: str, name: str, problems: list[dict]) -> None:
    with open(os.path.join(root, name), "w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps(p) + "\n")
