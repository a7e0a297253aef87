"""Loaders on the real benchmark files and on malformed ones."""

import json
import os

import pytest

from swift_fast import DataError, load_dataset
from swift_fast.data.datasets import Example, detect_format


def _rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_gsm8k(shared_data):
    path = os.path.join(shared_data, "gsm8k", "test.jsonl")
    rows = _rows(path)
    exs = load_dataset(path)
    assert len(exs) == len(rows) == 1319
    for i, (e, r) in enumerate(zip(exs, rows)):
        final = r["answer"].split("\n")[-1]
        assert final.startswith("#### ")
        assert e.reference == final[len("#### "):].replace(",", "")
        assert (e.id, e.question, e.kind, e.dataset) == (f"gsm8k/{i}", r["question"], "math", "gsm8k")
    assert exs[0].reference == "18"
    # Thousands separators are gone: "1,450,000" in the file.
    assert "1450000" in {e.reference for e in exs}


def test_math500(shared_data):
    path = os.path.join(shared_data, "math500", "test.jsonl")
    rows = _rows(path)
    exs = load_dataset(os.path.dirname(path))  # a folder means its test.jsonl
    assert len(exs) == 500
    for e, r in zip(exs, rows):
        assert (e.question, e.reference, e.kind) == (r["problem"], r["answer"], "math")
        assert e.extra["unique_id"] == r["unique_id"] and e.extra["level"] == r["level"]
    assert exs[157].reference == r"\frac65"


@pytest.mark.parametrize("split", ["test", "dev"])
def test_aqua(shared_data, split):
    path = os.path.join(shared_data, "aqua", f"{split}.jsonl")
    rows = _rows(path)
    exs = load_dataset(path)
    assert len(exs) == 254
    prefix = "aqua" if split == "test" else "aqua-dev"
    for i, (e, r) in enumerate(zip(exs, rows)):
        assert e.id == f"{prefix}/{i}" and e.kind == "choice" and e.reference == r["correct"]
        assert e.question.startswith(r["question"] + "\n")
        for opt in r["options"]:
            assert opt in e.question
        assert e.extra["options"] == r["options"]


def test_names_limit_and_kind(shared_data, monkeypatch):
    monkeypatch.setenv("SWIFT_FAST_DATA", shared_data)
    assert [e.id for e in load_dataset("gsm8k", limit=3)] == ["gsm8k/0", "gsm8k/1", "gsm8k/2"]
    assert load_dataset("aqua:dev", limit=1)[0].id == "aqua-dev/0"
    assert load_dataset("math500", limit=2, kind="literal")[1].kind == "literal"
    with pytest.raises(DataError, match="no file .*nosuch"):
        load_dataset("nosuch")
    monkeypatch.delenv("SWIFT_FAST_DATA")
    with pytest.raises(DataError, match="set SWIFT_FAST_DATA"):
        load_dataset("gsm8k")


def _write(tmp_path, name, lines):
    p = tmp_path / name
    p.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return str(p)


def test_generic(tmp_path):
    p = _write(
        tmp_path,
        "coinflip.jsonl",
        [
            {"prompt": "A coin is heads up. Ka flips it. Is it still heads up?", "answer": "No", "kind": "boolean"},
            {"prompt": "What is 2+2?", "answer": 4, "id": "q-2", "level": 1},
            "",
            {"question": "Pick one", "answer": "B", "dataset": "hellaswag", "kind": "choice"},
        ],
    )
    exs = load_dataset(p)
    assert exs[0] == Example("coinflip/0", exs[0].question, "No", "boolean", "coinflip", {})
    assert (exs[1].id, exs[1].reference, exs[1].kind, exs[1].extra) == ("q-2", 4, "math", {"level": 1})
    assert (exs[2].id, exs[2].dataset, exs[2].kind) == ("coinflip/3", "hellaswag", "choice")
    assert [e.kind for e in load_dataset(p, kind="literal")] == ["literal"] * 3


def test_format_detection():
    assert detect_format({"question": "q", "answer": "x\n#### 5"}) == "gsm8k"
    assert detect_format({"problem": "q", "answer": "5"}) == "math500"
    assert detect_format({"question": "q", "options": [], "correct": "A"}) == "aqua"
    assert detect_format({"prompt": "q", "answer": "5"}) == "generic"
    assert detect_format({"text": "q"}) is None


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"question": "q", "answer": "x\\n#### 5"', "invalid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ({"question": "q", "answer": "no final line"}, "no '#### <number>' line"),
        ({"question": "q", "answer": "x\n#### five"}, "must be a number, got 'five'"),
        ({"question": 3, "answer": "x\n#### 5"}, "field 'question' must be a string"),
        ({"answer": "x\n#### 5"}, "missing field 'question'"),
    ],
)
def test_malformed_gsm8k_rows_name_file_and_line(tmp_path, bad, message):
    good = {"question": "q", "answer": "x\n#### 1,234"}
    p = _write(tmp_path, "test.jsonl", [good, bad, good])
    with pytest.raises(DataError, match=rf"test\.jsonl:2: .*{message}"):
        load_dataset(p)
    stats = {}
    exs = load_dataset(p, skip_bad=True, stats=stats)
    assert [e.id for e in exs] == ["gsm8k/0", "gsm8k/2"]
    assert exs[0].reference == "1234"
    assert stats["skipped"] == 1 and stats["loaded"] == 2 and ":2: " in stats["errors"][0]


def test_malformed_aqua_and_math_rows(tmp_path):
    opts = ["A)1", "B)2", "C)3", "D)4", "E)5"]
    p = _write(
        tmp_path,
        "aqua.jsonl",
        [
            {"question": "q", "options": opts, "correct": "C"},
            {"question": "q", "options": opts, "correct": "F"},
            {"question": "q", "options": ["1", "2"], "correct": "A"},
            {"question": "q", "options": ["A)1", "C)2"], "correct": "A"},
        ],
    )
    with pytest.raises(DataError, match=r"aqua\.jsonl:2: field 'correct' is 'F', not one of the options ABCDE"):
        load_dataset(p)
    stats = {}
    assert len(load_dataset(p, skip_bad=True, stats=stats)) == 1
    assert "does not start with its letter" in stats["errors"][1] and "lettered AC" in stats["errors"][2]
    p = _write(tmp_path, "m.jsonl", [{"problem": "q", "answer": "  "}])
    with pytest.raises(DataError, match=r"m\.jsonl:1: field 'answer' is empty"):
        load_dataset(p)
    with pytest.raises(DataError, match="cannot tell the format"):
        load_dataset(_write(tmp_path, "x.jsonl", [{"text": "q"}]))
    with pytest.raises(DataError, match="duplicate id 'a'"):
        load_dataset(_write(tmp_path, "d.jsonl", [{"prompt": "q", "answer": 1, "id": "a"}] * 2))
    with pytest.raises(DataError, match="no usable examples"):
        load_dataset(_write(tmp_path, "e.jsonl", ["{}"]), format="generic", skip_bad=True)


def test_explicit_format_and_bad_arguments(tmp_path):
    p = _write(tmp_path, "g.jsonl", [{"question": "q", "answer": "x\n#### 5"}])
    assert load_dataset(p, format="generic")[0].reference == "x\n#### 5"
    with pytest.raises(DataError, match="missing field 'problem'"):
        load_dataset(p, format="math500")
    with pytest.raises(ValueError, match="unknown format"):
        load_dataset(p, format="csv")
    with pytest.raises(ValueError, match="unknown kind"):
        load_dataset(p, kind="numeric")
    with pytest.raises(DataError, match="no data file"):
        load_dataset(str(tmp_path / "missing.jsonl"))


def test_loading_data_starts_no_grading_machinery():
    """The loaders need the answer kinds only: importing them registers no fork or exit handler
    of the math grading workers."""
    import subprocess
    import sys

    code = "import sys, swift_fast.data.datasets; print('swift_fast.grading.math_workers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
