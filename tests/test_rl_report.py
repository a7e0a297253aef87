"""The RL recipe's report (``swift_fast.demo.real_rl_report``) on files written here by hand: the
figures it prints are the means and paired differences computed here, and a run still going is
read from its latest checkpoint."""

from __future__ import annotations

import json
import os

import pytest

from swift_fast.demo.real_rl_report import arm_log, summary, write_report


def _write(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f)


def _eval(step, acc, length):
    return {"step": step, "ids": ["a", "b", "c", "d"], "accuracy": acc, "length": length}


@pytest.fixture
def run(tmp_path):
    out = str(tmp_path)
    recipe = {"steps": 4, "prompts_per_step": 2, "generations": 2, "learning_rate": 1e-5, "temperature": 0.7,
              "top_p": 0.9, "max_completion_length": 8, "seed": 0, "test_problems": 4, "eval_n": 4}
    _write(os.path.join(out, "recipe.json"), {"recipe": recipe, "arms": {"rvr": 0.0, "rvr_sar": 0.2}})
    _write(os.path.join(out, "rvr", "eval", "step_0000.json"), _eval(0, [0.25, 0.5, 0.0, 1.0], [10, 20, 30, 40]))
    _write(os.path.join(out, "rvr", "eval", "step_0004.json"), _eval(4, [0.5, 0.5, 0.25, 1.0], [8, 20, 26, 30]))
    _write(os.path.join(out, "rvr_sar", "eval", "step_0000.json"), _eval(0, [0.25, 0.5, 0.0, 1.0], [10, 20, 30, 40]))
    _write(os.path.join(out, "rvr_sar", "eval", "step_0004.json"), _eval(4, [0.75, 0.5, 0.25, 0.75], [6, 10, 20, 24]))
    log = [{"step": s, "reward": 0.1 * s, "rewards/accuracy_reward/mean": 0.1 * s, "rewards/sar/mean": 0.5,
            "completions/mean_length": 20 - s} for s in range(1, 5)]
    _write(os.path.join(out, "rvr", "history.json"), {"log_history": log})
    # the second arm is still going: its latest checkpoint holds its log so far
    _write(os.path.join(out, "rvr_sar", "checkpoints", "checkpoint-2", "trainer_state.json"), {"log_history": log[:2]})
    _write(os.path.join(out, "rvr_sar", "checkpoints", "checkpoint-10", "trainer_state.json"), {"log_history": log})
    return out


def test_summary_is_the_hand_computed_means_and_paired_differences(run):
    s = summary(run)
    rvr, sar = s["arms"]["rvr"], s["arms"]["rvr_sar"]
    assert rvr["steps"][0]["accuracy"] == pytest.approx(1.75 / 4)
    assert rvr["steps"][4]["length"] == pytest.approx(84 / 4)
    # after minus before, per problem: +0.25, 0, +0.25, 0 -> +0.125; lengths -2, 0, -4, -10 -> -4
    assert rvr["accuracy_change"]["difference"] == pytest.approx(0.125)
    assert rvr["length_change"]["difference"] == pytest.approx(-4.0)
    lo, hi = rvr["accuracy_change"]["ci95"]
    assert 0.0 <= lo <= 0.125 <= hi <= 0.25
    # rvr_sar minus rvr at step 4: +0.25, 0, 0, -0.25 -> 0; lengths -2, -10, -6, -6 -> -6
    d = s["sar_minus_rvr"]
    assert d["step"] == 4
    assert d["accuracy"]["difference"] == pytest.approx(0.0)
    assert d["length"]["difference"] == pytest.approx(-6.0)
    assert sar["length_change"]["difference"] == pytest.approx((-4 - 10 - 10 - 16) / 4)


def test_a_running_arm_is_read_from_its_latest_checkpoint(run):
    assert len(arm_log(os.path.join(run, "rvr_sar"))) == 4  # checkpoint-10, not checkpoint-2 (sorted by number)
    assert arm_log(os.path.join(run, "nothing")) == []


def test_report_and_plot_are_written(run):
    path = write_report(run)
    text = open(path).read()
    assert "| rvr | 4 | 56.2% | 21.0 |" in text  # (0.5 + 0.5 + 0.25 + 1) / 4
    assert "+12.5 points" in text and "-6.0 tokens" in text
    assert os.path.getsize(os.path.join(run, "rl.png")) > 10_000


def test_the_recipes_verifier_wants_the_answer_written_out():
    from swift_fast.demo.real_rl import accuracy_reward, answered

    texts = ["7 + 11", "7 + 11 = 18", "The answer is \\boxed{18}.", "7 + 11 = 28", "18 apples", "1,018"]
    # math-verify alone accepts the first (it evaluates the expression); the recipe does not
    assert answered(texts, ["18"] * 5 + ["1018"]) == [False, True, True, False, True, True]
    chat = [[{"role": "assistant", "content": t}] for t in texts[:2]]
    assert accuracy_reward(chat, ["18", "18"], finish_reason=["stop", "length"]) == [0.0, 0.0]
