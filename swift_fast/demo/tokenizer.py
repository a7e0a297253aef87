"""The demo model's tokenizer: a word-level vocabulary over the task's alphabet.

Every digit and symbol is one token and the few words of the prompt and solution are one token
each, so token ids map one-to-one onto the characters a reader sees (no merges to hide a slip
inside). Special tokens and the chat template follow the Llama 3 layout; ``<|eot_id|>`` ends a
turn and is the model's EOS, so a generated response includes it.
"""

from __future__ import annotations

from .task import ANSWER_MARK, STEP_END

BOS, START, END, EOT, PAD, UNK = (
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<unk>",
)
SPECIALS = [PAD, BOS, START, END, EOT, UNK]

#: The model is trained without a system prompt, so SAR's question-removed prompt ``q0`` is the
#: chat template around an empty user turn.
SYSTEM_PROMPT = None

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

_WORDS = ["system", "user", "assistant"]
_SYMBOLS = list("0123456789") + ["+", "=", STEP_END, ANSWER_MARK, " ", "\n"]


def vocabulary() -> list[str]:
    words = list(dict.fromkeys(_WORDS))  # ordered, no repeats
    return SPECIALS + _SYMBOLS + words


def build_tokenizer():
    """A ``PreTrainedTokenizerFast`` (word level: words, single digits, single symbols)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(vocabulary())}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Each word, each digit and each other character is its own piece; Fuse joins them back
    # without separators, so decode(encode(text)) == text for any text over the alphabet.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[a-z]+|[0-9]|[^a-z0-9]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOT,
        pad_token=PAD,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
    )
    fast.add_special_tokens({"additional_special_tokens": [START, END]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def messages(question: str, with_question: bool = True) -> list[dict]:
    """The chat of a problem; without the question (SAR's ``q0``) the user turn is empty."""
    return [{"role": "user", "content": question if with_question else ""}]


def prompt_ids(tokenizer, question: str, with_question: bool = True) -> list[int]:
    ids = tokenizer.apply_chat_template(messages(question, with_question), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)
