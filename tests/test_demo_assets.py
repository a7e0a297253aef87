"""The shipped demo artefacts load and match the fingerprints their provenance records."""

import json
import os
import shutil

import pytest
import torch

from swift_fast import SwiftHead
from swift_fast.demo import assets as A
from swift_fast.demo.recipe import DEFAULT, RECIPES
from swift_fast.demo.tokenizer import build_tokenizer

MAX_BYTES = 20 * 1024 * 1024
TASKS = sorted(A.TASK_DIRS)


@pytest.mark.parametrize("task", TASKS)
def test_shipped_files_match_provenance(task):
    root = A.TASK_DIRS[task]
    prov = A.verify(root)
    files = prov["files"]
    assert {
        "head.safetensors", "train.jsonl", "test.jsonl", "model/model.safetensors", "model/config.json"
    } <= set(files)
    total = sum(os.path.getsize(os.path.join(root, f)) for f in files)
    assert total < MAX_BYTES
    assert not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)  # safetensors only, no pickle
    assert prov["recipe"] == json.loads(json.dumps(RECIPES[task].to_dict()))  # built by the recipe in the code


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


@pytest.mark.parametrize("task", TASKS)
def test_model_tokenizer_and_head_load_and_fit(task):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = A.TASK_DIRS[task]
    model_dir = os.path.join(root, A.MODEL)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = model.config
    assert cfg.architectures == ["LlamaForCausalLM"]
    assert cfg.hidden_size // cfg.num_attention_heads == 64  # what vLLM's CPU attention accepts
    # the saved tokenizer is the one the code builds
    ref = build_tokenizer()
    assert tok.get_vocab() == ref.get_vocab()
    assert tok.chat_template == ref.chat_template
    head = SwiftHead.load(os.path.join(root, A.HEAD))
    head.check_model(cfg)
    assert head.alignment == "predicting"  # the vLLM plugin scores predicting heads during generation
    assert head.provenance.get("loss") == RECIPES[task].head.loss


@pytest.mark.parametrize("task", TASKS)
def test_splits_are_the_recipe_and_disjoint(task):
    from swift_fast.demo.build import splits

    root = A.TASK_DIRS[task]
    train, test = splits(RECIPES[task])
    assert A.read_split(root, "train.jsonl") == json.loads(json.dumps(train))
    assert A.read_split(root, "test.jsonl") == json.loads(json.dumps(test))
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


def test_lag_model_adds_up_and_lags_where_its_solver_mostly_did():
    """The second task's weights are trained too: greedy decoding writes correct running sums of
    the operands it chose, lags on 8 terms (lag rate 0.8) and not on 5 (0.2)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swift_fast.demo import task_lag as L
    from swift_fast.demo.tokenizer import prompt_ids

    root = A.TASK_DIRS["lag"]
    model = AutoModelForCausalLM.from_pretrained(os.path.join(root, A.MODEL), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(os.path.join(root, A.MODEL))
    rows = A.read_split(root, "test.jsonl")
    rows = [r for r in rows if len(r["terms"]) == 5][:8] + [r for r in rows if len(r["terms"]) == 8][:8]
    ids = [prompt_ids(tok, r["question"]) for r in rows]
    width = max(map(len, ids))
    x = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in ids])
    m = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in ids])
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=m, do_sample=False,
                             max_new_tokens=RECIPES["lag"].max_new_tokens, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    for t, r in zip(texts, rows):
        assert t in (L.solution(r["terms"]), L.solution(r["terms"], lag=True)), (r["question"], t)
    five = [L.is_correct(t, r["reference"]) for t, r in zip(texts, rows) if len(r["terms"]) == 5]
    eight = [L.lagged(t, r["terms"]) for t, r in zip(texts, rows) if len(r["terms"]) == 8]
    assert sum(five) >= 6 and sum(eight) >= 6, (five, eight)
