"""The shipped demo artefacts load and match the fingerprints their provenance records."""

import json
import os
import shutil

import pytest
import torch

from swift_fast import SwiftHead
from swift_fast.demo import assets as A
from swift_fast.demo.recipe import DEFAULT
from swift_fast.demo.tokenizer import build_tokenizer

MAX_BYTES = 20 * 1024 * 1024


def test_shipped_files_match_provenance():
    prov = A.verify(A.ASSETS_DIR)
    files = prov["files"]
    assert {
        "head.safetensors", "train.jsonl", "test.jsonl", "model/model.safetensors", "model/config.json"
    } <= set(files)
    total = sum(os.path.getsize(os.path.join(A.ASSETS_DIR, f)) for f in files)
    assert total < MAX_BYTES
    assert not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)  # safetensors only, no pickle
    assert prov["recipe"] == json.loads(json.dumps(DEFAULT.to_dict()))  # built by the recipe in the code


def test_verify_names_a_changed_file(tmp_path):
    root = tmp_path / "demo"
    shutil.copytree(A.ASSETS_DIR, root)
    with open(root / "test.jsonl", "a") as f:
        f.write("\n")
    with pytest.raises(A.AssetError, match="test.jsonl has sha256"):
        A.verify(str(root))
    os.remove(root / "head.safetensors")
    with pytest.raises(A.AssetError, match="head.safetensors is missing"):
        A.verify(str(root))


def test_model_tokenizer_and_head_load_and_fit():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = os.path.join(A.ASSETS_DIR, A.MODEL)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = model.config
    assert cfg.architectures == ["LlamaForCausalLM"]
    assert cfg.hidden_size // cfg.num_attention_heads == 64  # what vLLM's CPU attention accepts
    # the saved tokenizer is the one the code builds
    ref = build_tokenizer()
    assert tok.get_vocab() == ref.get_vocab()
    assert tok.chat_template == ref.chat_template
    head = SwiftHead.load(os.path.join(A.ASSETS_DIR, A.HEAD))
    head.check_model(cfg)
    assert head.alignment == "predicting"  # the vLLM plugin scores predicting heads during generation
    assert head.provenance.get("loss") == DEFAULT.head.loss


def test_splits_are_the_recipe_and_disjoint():
    from swift_fast.demo.build import splits

    train, test = splits(DEFAULT)
    assert A.read_split(A.ASSETS_DIR, "train.jsonl") == json.loads(json.dumps(train))
    assert A.read_split(A.ASSETS_DIR, "test.jsonl") == json.loads(json.dumps(test))
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    for r in test:
        assert int(r["reference"]) == sum(r["terms"])


def test_model_adds_up_and_imitates_the_sloppy_solver():
    """The shipped weights are a trained model, not random ones: greedy decoding writes correct
    running sums, and it stops one term early where the training solver mostly did (5 terms,
    forget rate 0.7) but not where it seldom did (3 terms, 0.2)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swift_fast.demo import task as T
    from swift_fast.demo.tokenizer import prompt_ids

    model_dir = os.path.join(A.ASSETS_DIR, A.MODEL)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    rows = A.read_split(A.ASSETS_DIR, "test.jsonl")
    rows = [r for r in rows if len(r["terms"]) == 3][:8] + [r for r in rows if len(r["terms"]) == 5][:8]
    ids = [prompt_ids(tok, r["question"]) for r in rows]
    width = max(map(len, ids))
    x = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in ids])
    m = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=m, do_sample=False, max_new_tokens=DEFAULT.max_new_tokens,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    for t, r in zip(texts, rows):
        terms, used = r["terms"], T.steps_written(t) + 1
        # a prefix of the running sums, written right, and its last sum as the answer
        assert 2 <= used <= len(terms), (r["question"], t)
        assert t == T.solution(terms[:used]), (r["question"], t)
    three = [T.is_correct(t, r["reference"]) for t, r in zip(texts, rows) if len(r["terms"]) == 3]
    five = [T.stopped_early(t, r["terms"]) for t, r in zip(texts, rows) if len(r["terms"]) == 5]
    assert sum(three) >= 6 and sum(five) >= 6, (three, five)
