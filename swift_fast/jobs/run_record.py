"""Run records: what determines a resumable job's rollouts, written beside them, so that a rerun
never resumes (and reports as its own) rollouts another model, head, dataset or setting made.

``swift-fast collect`` and ``bon`` append problems to their rollout file as they finish, and a
rerun skips the ids already there. Without a record, a rerun with another head or temperature
reported the old file's candidates under the new settings. Each run now has a *record*
(:class:`RunRecord`), and a rerun resumes a file only when the records are equal; otherwise it is
refused before any engine starts, naming the first field that differs, its old and new value
(:func:`check_resume`), and ``overwrite=True`` (``--overwrite``) starts again (:func:`prepare`).

Where it lives:

- ``<base>.run.json`` beside the rollouts (``<base>``: their path without its extension, so
  ``bon``'s pruned run has ``<base>.pruned.run.json``): ``{"run_id", "record", "sources"}``.
- ``run_id`` first on every rollout line: the first 16 hex digits of the sha256 of the record's
  canonical JSON (:func:`canonical`). Lines of two runs never mix, and a file whose sidecar is
  lost is still checked (then the difference cannot be named, only seen).
- ``bon``'s ``summary.json``: the sidecar's content under ``run`` (the pruned run's under
  ``prune.run``).

The record, compared field by field (fields named as ``sampling.temperature``):

============  ==================================================================================
``format``    ``swift_fast.run/1``
``version``   the package's: its templates, grading and scoring code
``model``     a local folder or file: ``digest``; a Hub name: ``name`` and ``revision``, the commit
              it resolves to (``swift_fast.hf.model_identity``, the one rule for which model)
``data``      ``sha256`` of the problem file (a dataset name: of the file it resolves to) and
              ``problems``: a digest of its problems as loaded (id, kind, question, reference)
``prompt``    ``template`` and ``system`` as given (None: the dataset's)
``sampling``  ``n``, ``temperature``, ``top_p``, ``max_new_tokens``, ``seed``
``grading``   ``kind`` (None: each problem's), ``truncation``, ``timeout``
``engine``    ``dtype`` as given, and ``vllm``: the ``vllm.LLM`` keywords that can change what is
              sampled (``swift_fast.jobs.engine.EngineConfig.output_settings``)
``head``      ``bon``: ``sha256`` of the head file; null without a head (a run of the head-free
              values is another run than one with a head)
``plugin``    ``bon``: the engine's settings (``sar``; ``confidence_window`` when not the
              default), and ``request``: the per-request settings (``trace``, ``prune``: the
              pruned run's record differs from the full run's there)
============  ==================================================================================

Left out, as they do not change what is sampled, only where or how fast (:data:`NOT_RECORDED`,
``engine.OUTPUT_NEUTRAL``): the engine (each line names its own), device, parallelism, memory
share, eager mode, problems per engine call, ``--limit`` (a larger one extends a run). Paths are
not compared either: the same model folder, data and head at another path resume (``sources``
keeps the paths of this run, for the reader).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from typing import Any

from ..hf.model_identity import model_record
from ..support.files import sha256_of

FORMAT = "swift_fast.run/1"

#: the ``CollectConfig`` fields a record leaves out, and why (the others are recorded)
NOT_RECORDED = {
    "chunk": "problems per engine call: each problem is seeded from --seed and its id alone",
    "vllm_kwargs": "read by no engine (the engine's keywords are EngineConfig.vllm_kwargs)",
    "plugin_args": "recorded as plugin.request",
}

def canonical(record: Any) -> str:
    """The JSON a run id digests: keys sorted, no spaces, non-ASCII escaped; a value JSON cannot
    hold (an object among ``vllm.LLM`` keywords) as its ``str``."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class RunRecord:
    """A run's record (compared on resume), and ``sources``: the paths it was made from (kept for
    the reader, never compared)."""

    record: dict
    sources: dict = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        """The id written on every rollout line: 16 hex digits of the sha256 of :func:`canonical`."""
        return hashlib.sha256(canonical(self.record).encode()).hexdigest()[:16]

    def sidecar(self) -> dict:
        """What ``<base>.run.json`` holds (and ``bon``'s summary under ``run``)."""
        return {"run_id": self.run_id, "record": self.record, "sources": self.sources}

    def with_request(self, plugin_args: dict) -> RunRecord:
        """The same run with other per-request plugin settings (``bon``'s full and pruned runs)."""
        plugin = {**self.record.get("plugin", {}), "request": _json(plugin_args)}
        return replace(self, record={**self.record, "plugin": plugin})


def _json(x):
    # what the record holds is what it reads back as from its sidecar: compared alike, digested alike;
    # in the order it was built, so that the first difference named is the first in that order
    return json.loads(json.dumps(x, default=str))


def build(model: str, data: str, cfg, engine, kind: str | None = None, head: str | None = None,
          sar: bool | None = None, plugin: dict | None = None) -> RunRecord:
    """The record of a run of ``model`` on ``data`` (a file or a dataset name) with the
    ``CollectConfig`` ``cfg``, the ``EngineConfig`` ``engine`` and the grading ``kind``; ``bon``'s
    plugin: ``head`` its head file (None: none), ``sar`` its SAR setting (None: no plugin, as
    ``collect``), ``plugin`` its other engine settings that change the values (those not at their
    default: ``{"confidence_window": 64}``), ``cfg.plugin_args`` its per-request settings. Reads
    the model's files and the data (no engine, no model load)."""
    from .. import __version__
    from ..data.datasets import load_dataset, resolve_path

    data_file = resolve_path(data)
    # NOTE: the problems as loaded, not only the file's bytes: the same file under another name
    # gives other problem ids, and a resume would then append every problem again under its new id
    problems = [[e.id, e.kind, e.question, e.reference] for e in load_dataset(data, kind=kind)]
    record = {
        "format": FORMAT,
        "version": __version__,
        "model": model_record(model, engine.vllm_kwargs.get("revision")),
        "data": {"sha256": sha256_of(data_file),
                 "problems": hashlib.sha256(canonical(problems).encode()).hexdigest()},
        "prompt": {"template": cfg.template, "system": cfg.system},
        "sampling": {"n": int(cfg.n), "temperature": float(cfg.temperature), "top_p": float(cfg.top_p),
                     "max_new_tokens": int(cfg.max_new_tokens), "seed": int(cfg.seed)},
        "grading": {"kind": kind, "truncation": cfg.truncation,
                    "timeout": None if cfg.grade_timeout is None else float(cfg.grade_timeout)},
        "engine": engine.output_settings(),
    }
    sources = {"model": os.path.abspath(model) if os.path.exists(model) else model, "data": os.path.abspath(data_file)}
    on = head is not None or sar is not None
    if head is not None:
        record["head"] = {"sha256": sha256_of(head)}
        sources["head"] = os.path.abspath(head)
    elif on:
        record["head"] = None  # the head-free values only: never resumed as (or by) a run with a head
    if on or cfg.plugin_args:
        # NOTE: bon --prune's full run ("prune": false) is another run than a plain bon's: it keeps
        # every candidate's per-token values, which the pruning sweep replays
        record["plugin"] = {"sar": bool(sar), **(plugin or {}), "request": cfg.plugin_args}
    return RunRecord(_json(record), sources)


def record_path(out: str | os.PathLike) -> str:
    """Where the record of the rollouts at ``out`` lives: ``<out without its extension>.run.json``."""
    return os.path.splitext(os.fspath(out))[0] + ".run.json"


def read_sidecar(out: str | os.PathLike) -> dict | None:
    """The sidecar of the rollouts at ``out`` (None: none, or not readable as one)."""
    try:
        with open(record_path(out), encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and isinstance(d.get("record"), dict) else None


def head_of(out: str | os.PathLike) -> str | None:
    """The head file that scored the rollouts at ``out``, as their record names it, when that file
    is still there with the same contents (sha256); None otherwise (no record, a head-free run, a
    head moved or rewritten since)."""
    d = read_sidecar(out)
    if d is None:
        return None
    path = (d.get("sources") or {}).get("head")
    digest = (d["record"].get("head") or {}).get("sha256")
    if not path or not digest or not os.path.isfile(path):
        return None
    return path if sha256_of(path) == digest else None


def write_sidecar(out: str | os.PathLike, run: RunRecord) -> None:
    """Write ``run``'s sidecar beside ``out`` (whole or not at all: through a temporary file)."""
    path = record_path(out)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(run.sidecar(), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def first_difference(old: dict, new: dict, prefix: str = "") -> tuple[str, Any, Any] | None:
    """``(field, old value, new value)`` of the first field (in ``new``'s order, then ``old``'s
    own) where two records differ, nested fields named ``a.b``; None when they are equal."""
    for key in list(new) + [k for k in old if k not in new]:
        a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if isinstance(a, dict) and isinstance(b, dict):
            found = first_difference(a, b, f"{prefix}{key}.")
            if found is not None:
                return found
        elif a != b:
            return f"{prefix}{key}", a, b
    return None


_ABSENT = object()


def _show(x) -> str:
    return "(absent)" if x is _ABSENT else json.dumps(x, default=str)


def check_resume(out: str | os.PathLike, run: RunRecord | None, what: str = "") -> None:
    """Refuse (``ValueError``) to append ``run``'s problems to the rollouts at ``out`` unless every
    line there is of the same run (its ``run_id``): a file of another run names the first field
    that differs; one without run ids (an older swift-fast) is refused as such. ``run`` None (a
    library call of ``collect`` without a record) accepts only lines without run ids. ``what``
    names the run in the message ("the pruned run")."""
    from ..data.rollouts import run_ids

    out = os.fspath(out)
    found = run_ids(out)
    if not found:
        return
    mine = None if run is None else run.run_id
    if list(found) == [mine]:
        return
    sidecar = record_path(out)
    fix = ("Pass --overwrite (overwrite=True) to start again, which removes the rollouts and their run record, or "
           "write to another --out")
    head = f"{out}: cannot resume{' ' + what if what else ''}"
    if len(found) > 1:
        (a, _), (b, line) = list(found.items())[:2]
        raise ValueError(f"{head}: it mixes the lines of two runs ({a} and, from line {line}, {b}). {fix}.")
    (had, _), = found.items()
    if had is None:
        raise ValueError(
            f"{head}: its lines carry no run id, so nothing says which model, data and settings made them (a file "
            f"of swift-fast before {FORMAT} run records, or written without one). {fix}."
        )
    if run is None:
        raise ValueError(
            f"{head}: its lines are of the recorded run {had} ({sidecar}) and this call records none: pass the "
            "run's record (collect(..., run=)) or another output file"
        )
    old = read_sidecar(out)
    if old is None or old.get("run_id") != had:
        why = "is missing" if old is None else f"is of another run ({old.get('run_id')})"
        raise ValueError(
            f"{head}: its lines are of run {had}, this run is {run.run_id}, and the record that would name the "
            f"difference, {sidecar}, {why}. {fix}, or rerun with that run's settings."
        )
    diff = first_difference(old["record"], run.record)
    if diff is None:  # equal fields, another digest: a record written by another version of this code
        raise ValueError(f"{head}: its lines are of run {had}, this run is {run.run_id} ({sidecar}). {fix}.")
    name, was, now = diff
    raise ValueError(
        f"{head}: its rollouts were generated with {name} = {_show(was)}, this run has {_show(now)} (the run "
        f"record is {sidecar}). {fix}, or rerun with the recorded {name}."
    )


def _check_rollout_file(path: str) -> None:
    """Refuse to remove a file that is not a rollout file: every line a JSON problem with its
    ``candidates`` (a dataset, a head or any other file named as --out by mistake is kept)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not (isinstance(row, dict) and "candidates" in row):
                torn = i > 1 and not line.endswith("\n")  # a run killed mid-line leaves a torn last line
                if torn:
                    return
                raise ValueError(
                    f"{path}:{i}: not a rollout line (no 'candidates'), so --overwrite will not remove this file: "
                    "name another --out"
                )


def remove_run(out: str | os.PathLike) -> None:
    """Remove the rollouts at ``out`` and their record, where they exist; ``ValueError`` (and
    nothing removed) when ``out`` holds anything but rollouts."""
    out = os.fspath(out)
    if os.path.exists(out):
        _check_rollout_file(out)
    for path in (out, record_path(out)):
        if os.path.exists(path):
            os.remove(path)


def prepare(runs: list[tuple[str, RunRecord, str]], overwrite: bool = False) -> None:
    """What a job does with its ``(rollout path, record, what)`` runs before any engine starts:
    refuse a resume of another run (:func:`check_resume`); with ``overwrite``, remove instead the
    rollouts and record of each run that could not resume (:func:`remove_run`): a run that is
    this run's stays (``bon --prune --overwrite`` with other pruning keeps the full run). Every
    file is checked before anything is removed."""
    stale = []
    for out, run, what in runs:
        try:
            check_resume(out, run, what)
        except ValueError:
            if not overwrite:
                raise
            if os.path.exists(out):
                _check_rollout_file(out)
            stale.append(out)
    for out in stale:
        remove_run(out)
