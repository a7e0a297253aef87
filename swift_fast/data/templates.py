"""Instruction templates per dataset: the prompts of the SWIFT paper's experiments.

A template turns a question into chat messages (an optional system turn and one user turn);
the caller applies the model's chat template to them (``tokenizer.apply_chat_template(...,
add_generation_prompt=True)``), as the paper's generation code does.

The paper puts an instruction in front of the question in the user turn and no system turn.
The wording of ``math`` / ``gsm8k``, ``aqua``, ``hellaswag``, ``coinflip`` and ``imbue`` is that of
the paper's public code (``source="paper"``); ``choice`` (multiple choice with any number of
options) is this project's (``source="project"``). Each asks for the final answer in
``\\boxed{}``, which is what ``swift_fast.grading`` reads first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

QUESTION = "{question}"


@dataclass(frozen=True)
class Template:
    """``user`` is the user turn with ``{question}`` where the question goes (only that
    placeholder is substituted, so LaTeX braces such as ``\\boxed{}`` need no escaping)."""

    name: str
    user: str
    kind: str = "math"
    system: str | None = None
    source: str = "project"

    def __post_init__(self):
        if QUESTION not in self.user:
            raise ValueError(f"template {self.name!r}: the user text must contain {QUESTION} where the question goes")

    def messages(self, question: str, system: str | None = None) -> list[dict]:
        """``[{"role": "system", ...}?, {"role": "user", "content": ...}]``; ``system`` overrides the template's."""
        sys_text = self.system if system is None else system
        msgs = [{"role": "system", "content": sys_text}] if sys_text else []
        msgs.append({"role": "user", "content": self.user.replace(QUESTION, question)})
        return msgs


_MATH = (
    "Solve the following math problem step-by-step.\n"
    "Simplify your answer as much as possible. Present your final answer as \\boxed{Your Answer}.\n"
)
_AQUA = (
    "You are given a multiple-choice question with five options (A\u2013E).\n"
    "Solve it step by step, then present only one letter (A-E) in the form \\boxed{Letter}.\n"
    "Remember to output \\boxed{Letter} at the end of your answer or it will be considered incorrect.\n"
)
_HELLASWAG = (
    "You are given a context and four possible continuations (A\u2013D). "
    "Decide which option best continues the context.\n"
    "Explain your reasoning step by step, then present only one letter (A-D) in the form \\boxed{Letter}.\n"
    "Remember to output \\boxed{Letter} at the end of your answer or it will be considered incorrect.\n"
)
_COINFLIP = (
    "Answer the following Boolean question with detailed reasoning.\n"
    "Explain your reasoning step-by-step and conclude with a final answer as \\boxed{Yes} or \\boxed{No}.\n"
)
_IMBUE = (
    "Analyze the following problem step-by-step. The question includes a list of choices. "
    "Select the most appropriate choice from the provided options "
    "and output your final answer enclosed within \\boxed{...},\n"
    "ensuring that the content inside \\boxed{...} is valid Python literal syntax.\n"
)
_CHOICE = (
    "You are given a multiple-choice question.\n"
    "Solve it step by step, then present only the letter of the correct option in the form \\boxed{Letter}.\n"
)

TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        Template("math", _MATH + QUESTION, "math", source="paper"),
        Template("gsm8k", _MATH + QUESTION, "math", source="paper"),
        Template("math500", _MATH + QUESTION, "math", source="paper"),
        Template("aqua", _AQUA + QUESTION, "choice", source="paper"),
        Template("hellaswag", _HELLASWAG + QUESTION, "choice", source="paper"),
        Template("coinflip", _COINFLIP + QUESTION, "boolean", source="paper"),
        Template("imbue", _IMBUE + QUESTION, "literal", source="paper"),
        Template("choice", _CHOICE + QUESTION, "choice", source="project"),
    )
}

# Template for a dataset the registry does not name, by grading kind.
KIND_DEFAULTS = {"math": "math", "choice": "choice", "boolean": "coinflip", "literal": "imbue"}


def get_template(
    template: str | Template | None = None, dataset: str | None = None, kind: str | None = None
) -> Template:
    """A template by object, registry name or ``{question}`` text; else by dataset name, else by kind."""
    if isinstance(template, Template):
        return template
    if isinstance(template, str):
        if template in TEMPLATES:
            return TEMPLATES[template]
        if QUESTION in template:
            return Template("custom", template, kind or "math")
        raise ValueError(
            f"unknown template {template!r}; use one of {', '.join(sorted(TEMPLATES))}, "
            f"or a text with {QUESTION} where the question goes"
        )
    if template is not None:
        raise TypeError(f"template must be a name, a text with {QUESTION} or a Template, got {type(template).__name__}")
    if dataset and dataset.lower() in TEMPLATES:
        return TEMPLATES[dataset.lower()]
    return TEMPLATES[KIND_DEFAULTS.get(kind or "math", "math")]


def render_prompt(example: Any, template: str | Template | None = None, system: str | None = None) -> list[dict]:
    """Chat messages for ``example`` (an ``Example``, a mapping with "question" or "prompt", or the
    question text). With no ``template``, the example's dataset picks one (see ``TEMPLATES``),
    else its kind (``KIND_DEFAULTS``)."""
    if isinstance(example, str):
        question, dataset, kind = example, None, None
    elif isinstance(example, Mapping):
        question = example.get("question", example.get("prompt"))
        dataset, kind = example.get("dataset"), example.get("kind")
    else:
        question = getattr(example, "question", None)
        dataset, kind = getattr(example, "dataset", None), getattr(example, "kind", None)
    if not isinstance(question, str):
        raise TypeError(
            f"cannot find the question text in {type(example).__name__}; "
            "pass an Example, a dict with 'question', or a str"
        )
    return get_template(template, dataset, kind).messages(question, system=system)
