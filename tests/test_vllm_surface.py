"""The coupling surface (``swift_fast.vllm_plugin.surface``): the table holds for the installed vLLM,
lists every vLLM name the package uses, and a removed or renamed symbol is refused with a clear error.

Nothing here starts an engine, and nothing of vLLM is mocked: the checks run against the vLLM that
is installed (and, when it is unpacked beside the checkout, the source of another version).

How the completeness check decides what is a vLLM name (:func:`collect` and :func:`vllm_names`):
every module of ``swift_fast`` that touches vLLM (``vllm_plugin/`` and every module importing
``vllm``) is parsed, and its imported vLLM names, ``vllm.*`` module strings, ``VLLM_*`` environment
variables and accessed attribute names (``x.name``, ``getattr(x, "name")``, ``cls.__dict__.get("name")``,
``"name" in vars(x)``) are collected. An attribute name counts as vLLM's when a class of the
modules in the table (or imported by the package) defines it -- in its own ``__dict__``, as a
dataclass/msgspec/pydantic/NamedTuple field or annotation, or as ``self.<name> = ...`` in a method
-- and it is neither an attribute of ``torch.Tensor``, ``numpy.ndarray``, ``torch.nn.Module``, the
builtin types or ``collections`` nor a name swift-fast defines itself (functions, classes, class
attributes, ``self.<name>`` of its own classes, ``__slots__``).
"""

from __future__ import annotations

import ast
import collections
import importlib
import importlib.util
import inspect
import os
import re
import time
import types

import pytest

vllm = pytest.importorskip("vllm")

from swift_fast.vllm_plugin import surface  # noqa: E402 - after the skip: the module is only useful with vLLM
from swift_fast.vllm_plugin.surface import SURFACE, Symbol, VllmSurfaceError  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "swift_fast")
PLUGIN = os.path.join(PACKAGE, "vllm_plugin")
SURFACE_DIR = os.path.join(PLUGIN, "surface")
VLLM_SOURCE = os.path.dirname(vllm.__file__)
#: the GPU wheel of another version, unpacked (Python files only), when present beside the checkout
#: other vLLM source trees to check the table against (e.g. an unpacked GPU wheel's ``vllm`` folder:
#: ``pip download --no-deps vllm==0.33.0``, unzip), separated by ``os.pathsep``
OTHER_SOURCES = tuple(p for p in os.environ.get("SWIFT_FAST_VLLM_SOURCES", "").split(os.pathsep) if p)

_MODULE_STRING = re.compile(r"^vllm(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ENV_STRING = re.compile(r"^VLLM_[A-Z0-9_]+$")


@pytest.fixture(autouse=True)
def fresh_cache():
    """Every test starts and ends with an empty per-process cache (some change the table)."""
    surface.clear_cache()
    yield
    surface.clear_cache()


# -- (a) the installed vLLM ---------------------------------------------------------------------------
@pytest.mark.parametrize("runner", [None, "v1", "v2"])
def test_installed_vllm_has_every_symbol(runner):
    surface.check_surface(runner, sides=surface.SIDES)


def test_default_sides_pass_and_are_cheap_once_imported():
    for sym in SURFACE:  # what the processes have imported by the time they check
        importlib.import_module(sym.module)
    surface.clear_cache()
    t0 = time.perf_counter()
    surface.check_surface()
    surface.check_surface(sides=("server",))
    surface.check_surface("v1")
    surface.check_surface("v2")
    took = time.perf_counter() - t0
    assert took < 0.5, f"the start-up checks took {took:.3f} s"
    t0 = time.perf_counter()
    surface.check_surface("v1")
    assert time.perf_counter() - t0 < 0.01  # cached per process


def test_records_are_well_formed():
    seen = set()
    for s in SURFACE:
        assert s.kind in surface.KINDS and s.use in surface.USES, s
        assert s.runner in surface.RUNNERS and s.side in surface.SIDES and s.platform in surface.PLATFORMS, s
        assert s.positional <= len(s.params), s
        assert s.module.startswith("vllm"), s
        assert s.qualname not in seen, f"{s.qualname} is listed twice"
        seen.add(s.qualname)
        assert s.runner == "any" or s.side == "worker", f"{s.qualname}: a runner's symbol is a worker's"
    assert Symbol("m", "A._b", "method", "wrap").private and not Symbol("m", "A.__init__", "method", "wrap").private


def test_select_keeps_other_runners_out():
    v1 = {s.qualname for s in surface.select("v1")}
    v2 = {s.qualname for s in surface.select("v2")}
    assert "vllm.v1.worker.gpu_model_runner.GPUModelRunner._sample" in v1
    assert "vllm.v1.worker.gpu_model_runner.GPUModelRunner._sample" not in v2
    assert "vllm.v1.worker.gpu.model_runner.GPUModelRunner.sample" in v2
    front = surface.select()
    assert front and all(s.runner == "any" and s.side in surface.FRONT_SIDES for s in front)
    with pytest.raises(ValueError, match="runner"):
        surface.select("v3")


# -- (c) a removed or renamed symbol ------------------------------------------------------------------
def _refused(monkeypatch, *records: Symbol, runner=None) -> VllmSurfaceError:
    monkeypatch.setattr(surface.table, "SURFACE", records)
    surface.clear_cache()
    with pytest.raises(VllmSurfaceError) as info:
        surface.check_surface(runner, sides=surface.SIDES)
    return info.value


def _names_version_and_range(err: VllmSurfaceError, symbol: str) -> None:
    text = str(err)
    assert symbol in text
    assert vllm.__version__ in text and err.version == vllm.__version__
    assert surface.tested_range() in text
    assert "Install a tested vLLM" in text


def test_a_renamed_method_is_refused(monkeypatch):
    err = _refused(monkeypatch, Symbol("vllm.v1.core.sched.scheduler", "Scheduler.update_from_outputs", "method",
                                       "wrap", side="core"))
    _names_version_and_range(err, "Scheduler.update_from_outputs")
    assert "has no attribute 'update_from_outputs'" in str(err) and len(err.problems) == 1


def test_a_renamed_parameter_is_refused(monkeypatch):
    err = _refused(monkeypatch, Symbol("vllm.v1.core.sched.scheduler", "Scheduler.update_from_output", "method",
                                       "wrap", side="core", params=("scheduler_output", "runner_output"), positional=2))
    _names_version_and_range(err, "Scheduler.update_from_output")
    assert "runner_output" in str(err) and "model_runner_output" in str(err)


def test_a_moved_parameter_is_refused(monkeypatch):
    err = _refused(monkeypatch, Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample", "method", "wrap",
                                       runner="v1", side="worker", params=("spec_decode_metadata", "logits"),
                                       positional=2), runner="v1")
    _names_version_and_range(err, "GPUModelRunner._sample")
    assert "leading parameters are (logits, spec_decode_metadata" in str(err)
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in str(err)  # a V1-only problem: the other runner is suggested


def test_missing_instance_attribute_and_module_are_refused(monkeypatch):
    err = _refused(
        monkeypatch,
        Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.discard_request_masks", "attribute", "read",
               runner="v1", side="worker"),
        Symbol("vllm.v1.worker.no_such_module", "", "module", "import", side="worker"),
        Symbol("vllm.envs", "VLLM_NO_SUCH_VARIABLE", "env", "set"),
        runner="v1",
    )
    assert len(err.problems) == 3
    _names_version_and_range(err, "GPUModelRunner.discard_request_masks")
    assert "vllm.v1.worker.no_such_module" in str(err) and "VLLM_NO_SUCH_VARIABLE" in str(err)


def test_instance_attributes_resolve_without_instances():
    # assigned in __init__, in load_model (recorded), in a method other than the recorded one,
    # a property, a dataclass field without default, a NamedTuple field, a msgspec field
    records = (
        Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.discard_request_mask", "attribute", "read"),
        Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.model", "attribute", "read",
               assigned_in="load_model"),
        Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.model", "attribute", "read"),
        Symbol("vllm.v1.worker.gpu_input_batch", "InputBatch.req_ids", "attribute", "read"),
        Symbol("vllm.v1.core.sched.output", "NewRequestData.req_id", "field", "read"),
        Symbol("vllm.v1.worker.gpu_model_runner", "ExecuteModelState.logits", "field", "read"),
        Symbol("vllm.v1.engine", "EngineCoreOutput.ec_transfer_params", "field", "read"),
        Symbol("vllm.model_executor.models.llama", "LlamaModel.layers", "attribute", "read"),  # behind a decorator
    )
    for sym in records:
        assert surface.runtime._problem(sym) is None, sym


def test_platform_modules_are_checked_only_where_they_import(monkeypatch):
    here = "cpu" if surface.runtime._on_platform("cpu") else "cuda"
    other = "cuda" if here == "cpu" else "cpu"
    elsewhere = Symbol("vllm.v1.worker.no_such_runner", "", "module", "import", side="worker", platform=other)
    monkeypatch.setattr(surface.table, "SURFACE", (elsewhere,))
    surface.check_surface("v1")  # another platform's module: skipped here
    err = _refused(monkeypatch, Symbol("vllm.v1.worker.no_such_runner", "", "module", "import", side="worker",
                                       platform=here), runner="v1")
    assert "cannot be imported" in str(err)


def test_optional_symbols_do_not_fail(monkeypatch):
    monkeypatch.setattr(surface.table, "SURFACE", (Symbol("vllm.envs", "__getattr__.no_such_cache", "attribute", "call",
                                                          optional=True),))
    surface.check_surface()


def test_instances_that_the_plugin_extends_take_attributes(monkeypatch):
    extended = [s for s in SURFACE if s.use == "extend"]
    assert {s.name for s in extended} >= {"RequestState", "ModelRunnerOutput", "CompletionOutput"}
    err = _refused(monkeypatch, Symbol("vllm.v1.engine", "EngineCoreOutput", "class", "extend"))
    assert "no __dict__" in str(err)


# -- (d) the table against a source tree ----------------------------------------------------------------
def test_installed_source_tree_matches_the_table():
    assert surface.check_surface_against_source(VLLM_SOURCE) == []


def test_source_check_finds_what_is_gone(monkeypatch):
    monkeypatch.setattr(surface.table, "SURFACE", (
        Symbol("vllm.v1.core.sched.scheduler", "Scheduler.update_from_outputs", "method", "wrap"),
        Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.discard_request_masks", "attribute", "read"),
        Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample", "method", "wrap",
               params=("logits", "metadata")),
        Symbol("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.input_batch", "attribute", "read"),
        Symbol("vllm.distributed", "get_pp_group", "function", "call"),  # through a star import
        Symbol("vllm", "LLM", "class", "call", params=("model",)),  # through vLLM's lazy attribute table
    ))
    problems = surface.check_surface_against_source(VLLM_SOURCE)
    assert len(problems) == 3, problems
    assert "update_from_outputs" in problems[0] and "discard_request_masks" in problems[1]
    assert "['metadata']" in problems[2]


@pytest.mark.parametrize("root", [r for r in OTHER_SOURCES if os.path.isdir(r)] or
                         [pytest.param(None, marks=pytest.mark.skip(reason="SWIFT_FAST_VLLM_SOURCES is not set"))])
def test_other_source_tree_matches_the_table(root):
    assert surface.check_surface_against_source(root) == []


def test_source_report_names_every_record():
    report = surface.source_report(VLLM_SOURCE)
    assert len(report) == len(SURFACE)
    assert report["vllm.v1.core.sched.scheduler.Scheduler.update_from_output [any]"] == (
        "(scheduler_output, model_runner_output)")


# -- (b) completeness ---------------------------------------------------------------------------------------
class Uses:
    """What one source file uses of vLLM (names with ``file:line``)."""

    def __init__(self):
        self.imports: dict[tuple[str, str | None], list[str]] = collections.defaultdict(list)
        self.modules: dict[str, list[str]] = collections.defaultdict(list)
        self.envs: dict[str, list[str]] = collections.defaultdict(list)
        self.attrs: dict[str, list[str]] = collections.defaultdict(list)
        #: keyword arguments of calls: (callee name, keyword, how the callee was found, where)
        self.keywords: list[tuple[str, str, str, str]] = []


def _where(filename: str, node) -> str:
    name = os.path.relpath(filename, REPO) if os.path.isabs(filename) else filename
    return f"{name}:{getattr(node, 'lineno', 0)}"


def _is_vllm_module(name: str) -> bool:
    return bool(_MODULE_STRING.match(name)) and importlib.util.find_spec(name) is not None


def _str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def collect(source: str, filename: str = "<snippet>") -> Uses:
    """Parse ``source`` and collect its vLLM imports, module strings, environment variables,
    attribute names and keyword arguments (see the module notes)."""
    tree = ast.parse(source, filename)
    uses = Uses()
    imported: dict[str, tuple[str, str]] = {}  # local name -> (vllm module, name)
    foreign = _foreign_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in foreign:
            continue  # torch.empty, np.int64, time.sleep: another package's name
        _collect_node(node, _where(filename, node), uses, imported)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            _collect_keywords(node, uses, imported, filename)
    return uses


def _foreign_names(tree: ast.Module) -> set[str]:
    """Names bound by importing something other than vLLM (``import torch``, ``from x import y``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] != "vllm")
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] != "vllm"):
            out.update(a.asname or a.name for a in node.names)
    return out


def _collect_node(node, where: str, uses: Uses, imported: dict) -> None:
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.name == "vllm" or a.name.startswith("vllm."):
                uses.imports[(a.name, None)].append(where)
    elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "vllm":
        for a in node.names:
            uses.imports[(node.module, a.name)].append(where)
            imported[a.asname or a.name] = (node.module, a.name)
    elif isinstance(node, ast.Attribute):
        uses.attrs[node.attr].append(where)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        if _ENV_STRING.match(node.value):
            uses.envs[node.value].append(where)
        elif node.value.startswith("vllm.") and _is_vllm_module(node.value):
            uses.modules[node.value].append(where)
    elif isinstance(node, ast.Tuple) and len(node.elts) == 2:
        # ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"): a class looked up by name
        mod, name = _str(node.elts[0]), _str(node.elts[1])
        if mod and name and name.isidentifier() and mod.startswith("vllm") and _is_vllm_module(mod):
            uses.imports[(mod, name)].append(where)
    elif isinstance(node, ast.Call):
        _collect_string_lookup(node, where, uses)
    elif isinstance(node, ast.Compare) and isinstance(node.comparators[0], ast.Call):
        # "name" in vars(x)
        call = node.comparators[0]
        if isinstance(call.func, ast.Name) and call.func.id == "vars" and _str(node.left):
            uses.attrs[_str(node.left)].append(where)


def _collect_string_lookup(node: ast.Call, where: str, uses: Uses) -> None:
    """``getattr(x, "name")`` and friends, ``x.__dict__.get("name")``."""
    func = node.func
    if isinstance(func, ast.Name) and func.id in ("getattr", "hasattr", "setattr", "delattr") and len(node.args) > 1:
        name = _str(node.args[1])
        if name:
            uses.attrs[name].append(where)
    elif (isinstance(func, ast.Attribute) and func.attr == "get" and isinstance(func.value, ast.Attribute)
          and func.value.attr == "__dict__" and node.args and _str(node.args[0])):
        uses.attrs[_str(node.args[0])].append(where)


def _collect_keywords(node: ast.Call, uses: Uses, imported: dict, filename: str) -> None:
    """Keywords passed to an imported vLLM callable (``SamplingParams(max_tokens=...)``,
    ``AsyncLLM.from_engine_args(...)``) anywhere, and to a method named like a tabled one in the
    plugin's own files (whose receivers are vLLM objects)."""
    kws = [k.arg for k in node.keywords if k.arg is not None]
    if not kws:
        return
    where = _where(filename, node)
    chain = []
    f = node.func
    while isinstance(f, ast.Attribute):
        chain.insert(0, f.attr)
        f = f.value
    if isinstance(f, ast.Name) and f.id in imported:
        name = ".".join([imported[f.id][1], *chain])
        uses.keywords += [(name, k, "imported", where) for k in kws]
    elif chain and (filename == "<snippet>" or os.path.abspath(filename).startswith(PLUGIN)):
        uses.keywords += [(chain[-1], k, "method", where) for k in kws]


# -- what is a vLLM name ------------------------------------------------------------------------------------
def _package_files() -> list[str]:
    out = []
    for folder, _, files in os.walk(PACKAGE):
        if "assets" in os.path.relpath(folder, PACKAGE).split(os.sep):
            continue
        out += [os.path.join(folder, f) for f in files if f.endswith(".py")]
    return sorted(out)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _touches_vllm(path: str, source: str) -> bool:
    if os.path.abspath(path).startswith(PLUGIN + os.sep):
        return True
    return bool(re.search(r"^\s*(from vllm[\s.]|import vllm\b)", source, re.M)) or 'import_module("vllm' in source


def defined_by_swift_fast() -> set[str]:
    """Names swift-fast defines: module-level functions and classes, its classes' methods, class
    attributes and fields, module-level names, ``self.<name>`` of its own classes' methods,
    ``__slots__`` entries. Not the names of functions nested in functions: those are the wrappers,
    named after the vLLM method they replace."""
    out: set[str] = set()
    for path in _package_files():
        tree = ast.parse(_read(path), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                out.add(node.name)
                out.update(fn.name for fn in node.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)))
        out.update(fn.name for fn in tree.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                out |= _class_body_names(node)
                for fn in node.body:
                    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        out |= surface.source._self_assigned(fn)
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                out.update(surface.source._target_names(node))
    return out


def _class_body_names(cls: ast.ClassDef) -> set[str]:
    out = set()
    for node in cls.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            names = surface.source._target_names(node)
            out.update(names)
            if "__slots__" in names and node.value is not None:
                out.update(_str(e) for e in getattr(node.value, "elts", []) if _str(e))
    return out


def ordinary_names() -> set[str]:
    """Attributes of tensors, arrays, modules, builtin and standard-library types, ``collections``
    and Hugging Face's tokenizer/config/model classes (vLLM mirrors those): never vLLM's own."""
    import argparse
    import asyncio
    import concurrent.futures
    import contextvars
    import logging

    import numpy as np
    import torch
    import transformers

    kinds = [torch.Tensor, torch.nn.Module, torch.device, torch.dtype, np.ndarray, np.generic, object, type, dict,
             list, tuple, set, frozenset, str, bytes, int, float, bool, complex, BaseException, SystemExit, slice,
             range, types.FunctionType, types.ModuleType, collections.OrderedDict, collections.deque,
             collections.defaultdict, collections.Counter, collections.namedtuple("T", "a"), logging.Logger,
             contextvars.ContextVar, concurrent.futures.Future, asyncio.Future, asyncio.Task,
             asyncio.AbstractEventLoop, argparse.ArgumentParser, transformers.PreTrainedTokenizerBase,
             transformers.PretrainedConfig, transformers.PreTrainedModel, transformers.GenerationConfig]
    out = set(dir(torch.nn.Module()))  # an instance: its constructor sets _buffers, _modules, ...
    for k in kinds:
        out.update(dir(k))
        init = getattr(k, "__init__", None)
        if isinstance(init, types.FunctionType):  # attributes their constructors set (nn.Module._buffers)
            out |= surface.runtime._stores_in(init.__code__)
    return out


def _vllm_classes(modules: set[str]) -> list[type]:
    out = {}
    for name in sorted(modules):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        for value in vars(mod).values():
            if isinstance(value, type) and getattr(value, "__module__", "").startswith("vllm"):
                out[id(value)] = value
    return list(out.values())


def _names_of(cls: type) -> set[str]:
    """What vLLM's own code defines on ``cls`` and its vLLM bases."""
    out: set[str] = set()
    for klass in cls.__mro__:
        if not getattr(klass, "__module__", "").startswith("vllm"):
            continue
        out.update(k for k in vars(klass) if not (k.startswith("__") and k.endswith("__")))
        ann = vars(klass).get("__annotations__")
        if isinstance(ann, dict):
            out.update(ann)
        for member in vars(klass).values():
            for code in surface.runtime._codes_of(member):
                out |= surface.runtime._stores_in(code)
    out |= set(surface.runtime._declared_fields(cls))
    return out


def vllm_names(extra_modules: set[str] = frozenset()) -> set[str]:
    """Attribute names defined by vLLM classes of the tabled modules (and ``extra_modules``)."""
    modules = {s.module for s in SURFACE} | set(extra_modules)
    out: set[str] = set()
    for cls in _vllm_classes(modules):
        out |= _names_of(cls)
    return out


def table_names() -> set[str]:
    return {part for s in SURFACE for part in s.name.split(".") if part}


def package_uses() -> list[tuple[str, Uses, bool]]:
    """``(path, uses, touches vLLM)`` of every module of the package."""
    out = []
    for path in _package_files():
        source = _read(path)
        # the surface package handles ast, dis and inspect objects; the vLLM names it uses are its table's
        touches = _touches_vllm(path, source) and not path.startswith(SURFACE_DIR + os.sep)
        out.append((path, collect(source, path), touches))
    return out


def missing_from_table(uses: list[tuple[str, Uses, bool]]) -> list[str]:
    """One line per vLLM name the sources use and the table lacks."""
    recorded = {(s.module, s.name.split(".")[0]) for s in SURFACE}
    modules = {s.module for s in SURFACE}
    envs = {s.name for s in SURFACE if s.kind == "env"}
    params: dict[str, set[str]] = collections.defaultdict(set)
    for s in SURFACE:
        params[s.name].update(s.params)
        params[s.name.split(".")[-1] + "#method"].update(s.params if s.kind in ("method", "function") else ())
    imported_modules = {m for _, u, _ in uses for (m, _n) in u.imports} | {m for _, u, _ in uses for m in u.modules}
    known = vllm_names(imported_modules) - ordinary_names() - defined_by_swift_fast()
    names = table_names()
    problems = []
    for _path, u, touches in uses:
        for (mod, name), where in u.imports.items():
            ok = mod in modules if name is None else ((mod, name) in recorded or f"{mod}.{name}" in modules)
            if not ok:
                problems.append(f"import {mod}{'' if name is None else ' ' + name} ({where[0]})")
        problems += [f"module string {m} ({w[0]})" for m, w in u.modules.items() if m not in modules]
        problems += [f"environment variable {e} ({w[0]})" for e, w in u.envs.items() if e not in envs]
        if touches:
            problems += [f"attribute {a} ({w[0]})" for a, w in u.attrs.items() if a in known and a not in names]
            problems += _keyword_problems(u, params)
    return sorted(set(problems))


def _keyword_problems(u: Uses, params: dict[str, set[str]]) -> list[str]:
    out = []
    for callee, kw, how, where in u.keywords:
        key = callee if how == "imported" else callee + "#method"
        if key not in params:
            continue  # not a tabled callable (an import the table lacks is reported as such)
        if kw not in params[key]:
            out.append(f"keyword {kw}= of {callee} ({where})")
    return out


@pytest.fixture(scope="module")
def uses():
    return package_uses()


def test_the_table_lists_every_vllm_name_the_package_uses(uses):
    missing = missing_from_table(uses)
    assert not missing, (
        "vLLM names used in swift_fast that swift_fast/vllm_plugin/surface/table.py does not list (add a record):\n  "
        + "\n  ".join(missing)
    )


def test_the_walk_sees_the_plugin_and_its_callers(uses):
    touching = {os.path.relpath(p, PACKAGE) for p, _, t in uses if t}
    for f in ("vllm_plugin/runner_v1.py", "vllm_plugin/frontend.py", "jobs/engine.py", "demo/backend.py",
              "jobs/data_parallel.py", "cli/serve.py"):
        assert f in touching
    by_file = {os.path.relpath(p, PACKAGE): u for p, u, _ in uses}
    assert "_sample" in by_file["vllm_plugin/runner_v1.py"].attrs
    assert "ec_transfer_params" in by_file["vllm_plugin/transport.py"].attrs
    assert ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner") in by_file["vllm_plugin/__init__.py"].imports
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" in by_file["demo/backend.py"].envs


def _report(snippet: str) -> list[str]:
    return missing_from_table([("<snippet>", collect(snippet), True)])


def _new_vllm_attribute() -> str:
    """A real instance attribute of the V1 runner that the table does not list."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    unused = sorted(surface.runtime._self_stores(GPUModelRunner, "__init__") - table_names() - ordinary_names()
                    - defined_by_swift_fast())
    assert "uses_mrope" in unused
    return "uses_mrope"


def test_a_new_vllm_attribute_use_is_reported():
    attr = _new_vllm_attribute()
    assert _report(f"def f(runner):\n    return runner.{attr}\n") == [f"attribute {attr} (<snippet>:2)"]
    assert _report(f"def f(runner):\n    return getattr(runner, '{attr}', None)\n") == [
        f"attribute {attr} (<snippet>:2)"]
    # what the table lists, and tensors' and numpy's own attributes, are not
    assert _report("def f(runner, x):\n    return runner.input_batch.req_ids, x.shape, x.device, x.dtype\n") == []


def test_new_imports_keywords_modules_and_variables_are_reported():
    snippet = (
        "import os\n"
        "from vllm.v1.core.sched.output import CachedRequestData\n"
        "from vllm import SamplingParams\n"
        "SamplingParams(n=2, min_tokens=3)\n"
        "os.environ['VLLM_ATTENTION_BACKEND'] = 'x'\n"
        "M = 'vllm.v1.worker.block_table'\n"
        "def f(ip):\n"
        "    return ip.process_inputs('r', {}, None, supported_tasks=(), tokenization_kwargs={})\n"
    )
    assert _report(snippet) == [
        "environment variable VLLM_ATTENTION_BACKEND (<snippet>:5)",
        "import vllm.v1.core.sched.output CachedRequestData (<snippet>:2)",
        "keyword min_tokens= of SamplingParams (<snippet>:4)",
        "keyword tokenization_kwargs= of process_inputs (<snippet>:8)",
        "module string vllm.v1.worker.block_table (<snippet>:6)",
    ]


def _surface_code_without_table() -> str:
    source = _read(surface.table.__file__)
    tree = ast.parse(source)
    return "\n".join(ast.get_source_segment(source, n) or "" for n in tree.body
                     if not (isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "SURFACE"))


def test_every_record_is_used():
    """The table keeps no symbol nobody uses: each record's last name occurs in the package (as an
    attribute, import, string or keyword; the surface package's own code counts, its table does not), except
    classes whose instances the plugin receives and extends or subclasses without naming them."""
    table_file = surface.table.__file__
    sources = "\n".join(_read(p) for p in _package_files() if p != table_file) + _surface_code_without_table()
    unused = [s.qualname for s in SURFACE if s.kind not in ("module", "env") and s.use not in ("extend", "subclass")
              and not re.search(r"\b%s\b" % re.escape(s.name.split(".")[-1]), sources)]
    assert not unused, f"records whose name swift_fast never uses: {unused}"


def test_error_type_is_a_runtime_error():
    assert issubclass(VllmSurfaceError, RuntimeError)
    assert inspect.signature(surface.check_surface).parameters["runner"].default is None
