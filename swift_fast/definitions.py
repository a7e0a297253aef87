"""Constants of the normative definitions (DESIGN 2), shared by every layer.

A leaf: it imports nothing, so the kernels, the core, the vLLM front end (which must not load
the kernels) and the dataset loaders (which must not start grading workers) can all read the
same values.
"""

#: Floor of the gate sum in ``R = sum g r / max(sum g, GATE_EPS)`` (SWIFT Eq. 4).
GATE_EPS = 1e-8

#: Answer kinds the grader knows (DESIGN 2, "Answers").
KINDS = ("math", "choice", "boolean", "literal")
#: Letters of a multiple-choice answer (AQuA has five options).
CHOICE_LETTERS = "ABCDE"

#: The system prompt of the SAR reference's generation prompts (its question-removed prompts keep
#: the generation's system turn).
DEFAULT_SYSTEM_PROMPT = (
    "You are a reasoning expert assistant. Given a question, you will use your reasoning skills "
    "to solve the problem."
)
