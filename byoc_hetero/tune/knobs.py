"""Where the levels find a backend's knobs (:class:`~byoc_hetero.rules.Knob`): through the backend
object, by level name — the tuner names no backend.

A backend lets a level decide for its regions by declaring a knob of that level
(``bh.register_target(..., knobs={"algorithm": Knob(...)})``); the level's choices are the
backend's :class:`~byoc_hetero.rules.Variant` s of that level (``Backend.choices``), and its
decisions go back as the knob's option (``{backend: {option: JSON}}``, as ``bh.partition``'s
``options``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import RuleError
from ..targets import Knob, get_target


def knob_of(backend: str, level: str) -> Knob | None:
    """The knob of level ``level`` that backend ``backend`` declares, else None."""
    try:
        return get_target(backend).knobs.get(level)
    except RuleError:  # a region of a backend no longer registered has no knobs
        return None


def backends_with(level: str, names: Iterable[str]) -> list[str]:
    """The backends of ``names`` (canonical names) that declare a knob of ``level``, in order."""
    return [get_target(n).name for n in names if knob_of(n, level) is not None]


def with_option(options: Mapping[str, Mapping[str, Any]], backend: str, level: str,
                table: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``options`` (``{backend: {option: value}}``) with ``backend``'s knob ``level`` set to
    ``table`` (as canonical JSON), a copy."""
    out = {k: dict(v) for k, v in options.items()}
    out.setdefault(backend, {})[get_target(backend).knobs[level].option] = json.dumps(dict(table), sort_keys=True)
    return out


def option_value(options: Mapping[str, Mapping[str, Any]], level: str) -> dict[str, Any]:
    """Every decision of knob ``level`` that ``options`` carries, over all its backends (merged)."""
    found: dict[str, Any] = {}
    for backend, opts in options.items():
        knob = knob_of(backend, level)
        if knob is not None and opts.get(knob.option):
            found.update(json.loads(str(opts[knob.option])))
    return found


def merge_options(*parts: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Backend options (``{backend: {option: value}}``) merged, later parts winning."""
    out: dict[str, dict[str, Any]] = {}
    for part in parts:
        for backend, opts in part.items():
            out.setdefault(backend, {}).update(opts)
    return out


__all__ = ["backends_with", "knob_of", "merge_options", "option_value", "with_option"]
