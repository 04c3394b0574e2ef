"""The precision level: which convolutions and matrix products run bf16, within an error tolerance.

``bh.tune(mod, params, precisions=("f32", "bf16"), tolerance=1e-2, calibration=[...])`` decides,
per *unit*, whether it computes in float32 or bf16. A unit is one conv2d / dense / matmul node of
a oneDNN region (a whole model is often one region, so regions are too coarse), or a run of
consecutive such nodes of one region when a model has more than ``max_units`` of them (a layer
group). The decision reaches the nodes through the backend option ``node_precisions`` (region
symbol and node index → ``"f32"`` / ``"bf16"``, written as each node's ``precision`` attr by the
region pass ``apply_node_precisions``); every other op keeps float32 as in any bf16 region.

Steps (each measured on this machine):

1. **reference**: the default float32 partition runs the calibration and held-out inputs;
2. **time gain**: each node is built alone as a one-node region (:class:`OneNode`) in each
   precision and timed (:func:`.measure.time_call`, through the timing cache, so repeated layers
   are timed once); a unit's time is the sum of its nodes'. (The runtime's per-step profiler would
   see the nodes in place, but it runs every call at the full thread count: on a loaded 2-core
   machine its steps stalled for milliseconds, measured 5 ms on a 20 µs convolution.) A node alone
   pays the f32/bf16 conversions at its edges, which a bf16 neighbourhood saves: step 5 times the
   all-bf16 plan end to end for that reason;
3. **sensitivity**: when all-bf16 misses the tolerance on the calibration inputs, for each unit
   where bf16 is faster (largest gain first, so a cut search keeps the valuable ones) the model is
   built with that unit alone in bf16 and its error on the calibration inputs measured:
   ``max |y - y_f32| / max |y_f32|`` over every output and input (when all-bf16 meets it, each
   unit simply takes its faster precision and one build checks that mix);
4. **search**: :func:`.solver.solve` picks the fastest mix whose summed unit errors stay within
   the tolerance; errors need not add, so the mix's real calibration error is measured and the
   error budget rescaled by what was found (tighter when the mix missed, looser when it had room),
   a few rounds;
5. **check**: each candidate (the mix, all-bf16) is run on the *held-out* inputs and kept only
   when its error there is within the tolerance too (when every candidate misses there, one more
   search asks for a calibration error smaller by the ratio missed); the kept candidates and the
   float32 plans are timed end to end, alternating, and the fastest wins — never slower than the
   default float32 plan, which wins ties.

Every error of steps 3-5 and the end-to-end figures of step 5 go through the timing cache
(:mod:`.plan_errors`): a second tune of the model with the same inputs builds no candidate.

When no candidate meets the tolerance, the float32 plan comes back with a :class:`TuneWarning`
giving the best error found. ``budget_s`` bounds steps 2-4: when it runs out, the units not yet
measured stay float32, the search returns its best plan so far, and the report says the search
was cut. On a CPU without native bf16 (oneDNN below ``avx512_core_bf16``, or
``BYOC_HETERO_BF16=off``) the bf16 candidates are skipped with a note. int8 is one more choice of
this level, read from the backend as bf16 is (:class:`.levels.PrecisionLevel`): where a unit may take
it, the three-way search of :mod:`.int8` decides; where the backend says it runs as another
precision here (no VNNI) or no layer can take it, the float choices are searched as above.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tvm

from ..errors import InputError, RuleError
from .cache import TimingCache
from .plans import (MAX_UNITS, PlanResult, PrecisionReport, PrecisionUnit, Session, anchor_nodes,
                    float32_plans, held_out_candidates, make_units, measure_unit_times, native_reason, pick,
                    timed_graphs, warn_unmet)
from .solver import Choice, Problem, Region, solve

#: what ``bh.tune(precisions=...)`` accepts (int8's units are quantized layers: :mod:`.int8`)
TUNE_PRECISIONS = ("f32", "bf16", "int8")
#: rounds of the mix search (re-solving with the error budget rescaled by the measured error)
SEARCH_ROUNDS = 4


def check_precisions(precisions: Sequence[str], tolerance: float | None, calibration: Any,
                     budget_s: float | None) -> tuple[str, ...]:
    """The distinct precisions asked for, in order; a :class:`RuleError` naming what is wrong."""
    asked = tuple(dict.fromkeys(str(p) for p in precisions))
    if not asked:
        raise RuleError("tune: precisions is empty; give at least one of " + ", ".join(TUNE_PRECISIONS))
    unknown = [p for p in asked if p not in TUNE_PRECISIONS]
    if unknown:
        raise RuleError(f"tune: unknown precision {unknown[0]!r}; expected some of {', '.join(TUNE_PRECISIONS)}")
    if asked == ("int8",):
        raise RuleError("tune: precisions=('int8',) alone: the tuner chooses int8 per layer group against "
                        "float32 within a tolerance (precisions=('f32', 'int8'), tolerance=..., calibration=...); "
                        "to quantize every layer, use bh.quantize and partition the result")
    if "f32" not in asked and len(asked) > 1:
        raise RuleError(f"tune: precisions {list(asked)} leave out 'f32', the reference every error is "
                        "measured against and the plan kept when nothing else meets the tolerance")
    if budget_s is not None and not (isinstance(budget_s, (int, float)) and budget_s > 0):
        raise RuleError(f"tune: budget_s must be a positive number of seconds or None, got {budget_s!r}")
    if len(asked) == 1:
        if tolerance is not None or calibration is not None:
            raise RuleError("tune: tolerance and calibration are for choosing among several precisions "
                            "(precisions=('f32', 'bf16')); with one precision there is nothing to choose")
        return asked
    if tolerance is None:
        raise RuleError(f"tune: choosing among precisions {list(asked)} needs a tolerance: the largest "
                        "relative output error accepted against the float32 build (e.g. 1e-2)")
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise RuleError(f"tune: tolerance must be a finite number >= 0, got {tolerance!r}")
    if calibration is None:
        raise RuleError("tune: a tolerance needs calibration inputs (calibration=[sample, ...], each an "
                        "array, a list of arrays in input order, or a dict by input name): errors are "
                        "measured on them, and random inputs would say little about a real model's")
    return asked


def input_samples(mod: tvm.IRModule, params: Mapping[str, Any] | None, samples: Any,
                  what: str) -> list[list[np.ndarray]]:
    """``samples`` (each an array, a list of arrays in ``main``'s input order, or a dict by input
    name) as lists of arrays, checked against ``main``'s signature (:class:`InputError`)."""
    from ..inputs import sample_lists

    if samples is None or isinstance(samples, (np.ndarray, Mapping)) or not len(samples):
        raise InputError(f"tune: {what} must be a non-empty list of inputs (each an array, a list of "
                         "arrays in input order, or a dict by input name)")
    return sample_lists(mod, list(samples), params, f"tune: {what}")


def split_holdout(calibration: list, holdout: list | None) -> tuple[list, list]:
    """The calibration and held-out samples: ``holdout`` when given, else the last quarter (at
    least one) of ``calibration``, which then needs two samples or more."""
    if holdout is not None:
        return calibration, holdout
    if len(calibration) < 2:
        raise InputError("tune: the chosen precisions are checked on held-out inputs: give at least 2 "
                         "calibration inputs (the last quarter is held out) or holdout=[...]")
    cut = len(calibration) - max(1, len(calibration) // 4)
    return calibration[:cut], calibration[cut:]


def measure_sensitivity(units: Sequence[PrecisionUnit], session: Session, keys: Sequence[str],
                        report: PrecisionReport) -> None:
    """Each unit's calibration error with it alone in bf16 (the others float32), largest time
    gain first; a unit where bf16 is not faster is not built; the budget may cut the rest."""
    by_gain = sorted(units, key=lambda u: u.times["bf16"] - u.times["f32"])
    for i, unit in enumerate(by_gain):
        if unit.error is not None:
            continue  # measured in an earlier search
        if unit.times["bf16"] >= unit.times["f32"]:
            unit.unmeasured = unit.unmeasured or "bf16 is not faster"
            continue
        if session.left_s() <= 0:
            report.search_cut = True
            report.notes.append(f"budget_s ran out after {i} of {len(units)} units' sensitivities: "
                                "the others stay float32")
            for rest in by_gain[i:]:
                rest.unmeasured = "bf16 is not faster" if rest.times["bf16"] >= rest.times["f32"] else "search cut"
            return
        table = {k: "f32" for k in keys} | {k: "bf16" for k in unit.keys}
        unit.error, unit.unmeasured = session.errors.error(table, "calibration", session.build(table)), ""
        session.say(f"sensitivity {i + 1}/{len(units)} {unit.name}: error {unit.error:.2g}")


def _problem(units: Sequence[PrecisionUnit]) -> Problem:
    """The solver's view: one region per unit, f32 (no error) or bf16 (its measured error)."""
    regions = []
    for u in units:
        choices = [Choice("f32", "cpu:0", u.times["f32"])]
        if u.error is not None:
            choices.append(Choice("bf16", "cpu:0", u.times["bf16"], u.error))
        regions.append(Region(u.name, choices))
    return Problem(regions, {}, lambda src, dst, nbytes: 0.0)


def search_mix(units: Sequence[PrecisionUnit], session: Session, tolerance: float,
               report: PrecisionReport) -> PlanResult | None:
    """The fastest mix found whose real calibration error is within ``tolerance``, or None.

    The solver bounds the *summed* unit errors; real errors add up less (or more), so each mix
    is built and measured and the error budget rescaled by ``tolerance / measured`` (tighter after
    a miss, looser when there was room) for up to :data:`SEARCH_ROUNDS` rounds."""
    problem, budget, tried, best = _problem(units), tolerance, set(), None
    for _ in range(SEARCH_ROUNDS):
        left = session.left_s()
        solution = solve(problem, budget, budget_s=None if math.isinf(left) else max(left, 1e-3))
        if not solution.exact and any("budget" in n for n in solution.notes):
            report.search_cut = True
        table = {k: solution.choices[u.name].name for u in units for k in u.keys}
        chosen = frozenset(k for k, p in table.items() if p == "bf16")
        if not chosen or chosen in tried:
            break
        tried.add(chosen)
        built = session.build(table)
        plan = PlanResult("tuned mix", table, session.errors.error(table, "calibration", built),
                          modelled_s=solution.time_s, built=built)
        session.say(f"mix of {len(chosen)} bf16 nodes: calibration error {plan.calibration_error:.2g} "
                    f"(summed unit errors {solution.error:.2g}, budget {budget:.2g})")
        if plan.calibration_error <= tolerance and (best is None or plan.modelled_s < best.modelled_s):
            best = plan
        measured = plan.calibration_error
        if measured > tolerance:
            budget *= 0.8 * tolerance / measured
        elif measured > 0 and tolerance / measured < 1.25:
            break  # close to the tolerance already: little to gain from a looser budget
        else:
            budget *= 4.0 if measured == 0 else min(4.0, tolerance / measured)
        if session.left_s() <= 0:
            report.search_cut = True
            break
    return best


def _mix(report: PrecisionReport, session: Session, all_bf16: PlanResult, keys: Sequence[str],
         target: float) -> PlanResult | None:
    """The mix of units to check end to end, whose calibration error is at most ``target``. When
    all-bf16 already meets it, each unit takes its faster precision (no sensitivity needed: one
    build checks the mix); otherwise the sensitivities are measured and the solver searches."""
    units, tolerance = report.units, target
    if all_bf16.calibration_error > tolerance:
        measure_sensitivity(units, session, keys, report)
        mix = search_mix(units, session, tolerance, report)
        if mix is None:
            report.notes.append("no mix of bf16 units measured within the tolerance on the calibration inputs")
        return mix
    report.notes.append("all bf16 is within the tolerance on the calibration inputs: each unit takes its "
                        "faster precision, and the units' own sensitivities were not measured")
    table = {}
    for unit in units:
        unit.unmeasured = "all bf16 is within the tolerance"
        faster = "bf16" if unit.times["bf16"] < unit.times["f32"] else "f32"
        table.update({k: faster for k in unit.keys})
    if "bf16" not in table.values() or "f32" not in table.values():
        return None
    built = session.build(table)
    return PlanResult("tuned mix", table, session.errors.error(table, "calibration", built),
                      modelled_s=sum(min(u.times.values()) for u in units), built=built)


def _candidates(report: PrecisionReport, session: Session, candidates: list[PlanResult],
                keys: Sequence[str]) -> list[PlanResult]:
    """:func:`held_out_candidates` with the bf16 level's mix (``candidates`` holds all-bf16)."""

    def find_mix(target: float) -> PlanResult | None:
        mix = _mix(report, session, candidates[0], keys, target)
        return mix if mix is not None and mix.bf16_nodes < len(keys) else None

    return held_out_candidates(report, candidates, find_mix, session.errors)


def choose_precisions(mod: tvm.IRModule, params: Mapping[str, Any] | None, default: tvm.IRModule, *,
                      precisions: Sequence[str], tolerance: float, calibration: Any, holdout: Any = None,
                      targets: Any = None, options: Mapping[str, Mapping[str, Any]] | None = None,
                      budget_s: float | None = None, cache: TimingCache | None = None, rounds: int = 3,
                      repeat: int = 15, max_units: int = MAX_UNITS, progress: Any = False,
                      region_codegen: Mapping[str, str] | None = None, base: tvm.IRModule | None = None,
                      skipped: Mapping[str, str] | None = None) -> tuple[PlanResult | None, PrecisionReport]:
    """The precision level (see the module docstring): the plan kept (its ``built.module`` is the
    partitioned module; None when there was nothing to choose: no native bf16, no unit) and the
    report. ``default`` is the default float32 partition, the reference; ``options`` the backend
    options of the other levels (the algorithm level's ``algorithms``), kept in every candidate;
    ``region_codegen`` the codegen level's map and ``base`` the float32 partition it gives (the
    candidates are built on it); ``cache`` the timing cache the units' times go through (saved at
    the end). With ``"int8"`` among ``precisions``, :func:`.int8.choose_with_int8` decides; where it
    cannot apply int8 (a note says why), the float precisions are chosen as without it. ``skipped``:
    each precision asked that no unit may take and why (:meth:`.levels.PrecisionLevel.skipped`,
    read from the backends' variants and knobs; None: from the knobs' ``native`` alone)."""
    report = PrecisionReport(tuple(precisions), float(tolerance))
    samples = input_samples(mod, params, calibration, "calibration")
    held = None if holdout is None else input_samples(mod, params, holdout, "holdout")
    calibration, holdout = split_holdout(samples, held)
    report.calibration, report.holdout = len(calibration), len(holdout)
    session = Session(mod, params, targets, options, budget_s, progress, region_codegen)
    base = default if base is None else base
    if skipped is None:
        skipped = {p: r for p in precisions if p != "f32" for r in [native_reason(targets, p)] if r}
    if "int8" in precisions:
        from .int8 import choose_with_int8

        best, report = choose_with_int8(report, session, default, base, calibration, holdout, cache=cache,
                                        rounds=rounds, repeat=repeat, max_units=max_units, skipped=skipped)
        if best is not None or report.plans:
            return best, report
    # int8 not asked, or it could not apply here (a note says why): the float precisions are chosen
    report.precisions = tuple(p for p in report.precisions if p != "int8")
    if "bf16" not in report.precisions:
        report.notes.append("no float precision but f32 asked: nothing to choose")
        return None, report
    reason = skipped.get("bf16", "")
    anchors = anchor_nodes(base)
    if reason or not anchors:
        report.notes.append(f"bf16 candidates skipped: {reason}" if reason else
                            "no float conv2d / dense / matmul in a region with a precision knob: no precision "
                            "to choose")
        return None, report
    cache = cache if cache is not None else TimingCache(None)
    float_plans = float32_plans(session, default, calibration, holdout, cache)
    keys = [k for k, _ in anchors]
    all_bf16 = session.build({k: "bf16" for k in keys})
    report.units = make_units(anchors, max_units)
    graphs = timed_graphs(session, float_plans, base, cache)  # the algorithms apply in the graphs
    measure_unit_times(report.units, graphs, cache, repeat)
    cache.save()
    candidates = [PlanResult("all bf16", {k: "bf16" for k in keys},
                             session.errors.error({k: "bf16" for k in keys}, "calibration", all_bf16),
                             modelled_s=sum(u.times["bf16"] for u in report.units), built=all_bf16)]
    session.say(f"{len(report.units)} units timed; all bf16: calibration error {candidates[0].calibration_error:.2g}")
    valid = _candidates(report, session, candidates, keys)
    report.plans = float_plans + candidates
    if not valid:
        warn_unmet(report, float(tolerance))
    best = pick(report, float_plans, valid, calibration[0], rounds, repeat, session.errors)
    cache.save()
    report.notes.extend(n for n in [session.skipped_note()] if n)
    for unit in report.units:
        unit.chosen = "bf16" if best.table and all(best.table[k] == "bf16" for k in unit.keys) else "f32"
    return best, report
