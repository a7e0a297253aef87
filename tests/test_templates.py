"""Prompt templates: registry, rendering of real examples, and a chat template applied to them."""

import os

import pytest

from swift_fast import load_dataset
from swift_fast.data.templates import KIND_DEFAULTS, TEMPLATES, Template, get_template, render_prompt
from swift_fast.grading import grade


def test_registry_covers_the_papers_datasets():
    for name, kind in [("math", "math"), ("gsm8k", "math"), ("math500", "math"), ("aqua", "choice"),
                       ("hellaswag", "choice"), ("coinflip", "boolean"), ("imbue", "literal")]:
        t = TEMPLATES[name]
        assert (t.kind, t.source, t.system) == (kind, "paper", None)
        assert t.user.endswith("{question}") and "\\boxed{" in t.user
    assert TEMPLATES["choice"].source == "project"
    assert set(KIND_DEFAULTS.values()) <= set(TEMPLATES)


def test_math_template_wording():
    msgs = render_prompt("What is 1+1?", "math")
    assert msgs == [{
        "role": "user",
        "content": "Solve the following math problem step-by-step.\n"
        "Simplify your answer as much as possible. Present your final answer as \\boxed{Your Answer}.\n"
        "What is 1+1?",
    }]


def test_real_examples_pick_their_dataset_template(shared_data):
    for sub, name in [("gsm8k", "gsm8k"), ("math500", "math500"), ("aqua", "aqua")]:
        ex = load_dataset(os.path.join(shared_data, sub, "test.jsonl"), limit=2)[1]
        msgs = render_prompt(ex)
        assert len(msgs) == 1 and msgs[0]["role"] == "user"
        assert msgs[0]["content"] == TEMPLATES[name].user.replace("{question}", ex.question)
    aqua = load_dataset(os.path.join(shared_data, "aqua", "test.jsonl"), limit=1)[0]
    content = render_prompt(aqua)[0]["content"]
    assert "five options (A\u2013E)" in content and "E)" in content


def test_fallbacks_system_and_custom_templates():
    assert render_prompt({"question": "Heads up?", "kind": "boolean", "dataset": "mine"})[0]["content"].startswith(
        "Answer the following Boolean question"
    )
    assert render_prompt({"prompt": "q", "dataset": "HellaSwag"})[0]["content"] == TEMPLATES["hellaswag"].user.replace(
        "{question}", "q"
    )
    msgs = render_prompt("q", "imbue", system="You are careful.")
    assert msgs[0] == {"role": "system", "content": "You are careful."} and msgs[1]["role"] == "user"
    # Only {question} is substituted: LaTeX braces stay as written.
    assert (
        render_prompt("2+3", r"Compute {question} and box it: \boxed{}")[0]["content"]
        == r"Compute 2+3 and box it: \boxed{}"
    )
    t = Template("mine", "Q: {question}\nA:", "math", system="sys")
    assert get_template(t) is t and render_prompt("x", t)[0]["content"] == "sys"


def test_bad_templates_are_explained():
    with pytest.raises(ValueError, match="unknown template 'gsm9k'"):
        render_prompt("q", "gsm9k")
    with pytest.raises(ValueError, match="must contain \\{question\\}"):
        Template("t", "no placeholder")
    with pytest.raises(TypeError, match="cannot find the question"):
        render_prompt(42)


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_chat_template_of_a_real_tokenizer(family):
    # The messages go through a real chat template (the test tokenizer, a trained byte-level BPE)
    # and survive tokenisation unchanged; an answer that follows the instruction grades correct.
    from swift_fast.testing import build_tokenizer

    tok = build_tokenizer(family)
    msgs = render_prompt("What is 6/5 as a decimal?", "gsm8k", system="Be brief.")
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert msgs[1]["content"] in text and "Be brief." in text
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert msgs[1]["content"] in tok.decode(ids)
    assert grade(r"6/5 = 1.2, so \boxed{1.2}", r"\frac{6}{5}")
