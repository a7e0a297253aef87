"""Which model: the identity of the model a job sampled from or a head was trained on.

One rule, used by the run records of resumable jobs (``swift_fast.jobs.run_record``: a rerun with
another model must not resume) and by a trained head's provenance (``swift_fast.hf.train``: what
``swift-fast head info`` and the model card say it was trained on):

- a Hub name (``org/name``): the commit it resolves to, read from the local Hugging Face cache
  (what an offline load reads) or, for a job, asked of the Hub (:func:`hub_revision`);
- a local folder or file: :func:`model_digest` of its files.

``model_digest`` is chosen to be cheap on every run and still catch a changed model: every file of
the folder with its size, hashed whole up to :data:`WHOLE_FILE_LIMIT` (configs, tokenizers, chat
templates, small weights), else by its first and last :data:`END_BYTES` (weight shards: hashing
gigabytes on every rerun costs more than it protects). NOTE: a shard rewritten in place with the
same size, first and last MiB goes unnoticed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from ..support.files import sha256_of
from .hub import commit_of_path, hub_cache_dir, hub_offline

#: files up to this size are hashed whole in a model digest; larger ones by their ends
WHOLE_FILE_LIMIT = 64 << 20
#: how much of each end of a larger file its digest reads
END_BYTES = 1 << 20

#: a Hugging Face Hub model id: ``name`` or ``owner/name``
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def model_digest(path: str) -> str:
    """Hex sha256 over every file of a model folder (or of one model file): each file's path
    relative to the folder, its size, and the sha256 of its bytes up to :data:`WHOLE_FILE_LIMIT`,
    else of its first and last :data:`END_BYTES`, as the JSON list ``[[path, size, sha256], ...]``
    (no spaces). Links are followed (the Hugging Face cache's snapshots are links); names starting
    with a dot are skipped."""
    path = os.fspath(path)
    if os.path.isfile(path):
        files = [(os.path.basename(path), path)]
    else:
        files = []
        for folder, dirs, names in os.walk(path, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(names):
                if not name.startswith("."):
                    full = os.path.join(folder, name)
                    files.append((os.path.relpath(full, path).replace(os.sep, "/"), full))
    rows = []
    for rel, full in files:
        size = os.path.getsize(full)
        rows.append([rel, size, sha256_of(full) if size <= WHOLE_FILE_LIMIT else _ends_sha256(full, size)])
    return hashlib.sha256(json.dumps(rows, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _ends_sha256(path: str, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(END_BYTES))
        f.seek(size - END_BYTES)
        h.update(f.read(END_BYTES))
    return h.hexdigest()


def cached_revision(name: str, revision: str | None = None) -> str | None:
    """The commit of the Hub model ``name`` (at ``revision``, None: main) in the local cache, else None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(name, "config.json", revision=revision, cache_dir=hub_cache_dir())
    return commit_of_path(found) if isinstance(found, str) else None


def hub_revision(name: str, revision: str | None = None) -> str:
    """The commit the Hub model ``name`` at ``revision`` (None: main) resolves to: from the local
    Hugging Face cache when it holds the model (what an offline load reads), else from the Hub.

    NOTE: an online load may fetch a newer commit than the cache's ``main``; the next rerun then
    sees the new commit and refuses, which is the point."""
    commit = cached_revision(name, revision)
    if commit:
        return commit
    why = "HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set and the local cache does not have it"
    if not hub_offline():
        from huggingface_hub import HfApi

        try:
            return HfApi().model_info(name, revision=revision, timeout=10).sha
        except Exception as e:  # offline, gated, misspelt: all say the same to the user
            why = f"the Hub did not answer ({type(e).__name__}: {e})"
    raise ValueError(
        f"model {name!r}: no folder or file at that path, and its Hub revision cannot be resolved ({why}); "
        f"pass a model folder, or download it first (`hf download {name}`)"
    )


def model_record(model: str, revision: str | None = None) -> dict:
    """A job's model: ``{"digest"}`` of a local model folder or file, ``{"name", "revision"}`` of a
    Hub name (``ValueError`` when neither resolves)."""
    if os.path.exists(model):
        return {"digest": model_digest(model)}
    if not HUB_ID.fullmatch(model):
        raise ValueError(f"no model folder or file at {model} (and it is not a Hugging Face Hub name)")
    return {"name": model, "revision": hub_revision(model, revision)}


def model_revision(config: Any) -> dict:
    """Which version of a loaded model a head was trained on, for its provenance:
    ``{"revision", "source"}``. ``source`` ``"hub"``: the Hub commit it was loaded from
    (transformers' ``_commit_hash``, the cache snapshot its path lies in, or the cache's commit of
    its name); ``"local"``: ``"sha256:" +`` :func:`model_digest` of its folder; ``None``: neither is
    known (a model built in memory). Never asks the Hub."""
    name = getattr(config, "_name_or_path", "") or getattr(config, "name_or_path", "") or ""
    commit = getattr(config, "_commit_hash", None) or (commit_of_path(os.path.join(name, "")) if name else None)
    if not commit and name and not os.path.exists(name) and HUB_ID.fullmatch(name):
        # transformers 5 keeps no commit on the config: the cache's snapshot of the name is what it loaded
        commit = cached_revision(name)
    if commit:
        return {"revision": commit, "source": "hub"}
    if name and os.path.isdir(name):
        return {"revision": f"sha256:{model_digest(name)}", "source": "local"}
    return {"revision": None, "source": None}
