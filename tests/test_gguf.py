"""GGUF checkpoints: `swift-fast import-model` and `--model FILE.gguf` on tiny GGUF files written
here (llama.cpp's layout, q/k rows reordered as llama.cpp does), compared against the weights they
were written from, loaded directly."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("gguf")

from swift_fast.cli import main
from swift_fast.hf.gguf import MANIFEST, GGUFError, import_gguf, inspect_gguf
from swift_fast.testing import build_tiny_model, write_tiny_gguf

MESSAGES = [{"role": "system", "content": "You are a reasoning expert assistant."},
            {"role": "user", "content": "What is 12 plus 34? Put the answer in \\boxed{}."}]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return build_tiny_model("llama", str(tmp_path_factory.mktemp("gguf") / "hf"), num_layers=2, seed=3)


def _gguf(tmp_path, hf_dir, quant):
    # each file in its own folder: transformers also reads a tokenizer_config.json beside the file
    d = tmp_path / quant
    d.mkdir()
    return write_tiny_gguf(hf_dir, str(d / f"tiny.{quant}.gguf"), quant=quant)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SWIFT_FAST_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def test_an_f32_gguf_imports_to_the_very_weights_and_tokenizer_it_was_written_from(tmp_path, hf_dir, cache, capsys):
    path = _gguf(tmp_path, hf_dir, "F32")
    assert main(["import-model", path]) == 0
    printed = capsys.readouterr()
    folder = printed.out.strip().splitlines()[-1]
    assert os.path.dirname(folder) == str(cache / "models")
    assert "de-quantizing" not in printed.err  # transformers' plain tqdm bar stays silent
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from tqdm.auto import tqdm

    assert gguf_utils.tqdm is tqdm  # and is given back afterwards
    ref, ref_tok = _load(hf_dir)
    got, got_tok = _load(folder)
    want = ref.state_dict()
    have = got.state_dict()
    assert set(want) == set(have)
    for name, w in want.items():
        assert torch.equal(have[name], w), name  # q/k reordering undone exactly, nothing rounded
    text = ref_tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert got_tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) == text
    ids = ref_tok(text, add_special_tokens=False)["input_ids"]
    assert got_tok(text, add_special_tokens=False)["input_ids"] == ids
    assert got_tok.eos_token == ref_tok.eos_token and got_tok.bos_token == ref_tok.bos_token
    assert torch.equal(_logits(got, ids), _logits(ref, ids))
    man = json.load(open(os.path.join(folder, MANIFEST)))
    assert man["check"]["max_abs_diff"] == 0.0 and man["header"]["architecture"] == "llama"
    assert man["source"]["file"] == os.path.basename(path) and man["dtype"] == "float32"


def test_a_q8_0_gguf_imports_to_the_dequantized_weights_and_is_converted_once(tmp_path, hf_dir, cache):
    import gguf
    from gguf import quants

    path = _gguf(tmp_path, hf_dir, "Q8_0")
    assert inspect_gguf(path)["types"]["Q8_0"] > 0
    folder = import_gguf(path, quiet=True)
    ref, _ = _load(hf_dir)
    got, _ = _load(folder)
    have = got.state_dict()
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, w in ref.state_dict().items():
        if w.dim() == 2:
            # Q8_0 blocks run along a row, so llama.cpp's row reordering of q/k commutes with
            # quantization: the dequantized value of each original weight is what must come back
            want = torch.from_numpy(quants.dequantize(quants.quantize(w.numpy(), q8), q8)).reshape(w.shape)
            assert not torch.equal(want, w)
        else:
            want = w
        assert torch.equal(have[name], want), name
    stamp = os.stat(os.path.join(folder, "model.safetensors")).st_mtime_ns
    assert import_gguf(path, quiet=True) == folder  # found by the manifest, not converted again
    assert os.stat(os.path.join(folder, "model.safetensors")).st_mtime_ns == stamp
    moved = tmp_path / "moved.gguf"
    os.link(path, moved)  # the same bytes under another name: the same folder (by hash)
    assert import_gguf(str(moved), quiet=True) == folder
    assert os.stat(os.path.join(folder, "model.safetensors")).st_mtime_ns == stamp


def test_a_command_takes_a_gguf_file_as_its_model(tmp_path, hf_dir, cache, capsys):
    path = _gguf(tmp_path, hf_dir, "F32")
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "prompt": f"What is {i} plus 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(2)))
    out = tmp_path / "r.jsonl"
    rc = main(["collect", "--model", path, "--data", str(data), "--n", "2", "--max-new-tokens", "4",
               "--engine", "transformers", "--out", str(out), "--no-progress"])
    assert rc == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(len(r["candidates"]) == 2 for r in rows)
    folder = import_gguf(path, quiet=True)
    assert rows[0]["model"] == folder  # the converted folder is what ran


def test_unsupported_files_are_refused_with_what_to_do(tmp_path, cache):
    import gguf
    import numpy as np

    def one_tensor(path, arch, name, data, **kw):
        w = gguf.GGUFWriter(str(path), arch)
        w.add_tensor(name, data, **kw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return str(path)

    arch = one_tensor(tmp_path / "gpt2.gguf", "gpt2", "token_embd.weight", np.zeros((4, 32), np.float32))
    with pytest.raises(GGUFError, match=r"architecture 'gpt2' is not supported.*llama, mistral, qwen2, qwen3"):
        import_gguf(arch)

    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1][1]
    qt = one_tensor(tmp_path / "q8_1.gguf", "llama", "blk.0.attn_q.weight", np.zeros((4, block), np.uint8),
                    raw_shape=(4, block), raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    with pytest.raises(GGUFError, match=r"quantization type Q8_1 cannot be dequantized.*Re-quantize"):
        import_gguf(qt)

    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(GGUFError, match="not a readable GGUF file"):
        import_gguf(str(junk))
    with pytest.raises(GGUFError, match="no GGUF file"):
        import_gguf(str(tmp_path / "missing.gguf"))
    assert main(["train", "--model", arch, "--rollouts", "r.jsonl", "--out", "h.safetensors"]) == 2
    assert not (cache / "models").exists() or not any(p.name.startswith("gpt2") for p in (cache / "models").iterdir())
