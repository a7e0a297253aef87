"""Heads that travel: Hub repository ids resolved from a local Hugging Face cache (offline, nothing
reaches the network), `swift-fast head info` and `head push`, the model card and provenance the
train job writes, and the plugin's configuration naming a repository id.

The cache is laid out as huggingface_hub lays it out (``models--org--name/snapshots/<commit>/file``
and ``refs/<branch>``), and ``hf_hub_download`` itself resolves from it with ``HF_HUB_OFFLINE=1``.
Figures are checked against the head file's own metadata, read with safetensors here, never
against the printer's code.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch
from hf_fixtures import tiny_model_dir

from swift_fast.cli import main
from swift_fast.data.rollouts import Problem, write_rollouts
from swift_fast.hf import hub
from swift_fast.rewards.head import HeadError, SwiftHead

pytest.importorskip("huggingface_hub")

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _raw(path) -> tuple[dict, dict]:
    """The file's metadata and tensors, read with safetensors alone."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


def _cache_repo(cache, repo_id: str, snapshots: dict[str, dict[str, str]], refs: dict[str, str]) -> None:
    """A model repository in a Hugging Face cache: ``snapshots`` commit -> {path in repo: source
    file}, ``refs`` branch -> commit (as huggingface_hub writes them: blobs, with the snapshot
    files linking to them)."""
    root = cache / ("models--" + repo_id.replace("/", "--"))
    for commit, files in snapshots.items():
        for name, src in files.items():
            data = open(src, "rb").read()
            blob = root / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            dst = root / "snapshots" / commit / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(blob, dst.parent), dst)
    (root / "refs").mkdir(parents=True, exist_ok=True)
    for ref, commit in refs.items():
        (root / "refs" / ref).write_text(commit)


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty Hub cache, offline: HF_HUB_OFFLINE both in the environment (what hub.py reads when
    it resolves) and in huggingface_hub's constants (so any HTTP call would be refused)."""
    import huggingface_hub.constants as constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def _head(path, seed: int, model: str = "org/some-model", hidden: int = 8, layers=(0, 1, 2)) -> str:
    head = SwiftHead(hidden, list(layers))
    torch.manual_seed(seed)
    with torch.no_grad():
        head.weight.normal_()
    head.bind_model({"architecture": "LlamaForCausalLM", "hidden_size": hidden, "num_layers": 2, "vocab_size": 32},
                    name=model)
    head.save(path)
    return str(path)


@pytest.fixture
def repo(tmp_path, offline_cache):
    """``org/name``: main (commit A) holds head A and heads/other.safetensors; branch v2 (commit B) head B."""
    a, b, other = (_head(tmp_path / f"{n}.safetensors", seed=i) for i, n in enumerate(("a", "b", "other")))
    snapshots = {COMMIT_A: {"head.safetensors": a, "heads/other.safetensors": other},
                 COMMIT_B: {"head.safetensors": b}}
    _cache_repo(offline_cache, "org/name", snapshots, {"main": COMMIT_A, "v2": COMMIT_B})
    return {"a": a, "b": b, "other": other, "cache": offline_cache}


# -- resolution ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, commit, file, want", [
    ("org/name", COMMIT_A, "head.safetensors", "a"),
    ("org/name@v2", COMMIT_B, "head.safetensors", "b"),
    (f"org/name@{COMMIT_A}", COMMIT_A, "head.safetensors", "a"),
    ("org/name:heads/other.safetensors", COMMIT_A, "heads/other.safetensors", "other"),
    ("org/name@main:heads/other.safetensors", COMMIT_A, "heads/other.safetensors", "other"),
])
def test_repo_ids_resolve_offline_through_the_hub_cache(repo, monkeypatch, tmp_path, spec, commit, file, want):
    monkeypatch.chdir(tmp_path)
    loc = hub.locate_head(spec)
    assert loc.path == str(repo["cache"] / "models--org--name" / "snapshots" / commit / file)
    assert loc.commit == commit and loc.ref.repo_id == "org/name" and loc.ref.filename == file
    assert _sha(hub.resolve_head(spec)) == _sha(repo[want])
    assert str(hub.parse_hub_ref(spec)) == spec


def test_a_path_that_exists_wins_over_a_repo_id(repo, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "org" / "name"
    local.mkdir(parents=True)
    _head(local / "head.safetensors", seed=9)
    # a folder holding head.safetensors (a cloned repository) is that file
    assert hub.resolve_head("org/name") == str(local / "head.safetensors")
    assert hub.resolve_head(str(local / "head.safetensors")) == str(local / "head.safetensors")
    with pytest.raises(HeadError, match="holds no head.safetensors"):
        hub.resolve_head(str(tmp_path / "org"))


def test_a_name_found_nowhere_is_an_error_naming_what_was_tried(repo, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HeadError) as e:
        hub.resolve_head("org/missing@v3")
    msg = str(e.value)
    assert str(tmp_path / "org" / "missing@v3") in msg  # the path tried
    assert "org/missing (revision v3, file head.safetensors)" in msg  # the repository tried
    assert str(repo["cache"]) in msg and "HF_HUB_OFFLINE" in msg  # where, and why only there
    with pytest.raises(HeadError, match="file nope.safetensors"):
        hub.resolve_head("org/name:nope.safetensors")


def test_a_safetensors_name_is_only_ever_a_path(offline_cache, monkeypatch, tmp_path):
    import huggingface_hub

    def never(*a, **k):
        raise AssertionError("a .safetensors name must not be looked up on the Hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", never)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HeadError, match=f"no head file at {tmp_path}/heads/typo.safetensors$"):
        hub.resolve_head("heads/typo.safetensors")
    assert hub.parse_hub_ref("heads/typo.safetensors") is None
    assert hub.parse_hub_ref("./org/name") is None and hub.parse_hub_ref("/abs/org/name") is None
    assert hub.parse_hub_ref("a/b/c") is None  # a repository id has one slash


def test_the_plugin_config_resolves_a_repo_id_and_stays_lenient_about_plain_names(repo, monkeypatch, tmp_path):
    from swift_fast.vllm_plugin.config import PluginConfig

    monkeypatch.chdir(tmp_path)
    cfg = PluginConfig.parse({"head": "org/name@v2"})
    assert cfg.head_path == str(repo["cache"] / "models--org--name" / "snapshots" / COMMIT_B / "head.safetensors")
    assert _sha(cfg.head_path) == _sha(repo["b"])
    assert PluginConfig.parse("org/name").head_path.endswith(f"{COMMIT_A}/head.safetensors")  # the shorthand
    # a plain name that cannot be an id stays a path, refused when loaded (as before ids existed)
    assert PluginConfig.parse({"head": "h"}).head_path == str(tmp_path / "h")
    with pytest.raises(HeadError, match="org/absent"):
        PluginConfig.parse({"head": "org/absent"})


def test_the_plugin_config_does_not_import_transformers():
    import subprocess
    import sys

    code = ("import sys, swift_fast.vllm_plugin.config as c, swift_fast.hf.hub; "
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# -- a head trained here: provenance, card, info, push --------------------------------------------
CORRECT_IDS, WRONG_IDS = list(range(100, 116)), list(range(300, 316))


def _rollouts(tok, path, problems=12, n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(problems):
        prompt = list(tok.apply_chat_template([{"role": "user", "content": f"what is {i} + {i}?"}],
                                              add_generation_prompt=True, return_dict=False))
        cands = []
        for j in range(n):
            good = j % 2 == 0 if i % 3 else bool(torch.rand((), generator=g) < 0.5)
            pool = torch.tensor(CORRECT_IDS if good else WRONG_IDS)
            ids = pool[torch.randint(0, len(pool), (6,), generator=g)].tolist() + [tok.eos_token_id]
            cands.append({"token_ids": ids, "text": "", "answer": None, "correct": good})
        out.append(Problem(id=f"toy/{i}", candidates=cands, prompt_token_ids=prompt, question=f"q{i}"))
    write_rollouts(path, out)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A head trained by the train job (the probe, the default) on a tiny Llama; its card beside it."""
    from transformers import AutoTokenizer

    from swift_fast.jobs.train import plan_train, run_train
    from swift_fast.training import TrainSettings

    model_dir = tiny_model_dir(tmp_path_factory, "llama", num_layers=2)
    tmp = tmp_path_factory.mktemp("trained")
    data = tmp / "rollouts.jsonl"
    _rollouts(AutoTokenizer.from_pretrained(model_dir), data)
    job = run_train(plan_train(model_dir, str(data), TrainSettings(layers="0,2")), str(tmp / "head.safetensors"),
                    progress=False)
    return {"model": model_dir, "data": str(data), "head": job.head_path, "card": job.card_path, "job": job}


def test_train_writes_the_provenance_and_a_card_beside_the_head(trained):
    meta, tensors = _raw(trained["head"])
    prov = json.loads(meta["provenance"])
    # the model and its version: a local folder, so a digest of its weights, config and tokenizer
    assert prov["model"]["name"] == trained["model"] == meta["model"]
    assert prov["model"]["source"] == "local" and prov["model"]["revision"].startswith("sha256:")
    assert len(prov["model"]["revision"]) == len("sha256:") + 64
    assert prov["settings"]["layers"] == "0,2" and json.loads(meta["layers"]) == [0, 2]
    assert prov["settings"]["alignment"] == meta["alignment"] == "predicting"
    assert prov["data"]["path"] == trained["data"] and prov["data"]["bytes"] == os.path.getsize(trained["data"])
    assert prov["data"]["sha256"] == _sha(trained["data"]) and prov["data"]["problems"] == 12
    assert prov["solver"] == "probe" and isinstance(prov["lambda"], float) and prov["val_metrics"]["auc"] is not None
    assert prov["baselines"]["verdict"]["text"]
    # the card: beside the head, made from the head's own metadata
    assert trained["card"] == trained["head"][: -len(".safetensors")] + ".md"
    card = open(trained["card"], encoding="utf-8").read()
    assert card == hub.model_card(SwiftHead.load(trained["head"]), "head.safetensors")
    assert f"# SWIFT head for {trained['model']}" in card
    assert f"swift-fast serve --head head.safetensors {trained['model']}" in card
    assert trained["data"] in card and f"{prov['val_metrics']['auc']:.3f}" in card
    assert prov["baselines"]["verdict"]["text"] in card and "## License" in card
    assert "\nlicense: apache-2.0\n" in card and "released under Apache-2.0, the license of swift-fast" in card


def test_the_cards_license_is_the_projects():
    import re

    import swift_fast

    setup = open(os.path.join(os.path.dirname(os.path.dirname(swift_fast.__file__)), "setup.py")).read()
    assert re.search(r'\blicense="([^"]+)"', setup)[1] == hub.PROJECT_LICENSE


def _expected_lines(path) -> list[str]:
    """Figures ``head info`` must show, formatted here from the raw metadata."""
    meta, tensors = _raw(path)
    prov = json.loads(meta["provenance"])
    params = sum(t.numel() for t in tensors.values())
    vm = prov["val_metrics"]
    out = [meta["model"], f"{params:,}", f"hidden size  {meta['hidden_size']}", meta["alignment"],
           f"AUC {vm['auc']:.3f}", f"Best-of-N {vm['bon']:.3f}", f"oracle {vm['oracle']:.3f}",
           f"{prov['data']['problems']} problems", f"{prov['data']['candidates']} candidates",
           prov["data"]["path"]]
    if prov.get("solver") == "probe":
        out += [f"L2 strength {prov['lambda']:g}", f"{prov['folds']}-fold", prov["model"]["revision"],
                f"{prov['data']['bytes']:,} bytes", prov["baselines"]["verdict"]["text"]]
    else:
        out += [f"lr {prov['optimizer']['lr']:g}", f"epoch {prov['best_epoch']} kept of {prov['epochs_run']}"]
    return out


@pytest.mark.parametrize("which", ["trained", "demo"])
def test_head_info_on_a_file_shows_what_the_provenance_holds(trained, which, capsys):
    import swift_fast

    demo = os.path.join(os.path.dirname(swift_fast.__file__), "assets", "demo", "head.safetensors")
    path = trained["head"] if which == "trained" else demo
    assert main(["head", "info", path]) == 0
    text = capsys.readouterr().out
    for line in _expected_lines(path):
        assert line in text, (line, text)
    assert main(["head", "info", path, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    meta, tensors = _raw(path)
    assert got["provenance"] == json.loads(meta["provenance"])
    assert got["parameters"] == sum(t.numel() for t in tensors.values())
    assert got["layers"] == json.loads(meta["layers"]) and got["gate"] == json.loads(meta["gate"])
    assert got["model_fingerprint"] == json.loads(meta["model_fingerprint"]) and got["format"] == meta["format"]
    assert got["source"]["path"] == os.path.abspath(path) and got["source"]["repo_id"] is None


def test_head_info_on_a_repo_id(trained, offline_cache, monkeypatch, tmp_path, capsys):
    _cache_repo(offline_cache, "org/tiny-swift", {COMMIT_A: {"head.safetensors": trained["head"]}},
                {"main": COMMIT_A})
    monkeypatch.chdir(tmp_path)
    assert main(["head", "info", "org/tiny-swift", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["source"]["repo_id"] == "org/tiny-swift" and got["source"]["commit"] == COMMIT_A
    assert got["provenance"] == json.loads(_raw(trained["head"])[0]["provenance"])
    assert main(["head", "info", "org/tiny-swift"]) == 0
    text = capsys.readouterr().out
    assert f"Hugging Face Hub org/tiny-swift, file head.safetensors, revision main, commit {COMMIT_A}" in text
    for line in _expected_lines(trained["head"]):
        assert line in text
    assert main(["head", "info", "org/absent"]) == 2
    assert "org/absent" in capsys.readouterr().err


def test_head_push_to_folder_writes_the_repository_layout_and_card(trained, tmp_path, capsys):
    out = tmp_path / "repo"
    assert main(["head", "push", trained["head"], "org/tiny-swift", "--to-folder", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["README.md", "head.safetensors"]
    assert _sha(out / "head.safetensors") == _sha(trained["head"])  # the head, byte for byte
    card = (out / "README.md").read_text()
    prov = json.loads(_raw(trained["head"])[0]["provenance"])
    assert card.startswith("---\nlibrary_name: swift-fast\n") and "\n---\n" in card
    assert f"swift-fast serve --head org/tiny-swift {trained['model']}" in card
    assert f"--model {trained['model']} --head org/tiny-swift" in card
    assert '"head": "org/tiny-swift"' in card and "sf.best_output(out)" in card
    assert f"{prov['val_metrics']['auc']:.3f}" in card and prov["baselines"]["verdict"]["text"] in card
    assert f"{prov['baselines']['head']['within_auc']:.3f}" in card  # the baselines table
    # the folder is a repository: it resolves as a head, and a rerun into it is fine, anything else is refused
    assert hub.resolve_head(str(out)) == str(out / "head.safetensors")
    assert main(["head", "push", trained["head"], "org/tiny-swift", "--to-folder", str(out)]) == 0
    (out / "notes.txt").write_text("x")
    assert main(["head", "push", trained["head"], "org/tiny-swift", "--to-folder", str(out)]) == 2
    assert "notes.txt" in capsys.readouterr().err
    assert main(["head", "push", trained["head"], "org/name@v1", "--to-folder", str(tmp_path / "r2")]) == 2


def test_an_edited_card_is_published_as_written(trained, tmp_path):
    import shutil

    head = tmp_path / "h.safetensors"
    shutil.copyfile(trained["head"], head)
    assert hub.write_card(head) == str(tmp_path / "h.md")
    card = hub.write_repo_folder(str(head), "org/x", tmp_path / "r1")["card"]
    assert "--head org/x" in open(card).read()  # unedited: made for the repository
    (tmp_path / "h.md").write_text("# my own words\n")
    done = hub.write_repo_folder(str(head), "org/x", tmp_path / "r2")
    assert open(done["card"]).read() == "# my own words\n" and "edited" in done["card_source"]


def test_head_push_uploads_exactly_that_folder(trained, tmp_path, monkeypatch, capsys):
    import huggingface_hub
    import huggingface_hub.constants as constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    calls = []

    class FakeApi:
        def __init__(self, token=None):
            pass

        def create_repo(self, repo_id, **kw):
            calls.append(("create_repo", repo_id, kw))

        def create_branch(self, repo_id, **kw):
            calls.append(("create_branch", repo_id, kw))

        def upload_folder(self, **kw):
            files = {f: _sha(os.path.join(kw["folder_path"], f)) for f in os.listdir(kw["folder_path"])}
            calls.append(("upload_folder", kw["repo_id"], {"revision": kw["revision"], "files": files}))
            return type("CommitInfo", (), {"commit_url": "https://hub.example/commit/1"})()

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    assert main(["head", "push", trained["head"], "org/tiny-swift", "--revision", "v1", "--private"]) == 0
    assert "https://hub.example/commit/1" in capsys.readouterr().out
    hub.write_repo_folder(trained["head"], "org/tiny-swift", tmp_path / "local")
    local = {f: _sha(tmp_path / "local" / f) for f in os.listdir(tmp_path / "local")}
    assert calls == [
        ("create_repo", "org/tiny-swift", {"private": True, "exist_ok": True, "repo_type": "model"}),
        ("create_branch", "org/tiny-swift", {"branch": "v1", "exist_ok": True, "repo_type": "model"}),
        ("upload_folder", "org/tiny-swift", {"revision": "v1", "files": local}),
    ]


def test_head_push_is_refused_offline(trained, offline_cache, capsys):
    assert main(["head", "push", trained["head"], "org/tiny-swift"]) == 2
    assert "HF_HUB_OFFLINE" in capsys.readouterr().err


def test_a_hub_head_on_the_wrong_model_is_refused_naming_both(trained, offline_cache, tmp_path_factory, tmp_path,
                                                              monkeypatch, capsys):
    _cache_repo(offline_cache, "org/tiny-swift", {COMMIT_A: {"head.safetensors": trained["head"]}},
                {"main": COMMIT_A})
    other = tiny_model_dir(tmp_path_factory, "qwen2", num_layers=3)
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_text("")
    rc = main(["score", "--model", other, "--head", "org/tiny-swift", "--rollouts", str(rollouts),
               "--out", str(tmp_path / "s.jsonl"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and f"does not fit model {other}" in err and f"head trained on {trained['model']}" in err
