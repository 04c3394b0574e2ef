"""``bh.tune``: a partitioned module whose decisions come from measurements on this machine.

What it decides today (the levels of issue 26 that exist so far):

- **codegen**: each candidate region offloaded, left to llvm, or run by another backend of
  ``targets`` (a user's, from ``bh.register_target``), by timing it every way with its boundary
  (:mod:`.codegen`) instead of the cost gate's fixed rule;
- **algorithm**: each float32 convolution of a backend with an algorithm knob runs direct or Winograd by its own
  timing (:mod:`.algorithms`) instead of the fixed thresholds.
- **precision** (``precisions=("f32", "bf16")`` with a ``tolerance`` and ``calibration`` inputs):
  each conv2d / dense / matmul (or layer group) runs f32 or bf16, the fastest mix within the
  tolerance, checked on held-out inputs (:mod:`.precision`), on the partition the codegen level
  chose; with ``"int8"`` too, one more choice of the same search: layer groups may also be
  quantized (:mod:`.int8`);
- **device** (``devices=("cpu", "cuda")``): each call of the tuned module on the device where its
  time plus the copies it implies is least (:mod:`.devices`), measured where the GPU exists, from
  ``device_costs`` otherwise, skipped with a note on a CPU-only machine without them.

Every decision is checked end to end: the tuned module and the default ``bh.partition`` module are
built and timed side by side (alternating, :func:`.measure.time_call` each) on inputs of the
model's shapes, and the tuned one is returned only where it is measured faster — never slower than
the default. :class:`TuneReport` lists each decision with the alternatives' times and the end-to-end
figures.

- **threads** (``threads=True``): each region of a backend with a threads knob (this
  project's runtime) on the process's thread count or one, by timing it both ways (:mod:`.threads`).
- **options**: each option a backend declares tunable (``Option(..., tune=Tunable(...))``), per
  region, among its declared values (:mod:`.options`); a value the backend says changes numerics
  is tried only with a ``tolerance`` at least the error it states, and kept only where the region's
  outputs measured against the default's stay within it.

Each level is a :class:`.levels.Level` (units, choices read from the backend, measure through the
timing cache, apply as backend options); this module is the loop over them, the guard and the
report. The report's timing-cache counts are read once, when the CPU levels end.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .._relax import shape_of, static_shape
from ..errors import InputError
from .algorithms import AlgorithmDecision
from .cache import Timing, TimingCache, active
from .codegen import CodegenPlan
from .devices import DeviceReport, Measurer, check_devices, tune_devices
from .measure import random_input, time_call
from .plans import PrecisionReport
from .levels import AlgorithmLevel, CodegenLevel, Level, OptionLevel, PrecisionLevel, ThreadsLevel, TuneContext
from .options import OptionDecision, report_lines
from .precision import check_precisions
from .progress import ProgressBar
from .reuse import plan_digest, reused_guard
from .threads import ThreadsDecision


@dataclass
class TuneReport:
    """What :func:`tune` measured and decided."""

    algorithms: list[AlgorithmDecision] = field(default_factory=list)
    codegen: CodegenPlan = field(default_factory=CodegenPlan)  # offloaded or llvm, per region
    default: Timing | None = None  # the default partition, end to end
    tuned: Timing | None = None  # the tuned candidate, end to end (None: no decision changed)
    kept: str = "default"  # "tuned" or "default": which module was returned
    cache_hits: int = 0
    cache_misses: int = 0
    notes: list[str] = field(default_factory=list)
    precision: PrecisionReport | None = None  # the precision level, when several precisions were asked
    devices: DeviceReport | None = None  # the device level, when devices name a GPU
    threads: list[ThreadsDecision] = field(default_factory=list)  # the threads level, with threads=True
    options: list[OptionDecision] = field(default_factory=list)  # the option level: tunable backend options

    def __str__(self) -> str:
        lines = ["tuning report", *self.codegen.lines(), *report_lines(self.options)]
        for d in self.algorithms:
            if d.timings or d.kept_because:
                lines.append(f"  {d.site}: {d.why()}{' [cached]' if d.cached else ''}")
        lines.extend(f"  {d.region}: {d.why()}" for d in self.threads)
        if self.threads:
            fewer = sum(d.chosen < max(d.timings) for d in self.threads)
            lines.append(f"  threads: {len(self.threads)} regions timed, {fewer} run on fewer threads than the process's")
        changed = sum(d.chosen != d.default for d in self.algorithms)
        lines.append(f"  algorithm: {len(self.algorithms)} convolutions, {sum(bool(d.timings) for d in self.algorithms)}"
                     f" with a choice, {changed} differ from the thresholds")
        if self.default is not None:
            tuned = f"{self.tuned.median_s * 1e3:.3f} ms" if self.tuned else "(no change to time)"
            lines.append(f"  end to end: default {self.default.median_s * 1e3:.3f} ms, tuned {tuned}; "
                         f"kept the {self.kept} plan")
        lines.append(f"  timing cache: {self.cache_hits} hits, {self.cache_misses} misses")
        lines.extend(self.precision.lines() if self.precision else [])
        lines.extend(self.devices.lines() if self.devices else [])
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def _check_static(mod: tvm.IRModule, params: Mapping[str, np.ndarray] | None) -> None:
    """An :class:`~byoc_hetero.InputError` for an input with symbolic dims: timings need sizes."""
    for var in mod["main"].params:
        if not (params and var.name in params) and static_shape(var) is None:
            raise InputError(f"tune: input {var.name!r} has the shape {list(shape_of(var) or ['?'])}; tuning times "
                             "static shapes: fix it (bh.from_onnx(path, shape={name: dims}), byoc-hetero tune "
                             "--shape NAME=D1,D2,...)")


def _inputs(mod: tvm.IRModule, params: Mapping[str, np.ndarray] | None, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for var in mod["main"].params:
        if params and var.name in params:
            continue
        arrays.append(random_input(rng, [int(d) for d in var.ty.shape.values], str(var.ty.dtype)))
    return arrays


def _timer(partitioned: tvm.IRModule, inputs: list[np.ndarray]):
    vm = relax.VirtualMachine(relax.build(partitioned, target="llvm"), tvm.cpu())
    args = [tvm.runtime.tensor(x) for x in inputs]
    return lambda: vm["main"](*args)


def _guard(default: tvm.IRModule, tuned: tvm.IRModule, inputs: list[np.ndarray], rounds: int,
           repeat: int) -> tuple[Timing, Timing]:
    """Both modules timed alternately; the median of each round's medians."""
    run_default, run_tuned = _timer(default, inputs), _timer(tuned, inputs)
    d_medians, t_medians = [], []
    for r in range(rounds):
        order = [(run_default, d_medians), (run_tuned, t_medians)]
        for fn, out in order if r % 2 == 0 else reversed(order):
            out.append(time_call(fn, warmup=2, repeat=repeat).median_s)
    return (Timing(float(np.median(d_medians)), rounds * repeat),
            Timing(float(np.median(t_medians)), rounds * repeat))


def tune(mod: tvm.IRModule, params: Mapping[str, np.ndarray] | None = None, *,
         devices: Sequence[str] = ("cpu",), targets: Any = None, precisions: Sequence[str] = ("f32",),
         tolerance: float | None = None, calibration: Any = None, holdout: Any = None,
         budget_s: float | None = None, cache: str | os.PathLike | TimingCache | None = None,
         guard_rounds: int = 3, repeat: int = 15,
         progress: bool | Callable[[str, int, int, str], None] = False,
         device_costs: Measurer | None = None, threads: bool = False) -> tuple[tvm.IRModule, TuneReport]:
    """Partition ``mod`` with decisions measured on this machine; returns ``(module, report)``.

    The module builds, exports and reloads like any ``bh.partition`` result. ``cache``: a
    :class:`TimingCache` or the path of its file (kept between runs; a foreign or stale file is
    ignored with a warning). ``progress``: True draws a :class:`.progress.ProgressBar` on stderr; a
    callable ``(level, done, total, what)`` is told each step instead. See the module docstring for
    which levels are decided today; asking for another (a GPU device, int8) raises
    :class:`~byoc_hetero.RuleError` / :class:`~byoc_hetero.PlacementError`.

    Precision level (:mod:`.precision`, docs/tuning.md): ``precisions`` with more than one entry
    needs ``tolerance`` (max relative output error against the float32 build) and ``calibration``
    (sample inputs); ``holdout`` (default: the last quarter of ``calibration``) checks the result;
    ``budget_s`` bounds the search (the best plan so far when it runs out). int8 among
    ``precisions`` quantizes layer groups (:mod:`.int8`).

    Device level (:mod:`.devices`): with a GPU among ``devices`` (``("cpu", "cuda")``), each call of
    the tuned module is placed where its time plus the copies it implies is least, from
    measurements where the GPU exists, or from ``device_costs`` (a :class:`.devices.CostTable` or
    another :class:`.devices.Measurer`); without either the level is skipped with a note.

    Threads level (:mod:`.threads`, ``threads=True``): each region of a backend with a threads knob gets the
    process's thread count or one, whichever is measured faster.

    Option level (:mod:`.options`): each option the backends of ``targets`` declare tunable gets,
    per region, its fastest declared value; ``tolerance`` (also without several precisions) admits
    values that change numerics within it (the region's outputs against the default's).
    """
    names = check_devices(devices)
    asked = check_precisions(precisions, tolerance, calibration, budget_s, targets)
    _check_static(mod, params)
    bar = ProgressBar() if progress is True else progress or None
    module, report = _tune_cpu(mod, params, targets, asked, tolerance, calibration, holdout, budget_s, cache,
                               guard_rounds, repeat, bar, threads)
    if len(names) > 1:
        module, report.devices = tune_devices(module, names, device_costs, budget_s=budget_s, progress=bar)
    return _closed(bar, module), report


def _tune_cpu(mod: tvm.IRModule, params: Mapping[str, np.ndarray] | None, targets: Any, asked: tuple[str, ...],
              tolerance: float | None, calibration: Any, holdout: Any, budget_s: float | None, cache: Any,
              guard_rounds: int, repeat: int, bar: Callable[..., None] | None,
              threads: bool = False) -> tuple[tvm.IRModule, TuneReport]:
    """The CPU levels (codegen, threads, algorithm, precision: :mod:`.levels`, run in that order),
    the never-slower check, and the timing cache's hit and miss counts in the report."""
    from ..stages import partition

    timing_cache = cache if isinstance(cache, TimingCache) else TimingCache(cache)
    precision = asked[0] if len(asked) == 1 else "f32"
    ctx = TuneContext(mod, params, targets, precision, timing_cache, repeat, bar,
                      default=partition(mod, params, target=targets, precision=precision))
    report = TuneReport()
    try:
        with active(timing_cache, None if budget_s is None else time.monotonic() + budget_s):
            return _run_levels(ctx, report, _levels(asked, tolerance, calibration, holdout, budget_s, guard_rounds,
                                                    threads), guard_rounds)
    finally:
        timing_cache.save()
        report.cache_hits, report.cache_misses = timing_cache.hits, timing_cache.misses


def _levels(asked: tuple[str, ...], tolerance: float | None, calibration: Any, holdout: Any,
            budget_s: float | None, rounds: int, threads: bool) -> list[Level]:
    """The CPU levels a tune with these arguments runs, in order."""
    levels: list[Level] = [CodegenLevel(), *([ThreadsLevel()] if threads else []), OptionLevel(tolerance),
                           AlgorithmLevel()]
    if len(asked) > 1:
        levels.append(PrecisionLevel(asked, tolerance, calibration, holdout, budget_s, rounds))
    return levels


def _run_levels(ctx: TuneContext, report: TuneReport, levels: list[Level],
                guard_rounds: int) -> tuple[tvm.IRModule, TuneReport]:
    for level in levels:
        decisions = level.run(ctx)
        setattr(report, level.report_field, level.result(ctx, decisions))
        report.notes.extend(ctx.notes)
        ctx.notes.clear()
        if level.final:
            return _kept_precision(ctx, report, level.kept, guard_rounds)
    return _guarded(ctx, report, guard_rounds)


def _kept_precision(ctx: TuneContext, report: TuneReport, kept: Any,
                    guard_rounds: int) -> tuple[tvm.IRModule, TuneReport]:
    """The precision level's kept plan (it was timed end to end against the default there), or,
    where it had nothing to choose, the float levels' plan through the guard."""
    if kept is None:
        return _guarded(ctx, report, guard_rounds)
    quantized = set(kept.table.values()) & set(report.precision.quantized)
    if ctx.region_codegen is not None and quantized:
        report.notes.append(f"the kept plan quantizes layers to {', '.join(sorted(quantized))}: a quantized module "
                            "forms other regions, so the codegen level's map (float regions) does not apply to it")
    report.default, report.tuned = report.precision.plans[0].timing, kept.timing
    report.kept = "default" if kept is report.precision.plans[0] else "tuned"
    return kept.built.module, report  # a warm tune partitions the kept plan only now: what it looked up is saved


def _guarded(ctx: TuneContext, report: TuneReport, guard_rounds: int) -> tuple[tvm.IRModule, TuneReport]:
    """The tuned partition where it is measured faster end to end than the default one, else the
    default (never slower); the default outright where every decision equals the built-in rules."""
    from ..stages import partition

    mod, params, targets, precision, mapped = ctx.mod, ctx.params, ctx.targets, ctx.precision, ctx.region_codegen
    changed = any(v not in ("{}", None) for opts in ctx.options.values() for v in opts.values())
    if not changed and mapped is None:
        report.notes.append("every measured decision equals the built-in rules: the default plan")
        return ctx.default, report
    # built only where needed: figures reused from the cache that keep the default need no tuned module
    tuned = functools.cache(lambda: partition(mod, params, target=targets, precision=precision,
                                              region_codegen=mapped, options=ctx.options))
    ctx.say("end to end", 0, 1, "the default and the tuned plan, alternating")
    report.default, report.tuned, reused = reused_guard(
        ctx.cache, mod, params, plan_digest(targets, precision, mapped, _options_text(ctx.options),
                                            guard_rounds, ctx.repeat),
        lambda: _guard(ctx.default, tuned(), _inputs(mod, params, seed=0), guard_rounds, ctx.repeat))
    if reused:
        report.notes.append("end-to-end figures from the timing cache (same model, same plan): nothing rebuilt")
    if report.tuned.median_s < report.default.median_s:
        report.kept = "tuned"
        return tuned(), report
    report.notes.append("the tuned plan was not measured faster end to end: the default plan is kept")
    return ctx.default, report


def _options_text(options: Mapping[str, Mapping[str, Any]]) -> str:
    """The backend options as the end-to-end figures' key knows them: one backend's own table
    (what the key held before the options named their backend), else every backend's."""
    only = list(options.values())[0] if len(options) == 1 else options
    return json.dumps(only, sort_keys=True)


def _closed(bar: Callable[..., None] | None, module: tvm.IRModule) -> tvm.IRModule:
    """``module``, once a progress bar :func:`tune` drew has ended its line."""
    if isinstance(bar, ProgressBar):
        bar.close()
    return module
