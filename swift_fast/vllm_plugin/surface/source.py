"""The table against a vLLM source tree, importing nothing: how a release that cannot run here
is read (:func:`check_surface_against_source`), and what each record looks like in a tree
(:func:`source_report`, two of them compared show what changed between versions).

A record is found the way Python would find it, with ``ast`` instead of imports: a module-level
name in its module (inside ``if``/``try``/``with`` blocks too), else through the module's
re-exports (``from .x import name``, star imports, a submodule, the lazy attribute table of
``vllm/__init__.py``); a member in the class body or a base vLLM defines, or as ``self.<name> =``
in one of the class's methods. Where ``ast`` cannot follow (a name made at run time, an
instance's attribute, a function's attribute), the rest of the name is looked for as a word in
the file. A callable's
parameters are read from its ``def``, a class's from its ``__init__`` or, without one, its
declared fields. Platform tags do not apply: every file can be read.
"""

from __future__ import annotations

import ast
import os
import re
from typing import Any, Iterable

from . import table
from .table import SIDES, Symbol, select


class _SourceTree:
    """An unpacked vLLM package read with ``ast`` (nothing is imported)."""

    def __init__(self, root: str):
        root = os.fspath(root)
        if os.path.isfile(os.path.join(root, "vllm", "__init__.py")):
            root = os.path.join(root, "vllm")
        if not os.path.isfile(os.path.join(root, "__init__.py")):
            raise FileNotFoundError(f"{root} is not a vllm package directory (no __init__.py)")
        self.root = root
        self._parsed: dict[str, tuple[ast.Module, str] | None] = {}

    def path(self, module: str) -> str | None:
        parts = module.split(".")[1:]
        base = os.path.join(self.root, *parts)
        for p in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(p):
                return p
        return None

    def parsed(self, module: str) -> tuple[ast.Module, str] | None:
        if module not in self._parsed:
            p = self.path(module)
            if p is None:
                self._parsed[module] = None
            else:
                with open(p, encoding="utf-8") as fh:
                    text = fh.read()
                self._parsed[module] = (ast.parse(text, p), text)
        return self._parsed[module]

    # -- module level ------------------------------------------------------------------------------
    def top(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """``(module, node)`` defining ``name`` at module level, following re-exports."""
        got = self.parsed(module)
        if got is None or depth > 8:
            return None
        tree, text = got
        for node in _top_level(tree.body):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return module, node
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _target_names(node):
                return module, node
        for node in _top_level(tree.body):
            if not isinstance(node, ast.ImportFrom):
                continue
            src = _absolute(module, node, self.path(module))
            if src is None or not src.startswith("vllm"):
                continue
            for alias in node.names:
                if alias.name == "*":  # from .parallel_state import *
                    found = self.top(src, name, depth + 1)
                    if found is not None:
                        return found
                elif (alias.asname or alias.name) == name:
                    if self.path(f"{src}.{alias.name}") is not None:  # a submodule
                        return f"{src}.{alias.name}", ast.Module(body=[], type_ignores=[])
                    return self.top(src, alias.name, depth + 1)
        if self.path(f"{module}.{name}") is not None:  # a submodule, imported by its parent or not
            return f"{module}.{name}", ast.Module(body=[], type_ignores=[])
        # a lazy attribute table (vllm/__init__.py: "LLM": ".entrypoints.llm:LLM")
        m = re.search(r'"%s"\s*:\s*"(\.[\w.]+):(\w+)"' % re.escape(name), text)
        if m:
            return self.top(_join(module, m.group(1), self.path(module)), m.group(2), depth + 1)
        return None

    # -- class members ------------------------------------------------------------------------------
    def member(self, module: str, cls: ast.ClassDef, name: str, depth: int = 0) -> ast.AST | str | None:
        """The node defining ``name`` in class ``cls`` or a base vLLM defines; ``"self"`` for an attribute
        assigned on ``self`` in a method."""
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                return node
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and name in _target_names(node):
                return node
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and name in _self_assigned(node):
                return "self"
        if depth > 8:
            return None
        for base in cls.bases:
            found = self.base_class(module, base)
            if found is not None:
                hit = self.member(found[0], found[1], name, depth + 1)
                if hit is not None:
                    return hit
        return None

    def base_class(self, module: str, base: ast.expr) -> tuple[str, ast.ClassDef] | None:
        if isinstance(base, ast.Subscript):  # Generic[T], Protocol[T]
            base = base.value
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        found = self.top(module, name) if name else None
        if found is not None and isinstance(found[1], ast.ClassDef):
            return found[0], found[1]
        return None

    # -- one record ---------------------------------------------------------------------------------
    def resolve(self, sym: Symbol) -> tuple[str, ast.AST | str | None, str | None]:
        """``(module, node, None)``, or ``(.., .., why not)``. Past something ``ast`` cannot follow
        (an instance's attribute, a function's attribute), the rest is looked for as a word in the file."""
        if self.parsed(sym.module) is None:
            return sym.module, None, f"no module {sym.module}"
        if sym.kind == "module":
            return sym.module, None, None
        module, node = sym.module, None
        parts = sym.name.split(".")
        for i, part in enumerate(parts):
            where = ".".join([sym.module, *parts[:i]])
            if i == 0:
                found = self.top(module, part)
                if found is None:
                    return module, None, self._textual(module, parts[i:], where)
                module, node = found
            elif isinstance(node, ast.ClassDef):
                node = self.member(module, node, part)
                if node is None:
                    return module, None, f"{where} has no attribute {part!r}"
            else:
                return module, None, self._textual(module, parts[i:], where)
        return module, node, None

    def _textual(self, module: str, rest: list[str], where: str) -> str | None:
        text = self.parsed(module)[1]
        missing = [p for p in rest if not re.search(r"\b%s\b" % re.escape(p), text)]
        return f"{where}: {missing} not found in {self.path(module)}" if missing else None

    def problem(self, sym: Symbol) -> str | None:
        if sym.kind == "env":
            got = self.parsed(sym.module)
            return None if got and f'"{sym.name}"' in got[1] else f"{sym.name} not in {sym.module}"
        module, node, why = self.resolve(sym)
        if why is not None:
            return None if sym.optional else why
        if sym.params:
            names, leading = self.parameters(module, node)
            if names is None:
                return None
            missing = [p for p in sym.params if p not in names]
            if missing and sym.forwards_to and self.takes_kwargs(module, node):
                target = self.top(*sym.forwards_to.split(":"))
                fields = self.fields(*target) if target and isinstance(target[1], ast.ClassDef) else []
                missing = [p for p in missing if p not in fields]
            if missing:
                return f"no parameter(s) {missing}; its parameters are ({', '.join(names)})"
            want = list(sym.params[: sym.positional])
            if leading[: len(want)] != want:
                return f"its leading parameters are ({', '.join(leading[: len(want) + 2])}), the plugin passes {want}"
        return None

    def parameters(self, module: str, node: Any) -> tuple[list[str] | None, list[str]]:
        """Parameter names of a function node, of a class's ``__init__`` or its declared fields."""
        if isinstance(node, ast.ClassDef):
            init = self.member(module, node, "__init__")
            if isinstance(init, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return self.parameters(module, init)
            return self.fields(module, node), []
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None, []  # an attribute holding a callable: not followed
        a = node.args
        positional = [x.arg for x in a.posonlyargs + a.args]
        method = positional and positional[0] in ("self", "cls")
        if method:
            positional = positional[1:]
        return positional + [x.arg for x in a.kwonlyargs], positional

    def takes_kwargs(self, module: str, node: Any) -> bool:
        if isinstance(node, ast.ClassDef):
            node = self.member(module, node, "__init__")
        return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.args.kwarg is not None

    def fields(self, module: str, cls: ast.ClassDef, depth: int = 0) -> list[str]:
        out = [n for node in cls.body if isinstance(node, ast.AnnAssign) for n in _target_names(node)]
        for base in cls.bases if depth < 8 else ():
            found = self.base_class(module, base)
            if found is not None:
                out += self.fields(found[0], found[1], depth + 1)
        return out

    def signature_text(self, sym: Symbol) -> str:
        """What the tree holds for ``sym``, in a line: its parameters for a callable, else "found"."""
        why = self.problem(sym)
        if why is not None:
            return "MISSING: " + why
        if sym.kind not in ("function", "method") and not sym.params:
            return "found"
        module, node, _ = self.resolve(sym)
        names, _ = self.parameters(module, node) if node is not None else (None, [])
        return "found" if names is None else f"({', '.join(names)})"


def _top_level(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """Module-level statements, looking inside ``if``/``try``/``with`` blocks (not functions)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def _target_names(node: ast.Assign | ast.AnnAssign) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    out = []
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, ast.Name):
                out.append(n.id)
    return out


def _self_assigned(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = fn.args.posonlyargs + fn.args.args
    if not args:
        return set()
    me = args[0].arg
    out = set()
    for node in ast.walk(fn):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                and node.value.id == me):
            out.add(node.attr)
    return out


def _absolute(module: str, node: ast.ImportFrom, path: str | None) -> str | None:
    if not node.level:
        return node.module
    return _join(module, "." * node.level + (node.module or ""), path)


def _join(module: str, relative: str, path: str | None) -> str:
    """The absolute name of ``relative`` (``".x"``, ``"..y.z"``) imported from ``module``."""
    level = len(relative) - len(relative.lstrip("."))
    package = module.split(".")
    if not (path and path.endswith("__init__.py")):
        package = package[:-1]
    base = package[: len(package) - (level - 1)] if level > 1 else package
    rest = relative.lstrip(".")
    return ".".join(base + ([rest] if rest else []))


def check_surface_against_source(root: str, runner: str | None = None,
                                 sides: Iterable[str] | None = None) -> list[str]:
    """The table checked against an unpacked vLLM source tree, importing nothing.

    ``root``: the ``vllm`` package directory (or its parent). ``runner``/``sides`` select as in
    :func:`select`; the default is every record. Returns one line per record that the tree lacks
    or has changed (empty: all found). Platform tags do not apply: every file can be read.
    """
    tree = _SourceTree(root)
    syms = table.SURFACE if runner is None and sides is None else select(runner, sides or SIDES)
    return [f"{s.describe()}: {why}" for s in syms if (why := tree.problem(s)) is not None]


def source_report(root: str) -> dict[str, str]:
    """For every record, what the tree at ``root`` holds (a callable's parameters, "found", or
    "MISSING: ..."): compare the reports of two trees to see what changed between versions."""
    tree = _SourceTree(root)
    return {f"{s.qualname} [{s.runner}]": tree.signature_text(s) for s in table.SURFACE}

