"""``emitted`` heads in vLLM: the states of a candidate's last token, from one more short forward.

The alignment (DESIGN 2). An ``emitted`` head -- the SWIFT paper's own definition, and what
``swift-fast import-head`` produces -- scores response token ``r_j`` with the states computed
when ``r_j`` is the *input*. A generation engine computes those states one step late: the
decode step that samples ``r_{j+1}`` takes ``r_j`` as its input. So the runner credits each
sampling row's state to the request's last token so far when that token is a response token
(:mod:`.runner`): every response token once, except the last, which vLLM never feeds back.
A preempted request is recomputed up to its last token, whose state (never computed before) is
the one credited: nothing is counted twice. Each step's value therefore travels with the token
sampled *after* the one it scores; the front end adds values as they come, so a streaming
``swift_score`` covers ``swift_tokens = len(token_ids) - 1`` tokens until the candidate finishes.

The last token. When a scored candidate finishes (EOS, stop token, stop string, ``max_tokens``),
the front end holds its final output, as for SAR, and submits a *last-state pass*: a request
whose prompt is the candidate's own sequence, prompt + answer (same token ids, same LoRA, same
``cache_salt``), with ``max_tokens=1``. Its one sampling row is the state of the last answer
token as an input, which the runner reports like any other scored state; the front end adds it,
and releases the candidate once all its passes (this one, and SAR's where SAR is on) are back.
With SAR on both passes are submitted together: the candidate is held once.

What it costs. The pass reads the prefix cache: vLLM caches every full KV block of the
candidate as generation fills it, and keeps them after the candidate finishes until the memory
is needed, so the pass recomputes only the tokens after the last full block of prompt + answer
minus one (vLLM always computes the last prompt token): between 1 and ``block_size`` tokens,
``(len(prompt) + len(answer) - 1) % block_size + 1``. It computes no logits beyond its one
sampling row and samples greedily. So that the blocks are still there, the pass goes to the head
of the engine core's waiting queue (:mod:`.scheduling`; under the priority policy it carries its
candidate's priority and arrival time), and with data-parallel engines to the candidate's own
engine. With prefix caching off, or when a full KV cache gave the blocks to a running request
first, the pass recomputes more, up to the whole sequence: exact, only slower (a warning at
start-up when prefix caching is off). ``FrontEnd.last_state_passes`` / ``last_state_tokens``
count the passes and the tokens they computed. The pass runs on the weights loaded when it runs:
an RL loop that updates weights while candidates are held scores their last token with the new
ones (SAR's pass alike).

Where there is no exact last state, ``swift_score`` is None with the reason logged, never the
score of a shorter answer presented as the whole: a candidate that fills ``max_model_len``
(vLLM cannot take ``max_model_len`` tokens as a prompt), a prompt with multimodal inputs or
prompt embeddings (the pass sends token ids only), a pass the engine refused. A candidate
stopped by pruning or aborted gets no pass: its partial ``swift_score`` covers its tokens but the
last, and ``swift_tokens`` says so. Pruning ranks an emitted head's candidates on their scores over
``t`` tokens once those exist, that is when token ``t + 1`` has been sampled
(:func:`swift_fast.selection.pruning.signal_lag`, which the offline replay applies too).
"""

from __future__ import annotations

from .config import KEY, LAST_STATE_KEY, SAR_PASS_KEY


def pass_params(kind: str, q0_len: int = 0):
    """``SamplingParams`` of a pass the front end submits: ``kind`` is ``"sar"`` (the
    question-removed sequence, whose answer log-probs need every position computed: prefix-cache
    reads off) or ``"last"`` (the candidate's own sequence: the cache is what makes it cheap)."""
    from vllm import SamplingParams

    if kind == "sar":
        extra, skip = {SAR_PASS_KEY: q0_len}, True
    elif kind == "last":
        extra, skip = {LAST_STATE_KEY: 1}, False
    else:
        raise ValueError(f"unknown pass kind {kind!r}")
    return SamplingParams(
        max_tokens=1, temperature=0.0, detokenize=False, skip_reading_prefix_cache=skip, extra_args={KEY: extra},
    )


def unavailable(request) -> str | None:
    """Why a request's last state cannot come from a pass of token ids (``request``: vLLM's
    ``EngineCoreRequest``), or None."""
    if request.prompt_token_ids is None or getattr(request, "prompt_embeds", None) is not None:
        return "its prompt is given as embeddings, which a last-state pass of token ids cannot reproduce"
    if getattr(request, "mm_features", None):
        return "its prompt has multimodal inputs, which a last-state pass of token ids cannot reproduce"
    return None


def too_long(prompt_len: int, answer_len: int, max_model_len: int) -> str | None:
    """Why the pass cannot run because of its length, or None."""
    if prompt_len + answer_len >= max_model_len:
        return (
            f"the candidate fills max_model_len ({prompt_len} prompt + {answer_len} answer tokens >= "
            f"{max_model_len}): vLLM cannot take it as a prompt to run its last token; raise --max-model-len "
            "or lower max_tokens"
        )
    return None
