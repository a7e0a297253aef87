"""Hugging Face transformers integration: exact features, offline and generate-time SWIFT
scoring, head training and SAR (with TRL and VERL adapters). Rollout collection, which drives vLLM
or transformers, is a job: ``swift_fast.jobs.collect``.

Supported models: Llama, Qwen2, Qwen3 and Mistral causal LMs (``...ForCausalLM``). Names load
on first use, so ``import swift_fast.hf`` does not import transformers.

=============================  ==================================================================
``swift_scores``               offline SWIFT scores of token-id sequences, each layer projected
                               as it is produced (``swift_fast.hf.scoring``)
``GenerationScorer``           SWIFT scores of what ``model.generate`` returns, no second forward
``generate_with_scores``       one-call form of the above
``extract_features``           the exact states a head reads, packed over scored tokens
``response_logprobs``          log P of response tokens without ``[T, V]`` logits
``sar_rewards``                self-aligned reward: question-kept and question-removed passes
``candidate_signals``          length, mean token log-prob and DeepConf confidence per candidate
                               (the trivial selectors' columns; ``record_signals`` on rollouts)
``trl_sar_reward``             SAR as a TRL ``GRPOTrainer`` reward function
``train_from_rollouts``        train a head on graded rollouts, features recomputed per batch
``load_model``                 model + tokenizer for the command line, architecture checked first
=============================  ==================================================================

Modules without a lazy name here: ``hub`` (heads on the Hugging Face Hub: ``org/name@rev:file``
resolved through its cache, ``head info``/``head push``, model cards), ``model_identity`` (which
model a run or a head came from), ``gguf`` (GGUF checkpoints as models), ``reference_heads`` (the
SWIFT paper's checkpoints as heads), ``rl_adapters`` (SAR as an RL trainer's reward).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "swift_scores": "scoring",
    "check_head": "scoring",
    "GenerationScorer": "generate",
    "GenerationError": "generate",
    "generate_with_scores": "generate",
    "response_lengths": "generate",
    "extract_features": "features",
    "decoder_parts": "features",
    "UnsupportedModelError": "features",
    "SUPPORTED_MODEL_TYPES": "features",
    "response_logprobs": "logprobs",
    "sar_rewards": "sar",
    "question_removed_contexts": "sar",
    "candidate_signals": "signals",
    "record_signals": "signals",
    "Signals": "signals",
    "trl_sar_reward": "rl_adapters",
    "verl_question_removed_batch": "rl_adapters",
    "verl_sar_reward": "rl_adapters",
    "verl_token_level": "rl_adapters",
    "train_from_rollouts": "train",
    "HFFeatureSource": "train",
    "rollout_sequences": "rollout_data",
    "load_model": "loading",
}

#: names that moved with the jobs (kept for one release, with a DeprecationWarning)
_MOVED = {"collect": "swift_fast.jobs.collect", "CollectConfig": "swift_fast.jobs.collect"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _MOVED:
        from .._compat import moved_warning

        moved_warning(f"swift_fast.hf.{name}", f"{_MOVED[name]}.{name}")
        return getattr(importlib.import_module(_MOVED[name]), name)
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'swift_fast.hf' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
