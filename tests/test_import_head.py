"""`swift-fast import-head`: SWIFT reference checkpoints (aster2024/SWIFT's LinearRewardModel state
dicts, written here by hand) imported as heads, scored by ``swift_fast.hf.swift_scores`` (float32)
against the reference's own formula computed in float64 from ``output_hidden_states``."""

import hashlib
import os

import pytest
import torch
from hf_fixtures import tiny_model_dir

from swift_fast.cli import main
from swift_fast.hf import swift_scores
from swift_fast.hf.reference_heads import (
    import_reference_checkpoint,
    load_reference_state_dict,
    read_final_norm_weight,
    reference_layers,
)
from swift_fast.rewards.head import HeadError, SwiftHead

transformers = pytest.importorskip("transformers")

D_MODEL = 128  # build_tiny_model's hidden size
NUM_LAYERS = 2


# -- fixtures -------------------------------------------------------------------------------------


def _with_random_norm_gain(src: str, dst: str, seed: int, shard: bool) -> str:
    """A copy of ``src`` whose final norm has a random gain (the default, all ones, would hide a
    gain that is not folded in); ``shard`` writes it as several safetensors files with an index."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if os.path.exists(os.path.join(dst, "config.json")):
        return dst
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.model.norm.weight.copy_(0.5 + torch.rand(model.model.norm.weight.shape, generator=g) * 1.5)
    model.save_pretrained(dst, **({"max_shard_size": "200KB"} if shard else {}))
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    src = tiny_model_dir(tmp_path_factory, "llama", num_layers=NUM_LAYERS)
    return _with_random_norm_gain(src, str(tmp_path_factory.mktemp("import-head") / "llama-gain"), 1, shard=False)


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
    src = tiny_model_dir(tmp_path_factory, "qwen2", num_layers=NUM_LAYERS)
    return _with_random_norm_gain(src, str(tmp_path_factory.mktemp("import-head") / "qwen2-gain"), 2, shard=True)


_MODELS: dict = {}


def _models(path):
    """``(float32 model for swift-fast, float64 model for the reference, tokenizer)``, loaded once."""
    if path not in _MODELS:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        m32 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        m64 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).double().eval()
        _MODELS[path] = (m32, m64, AutoTokenizer.from_pretrained(path))
    return _MODELS[path]


def _sequences(tok, seed=0):
    """Chat prompts and random responses ending with the end-of-turn token (one response empty)."""
    g = torch.Generator().manual_seed(seed)
    seqs, plens = [], []
    for q, m in [("What is 2 + 3?", 9), ("Natalia sold clips.", 14), ("x = 5", 1), ("Hi", 0)]:
        prompt = list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                              return_dict=False))
        resp = torch.randint(3, tok.vocab_size, (m,), generator=g).tolist()
        if m:
            resp[-1] = tok.eos_token_id
        seqs.append(prompt + resp)
        plens.append(len(prompt))
    return seqs, plens


def _checkpoint(path, D, gate=True, seed=0, scale=1.0):
    """A reference checkpoint, as train/extract_train.py saves it: torch.save(LinearRewardModel.state_dict()).
    Weights large enough that gates and rewards vary across tokens."""
    g = torch.Generator().manual_seed(seed)
    rows, name = (2, "fused_layer") if gate else (1, "reward_layer")
    sd = {
        f"{name}.weight": torch.randn(rows, D, generator=g) * (scale * 10.0 / D**0.5),
        f"{name}.bias": torch.randn(rows, generator=g),
    }
    torch.save(sd, path)
    return sd


def _reference_scores(m64, sd, seqs, plens, layers=None, apply_norm=False, logits=False):
    """The reference's score, float64: output_hidden_states (the final norm applied to each when
    apply_norm), a dict keyed by the --layers ints as typed, concatenated in sorted(key) order, each
    response token's own position, the checkpoint's Linear, gated average or plain mean."""
    gate = "fused_layer.weight" in sd
    name = "fused_layer" if gate else "reward_layer"
    W, b = sd[f"{name}.weight"].double(), sd[f"{name}.bias"].double()
    out = []
    for s, p in zip(seqs, plens):
        with torch.no_grad():
            o = m64(torch.tensor([s]), output_hidden_states=True, use_cache=False)
            if logits:
                feats = o.logits[0]
            else:
                hs = o.hidden_states
                if apply_norm:
                    hs = tuple(m64.model.norm(h) for h in hs)
                keys = range(len(hs)) if layers is None else layers
                selected = {i: hs[i] for i in keys}
                feats = torch.cat([selected[i][0] for i in sorted(selected)], dim=-1)
        z = feats[p:] @ W.T + b
        if gate:
            gt, r = torch.sigmoid(z[:, 0]), z[:, 1]
            out.append(float((gt * r).sum() / gt.sum().clamp(min=1e-8)))
        else:
            out.append(float(z[:, 0].sum() / max(len(z), 1)))
    return torch.tensor(out, dtype=torch.float64)


def _check_scores(model_dir, head, sd, **ref_kwargs):
    m32, m64, tok = _models(model_dir)
    seqs, plens = _sequences(tok)
    got = swift_scores(m32, head, seqs, plens, batch_size=3)
    want = _reference_scores(m64, sd, seqs, plens, **ref_kwargs)
    assert got[-1] == 0.0 and want[-1] == 0.0  # empty response
    assert want[:-1].std() > 0.1  # scores that differ across sequences: a wrong column would show
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    return got


def _config(model_dir):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir)


# -- imports that score as the reference does -------------------------------------------------------


@pytest.mark.parametrize("gate", [True, False])
def test_default_layers_score_as_the_reference(llama_dir, tmp_path, gate):
    ckpt = tmp_path / "reward_model_ce.pt"
    sd = _checkpoint(ckpt, (NUM_LAYERS + 1) * D_MODEL, gate=gate)
    head = import_reference_checkpoint(ckpt, _config(llama_dir), model_name="tiny-llama")
    assert head.layers == [0, 1, 2] and head.gate is gate and head.alignment == "emitted"
    assert head.feature == "hidden" and head.norm_eps is None
    assert head.model_name == "tiny-llama" and head.model_fingerprint["num_layers"] == NUM_LAYERS
    _check_scores(llama_dir, head, sd)


def test_unsorted_layer_subset_is_read_in_ascending_order(llama_dir, tmp_path):
    ckpt = tmp_path / "sub.pt"
    sd = _checkpoint(ckpt, 2 * D_MODEL, gate=False, seed=1)
    head = import_reference_checkpoint(ckpt, _config(llama_dir), layers=[2, 0])
    assert head.layers == [0, 2] and not head.gate
    assert any("ascending" in n for n in head.provenance["notes"])
    _check_scores(llama_dir, head, sd, layers=[2, 0])


def test_negative_and_repeated_indices_follow_the_reference(qwen2_dir, tmp_path):
    # the reference sorts the ints as typed: [-1, 0, 2] is states [2, 0, 2] in that column order
    # (-1 before 0), and its dict keeps one 0; the two blocks of state 2 are one state's features
    ckpt = tmp_path / "neg.pt"
    typed = [0, 2, -1, 0]
    sd = _checkpoint(ckpt, 3 * D_MODEL, seed=2)
    head = import_reference_checkpoint(ckpt, _config(qwen2_dir), layers=",".join(map(str, typed)))
    assert head.layers == [0, 2] and head.weight.shape == (2, 2 * D_MODEL)
    notes = " ".join(head.provenance["notes"])
    assert "repeats [0]" in notes and "-1 is state 2" in notes and "added" in notes
    _check_scores(qwen2_dir, head, sd, layers=typed)


def test_layer_spellings(llama_dir):
    assert reference_layers(None, 2).raw == [0, 1, 2]
    assert reference_layers("last2", 2).resolved == [1, 2]
    sel = reference_layers("2 0", 2)
    assert (sel.raw, sel.head_layers) == ([0, 2], [0, 2]) and "ascending" in sel.notes[0]
    assert reference_layers([0, 1], 2).notes == []  # nothing to say about a sorted list
    with pytest.raises(HeadError, match=r"layer index 3 is out of range.*0\.\.2"):
        reference_layers([0, 3], 2)
    with pytest.raises(HeadError, match=r"layer index -4 is out of range"):
        reference_layers([-4], 2)
    with pytest.raises(HeadError, match=r"'0,x'.*indices"):
        reference_layers("0,x", 2)


@pytest.mark.parametrize("gate", [True, False])
def test_logits_mode(llama_dir, tmp_path, gate):
    vocab = _config(llama_dir).vocab_size
    ckpt = tmp_path / "logits.pt"
    sd = _checkpoint(ckpt, vocab, gate=gate, seed=3, scale=0.3)
    head = import_reference_checkpoint(ckpt, _config(llama_dir), logits=True)
    assert head.feature == "logits" and head.hidden_size == vocab and head.alignment == "emitted"
    _check_scores(llama_dir, head, sd, logits=True)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_apply_norm_folds_the_final_norm(llama_dir, qwen2_dir, tmp_path, family):
    model_dir = {"llama": llama_dir, "qwen2": qwen2_dir}[family]
    cfg = _config(model_dir)
    g = read_final_norm_weight(model_dir)
    m32, _, _ = _models(model_dir)
    assert torch.equal(g, m32.model.norm.weight.detach()) and not torch.allclose(g, torch.ones_like(g))
    ckpt = tmp_path / "reward_model_ce_norm.pt"
    sd = _checkpoint(ckpt, (NUM_LAYERS + 1) * D_MODEL, seed=4, scale=0.3)
    head = import_reference_checkpoint(ckpt, cfg, apply_norm=True, norm_weight=g)
    assert head.norm_eps == cfg.rms_norm_eps
    torch.testing.assert_close(head.weight.view(2, 3, D_MODEL), sd["fused_layer.weight"].view(2, 3, D_MODEL) * g)
    assert any("a second time" in n for n in head.provenance["notes"])  # state L is normed twice
    _check_scores(model_dir, head, sd, apply_norm=True)
    # a subset without state L, and no gate
    sd = _checkpoint(ckpt, 2 * D_MODEL, gate=False, seed=5, scale=0.3)
    head = import_reference_checkpoint(ckpt, cfg, layers=[1, 0], apply_norm=True, norm_weight=g)
    _check_scores(model_dir, head, sd, layers=[1, 0], apply_norm=True)


def test_read_final_norm_weight_needs_safetensors(tmp_path, llama_dir):
    _config(llama_dir).save_pretrained(tmp_path)
    with pytest.raises(HeadError, match=r"neither model.safetensors nor model.safetensors.index.json"):
        read_final_norm_weight(tmp_path)


# -- the command line -----------------------------------------------------------------------------


def test_cli_writes_a_head_that_scores_as_the_reference(llama_dir, tmp_path, capsys):
    ckpt = tmp_path / "reward_model_ce.pt"
    sd = _checkpoint(ckpt, 2 * D_MODEL, seed=6)
    rc = main(["import-head", str(ckpt), "--model", llama_dir, "--layers", "2", "1"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    path = tmp_path / "reward_model_ce.safetensors"  # default --out: the checkpoint's name
    assert f"wrote {path}" in out and "[1, 2]" in out and "emitted" in out and "ascending" in out
    head = SwiftHead.load(path)
    assert head.layers == [1, 2] and head.alignment == "emitted" and head.model_name == llama_dir
    prov = head.provenance
    assert prov["created_by"] == "swift-fast import-head"
    assert prov["source"]["sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    assert prov["source"]["path"] == str(ckpt) and prov["options"]["layers"] == "2,1"
    assert prov["options"]["apply_norm"] is False and prov["options"]["disable_gate"] is False
    _check_scores(llama_dir, head, sd, layers=[2, 1])


def test_cli_apply_norm(qwen2_dir, tmp_path, capsys):
    ckpt = tmp_path / "n.pt"
    sd = _checkpoint(ckpt, (NUM_LAYERS + 1) * D_MODEL, seed=7, scale=0.3)
    out = tmp_path / "head.safetensors"
    rc = main(["import-head", str(ckpt), "--model", qwen2_dir, "--apply-norm", "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert rc == 0, err
    assert "RMSNorm" in stdout and f"wrote {out}" in stdout
    head = SwiftHead.load(out)
    assert head.norm_eps == _config(qwen2_dir).rms_norm_eps and head.provenance["options"]["apply_norm"] is True
    _check_scores(qwen2_dir, head, sd, apply_norm=True)


def _cli_error(capsys, *argv):
    rc = main(["import-head", *map(str, argv)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, (rc, out, err)
    return err


def test_cli_refusals(llama_dir, tmp_path, capsys):
    ckpt = tmp_path / "c.pt"
    _checkpoint(ckpt, 2 * D_MODEL)
    err = _cli_error(capsys, ckpt, "--model", llama_dir)  # trained on 2 layers, imported as all 3
    assert "D = 256" in err and "hidden size 128 x 3 layers" in err
    assert "D = 2 x 128: pass --layers with 2 indices" in err
    err = _cli_error(capsys, ckpt, "--model", llama_dir, "--layers", "0", "5")
    assert "layer index 5 is out of range" in err
    err = _cli_error(capsys, ckpt, "--model", llama_dir, "--logits", "--apply-norm")
    assert "ignores --apply_norm in logits mode" in err
    err = _cli_error(capsys, ckpt, "--model", llama_dir, "--logits")
    assert "D = 256" in err and "drop --logits" in err
    _checkpoint(ckpt, _config(llama_dir).vocab_size)
    err = _cli_error(capsys, ckpt, "--model", llama_dir)
    assert "pass --logits" in err
    err = _cli_error(capsys, tmp_path / "missing.pt", "--model", llama_dir)
    assert "no checkpoint file at" in err
    assert not list(tmp_path.glob("*.safetensors"))  # nothing written by a refusal


class _Payload:
    """What a malicious or non-weights pickle holds: unpickling it would call ``_ran``."""

    def __reduce__(self):
        return (_ran, ("unpickled",))


_CALLS: list = []


def _ran(what):
    _CALLS.append(what)
    return what


def _save(path, obj):
    torch.save(obj, path)
    return path


W2, B2 = torch.randn(2, 3 * D_MODEL), torch.randn(2)


@pytest.mark.parametrize(
    "content, message",
    [
        ({"fused_layer.weight": W2, "fused_layer.bias": B2, "extra.weight": B2},
         r"unknown key\(s\) \['extra.weight'\]"),
        ({"dim_reduction.proj.weight": torch.randn(128, 3 * D_MODEL), "dim_reduction.proj.bias": torch.randn(128),
          "base_model.fused_layer.weight": torch.randn(2, 128), "base_model.fused_layer.bias": B2},
         r"dimension-reduction checkpoint.*never finished that mode"),
        ({"fused_layer.weight": W2, "fused_layer.bias": B2, "reward_layer.weight": W2[:1], "reward_layer.bias": B2[:1]},
         r"both fused_layer"),
        ({"fused_layer.weight": W2}, r"lacks \['fused_layer.bias'\]"),
        ({"fused_layer.weight": W2[0], "fused_layer.bias": B2}, r"shape \(384,\), expected \[2, D\]"),
        ({"reward_layer.weight": W2, "reward_layer.bias": B2}, r"shape \(2, 384\), expected \[1, D\]"),
        ({"fused_layer.weight": W2, "fused_layer.bias": B2[:1]}, r"fused_layer.bias has shape \(1,\), expected \[2\]"),
        ({"fused_layer.weight": W2.long(), "fused_layer.bias": B2}, r"dtype torch.int64"),
        ({"fused_layer.weight": W2.clone().fill_(float("nan")), "fused_layer.bias": B2}, r"NaN or infinity"),
        ({"state_dict": {"fused_layer.weight": W2, "fused_layer.bias": B2}}, r"'state_dict' holds a dict.*never wraps"),
        (W2, r"holds a Tensor, not a state dict"),
        ({"fused_layer.weight": W2, "fused_layer.bias": B2, "args": _Payload()}, r"refuses to run code"),
    ],
    ids=["unknown-key", "dim-reduction", "both-sets", "missing-bias", "rank", "rows", "bias-shape", "dtype", "nan",
         "wrapped", "not-a-dict", "pickled-object"],
)
def test_bad_checkpoints_are_refused_naming_the_file(llama_dir, tmp_path, content, message):
    path = _save(tmp_path / "bad.pt", content)
    with pytest.raises(HeadError, match=message) as e:
        import_reference_checkpoint(path, _config(llama_dir))
    assert str(path) in str(e.value)
    assert _CALLS == []  # the pickled object's code never ran


def test_files_that_are_not_checkpoints(tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(HeadError, match=r"junk.pt is not a readable PyTorch checkpoint"):
        load_reference_state_dict(junk)
    head = tmp_path / "head.safetensors"
    SwiftHead(8, [0]).save(head)
    with pytest.raises(HeadError, match=r"safetensors file.*needs no import"):
        load_reference_state_dict(head)


def test_option_conflicts_are_refused_before_reading_anything(llama_dir, tmp_path):
    ckpt = tmp_path / "c.pt"
    _checkpoint(ckpt, 3 * D_MODEL)
    with pytest.raises(HeadError, match=r"ignores --layers in logits mode"):
        import_reference_checkpoint(ckpt, _config(llama_dir), logits=True, layers=[0])
    with pytest.raises(HeadError, match=r"needs the final norm's weight"):
        import_reference_checkpoint(ckpt, _config(llama_dir), apply_norm=True)
    with pytest.raises(HeadError, match=r"must be a floating-point \[128\] tensor"):
        import_reference_checkpoint(ckpt, _config(llama_dir), apply_norm=True, norm_weight=torch.ones(64))


def test_help_teaches_with_examples(capsys):
    with pytest.raises(SystemExit) as e:
        main(["import-head", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "aster2024/SWIFT" in text and "swift-fast import-head reward_model_ce.pt --model" in text
    assert "--apply-norm" in text and "--logits_mode" in text
