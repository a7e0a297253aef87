"""The plugin's configuration: ``additional_config={"swift_fast": {...}}`` (``--additional-config``).

Keys:

``head`` (default ``null``: no head)
    path of a ``swift_fast.head/1`` file (or of a folder holding ``head.safetensors``), or a
    Hugging Face Hub repository id ``org/name[@revision][:file]`` (file default
    ``head.safetensors``), fetched into the Hugging Face cache when the configuration is read
    (``HF_HUB_OFFLINE=1``: the cache only; ``swift_fast.hf.hub``). A path that exists wins.
    Without a head the plugin computes the head-free values only: every candidate's
    ``mean_logprob`` and DeepConf confidences (:mod:`swift_fast.rewards.confidence`), ``sar`` when
    asked, and ``swift_score`` None; nothing is hooked into the model. With a head, every
    candidate has those values too.
``sar`` (default ``false``)
    also compute the self-aligned reward of every finished candidate.
``confidence_window`` (default 2048, DeepConf's)
    tokens per group of DeepConf's group confidences (``confidence_lowest_group``,
    ``confidence_tail``, ``confidence_bottom10``; :mod:`swift_fast.rewards.confidence`). An answer
    shorter than the window is one group: all three are then its mean token confidence.
``answer`` (default ``null``)
    the kind of final answer the front end extracts from each finished candidate, for the votes
    ``select`` may ask for and DeepConf's consensus stop: ``"math"``, ``"choice"``, ``"boolean"``
    or ``"literal"`` (:mod:`swift_fast.grading.answers`).
``select`` (default: the head's recommended selector, else ``"swift"`` with a head, else ``"confidence_lowest_group"``)
    what server-side Best-of-N (``"best_of_n": N`` in a request body; a request may name its own
    ``"select"``) chooses by: a value (``"swift"``, ``"sar"``, ``"mean_logprob"``,
    ``"confidence_lowest_group"``, ``"confidence_tail"``, ``"confidence_bottom10"``), a
    combination of SWIFT and SAR (``"rank"``, ``"scaled"``), or a vote over the candidates'
    answers (``"vote"``: majority; ``"vote:<value>"``: weighted by that value, DeepConf's
    ``"vote:confidence_tail"`` for instance), which needs ``answer``. A choice that needs a head
    (``swift``, ``rank``, ``scaled``) is refused without one, and one that needs SAR without ``sar``
    (:mod:`swift_fast.selection.by_value`). A head trained by ``swift-fast train`` records the
    selector its validation evidence picked (``SwiftHead.selector``; ``vote:swift@T``, a vote
    weighted by ``exp(score / T)``, is common): that is the default. Where it is a vote and the
    engine has no ``answer``, a request that gives its own ``"answer"`` votes, and the others
    choose by the highest SWIFT score, their ``best_of_n`` saying so in ``select_fallback``.
``max_best_of_n`` (default 64)
    the largest ``best_of_n`` a server request may ask for. Each candidate is a sequence in the
    engine (and, with SAR, one question-removed pass more), so an unbounded N lets one request
    occupy the engine; 64 is four times the largest N the SWIFT paper evaluates.
``prune`` (default ``null``: no pruning)
    the engine's default pruning of a request's candidates while they are generated (scored
    requests with ``n > 1``): ``true`` for the defaults, or an object of
    :class:`swift_fast.selection.pruning.PruneConfig` settings (:mod:`.pruning`).
``deepconf`` (default ``null``: off)
    the engine's default DeepConf online early stopping (scored requests with ``n`` above its
    warmup): ``true`` for the defaults, or an object of
    :class:`swift_fast.selection.deepconf.DeepConfConfig` settings (:mod:`.deepconf`). A request
    is stopped by ``prune`` or by ``deepconf``, not both: the one it names wins over the engine's
    default of the other.

Per request (``SamplingParams.extra_args``; ``vllm_xargs`` in an OpenAI request cannot carry a
dict, so the server also takes the flat keys in brackets):

- ``{"swift_fast": {"score": False}}`` (``"swift_fast_score": false``) opts the request out of scoring;
- ``{"swift_fast": {"sar_context": ...}}`` (``"swift_fast_sar_context"``, or a ``"sar_context"``
  body field) gives the request's question-removed context: token ids or text (it wins over the
  context a chat request would get; for a raw prompt it is the only exact one);
- ``{"swift_fast": {"prune": {...} | true | false}}`` (``"swift_fast_prune"``,
  ``"swift_fast_prune_<setting>"``, or a ``"prune"`` body field) prunes the request's candidates
  (:mod:`.pruning`; ``n > 1`` only);
- ``{"swift_fast": {"trace": True}}`` (``"swift_fast_trace": true``) also returns each token's
  values, ``CompletionOutput.swift_trace = {"gate_reward": [...], "gate": [...], "confidence":
  [...], "logprob": [...]}`` (``g_t r_t``, ``g_t``, DeepConf's token confidence and the
  token's log-prob; one entry per token of ``token_ids``, ``gate_reward`` and ``gate`` empty
  without a head; on the final output): what
  replaying a pruning policy offline (``swift_fast.selection.pruning.replay``) and the trivial selectors need.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..definitions import KINDS
from ..hf.hub import resolve_head_lenient
from ..rewards.confidence import DEFAULT_WINDOW
from ..rewards.head import HeadError, SwiftHead, read_selector
from ..selection.by_value import DEFAULT_HEAD_FREE, Available, SelectorError, check_prune, check_selector, needs
from ..selection.deepconf import DeepConfConfig, DeepConfConfigError
from ..selection.pruning import PruneConfig, PruneConfigError

#: key of the plugin's section in ``VllmConfig.additional_config`` and in ``SamplingParams.extra_args``
KEY = "swift_fast"
_KEYS = ("head", "sar", "sar_context", "select", "max_best_of_n", "prune", "deepconf", "confidence_window", "answer")
DEFAULT_MAX_BEST_OF_N = 64
#: keys the plugin itself writes into the section at start-up
_INTERNAL = ("_head_sha256",)


class PluginConfigError(ValueError):
    """``additional_config["swift_fast"]`` cannot be used as given."""


@dataclass(frozen=True)
class PluginConfig:
    head_path: str | None = None  # None: no head, head-free values only
    sar: bool = False
    sar_context: str | tuple[int, ...] | None = None
    select: str = "swift"
    max_best_of_n: int = DEFAULT_MAX_BEST_OF_N
    prune: PruneConfig | None = None
    deepconf: DeepConfConfig | None = None
    confidence_window: int = DEFAULT_WINDOW
    answer: str | None = None
    #: where ``select`` is the head's recommended vote and the engine has no ``answer`` kind: what a
    #: request without its own ``"answer"`` selects by instead (its highest score), None otherwise
    select_fallback: str | None = None

    @property
    def has_head(self) -> bool:
        return self.head_path is not None

    @classmethod
    def parse(cls, section: Any) -> "PluginConfig":
        if isinstance(section, str):
            # `--additional-config '{"swift_fast": "head.safetensors"}'` is a natural shorthand
            section = {"head": section}
        if section is True:
            section = {}  # `{"swift_fast": true}`: on, with every default
        if not isinstance(section, Mapping):
            raise PluginConfigError(
                f'additional_config["{KEY}"] must be an object such as {{}} (head-free values) or '
                f'{{"head": "head.safetensors"}}, got {type(section).__name__}'
            )
        if "sar_system_prompt" in section:
            raise PluginConfigError(
                f'additional_config["{KEY}"]["sar_system_prompt"] is gone: SAR\'s question-removed prompt now keeps '
                "the generation's own context (its system turn or none, its template) and removes only the "
                "question. Put a system prompt in the generation prompts that should have one; for raw prompts "
                'set "sar_context" (or a per-request context)'
            )
        unknown = sorted(set(section) - set(_KEYS) - set(_INTERNAL))
        if unknown:
            raise PluginConfigError(
                f'additional_config["{KEY}"] has unknown key(s) {unknown}; known keys: {list(_KEYS)}'
            )
        head = section.get("head")
        if head is not None and (not isinstance(head, str) or not head):
            raise PluginConfigError(
                f'additional_config["{KEY}"]["head"] must be the path of a SWIFT head file or a Hugging Face Hub '
                f"repository id (org/name[@revision][:file]), or null for the head-free values only; got {head!r}"
            )
        sar = section.get("sar", False)
        if not isinstance(sar, bool):
            raise PluginConfigError(f'additional_config["{KEY}"]["sar"] must be true or false, got {sar!r}')
        context = section.get("sar_context")
        if isinstance(context, list) and all(type(t) is int and t >= 0 for t in context):
            context = tuple(context)
        elif context is not None and not isinstance(context, str):
            raise PluginConfigError(
                f'additional_config["{KEY}"]["sar_context"] must be text, a list of token ids or null, got {context!r}'
            )
        max_bon = section.get("max_best_of_n", DEFAULT_MAX_BEST_OF_N)
        if isinstance(max_bon, bool) or not isinstance(max_bon, int) or max_bon < 1:
            raise PluginConfigError(
                f'additional_config["{KEY}"]["max_best_of_n"] must be a positive integer, got {max_bon!r}'
            )
        window = section.get("confidence_window", DEFAULT_WINDOW)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise PluginConfigError(
                f'additional_config["{KEY}"]["confidence_window"] must be a positive number of tokens, got {window!r}'
            )
        answer = section.get("answer")
        if answer is not None and answer not in KINDS:
            raise PluginConfigError(
                f'additional_config["{KEY}"]["answer"] must be one of {list(KINDS)} or null, got {answer!r}'
            )
        have = Available(head=head is not None, sar=sar, answers=answer is not None)
        # the front end writes the resolved path back into the section (prepare_config): the
        # engine's other processes read that file, never the Hub. Resolved before the checks only
        # when its recommended selector is wanted: an asked selector is refused before any download
        asked = section.get("select")
        head_path = resolve_head_lenient(head) if head is not None and asked is None else None
        select, fallback = _default_select(asked, head_path, answer)
        try:
            if fallback is not None:
                # a vote this engine cannot run without an answer kind: a request that names one votes
                check_selector(select, have._replace(answers=True), where="the head's recommended selector")
            check_selector(fallback or select, have, where=f'additional_config["{KEY}"]["select"]')
            prune = PruneConfig.parse(section.get("prune"), where=f'additional_config["{KEY}"]["prune"]')
            if prune is not None:
                check_prune(prune, have, where=f'additional_config["{KEY}"]["prune"]')
            deepconf = DeepConfConfig.parse(section.get("deepconf"), where=f'additional_config["{KEY}"]["deepconf"]')
            if deepconf is not None and deepconf.signal == "swift" and head is None:
                raise SelectorError(f'additional_config["{KEY}"]["deepconf"]: signal "swift" thresholds the running '
                                    'SWIFT score, which needs a SWIFT head ("head"); use signal "confidence"')
        except (SelectorError, PruneConfigError, DeepConfConfigError) as e:
            raise PluginConfigError(str(e)) from None
        if head is not None and head_path is None:
            head_path = resolve_head_lenient(head)
        return cls(head_path=head_path, sar=sar, sar_context=context, select=select, max_best_of_n=max_bon,
                   prune=prune, deepconf=deepconf, confidence_window=window, answer=answer, select_fallback=fallback)

    @property
    def available(self) -> "Available":
        """What this engine computes, for the checks of a selector or pruning signal."""
        return Available(head=self.has_head, sar=self.sar, answers=self.answer is not None)

    def load_head(self) -> SwiftHead | None:
        return SwiftHead.load(self.head_path) if self.head_path is not None else None


# -- request kinds ------------------------------------------------------------------------------
#: A request the plugin scores, one it leaves alone (opted out, or no sampling parameters), a
#: SAR question-removed pass the front end submitted for a finished candidate, and a last-state
#: pass (``emitted`` heads: the candidate's own sequence, to compute the states of its last token).
SCORE, SKIP, SAR_PASS, LAST_STATE = 0, 1, 2, 3
#: keys of the plugin's internal passes in ``extra_args["swift_fast"]``
SAR_PASS_KEY, LAST_STATE_KEY = "sar_pass", "last_state"


def request_kind(sampling_params) -> tuple[int, int]:
    """``(kind, q0_len)`` of a request from its ``SamplingParams.extra_args`` (``q0_len``: tokens of
    the question-removed prompt that precede the answer, for a SAR pass; 0 otherwise)."""
    if sampling_params is None:
        return SKIP, 0
    extra = sampling_params.extra_args or {}
    own = extra.get(KEY)
    if isinstance(own, dict):
        if SAR_PASS_KEY in own:
            return SAR_PASS, int(own[SAR_PASS_KEY])
        if LAST_STATE_KEY in own:
            return LAST_STATE, 0
        if own.get("score") is False:
            return SKIP, 0
    if extra.get("swift_fast_score") in (False, "false", "0", 0):
        return SKIP, 0
    return SCORE, 0


_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def flag(v: Any, where: str, error: type[ValueError] = ValueError) -> bool:
    """A request's on/off value: a bool, 0/1, or a string such as "true"/"off" (flat keys arrive as text)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE + _FALSE:
        return v.strip().lower() in _TRUE
    raise error(f"{where} must be true or false, got {v!r}")


def request_setting(extra: dict | None, name: str, fields, error: type[ValueError],
                    label: str) -> tuple[bool, Any, str]:
    """``(given, setting, where)``: whether a request's ``extra_args`` say anything about the
    plugin's ``name`` setting (``"prune"``, ``"deepconf"``), what (a mapping, True or False), and
    where it was said (for error messages) -- from ``{"swift_fast": {name: ...}}`` or the flat keys
    ``swift_fast_<name>`` (on/off) and ``swift_fast_<name>_<setting>`` (``vllm_xargs`` cannot carry
    an object). ``label`` names the setting in errors ("pruning")."""
    extra = extra or {}
    own = extra.get(KEY)
    if isinstance(own, dict) and name in own:
        return True, own[name], f'extra_args["{KEY}"]["{name}"]'
    base = f"{KEY}_{name}"
    flat = {k[len(base) + 1:]: v for k, v in extra.items() if k.startswith(base + "_")}
    if base in extra and not flag(extra[base], base, error):
        if flat:
            raise error(f"{base} is false but {sorted(base + '_' + k for k in flat)} are set")
        return True, False, base
    if flat:
        unknown = sorted(k for k in flat if k not in fields)
        if unknown:
            raise error(f"unknown {label} key(s) {[base + '_' + k for k in unknown]}; the keys are "
                        f"{[base + '_' + k for k in fields]}")
        return True, flat, f"{base}_<setting>"
    if base in extra:
        return True, True, base
    return False, None, ""


def is_internal_pass(extra: dict | None) -> bool:
    """Whether ``extra_args`` are those of a pass the front end submitted (SAR's or a last-state one)."""
    own = (extra or {}).get(KEY)
    return isinstance(own, dict) and (SAR_PASS_KEY in own or LAST_STATE_KEY in own)


def trace_requested(sampling_params) -> bool:
    """Whether a request asked for its per-token values (``trace``)."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    own = extra.get(KEY)
    if isinstance(own, dict) and own.get("trace") in (True, 1, "true", "1"):
        return True
    return extra.get("swift_fast_trace") in (True, 1, "true", "1")


def section_of(vllm_config: Any) -> Any:
    """The raw ``swift_fast`` section of a ``VllmConfig`` (None when absent)."""
    extra = getattr(vllm_config, "additional_config", None)
    if not extra:
        return None
    if not isinstance(extra, Mapping):
        return None
    return extra.get(KEY)


def plugin_config(vllm_config: Any) -> PluginConfig | None:
    """The parsed configuration, or None when the plugin is not configured for this engine."""
    section = section_of(vllm_config)
    if section is None or section is False:
        return None
    cached = getattr(vllm_config, "_swift_fast_config", None)
    if cached is not None:
        return cached
    cfg = PluginConfig.parse(section)
    try:
        object.__setattr__(vllm_config, "_swift_fast_config", cfg)
    except (AttributeError, TypeError):
        pass
    return cfg


def check_same_head(vllm_config: Any, head_path: str) -> None:
    """Raise ``HeadError`` when the head file a worker is about to load is not the one the front
    end checked (its sha256, pinned into the config at start-up): on several nodes each engine
    reads the path from its own disk, and another file there would score with other weights."""
    from ..support.files import sha256_of

    section = section_of(vllm_config)
    want = section.get("_head_sha256") if isinstance(section, Mapping) else None
    if want is None:
        return
    got = sha256_of(head_path)
    if got != want:
        raise HeadError(
            f"the SWIFT head file {head_path} on this node (sha256 {got[:16]}...) is not the one the engine "
            f"was started with (sha256 {want[:16]}...): copy the same head file to that path on every node"
        )


def check_engine(vllm_config: Any, head: SwiftHead | None) -> None:
    """Refuse, at start-up, what the plugin cannot score exactly (``head`` None: the head-free
    values only). Raises ``HeadError``."""
    model_config = vllm_config.model_config
    name = getattr(model_config, "model", None)
    if head is not None:
        head.check_model(model_config.hf_config, name=name)
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is not None:
        raise HeadError(
            "swift-fast scores one token per request per step; speculative decoding is not supported with the "
            "swift_fast plugin: remove --speculative-config"
        )
    parallel = vllm_config.parallel_config
    if getattr(parallel, "use_ubatching", False):
        raise HeadError(
            "swift-fast does not support dual-batch overlap / micro-batching (--enable-dbo, --ubatch-size): "
            "each micro-batch runs the model on its own slice of the tokens, and the plugin's per-token "
            "buffers are indexed from 0 in every slice, so both would write the same rows (nor is it run without "
            "a head). Remove "
            "--enable-dbo / --ubatch-size to serve with the swift_fast plugin"
        )
    if getattr(parallel, "enable_batch_sharded_sampling", False):
        raise HeadError(
            "swift-fast does not support batch-sharded sampling (--enable-batch-sharded-sampling, Model Runner V2): "
            "each tensor-parallel rank then computes the logits of its own requests only, and SAR, DeepConf "
            "confidence, trace and logit-feature heads read the logits of every request. Remove the flag to serve "
            "with the swift_fast plugin"
        )
    if head is None:
        return  # the rest concern the head's per-token sums over the forward's states
    pcp = getattr(parallel, "prefill_context_parallel_size", 1)
    if pcp and pcp > 1:
        raise HeadError(
            f"swift-fast does not support prefill context parallelism (prefill_context_parallel_size={pcp}, Model "
            "Runner V2): each rank computes a slice of a prompt's tokens, so the head's per-token sums no longer "
            "line up with the states vLLM gathers for sampling. Use tensor or pipeline parallelism"
        )
    pp = getattr(parallel, "pipeline_parallel_size", 1)
    if pp and pp > 1 and getattr(parallel, "distributed_executor_backend", None) == "external_launcher":
        raise HeadError(
            f"swift-fast does not support pipeline parallelism (pipeline_parallel_size={pp}) under the "
            "external_launcher (torchrun) backend: vLLM sends the stages' tensors from inside its model runner "
            "there, where the head's partial sums cannot travel with them. Use vLLM's multiprocessing or Ray "
            "backend, or tensor parallelism"
        )


def _default_select(asked: str | None, head_path: str | None, answer: str | None) -> tuple[str, str | None]:
    """``(select, fallback)``: the selector asked for; else the one the head file recommends
    (``SwiftHead.selector``, read from its metadata); else SWIFT with a head and DeepConf's lowest
    group confidence without. ``fallback`` is ``"swift"`` where the head recommends a vote and
    the engine has no answer kind (requests that give one vote), None otherwise."""
    if asked is not None:
        return asked, None
    if head_path is None:
        return DEFAULT_HEAD_FREE, None
    recommended = None
    if os.path.isfile(head_path):
        try:
            recommended = (read_selector(head_path) or {}).get("select")
        except HeadError as e:
            raise PluginConfigError(str(e)) from None
    if recommended is None:
        return "swift", None
    return recommended, ("swift" if needs(recommended).answers and answer is None else None)
