"""Heads that travel: a head named by a Hugging Face Hub repository id, what a head holds in
words, its model card, and the repository it is published as.

**Where a head is found** (:func:`resolve_head`, the one place every entry point asks: ``bon``,
``serve``, ``score``, ``head info``/``push``, ``run_bon`` and the vLLM plugin's ``"head"``):

- a path that exists always wins: a head file, or a folder holding ``head.safetensors`` (a
  repository cloned or written by ``swift-fast head push --to-folder``);
- else ``org/name[@revision][:file]`` is a Hub repository id: ``revision`` is a branch, tag or
  commit (default ``main``), ``file`` the head's path in the repository (default
  ``head.safetensors``), e.g. ``org/name@v1:heads/gsm8k.safetensors``. It is fetched through
  ``huggingface_hub.hf_hub_download`` into the Hugging Face cache and read from there; with
  ``HF_HUB_OFFLINE=1`` only the cache is read. ``HF_HUB_CACHE``/``HF_HOME``/``HF_HUB_OFFLINE``
  are read when a head is resolved (not only when ``huggingface_hub`` was imported), so a
  process may set them late;
- a ``.safetensors`` name without ``:`` is taken as a path only: a missing file stays a missing
  file, never a network look-up;
- anything else that exists nowhere is an error naming each place tried.

**A repository** holds the head as ``head.safetensors`` and its model card as ``README.md``
(:func:`write_repo_folder`); ``push_head`` uploads exactly that folder. The card beside a head
(``<head stem>.md``, written by ``swift-fast train``) is the card :func:`model_card` makes from the
head's own metadata; pushing regenerates it with the repository id in its usage lines, unless it
was edited, in which case the edited card is published as it is.

Light on purpose: the vLLM plugin imports this module, so it needs ``huggingface_hub`` only,
never transformers.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass

from ..rewards.head import FORMAT, HeadError, SwiftHead
from ..support.files import sha256_of

#: the head's file name in a repository, and what a folder or a bare repository id resolves to
DEFAULT_FILE = "head.safetensors"
CARD_FILE = "README.md"

_REPO_ID = re.compile(
    r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)(?:@(?P<rev>[^:@]+))?(?::(?P<file>.+))?$"
)
_SNAPSHOT = re.compile(r"[/\\]snapshots[/\\]([0-9a-f]{40})[/\\]")


class HubHeadError(HeadError):
    """A head named by a path or a Hub repository id that cannot be found."""


@dataclass(frozen=True)
class HubRef:
    """A head in a Hub repository: ``repo_id``, ``revision`` (None: ``main``) and ``filename``."""

    repo_id: str
    revision: str | None = None
    filename: str = DEFAULT_FILE

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        file = f":{self.filename}" if self.filename != DEFAULT_FILE else ""
        return f"{self.repo_id}{rev}{file}"


@dataclass(frozen=True)
class HeadLocation:
    """Where a head spec led: the local ``path`` and, for a Hub head, the ``ref`` and the ``commit``
    the revision pointed to."""

    spec: str
    path: str
    ref: HubRef | None = None
    commit: str | None = None

    def to_dict(self) -> dict:
        return {"spec": self.spec, "path": self.path, "repo_id": self.ref.repo_id if self.ref else None,
                "revision": self.ref.revision if self.ref else None,
                "filename": self.ref.filename if self.ref else None, "commit": self.commit}


def parse_hub_ref(spec: str) -> HubRef | None:
    """The repository id of ``spec`` (``org/name[@revision][:file]``), or None when it cannot be one."""
    if spec.endswith(".safetensors") and ":" not in spec:
        return None  # a head file's name: a path, never a network look-up
    m = _REPO_ID.match(spec)
    if m is None:
        return None
    return HubRef(m["repo"], m["rev"], m["file"] or DEFAULT_FILE)


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_offline() -> bool:
    """Whether the Hub may not be reached: ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) now or at import."""
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")


def hub_cache_dir() -> str:
    """The Hub cache a head is read from and written to, from the environment as it is now."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return os.path.expanduser(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.environ["HF_HOME"]), "hub")
    return constants.HF_HUB_CACHE


def commit_of_path(path: str) -> str | None:
    """The Hub commit of a file in the Hugging Face cache (``.../snapshots/<commit>/...``), else None."""
    m = _SNAPSHOT.search(os.path.abspath(path))
    return m[1] if m else None


def locate_head(spec: str | os.PathLike) -> HeadLocation:
    """Where the head ``spec`` (a path, a folder or ``org/name[@revision][:file]``) is on this
    machine: a Hub head is fetched into the cache first (read from the cache alone when offline).
    Raises ``HubHeadError`` naming every place tried."""
    spec = os.fspath(spec)
    path = os.path.abspath(os.path.expanduser(spec))
    if os.path.isdir(path):
        inner = os.path.join(path, DEFAULT_FILE)
        if not os.path.isfile(inner):
            raise HubHeadError(f"the folder {path} holds no {DEFAULT_FILE}: name the head file inside it")
        return HeadLocation(spec, inner, commit=commit_of_path(inner))
    if os.path.exists(path):
        return HeadLocation(spec, path, commit=commit_of_path(path))
    ref = parse_hub_ref(spec)
    if ref is None:
        hint = (" (a head in a Hub repository is named org/name, org/name@revision or org/name:file.safetensors)"
                if "/" not in spec else "")
        raise HubHeadError(f"no head file at {path}{hint}")
    local, error = _download(ref)
    if local is None:
        cache = hub_cache_dir()
        if hub_offline():
            where = f"read from the Hugging Face cache {cache} (HF_HUB_OFFLINE is set: the cache only)"
            fix = "fetch it once with the network on (unset HF_HUB_OFFLINE), or give a local path"
        else:
            where = f"fetched from the Hub nor read from the Hugging Face cache {cache}"
            fix = "check the repository id, revision and file, and your access to it (huggingface-cli login)"
        raise HubHeadError(
            f"head {spec!r} not found: no file or folder at {path}, and the Hugging Face Hub repository "
            f"{ref.repo_id} (revision {ref.revision or 'main'}, file {ref.filename}) could not be {where} "
            f"({error}); {fix}"
        )
    return HeadLocation(spec, local, ref, commit_of_path(local))


def resolve_head(spec: str | os.PathLike) -> str:
    """The local path of the head ``spec`` names (:func:`locate_head`)."""
    return locate_head(spec).path


def resolve_head_lenient(spec: str) -> str:
    """``resolve_head`` for a configuration read before any file is wanted (the vLLM plugin's
    ``"head"``): a missing file that cannot be a repository id stays its absolute path, refused when
    the head is loaded, as before repository ids existed; a repository id is resolved now."""
    path = os.path.abspath(os.path.expanduser(spec))
    if not os.path.exists(path) and parse_hub_ref(spec) is None:
        return path
    return locate_head(spec).path


def _download(ref: HubRef) -> tuple[str | None, str]:
    """``(path, "")`` of the head in the cache, or ``(None, why not)``."""
    from huggingface_hub import hf_hub_download

    try:
        from huggingface_hub.errors import EntryNotFoundError
    except ImportError:  # huggingface_hub < 0.23 kept it in utils
        from huggingface_hub.utils import EntryNotFoundError
    try:
        return hf_hub_download(ref.repo_id, ref.filename, revision=ref.revision, cache_dir=hub_cache_dir(),
                               local_files_only=hub_offline()), ""
    except (OSError, ValueError, EntryNotFoundError) as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no detail'}"


# -- what a head holds ---------------------------------------------------------------------------
def head_summary(head: SwiftHead, location: HeadLocation | None = None) -> dict:
    """Everything a head file holds, JSON-ready: its shape, its model, its provenance (as written)."""
    return {
        "source": location.to_dict() if location is not None else None,
        "format": FORMAT,
        "hidden_size": head.hidden_size,
        "layers": head.layers,
        "gate": head.gate,
        "alignment": head.alignment,
        "feature": head.feature,
        "state_norm": None if head.norm_eps is None else {"type": "rms", "eps": head.norm_eps},
        "model": head.model_name or None,
        "model_fingerprint": head.model_fingerprint,
        "parameters": head.weight.numel() + head.bias.numel(),
        "weight_shape": list(head.weight.shape),
        "provenance": head.provenance or {},
        "selector": head.selector,
    }


def _fig(x, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _layers_text(layers: list[int], feature: str, fp: dict | None) -> str:
    if feature == "logits":
        return "the final logits (one 'layer')"
    n = (fp or {}).get("num_layers")
    runs, a = [], 0
    for i in range(1, len(layers) + 1):
        if i == len(layers) or layers[i] != layers[i - 1] + 1:
            runs.append(str(layers[a]) if i - a == 1 else f"{layers[a]}-{layers[i - 1]}")
            a = i
    whole = " (all: the embeddings, every layer's output and the final norm)" if n is not None and \
        layers == list(range(n + 1)) else ""
    return f"{len(layers)} hidden states: {', '.join(runs)}{whole}"


def _model_text(s: dict) -> str:
    fp = s["model_fingerprint"] or {}
    said = {"architecture": "{}", "hidden_size": "hidden size {}", "num_layers": "{} layers",
            "vocab_size": "vocabulary {}"}
    shape = ", ".join(text.format(fp[k]) for k, text in said.items() if fp.get(k) is not None)
    model = s["provenance"].get("model")
    rev = model.get("revision") if isinstance(model, dict) else None
    rev_text = f", revision {rev}" if rev else ""
    return f"{s['model'] or 'an unnamed model'}{rev_text} ({shape or 'no fingerprint'})"


def _data_text(p: dict) -> str | None:
    d = p.get("data")
    if not isinstance(d, dict):
        return None
    parts = []
    if d.get("path"):
        size = f", {d['bytes']:,} bytes" if d.get("bytes") is not None else ""
        digest = f", sha256 {d['sha256'][:12]}..." if d.get("sha256") else ""
        parts.append(f"{d['path']}{size}{digest}")
    counts = []
    if d.get("problems") is not None:
        counts.append(f"{d['problems']} problems")
    if d.get("candidates") is not None:
        counts.append(f"{d['candidates']} candidates")
    if d.get("positive_rate") is not None:
        counts.append(f"{100 * d['positive_rate']:.1f}% correct")
    if counts:
        parts.append(", ".join(counts))
    split = d.get("split") or {}
    if d.get("train_problems") is not None:
        parts.append(f"split by {split.get('by', 'problem')}: {d['train_problems']} training / "
                     f"{d.get('val_problems')} validation problems (seed {split.get('seed')})")
    return "; ".join(parts) or None


def _fit_text(p: dict) -> str | None:
    """How the head was fitted: the solver and its strength, or its epochs."""
    solver = p.get("solver") or ("adamw" if p.get("optimizer") else None)
    loss = f"{p['loss']} loss" if p.get("loss") else None
    if solver == "probe":
        text = "probe (logistic regression on mean states)"
        if isinstance(p.get("lambda"), (int, float)):
            text += f", L2 strength {p['lambda']:g}"
            if p.get("lambdas"):
                text += f" chosen from {', '.join(f'{x:g}' for x in p['lambdas'])}"
            if p.get("folds"):
                text += f" by {p['folds']}-fold cross-validation over the training problems"
        if p.get("refit"):
            text += ", then refitted on training and validation candidates"
        return "; ".join(x for x in (text, loss) if x)
    if solver == "adamw" or p.get("optimizer"):
        opt = p.get("optimizer") or {}
        bits = [f"AdamW lr {opt.get('lr', 'n/a'):g}, weight decay {opt.get('weight_decay', 'n/a'):g}"
                if opt else "AdamW"]
        if p.get("batch_size"):
            bits.append(f"batches of {p['batch_size']}")
        if p.get("best_epoch") is not None:
            stop = ", stopped early" if p.get("stopped_early") else ""
            by = f", kept by {'within-problem AUC' if p.get('select') == 'pairs' else 'validation loss'}" \
                if p.get("select") else ""
            bits.append(f"epoch {p['best_epoch']} kept of {p.get('epochs_run')} run (at most {p.get('max_epochs')}, "
                        f"patience {p.get('patience')}{stop}{by})")
        return "; ".join(bits + ([loss] if loss else []))
    return loss


def _validation_text(p: dict) -> str | None:
    vm = p.get("val_metrics")
    if not isinstance(vm, dict) or not vm:
        return None
    bits = []
    if "auc" in vm:
        bits.append(f"AUC {_fig(vm['auc'])}")
    if "within_auc" in vm:
        bits.append(f"within-problem AUC {_fig(vm['within_auc'])}")
    if "bon" in vm:
        bits.append(f"Best-of-N {_fig(vm['bon'])} (random pick {_fig(vm.get('random'))}, "
                    f"oracle {_fig(vm.get('oracle'))})")
    if "balanced_accuracy" in vm:
        bits.append(f"balanced accuracy {_fig(vm['balanced_accuracy'])}")
    if "loss" in vm:
        bits.append(f"loss {_fig(vm['loss'], 4)}")
    where = f" on {vm['problems']} problems / {vm['candidates']} candidates" if "problems" in vm else ""
    return ", ".join(bits) + where


def _verdict_text(p: dict) -> str | None:
    b = p.get("baselines")
    if isinstance(b, dict) and isinstance(b.get("verdict"), dict):
        return b["verdict"].get("text")
    return None


def _selector_text(rec: dict | None) -> str:
    """The selector the head is used with by default, and why."""
    if not rec:
        return "swift (the highest score; no recommendation recorded)"
    from ..training.recommend import describe

    return describe(rec).removeprefix("recommended selector: ")


def head_facts(s: dict) -> list[tuple[str, str]]:
    """``(label, text)`` lines of a :func:`head_summary`, for people: what ``head info`` prints and
    the model card's tables show (one wording for both)."""
    p = s["provenance"]
    norm = s["state_norm"]
    rows = [
        ("format", s["format"]),
        ("model", _model_text(s)),
        ("feature", "hidden states" if s["feature"] == "hidden" else "final logits"),
        ("layers", _layers_text(s["layers"], s["feature"], s["model_fingerprint"])),
        ("hidden size", str(s["hidden_size"])),
        ("gate", "yes: a gated average of token rewards (weight rows: gate, reward)" if s["gate"]
         else "no: the plain mean of token rewards"),
        ("alignment", s["alignment"] + (": token r_j scored with the state whose logits produced it (free during "
                                        "generation)" if s["alignment"] == "predicting" else
                                        ": token r_j scored with the state where it is the input (the paper's)")),
        ("state norm", "none" if norm is None else f"RMS, eps {norm['eps']:g}"),
        ("parameters", f"{s['parameters']:,} (weight {' x '.join(map(str, s['weight_shape']))} and bias)"),
    ]
    fp = s["model_fingerprint"]
    if fp:
        rows.append(("fingerprint", ", ".join(f"{k}={v}" for k, v in fp.items())))
    for label, text in (("trained on", _data_text(p)), ("fitted by", _fit_text(p)),
                        ("validation", _validation_text(p)), ("baselines", _verdict_text(p)),
                        ("selector", _selector_text(s.get("selector")))):
        if text:
            rows.append((label, text))
    if p.get("swift_fast"):
        rows.append(("swift-fast", f"trained with swift-fast {p['swift_fast']}"))
    if not p:
        rows.append(("trained on", "no provenance recorded (not a head `swift-fast train` wrote)"))
    return rows


def format_head_info(s: dict) -> str:
    """A :func:`head_summary` as aligned lines (``swift-fast head info``)."""
    rows = head_facts(s)
    if s.get("source"):
        src = s["source"]
        rows.insert(0, ("file", src["path"]))
        if src.get("repo_id"):
            commit = f", commit {src['commit']}" if src["commit"] else ""
            rows.insert(1, ("from", f"Hugging Face Hub {src['repo_id']}, file {src['filename']}, revision "
                                    f"{src['revision'] or 'main'}{commit}"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {text}" for label, text in rows)


# -- the model card -----------------------------------------------------------------------------
#: swift-fast's license (``setup.py``'s ``license``, the LICENSE file), which a head's card states;
#: a constant rather than the installed package's metadata, which an editable install keeps stale
PROJECT_LICENSE = "Apache-2.0"


def card_path(head_path: str | os.PathLike) -> str:
    """The model card beside a head file: ``<head stem>.md`` (``<name>.md`` added to a head file
    that itself ends in ``.md``, which a card must never overwrite)."""
    path = os.fspath(head_path)
    card = os.path.splitext(path)[0] + ".md"
    return card if card != path else path + ".md"


def _looks_like_hub_model(name: str | None) -> bool:
    return bool(name) and _REPO_ID.match(name) is not None and not os.path.exists(name)


def _baselines_table(b: dict) -> list[str]:
    n = f"BoN@{b['n']}" if b.get("n") else "Best-of-N"
    out = [f"| selector | AUC | within-problem AUC | {n} |", "| --- | --- | --- | --- |"]
    from ..training.baselines import baseline_name

    # the free baselines by the names train prints them under
    names = {"head": "this head", "length": baseline_name(b, "length") if isinstance(b.get("length"), dict) else "",
             "mean_logprob": baseline_name(b, "mean_logprob"), "random": "random pick", "oracle": "oracle (pass@N)"}
    for key, label in names.items():
        row = b.get(key)
        if isinstance(row, dict):
            out.append(f"| {label} | {_fig(row.get('auc'))} | {_fig(row.get('within_auc'))} | {_fig(row.get('bon'))} |")
    return out


def model_card(head: SwiftHead, head_ref: str = DEFAULT_FILE, license: str | None = None) -> str:
    """The model card (markdown with the Hub's YAML header) of a head, from its own metadata:
    the model it is for, how to use it (``head_ref``: what ``--head`` takes, a file or a repository
    id), what it was trained on, its validation figures beside the free baselines, the license."""
    s = head_summary(head)
    p = s["provenance"]
    model = s["model"] or "MODEL"
    lic = license if license is not None else PROJECT_LICENSE
    yaml = ["---", "library_name: swift-fast", "tags:", "- swift-fast", "- swift", "- reward-model", "- best-of-n"]
    if _looks_like_hub_model(s["model"]):
        yaml.append(f"base_model: {s['model']}")
    if lic:
        yaml.append(f"license: {lic.lower()}")  # the Hub's license identifiers are lower case
    yaml.append("---")
    lines = yaml + [
        "",
        f"# SWIFT head for {model}",
        "",
        f"A SWIFT reward head for `{model}`: a {'gated ' if s['gate'] else ''}linear map over the model's own "
        f"{'hidden states' if s['feature'] == 'hidden' else 'final logits'} ({s['parameters']:,} parameters) that "
        "scores each candidate answer while it is generated, for Best-of-N selection with swift-fast. It reads "
        "this model's states only: swift-fast refuses it on another model, naming both.",
        "",
        "## Use",
        "",
        "With swift-fast installed (its vLLM plugin comes with it):",
        "",
        "```bash",
        f"swift-fast serve --head {head_ref} {model}",
        f"swift-fast bon --model {model} --head {head_ref} --data test.jsonl --n 16",
        "```",
        "",
        "```python",
        "import swift_fast as sf",
        "from vllm import LLM, SamplingParams",
        "",
        f'llm = LLM(model="{model}", additional_config={{"swift_fast": {{"head": "{head_ref}"}}}})',
        "for out in llm.generate(prompts, SamplingParams(n=16, temperature=1.0, top_p=0.9)):",
        "    best = sf.best_output(out)  # highest swift_score, never a pruned or unscored candidate",
        "```",
        "",
        "## The head",
        "",
        "| | |",
        "| --- | --- |",
    ]
    facts = dict(head_facts(s))
    for label in ("format", "model", "fingerprint", "feature", "layers", "gate", "alignment", "state norm",
                  "parameters"):
        if label in facts:
            lines.append(f"| {label} | {facts[label]} |")
    lines += ["", "## Training", ""]
    trained = [(label, facts[label]) for label in ("trained on", "fitted by", "swift-fast") if label in facts]
    lines += [f"- **{label}**: {text}" for label, text in trained] or ["No training record in the head file."]
    lines += ["", "## Validation", ""]
    if "validation" in facts:
        lines += [f"On the held-out problems: {facts['validation']}.", ""]
    b = p.get("baselines")
    if isinstance(b, dict) and b.get("head"):
        lines += ["Beside the selectors that need no training, on the same validation candidates:", ""]
        lines += _baselines_table(b)
        if facts.get("baselines"):
            lines += ["", f"Verdict: {facts['baselines']}."]
    elif "validation" not in facts:
        lines.append("No validation figures in the head file.")
    lines += [
        "",
        "## License",
        "",
        (f"This head is released under {lic}, the license of swift-fast, which trained it and runs it." if lic
         else "No license is stated: state this head's license here (and as `license:` in the header above) "
         "before publishing it.") + f" The model `{model}` keeps its own license.",
        "",
    ]
    return "\n".join(lines)


def write_card(head_path: str | os.PathLike, head: SwiftHead | None = None) -> str:
    """Write the model card beside a head file (:func:`card_path`); returns its path."""
    head = head if head is not None else SwiftHead.load(head_path)
    path = card_path(head_path)
    with open(path, "w", encoding="utf-8") as f:
        f.write(model_card(head, os.path.basename(os.fspath(head_path))))
    return path


def card_for_repo(head_path: str, head: SwiftHead, repo_id: str) -> tuple[str, str]:
    """``(card, where it came from)`` for publishing ``head_path`` as ``repo_id``: the card beside the
    head when it was edited (kept as written), else the card made for the repository."""
    beside = card_path(head_path)
    if os.path.isfile(beside):
        with open(beside, encoding="utf-8") as f:
            text = f.read()
        if text != model_card(head, os.path.basename(head_path)):
            return text, f"{beside} (edited, published as written)"
    return model_card(head, repo_id), "made from the head's metadata"


# -- the repository -----------------------------------------------------------------------------
def write_repo_folder(head: str | os.PathLike, repo_id: str, folder: str | os.PathLike) -> dict:
    """Write the repository ``repo_id`` of a head (a path or a repository id) into ``folder``: the
    head file, byte for byte, as ``head.safetensors`` and its card as ``README.md``. A folder that
    holds anything else is refused (an upload sends the whole folder)."""
    if parse_hub_ref(repo_id) is None or "@" in repo_id or ":" in repo_id:
        raise HubHeadError(f"{repo_id!r} is not a Hub repository id: expected org/name")
    loc = locate_head(head)
    model = SwiftHead.load(loc.path)  # a file that is no head is never published
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    other = sorted(set(os.listdir(folder)) - {DEFAULT_FILE, CARD_FILE})
    if other:
        raise HubHeadError(f"{folder} already holds {other}: write the repository into an empty folder")
    card, card_source = card_for_repo(loc.path, model, repo_id)
    target = os.path.join(folder, DEFAULT_FILE)
    if os.path.abspath(target) != os.path.abspath(loc.path):
        shutil.copyfile(loc.path, target)
    with open(os.path.join(folder, CARD_FILE), "w", encoding="utf-8") as f:
        f.write(card)
    return {"folder": folder, "head": target, "card": os.path.join(folder, CARD_FILE), "card_source": card_source,
            "sha256": sha256_of(target), "source": loc.to_dict()}


def push_head(head: str | os.PathLike, repo_id: str, revision: str | None = None, private: bool = False,
              token: str | None = None, commit_message: str | None = None) -> dict:
    """Publish a head as the Hub repository ``repo_id``: the folder :func:`write_repo_folder` makes,
    uploaded as one commit (``HfApi.create_repo``, ``create_branch`` for a ``revision`` that is
    not ``main``, ``upload_folder``). Returns what was written with the commit's ``url``."""
    from huggingface_hub import HfApi

    if hub_offline():
        raise HubHeadError("HF_HUB_OFFLINE is set: a head cannot be pushed offline (write it with --to-folder)")
    with tempfile.TemporaryDirectory(prefix="swift-fast-push-") as tmp:
        written = write_repo_folder(head, repo_id, tmp)
        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        info = api.upload_folder(repo_id=repo_id, folder_path=tmp, revision=revision, repo_type="model",
                                 commit_message=commit_message or "swift-fast head push")
    written.update(folder=None, head=DEFAULT_FILE, card=CARD_FILE, url=str(getattr(info, "commit_url", info)))
    return written
