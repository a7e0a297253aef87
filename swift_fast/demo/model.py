"""The demo model: a small Llama trained from scratch on the demo task, on the CPU.

Loss is on the response tokens only (end-of-turn included): the prompt's numbers are random and
predicting them teaches nothing. Sequences are generated on the fly from a seeded stream, so the
same seed and settings give the same model on the same torch build.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import asdict, dataclass

import torch

from . import task as T
from .tasks import module_for
from .tokenizer import build_tokenizer, prompt_ids


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int = 256
    num_layers: int = 4
    #: head_dim is hidden_size / num_heads; vLLM's CPU attention needs 64 (16 is rejected)
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 768
    max_positions: int = 512

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1500
    batch_size: int = 64
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.01
    seed: int = 0
    threads: int = 2


def llama_config(mc: ModelConfig, tokenizer):
    from transformers import LlamaConfig

    if mc.hidden_size % mc.num_heads:
        raise ValueError(f"hidden_size {mc.hidden_size} is not a multiple of num_heads {mc.num_heads}")
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=mc.hidden_size,
        intermediate_size=mc.intermediate_size,
        num_hidden_layers=mc.num_layers,
        num_attention_heads=mc.num_heads,
        num_key_value_heads=mc.num_kv_heads,
        head_dim=mc.hidden_size // mc.num_heads,
        max_position_embeddings=mc.max_positions,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        initializer_range=0.02,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        architectures=["LlamaForCausalLM"],
    )


def _batch(rng: random.Random, task_cfg, tok, size: int, exclude: set[str]):
    M = module_for(task_cfg)
    seqs, starts = [], []
    while len(seqs) < size:
        terms = M.sample_terms(rng, task_cfg)
        q = M.question(terms)
        if q in exclude:
            continue
        p = prompt_ids(tok, q)
        r = tok(M.training_solution(terms, task_cfg, rng), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        seqs.append(p + r)
        starts.append(len(p))
    n = max(len(s) for s in seqs)
    ids = torch.full((size, n), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((size, n), -100, dtype=torch.long)
    attn = torch.zeros((size, n), dtype=torch.long)
    for i, (s, st) in enumerate(zip(seqs, starts)):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, st : len(s)] = torch.tensor(s[st:])
        attn[i, : len(s)] = 1
    return ids, labels, attn


def train_model(
    out_dir: str,
    task_cfg: "T.TaskConfig",
    model_cfg: ModelConfig = ModelConfig(),
    train_cfg: TrainConfig = TrainConfig(),
    exclude: set[str] | None = None,
    progress: bool = True,
    log: list | None = None,
) -> str:
    """Train the demo model and save it (safetensors, config, tokenizer) to ``out_dir``.

    ``task_cfg``: the task's config (``task.TaskConfig`` or ``task_misread.MisreadConfig``); its
    module (``tasks.module_for``) writes the training solutions.

    ``exclude``: question texts never used for training (the held-out problems).
    """
    from tqdm.auto import tqdm
    from transformers import GenerationConfig, LlamaForCausalLM

    torch.set_num_threads(train_cfg.threads)
    torch.manual_seed(train_cfg.seed)
    rng = random.Random(train_cfg.seed)
    tok = build_tokenizer()
    model = LlamaForCausalLM(llama_config(model_cfg, tok))
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": train_cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=train_cfg.lr,
        betas=(0.9, 0.98),
    )

    def lr_at(step):
        if step < train_cfg.warmup:
            return train_cfg.lr * (step + 1) / train_cfg.warmup
        frac = (step - train_cfg.warmup) / max(1, train_cfg.steps - train_cfg.warmup)
        return train_cfg.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))

    exclude = exclude or set()
    bar = tqdm(range(train_cfg.steps), desc="train model", disable=not progress)
    t0 = time.time()
    ema = None
    for step in bar:
        ids, labels, attn = _batch(rng, task_cfg, tok, train_cfg.batch_size, exclude)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        out = model(input_ids=ids, attention_mask=attn, labels=labels)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = out.loss.item()
        ema = loss if ema is None else 0.98 * ema + 0.02 * loss
        bar.set_postfix(loss=f"{ema:.4f}")
        if not progress and step % 50 == 0:
            print(f"step {step} loss {ema:.4f} {time.time() - t0:.0f}s", flush=True)
        if log is not None and (step % 50 == 0 or step == train_cfg.steps - 1):
            log.append({"step": step, "loss": round(ema, 5), "seconds": round(time.time() - t0, 1)})
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return out_dir
