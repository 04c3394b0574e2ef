"""The precision level: which convolutions and matrix products run bf16 or int8, within an error tolerance.

``bh.tune(mod, params, precisions=("f32", "bf16", "int8"), tolerance=1e-2, calibration=[...])``
decides, per *unit*, the precision it computes in among those asked that the backend offers: its
:class:`~byoc_hetero.rules.Variant` s of level ``precision`` for the unit's op, left out where the
knob's ``native`` says one runs as another here (no native bf16, no VNNI), with the backend's reason
in the report (:func:`.plans.precision_choices`). A unit is one conv2d / dense / matmul node of a
region whose backend has a precision knob (a whole model is often one region, so regions are too
coarse), or a run of consecutive such nodes of one region when a model has more than ``max_units``
of them (a layer group).

There is one search, over a *plan space* that says how a plan is made from per-unit choices:

* :class:`FloatSpace` (f32 / bf16): the float partition again with the chosen nodes named in the
  knob's option (``node_precisions``: the backend's node key, by content, -> precision, written as each
  node's ``precision`` attr by the region pass ``apply_node_precisions``); every other op keeps
  float32 as in any bf16 region;
* :class:`.int8.QuantizedSpace` (f32 / bf16 / int8), where int8 is asked and applies: a layer in
  int8 is quantized (Q/DQ around it), its bf16 nodes named as above; its units are the quantizer's
  layers, matched to their nodes by content; the conversions between an int8 unit and a float
  one are measured and counted.

Steps (each measured on this machine):

1. **reference**: the default float32 partition runs the calibration and held-out inputs;
2. **time gain**: each node is built alone as a one-node region (:class:`.plans.OneNode`) in each
   precision and timed (:func:`.measure.time_call`, through the timing cache, so repeated layers
   are timed once); a unit's time is the sum of its nodes'. (The runtime's per-step profiler would
   see the nodes in place, but it runs every call at the full thread count: on a loaded 2-core
   machine its steps stalled for milliseconds, measured 5 ms on a 20 µs convolution.) A node alone
   pays the conversions at its edges, which a neighbourhood in the same precision saves: step 5
   times the all-one plans (all int8, all bf16) end to end for that reason;
3. **sensitivity**: when the first all-one plan (lowest precision first) misses the tolerance on
   the calibration inputs, for each unit and each precision faster than f32 for it (largest time
   gain first, so a cut search keeps the valuable ones) the model is built with that unit alone in
   that precision and its error on the calibration inputs measured:
   ``max |y - y_f32| / max |y_f32|`` over every output and input (when it meets it, each unit
   simply takes its fastest precision and one build checks that mix: :func:`fastest_each`);
4. **search** (:func:`search`): :func:`.solver.solve` picks the fastest mix whose summed unit
   errors stay within a budget; errors need not add, so the mix's real calibration error is
   measured and the budget searched as the space's schedule says
   (:class:`.solver.RescaledBudget`: rescaled by ``tolerance / measured``, four rounds, for the one
   float domain; :class:`.solver.BisectedBudget`: bisected, eight rounds, with int8's domain and
   its conversions counted through :func:`.solver.improve`);
5. **check**: each candidate (the all-one plans, the mix) is run on the *held-out* inputs and kept
   only when its error there is within the tolerance too (when every candidate misses there, one
   more search asks for a calibration error smaller by the ratio missed); the kept candidates and
   the float32 plans are timed end to end, alternating, and the fastest wins — never slower than
   the default float32 plan, which wins ties.

Every error of steps 3-5 and the end-to-end figures of step 5 go through the timing cache
(:mod:`.plan_errors`): a second tune of the model with the same inputs builds no candidate.

When no candidate meets the tolerance, the float32 plan comes back with a :class:`TuneWarning`
giving the best error found. ``budget_s`` bounds steps 2-4: when it runs out, the units not yet
measured stay float32, the search returns its best plan so far, and the report says the search
was cut. Where the backend says a precision runs as another here (bf16 below
``avx512_core_bf16`` or with ``BYOC_HETERO_BF16=off``; int8 below VNNI) its candidates are skipped
with the backend's reason; where int8 cannot apply (no layer to quantize, none matched to a node of
its own), the float choices are searched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tvm

from ..errors import InputError, RuleError
from .cache import TimingCache
from .edges import FLOAT, UnitEdges, domain, edge_cost
from .plans import (MAX_UNITS, Built, PlanResult, PlanSpace, PrecisionReport, PrecisionUnit, Session, anchor_nodes,
                    assignment_of, float32_plans, held_out_candidates, make_units, measure_unit_times, native_reason,
                    offered_precisions, pick, plan_result, quantized_precisions, timed_graphs, unit_layers,
                    warn_unmet)
from .solver import Choice, Problem, Region, RescaledBudget, Solution, improve, solve


def check_precisions(precisions: Sequence[str], tolerance: float | None, calibration: Any,
                     budget_s: float | None, targets: Any = None) -> tuple[str, ...]:
    """The distinct precisions asked for, in order; a :class:`RuleError` naming what is wrong. The
    precisions known are those the backends of ``targets`` offer (their variants of level
    ``precision``), f32 always."""
    from ..stages import target_names

    names = target_names(targets)
    offered, quantized = offered_precisions(names), quantized_precisions(names)
    asked = tuple(dict.fromkeys(str(p) for p in precisions))
    if not asked:
        raise RuleError("tune: precisions is empty; give at least one of " + ", ".join(offered))
    unknown = [p for p in asked if p not in offered]
    if unknown:
        raise RuleError(f"tune: unknown precision {unknown[0]!r}; the backends {', '.join(names)} offer "
                        f"{', '.join(offered)}")
    if len(asked) == 1 and asked[0] in quantized:
        raise RuleError(f"tune: precisions=({asked[0]!r},) alone: the tuner chooses {asked[0]} per layer group "
                        f"against float32 within a tolerance (precisions=('f32', {asked[0]!r}), tolerance=..., "
                        "calibration=...); to quantize every layer, use bh.quantize and partition the result")
    if "f32" not in asked and len(asked) > 1:
        raise RuleError(f"tune: precisions {list(asked)} leave out 'f32', the reference every error is "
                        "measured against and the plan kept when nothing else meets the tolerance")
    if budget_s is not None and not (isinstance(budget_s, (int, float)) and budget_s > 0):
        raise RuleError(f"tune: budget_s must be a positive number of seconds or None, got {budget_s!r}")
    if len(asked) == 1 and calibration is not None:
        raise RuleError("tune: calibration inputs are for choosing among several precisions "
                        "(precisions=('f32', 'bf16')); with one precision there is nothing to choose")
    if len(asked) == 1 and tolerance is None:
        return asked
    if tolerance is None:
        raise RuleError(f"tune: choosing among precisions {list(asked)} needs a tolerance: the largest "
                        "relative output error accepted against the float32 build (e.g. 1e-2)")
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise RuleError(f"tune: tolerance must be a finite number >= 0, got {tolerance!r}")
    if len(asked) == 1:  # the option level's tolerance alone (a backend option that changes numerics)
        return asked
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


class FloatSpace:
    """The precision level's plan space of the float choices (f32, bf16): a unit is a conv2d /
    dense / matmul node of the float partition (or a run of them, :func:`.plans.make_units`); a
    plan (node index -> precision) is that partition again with the nodes named in the knob's
    option (:meth:`.plans.Session.build`). Its choices are one domain: the error budget is
    rescaled by what each mix measured (:class:`.solver.RescaledBudget`)."""

    def __init__(self, session: Session, anchors: Sequence[tuple[str, str]], max_units: int):
        self.session = session
        self.keys = [k for k, _ in anchors]
        self.layers = list(range(len(self.keys)))
        self.layer_of = {k: i for i, k in enumerate(self.keys)}
        self.units = make_units(anchors, max_units)
        self.edges = self.edge_costs = None

    def schedule(self) -> RescaledBudget:
        return RescaledBudget()

    def build(self, assignment: Mapping[int, str]) -> Built:
        """The plan ``assignment`` (node index -> precision), built when first used."""
        return self.session.build({self.keys[i]: p for i, p in assignment.items()})

    def prebuilt(self, precision: str) -> Built | None:
        return None

    def time_units(self, report: PrecisionReport, graphs: Mapping[str, Any], cache: TimingCache,
                   repeat: int) -> None:
        """Each unit's f32 and bf16 time: its nodes alone (:func:`.plans.measure_unit_times`)."""
        measure_unit_times(self.units, graphs, cache, repeat)
        cache.save()


def measure_sensitivities(space: PlanSpace, report: PrecisionReport) -> None:
    """Each unit's calibration error alone in each precision faster than f32 for it (the others
    float32), largest time gain first; a precision not faster than f32 is not built; the budget
    may cut the rest (they stay float32)."""
    session, gains = space.session, []
    for unit in space.units:
        faster = [p for p in report.lowest_first if unit.times.get(p, math.inf)
                  < unit.times["f32"]]
        gains += [(unit.times[p] - unit.times["f32"], unit, p) for p in faster if p not in unit.errors]
        if not faster:
            unit.unmeasured = unit.unmeasured or "no precision faster than f32 alone"
    gains.sort(key=lambda g: g[0])
    for i, (_, unit, p) in enumerate(gains):
        if session.left_s() <= 0:
            report.search_cut = True
            report.notes.append(f"budget_s ran out after {i} of {len(gains)} sensitivities: the others stay float32")
            for _, rest, _ in gains[i:]:
                rest.unmeasured = rest.unmeasured or "search cut"
            return
        assignment = {i_: "f32" for i_ in space.layers} | {i_: p for i_ in unit_layers(unit, space.layer_of)}
        table = {k: assignment[i_] for k, i_ in space.layer_of.items()}
        error = session.errors.error(table, "calibration", space.build(assignment))
        unit.errors[p] = error
        if p == "bf16":
            unit.error = error
        session.say(f"sensitivity {i + 1}/{len(gains)} {unit.name} in {p}: error {error:.2g}")


def problem_of(units: Sequence[PrecisionUnit], edges: UnitEdges | None = None,
               edge_costs: Mapping[tuple[str, str, int], float] | None = None, limit: float = math.inf) -> Problem:
    """The solver's view: per unit f32 (no error) and each precision whose error was measured and
    is at most ``limit`` (the error a mix is searched within: a unit that alone misses it could be
    in a mix that meets it only by errors cancelling on the calibration inputs — on the int8 test
    model natively (VNNI, session 14) the last dense alone in int8 was 0.024 off against a tolerance
    of 0.017, a mix with it 0.014 on the calibration inputs and 0.041 on the held-out ones);
    with ``edges`` and their measured ``edge_costs`` (:mod:`.edges`), each choice runs in its
    precision's domain and every tensor crossing between the int8 and the float domain costs a
    conversion (without them, units add up alone, as before session 5)."""
    regions = []
    for u in units:
        choices = [Choice("f32", FLOAT, u.times["f32"])]
        choices += [Choice(p, domain(p), u.times[p], e) for p, e in u.errors.items() if p in u.times and e <= limit]
        ins, outs = (edges.inputs.get(u.name, ()), edges.outputs.get(u.name, ())) if edges else ((), ())
        regions.append(Region(u.name, choices, list(ins), list(outs)))
    if edges is None or edge_costs is None:
        return Problem(regions, {}, lambda src, dst, nbytes: 0.0, input_device=FLOAT)
    return Problem(regions, edges.elements, edge_cost(edge_costs), edges.model_inputs, edges.model_outputs,
                   input_device=FLOAT)


def with_edges(space: PlanSpace, solution: Solution, budget: float, limit: float = math.inf) -> Solution:
    """``solution`` (the solver's, units alone) improved with the space's int8 / float edges counted
    (:func:`.solver.improve` from it and from all float32; the faster), or as it is without edges;
    a unit's choice over ``limit`` alone is not offered (:func:`problem_of`)."""
    if space.edges is None or space.edge_costs is None:
        return solution
    problem = problem_of(space.units, space.edges, space.edge_costs, limit)
    starts = [solution.choices] if solution.error <= budget else []
    starts.append({r.name: r.choices[0] for r in problem.regions})  # all f32: no error, always a start
    return min((improve(problem, start, budget) for start in starts), key=lambda s: s.time_s)


def search(space: PlanSpace, tolerance: float, report: PrecisionReport) -> PlanResult | None:
    """The fastest mix found whose real calibration error is within ``tolerance`` (None: none).

    The solver bounds the *summed* unit errors, which overstate or understate a mix's real error,
    so each mix is built and measured and the error budget searched for as the space's
    :meth:`schedule` says (:class:`.solver.RescaledBudget`, :class:`.solver.BisectedBudget`);
    a mix met twice, or all float32, is not built again."""
    session, units, schedule = space.session, space.units, space.schedule()
    problem, budget, seen, best = problem_of(units, limit=tolerance), tolerance, {}, None
    for _ in range(schedule.rounds):
        left = session.left_s()
        solution = solve(problem, budget, budget_s=None if math.isinf(left) else max(left, 1e-3))
        report.search_cut |= not solution.exact and any("budget" in n for n in solution.notes)
        solution = with_edges(space, solution, budget, tolerance)
        assignment = assignment_of(units, space.layer_of, {n: c.name for n, c in solution.choices.items()})
        frozen = frozenset(assignment.items())
        fresh = set(assignment.values()) != {"f32"} and frozen not in seen
        if fresh:
            plan = plan_result("tuned mix", units, assignment, space.layer_of, space.build(assignment),
                               session.errors)
            plan.modelled_s = solution.time_s  # the unit times (and the int8 / float edges) it implies
            session.say(f"mix {plan.text()} (summed unit errors {solution.error:.2g}, budget {budget:.2g})")
            seen[frozen] = plan.calibration_error
            if plan.calibration_error <= tolerance and (best is None or plan.modelled_s < best.modelled_s):
                best = plan
        following = schedule.next(budget, seen.get(frozen, 0.0), tolerance, fresh)
        if session.left_s() <= 0:
            report.search_cut = True
            break
        if following is None:
            break
        budget = following
    return best


def fastest_each(space: PlanSpace, report: PrecisionReport) -> PlanResult | None:
    """When the first all-one-precision plan is within the tolerance: each unit takes its fastest
    measured precision (one build checks the mix); None when that is one precision throughout."""
    units = space.units
    order = ["f32", *(p for p in report.precisions if p != "f32")]  # a tie keeps f32, then the order asked
    chosen = {u.name: min((p for p in order if p in u.times), key=lambda p: u.times[p]) for u in units}
    for u in units:
        u.unmeasured = u.unmeasured or f"all {candidate_order(report)[0]} is within the tolerance"
    assignment = assignment_of(units, space.layer_of, chosen)
    if len(set(assignment.values())) == 1:  # the all-one plan is a candidate already; all f32 the default
        return None
    return plan_result("tuned mix", units, assignment, space.layer_of, space.build(assignment), space.session.errors)


def candidate_order(report: PrecisionReport) -> list[str]:
    """The precisions other than f32 whose all-one plans are candidates, lowest first."""
    return list(report.lowest_first)


def _candidates(report: PrecisionReport, space: PlanSpace, candidates: list[PlanResult]) -> list[PlanResult]:
    """:func:`.plans.held_out_candidates` with the space's mix: each unit's fastest precision when
    the first all-one plan (``candidates[0]``) is within the target, else the sensitivities and the
    search."""
    first = candidate_order(report)[0]

    def find_mix(target: float) -> PlanResult | None:
        if candidates[0].calibration_error <= target:
            report.notes.append(f"all {first} is within the tolerance on the calibration inputs: each unit takes "
                                "its fastest precision, and the units' own sensitivities were not measured")
            return fastest_each(space, report)
        measure_sensitivities(space, report)
        mix = search(space, target, report)
        if mix is None:
            report.notes.append("no mix measured within the tolerance on the calibration inputs")
        return mix

    return held_out_candidates(report, candidates, find_mix, space.session.errors)


def _all_of(precision: str, report: PrecisionReport, space: PlanSpace) -> PlanResult:
    assignment = {i: precision for i in space.layers}
    built = space.prebuilt(precision) or space.build(assignment)
    return plan_result(f"all {precision}", space.units, assignment, space.layer_of, built, space.session.errors)


def decide(report: PrecisionReport, space: PlanSpace, float_plans: list[PlanResult], graphs: Mapping[str, Any],
           calibration: list, cache: TimingCache, rounds: int, repeat: int) -> PlanResult:
    """The level's one search over ``space`` (:class:`FloatSpace`, :class:`.int8.QuantizedSpace`):
    the units timed, the all-one plans of each precision, the mix, the held-out check and the
    end-to-end pick among them and ``float_plans`` (never slower than the default)."""
    session = space.session
    report.units = space.units
    space.time_units(report, graphs, cache, repeat)
    candidates = [_all_of(p, report, space) for p in candidate_order(report)]
    session.say(f"{len(report.units)} units timed; " + ", ".join(
        f"{c.name}: calibration error {c.calibration_error:.2g}" for c in candidates))
    valid = _candidates(report, space, candidates)
    report.plans = float_plans + candidates
    if not valid:
        warn_unmet(report, report.tolerance)
    best = pick(report, float_plans, valid, calibration[0], rounds, repeat, session.errors)
    cache.save()
    for unit in report.units:
        got = {best.table.get(k, "f32") for k in unit.keys} if best.table else {"f32"}
        unit.chosen = got.pop() if len(got) == 1 else "mixed"
    report.notes.extend(n for n in [session.skipped_note()] if n)
    return best


def _float_space(report: PrecisionReport, session: Session, base: tvm.IRModule, max_units: int,
                 skipped: Mapping[str, str]) -> FloatSpace | None:
    """The float choices' space, or None with a note saying why there is nothing to choose."""
    report.precisions = tuple(p for p in report.precisions if p not in report.quantized)
    if "bf16" not in report.precisions:
        report.notes.append("no float precision but f32 asked: nothing to choose")
        return None
    reason = skipped.get("bf16", "")
    anchors = anchor_nodes(base)
    if reason or not anchors:
        report.notes.append(f"bf16 candidates skipped: {reason}" if reason else
                            "no float conv2d / dense / matmul in a region with a precision knob: no precision "
                            "to choose")
        return None
    return FloatSpace(session, anchors, max_units)


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
    the end). With ``"int8"`` among ``precisions`` the search runs over :func:`.int8.quantized_space`;
    where int8 cannot apply (a note says why), over the float precisions' :class:`FloatSpace`.
    ``skipped``: each precision asked that no unit may take and why
    (:meth:`.levels.PrecisionLevel.skipped`, read from the backends' variants and knobs; None: from
    the knobs' ``native`` alone)."""
    from ..stages import target_names

    report = PrecisionReport(tuple(precisions), float(tolerance), quantized_precisions(target_names(targets)))
    samples = input_samples(mod, params, calibration, "calibration")
    held = None if holdout is None else input_samples(mod, params, holdout, "holdout")
    calibration, holdout = split_holdout(samples, held)
    report.calibration, report.holdout = len(calibration), len(holdout)
    session = Session(mod, params, targets, options, budget_s, progress, region_codegen)
    base = default if base is None else base
    if skipped is None:
        skipped = {p: r for p in precisions if p != "f32" for r in [native_reason(targets, p)] if r}
    cache = cache if cache is not None else TimingCache(None)  # not `or`: an empty cache is falsy (len 0)
    space: PlanSpace | None = None
    if set(precisions) & set(report.quantized):
        from .int8 import quantized_space

        if "bf16" in report.precisions and skipped.get("bf16"):
            report.precisions = tuple(p for p in report.precisions if p != "bf16")
            report.notes.append(f"bf16 candidates skipped: {skipped['bf16']}")
        space = quantized_space(report, session, base, calibration, cache, max_units, skipped)
    if space is None:  # int8 not asked, or it could not apply here (a note says why)
        space = _float_space(report, session, base, max_units, skipped)
    if space is None:
        return None, report
    float_plans = float32_plans(session, default, calibration, holdout, cache)
    graphs = timed_graphs(session, float_plans, base, cache)  # the algorithms apply in the graphs
    return decide(report, space, float_plans, graphs, calibration, cache, rounds, repeat), report
