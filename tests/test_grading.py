"""Grading on real GSM8K / MATH-500 / AQuA references, answer keys, and the math timeout."""

import multiprocessing
import os
import re
import threading

import pytest

from swift_fast.data.datasets import load_dataset
from swift_fast.grading import (
    CUT_OFF_REASONS,
    cut_off,
    extract_answer,
    extract_many,
    grade,
    grade_many,
    has_final_statement,
    judge_many,
    math_workers,
)

# sympy spends minutes on this power (with little memory): a stand-in for any hung comparison.
PATHOLOGICAL = r"So the answer is $\boxed{10^{10^{8}}}$."


@pytest.fixture(scope="module")
def gsm8k(shared_data):
    return load_dataset(os.path.join(shared_data, "gsm8k", "test.jsonl"))


@pytest.fixture(scope="module")
def math500(shared_data):
    return load_dataset(os.path.join(shared_data, "math500", "test.jsonl"))


@pytest.fixture(scope="module")
def aqua(shared_data):
    return load_dataset(os.path.join(shared_data, "aqua", "test.jsonl"))


def _by_reference(examples, ref):
    return next(e for e in examples if e.reference == ref)


def _with_commas(n: str) -> str:
    return f"{int(n):,}"


# ---- math: GSM8K ---------------------------------------------------------------------------


def test_gsm8k_reference_solutions_and_wrong_answers(gsm8k):
    exs = gsm8k[:40]
    responses, refs, expect = [], [], []
    for e in exs:
        n = int(e.reference)
        # The reference solution itself, with its "#### N" turned into a sentence.
        responses += [e.extra["solution"] + f"\nThe answer is {e.reference}.", rf"Thus the total is $\boxed{{{n}}}$."]
        responses += [rf"Thus the total is $\boxed{{{n + 1}}}$.", f"The answer is {n - 3}."]
        refs += [e.reference] * 4
        expect += [True, True, False, False]
    assert grade_many(responses, refs, "math") == expect


def test_gsm8k_thousands_separators_and_units(gsm8k):
    big = [e for e in gsm8k if int(e.reference) >= 1000][:12]
    assert len(big) == 12
    responses, refs, expect = [], [], []
    for e in big:
        c = _with_commas(e.reference)
        for r in (rf"\boxed{{{c}}}", f"The answer is {c}.", rf"\boxed{{\${c}}}", rf"\boxed{{{c} \text{{ dollars}}}}"):
            responses.append(r)
            refs.append(e.reference)
            expect.append(True)
        responses.append(rf"\boxed{{{_with_commas(int(e.reference) + 1000)}}}")
        refs.append(e.reference)
        expect.append(False)
    assert grade_many(responses, refs, "math") == expect


def test_gsm8k_units_and_decimal_forms(gsm8k):
    e = gsm8k[0]
    assert e.reference == "18"
    for r in (r"\boxed{\$18}", r"\boxed{18 \text{ dollars}}", r"\boxed{18.00}", r"\boxed 18", r"$\boxed{18}$ dollars"):
        assert grade(r, e.reference), r
    for r in (r"\boxed{\$19}", r"\boxed{1.8}", "I cannot tell."):
        assert not grade(r, e.reference), r


# ---- math: MATH-500 ------------------------------------------------------------------------


def test_math500_every_reference_and_solution(math500):
    responses, refs = [], []
    for e in math500:
        responses += [rf"The final answer is $\boxed{{{e.reference}}}$.", e.extra["solution"]]
        refs += [e.reference, e.reference]
    stats = {}
    assert all(grade_many(responses, refs, "math", stats=stats))
    assert stats["timeouts"] == stats["crashes"] == stats["errors"] == 0


def test_math500_wrong_answers(math500):
    ints = [e for e in math500 if re.fullmatch(r"-?\d+", e.reference)]
    pairs = [(a, b) for a, b in zip(ints, ints[1:]) if int(a.reference) != int(b.reference)][:60]
    responses = [rf"The final answer is $\boxed{{{b.reference}}}$." for a, b in pairs]
    assert not any(grade_many(responses, [a.reference for a, b in pairs], "math"))


@pytest.mark.parametrize(
    "ref, right, wrong",
    [
        (r"\frac65",
         [r"\boxed{1.2}", r"\boxed{6/5}", r"\boxed{\frac{6}{5}}", r"\boxed{\dfrac{6}{5}}", "The answer is 1.2."],
         [r"\boxed{1.25}"]),
        (r"1\frac{4}{5}", [r"\boxed{1.8}", r"\boxed{\frac{9}{5}}", r"\boxed{1\frac{4}{5}}"], [r"\boxed{1\frac{3}{5}}"]),
        (r"10,\!080", [r"\boxed{10080}", r"\boxed{10,080}", r"\boxed{10\,080}", "The answer is 10,080."],
         [r"\boxed{10,081}"]),
        (r"\$32,\!348", [r"\boxed{\$32,348}", r"\boxed{32348}", r"\boxed{32348 \text{ dollars}}"], [r"\boxed{32,349}"]),
        (r"90^\circ", [r"\boxed{90}", r"\boxed{90^{\circ}}", r"\boxed{90 \text{ degrees}}"], [r"\boxed{45^\circ}"]),
        (r"\text{Evelyn}", [r"\boxed{\text{Evelyn}}", r"\boxed{Evelyn}", r"\boxed{\textbf{Evelyn}}"],
         [r"\boxed{\text{Bob}}"]),
        (r"\text{(C)}", [r"\boxed{C}", r"\boxed{(C)}", r"\boxed{\text{(C)}}"], [r"\boxed{D}"]),
        (r"\frac{270}7\text{ degrees}", [r"\boxed{\frac{270}{7}}", r"\boxed{\frac{270}{7}^\circ}"], [r"\boxed{38.57}"]),
    ],
)
def test_math500_equivalent_forms(math500, ref, right, wrong):
    e = _by_reference(math500, ref)
    got = grade_many(right + wrong, [e.reference] * (len(right) + len(wrong)), "math")
    assert got == [True] * len(right) + [False] * len(wrong)


def test_boxed_variants():
    for r in (r"\boxed 5", r"$\boxed{5}$", r"\boxed{\text{5}}", r"\[\boxed{5}\]",
              r"first $\boxed{3}$, then $\boxed{5}$"):
        assert grade(r, "5"), r
    assert not grade(r"first $\boxed{5}$, then $\boxed{3}$", "5")
    # math-verify reads boxes listed one after another as one set of answers: hedging is wrong.
    assert not grade(r"\boxed{3}, \boxed{5}", "5")
    assert grade(r"\boxed{3}, \boxed{5}", "3, 5")


# ---- multiple choice on AQuA -------------------------------------------------------------------


def test_aqua_letters(aqua):
    responses, refs, expect = [], [], []
    for e in aqua[:25]:
        c = e.reference
        opt = e.extra["options"]["ABCDE".index(c)]
        wrong = "ABCDE"[("ABCDE".index(c) + 1) % 5]
        for r in (
            f"... so the answer is ({c}).",
            f"Working...\n{opt}",
            rf"Therefore $\boxed{{{c}}}$",
            rf"\boxed{{\text{{{c}}}}}",
            f"**Answer:** {c}) {opt[2:]}",
            f"The correct option is {c}.",
            rf"\boxed{{{c.lower()}}}",
        ):
            responses.append(r)
            expect.append(True)
        for r in (rf"\boxed{{{wrong}}}", f"The answer is ({wrong})", "A total of 12 apples.", "No idea."):
            responses.append(r)
            expect.append(False)
        refs += [c] * 11
    assert grade_many(responses, refs, "choice") == expect


def test_choice_extraction_order():
    # The last box wins; prose answers come next; a bare letter on the last line last.
    assert extract_answer(r"\boxed{A} no wait, \boxed{D}", "choice") == "D"
    assert extract_answer("The answer is B.\nFinal: \\boxed{(e)}", "choice") == "E"
    assert extract_answer("Answer: C\n(D)", "choice") == "C"
    assert extract_answer("Hmm.\n(D)", "choice") == "D"
    assert extract_answer("A coin is flipped.", "choice") is None


# ---- boolean and literal ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, answer",
    [
        (r"The coin was flipped twice, so it is heads up. \boxed{Yes}", "yes"),
        (r"\boxed{\text{no}}", "no"),
        ("It was flipped once, so the coin is not heads up.\n**No**.", "no"),
        ("The answer is yes, since it was flipped twice in total.", "yes"),
        (r"\boxed{True}", "yes"),
        ("I am not sure about the casino", None),
    ],
)
def test_boolean(response, answer):
    assert extract_answer(response, "boolean") == answer
    assert grade(response, "Yes", "boolean") is (answer == "yes")
    assert grade(response, False, "boolean") is (answer == "no")


@pytest.mark.parametrize(
    "response, reference, correct, key",
    [
        (r"The loop leaves the dict as \boxed{{0: None}}.", "{0: None}", True, "{0: None}"),
        (r"\boxed{'abc'}", "abc", True, "abc"),
        (r"\boxed{\text{abc}}", "'abc'", True, "abc"),
        ("The output is: [1, 2, 3]", "[1, 2, 3]", True, "[1, 2, 3]"),
        ("result = 2.0", "2", True, "2"),
        ("```python\n(1, 'a')\n```", "(1, 'a')", True, "(1, 'a')"),
        (r"\boxed{\{1, 2\}}", "{2, 1}", True, "{1, 2}"),
        (r"\boxed{[1, 2]}", "[2, 1]", False, "[1, 2]"),
        (r"\boxed{None}", "0", False, "None"),
    ],
)
def test_literal(response, reference, correct, key):
    assert grade(response, reference, "literal") is correct
    assert extract_answer(response, "literal") == key


# ---- answer keys for majority vote ----------------------------------------------------------------


def test_math_keys_equivalent_forms():
    same = [
        [r"\boxed{\frac{6}{5}}", r"\boxed{1.2}", "so it is 6/5", "The answer is 1.2", r"\boxed{\dfrac65}"],
        [r"\boxed{1,000}", "The answer is 1000.", r"\boxed{1\,000}", r"\boxed{1000.0}"],
        [r"\boxed{x = 5}", r"\boxed{5}", r"\boxed{\text{5}}"],
        [r"\boxed{\frac{1}{\sqrt{2}}}", r"\boxed{\frac{\sqrt{2}}{2}}"],
        [r"\boxed{p - q}", r"\boxed{-q + p}"],
    ]
    flat = [r for group in same for r in group]
    keys = extract_many(flat, "math")
    it = iter(keys)
    per_group = [{next(it) for _ in group} for group in same]
    assert all(len(g) == 1 and None not in g for g in per_group), per_group
    assert len({next(iter(g)) for g in per_group}) == len(same)
    assert extract_answer("no numbers here", "math") is None
    assert extract_answer(r"\boxed{c}", "choice") == "C"
    assert extract_answer(r"\boxed{\text{YES}}", "boolean") == "yes"


def test_judge_many_matches_grade_and_extract(math500):
    exs = math500[:20]
    responses = [e.extra["solution"] for e in exs] + [r"\boxed{0.5}"] * 2
    refs = [e.reference for e in exs] + [r"\frac12", "2"]
    js = judge_many(responses, refs, "math")
    assert [j.correct for j in js] == grade_many(responses, refs, "math")
    assert [j.answer for j in js] == extract_many(responses, "math")
    assert all(j.status == "ok" for j in js)


def test_in_process_path_agrees_with_worker_processes(math500):
    responses = [e.extra["solution"] for e in math500[:15]] + [r"\boxed{3.5}", r"\boxed{7/2}", r"\boxed{4}"]
    refs = [e.reference for e in math500[:15]] + [r"\frac72"] * 3
    kinds = ["math"] * len(responses)
    assert grade_many(responses, refs, kinds, timeout=None) == grade_many(responses, refs, kinds)
    assert extract_many(responses, timeout=None) == extract_many(responses)


def test_mixed_kinds_in_one_batch():
    responses = [r"\boxed{12}", r"\boxed{B}", r"\boxed{No}", r"\boxed{[1]}"]
    assert grade_many(responses, ["12", "B", "no", "[1]"], ["math", "choice", "boolean", "literal"]) == [True] * 4
    assert grade_many(responses, ["13", "C", "yes", "[2]"], ["math", "choice", "boolean", "literal"]) == [False] * 4


# ---- timeouts -------------------------------------------------------------------------------------


def test_timeout_from_a_thread():
    out, stats = [], {}

    def work():
        out.append(grade_many([PATHOLOGICAL, r"\boxed{5}"], ["5", "5"], "math", timeout=0.5, stats=stats))
        # math-verify's own (signal) timeouts are off on the in-process path too: this would
        # raise "signal only works in main thread" otherwise.
        out.append(grade(r"\boxed{\frac{1}{2}}", "0.5", timeout=None))

    t = threading.Thread(target=work)
    t.start()
    t.join(120)
    assert not t.is_alive()
    assert out == [[False, True], True]
    assert stats["timeouts"] == 1
    j = judge_many([PATHOLOGICAL], ["5"], timeout=0.3)[0]
    assert (j.correct, j.answer, j.status) == (False, None, "timeout")
    assert grade(r"\boxed{5}", "5")  # the pool still serves after replacing the stuck worker


def _grade_in_worker(args):
    responses, refs, timeout = args
    import multiprocessing as mp

    return mp.current_process().daemon, grade_many(responses, refs, "math", timeout=timeout)


def test_timeout_inside_a_daemonic_worker_process():
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        daemon, got = pool.apply(_grade_in_worker, (([PATHOLOGICAL, r"\boxed{5}"], ["5", "5"], 0.5),))
    assert daemon  # such workers may not start multiprocessing children: the grading workers are subprocesses
    assert got == [False, True]


def test_a_worker_that_dies_is_counted_and_replaced():
    assert grade(r"\boxed{2}", "2")  # a ready worker
    stats, out = {}, []
    t = threading.Thread(
        target=lambda: out.append(
            grade_many([PATHOLOGICAL, r"\boxed{5}"], ["5", "5"], workers=1, timeout=60, stats=stats)
        )
    )
    t.start()
    t.join(1.0)  # the worker is now inside the pathological answer
    for h in list(math_workers.pool().live):
        if h not in math_workers.pool().idle:
            h.proc.kill()
    t.join(120)
    assert not t.is_alive()
    assert out == [[False, True]]
    assert stats["crashes"] == 1


# ---- what counts as an answer: chains, placeholders, words -----------------------------------------


def test_chain_keys_vote_with_their_last_side():
    # Written as the model wrote them; all state 1321, none states 1269.
    same = [
        "So the final answer, which is 1320 - 51 = 1321.",
        r"\boxed{1320 - 51 = 1321}",
        r"$1320 - 51 = 1300 + 21 = 1321$",
        r"\boxed{1,321}",
        "The answer is 1321.",
    ]
    assert extract_many(same) == ["1321"] * len(same)
    assert extract_many(same, timeout=None) == ["1321"] * len(same)
    assert grade_many(same, ["1269"] * len(same)) == [False] * len(same)


def test_non_answers_are_out_of_the_vote():
    texts = [r"\boxed{Your Answer}", r"\boxed{answer}", r"\boxed{\ldots}", r"\boxed{Sara has 17}", r"\boxed{}"]
    assert extract_many(texts) == [None] * len(texts)
    js = judge_many(texts, ["17"] * len(texts))
    assert [(j.correct, j.answer, j.status) for j in js] == [(False, None, "ok")] * len(texts)
    # a word is a text answer without a reference, and no value where a number is asked
    assert extract_answer(r"\boxed{Evelyn}") == extract_answer(r"\boxed{\text{Evelyn}}") == "evelyn"
    assert judge_many([r"\boxed{Evelyn}", r"\boxed{2x}"], ["17", "17"])[0].answer is None
    assert judge_many([r"\boxed{2x}"], ["17"])[0].answer is None
    assert judge_many([r"\boxed{2x}"], ["2x"])[0] == judge_many([r"\boxed{2 x}"], ["2x"])[0]


# ---- truncation ------------------------------------------------------------------------------------


def test_cut_off_rule():
    assert CUT_OFF_REASONS == {"length", "pruned", "abort"}
    for why in ("length", "pruned", "abort"):
        assert cut_off("2960 * 2 = 59", why)
    for why in ("stop", None, "error"):
        assert not cut_off("2960 * 2 = 59", why)
    complete = [r"\boxed{12} and then 3 * 4 = 1", "The answer is 12.", "Final answer: 12\n", "**Answer:** $12$",
                "#### 12\n", "So the final answer, which is 1320 - 51 = 1321."]
    incomplete = ["The answer is 12", r"The answer is \boxed{12", "The answer is 1320 - 51 = 13", "The answer is",
                  r"The answer is \frac{1}{2", "The answer is 12.5", r"\boxed{Your Answer} 12 + 3 = 15"]
    assert [has_final_statement(t) for t in complete] == [True] * len(complete)
    assert [has_final_statement(t) for t in incomplete] == [False] * len(incomplete)
    assert has_final_statement("The answer is (C)", "choice") and not has_final_statement("The answer is (C", "choice")
    # a lone letter ends a choice statement only with something after it; for math it is no value at all
    assert not has_final_statement("The answer is a bit long, 12.")


def test_truncation_in_batches_and_stats():
    texts = ["2960 * 2 = 59", "2960 * 2 = 59", r"\boxed{59} wait, 2960 * 2 = 5", "The answer is (B", "The answer is (B"]
    refs = ["59", "59", "59", "B", "B"]
    kinds = ["math", "math", "math", "choice", "choice"]
    why = ["length", "stop", "length", "length", None]
    stats = {}
    js = judge_many(texts, refs, kinds, finish_reasons=why, stats=stats)
    assert [(j.correct, j.answer, j.status) for j in js] == [
        (False, None, "truncated"), (True, "59", "ok"), (True, "59", "ok"),
        (False, None, "truncated"), (True, "B", "ok"),
    ]
    assert stats["truncated"] == 2 and stats["graded"] == 5 and stats["errors"] == 0
    assert grade_many(texts, refs, kinds, finish_reasons=why, truncation="lenient") == [True, True, True, True, True]
    assert extract_many(texts, kinds, finish_reasons=why) == [None, "59", "59", None, "B"]
    assert not grade("2960 * 2 = 59", "59", finish_reason="length")
    assert grade("2960 * 2 = 59", "59", finish_reason="length", truncation="lenient")
    assert extract_answer("2960 * 2 = 59", finish_reason="length") is None
    # the same text with and without a cut is graded apart (not merged by the dedup of identical answers)
    assert grade_many(["5 + 7 = 12"] * 2, ["12"] * 2, finish_reasons=["length", "stop"], timeout=None) == [False, True]


def test_regrade_and_collect_apply_the_rule():
    from swift_fast.cli.eval import regrade
    from swift_fast.data.datasets import Example
    from swift_fast.data.rollouts import Problem
    from swift_fast.jobs.collect import grade_candidates

    def cands():
        return [
            {"text": "Both weeks: 2960 * 2 = 59", "finish_reason": "length"},
            {"text": r"So \boxed{59}.", "finish_reason": "length"},
            {"text": "Both weeks: 2960 * 2 = 59", "finish_reason": "stop"},
            {"text": "Both weeks: 2960 * 2 = 59"},
        ]

    problems = [Problem(id="p", candidates=cands(), reference="59", kind="math")]
    stats = regrade(problems)
    assert [(c["correct"], c["answer"]) for c in problems[0].candidates] == [
        (False, None), (True, "59"), (True, "59"), (True, "59"),
    ]
    assert stats["truncated"] == 1
    lenient = [Problem(id="p", candidates=cands(), reference="59", kind="math")]
    assert regrade(lenient, truncation="lenient")["truncated"] == 0
    assert all(c["correct"] for c in lenient[0].candidates)

    rolled = [cands()]
    grade_candidates(rolled, [Example(id="d/0", question="q", reference="59", kind="math", dataset="d")], timeout=5.0)
    assert [(c["correct"], c["answer"]) for c in rolled[0]] == [(False, None), (True, "59"), (True, "59"), (True, "59")]


# ---- bad input -------------------------------------------------------------------------------------


def test_bad_arguments_are_explained():
    with pytest.raises(ValueError, match="unknown answer kind 'numeric'"):
        grade("1", "1", "numeric")
    with pytest.raises(ValueError, match="choice reference 0 must be a letter"):
        grade("A", "F", "choice")
    with pytest.raises(ValueError, match="boolean reference 0 must be yes/no"):
        grade("yes", "maybe", "boolean")
    with pytest.raises(ValueError, match="reference 1 is missing"):
        grade_many(["1", "2"], ["1", None])
    with pytest.raises(ValueError, match="2 references for 3 responses"):
        grade_many(["1", "2", "3"], ["1", "2"])
    with pytest.raises(ValueError, match="timeout must be a positive"):
        grade("1", "1", timeout=0)
    with pytest.raises(TypeError, match="response 0 must be a str"):
        grade(None, "1")
    with pytest.raises(TypeError, match="sequence of strings"):
        grade_many("1", ["1"])
    with pytest.raises(ValueError, match="truncation must be 'strict'.*or 'lenient'.*got 'loose'"):
        grade("1", "1", truncation="loose")
    with pytest.raises(ValueError, match="1 finish reasons for 2 responses"):
        grade_many(["1", "2"], ["1", "2"], finish_reasons=["stop"])
    with pytest.raises(TypeError, match="one finish reason per response"):
        grade_many(["1"], ["1"], finish_reasons="length")
    with pytest.raises(TypeError, match="finish reason 0 must be a str or None, got int"):
        grade_many(["1"], ["1"], finish_reasons=[1])

