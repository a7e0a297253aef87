"""Candidates that finish while ``AsyncLLM.pause_generation(mode="wait")`` drains the engine (an RL
weight update, say): their SAR passes must still deliver their values, once, after the resume, and
say when they ran under another weight version than the generation (``swift_weight_versions``).

vLLM 0.32 (what runs here) queues a request added during the pause and runs it at resume. vLLM
0.33's engine core refuses it instead (``EngineCore._reject_add_while_paused``): it answers with an
``EngineCoreOutput`` whose ``finish_reason`` is ``ERROR`` and whose ``error`` says
``"engine_paused"``. That answer is reproduced here on the real 0.32 engine: while the engine is
paused, a pass the front end sends is not delivered, and 0.33's answer (its output type, with
0.33's added ``error`` field) goes into the client's output queue, where the engine core's
answers arrive. Both ways, every SAR equals the Hugging Face reference.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
import torch

pytest.importorskip("vllm")

from test_vllm_plugin import ATOL, KV_BYTES_PER_TOKEN, RTOL, TEXTS, Ref, make_head

from swift_fast.testing import build_tiny_model


@dataclasses.dataclass(frozen=True)
class RequestError:
    """vLLM 0.33's ``vllm.outputs.RequestError`` (code, message, retryable)."""

    code: str
    message: str
    retryable: bool = False


def refusal(request_id: str):
    """What vLLM 0.33's ``_reject_add_while_paused`` sends for a request added during a pause."""
    import msgspec
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

    class EngineCoreOutput033(EngineCoreOutput, array_like=True, omit_defaults=True, gc=False):
        error: Any = None  # 0.33 appends this field

    error = RequestError("engine_paused", "Generation is paused. Please retry after it resumes.", True)
    out = EngineCoreOutput033(request_id, [], finish_reason=FinishReason.ERROR, error=error)
    assert isinstance(out, msgspec.Struct)
    return EngineCoreOutputs(outputs=[out], finished_requests={request_id})


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("pause")
    path = build_tiny_model("llama", root / "llama")
    head = make_head(path, layers=[0, 2], seed=41)
    hp = str(root / "head.safetensors")
    head.save(hp)
    return path, hp, head, Ref(path)


async def _final(eng, prompt, request_id, max_tokens, started: asyncio.Event):
    from vllm import SamplingParams

    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True)
    last = None
    async for out in eng.generate({"prompt_token_ids": prompt}, params, request_id=request_id):
        started.set()
        last = out
    return last


def test_sar_passes_refused_or_queued_during_a_wait_pause_deliver_their_values(model):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    path, hp, head, ref = model
    prompt = ref.prompt(TEXTS[0])

    async def generate_across_a_pause(eng, request_id):
        started = asyncio.Event()
        task = asyncio.create_task(_final(eng, prompt, request_id, 32, started))
        fe = eng._swift_fast_frontend
        await asyncio.wait_for(started.wait(), 60)  # generating: the pause lets it finish
        # returns once the candidate finished
        await asyncio.wait_for(eng.pause_generation(mode="wait", clear_cache=False), 60)
        await asyncio.sleep(1.7)  # a refused pass is refused again meanwhile (0.5 s, then 1 s later)
        assert fe.pass_of or fe.parked, "the candidate finished during the pause and waits for its pass"
        assert not task.done(), "its output is held until the pass is back"
        return task

    async def run():
        eng = AsyncLLM.from_engine_args(AsyncEngineArgs(
            model=path, dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
            kv_cache_memory_bytes=512 * KV_BYTES_PER_TOKEN,
            additional_config={"swift_fast": {"head": hp, "sar": True}}))
        fe = eng._swift_fast_frontend
        client = eng.engine_core
        results = []
        try:
            # vLLM 0.32: the pass waits in the engine's queue and runs at resume
            task = await generate_across_a_pause(eng, "queued")
            assert fe.pass_of and not fe.passes_refused
            # a weight update while paused (the label alone: the weights stay, so SAR stays checkable)
            await eng.update_weight_version("v2")
            await eng.resume_generation()
            results.append(await asyncio.wait_for(task, 60))

            # vLLM 0.33: the engine refuses the pass while paused
            paused = True
            refused: list[str] = []
            orig_add = client.add_request_async

            async def add_request_async(request):
                if paused and request.request_id.startswith("swift-fast-"):
                    refused.append(request.request_id)
                    client.outputs_queue.put_nowait(refusal(request.request_id))
                    return
                await orig_add(request)

            client.add_request_async = add_request_async
            task = await generate_across_a_pause(eng, "refused")
            assert len(refused) >= 2 and fe.parked and not fe.pass_of, "refused, parked, retried, refused"
            paused = False
            await eng.resume_generation()
            results.append(await asyncio.wait_for(task, 60))
            assert fe.passes_refused == len(refused) and len(set(refused)) == len(refused)
            assert not fe.parked and not fe.passes and not fe.pass_of and not fe.op.request_states
        finally:
            eng.shutdown(timeout=1.0)
        return results

    results = asyncio.run(asyncio.wait_for(run(), 300))
    # the first candidate was generated before the update and its pass ran after it; the second
    # was generated, and its pass ran, after it
    assert [r.outputs[0].swift_weight_versions for r in results] == [["default", "v2"], ["v2"]]
    R = [list(r.outputs[0].token_ids) for r in results]
    assert [len(r) for r in R] == [32, 32]
    sar = torch.tensor([r.outputs[0].sar for r in results], dtype=torch.float32)
    torch.testing.assert_close(sar, ref.sar([prompt] * 2, R), rtol=RTOL, atol=ATOL)
    swift = torch.tensor([r.outputs[0].swift_score for r in results], dtype=torch.float32)
    torch.testing.assert_close(swift, ref.swift(head, [prompt] * 2, R), rtol=RTOL, atol=ATOL)
