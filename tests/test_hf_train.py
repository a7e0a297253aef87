"""`swift-fast train` and `swift-fast score` on a tiny model, with a label the states carry."""

import json

import numpy as np
import pytest
import torch
from hf_fixtures import tiny_model_dir

from swift_fast.cli import main
from swift_fast.data.datasets import DataError
from swift_fast.data.rollouts import Problem, read_rollouts, write_rollouts
from swift_fast.hf import swift_scores, train_from_rollouts
from swift_fast.rewards.head import SwiftHead
from swift_fast.training import LOSSES, LabelBalanceError, LabelShareWarning, split_by_problem

transformers = pytest.importorskip("transformers")

CORRECT_IDS = list(range(100, 116))
WRONG_IDS = list(range(300, 316))


def _rollouts(tok, path, problems=20, n=8, seed=0):
    """Correct candidates are drawn from one set of tokens, wrong ones from another: the label is
    in the states (the embeddings of the response tokens), not in anything else."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(problems):
        prompt = list(
            tok.apply_chat_template(
                [{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}],
                add_generation_prompt=True,
                return_dict=False,
            )
        )
        cands = []
        for _ in range(n):
            good = bool(torch.rand((), generator=g) < 0.5)
            pool = torch.tensor(CORRECT_IDS if good else WRONG_IDS)
            m = int(torch.randint(5, 10, (), generator=g))
            ids = pool[torch.randint(0, len(pool), (m,), generator=g)].tolist() + [tok.eos_token_id]
            cands.append({"token_ids": ids, "text": tok.decode(ids), "answer": None, "correct": good})
        out.append(Problem(id=f"toy/{i}", candidates=cands, prompt_token_ids=prompt, question=f"q{i}"))
    write_rollouts(path, out)
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory, "llama", num_layers=2)


@pytest.fixture(scope="module")
def model_and_tok(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(),
        AutoTokenizer.from_pretrained(model_dir),
    )


def test_train_cli_learns_the_label_and_score_cli_applies_the_head(model_dir, model_and_tok, tmp_path, capsys):
    model, tok = model_and_tok
    data = tmp_path / "rollouts.jsonl"
    _rollouts(tok, data)
    head_path = tmp_path / "head.safetensors"
    rc = main([
        "train", "--model", model_dir, "--rollouts", str(data), "--out", str(head_path), "--layers", "0,2",
        "--lr", "1e-2", "--epochs", "10", "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--solver", "adamw",
    ])
    assert rc == 0, capsys.readouterr().err
    head = SwiftHead.load(head_path)
    prov = head.provenance
    assert head.layers == [0, 2] and head.alignment == "predicting" and head.gate
    assert head.model_name == model_dir and head.model_fingerprint["num_layers"] == 2
    assert prov["loss"] == "bce" and prov["optimizer"] == {"name": "AdamW", "lr": 1e-2, "weight_decay": 1e-5}
    assert (
        prov["data"]["train_problems"] == 16 and prov["data"]["val_problems"] == 4 and len(prov["data"]["sha256"]) == 64
    )
    assert 1 <= prov["best_epoch"] <= prov["epochs_run"] <= 10
    # train's default keeps the first epoch with the best within-problem AUC on validation
    assert prov["select"] == "pairs" and prov["standardize"] is True
    aucs = [h["val_within_problem_auc"] for h in prov["history"]]
    assert prov["best_epoch"] == aucs.index(max(aucs)) + 1
    # chance is 0.5 here: a trainer that does not learn from the states cannot get there
    assert prov["val_metrics"]["balanced_accuracy"] >= 0.9 and prov["val_metrics"]["auc"] >= 0.95
    captured = capsys.readouterr()
    assert f"feature cache {tmp_path / 'cache'}: about " in captured.err and "in bfloat16" in captured.err
    lines = captured.out.splitlines()
    assert "balanced accuracy" in lines[0] and "precision" in lines[0] and "accuracy" not in lines[0].replace(
        "balanced accuracy", "")
    assert [ln.split()[0] for ln in lines[3:8]] == ["head", "length", "mean", "random", "oracle"]
    assert lines[8].startswith("AUC(within): ") and lines[9].startswith("the head ")
    summary = json.loads(lines[-1])
    assert summary["baselines"] == prov["baselines"] and summary["val"]["majority_class_share"] >= 0.5
    assert summary["baselines"]["head"]["auc"] == prov["val_metrics"]["auc"]
    assert summary["baselines"]["mean_logprob"]["auc"] is not None

    out = tmp_path / "scored.jsonl"
    assert main([
        "score", "--model", model_dir, "--head", str(head_path), "--rollouts", str(data), "--out", str(out),
        "--no-progress",
    ]) == 0
    scored = read_rollouts(out)
    problems = read_rollouts(data)
    assert [p.id for p in scored] == [p.id for p in problems]
    seqs = [p.prompt_token_ids + c["token_ids"] for p in problems for c in p.candidates]
    plens = [len(p.prompt_token_ids) for p in problems for c in p.candidates]
    want = swift_scores(model, head, seqs, plens)
    got = torch.tensor([c["swift_score"] for p in scored for c in p.candidates])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    labels = torch.tensor([c["correct"] for p in scored for c in p.candidates])
    assert ((got > 0) == labels).float().mean() >= 0.9


def test_train_cli_fits_the_probe_by_default_an_ungated_head_at_the_optimum(model_dir, model_and_tok, tmp_path,
                                                                              capsys):
    """The default for bce: the ungated head as a logistic regression on mean states. Checked by
    hand in float64: the head's score is the regression's on pooled raw states (pooling and the
    folded standardisation), and the fit is the optimum (the gradient of the objective vanishes)."""
    from swift_fast.hf import extract_features
    from swift_fast.training.probe import DEFAULT_LAMBDAS

    model, tok = model_and_tok
    data = tmp_path / "rollouts.jsonl"
    problems = _rollouts(tok, data, problems=20, n=8, seed=2)
    out = [tmp_path / f"h{i}.safetensors" for i in range(2)]
    for path in out:
        rc = main(["train", "--model", model_dir, "--rollouts", str(data), "--out", str(path), "--layers", "0,2",
                   "--no-progress"])
        assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "probe, L2 strength" in printed and "refitted on 160 candidates" in printed
    head, again = SwiftHead.load(out[0]), SwiftHead.load(out[1])
    assert torch.equal(head.weight, again.weight) and torch.equal(head.bias, again.bias)  # no seed in the fit
    prov = head.provenance
    assert not head.gate and head.weight.shape == (1, 2 * model.config.hidden_size) and head.layers == [0, 2]
    assert prov["solver"] == "probe" and prov["lambda"] in DEFAULT_LAMBDAS and prov["refit"] is True
    assert prov["lambdas"] == sorted(DEFAULT_LAMBDAS, reverse=True) and len(prov["history"]) == len(DEFAULT_LAMBDAS)
    best = max(prov["history"], key=lambda r: r["cv_within_problem_auc"])
    assert prov["lambda"] >= best["lambda"] and best["cv_within_problem_auc"] == max(
        r["cv_within_problem_auc"] for r in prov["history"] if r["lambda"] == prov["lambda"])
    assert prov["val_metrics"]["balanced_accuracy"] >= 0.9 and prov["val_metrics"]["auc"] >= 0.95

    # by hand: pooled raw states of every candidate, float64
    seqs = [p.prompt_token_ids + c["token_ids"] for p in problems for c in p.candidates]
    plens = [len(p.prompt_token_ids) for p in problems for c in p.candidates]
    y = torch.tensor([float(c["correct"]) for p in problems for c in p.candidates], dtype=torch.float64)
    states, cu = extract_features(model, seqs, plens, layers=[0, 2])
    x = torch.cat([s.double() for s in states], 1)  # [rows, 2d], layer-major
    pooled = torch.stack([x[int(cu[i]) : int(cu[i + 1])].mean(0) for i in range(len(seqs))])
    w, b = head.weight.detach().double()[0], head.bias.detach().double()[0]
    r = pooled @ w + b
    torch.testing.assert_close(swift_scores(model, head, seqs, plens).double(), r, rtol=1e-4, atol=1e-4)
    # the objective is over standardised states: |w_std|^2 = sum (w * std)^2, std over every candidate
    std = pooled.std(0, unbiased=False)
    lam = prov["lambda"]
    p_ = torch.sigmoid(r)
    grad_w = pooled.T @ (p_ - y) / len(y) + 2 * lam * w * std * std  # d/dw of mean BCE + lam |w * std|^2
    grad_b = float((p_ - y).mean())
    scale = (pooled.T.abs() @ (p_ - y).abs() / len(y)).clamp_min(1e-12)
    assert abs(grad_b) < 1e-3 and float((grad_w.abs() / scale).max()) < 1e-2


def test_the_probe_refuses_what_it_cannot_fit(model_dir, model_and_tok, tmp_path, capsys):
    from swift_fast.rewards.head import HeadError
    from swift_fast.training.probe import train_probe

    _, tok = model_and_tok
    data = tmp_path / "rollouts.jsonl"
    _rollouts(tok, data, problems=6, n=4)
    base = ["train", "--model", model_dir, "--rollouts", str(data), "--out", str(tmp_path / "h.safetensors")]
    for extra, said in ((["--solver", "probe", "--loss", "dpo"], "--solver adamw"),
                        (["--lambdas", "0.1,x"], "comma-separated"), (["--lambdas", "-1"], "positive"),
                        (["--folds", "1"], "at least 2")):
        assert main(base + extra) == 2
        assert said in capsys.readouterr().err
    assert not (tmp_path / "h.safetensors").exists()
    with pytest.raises(HeadError, match="ungated"):
        train_probe(SwiftHead(8, [0], gate=True), None, [object()], [object()])


def test_feature_cache_holds_bf16_of_the_selected_states_and_trains_on_them(model_and_tok, tmp_path, monkeypatch):
    from swift_fast.hf import extract_features
    from swift_fast.hf.train import HFFeatureSource, finite_or_none

    model, tok = model_and_tok
    problems = _rollouts(tok, tmp_path / "r.jsonl", problems=10, n=4, seed=1)
    kw = dict(layers="last2", alignment="emitted", loss="nca", lr=1e-3, max_epochs=2, progress=False, seed=7,
              solver="adamw")
    a, ra = train_from_rollouts(model, problems, **kw)
    b, rb = train_from_rollouts(model, problems, **kw)
    cache = tmp_path / "cache"
    c, rc = train_from_rollouts(model, problems, cache_dir=str(cache), **kw)
    d, rd = train_from_rollouts(model, problems, cache_dir=str(cache), **kw)  # read back from disk
    assert torch.equal(a.weight, b.weight) and finite_or_none(ra.history) == finite_or_none(rb.history)
    assert torch.equal(c.weight, d.weight) and finite_or_none(rc.history) == finite_or_none(rd.history)
    assert rc.baselines == rd.baselines  # the log-probs come back from the cache as they went in

    # on disk: the two selected states of the response tokens only, as bfloat16 bits
    seqs = [p.prompt_token_ids + c_["token_ids"] for p in problems for c_ in p.candidates]
    plens = [len(p.prompt_token_ids) for p in problems for c_ in p.candidates]
    rows = sum(len(s_) - p_ for s_, p_ in zip(seqs, plens))
    meta = json.loads((cache / "meta.json").read_text())
    assert meta["k"] == 2 and meta["d"] == model.config.hidden_size and meta["dtype"] == "torch.bfloat16"
    assert (cache / "states.bin").stat().st_size == rows * 2 * model.config.hidden_size * 2
    states, _ = extract_features(model, seqs[:3], plens[:3], layers=[1, 2], alignment="emitted")
    want = torch.stack(states, 1).to(torch.bfloat16).view(torch.int16).numpy()
    raw = np.memmap(cache / "states.bin", dtype=np.int16, mode="r").reshape(-1, 2, model.config.hidden_size)
    assert np.array_equal(raw[: len(want)], want)

    # training without a cache on features rounded to bfloat16 by hand is the cached training, bit for bit
    compute = HFFeatureSource._compute

    def rounded(self, keys):
        st, cu = compute(self, keys)
        return [x.to(torch.bfloat16).float() for x in st], cu

    monkeypatch.setattr(HFFeatureSource, "_compute", rounded)
    e, re_ = train_from_rollouts(model, problems, **kw)
    monkeypatch.undo()
    assert torch.equal(e.weight, c.weight) and torch.equal(e.bias, c.bias)
    assert finite_or_none(re_.history) == finite_or_none(rc.history)
    assert not torch.equal(e.weight, a.weight)  # the rounding is real: float32 features train another head
    assert a.alignment == "emitted" and a.layers == [1, 2] and a.provenance["alpha"] == 0.01
    # the logit feature without gate trains too, and its head reads the vocabulary
    f, _ = train_from_rollouts(model, problems, feature="logits", gate=False, max_epochs=1, progress=False,
                               solver="adamw")
    assert f.feature == "logits" and f.hidden_size == model.config.vocab_size and f.weight.shape[0] == 1


def test_a_shared_prompt_runs_once_and_gives_the_states_of_whole_sequences(model_and_tok, tmp_path):
    """``prefix``: one prompt's candidates reuse its keys and values; every state equals the one a
    forward of each whole sequence gives, to float32 rounding, and the training source hands them
    back in the order asked, prompts mixed."""
    from swift_fast.hf import extract_features
    from swift_fast.hf.train import HFFeatureSource

    model, tok = model_and_tok
    problems = _rollouts(tok, tmp_path / "r.jsonl", problems=3, n=4, seed=5)
    seqs = [p.prompt_token_ids + c["token_ids"] for p in problems for c in p.candidates]
    plens = [len(p.prompt_token_ids) for p in problems for c in p.candidates]
    for alignment in ("predicting", "emitted"):
        for feature in ("hidden", "logits"):
            whole = [extract_features(model, [s], [p], alignment=alignment, feature=feature)[0] for s, p in
                     zip(seqs[:4], plens[:4])]
            shared, cu = extract_features(model, seqs[:4], plens[:4], alignment=alignment, feature=feature,
                                          prefix=plens[0] - 1)
            assert cu.tolist() == [0, *np.cumsum([len(s) - p for s, p in zip(seqs[:4], plens[:4])]).tolist()]
            for slot, x in enumerate(shared):
                torch.testing.assert_close(x, torch.cat([w[slot] for w in whole]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="shared prefix"):
        extract_features(model, seqs[3:5], plens[3:5], prefix=plens[3] - 1)  # two prompts
    with pytest.raises(ValueError, match="shortest prompt"):
        extract_features(model, seqs[:2], plens[:2], prefix=plens[0])  # would swallow the first scored state
    keys = [9, 0, 5, 1, 10, 4]  # three prompts, interleaved
    src = HFFeatureSource(model, seqs, plens, [0, 1, 2], "predicting", "hidden")
    states, cu = src.features(keys)
    want = [extract_features(model, [seqs[k]], [plens[k]], layers=[0, 1, 2])[0] for k in keys]
    assert cu.tolist() == [0, *np.cumsum([len(seqs[k]) - plens[k] for k in keys]).tolist()]
    for slot in range(3):
        torch.testing.assert_close(states[slot], torch.cat([w[slot] for w in want]), rtol=1e-5, atol=1e-5)


def test_padding_runs_are_the_cheapest_cut_of_a_prompts_candidates():
    import itertools
    import random

    from swift_fast.hf.train import padding_runs

    rng = random.Random(3)
    for _ in range(60):
        n, most, fixed = rng.randint(1, 8), rng.randint(1, 5), rng.choice([0, 3, 50])
        lengths = sorted(rng.choice([1, 2, 5, 18, 20, 96]) for _ in range(n))
        runs = padding_runs(lengths, fixed, most)
        assert [a for a, _ in runs] == [0, *[b for _, b in runs[:-1]]] and runs[-1][1] == n  # a partition, in order
        assert all(b - a <= most for a, b in runs)

        def cost(rs, lengths=lengths, fixed=fixed):
            return sum(fixed + (b - a) * lengths[b - 1] for a, b in rs)

        best = None  # every way of cutting, by hand
        for cuts in itertools.product([0, 1], repeat=n - 1):
            edges = [0, *[i + 1 for i, c in enumerate(cuts) if c], n]
            rs = list(zip(edges, edges[1:]))
            if all(b - a <= most for a, b in rs):
                best = cost(rs) if best is None else min(best, cost(rs))
        assert cost(runs) == best


def test_mean_logprobs_of_the_feature_forward_match_a_float64_log_softmax(model_and_tok, tmp_path):
    import copy

    from swift_fast.hf.train import HFFeatureSource

    model, tok = model_and_tok
    problems = _rollouts(tok, tmp_path / "r.jsonl", problems=3, n=3, seed=4)
    seqs = [p.prompt_token_ids + c["token_ids"] for p in problems for c in p.candidates]
    plens = [len(p.prompt_token_ids) for p in problems for c in p.candidates]
    seqs.append([7, 8, 9])  # an empty prompt: no state predicts the first token, no mean log-prob
    plens.append(0)
    ref_model = copy.deepcopy(model).double()
    want = []
    with torch.no_grad():
        for s, p in zip(seqs, plens):
            if p == 0:
                want.append(float("nan"))
                continue
            logp = torch.log_softmax(ref_model(torch.tensor([s])).logits[0].double(), -1)
            # log P(r_j | prefix) is read at the position before r_j
            want.append(sum(float(logp[t - 1, s[t]]) for t in range(p, len(s))) / (len(s) - p))
    want = torch.tensor(want, dtype=torch.float64)
    # 'predicting' needs a prompt token before the first response token: the empty prompt is 'emitted' only
    for alignment, n in (("emitted", 10), ("predicting", 9)):
        src = HFFeatureSource(model, seqs[:n], plens[:n], [0, 2], alignment, "hidden", logprob_keys=[1, 4, 8])
        src.features([0, 1, 2, 3])
        assert np.isnan(src._mean_lp[[0, 2, 3]]).all() and not np.isnan(src._mean_lp[1])  # only what was asked
        src.features(list(range(4, n)))
        # the rest is computed when asked for
        torch.testing.assert_close(src.mean_logprobs(list(range(n))), want[:n], rtol=0, atol=2e-5, equal_nan=True)
    assert not torch.isnan(want[:9]).any()


def test_rollouts_without_token_ids_or_labels_are_refused_with_file_and_line(
    model_dir, model_and_tok, tmp_path, capsys
):
    model, tok = model_and_tok
    problems = _rollouts(tok, tmp_path / "ok.jsonl", problems=3, n=2)
    rows = [json.loads(json.dumps(p.to_json())) for p in problems]
    del rows[1]["candidates"][1]["token_ids"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"bad\.jsonl:2: problem 'toy/1', candidate 1: 'token_ids' has no token ids"):
        train_from_rollouts(model, str(bad), progress=False)
    head = SwiftHead(model.config.hidden_size, [0, 1, 2])
    head_path = tmp_path / "h.safetensors"
    head.save(head_path)
    rc = main([
        "score", "--model", model_dir, "--head", str(head_path), "--rollouts", str(bad),
        "--out", str(tmp_path / "o.jsonl"), "--no-progress",
    ])
    assert rc == 2 and "bad.jsonl:2" in capsys.readouterr().err
    rows = [json.loads(json.dumps(p.to_json())) for p in problems]
    rows[2]["candidates"][0]["correct"] = None
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"bad\.jsonl:3: .*'correct' must be true or false"):
        train_from_rollouts(model, str(bad), progress=False)
    # empty responses carry no scored token: left out of training and counted
    rows = [json.loads(json.dumps(p.to_json())) for p in _rollouts(tok, tmp_path / "ok3.jsonl", problems=3, n=3)]
    for r in rows:  # both kinds in every problem, after the empty one is left out too: any split can train
        for ci, c in enumerate(r["candidates"]):
            c["correct"] = ci != 1
    rows[0]["candidates"][0]["token_ids"] = []
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # 8 candidates teach little, and training says so with the counts it trains on (the empty one left out)
    with pytest.warns(LabelShareWarning, match=r"^5 of 8 candidates are correct"):
        h, _ = train_from_rollouts(model, str(bad), max_epochs=1, progress=False, solver="adamw")
    assert h.provenance["data"]["skipped_empty"] == 1 and h.provenance["data"]["candidates"] == 8


def test_train_cli_refuses_an_unsupported_architecture(tmp_path, capsys):
    from transformers import GPT2Config

    d = tmp_path / "gpt2"
    GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=64, bos_token_id=0, eos_token_id=0, architectures=["GPT2LMHeadModel"]
    ).save_pretrained(d)
    rc = main([
        "train", "--model", str(d), "--rollouts", str(tmp_path / "none.jsonl"),
        "--out", str(tmp_path / "h.safetensors"),
    ])
    assert rc == 2 and "unsupported architecture GPT2LMHeadModel" in capsys.readouterr().err


def _relabel(problems, path, correct):
    for pi, p in enumerate(problems):
        for ci, c in enumerate(p.candidates):
            c["correct"] = correct(pi, ci)
    write_rollouts(path, problems)
    return problems


def test_rollouts_that_cannot_teach_are_refused_by_the_api_and_the_cli(model_dir, model_and_tok, tmp_path, capsys):
    model, tok = model_and_tok
    data = tmp_path / "all_wrong.jsonl"
    _relabel(_rollouts(tok, tmp_path / "r.jsonl"), data, lambda pi, ci: False)
    for loss in LOSSES:
        with pytest.raises(LabelBalanceError) as e:
            train_from_rollouts(model, str(data), loss=loss, cache_dir=str(tmp_path / "cache"), progress=False)
        msg = str(e.value)
        assert f"cannot train a head with the {loss} loss: the training split has no " in msg
        assert "  all data:         20 problems, 160 candidates (0 correct, 160 incorrect); 0 problems with both" in msg
        assert "  training split:   16 problems, 128 candidates (0 correct, 128 incorrect)" in msg
        assert "every candidate is incorrect" in msg
    assert not (tmp_path / "cache").exists()  # refused before any feature was computed

    head_path = tmp_path / "h.safetensors"
    rc = main(["train", "--model", model_dir, "--rollouts", str(data), "--out", str(head_path), "--loss", "dpo"])
    captured = capsys.readouterr()
    assert rc == 2 and not head_path.exists() and "Traceback" not in captured.err
    assert captured.err.startswith("error: cannot train a head with the dpo loss: the training split has no problem")
    assert "(0 correct, 160 incorrect)" in captured.err

    # both classes overall, one per problem: a pairwise loss has nothing to compare
    mixed = tmp_path / "one_kind_per_problem.jsonl"
    _relabel(_rollouts(tok, tmp_path / "r.jsonl"), mixed, lambda pi, ci: pi % 2 == 0)
    with pytest.raises(LabelBalanceError, match=r"(?s)the dpo loss: the training split has no problem with both.*"
                       r"no problem has both kinds.*pointwise loss"):
        train_from_rollouts(model, str(mixed), loss="dpo", progress=False)


def test_provenance_records_the_label_balance_and_progress_names_the_cache(model_and_tok, tmp_path, capsys):
    model, tok = model_and_tok
    data = tmp_path / "r.jsonl"
    problems = _rollouts(tok, data, problems=10, n=4, seed=3)
    head, res = train_from_rollouts(model, str(data), layers="last2", max_epochs=1, progress=True, solver="adamw")
    err = capsys.readouterr().err
    assert "train (features recomputed every epoch)" in err
    assert "features are recomputed by the model for every batch of every epoch" in err and "--cache-dir DIR" in err
    head.save(tmp_path / "h.safetensors")
    labels = SwiftHead.load(tmp_path / "h.safetensors").provenance["data"]["labels"]

    _, val_ids = split_by_problem([p.id for p in problems], 0.2, 0)
    want = {}
    for split, chosen in (("train", [p for p in problems if p.id not in val_ids]),
                          ("val", [p for p in problems if p.id in val_ids])):
        kinds = [{c["correct"] for c in p.candidates} for p in chosen]
        correct = sum(c["correct"] for p in chosen for c in p.candidates)
        want[split] = {
            "problems": len(chosen), "candidates": 4 * len(chosen), "correct": correct,
            "incorrect": 4 * len(chosen) - correct, "problems_with_both": kinds.count({True, False}),
            "problems_all_correct": kinds.count({True}), "problems_all_incorrect": kinds.count({False}),
        }
    assert labels == want == res.labels
    assert want["train"]["problems"] == 8 and want["val"]["problems"] == 2

    train_from_rollouts(model, str(data), layers="last2", max_epochs=1, cache_dir=str(tmp_path / "c"), progress=True,
                        solver="adamw")
    err = capsys.readouterr().err
    assert "training split:   8 problems" in err and "recomputed" not in err


def test_demo_head_training_refuses_rollouts_that_cannot_teach(model_dir, model_and_tok, tmp_path):
    import shutil

    _, tok = model_and_tok
    work = tmp_path / "work"
    shutil.copytree(model_dir, work / "forget" / "model")  # the build's intermediates, one folder per task
    data = work / "forget" / "train_rollouts.jsonl"
    _relabel(_rollouts(tok, tmp_path / "r.jsonl", problems=10, n=4), data, lambda pi, ci: False)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as e:
            main(["demo", "ablations", "--task", "forget", "--work", str(work), "--rollouts", str(data),
                  "--out", str(tmp_path / "o"), "--no-progress"])
    finally:
        torch.set_num_threads(threads)
    assert str(e.value.code).startswith("swift-fast demo ablations: cannot train a head with the dpo loss")


def test_train_cli_sets_the_head_beside_length_when_length_is_the_label(model_dir, model_and_tok, tmp_path, capsys):
    model, tok = model_and_tok
    data = tmp_path / "r.jsonl"
    problems = _rollouts(tok, tmp_path / "raw.jsonl", problems=20, n=6, seed=5)
    for p in problems:  # the short responses are the correct ones, whatever their tokens
        for c in p.candidates:
            c["correct"] = len(c["token_ids"]) <= 7
    write_rollouts(data, problems)
    rc = main(["train", "--model", model_dir, "--rollouts", str(data), "--out", str(tmp_path / "h.safetensors"),
               "--layers", "last2", "--epochs", "2", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    b = json.loads(out.splitlines()[-1])["baselines"]
    assert b["length"] == {"direction": "shorter", "auc": 1.0, "within_auc": 1.0, "bon": b["oracle"]["bon"]}
    table = out.splitlines()[1:9]
    assert any(ln.startswith("length (shorter better)") and ln.split()[3] == "1.000" for ln in table)
    assert "the head does not beat length (shorter better): within-problem AUC " in out
    assert " vs 1.000, difference " in out
    assert b["verdict"]["outcome"] == "does not beat"


def test_train_cli_warns_about_few_correct_candidates_before_loading_the_model(
    model_dir, model_and_tok, tmp_path, capsys, monkeypatch
):
    import swift_fast.hf.loading as loading

    _, tok = model_and_tok
    problems = _rollouts(tok, tmp_path / "raw.jsonl", problems=20, n=8)
    _, val_ids = split_by_problem([p.id for p in problems], 0.2, 0)
    val = [i for i, p in enumerate(problems) if p.id in val_ids]
    train = [i for i, p in enumerate(problems) if p.id not in val_ids]
    chosen = val[:2] + train[:7]  # 9 problems with a correct candidate, both splits have some
    twice = set(chosen[:3])
    data = tmp_path / "few.jsonl"
    _relabel(problems, data, lambda pi, ci: pi in chosen and ci < (2 if pi in twice else 1))

    def no_load(*a, **k):
        raise OSError("the model was loaded")

    monkeypatch.setattr(loading, "load_model", no_load)
    rc = main(["train", "--model", model_dir, "--rollouts", str(data), "--out", str(tmp_path / "h.safetensors"),
               "--cache-dir", str(tmp_path / "c"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.splitlines()[-1] == "error: the model was loaded"
    assert err.startswith(
        "warning: 12 of 160 candidates are correct (7.5%), in 9 of 20 problems: the head has little to learn from; "
        "collect at a lower temperature, with easier problems or more candidates\n"
    )
    rows = sum(len(c["token_ids"]) for p in problems for c in p.candidates)
    hidden = model_and_tok[0].config.hidden_size
    assert f"feature cache {tmp_path / 'c'}: about " in err and f"({rows} scored tokens x 3 x {hidden} values" in err


def test_models_load_without_transformers_bars_off_a_terminal(model_dir, capsys):
    """Off a terminal (a log file, CI) transformers' "Loading weights" bar would land as a run of
    carriage returns; on one it is drawn as usual."""
    from transformers.utils import logging as hf_logging

    from swift_fast.hf.loading import load_model, transformers_bars

    assert hf_logging.is_progress_bar_enabled()
    load_model(model_dir, dtype="float32", device="cpu")
    assert "Loading weights" not in capsys.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # as it was
    with transformers_bars(True):
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(model_dir)
    assert "Loading weights" in capsys.readouterr().err  # the bar this test would miss is there


def test_the_real_model_ablation_harness_fits_as_train_does_and_its_report_reads_every_row(model_dir, model_and_tok,
                                                                                             tmp_path):
    """The harness behind docs/real-model.md: each fit splits the problems it is given as train
    splits a file of them, the probe is refitted on all of them (or not), a learning-curve point
    sees only its first N problems, and the report prints a number for every row (a curve's last
    point is a variant's result, whose rows carry the variant's name)."""
    from swift_fast.demo.real_ablations import run_ablations
    from swift_fast.demo.real_report import plot_curve, write_report

    _, tok = model_and_tok
    _rollouts(tok, tmp_path / "train_rollouts.jsonl", problems=20, n=16, seed=3)
    _rollouts(tok, tmp_path / "held_out.jsonl", problems=6, n=16, seed=4)
    variants = {"probe": {"solver": "probe", "layers": "0,2"},
                "probe, not refitted": {"solver": "probe", "layers": "0,2", "refit": False},
                "epoch loop": {"layers": "0,2", "lr": 1e-2}}
    res = run_ablations(str(tmp_path), variants=variants, curve=(10,), model=model_dir,
                        test_rollouts=str(tmp_path / "held_out.jsonl"), log=lambda *_: None)
    v = res["variants"]
    assert res["held_out_problems"] == 6 and res["training_problems"] == 20
    assert v["probe"]["fitted_on_problems"] == 20 and v["probe, not refitted"]["fitted_on_problems"] == 16
    assert v["epoch loop"]["fitted_on_problems"] == 16 and v["epoch loop"]["best_epoch"] >= 1
    assert res["curve"][10]["problems"] == 10 and res["curve"][10]["fitted_on_problems"] == 10
    assert res["curve"][20] is v["probe"]
    # the label is in the states: every head ranks the held-out candidates almost perfectly
    assert all(r["within_problem_auc"] > 0.9 for r in v.values())
    assert json.loads((tmp_path / "ablations.json").read_text())["curve"]["20"]["bon"] == v["probe"]["bon"]
    with open(tmp_path / "times.json", "w") as f:
        json.dump({"recipe": {}, "seconds": {}}, f)
    text = open(write_report(str(tmp_path))).read()
    rows = [line for line in text.splitlines() if line.startswith("| curve ") or line.startswith("| probe")]
    assert len(rows) == 4 and not any("n/a" in line for line in rows)
    assert plot_curve(res, str(tmp_path / "curve.png")).endswith("curve.png")


def test_the_probe_picks_its_strength_by_the_loss_when_no_problem_has_both_kinds(model_dir, model_and_tok, tmp_path,
                                                                                  capsys):
    """One candidate per problem (``collect --n 1``): the within-problem AUC is undefined, so the
    strength follows the out-of-fold loss, said before the model loads; too few training problems
    for the folds are refused there too."""
    from swift_fast.training.probe import DEFAULT_LAMBDAS

    _, tok = model_and_tok
    data = tmp_path / "rollouts.jsonl"
    problems = _rollouts(tok, data, problems=60, n=1, seed=6)
    assert {len(p.candidates) for p in problems} == {1}
    out = tmp_path / "h.safetensors"
    rc = main(["train", "--model", model_dir, "--rollouts", str(data), "--out", str(out), "--layers", "0,2",
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert err.count("follows the out-of-fold loss") == 1  # said once, by the command line's early checks
    prov = SwiftHead.load(out).provenance
    hist = prov["history"]
    assert {r["selected_by"] for r in hist} == {"loss"} and len(hist) == len(DEFAULT_LAMBDAS)
    assert prov["lambda"] == min(hist, key=lambda r: (r["cv_loss"], -r["lambda"]))["lambda"]
    _rollouts(tok, data, problems=5, n=16, seed=5)  # 4 training problems after the 80/20 split
    assert main(["train", "--model", model_dir, "--rollouts", str(data), "--out", str(out) + ".2", "--folds", "5"]) == 2
    assert "5-fold cross-validation over the training problems, but the training split has 4: use --folds 4" \
        in capsys.readouterr().err


def test_the_train_job_as_a_library_and_train_from_rollouts_settings(model_dir, model_and_tok, tmp_path):
    """``swift_fast.jobs.train``: the plan says its warnings and cache before any model loads, the
    run writes the head; ``train_from_rollouts`` takes ``TrainSettings`` (``solver="auto"``, the
    probe for bce, by default) and names a keyword that is no setting."""
    from swift_fast.jobs.train import plan_train, run_train
    from swift_fast.training import TrainSettings

    model, tok = model_and_tok
    data = tmp_path / "r.jsonl"
    problems = _rollouts(tok, data, problems=10, n=4, seed=3)
    plan = plan_train(model_dir, str(data), TrainSettings(layers="0,2"), cache_dir=str(tmp_path / "c"))
    assert plan.warnings == [] and plan.cache.startswith(f"feature cache {tmp_path / 'c'}: about ")
    job = run_train(plan, str(tmp_path / "h.safetensors"), progress=False)
    assert SwiftHead.load(job.head_path).provenance["solver"] == "probe" and job.result.fit["solver"] == "probe"
    head, res = train_from_rollouts(model, problems, layers="0,2", progress=False)
    assert res.fit["solver"] == "probe" and not head.gate
    head, res = train_from_rollouts(model, problems, TrainSettings.paper(layers="0,2", max_epochs=1), progress=False)
    assert not res.fit and head.gate and head.provenance["select"] == "loss"
    with pytest.raises(TypeError, match=r"unknown keyword 'epochs' \(did you mean 'max_epochs'\?\)"):
        train_from_rollouts(model, problems, epochs=3)


def test_train_records_the_selector_its_out_of_fold_evidence_picks(model_dir, model_and_tok, tmp_path, capsys):
    """The probe's evidence is every problem scored by a fit that did not see it; the head file
    records the selector that evidence picks, with the figures behind it. Majority vote's figure
    is checked by a tally written out here, and the choice is the best figure (ties to the
    selectors that need no head)."""
    model, tok = model_and_tok
    data = tmp_path / "rollouts.jsonl"
    problems = _rollouts(tok, data, problems=20, n=8, seed=3)
    g = torch.Generator().manual_seed(1)
    for p in problems:  # the right answer is one number; wrong ones scatter over three
        for c in p.candidates:
            c["answer"] = "42" if c["correct"] else str(int(torch.randint(0, 3, (), generator=g)))
    write_rollouts(data, problems)
    out = tmp_path / "h.safetensors"
    rc = main(["train", "--model", model_dir, "--rollouts", str(data), "--out", str(out), "--layers", "0,2",
               "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    rec = SwiftHead.load(out).selector
    assert rec["evidence"] == "out-of-fold" and rec["problems"] == 20 and rec["candidates"] == 160
    assert f"recommended selector: {rec['select']}" in printed
    assert json.loads(printed.splitlines()[-1])["selector"] == rec
    wins = 0
    for p in problems:
        counts, first = {}, {}
        for i, c in enumerate(p.candidates):
            counts[c["answer"]] = counts.get(c["answer"], 0) + 1
            first.setdefault(c["answer"], i)
        top = max(counts, key=lambda a: (counts[a], -first[a]))
        wins += p.candidates[first[top]]["correct"]
    assert rec["accuracy"]["vote"] == pytest.approx(wins / 20)
    assert set(rec["accuracy"]) == {"swift", "vote:swift@cv", "vote", "mean_logprob"}
    order = ["vote", "mean_logprob", "swift", "vote:swift@cv"]
    best = max(order, key=lambda k: (rec["accuracy"][k], -order.index(k)))
    assert rec["select"] == (f"vote:swift@{rec['temperature']['chosen']:g}" if best == "vote:swift@cv" else best)


def test_the_curves_harness_fits_the_probe_as_train_does(model_dir, model_and_tok, tmp_path):
    """``demo real-curves``'s probe is ``train``'s: on the same rollouts its held-out scores are the
    trained head's (scored by the model), its evidence is train's recorded selector's. Vote labels
    and the pairwise fit are checked by hand."""
    from swift_fast.demo import real_curves as C

    model, tok = model_and_tok
    data = tmp_path / "rollouts.jsonl"
    problems = _rollouts(tok, data, problems=20, n=8, seed=4)
    g = torch.Generator().manual_seed(2)
    for p in problems:
        for c in p.candidates:
            c["answer"] = "42" if c["correct"] else str(int(torch.randint(0, 3, (), generator=g)))
    write_rollouts(data, problems)
    pooled = C.pooled(model, str(data), str(tmp_path / "curves" / "train.pt"), held_out=True, log=lambda *_: None)
    again = C.pooled(model, str(data), str(tmp_path / "curves" / "train.pt"), held_out=True)  # read back
    assert torch.equal(pooled.x, again.x) and set(pooled.values) >= {"mean_logprob", "confidence_tail"}
    score, evidence = C.fit_variant("probe", pooled, sorted({p.id for p in problems}), seed=0)
    head, _ = train_from_rollouts(model, str(data), progress=False)
    seqs = [p.prompt_token_ids + c["token_ids"] for p in problems for c in p.candidates]
    plens = [len(p.prompt_token_ids) for p in problems for c in p.candidates]
    torch.testing.assert_close(score(pooled.x).float(), swift_scores(model, head, seqs, plens).float(),
                               rtol=1e-3, atol=1e-3)
    assert evidence["lambda"] == head.provenance["lambda"] and len(evidence["rows"]) == 160
    test = C.HeldOut(pooled)
    point = C.evaluate("probe", 20, score, evidence, pooled, test)
    assert point["recommended"] == head.selector["select"] and point["evidence"] == head.selector["accuracy"]

    # the vote as a label: the most frequent answer (ties: the earliest), no answer never agrees
    y = C.vote_labels(["3", "4", "4", None, "3", "9", None], ["a", "a", "a", "a", "b", "b", "c"])
    assert y.tolist() == [0, 1, 1, 0, 1, 0, 0]
    # the pairwise fit is at its optimum: the gradient of its objective vanishes (float64, by hand)
    z = torch.randn(24, 5, generator=g)
    lab = torch.tensor([1, 0, 0, 1, 0, 1] * 4, dtype=torch.float32)
    grp = torch.arange(24) // 6
    w = C.fit_pairwise(z, lab, grp, 0.01).double()
    zd = z.double()
    grad = 0.02 * w
    for p_ in range(4):
        idx = (grp == p_).nonzero().flatten()
        pos, neg = idx[lab[idx] > 0.5], idx[lab[idx] < 0.5]
        for a in pos:
            for b in neg:
                d = torch.sigmoid(zd[b] @ w - zd[a] @ w)
                grad += d * (zd[b] - zd[a]) / (len(pos) * len(neg) * 4)
    assert float(grad.abs().max()) < 1e-5
