"""Reading a settings object of the selection policies (:class:`~.pruning.PruneConfig`,
:class:`~.deepconf.DeepConfConfig`) from what a user wrote: one rule for both, so ``true``, ``false``,
a partial object over a base, unknown keys and flat-key strings mean the same for each."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, TypeVar

T = TypeVar("T")


def parse_settings(cls: Callable[..., T], given: Any, where: str, base: T | None, fields: Sequence[str],
                   coerce: Callable[[str, Any, str], Any], error: type[ValueError], example: str) -> T | None:
    """A ``cls`` (a frozen dataclass with ``to_dict``) from ``given``: a mapping of some of
    ``fields`` (the rest from ``base``, else the defaults), ``True`` (``base`` or the defaults), or
    ``False``/``None`` (off: None). ``coerce(key, value, where)`` reads one value (flat request keys
    arrive as strings); ``where`` names the setting in every error (``error``), ``example`` shows a
    valid object."""
    if given is None or given is False:
        return None
    start = base or cls()
    if given is True:
        return start
    if not isinstance(given, Mapping):
        raise error(f"{where} must be an object such as {example}, true or false; got {given!r}")
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise error(f"{where} has unknown setting(s) {unknown}; the settings are {list(fields)}")
    values = start.to_dict()
    for k, v in given.items():
        values[k] = coerce(k, v, where)
    try:
        return cls(**values)
    except error as e:
        raise error(f"{where}: {e}") from None


def settings_text(text: str | None, where: str, error: type[ValueError], example: str) -> dict:
    """What a command line's settings say: JSON (``'{"keep": 0.5}'``) or ``key=value`` pairs separated
    by commas (``example``); empty: nothing (the defaults). Values stay text: the settings' own
    parser reads them."""
    import json

    text = (text or "").strip() or "{}"
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise error(f"{where} {text!r}: not valid JSON ({e})") from None
    given = {}
    for pair in text.split(","):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise error(f"{where} {text!r}: expected key=value pairs, e.g. {where} {example}")
        given[key.strip()] = value.strip()
    return given
