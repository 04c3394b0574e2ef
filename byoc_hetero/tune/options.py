"""The option level: each option a backend declares tunable (:class:`~byoc_hetero.rules.Tunable`
on its :class:`~byoc_hetero.rules.Option`), chosen per region from timings (``bh.tune``).

A backend option is a value for all its regions (``bh.partition(..., options={backend: {...}})``).
One the backend declares tunable states the values a tuner may try, and whether a value other than
the default changes the numbers it computes, within what relative error (the tvm_cpu backend's
polynomial exp, for instance); the backend then also takes the option per region, as
``{region key: value}``, and applies it region by region (``Backend.region_option``).

The level's four steps (:class:`.levels.OptionLevel`):

1. units: each region the codegen level runs on a backend with tunable options (repeated blocks
   share a key), once per such option;
2. choices: the option's declared values, the default first; a value that changes numerics is
   left out, with the reason in the report, where ``bh.tune`` has no ``tolerance`` or one below
   the error the backend states for it;
3. measure: the region built alone once per value (the backend's codegen, the option given for the
   whole one-region module) and timed alternately on random inputs of its shapes, through the
   timing cache (:func:`measure_option`); for a value that changes numerics, the region's outputs
   are compared with the default's on the same inputs (``max |y - y_default| / max |y_default|``,
   cached beside the timings), and the value is kept only within ``bh.tune``'s tolerance. The
   fastest value left wins where it beats the default by more than the timings' spread;
4. apply: the per-region table of the values that differ from the default, as the option itself.

Where a backend declares several tunable options, a region's unit is their combination: every
combination of the values each option may take (:func:`unit_choices`) is measured as one choice,
since options interact (a faster exp may pay off only with another unroll); a backend whose
combinations exceed :data:`MAX_COMBINATIONS` has each option decided with the others at their
defaults. The tuned module as a whole is still kept only where it is measured faster than the
default end to end. Nothing here names a
backend or an option: what is tuned is what the backends of ``targets`` declare.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

from ..passes.cost_gate import HOST
from ..stages import retarget_region
from ..targets import Option, get_target
from .cache import Timing, TimingCache, signature
from .codegen import RegionCandidate, harness_module, ms_text, random_inputs, runner, time_all, timing_key, winner

LEVEL = "options"

#: the most value combinations of one backend's tunable options measured together per region;
#: beyond it, each option is decided alone (the others at their defaults)
MAX_COMBINATIONS = 16


@dataclass(frozen=True)
class OptionUnit:
    """One region run by ``backend`` and its tunable options ``options``, decided together: a
    value of the unit is the option's value where it has one option, else a tuple of values in
    ``options`` order."""

    region: RegionCandidate  # as the backend runs it (``func`` is that backend's region)
    backend: str
    options: tuple[str, ...]

    @property
    def option(self) -> str:
        """The option (options, joined by `` + ``) the unit decides."""
        return " + ".join(self.options)

    def settings(self, value: Any) -> dict[str, Any]:
        """Option name -> value, for a value of this unit."""
        return dict(zip(self.options, value if len(self.options) > 1 else (value,)))

    def __str__(self) -> str:
        return f"{self.region} on {self.backend}, option{'s' if len(self.options) > 1 else ''} {self.option}"


def value_text(value: Any) -> str:
    """An option value as the report and the tables name it (JSON: ``true``, ``2``, ``"x"``)."""
    return json.dumps(value, sort_keys=True, default=str)


@dataclass
class OptionDecision:
    """What was measured for one region's option, and the value chosen."""

    unit: OptionUnit
    default: Any = None
    chosen: Any = None
    timings: dict[str, Timing] = field(default_factory=dict)  # value text -> the region's time with it
    errors: dict[str, float] = field(default_factory=dict)  # value text -> relative error against the default
    refused: dict[str, str] = field(default_factory=dict)  # value text -> why it is not a choice
    cached: bool = False

    @property
    def changed(self) -> bool:
        return value_text(self.chosen) != value_text(self.default)

    def changes(self) -> dict[str, Any]:
        """Option name -> the value chosen, for each option of the unit set otherwise than its default."""
        default = self.unit.settings(self.default)
        return {o: v for o, v in self.unit.settings(self.chosen).items() if value_text(v) != value_text(default[o])}

    def why(self) -> str:
        """The decision, each value's time (and error), and why a value was left out."""
        parts = ", ".join(f"{v} {ms_text(t)}" + (f" (error {self.errors[v]:.2g})" if v in self.errors else "")
                          for v, t in self.timings.items())
        refused = "".join(f"; {v} not tried: {why}" for v, why in self.refused.items())
        measured = parts or "nothing to time"
        return f"{value_text(self.chosen)}: {measured}{refused}{' [cached]' if self.cached else ''}"


def option_units(decisions: Sequence[Any]) -> list[OptionUnit]:
    """The units of the codegen level's ``decisions`` (:class:`.codegen.CodegenDecision`): each
    region placed on a backend with tunable options, as that backend runs it, once per option."""
    units = []
    for d in decisions:
        if d.chosen == HOST or d.region.untimeable:
            continue
        backend = get_target(d.chosen)
        tunable = backend.tunable_options()
        if not tunable:
            continue
        region = d.region
        if backend.name != region.target:  # the codegen level handed it to another backend
            func = retarget_region(region.func, backend.name)
            if isinstance(func, str):
                continue
            region = RegionCandidate(region.key, backend.name, region.ops, region.gate, region.count, func)
        names = tuple(tunable)
        together = len(names) > 1 and combinations(backend.options, names) <= MAX_COMBINATIONS
        units.extend(OptionUnit(region, backend.name, group) for group in ([names] if together else
                                                                           [(n,) for n in names]))
    return units


def combinations(options: Mapping[str, Option], names: Sequence[str]) -> int:
    """How many value combinations the tunable options ``names`` declare (each default included)."""
    return math.prod(len(dict.fromkeys((options[n].default, *options[n].tune.values))) for n in names)


def unit_choices(unit: OptionUnit, tolerance: float | None) -> tuple[tuple[Any, ...], dict[str, str]]:
    """The values ``unit`` tries (all defaults first) and why each other declared value is left out
    (:func:`option_choices` per option; for several options every combination of the values each
    may take, a left-out value named ``option=value``)."""
    declared = get_target(unit.backend).options
    per = [option_choices(declared[name], tolerance) for name in unit.options]
    if len(per) == 1:
        return per[0]
    refused = {f"{name}={text}": why for name, (_, out) in zip(unit.options, per) for text, why in out.items()}
    return tuple(itertools.product(*(values for values, _ in per))), refused


def option_choices(option: Option, tolerance: float | None) -> tuple[tuple[Any, ...], dict[str, str]]:
    """The values of ``option`` a tune with ``tolerance`` tries (its default first), and why each
    other declared value is left out."""
    values = tuple(dict.fromkeys((option.default, *option.tune.values), None))
    stated = option.tune.tolerance
    if stated is None:
        return values, {}
    if tolerance is None:
        why = f"changes numerics (relative error up to {stated:g} stated by the backend): give bh.tune a tolerance"
    elif stated > tolerance:
        why = f"changes numerics by up to {stated:g} (stated by the backend), above the tolerance {tolerance:g}"
    else:
        return values, {}
    return values[:1], {value_text(v): why for v in values[1:]}


def _arrays(value: Any) -> list[np.ndarray]:
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    return [a for v in value for a in _arrays(v)]


def relative_error(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    """``max |got - want| / max |want|`` over every output (equal infinities and NaNs count as equal;
    any other NaN or infinity is an infinite error)."""
    diff, scale = 0.0, 0.0
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        same = (g == w) | (np.isnan(g) & np.isnan(w))
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: NaN, counted as an infinite error
            d = np.where(same, 0.0, np.abs(g - w))
        if d.size and not np.all(np.isfinite(d)):
            return math.inf
        diff = max(diff, float(d.max(initial=0.0)))
        finite = np.abs(w[np.isfinite(w)])
        scale = max(scale, float(finite.max(initial=0.0)))
    return diff / scale if scale > 0 else diff


def _with_value(options: Mapping[str, Mapping[str, Any]], unit: OptionUnit, value: Any) -> dict[str, dict[str, Any]]:
    """``options`` with ``unit``'s option set to ``value`` for its backend (the whole one-region
    module), checked by the backend; a copy."""
    out = {k: dict(v) for k, v in options.items()}
    out.setdefault(unit.backend, {}).update(get_target(unit.backend).check_options(unit.settings(value)))
    return out


def _changes_numerics(unit: OptionUnit, value: Any) -> bool:
    """Whether ``value`` sets an option that changes numerics otherwise than its default."""
    declared = get_target(unit.backend).options
    return any(declared[o].tune.changes_numerics and value_text(v) != value_text(declared[o].default)
               for o, v in unit.settings(value).items())


def _error_key(timing_keys: Mapping[str, str], value: str, default: str) -> str:
    return signature("option_error", attrs={"value": timing_keys[value], "default": timing_keys[default]})


def measure_option(unit: OptionUnit, cache: TimingCache, options: Mapping[str, Mapping[str, Any]],
                   values: Sequence[Any], tolerance: float | None = None, repeat: int = 15,
                   budget_s: float = 1.0, refused: Mapping[str, str] | None = None) -> OptionDecision:
    """Time ``unit``'s region with each of ``values`` (its option's default first) through
    ``cache``; where the option changes numerics, each other value's outputs against the
    default's (kept only within ``tolerance``); the fastest value left, the default on a tie.
    ``refused``: the values left out before (:func:`option_choices`) and why, for the report."""
    texts = {value_text(v): v for v in values}
    default = value_text(values[0])
    d = OptionDecision(unit, default=values[0], chosen=values[0], refused=dict(refused or {}))
    if len(texts) < 2:
        return d
    given = {t: _with_value(options, unit, v) for t, v in texts.items()}
    keys = {t: timing_key(unit.region, unit.backend, opts) for t, opts in given.items()}
    checked = [t for t, v in texts.items() if t != default and _changes_numerics(unit, v)]
    found = {t: cache.get(k) for t, k in keys.items()}
    errors = {t: cache.get_error(_error_key(keys, t, default)) for t in checked}
    if all(found.values()) and all(e is not None for e in errors.values()):
        d.timings, d.errors, d.cached = dict(found), dict(errors), True
    else:
        args, harness = random_inputs(unit.region.func), harness_module(unit.region.func, True)
        runners = {t: runner(harness, args, opts) for t, opts in given.items()}
        want = _arrays(runners[default]())
        d.errors = {t: relative_error(_arrays(runners[t]()), want) for t in checked}
        d.timings, _ = time_all(runners, repeat, budget_s)
        for t, k in keys.items():
            cache.put(k, d.timings[t])
        for t, e in d.errors.items():
            cache.put_error(_error_key(keys, t, default), e)
    limit = tolerance if tolerance is not None else 0.0
    for t, e in d.errors.items():
        if not e <= limit:  # NaN too
            d.refused[t] = f"measured error {e:.2g} against the default, above the tolerance {limit:g}"
    allowed = {t: timing for t, timing in d.timings.items() if t not in d.refused}
    d.chosen = texts[winner(allowed, default)]
    return d


def options_of(decisions: Sequence[OptionDecision]) -> dict[str, dict[str, str]]:
    """The backend options that apply ``decisions``: per backend and option, the per-region table
    (JSON ``{region key: value}``) of the regions whose value differs from the default."""
    tables: dict[tuple[str, str], dict[str, Any]] = {}
    for d in decisions:
        for option, value in d.changes().items():
            tables.setdefault((d.unit.backend, option), {})[d.unit.region.key] = value
    out: dict[str, dict[str, str]] = {}
    for (backend, option), table in tables.items():
        out.setdefault(backend, {})[option] = json.dumps(table, sort_keys=True)
    return out


def report_lines(decisions: Sequence[OptionDecision]) -> list[str]:
    """The report's lines for this level (indented for :class:`.tuner.TuneReport`)."""
    if not decisions:
        return []
    lines = [f"  {d.unit}: {d.why()}" for d in decisions]
    changed = sum(d.changed for d in decisions)
    lines.append(f"  options: {len(decisions)} region options, {changed} set otherwise than the backend's default")
    return lines


__all__ = ["LEVEL", "MAX_COMBINATIONS", "OptionDecision", "OptionUnit", "combinations", "measure_option",
           "option_choices", "option_units", "options_of", "relative_error", "report_lines", "unit_choices",
           "value_text"]
