"""int8 as a precision of the tuner: which layer groups run int8, bf16 or float32, within a tolerance.

``bh.tune(mod, params, precisions=("f32", "bf16", "int8"), tolerance=..., calibration=[...])``
decides per *unit* — one conv2d / matmul layer, or a run of consecutive layers of one region when a
model has more than :data:`~.plans.MAX_UNITS` (a layer group) — among the precisions asked. int8
is this project's post-training quantizer (:func:`byoc_hetero.quantize`): a layer in int8 gets
quantize / dequantize pairs around it (the QDQ form), which the int8 region passes turn into an
int8 kernel of the runtime. A layer's three forms are therefore two different modules: bf16 is a
per-node option of the float partition (``node_precisions``), int8 a different Relax module.

Steps (each measured on this machine):

1. **calibration once** (:class:`Quantizer`): the float model runs the calibration inputs once with
   every quantization point observed; the QDQ module of any subset of layers is then written from
   those ranges without running the model again (a subset's points are the full plan's, and so are
   their ranges; where a subset has a point the full plan lacks, :func:`byoc_hetero.quantize` runs
   for that subset instead);
2. **unit times**: f32 and bf16 as the bf16 level times them (each node alone as a one-node region,
   :func:`.precision.measure_unit_times`); int8 likewise, on the node the layer became in the
   all-int8 partition (its int8 weights and scales, quantize / dequantize steps not included),
   through the timing cache under a key without the scale values (they do not change the time);
3. **sensitivity**: when the all-int8 build misses the tolerance, each unit's error alone in int8
   (the others float32) and, when bf16 is asked, alone in bf16, largest time gain first;
4. **search**: :func:`.solver.solve` over three choices per unit, the fastest mix whose summed
   errors fit the tolerance, each mix built and measured with the budget rescaled (as the bf16 level);
5. **check**: the candidates (all int8, all bf16, the mix) are run on the held-out inputs and kept
   only within the tolerance there; the kept ones and the float32 plans are timed end to end,
   alternating, the fastest wins, the default float32 plan unless another is measured faster.

int8 is one choice of the precision level (:class:`.levels.PrecisionLevel` reads it from the
backend's variants and knob, as bf16); this module holds what that choice needs: the quantizer, the
layer-to-node maps, the int8 unit times and the three-way search. Layers are matched to a
partition's nodes by content (:func:`layer_keys`: the node whose weight constant is made from the
layer's weight, float, folded or quantized; the region documents carry each constant's digest), not
by order: the zoo ResNet-50's float partition lists each stage's shortcut conv before the block's
third conv, the quantizer (program order) after it, so the order match paired those layers with each
other's nodes (same op, same count: silently), while its all-int8 partition keeps program order; and
one layer without a node of its own made the whole int8 choice skipped. A layer that became no node
of its own keeps float32 (the report counts them); where none did, the int8 candidates are skipped
with a note saying why. Below VNNI the backend says int8 runs as float32 between Q/DQ steps (its
knob's ``native``): the level then leaves int8 out, as bf16 without native bf16.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tvm

from .cache import TimingCache, signature
from .measure import time_cached
from .node_maps import NodeMaps
from .plan_errors import PlanErrors, inputs_digest, settings_digest
from .plans import (ANCHOR_OPS, Built, OneNode, PlanResult, PrecisionReport, PrecisionUnit, Session, anchor_nodes,
                    constant_tensors, float32_plans, held_out_candidates, make_units, measure_unit_times,
                    node_signature, partition_with_node_precisions, pick, precision_regions, timed_graphs, warn_unmet)
from .edges import FLOAT, UnitEdges, domain, edge_cost, measure_edge_costs, unit_edges
from .solver import Choice, Problem, Region, improve, solve

#: the attrs of an int8 node that hold quantization values: not part of its timing key
_SCALE_ATTRS = ("src_scale", "src_zero_point", "weight_scales", "dst_scale", "dst_zero_point", "precision")
#: rounds of the mix search (three choices per unit: more than the bf16 level's four)
SEARCH_ROUNDS = 8
_LAYER_NODE_OPS = {"conv2d": ("conv2d",), "matmul": ("dense", "matmul")}


class MatchError(ValueError):
    """The quantizer's layers and a partition's conv2d / dense / matmul nodes do not correspond."""


class Quantizer:
    """The model's quantization plan, calibrated once; :meth:`module` writes the QDQ module of any
    subset of layers from those ranges (uint8 activations, per-channel s8 weights, min-max ranges:
    :func:`byoc_hetero.quantize`'s defaults)."""

    def __init__(self, mod: tvm.IRModule, params: Mapping[str, np.ndarray] | None,
                 calibration: Sequence[Sequence[np.ndarray]], cache: TimingCache | None = None, model: str = ""):
        from ..quant.fold_batch_norms import fold_batch_norms
        from ..quant.plan import activation_qparams, plan, tensor_index

        # As bh.quantize does: each inference batch norm folded into its conv first. Without it every
        # int8 conv of ResNet-50 was followed by a float batch norm and its reorders (session 5, quiet:
        # the tuner's 40 int8 + 14 bf16 mix 18.9 ms, 40 batch_norm + 33 reorder steps = 6.8 ms of it,
        # against 5.5 ms for the same mix through bh.quantize and 5.4 ms all bf16).
        func, folded = fold_batch_norms(mod["main"], dict(params or {}))
        if func is not mod["main"]:
            mod = mod.clone()
            mod["main"] = func
        self.mod, self.params, self.samples = mod, folded, list(calibration)
        self.original = dict(params or {})  # the weights before the batch norms were folded
        # what the QDQ modules are made from (the model, the inputs its ranges come from): the key of the
        # partitions' node maps in the cache (:mod:`.node_maps`); None without a cache
        self.identity = {"model": model, "inputs": inputs_digest(self.samples)} if cache is not None and model else None
        full, _ = plan(func, set(self.params), None)
        self.layers = full.layers
        self.qparams: dict = {}
        if not self.layers:
            return
        order = {p: -len(func.params) + i for i, p in enumerate(func.params)} | tensor_index(func)
        observed = sorted(set(full.points.values()), key=lambda v: order[v])
        key = signature("int8_ranges", attrs=self.identity or {})
        ranges = cache.get_value(key) if self.identity else None
        if ranges is None or len(ranges) != len(observed):
            ranges = self._observe(observed)
            if self.identity:
                cache.put_value(key, ranges)
        for var, (lo, hi) in zip(observed, ranges):
            scale, zp = activation_qparams(lo, hi, "uint8")
            self.qparams[var] = (scale, zp, "uint8")

    @functools.cached_property
    def digests(self) -> dict[str, int]:
        """Content digest (the region documents' constant ``digest``) -> layer index, for each form
        a layer's weight may take in a partition: as given, with its batch norm folded in, quantized
        (per-channel s8), each 2-D one transposed too. A digest two layers share (tied weights) is
        left out: those layers are matched as weightless ones."""
        from .._native import _C
        from ..quant.plan import weight_qparams

        found: dict[str, set[int]] = {}
        for layer in self.layers:
            if layer.weight is None or layer.weight not in self.params:
                continue
            w = np.asarray(self.params[layer.weight], np.float32)
            forms = [w, weight_qparams(w, layer.weight_axis)[0]]
            if layer.weight.endswith("_bn") and layer.weight[:-3] in self.original:
                forms.append(np.asarray(self.original[layer.weight[:-3]]))
            for form in forms:
                for arr in (form, form.T) if form.ndim == 2 else (form,):
                    found.setdefault(str(_C.digest(np.ascontiguousarray(arr))), set()).add(layer.index)
        return {d: next(iter(s)) for d, s in found.items() if len(s) == 1}

    def _observe(self, observed: list) -> list[list[float]]:
        """The min-max range of each ``observed`` value over the calibration samples: the model
        built for llvm with those values as outputs, run on each sample (the int8 level's slowest
        step on a warm cache before the ranges were kept there: 4 ResNet-50 calls on llvm)."""
        from ..quant.calibrate import Observations, build_observer, run_observer

        vm = build_observer(self.mod, self.params, observed, "llvm")
        stats = Observations([v.name for v in observed], keep_samples=False)
        for sample in self.samples:
            stats.add(run_observer(vm, sample)[1])
        return [[float(x) for x in stats.range(i, "minmax", 100.0)] for i in range(len(observed))]

    def module(self, int8: set[int]) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
        """The model with the layers of index ``int8`` quantized, the others float32."""
        from ..quant import quantize
        from ..quant.insert_qdq import insert_qdq, replaced_weights
        from ..quant.plan import plan

        func = self.mod["main"]
        keep = lambda layer: layer.index not in int8  # noqa: E731
        the_plan, _ = plan(func, set(self.params), keep)
        if any(v not in self.qparams for v in the_plan.points.values()):
            q = quantize(self.mod, self.params, self.samples, keep_float=keep, verbose=False)
            return q.mod, dict(q.params)
        new_func, values, _ = insert_qdq(func, the_plan, self.qparams, self.params, True)
        out = self.mod.clone()
        out["main"] = new_func
        gone = replaced_weights(func, new_func)
        return out, {k: v for k, v in self.params.items() if k not in gone} | values


def _weight_source(graph: Mapping[str, Any], node: Mapping[str, Any], known: set[int]) -> str | None:
    """The content digest of the constant node ``node``'s weight (its second input) is made from:
    traced back through the nodes that compute from constants alone (a batch norm folded into the
    weights, a dequantize of int8 weights) to their first input; None for a weight known only at
    run time (a matmul of two activations)."""
    if len(node["inputs"]) < 2 or node["inputs"][1] not in known:
        return None
    digests = {c["tensor"]: c.get("digest") for c in graph.get("constants", [])}
    producers = {n["output"]: n for n in graph["nodes"]}
    tensor = node["inputs"][1]
    while tensor not in digests and tensor in producers and producers[tensor]["inputs"]:
        tensor = producers[tensor]["inputs"][0]
    return digests.get(tensor)


def _anchors(partitioned: tvm.IRModule) -> list[tuple[str, str, bool, str | None]]:
    """``(node key, op, is int8, weight digest)`` of every conv2d / dense / matmul of the regions
    whose backend has a precision knob, in order."""
    found = []
    for symbol, graph, knob in precision_regions(partitioned):
        known = constant_tensors(graph)
        for i, node in enumerate(graph.get("nodes", [])):
            if node["op"] in ANCHOR_OPS:
                found.append((knob.key(symbol, i), node["op"], "src_scale" in node.get("attrs", {}),
                              _weight_source(graph, node, known)))
    return found


def _fits(layer: Any, op: str) -> bool:
    return op in _LAYER_NODE_OPS.get(layer.op, ())


def layer_keys(partitioned: tvm.IRModule, quantizer: "Quantizer", int8: set[int]
               ) -> tuple[dict[int, str], dict[int, str]]:
    """Which node each layer became in ``partitioned`` (the model with layers ``int8`` quantized):
    ``(float layer index -> node key, int8 layer index -> node key)``.

    Matched by content (:attr:`Quantizer.digests`: a node whose weight is made from a layer's
    weight, float, folded or quantized, is that layer's), which no pass changes; the layers without
    a weight (a matmul of two activations) are matched by order and op among the nodes left, where
    their counts agree. A layer that became no node of its own (fused into another, left to llvm)
    is in neither map: it keeps float32."""
    by_index = {lyr.index: lyr for lyr in quantizer.layers}
    out: tuple[dict[int, str], dict[int, str]] = ({}, {})
    rest: tuple[list, list] = ([], [])
    for key, op, quantized, digest in _anchors(partitioned):
        layer = by_index.get(quantizer.digests.get(digest, -1))
        if layer is not None and (layer.index in int8) == quantized and _fits(layer, op) \
                and layer.index not in out[quantized]:
            out[quantized][layer.index] = key
        elif digest is None:
            rest[quantized].append((key, op))
    for quantized in (False, True):
        wanted = [lyr for lyr in quantizer.layers if lyr.weight is None and (lyr.index in int8) == quantized]
        mine = rest[quantized]
        if len(mine) == len(wanted) and all(_fits(lyr, op) for lyr, (_, op) in zip(wanted, mine)):
            out[quantized].update({lyr.index: key for lyr, (key, _) in zip(wanted, mine)})
    return out


def int8_timing_key(graph: Mapping[str, Any], index: int) -> str:
    """The timing-cache key of an int8 node: op, shapes, dtypes, attrs without the scale values."""
    attrs = {k: v for k, v in graph["nodes"][index].get("attrs", {}).items() if k not in _SCALE_ATTRS}
    return node_signature(graph, index, attrs, "int8")


def measure_int8_times(units: Sequence[PrecisionUnit], layer_of: Mapping[str, int], timing_keys: Mapping[int, str],
                       locate: Callable[[int], tuple[Mapping[str, Any], int]], cache: TimingCache,
                       repeat: int = 15) -> None:
    """Each unit's int8 seconds per call: its layers' int8 nodes (``timing_keys``: layer index ->
    :func:`int8_timing_key`), each alone as a one-node region (:class:`.precision.OneNode`, random
    data of its dtypes), through ``cache``; ``locate(layer)`` gives the node's region document and
    index, asked only for a node to time (:attr:`AllInt8.nodes`)."""
    from ..errors import first_line

    for unit in units:
        total = 0.0
        try:
            for key in unit.keys:
                layer = layer_of[key]
                if layer not in timing_keys:
                    raise ValueError(f"layer {layer} is no int8 node of its own in the all-int8 partition")
                total += time_cached(cache, timing_keys[layer], lambda: OneNode(*locate(layer), "f32"),
                                     repeat).median_s
            unit.times["int8"] = total
        except (RuntimeError, ValueError) as err:
            unit.unmeasured = f"int8 could not be timed alone: {first_line(err)}"


class AllInt8:
    """The all-int8 partition, made when first needed, and where each layer's int8 node is in it."""

    def __init__(self, session: Session, quantizer: Quantizer, layers: set[int]):
        from ..stages import partition

        self.quantizer, self.layers = quantizer, set(layers)
        self.built = Built(lambda: partition(*quantizer.module(self.layers), target=session.targets,
                                             options=session.options))

    @functools.cached_property
    def nodes(self) -> dict[int, tuple[Mapping[str, Any], int]]:
        """Layer index -> (region document, node index) of its int8 node (a layer whose int8 form
        is no node of its own is left out)."""
        from .._relax import region_table

        _, keys = layer_keys(self.built.module, self.quantizer, self.layers)
        graphs = {symbol: entry.graph for symbol, entry in region_table(self.built.module).items()}
        return {i: (graphs[k.rpartition("#")[0]], int(k.rpartition("#")[2])) for i, k in keys.items()}

    def timing_keys(self, maps: NodeMaps) -> dict[int, str]:
        """Layer index -> timing-cache key of its int8 node: from ``maps`` (a warm cache: the
        partition is not made), else worked out from the partition."""
        return maps.get("int8 timing", self.layers,
                        lambda: {i: int8_timing_key(g, n) for i, (g, n) in self.nodes.items()})


class MixBuilder:
    """Builds a plan given as layer index -> ``"f32"`` / ``"bf16"`` / ``"int8"``."""

    def __init__(self, session: Session, quantizer: Quantizer, float_keys: Mapping[int, str], maps: NodeMaps):
        self.session, self.quantizer, self.float_keys, self.maps = session, quantizer, dict(float_keys), maps

    def build(self, assignment: Mapping[int, str]) -> Built:
        """The plan ``assignment``, partitioned and built when first used (:class:`.precision.Built`)."""
        return Built(lambda: self._partition(assignment))

    def _partition(self, assignment: Mapping[int, str], retry: bool = True) -> tvm.IRModule:
        """The mix's module. With bf16 layers, their nodes are named by key in ``node_precisions``:
        the keys of the mix's float nodes come from :attr:`maps` (else from the mix partitioned
        without bf16 first), and are checked against the module made with them."""
        from ..stages import partition

        int8 = {i for i, p in assignment.items() if p == "int8"}
        if not int8:
            return self.session.build({self.float_keys[i]: p for i, p in assignment.items()}).module
        qmod, qparams = self.quantizer.module(int8)
        targets, options = self.session.targets, {k: dict(v) for k, v in self.session.options.items()}
        if "bf16" not in assignment.values():
            return partition(qmod, qparams, target=targets, options=options)
        floats = self.maps.get("float", int8, lambda: layer_keys(partition(qmod, qparams, target=targets,
                                                                           options=options), self.quantizer, int8)[0])
        skipped: dict[str, str] = {}
        mixed = partition_with_node_precisions(qmod, qparams, {key: assignment[i] for i, key in floats.items()},
                                               targets=targets, options=options, skipped=skipped)
        if self.maps.check("float", int8, floats, layer_keys(mixed, self.quantizer, int8)[0]) or not retry:
            self.session.skipped.update(skipped)
            return mixed
        return self._partition(assignment, retry=False)  # a stored map the module contradicted: replaced


def unit_layers(unit: PrecisionUnit, layer_of: Mapping[str, int]) -> list[int]:
    return [layer_of[k] for k in unit.keys]


def assignment_of(units: Sequence[PrecisionUnit], layer_of: Mapping[str, int], chosen: Mapping[str, str]
                  ) -> dict[int, str]:
    """Layer index -> precision, from unit name -> precision."""
    return {i: chosen[u.name] for u in units for i in unit_layers(u, layer_of)}


def plan_result(name: str, units: Sequence[PrecisionUnit], assignment: Mapping[int, str],
                layer_of: Mapping[str, int], built: Built, errors: PlanErrors) -> PlanResult:
    """A measured plan: its table (float node key -> precision), calibration error (through the
    cache: :mod:`.plan_errors`) and modelled time."""
    table = {k: assignment[layer_of[k]] for u in units for k in u.keys}
    modelled = sum(u.times.get(assignment[layer_of[u.keys[0]]], math.nan) for u in units)
    return PlanResult(name, table, errors.error(table, "calibration", built), modelled_s=modelled, built=built)


def measure_sensitivities(units: Sequence[PrecisionUnit], ctx: "Int8Context", report: PrecisionReport) -> None:
    """Each unit's calibration error alone in int8 and (when asked) alone in bf16, the others
    float32; largest time gain first; a precision not faster than f32 is not built; the budget
    may cut the rest (they stay float32)."""
    gains = []
    for unit in units:
        faster = [p for p in ("int8", "bf16") if p in report.precisions and unit.times.get(p, math.inf)
                  < unit.times["f32"]]
        gains += [(unit.times[p] - unit.times["f32"], unit, p) for p in faster if p not in unit.errors]
        if not faster:
            unit.unmeasured = unit.unmeasured or "no precision faster than f32 alone"
    gains.sort(key=lambda g: g[0])
    for i, (_, unit, p) in enumerate(gains):
        if ctx.session.left_s() <= 0:
            report.search_cut = True
            report.notes.append(f"budget_s ran out after {i} of {len(gains)} sensitivities: the others stay float32")
            for _, rest, _ in gains[i:]:
                rest.unmeasured = rest.unmeasured or "search cut"
            return
        assignment = {i_: "f32" for i_ in ctx.layers} | {i_: p for i_ in unit_layers(unit, ctx.layer_of)}
        table = {k: assignment[i_] for k, i_ in ctx.layer_of.items()}
        error = ctx.session.errors.error(table, "calibration", ctx.builder.build(assignment))
        unit.errors[p] = error
        if p == "bf16":
            unit.error = error
        ctx.session.say(f"sensitivity {i + 1}/{len(gains)} {unit.name} in {p}: error {error:.2g}")


def problem_of(units: Sequence[PrecisionUnit], edges: UnitEdges | None = None,
               edge_costs: Mapping[tuple[str, str, int], float] | None = None) -> Problem:
    """The solver's view: per unit f32 (no error) and each precision whose error was measured;
    with ``edges`` and their measured ``edge_costs`` (:mod:`.edges`), each choice runs in its
    precision's domain and every tensor crossing between the int8 and the float domain costs a
    conversion (without them, units add up alone, as before session 5)."""
    regions = []
    for u in units:
        choices = [Choice("f32", FLOAT, u.times["f32"])]
        choices += [Choice(p, domain(p), u.times[p], e) for p, e in u.errors.items() if p in u.times]
        ins, outs = (edges.inputs.get(u.name, ()), edges.outputs.get(u.name, ())) if edges else ((), ())
        regions.append(Region(u.name, choices, list(ins), list(outs)))
    if edges is None or edge_costs is None:
        return Problem(regions, {}, lambda src, dst, nbytes: 0.0, input_device=FLOAT)
    return Problem(regions, edges.elements, edge_cost(edge_costs), edges.model_inputs, edges.model_outputs,
                   input_device=FLOAT)


class Int8Context:
    """What the int8 search shares: the builder, the layers, the node key -> layer map and the
    int8 / float edges between units with their measured conversions (:mod:`.edges`)."""

    def __init__(self, session: Session, builder: MixBuilder, layers: Sequence[int], layer_of: Mapping[str, int]):
        self.session, self.builder, self.layers, self.layer_of = session, builder, list(layers), dict(layer_of)
        self.edges: UnitEdges | None = None
        self.edge_costs: dict[tuple[str, str, int], float] | None = None


def _next_budget(budget: float, measured: float, tolerance: float, lo: float, hi: float) -> float:
    """Between the largest budget whose mix met the tolerance (``lo``) and the smallest whose mix
    missed (``hi``): their geometric mean once both are known, else rescaled by what was measured."""
    if lo > 0 and math.isfinite(hi):
        return math.sqrt(lo * hi)
    if measured > tolerance:
        return budget * 0.8 * tolerance / measured
    return budget * (4.0 if measured == 0 else min(4.0, max(2.0, tolerance / measured)))


def with_edges(units: Sequence[PrecisionUnit], ctx: Int8Context, solution: Any, budget: float) -> Any:
    """``solution`` (the solver's, units alone) improved with the int8 / float edges counted
    (:func:`.solver.improve` from it and from all float32; the faster), or as it is without edges."""
    if ctx.edges is None or ctx.edge_costs is None:
        return solution
    problem = problem_of(units, ctx.edges, ctx.edge_costs)
    starts = [solution.choices] if solution.error <= budget else []
    starts.append({r.name: r.choices[0] for r in problem.regions})  # all f32: no error, always a start
    return min((improve(problem, start, budget) for start in starts), key=lambda s: s.time_s)


def search(units: Sequence[PrecisionUnit], ctx: Int8Context, tolerance: float,
           report: PrecisionReport) -> PlanResult | None:
    """The fastest mix found whose real calibration error is within ``tolerance`` (None: none).

    The solver bounds the *summed* unit errors, which overstate or understate a mix's real error,
    so each mix is built and measured and the error budget searched for: raised after a mix that
    met the tolerance, lowered after one that missed, bisected once both are known, for up to
    :data:`SEARCH_ROUNDS` rounds (a mix met twice is measured once)."""
    problem, budget, seen, best = problem_of(units), tolerance, {}, None
    lo, hi = 0.0, math.inf
    for _ in range(SEARCH_ROUNDS):
        left = ctx.session.left_s()
        solution = solve(problem, budget, budget_s=None if math.isinf(left) else max(left, 1e-3))
        report.search_cut |= not solution.exact and any("budget" in n for n in solution.notes)
        solution = with_edges(units, ctx, solution, budget)
        assignment = assignment_of(units, ctx.layer_of, {n: c.name for n, c in solution.choices.items()})
        frozen = frozenset(assignment.items())
        if set(assignment.values()) == {"f32"}:
            measured = 0.0
        elif frozen not in seen:
            plan = plan_result("tuned mix", units, assignment, ctx.layer_of, ctx.builder.build(assignment),
                               ctx.session.errors)
            plan.modelled_s = solution.time_s  # the unit times and the int8 / float edges it implies
            ctx.session.say(f"mix {plan.text()} (summed unit errors {solution.error:.2g}, budget {budget:.2g})")
            seen[frozen] = plan.calibration_error
            if plan.calibration_error <= tolerance and (best is None or plan.modelled_s < best.modelled_s):
                best = plan
        measured = seen.get(frozen, 0.0)
        lo, hi = (max(lo, budget), hi) if measured <= tolerance else (lo, min(hi, budget))
        if hi < 1.1 * lo or ctx.session.left_s() <= 0:
            report.search_cut |= ctx.session.left_s() <= 0
            break
        budget = _next_budget(budget, measured, tolerance, lo, hi)
    return best


def _fastest_each(units: Sequence[PrecisionUnit], ctx: Int8Context, asked: Sequence[str]) -> PlanResult | None:
    """When all int8 is within the tolerance: each unit takes its fastest measured precision (one
    build checks the mix); None when that is all int8 already."""
    chosen = {u.name: min((p for p in asked if p in u.times), key=lambda p: u.times[p]) for u in units}
    for u in units:
        u.unmeasured = u.unmeasured or "all int8 is within the tolerance"
    assignment = assignment_of(units, ctx.layer_of, chosen)
    if len(set(assignment.values())) == 1:  # all int8 is a candidate already; all f32 the default
        return None
    return plan_result("tuned mix", units, assignment, ctx.layer_of, ctx.builder.build(assignment),
                       ctx.session.errors)


def _candidates(report: PrecisionReport, ctx: Int8Context, candidates: list[PlanResult]) -> list[PlanResult]:
    """:func:`.precision.held_out_candidates` with the int8 level's mix (``candidates``: all int8
    first, all bf16 when asked): each unit's fastest precision when all int8 is within the target,
    else the sensitivities and the search."""

    def find_mix(target: float) -> PlanResult | None:
        if candidates[0].calibration_error <= target:
            report.notes.append("all int8 is within the tolerance on the calibration inputs: each unit takes its "
                                "fastest precision, and the units' own sensitivities were not measured")
            return _fastest_each(report.units, ctx, report.precisions)
        measure_sensitivities(report.units, ctx, report)
        return search(report.units, ctx, target, report)

    return held_out_candidates(report, candidates, find_mix, ctx.session.errors)


def _units(report: PrecisionReport, session: Session, quantizer: Quantizer, base: tvm.IRModule,
           max_units: int, maps: NodeMaps) -> tuple[dict[int, str], AllInt8, dict[int, str]]:
    """The units (layer groups, over the float nodes of ``base`` a layer became), the layers' node
    keys in the float partition, the all-int8 partition of those layers (lazy) and its int8 nodes'
    timing keys: a :class:`MatchError` where no layer became a node of its own (a layer that did
    not keeps float32, and a note says how many)."""
    float_keys, _ = layer_keys(base, quantizer, set())
    if not float_keys:
        raise MatchError(f"none of the {len(quantizer.layers)} conv2d/matmul layers is a conv2d/dense/matmul node "
                         "of its own in a region with a precision knob (left to llvm, or fused into another node)")
    left = [lyr.name for lyr in quantizer.layers if lyr.index not in float_keys]
    if left:
        report.notes.append(f"{len(left)} of {len(quantizer.layers)} layers are no conv2d/dense/matmul node of their "
                            f"own in the float partition and keep float32 ({', '.join(left[:6])}"
                            f"{', ...' if len(left) > 6 else ''})")
    all_int8 = AllInt8(session, quantizer, set(float_keys))
    timing_keys = all_int8.timing_keys(maps)
    labels = dict(anchor_nodes(base))
    report.units = make_units([(float_keys[lyr.index], labels.get(float_keys[lyr.index], lyr.name))
                               for lyr in quantizer.layers if lyr.index in float_keys], max_units)
    return float_keys, all_int8, timing_keys


def _time_units(report: PrecisionReport, ctx: Int8Context, graphs: Mapping[str, Any], int8_keys: Mapping[int, str],
                all_int8: AllInt8, cache: TimingCache, repeat: int) -> None:
    floats = [p for p in ("f32", "bf16") if p in report.precisions]
    measure_unit_times(report.units, graphs, cache, repeat, floats)
    measure_int8_times(report.units, ctx.layer_of, int8_keys, lambda layer: all_int8.nodes[layer], cache, repeat)
    for unit in report.units:  # a unit that could not be timed in int8 stays out of int8
        unit.times.setdefault("f32", 0.0)
    _measure_edges(report, ctx, graphs, cache, repeat)
    cache.save()


def _measure_edges(report: PrecisionReport, ctx: Int8Context, graphs: Mapping[str, Any], cache: TimingCache,
                   repeat: int) -> None:
    """The tensors between units in the float partition (``graphs``) and each size's quantize and
    dequantize time (:mod:`.edges`), for the search to count what a mix's int8 / float edges cost."""
    from ..errors import first_line

    try:
        ctx.edges = unit_edges({u.name: u.keys for u in report.units}, graphs)
        ctx.edge_costs = measure_edge_costs(ctx.edges.sizes(), cache, repeat)
    except (RuntimeError, ValueError, KeyError) as err:
        ctx.edges = ctx.edge_costs = None
        report.notes.append(f"int8 / float edges not counted (units add up alone): {first_line(err)}")
        return
    largest = max(ctx.edges.sizes(), default=0)
    if largest:
        report.notes.append(
            f"int8 / float edges counted: {len(ctx.edges.elements)} tensors between units, a conversion of the "
            f"largest ({largest} elements) measured at quantize {ctx.edge_costs[(FLOAT, 'int8', largest)] * 1e6:.1f} "
            f"µs, dequantize {ctx.edge_costs[('int8', FLOAT, largest)] * 1e6:.1f} µs")


def _all_of(precision: str, report: PrecisionReport, ctx: Int8Context, built: Built | None = None) -> PlanResult:
    assignment = {i: precision for i in ctx.layers}
    built = built or ctx.builder.build(assignment)
    return plan_result(f"all {precision}", report.units, assignment, ctx.layer_of, built, ctx.session.errors)


def choose_with_int8(report: PrecisionReport, session: Session, default: tvm.IRModule, base: tvm.IRModule,
                     calibration: list, holdout: list, *, cache: TimingCache | None, rounds: int, repeat: int,
                     max_units: int, skipped: Mapping[str, str]) -> tuple[PlanResult | None, PrecisionReport]:
    """The precision level with int8 among the precisions (module docstring): the plan kept (None:
    nothing to choose) and ``report``. ``session`` builds float plans (the algorithm level's
    options, the codegen level's map); ``default`` is the reference float32 partition, ``base`` the
    float32 partition the candidates' float nodes are keyed on; ``skipped`` the precisions asked
    that no unit may take here, and why."""
    if "bf16" in report.precisions and skipped.get("bf16"):
        report.precisions = tuple(p for p in report.precisions if p != "bf16")
        report.notes.append(f"bf16 candidates skipped: {skipped['bf16']}")
    cache = cache if cache is not None else TimingCache(None)  # not `or`: an empty cache is falsy (len 0)
    quantizer = Quantizer(session.mod, session.params, calibration, cache, session.model_digest())
    if not quantizer.layers:
        report.notes.append("int8 candidates skipped: no conv2d or matmul layer to quantize")
        return None, report
    if skipped.get("int8"):
        report.notes.append(f"int8 candidates skipped: {skipped['int8']}")
        return None, report
    maps = NodeMaps(cache, quantizer.identity, settings_digest(session.targets, session.options, None))
    try:
        float_keys, all_int8, int8_keys = _units(report, session, quantizer, base, max_units, maps)
    except MatchError as err:
        report.notes.append(f"int8 candidates skipped: {err}")
        return None, report
    float_plans = float32_plans(session, default, calibration, holdout, cache)
    ctx = Int8Context(session, MixBuilder(session, quantizer, float_keys, maps),
                      sorted(float_keys), {k: i for i, k in float_keys.items()})
    _time_units(report, ctx, timed_graphs(session, float_plans, base, cache), int8_keys, all_int8, cache, repeat)
    candidates = [_all_of("int8", report, ctx, all_int8.built)]
    if "bf16" in report.precisions:
        candidates.append(_all_of("bf16", report, ctx))
    session.say(f"{len(report.units)} units timed; " + ", ".join(
        f"{c.name}: calibration error {c.calibration_error:.2g}" for c in candidates))
    valid = _candidates(report, ctx, candidates)
    report.plans = float_plans + candidates
    if not valid:
        warn_unmet(report, report.tolerance)
    best = pick(report, float_plans, valid, calibration[0], rounds, repeat, session.errors)
    cache.save()
    for unit in report.units:
        got = {best.table.get(k, "f32") for k in unit.keys} if best.table else {"f32"}
        unit.chosen = got.pop() if len(got) == 1 else "mixed"
    report.notes.extend(n for n in [session.skipped_note()] if n)
    return best, report
