"""No two modules of the package import each other (at module level or inside a function)."""

import ast
import os

import pytest

PACKAGE = "swift_fast"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), PACKAGE)


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[: -len(".py")].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join(rel)


def _modules() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                out[_module_name(path)] = path
    return out


def _imports(name: str, path: str, known: set[str]) -> set[str]:
    """The package modules ``name`` imports anywhere in its file (``from . import x`` counts as
    importing ``x`` when ``x`` is a module, else as importing the package)."""
    is_pkg = os.path.basename(path) == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[: len(base) - (node.level - 1)]
                mod = ".".join(up + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names]
            # "from . import sibling" imports the sibling; the package itself only when a name
            # taken from it is not a submodule.
            targets = subs + ([mod] if any(t not in known for t in subs) else [])
        else:
            continue
        for t in targets:
            if t in known and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def test_the_walk_sees_the_grading_modules():
    g = _graph()
    assert {"swift_fast.grading.answers", "swift_fast.grading.math_judge", "swift_fast.grading.math_workers"} <= set(g)
    # the checker itself must see both import forms the package uses
    assert "swift_fast.grading.math_judge" in g["swift_fast.grading.answers"]
    # a function-level `from . import math_workers`
    assert "swift_fast.grading.math_workers" in g["swift_fast.grading.answers"]
    assert "swift_fast.grading.math_judge" in g["swift_fast.grading.math_workers"]


def test_no_two_modules_import_each_other():
    g = _graph()
    pairs = sorted({tuple(sorted((a, b))) for a, deps in g.items() for b in deps if a in g.get(b, ())})
    assert not pairs, "modules that import each other: " + ", ".join(f"{a} <-> {b}" for a, b in pairs)


def test_math_workers_never_import_grading():
    # a worker process imports the package on the way to math_workers: it must import nothing itself
    g = _graph()
    assert "swift_fast.grading.answers" not in g["swift_fast.grading.math_workers"]
    assert not g["swift_fast.grading"]


@pytest.mark.parametrize(
    "source, expect",
    [
        ("from . import b\n", {"swift_fast.b"}),
        ("def f():\n    from .b import x\n", {"swift_fast.b"}),
        ("import swift_fast.b\n", {"swift_fast.b"}),
        ("from .. import b\n", set()),  # above the package: nothing of ours
        ("from . import b, c\n", {"swift_fast.b", "swift_fast"}),  # c is a name defined in the package
    ],
)
def test_import_forms_are_resolved(tmp_path, source, expect):
    path = tmp_path / "a.py"
    path.write_text(source)
    assert _imports("swift_fast.a", str(path), {"swift_fast", "swift_fast.a", "swift_fast.b"}) == expect


#: the package's parts, lowest first: a module imports only from its own part or the parts below
#: (docs/layout.md draws the same picture)
LAYERS = [
    ("swift_fast", "swift_fast._compat", "swift_fast.definitions", "swift_fast.support"),
    ("swift_fast.kernels",),
    ("swift_fast.rewards", "swift_fast.selection", "swift_fast.training"),
    ("swift_fast.data", "swift_fast.grading", "swift_fast.reports"),
    ("swift_fast.hf", "swift_fast.vllm_plugin"),
    ("swift_fast.jobs", "swift_fast.rl"),
    ("swift_fast.demo", "swift_fast.testing"),
    ("swift_fast.cli", "swift_fast.__main__"),
]


def _layer(module: str) -> int:
    best, rank = "", None
    for i, parts in enumerate(LAYERS):
        for p in parts:
            if (module == p or module.startswith(p + ".")) and len(p) > len(best):
                best, rank = p, i
    return rank


def test_every_module_has_a_layer():
    assert [m for m in _graph() if _layer(m) is None] == []


def test_every_import_points_down():
    up = sorted(f"{a} -> {b}" for a, deps in _graph().items() for b in deps if _layer(b) > _layer(a))
    assert not up, "imports that point up: " + "; ".join(up)


def test_the_layers_see_an_upward_import():
    assert _layer("swift_fast.rewards.head") < _layer("swift_fast.hf.features") < _layer("swift_fast.cli.train")
    assert _layer("swift_fast") == 0  # the light package (__version__) may be imported from anywhere
