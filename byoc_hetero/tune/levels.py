"""The tuning protocol: each level of ``bh.tune`` is an object with the same four steps.

1. ``units(ctx)``: what the level decides over, read from the partitioned module (the codegen
   level: candidate regions; threads: the regions of backends with a threads knob; options: the
   regions of backends with tunable options, once per option; algorithm: the units of the
   backends' algorithm knobs, e.g. a backend's convolution sites);
2. ``choices(ctx, unit)``: the alternatives for one unit, read from the backend (its
   :class:`~byoc_hetero.rules.Variant` s of the level, ``Backend.choices``; the codegen level: the
   region's backend, llvm and the other backends of ``targets``; threads: the process's count or one;
   options: the values the backend declares for the option, :class:`~byoc_hetero.rules.Tunable`);
3. ``measure(ctx, unit, choices)``: each choice timed through the shared
   :class:`.cache.TimingCache` (a repeated unit is timed once, a warm tune builds nothing) and the
   unit's decision taken;
4. ``apply(ctx, decisions)``: the decisions as backend options (``{backend: {option: value}}``,
   the option the backend's :class:`~byoc_hetero.rules.Knob` names), merged into
   :attr:`TuneContext.options` for the levels after it and the tuned partition.

:meth:`Level.run` is the loop over units with the progress line; a level whose decisions are a
search rather than one per unit (codegen's rounds, the precision level's mix within an error
tolerance) overrides :meth:`Level.decide`. The tuner (:mod:`.tuner`) is the loop over levels, then
the never-slower guard and the report. No level names a backend: what a backend lets be tuned is
what its knobs and variants say.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

from .algorithms import LEVEL as ALGORITHM
from .algorithms import conv_sites, decide_unit, decisions_options
from .cache import TimingCache
from .codegen import tune_codegen
from .knobs import knob_of, merge_options
from .options import LEVEL as OPTIONS
from .options import measure_option, option_units, options_of, unit_choices
from .threads import LEVEL as THREADS
from .threads import measure_threads, threads_options


@dataclass
class TuneContext:
    """What the levels of one tune share: the model, the targets, the cache, the decisions so far."""

    mod: tvm.IRModule
    params: Mapping[str, np.ndarray] | None
    targets: Any
    precision: str
    cache: TimingCache
    repeat: int = 15
    progress: Callable[[str, int, int, str], None] | None = None
    default: tvm.IRModule | None = None  # the default partition
    region_codegen: dict[str, str] | None = None  # the codegen level's map, where it changed anything
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # backend options the levels applied
    codegen: Any = None  # the codegen level's plan (its regions are the threads level's units)
    notes: list[str] = field(default_factory=list)  # what the levels say for the report

    @property
    def names(self) -> list[str]:
        """The backends of ``targets`` (canonical names)."""
        from ..stages import target_names

        return target_names(self.targets)

    @functools.cached_property
    def base(self) -> tvm.IRModule:
        """The partition the codegen level's map gives (the default one where it changed nothing)."""
        from ..stages import partition

        if not self.region_codegen:
            return self.default
        return partition(self.mod, self.params, target=self.targets, precision=self.precision,
                         region_codegen=self.region_codegen)

    def say(self, level: str, done: int, total: int, what: str) -> None:
        if self.progress is not None:
            self.progress(level, done, total, what)


class Level:
    """One level of the tuner: :meth:`units`, :meth:`choices`, :meth:`measure`, :meth:`apply`."""

    name = ""
    #: the :class:`.tuner.TuneReport` field that holds :meth:`result`
    report_field = ""
    #: a level that ends the tune with a plan it measured end to end itself (:attr:`kept`)
    final = False
    kept: Any = None

    def units(self, ctx: TuneContext) -> list[Any]:
        raise NotImplementedError

    def choices(self, ctx: TuneContext, unit: Any) -> tuple[Any, ...]:
        raise NotImplementedError

    def measure(self, ctx: TuneContext, unit: Any, choices: tuple[Any, ...]) -> Any:
        raise NotImplementedError

    def apply(self, ctx: TuneContext, decisions: list[Any]) -> dict[str, dict[str, Any]]:
        return {}

    def result(self, ctx: TuneContext, decisions: list[Any]) -> Any:
        """What the report keeps of this level: its decisions."""
        return decisions

    def label(self, unit: Any, choices: tuple[Any, ...]) -> str:
        """The progress line's words for ``unit``."""
        return str(unit)

    def decide(self, ctx: TuneContext) -> list[Any]:
        """Each unit measured over its choices, in order, with the progress line."""
        units, out = self.units(ctx), []
        for i, unit in enumerate(units):
            choices = self.choices(ctx, unit)
            ctx.say(self.name, i, len(units), self.label(unit, choices))
            out.append(self.measure(ctx, unit, choices))
        return out

    def run(self, ctx: TuneContext) -> list[Any]:
        """:meth:`decide`, then :meth:`apply` into ``ctx.options``; returns the decisions."""
        decisions = self.decide(ctx)
        ctx.options = merge_options(ctx.options, self.apply(ctx, decisions))
        ctx.cache.save()
        return decisions


class CodegenLevel(Level):
    """Each candidate region offloaded, on llvm or on another backend of ``targets``
    (:mod:`.codegen`); applied as ``bh.partition``'s ``region_codegen`` rather than as an option."""

    name = report_field = "codegen"

    def result(self, ctx: TuneContext, decisions: list[Any]) -> Any:
        return ctx.codegen

    def decide(self, ctx: TuneContext) -> list[Any]:  # rounds: a region sent to llvm may form new ones
        ctx.codegen = tune_codegen(ctx.mod, ctx.params, ctx.cache, targets=ctx.targets, precision=ctx.precision,
                                   repeat=ctx.repeat, progress=ctx.progress)
        ctx.region_codegen = ctx.codegen.region_codegen if ctx.codegen.changed else None
        return ctx.codegen.decisions


class ThreadsLevel(Level):
    """Each region of a backend with a threads knob on the process's thread count or one
    (:mod:`.threads`); applied as the knob's option."""

    name = report_field = THREADS

    def units(self, ctx: TuneContext) -> list[Any]:
        from .._native import _C

        if int(_C.num_threads()) <= 1:
            ctx.notes.append("threads: the process runs regions on 1 thread: nothing to choose")
            return []
        return [d.region for d in ctx.codegen.decisions if d.chosen == d.region.target
                and knob_of(d.region.target, THREADS) is not None and not d.region.untimeable]

    def choices(self, ctx: TuneContext, unit: Any) -> tuple[int, int]:
        from .._native import _C

        return int(_C.num_threads()), 1

    def measure(self, ctx: TuneContext, unit: Any, choices: tuple[Any, ...]) -> Any:
        from ..stages import codegen_options

        return measure_threads(unit, ctx.cache, codegen_options(ctx.names, ctx.precision, None), choices, ctx.repeat)

    def label(self, unit: Any, choices: tuple[Any, ...]) -> str:
        return f"{unit}: {choices[0]} threads or {choices[1]}"

    def apply(self, ctx: TuneContext, decisions: list[Any]) -> dict[str, dict[str, Any]]:
        return threads_options(decisions)


class OptionLevel(Level):
    """Each option the backends declare tunable, per region they run (:mod:`.options`): its
    declared values, those that change numerics only within ``tolerance`` (stated by the backend,
    then measured against the default); applied as the option's per-region table."""

    name = report_field = OPTIONS

    def __init__(self, tolerance: float | None = None):
        self.tolerance = tolerance

    def units(self, ctx: TuneContext) -> list[Any]:
        return option_units(ctx.codegen.decisions)

    def _choices(self, unit: Any) -> tuple[tuple[Any, ...], dict[str, str]]:
        return unit_choices(unit, self.tolerance)

    def choices(self, ctx: TuneContext, unit: Any) -> tuple[Any, ...]:
        return self._choices(unit)[0]

    def measure(self, ctx: TuneContext, unit: Any, choices: tuple[Any, ...]) -> Any:
        from ..stages import codegen_options

        return measure_option(unit, ctx.cache, codegen_options(ctx.names, ctx.precision, None), choices,
                              self.tolerance, ctx.repeat, refused=self._choices(unit)[1])

    def label(self, unit: Any, choices: tuple[Any, ...]) -> str:
        return f"{unit}: {len(choices)} values"

    def apply(self, ctx: TuneContext, decisions: list[Any]) -> dict[str, dict[str, Any]]:
        return options_of(decisions)


class AlgorithmLevel(Level):
    """Each unit of the backends' algorithm knobs on its fastest variant (:mod:`.algorithms`);
    applied as the knob's option (an empty table for a backend where nothing changed)."""

    name = ALGORITHM
    report_field = "algorithms"

    def units(self, ctx: TuneContext) -> list[Any]:
        return conv_sites(ctx.base)

    def choices(self, ctx: TuneContext, unit: Any) -> tuple[str, ...]:
        from ..targets import get_target

        backend = get_target(unit.backend)
        return backend.choices(ALGORITHM, backend.knobs[ALGORITHM].op)

    def measure(self, ctx: TuneContext, unit: Any, choices: tuple[Any, ...]) -> Any:
        return decide_unit(unit, ctx.cache, ctx.repeat, choices)

    def apply(self, ctx: TuneContext, decisions: list[Any]) -> dict[str, dict[str, Any]]:
        return decisions_options(decisions, ctx.names)


class PrecisionLevel(Level):
    """The precision of each conv2d / dense / matmul (or layer group) of the regions with a
    precision knob: the fastest mix within ``tolerance``.

    1. ``units``: the partition's float conv2d / dense / matmul nodes (:func:`.plans.precision_nodes`,
       keyed by the backend's knob);
    2. ``choices``: f32 and the backend's variants of level ``precision`` for the node's op that
       run as asked here (:func:`.plans.precision_choices`: a variant the knob's ``native`` says
       runs as another precision on this machine is left out, with the backend's reason in the
       report); a choice made by quantizing (int8) applies to a node that is a layer of the
       calibrated quantizer (its scales come from the calibration inputs);
    3. ``measure``: each unit timed per choice through the timing cache, its errors measured, and
       the mix searched within the tolerance: one search (:mod:`.precision`) over the plan space
       the choices need (the float node table, or with int8 the quantized one of :mod:`.int8`);
    4. ``apply``: a float choice through the knob's option
       (:func:`.plans.partition_with_node_precisions`), int8 by the Q/DQ steps around the chosen layers.

    It ends the tune: :attr:`kept` is the plan it measured fastest end to end (None: nothing to
    choose), never slower than the default, which wins ties."""

    name = report_field = "precision"
    final = True

    def __init__(self, asked: tuple[str, ...], tolerance: float | None, calibration: Any, holdout: Any,
                 budget_s: float | None, rounds: int):
        self.asked, self.tolerance, self.calibration, self.holdout = asked, tolerance, calibration, holdout
        self.budget_s, self.rounds = budget_s, rounds
        self.report: Any = None

    def units(self, ctx: TuneContext) -> list[Any]:
        from .plans import precision_nodes

        return precision_nodes(ctx.base)

    def choices(self, ctx: TuneContext, unit: Any) -> tuple[str, ...]:
        from .plans import precision_choices

        return precision_choices(unit, self.asked)[0]

    def result(self, ctx: TuneContext, decisions: list[Any]) -> Any:
        return self.report

    def skipped(self, ctx: TuneContext) -> dict[str, str] | None:
        """Each precision asked that no unit may take, and why (the backend's words; None where
        there is no unit: the level then says so itself)."""
        from .plans import precision_choices

        offered: set[str] = set()
        why: dict[str, str] = {}
        units = self.units(ctx)
        for unit in units:
            got, reasons = precision_choices(unit, self.asked)
            offered.update(got)
            for p, reason in reasons.items():
                why.setdefault(p, reason)
        return {p: why.get(p, "") for p in self.asked if p not in offered} if units else None

    def decide(self, ctx: TuneContext) -> list[Any]:
        from .precision import choose_precisions

        self.kept, self.report = choose_precisions(
            ctx.mod, ctx.params, ctx.default, precisions=self.asked, tolerance=self.tolerance,
            calibration=self.calibration, holdout=self.holdout, targets=ctx.targets, options=ctx.options,
            budget_s=self.budget_s, cache=ctx.cache, rounds=self.rounds, repeat=ctx.repeat, progress=ctx.progress,
            region_codegen=ctx.region_codegen, base=ctx.base, skipped=self.skipped(ctx))
        return self.report.units


__all__ = ["AlgorithmLevel", "CodegenLevel", "Level", "OptionLevel", "PrecisionLevel", "ThreadsLevel", "TuneContext"]
