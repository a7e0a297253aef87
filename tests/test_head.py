import json

import pytest
import torch
from safetensors.torch import save_file

from swift_fast import HeadError, SwiftHead, resolve_layers
from swift_fast.rewards.head import FORMAT


class _Cfg:
    """Stands in for a Hugging Face config: only the attributes a fingerprint reads."""

    def __init__(self, hidden=64, layers=4, vocab=100, arch="LlamaForCausalLM", name="org/model"):
        self.hidden_size, self.num_hidden_layers, self.vocab_size = hidden, layers, vocab
        self.architectures = [arch]
        self.name_or_path = name


def test_shapes_with_and_without_gate():
    h = SwiftHead(8, [0, 2, 4])
    assert h.weight.shape == (2, 24) and h.bias.shape == (2,)
    h = SwiftHead(8, [1], gate=False)
    assert h.weight.shape == (1, 8) and h.bias.shape == (1,)


def test_layer_weight_is_a_view_of_the_right_columns():
    h = SwiftHead(3, [5, 1])
    with torch.no_grad():
        h.weight.copy_(torch.arange(12.0).view(2, 6))
    assert h.layer_weight(0).tolist() == [[0, 1, 2], [6, 7, 8]]
    assert h.layer_weight(1).tolist() == [[3, 4, 5], [9, 10, 11]]


def test_save_load_roundtrip(tmp_path):
    h = SwiftHead(16, [0, 3, 4], gate=True, alignment="emitted")
    h.bind_model(_Cfg(hidden=16, layers=4), name="org/model")
    h.provenance = {"loss": "dpo", "best_epoch": 3, "val": {"acc": 0.8}}
    p = tmp_path / "h.safetensors"
    h.save(p)
    g = SwiftHead.load(p)
    assert torch.equal(g.weight, h.weight) and torch.equal(g.bias, h.bias)
    assert (g.layers, g.gate, g.alignment, g.feature) == ([0, 3, 4], True, "emitted", "hidden")
    assert g.model_name == "org/model"
    assert g.model_fingerprint == {
        "architecture": "LlamaForCausalLM", "hidden_size": 16, "num_layers": 4, "vocab_size": 100
    }
    assert g.provenance["best_epoch"] == 3


def test_file_metadata_is_the_documented_format(tmp_path):
    from safetensors import safe_open

    h = SwiftHead(4, [1, 2], gate=False)
    h.save(tmp_path / "h.safetensors")
    with safe_open(str(tmp_path / "h.safetensors"), "pt") as f:
        meta = f.metadata()
        assert f.get_tensor("weight").dtype == torch.float32
    assert meta["format"] == "swift_fast.head/1"
    assert json.loads(meta["layers"]) == [1, 2] and meta["gate"] == "false"
    assert meta["feature"] == "hidden" and meta["alignment"] == "predicting" and meta["hidden_size"] == "4"


def test_logit_head():
    h = SwiftHead(100, feature="logits")
    assert h.layers == [-1] and h.weight.shape == (2, 100)
    h.check_model(_Cfg(vocab=100))
    with pytest.raises(HeadError, match="vocabulary size 50"):
        h.check_model(_Cfg(vocab=50))


def test_wrong_model_names_both(tmp_path):
    h = SwiftHead(64, [0, 4]).bind_model(_Cfg(hidden=64, layers=4), name="org/small")
    with pytest.raises(HeadError) as e:
        h.check_model(_Cfg(hidden=128, layers=4, name="org/big"))
    msg = str(e.value)
    assert "org/big" in msg and "org/small" in msg and "hidden size 64 != model hidden size 128" in msg
    with pytest.raises(HeadError, match=r"layers \[4\] do not exist"):
        SwiftHead(64, [0, 4]).check_model(_Cfg(hidden=64, layers=3))
    with pytest.raises(HeadError, match="architecture"):
        h.check_model(_Cfg(hidden=64, layers=4, arch="Qwen2ForCausalLM"))
    h.check_model(_Cfg(hidden=64, layers=4))


def test_corrupt_and_foreign_files(tmp_path):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(b"\x00\x01not a safetensors file")
    with pytest.raises(HeadError, match="not a readable safetensors"):
        SwiftHead.load(p)
    with pytest.raises(HeadError, match="no head file"):
        SwiftHead.load(tmp_path / "missing.safetensors")
    q = tmp_path / "foreign.safetensors"
    save_file({"weight": torch.zeros(2, 4)}, str(q), metadata={"format": "pt"})
    with pytest.raises(HeadError, match="not a swift-fast head"):
        SwiftHead.load(q)
    r = tmp_path / "future.safetensors"
    save_file({"weight": torch.zeros(2, 4), "bias": torch.zeros(2)}, str(r), metadata={"format": "swift_fast.head/9"})
    with pytest.raises(HeadError, match="upgrade swift-fast"):
        SwiftHead.load(r)


def test_shape_metadata_mismatch_and_nan(tmp_path):
    h = SwiftHead(4, [0, 1])
    meta = h.metadata()
    p = tmp_path / "m.safetensors"
    save_file({"weight": torch.zeros(2, 12), "bias": torch.zeros(2)}, str(p), metadata=meta)
    with pytest.raises(HeadError, match="do not match its metadata"):
        SwiftHead.load(p)
    save_file({"weight": torch.full((2, 8), float("nan")), "bias": torch.zeros(2)}, str(p), metadata=meta)
    with pytest.raises(HeadError, match="NaN"):
        SwiftHead.load(p)
    bad = dict(meta, layers="[0, oops")
    save_file({"weight": torch.zeros(2, 8), "bias": torch.zeros(2)}, str(p), metadata=bad)
    with pytest.raises(HeadError, match="malformed head metadata"):
        SwiftHead.load(p)
    assert meta["format"] == FORMAT


def test_constructor_errors():
    with pytest.raises(HeadError, match="alignment"):
        SwiftHead(4, [0], alignment="last")
    with pytest.raises(HeadError, match="repeats"):
        SwiftHead(4, [0, 0])
    with pytest.raises(HeadError, match="non-empty"):
        SwiftHead(4, [])


def test_resolve_layers():
    assert resolve_layers("all", 4) == [0, 1, 2, 3, 4]
    assert resolve_layers("last4", 4) == [1, 2, 3, 4]
    assert resolve_layers("0,2, 4", 4) == [0, 2, 4]
    assert resolve_layers([-1, 0], 4) == [4, 0]
    for bad, msg in [("last9", "0..4"), ("5", "out of range"), ("x,y", "comma-separated"), ("lastx", "lastN")]:
        with pytest.raises(HeadError, match=msg):
            resolve_layers(bad, 4)


# -- state norm ----------------------------------------------------------------------------


def test_state_norm_round_trip_and_format(tmp_path):
    from safetensors import safe_open

    h = SwiftHead(8, [0, 2], norm_eps=1e-6, alignment="emitted")
    p = tmp_path / "norm.safetensors"
    h.save(p)
    with safe_open(str(p), "pt") as f:
        meta = f.metadata()
    assert json.loads(meta["state_norm"]) == {"type": "rms", "eps": 1e-6}
    g = SwiftHead.load(p)
    assert g.norm_eps == 1e-6 and torch.equal(g.weight, h.weight)
    assert "norm_eps=1e-06" in repr(g)
    for eps in (0.0, 0.5, 3e-7):  # float32-unfriendly values keep their exact float64 value
        SwiftHead(8, [1], norm_eps=eps).save(p)
        assert SwiftHead.load(p).norm_eps == eps
    plain = SwiftHead(8, [1])
    plain.save(p)
    with safe_open(str(p), "pt") as f:
        assert f.metadata()["state_norm"] == "null"
    assert SwiftHead.load(p).norm_eps is None and "norm_eps=None" in repr(plain)


def test_state_norm_missing_key_loads_as_none(tmp_path):
    # heads written before the key existed
    h = SwiftHead(4, [0, 1])
    meta = {k: v for k, v in h.metadata().items() if k != "state_norm"}
    p = tmp_path / "old.safetensors"
    save_file({"weight": torch.ones(2, 8), "bias": torch.zeros(2)}, str(p), metadata=meta)
    g = SwiftHead.load(p)
    assert g.norm_eps is None and torch.equal(g.weight, torch.ones(2, 8))


def test_the_recommended_selector_round_trips_and_old_heads_have_none(tmp_path):
    """A head written before ``selector`` existed loads with none (it selects by its highest score
    as it always did) and scores exactly as the same head written with one."""
    from swift_fast.rewards.head import read_selector

    h = SwiftHead(4, [0, 1])
    h.selector = {"select": "vote:swift@0.5", "accuracy": {"swift": 0.4, "vote": 0.3}}
    new, old = tmp_path / "new.safetensors", tmp_path / "old.safetensors"
    h.save(new)
    meta = {k: v for k, v in h.metadata().items() if k != "selector"}
    save_file({"weight": h.weight.detach().contiguous(), "bias": h.bias.detach().contiguous()}, str(old), metadata=meta)
    a, b = SwiftHead.load(new), SwiftHead.load(old)
    assert a.selector == h.selector and a.recommended_select == "vote:swift@0.5" and read_selector(new) == h.selector
    assert b.selector is None and b.recommended_select is None and read_selector(old) is None
    from swift_fast.training.loop import head_scores

    states = [torch.randn(7, 4), torch.randn(7, 4)]
    cu = torch.tensor([0, 3, 7])
    assert torch.equal(head_scores(a, states, cu), head_scores(b, states, cu))


@pytest.mark.parametrize("bad", ['"vote"', '{"accuracy": 1}', '[1]', "{"])
def test_a_malformed_selector_is_a_head_error_naming_the_file(tmp_path, bad):
    from swift_fast.rewards.head import read_selector

    p = tmp_path / "bad.safetensors"
    save_file({"weight": torch.ones(2, 8), "bias": torch.zeros(2)}, str(p),
              metadata=dict(SwiftHead(4, [0, 1]).metadata(), selector=bad))
    with pytest.raises(HeadError, match="bad.safetensors"):
        SwiftHead.load(p)
    with pytest.raises(HeadError, match="bad.safetensors"):
        read_selector(p)


@pytest.mark.parametrize("eps", [-1e-6, float("nan"), float("inf"), "1e-6", True])
def test_state_norm_bad_eps(eps):
    with pytest.raises(HeadError, match="norm_eps must be"):
        SwiftHead(4, [0], norm_eps=eps)


def test_logit_head_cannot_have_a_state_norm():
    with pytest.raises(HeadError, match="logit-feature head cannot have a state norm"):
        SwiftHead(100, feature="logits", norm_eps=1e-6)
    SwiftHead(100, feature="logits", norm_eps=None)


@pytest.mark.parametrize(
    "state_norm, message",
    [
        ('{"type": "layer", "eps": 1e-5}', "expected null or"),
        ('{"type": "rms"}', "expected null or"),
        ('{"type": "rms", "eps": -1}', "norm_eps must be finite and >= 0"),
        ('{"type": "rms", "eps": "x"}', "norm_eps must be a float"),
        ("[1e-6]", "expected null or"),
        ("{oops", "malformed head metadata"),
    ],
)
def test_state_norm_bad_metadata(tmp_path, state_norm, message):
    meta = dict(SwiftHead(4, [0, 1]).metadata(), state_norm=state_norm)
    p = tmp_path / "bad.safetensors"
    save_file({"weight": torch.zeros(2, 8), "bias": torch.zeros(2)}, str(p), metadata=meta)
    with pytest.raises(HeadError, match=message):
        SwiftHead.load(p)
    # a logit head's file that claims a state norm
    meta = dict(SwiftHead(4, feature="logits").metadata(), state_norm='{"type": "rms", "eps": 1e-6}')
    save_file({"weight": torch.zeros(2, 4), "bias": torch.zeros(2)}, str(p), metadata=meta)
    with pytest.raises(HeadError, match="logit-feature head cannot have a state norm"):
        SwiftHead.load(p)
