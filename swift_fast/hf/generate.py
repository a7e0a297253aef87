"""SWIFT scores during Hugging Face ``generate``, with no second forward pass.

Every decoding step computes each layer's state for the last position of every row; a hook on
each selected layer takes that ``[B, d]`` row. Two ways to project it (``projection=``):

- ``"step"`` (default): the rows of one step are kept until its last selected state is produced,
  then projected together (``[B, k*d] x [k*d, 2]`` in float32): one Python hook per layer and
  three kernel launches per step, so the cost in an eager, launch-bound ``generate`` stays small.
  What is held is one step's rows (``B x k x d``), never a sequence of states.
- ``"layer"``: each row is projected as its layer runs (the fused ``project_layer_`` op), into a
  float32 ``[B, 2]`` accumulator; nothing of size ``d`` outlives its layer, at one op per layer.
  Use it as well when something patches the layers to update their outputs in place (the
  supported families' layers do not: their residual adds are out of place).

After generation the per-step projections (``[steps, B, 2]`` floats) are gated and averaged over
each response, which is exactly offline scoring of the same token ids. A model split over
devices is projected on each state's own device and added on the LM head's (:mod:`.projection`).

Alignment (DESIGN 2):

- ``predicting``: step ``s`` (0-based; step 0 is the prefill) produces response token ``s`` from
  the last position's state, so every scored state exists during generation.
- ``emitted``: response token ``s`` is scored with the state where it is the *input*: that is
  step ``s + 1``. ``generate`` never feeds the last generated token back, so the scorer runs
  exactly one more decoding step (one token per row, on the cache ``generate`` returns) to
  compute it. This needs ``return_dict_in_generate=True`` (``GenerationScorer.generate`` sets
  it); without the cache the scorer refuses with a clear error rather than re-running the model.

Response span: the generated tokens up to and including the first end-of-sequence token
(``generation_config.eos_token_id`` unless told otherwise), all of them when none was
generated: the rule ``generate`` itself uses to stop a row. Pass ``response_lengths`` to
:meth:`GenerationScorer.scores` when another stopping rule ended the rows.

Supported: greedy and sampling, any ``num_return_sequences``, left-padded batches. Beam search,
assisted and prompt-lookup decoding reorder or batch steps differently and are refused.
Compiled generation (``torch.compile`` of the forward) bypasses module hooks: not supported.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..kernels.streaming import finish_, scores_from_state
from ..rewards.head import ALIGNMENT, SwiftHead
from .features import decoder_parts, state_hooks, state_indices
from .projection import Projector
from .scoring import check_head


class GenerationError(RuntimeError):
    """Generation-time scoring was asked for something it cannot do exactly."""


def response_lengths(generated: torch.Tensor, eos_token_ids: Sequence[int]) -> torch.Tensor:
    """Tokens of each row up to and including its first EOS (all of them without one): ``[B]`` int64."""
    s = generated.shape[1]
    if not eos_token_ids:
        return torch.full((generated.shape[0],), s, dtype=torch.long, device=generated.device)
    eos = torch.tensor(list(eos_token_ids), device=generated.device)
    is_eos = torch.isin(generated, eos)
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full_like(is_eos[:, 0], s - 1, dtype=torch.long))
    return (first + 1).long()


def _eos_ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        return [int(x) for x in value.flatten().tolist()]
    if isinstance(value, int):
        return [value]
    return [int(x) for x in value]


class GenerationScorer:
    """Scores every sequence a Hugging Face model generates while attached.

    Usage::

        scorer = GenerationScorer(model, head)
        out, scores = scorer.generate(**inputs, do_sample=True, num_return_sequences=8)

        # or around your own generate calls
        with GenerationScorer(model, head) as scorer:
            out = model.generate(**inputs, return_dict_in_generate=True, max_new_tokens=64)
            scores = scorer.scores(out)

    The scorer records the most recent generation: a forward pass that starts from an empty
    cache (a new ``generate`` call, or any plain forward) starts a new record.
    """

    def __init__(
        self,
        model: nn.Module,
        head: SwiftHead,
        eos_token_id: int | Sequence[int] | None = None,
        projection: str = "step",
    ):
        if projection not in ("step", "layer"):
            raise ValueError(f"projection {projection!r}: expected 'step' or 'layer'")
        self.parts = decoder_parts(model)
        check_head(model, head)
        self.model = model
        self.head = head
        self.projection = projection
        self.indices = state_indices(head.layers, head.feature, self.parts.num_layers)
        dev = self.parts.device
        self._projector = Projector(head.weight, head.hidden_size, dev, head.norm_eps)
        self._bias = head.bias.detach().to(dev, torch.float32)
        # the state produced last in a forward: its hook closes the step ("step" projection)
        self._last_slot = max(range(len(self.indices)), key=lambda i: self.indices[i])
        self._rows: list[torch.Tensor | None] = [None] * len(self.indices)
        self._eos = eos_token_id
        self._steps: list = []  # per forward: [B, rows] projections ("step") or per-device accumulators ("layer")
        self._batch = 0  # rows of the recorded generation
        self._prompt_mask: torch.Tensor | None = None
        self._handles: list = []
        self._ctx = None

    # -- hooks -----------------------------------------------------------------------------
    def attach(self) -> "GenerationScorer":
        if self._handles or self._ctx is not None:
            return self
        self._handles.append(self.parts.base.register_forward_pre_hook(self._on_step, with_kwargs=True))
        if self.head.feature == "logits":
            # generate computes the last position's logits anyway: read them, do not recompute.
            def on_logits(module, args, output):
                self._project(0, output)

            self._handles.append(self.parts.lm_head.register_forward_hook(on_logits))
        else:
            self._ctx = state_hooks(self.parts, self.indices, self._project)
            self._ctx.__enter__()
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self._ctx = None

    def __enter__(self) -> "GenerationScorer":
        return self.attach()

    def __exit__(self, *exc) -> None:
        self.detach()

    def reset(self) -> None:
        self._steps = []
        self._rows = [None] * len(self.indices)
        self._prompt_mask = None

    def _on_step(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        ref = ids if ids is not None else kwargs.get("inputs_embeds")
        cache = kwargs.get("past_key_values")
        if cache is None or cache.get_seq_length() == 0:
            self.reset()
            mask = kwargs.get("attention_mask")
            if not (isinstance(mask, torch.Tensor) and mask.dim() == 2):
                mask = torch.ones(ref.shape[:2], dtype=torch.long, device=ref.device)
            if not bool(mask[:, -1].all()):
                raise GenerationError(
                    "the prompts are right-padded: generate (and the scorer, which reads the last position of "
                    "each row) needs left padding; set tokenizer.padding_side = 'left'"
                )
            self._prompt_mask = mask
        # "layer": per-device accumulators of the step, added up when scores are asked for
        self._steps.append(self._projector.new_accumulators() if self.projection == "layer" else None)
        self._batch = ref.shape[0]

    def _project(self, slot: int, h: torch.Tensor) -> None:
        if not self._steps:
            return
        x = h[:, -1, :]
        if self.projection == "layer":
            self._projector.project(self._steps[-1], self._batch, slot, x)
            return
        # "step": keep the step's last-position row of each selected state ([B, d]; a decoding
        # step's layer outputs are fresh [B, 1, d] tensors that nothing modifies in place, so a
        # reference is enough; the prefill's [B, P, d] would stay alive through a view, so its
        # last row is copied) and project all of them at once when the last one is produced:
        # one hook call per layer and three launches per step (per device the states live on),
        # fp32 accumulation as before.
        self._rows[slot] = x.clone() if h.shape[1] > 1 else x
        if slot == self._last_slot:
            self._steps[-1] = self._projector.project_rows(self._rows)
            self._rows = [None] * len(self._rows)

    # -- results ---------------------------------------------------------------------------
    def eos_token_ids(self) -> list[int]:
        if self._eos is not None:
            return _eos_ids(self._eos)
        gc = getattr(self.model, "generation_config", None)
        return _eos_ids(getattr(gc, "eos_token_id", None) or getattr(self.parts.model.config, "eos_token_id", None))

    def scores(self, output, response_lengths_: torch.Tensor | Sequence[int] | None = None) -> torch.Tensor:
        """``[B]`` float32 SWIFT scores of the last generation (B counts every returned sequence).

        ``output``: what ``generate`` returned (the sequences tensor, or the output object; the
        ``emitted`` alignment needs the object, with its cache). ``response_lengths_``: tokens of
        each response, when rows were stopped by something other than EOS or the length limit.
        """
        seqs = output if isinstance(output, torch.Tensor) else output.sequences
        gen_len = self._generated_count(seqs)
        generated = seqs[:, seqs.shape[1] - gen_len :]
        if response_lengths_ is None:
            lengths = response_lengths(generated, self.eos_token_ids())
        else:
            lengths = torch.as_tensor(response_lengths_, dtype=torch.long, device=seqs.device)
            if lengths.shape != (seqs.shape[0],) or (lengths < 0).any() or (lengths > gen_len).any():
                raise GenerationError(f"response_lengths must be {seqs.shape[0]} ints in 0..{gen_len}")
        align = ALIGNMENT[self.head.alignment]
        if align.extra_forward and len(self._steps) == gen_len:
            self._final_step(output, seqs, gen_len)
        first = 1 + align.state_offset  # forward s (0: the prefill) computes position P + s - 1
        steps = self._steps[first : first + gen_len]
        if self.projection == "layer":
            steps = [self._projector.total(accs, self._batch) for accs in steps]
        z = torch.stack(steps)
        t = torch.arange(gen_len, device=z.device)[:, None]
        mask = t < lengths.to(z.device)[None, :]
        return _gated_scores(z, self._bias, mask).cpu()

    def _generated_count(self, seqs: torch.Tensor) -> int:
        if not self._steps or self._prompt_mask is None:
            raise GenerationError("no generation was recorded: call generate while the scorer is attached")
        if any(z is None for z in self._steps):
            raise GenerationError(
                "a recorded forward pass did not run all the head's layers (interrupted?): generate again"
            )
        if self._batch != seqs.shape[0]:
            raise GenerationError(
                f"the recorded generation has {self._batch} rows, the output {seqs.shape[0]}: "
                "score the output of the most recent generate call"
            )
        gen_len = seqs.shape[1] - self._prompt_mask.shape[1]
        expected = (gen_len, gen_len + 1) if ALIGNMENT[self.head.alignment].extra_forward else (gen_len,)
        if gen_len < 1 or len(self._steps) not in expected:
            raise GenerationError(
                f"the scorer saw {len(self._steps)} forward passes for {gen_len} generated tokens: generate-time "
                "scoring supports greedy and sampling (one forward per token); beam search, assisted and "
                "prompt-lookup decoding are not supported. Score such outputs offline with swift_scores."
            )
        return gen_len

    def _final_step(self, output, seqs: torch.Tensor, gen_len: int) -> None:
        cache = None if isinstance(output, torch.Tensor) else getattr(output, "past_key_values", None)
        if cache is None:
            raise GenerationError(
                f"this head uses the '{self.head.alignment}' alignment, which scores each token with the state "
                "where it is the input; generate never feeds the last generated token back, so one more decoding "
                "step is needed, on the cache generate returns. Call generate with return_dict_in_generate=True "
                "(and use_cache on), or use GenerationScorer.generate, which does; or score offline with swift_scores"
            )
        prompt_len = self._prompt_mask.shape[1]
        if cache.get_seq_length() != prompt_len + gen_len - 1:
            raise GenerationError(
                f"the returned cache holds {cache.get_seq_length()} positions, expected {prompt_len + gen_len - 1}: "
                "score the output of the most recent generate call, once"
            )
        b = seqs.shape[0]
        prompt_mask = self._prompt_mask.to(seqs.device)
        mask = torch.cat([prompt_mask, torch.ones((b, gen_len), dtype=prompt_mask.dtype, device=seqs.device)], 1)
        pos = mask.long().sum(-1, keepdim=True) - 1
        with torch.no_grad():
            kwargs = dict(
                input_ids=seqs[:, -1:], attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True
            )
            if self.head.feature == "logits":
                self.parts.model(**kwargs, logits_to_keep=1)
            else:
                self.parts.base(**kwargs)

    # -- one call --------------------------------------------------------------------------
    def generate(self, *args, **kwargs):
        """``model.generate(*args, **kwargs)`` with scoring: returns ``(output, scores[B])``.

        ``output`` is exactly what ``generate`` would have returned for these arguments.
        """
        gc = kwargs.get("generation_config") or getattr(self.model, "generation_config", None)
        beams = kwargs.get("num_beams", getattr(gc, "num_beams", 1)) or 1
        if beams > 1:
            raise GenerationError("generate-time scoring supports greedy and sampling, not beam search (num_beams > 1)")
        if kwargs.get("assistant_model") is not None or kwargs.get("prompt_lookup_num_tokens") is not None:
            raise GenerationError("generate-time scoring does not support assisted or prompt-lookup decoding")
        if kwargs.get("use_cache") is False:
            raise GenerationError("generate-time scoring needs use_cache (one forward per generated token)")
        want_dict = kwargs.get("return_dict_in_generate", getattr(gc, "return_dict_in_generate", False))
        if ALIGNMENT[self.head.alignment].extra_forward:
            kwargs["return_dict_in_generate"] = True
        eos = kwargs.get("eos_token_id", getattr(gc, "eos_token_id", None))
        prev_eos = self._eos
        if self._eos is None and eos is not None:
            self._eos = eos
        attached_here = not self._handles
        self.attach()
        try:
            out = self.model.generate(*args, **kwargs)
            scores = self.scores(out)
        finally:
            self._eos = prev_eos
            if attached_here:
                self.detach()
        if not want_dict and not isinstance(out, torch.Tensor):
            out = out.sequences
        return out, scores


def generate_with_scores(model: nn.Module, head: SwiftHead, *args, **kwargs):
    """``model.generate`` that also returns each returned sequence's SWIFT score: ``(output, scores[B])``."""
    return GenerationScorer(model, head).generate(*args, **kwargs)


def _gated_scores(z: torch.Tensor, bias: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scores from per-step projections through the streaming ``finish_`` op.

    ``z``: ``[S, B, rows]`` projections without bias; ``mask``: bool ``[S, B]``, True where the
    step's token belongs to row b's response. Returns ``[B]`` float32.
    """
    s, b = mask.shape
    acc = z.reshape(s * b, -1).float().contiguous()  # a fresh stack: finish_ may zero it
    rows = torch.arange(b, device=z.device).expand(s, b)
    slots = torch.where(mask, rows, torch.full_like(rows, -1)).reshape(-1)
    state = torch.zeros((b, 3), dtype=torch.float32, device=z.device)
    finish_(acc, bias.float(), slots, state)
    return scores_from_state(state)
