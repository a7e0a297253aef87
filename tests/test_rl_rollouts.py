"""TRL's ``GRPOTrainer`` trained with rollouts from a vLLM engine running the plugin
(``swift_fast.rl.PluginRollouts``), across weight updates.

One engine (V1 runner, in-process engine core, float32, SAR on, no head) and one training run of
three optimizer steps on a tiny Llama whose end-of-turn token is likely enough that answers end at
different lengths. The learning rate is large so that each step moves the policy visibly. At every
generation step a wrapped reward function (which TRL calls after the rollout and before the
optimizer step, so the policy is the one that generated) takes a float64 copy of the policy and
computes each completion's SAR straight from the SAR paper's equations (two plain forwards,
float64 log-softmax; ``q0`` the same chat with the user turn emptied, rendered here), and checks:

* the rollout's ``sar`` equals it (the engine generated and scored with the synced weights);
* the same completions under the *previous* step's policy give other values (the check can fail);
* the weight-version labels are the step numbers, one label per completion;
* the rollout's sampling log-probs equal the float64 policy's at TRL's temperature.
"""

from __future__ import annotations

import math

import pytest
import torch
from hf_fixtures import eos_prone_model_dir
from test_vllm_plugin import env

pytest.importorskip("vllm")
pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

pytestmark = pytest.mark.slow

STEPS = 3
TEMPERATURE = 0.8
#: vLLM float32 (its CPU kernels) against a float64 reference on the same float32 weights
ATOL = 2e-5

#: two prompts longer than a KV block (32 tokens), so a stale prefix cache would be hit
QUESTIONS = ["What is 2 + 3? Think about it step by step, then answer.", "Name a color.", "Hi there",
             "Count to three, slowly, one number on each line of your answer."]


def _chat_ids(tok, messages) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _f64_logprobs(model, prefix: list[int], response: list[int], temperature: float = 1.0) -> list[float]:
    """log P(response_j | prefix, response_<j) in float64, plain forward, full log-softmax."""
    seq = torch.tensor([prefix + response])
    with torch.no_grad():
        logits = model(seq).logits[0].double()
    logp = torch.log_softmax(logits / temperature, -1)
    return [float(logp[len(prefix) - 1 + j, t]) for j, t in enumerate(response)]


def _sar(model, prompt: list[int], q0: list[int], response: list[int]) -> float:
    """SAR paper Eq. 8-9: clip((ppl(a|q0) - ppl(a|q)) / ppl(a|q0), -1, 1)."""
    if not response:
        return float("nan")
    ppl_q = math.exp(-sum(_f64_logprobs(model, prompt, response)) / len(response))
    ppl_0 = math.exp(-sum(_f64_logprobs(model, q0, response)) / len(response))
    return max(-1.0, min(1.0, (ppl_0 - ppl_q) / ppl_0))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``(steps seen by the reward, trainer)`` of one GRPO run with plugin rollouts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from swift_fast.rl import PluginRollouts, plugin_sar_reward

    path = eos_prone_model_dir(tmp_path_factory)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    with env(VLLM_ENABLE_V1_MULTIPROCESSING=0, TRL_EXPERIMENTAL_SILENCE=1):
        # block_size 32: the longer prompts fill a block, so a stale prefix cache would be hit (the CPU default is 128)
        rollouts = PluginRollouts(path, dtype="float32", seed=3, max_model_len=256, block_size=32,
                                  kv_cache_memory_bytes=8 << 20)
    sar = plugin_sar_reward()
    seen, previous = [], {}

    def checked_sar(prompts, completions, completion_ids=None, **kw):
        # NOTE: not copy.deepcopy(model): the trainer sets an instance-level ``forward`` bound to
        # the live model, which a deep copy keeps calling
        policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
        policy.load_state_dict({k: v.detach().double() for k, v in model.state_dict().items()})
        seen.append({"prompts": prompts, "completion_ids": completion_ids, "policy": policy,
                     "before": previous.get("policy"), "step": trainer.state.global_step,
                     **{k: kw[k] for k in ("sar", "swift_weight_versions", "weight_version")},
                     "logprobs": rollouts.last["logprobs"], "reward": sar(prompts, completions, **kw)})
        previous["policy"] = policy
        return seen[-1]["reward"]

    checked_sar.__name__ = "sar"
    ds = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS])
    cfg = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("grpo")), max_steps=STEPS, per_device_train_batch_size=4,
        num_generations=2, max_completion_length=12, temperature=TEMPERATURE, learning_rate=0.05,
        report_to=[], use_cpu=True, logging_steps=1, save_strategy="no", seed=0, bf16=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[checked_sar], args=cfg, train_dataset=ds,
                          processing_class=tok, rollout_func=rollouts)
    trainer.train()
    rollouts.close()
    return seen, trainer, tok


def test_every_generation_step_ran_on_the_synced_policy(trained):
    seen, trainer, _ = trained
    assert [s["step"] for s in seen] == list(range(STEPS))
    assert trainer.state.global_step == STEPS
    for s in seen:
        assert s["weight_version"] == [str(s["step"])] * len(s["sar"])
        assert s["swift_weight_versions"] == [[str(s["step"])]] * len(s["sar"])


def test_rollout_sar_equals_float64_sar_of_the_policy_that_generated(trained):
    seen, _, tok = trained
    q0 = _chat_ids(tok, [{"role": "user", "content": ""}])
    moved = 0
    for s in seen:
        for p, ids, got in zip(s["prompts"], s["completion_ids"], s["sar"]):
            ids = [int(t) for t in ids]
            want = _sar(s["policy"], _chat_ids(tok, p), q0, ids)
            if not ids:
                assert got is None
                continue
            assert got == pytest.approx(want, abs=ATOL), (s["step"], ids)
            if s["before"] is not None:
                moved += abs(_sar(s["before"], _chat_ids(tok, p), q0, ids) - want) > 100 * ATOL
    # the policy moved between rollouts: last step's weights would have given other values
    assert moved >= 4, moved


def test_rollout_logprobs_are_the_policys_at_the_sampling_temperature(trained):
    seen, _, tok = trained
    for s in seen:
        for p, ids, got in zip(s["prompts"], s["completion_ids"], s["logprobs"]):
            want = _f64_logprobs(s["policy"], _chat_ids(tok, p), [int(t) for t in ids], TEMPERATURE)
            assert got == pytest.approx(want, abs=1e-4)


def test_the_reward_drops_sar_of_a_candidate_that_spans_two_weight_versions():
    from swift_fast.rl import plugin_sar_reward

    r = plugin_sar_reward()
    out = r(prompts=[0] * 4, completions=[0] * 4, sar=[0.25, 0.5, None, -0.125],
            swift_weight_versions=[["3"], ["3", "4"], ["3"], None])
    assert out == [0.25, None, None, -0.125]
    with pytest.raises(ValueError, match="rollout_func=PluginRollouts"):
        r(prompts=[0], completions=[0])
