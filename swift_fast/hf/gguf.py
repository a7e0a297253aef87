"""GGUF checkpoints as models: converted once into a Hugging Face folder, checked, and cached.

Many llama.cpp and Ollama users hold their models as one ``.gguf`` file. vLLM and swift-fast's
Hugging Face path both read a Hugging Face folder (``config.json``, safetensors, tokenizer
files), so a GGUF file is converted once: transformers reads it (``from_pretrained(dir,
gguf_file=...)``, which needs the ``gguf`` package) and dequantizes every tensor, and the model
and tokenizer are written with ``save_pretrained``. The tokenizer and the chat template are the
file's own (GGUF stores them as metadata).

Design notes:

- **One conversion per file.** The folder is named after the file's SHA-256 (first 16 hex
  digits) under the cache root (``$SWIFT_FAST_CACHE``, default ``~/.cache/swift-fast``,
  subfolder ``models``), so two paths to the same bytes share it and a changed file gets a new
  one. ``swift_fast_gguf.json`` in the folder records the source, its size and modification
  time: a later call with an unchanged file finds the folder without reading the whole file
  again. The folder is written under a temporary name and renamed when complete, so an
  interrupted conversion never leaves a folder that looks finished.
- **Checked before it is kept.** The dequantized model (as transformers holds it in memory) and
  the folder read back from disk must give the same logits on a chat-templated prompt, to the
  bit at float32 (the folder stores the dequantized values themselves); at bfloat16/float16 the
  reference is the dequantized model cast to that dtype, so the check is exact there too. A
  mismatch is an error and nothing is kept.
- **Refusals before the long part.** The architecture (``general.architecture``) and the
  quantization type of every tensor are read from the file's header (``gguf.GGUFReader``, a
  memory map: no tensor is dequantized for this) and checked against what transformers
  dequantizes and what swift-fast scores (Llama-family: llama, mistral, qwen2, qwen3). The
  message names what is unsupported and what to do.
- **Exactness has a price.** Dequantized weights are stored in float32 by default, four bytes a
  parameter (a 4-bit 7B file becomes 28 GB); ``dtype="bfloat16"`` halves that and rounds each
  weight once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import time

#: GGUF ``general.architecture`` -> the transformers model type swift-fast scores
SUPPORTED_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3"}
MANIFEST = "swift_fast_gguf.json"
FORMAT = "swift_fast.gguf_import/1"
CACHE_ENV = "SWIFT_FAST_CACHE"
DTYPES = ("float32", "bfloat16", "float16")
_CHECK_MESSAGES = [{"role": "user", "content": "What is 12 + 30? Put the answer in \\boxed{}."}]


class GGUFError(ValueError):
    """A GGUF file that cannot be imported: what is wrong and what to do."""


def is_gguf(name_or_path) -> bool:
    return isinstance(name_or_path, (str, os.PathLike)) and os.fspath(name_or_path).lower().endswith(".gguf")


def cache_root() -> str:
    return os.path.join(os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "swift-fast"),
                        "models")


def _need_gguf():
    try:
        import gguf
    except ImportError:
        raise GGUFError(
            "reading a .gguf file needs the gguf package: pip install 'swift-fast[gguf]' (or pip install gguf)"
        ) from None
    return gguf


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def inspect_gguf(path: str) -> dict:
    """The header facts an import depends on, read without dequantizing anything:
    ``architecture``, ``name``, ``tensors``, ``types`` (quantization type name -> tensor count),
    ``chat_template`` (bool). Raises ``GGUFError`` for an unreadable file, an architecture
    swift-fast does not score, or a quantization type nothing here dequantizes."""
    gguf = _need_gguf()
    from gguf import quants

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:
        raise GGUFError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None

    def text(key):
        f = reader.fields.get(key)
        if f is None or not f.data:
            return None
        return bytes(f.parts[f.data[0]]).decode("utf-8", "replace")

    arch = text("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(
            f"{path}: architecture {arch!r} is not supported; swift-fast imports GGUF files of "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} (the Llama-family models its heads score). For another "
            "architecture, convert the original Hugging Face checkpoint instead of the GGUF file"
        )
    types: dict[str, int] = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    readable = {"F32", "F16"} | {q.name for q in quants._type_traits}
    bad = sorted(set(types) - readable)
    if bad:
        raise GGUFError(
            f"{path}: quantization type {', '.join(bad)} cannot be dequantized by this gguf package "
            f"({getattr(gguf, '__version__', 'installed version')}); dequantizable types: "
            f"{', '.join(sorted(readable))}. Re-quantize the model to one of them (llama.cpp's llama-quantize, "
            "e.g. Q8_0 or Q4_K_M), or upgrade gguf"
        )
    return {"architecture": arch, "name": text("general.name"), "tensors": len(reader.tensors), "types": types,
            "chat_template": reader.fields.get("tokenizer.chat_template") is not None}


def _find_cached(path: str, root: str, sha256: str | None = None, dtype: str | None = None) -> str | None:
    """The converted folder of ``path`` under ``root``: without ``sha256``, one whose manifest
    records this very file (same real path, size and modification time), found without hashing
    the file; with it, one converted from the same bytes (and ``dtype``) under any name."""
    if not os.path.isdir(root):
        return None
    st = os.stat(path)
    real = os.path.realpath(path)
    for name in sorted(os.listdir(root)):
        m = os.path.join(root, name, MANIFEST)
        try:
            with open(m) as f:
                man = json.load(f)
        except (OSError, ValueError):
            continue
        src = man.get("source", {})
        if sha256 is not None:
            if src.get("sha256") == sha256 and man.get("dtype") == dtype:
                return os.path.dirname(m)
        elif src.get("path") == real and src.get("size") == st.st_size and src.get("mtime_ns") == st.st_mtime_ns:
            return os.path.dirname(m)
    return None


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, file=sys.stderr, flush=True)


def import_gguf(path, out: str | None = None, dtype: str = "float32", force: bool = False,
                quiet: bool = False) -> str:
    """Convert the GGUF file ``path`` into a Hugging Face folder and return that folder.

    ``out``: the folder to write (default: a folder named after the file's hash in
    ``cache_root()``, reused when it already holds this file's conversion; ``force`` converts
    again). ``dtype``: what the weights are stored in (float32 keeps the dequantized values
    exactly). The conversion is checked (module docstring) before the folder is kept; its
    manifest ``swift_fast_gguf.json`` records source, hash, header facts and the check."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise GGUFError(f"no GGUF file at {path}")
    if dtype not in DTYPES:
        raise GGUFError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    root = cache_root()
    if out is None and not force:
        hit = _find_cached(path, root)
        if hit is not None and _manifest_dtype(hit) == dtype:
            return hit
    info = inspect_gguf(path)  # refusals first: no hashing or dequantizing for a file that cannot be used
    t0 = time.perf_counter()
    digest = _sha256(path)
    if out is None:
        same = None if force else _find_cached(path, root, sha256=digest, dtype=dtype)
        if same is not None:
            _update_source(same, path)
            return same
        stem = os.path.splitext(os.path.basename(path))[0]
        out = os.path.join(root, f"{stem}-{digest[:16]}" + ("" if dtype == "float32" else f"-{dtype}"))
    _log(f"importing {path} ({info['architecture']}, {_types_text(info['types'])}) into {out}", quiet)
    tmp = out.rstrip(os.sep) + f".partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        check = _convert(path, tmp, dtype)
        man = {
            "format": FORMAT,
            "source": {"path": os.path.realpath(path), "file": os.path.basename(path), "sha256": digest,
                       "size": os.path.getsize(path), "mtime_ns": os.stat(path).st_mtime_ns},
            "header": info,
            "dtype": dtype,
            "check": check,
        }
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(man, f, indent=1)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _log(f"imported in {time.perf_counter() - t0:.0f} s; logits checked on a {check['prompt_tokens']}-token prompt "
         f"(max difference {check['max_abs_diff']:g})", quiet)
    return out


def _types_text(types: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(types.items(), key=lambda kv: -kv[1]))


def _manifest(folder: str) -> dict:
    try:
        with open(os.path.join(folder, MANIFEST)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _manifest_dtype(folder: str) -> str | None:
    return _manifest(folder).get("dtype")


def _update_source(folder: str, path: str) -> None:
    """Point the manifest at this copy of the file, so the next call finds it without hashing."""
    man = _manifest(folder)
    st = os.stat(path)
    man["source"].update(path=os.path.realpath(path), size=st.st_size, mtime_ns=st.st_mtime_ns)
    with open(os.path.join(folder, MANIFEST), "w") as f:
        json.dump(man, f, indent=1)


def _convert(path: str, out: str, dtype: str) -> dict:
    """Dequantize, save, read back and compare; returns the check's figures."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .loading import transformers_bars

    # the command prints its own two lines; transformers' per-tensor bars would redraw in place
    # NOTE: the dequantizing loop's bar is plain tqdm, not behind transformers' logging switch
    # (a log file would capture each redraw): its module's tqdm is silenced while converting
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - a transformers without GGUF support fails below anyway
        gguf_utils = None
    plain = getattr(gguf_utils, "tqdm", None)
    if plain is not None:
        gguf_utils.tqdm = functools.partial(plain, disable=True)
    try:
        with transformers_bars(False):
            return _convert_quietly(path, out, dtype, AutoModelForCausalLM, AutoTokenizer, torch)
    finally:
        if plain is not None:
            gguf_utils.tqdm = plain


def _convert_quietly(path, out, dtype, AutoModelForCausalLM, AutoTokenizer, torch) -> dict:
    d, name = os.path.split(os.path.abspath(path))
    tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    # NOTE: the in-memory model is marked as GGUF-quantized, which save_pretrained refuses; its
    # weights are plain dequantized tensors by now, so the marks are dropped before saving
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target = getattr(torch, dtype)
    model = model.to(target)
    model.config.dtype = target
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    ids = _check_ids(tokenizer)
    x = torch.tensor([ids])
    with torch.no_grad():
        want = model(input_ids=x).logits.float()
    del model
    back = AutoModelForCausalLM.from_pretrained(out, dtype=target).eval()
    with torch.no_grad():
        got = back(input_ids=x).logits.float()
    diff = float((got - want).abs().max())
    if not torch.equal(got, want):
        raise GGUFError(
            f"{path}: the converted model's logits differ from the dequantized GGUF model's by up to {diff:g} "
            "on the check prompt; nothing was kept. Please report this with the file's name and header"
        )
    reread = AutoTokenizer.from_pretrained(out)
    if _check_ids(reread) != ids:
        raise GGUFError(f"{path}: the saved tokenizer encodes the check prompt differently; nothing was kept")
    return {"prompt_tokens": len(ids), "max_abs_diff": diff, "chat_template": tokenizer.chat_template is not None}


def _check_ids(tokenizer) -> list[int]:
    if tokenizer.chat_template:
        out = tokenizer.apply_chat_template(_CHECK_MESSAGES, add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "keys"):
            out = out["input_ids"]
        return list(out)
    return tokenizer(_CHECK_MESSAGES[0]["content"])["input_ids"]


def resolve_model(name_or_path, quiet: bool = False):
    """``name_or_path`` itself, or for a ``.gguf`` file its converted folder (``import_gguf``
    with the defaults: converted on first use, reused after)."""
    if is_gguf(name_or_path):
        return import_gguf(name_or_path, quiet=quiet)
    return name_or_path
