"""The real-model recipe's parts that run without the model: its task and its command lines."""

from __future__ import annotations

import pytest

from swift_fast.demo import arithmetic
from swift_fast.demo.real_model import RealRecipe, plan


def test_the_task_lists_every_problem_once_with_its_answer_and_splits_without_overlap():
    rows = arithmetic.problems(seed=0)
    assert len({r["prompt"] for r in rows}) == len({r["id"] for r in rows}) == len(rows) == arithmetic.space_size()
    assert len(rows) >= RealRecipe().train_problems + RealRecipe().test_problems
    ops = {"plus": "+", "minus": "-", "times": "*", "divided by": "/"}
    for r in rows:
        words = r["prompt"].replace("?", "").split(" ")
        a, b, word = int(words[2]), int(words[-1]), " ".join(words[3:-1])
        value = eval(f"{a} {ops[word]} {b}")  # by hand, from the words
        assert value == int(value) >= 1 and int(r["answer"]) == value
        assert r["id"] == f"{r['operation']}-{a}-{b}"
    train, test = arithmetic.make_splits(800, 300, seed=0)
    assert len(train) == 800 and len(test) == 300
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert arithmetic.make_splits(800, 300, seed=0) == (train, test)
    assert arithmetic.make_splits(800, 300, seed=1)[0] != train
    with pytest.raises(ValueError, match="train \\+ test"):
        arithmetic.make_splits(len(rows), 1)


def test_every_step_of_the_recipe_is_a_valid_command_line(tmp_path):
    from swift_fast import cli

    steps = plan(str(tmp_path), "m.gguf", RealRecipe(), gsm8k="gsm8k.jsonl")
    assert [s[0] for s in steps] == ["collect", "train", "bon", "bon on GSM8K"]
    for _, args, _ in steps:
        cli._ARGV = list(args)
        ns = cli.build_parser().parse_args(args)
        assert ns.command == args[0] and ns.model == "m.gguf"
    cli._ARGV = list(steps[2][1])
    bon = cli.build_parser().parse_args(steps[2][1])
    assert bon.sar and bon.prune is not None and bon.temperature == 0.7 and bon.template == arithmetic.TEMPLATE
    assert plan(str(tmp_path), "m.gguf", RealRecipe(), gsm8k=None)[-1][0] == "bon"
