"""The int8 choice of the precision level: the plan space where a unit may also be quantized.

``bh.tune(mod, params, precisions=("f32", "bf16", "int8"), tolerance=..., calibration=[...])``
decides per *unit* among the precisions asked, with the precision level's one search
(:func:`.precision.choose_precisions`: sensitivities, :func:`.solver.solve`, the held-out check,
the end-to-end pick). int8 is one of the backend's variants of level ``precision`` (read through
its knob as bf16 is: :func:`.plans.precision_choices`); what differs is how a plan that takes it is
made, and this module makes it (:class:`QuantizedSpace`, what the search asks of a space):

* a layer in int8 gets quantize / dequantize pairs around it (the QDQ form) from this project's
  post-training quantizer (:func:`byoc_hetero.quantize`), which the backend's int8 region passes
  turn into an int8 kernel; a layer's three forms are two modules: bf16 is a per-node option of
  the float partition (the knob's option), int8 a different Relax module;
* **calibration once** (:class:`Quantizer`): the float model runs the calibration inputs once with
  every quantization point observed; the QDQ module of any subset of layers is then written from
  those ranges without running the model again (a subset's points are the full plan's, and so are
  their ranges; where a subset has a point the full plan lacks, :func:`byoc_hetero.quantize` runs
  for that subset instead);
* **units** are the quantizer's layers (each conv2d and matmul) that became a node of their own,
  grouped as the float choices' nodes are (:func:`.plans.make_units`);
* **unit times**: f32 and bf16 as for the float choices (each node alone as a one-node region,
  :func:`.plans.measure_unit_times`); int8 likewise, on the node the layer became in the all-int8
  partition (its int8 weights and scales, quantize / dequantize steps not included), through the
  timing cache under a key without the scale values (they do not change the time); and the
  tensors between units, each size's quantize / dequantize timed (:mod:`.edges`), which the
  search counts between an int8 unit and a float one.

Layers are matched to a partition's nodes by content (:func:`layer_keys`: the node whose weight
constant is made from the layer's weight, float, folded or quantized; the region documents carry
each constant's digest), not by order: the zoo ResNet-50's float partition lists each stage's
shortcut conv before the block's third conv, the quantizer (program order) after it, so the order
match paired those layers with each other's nodes (same op, same count: silently), while its
all-int8 partition keeps program order; and one layer without a node of its own made the whole
int8 choice skipped. A layer that became no node of its own keeps float32 (the report counts
them); where none did, the int8 candidates are skipped with a note saying why. Below VNNI the
backend says int8 runs as float32 between Q/DQ steps (its knob's ``native``): the level then
leaves int8 out, as bf16 without native bf16.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tvm

from .cache import TimingCache, signature
from .edges import FLOAT, INT8, UnitEdges, measure_edge_costs, unit_edges
from .measure import time_cached
from .node_maps import NodeMaps
from .plan_errors import inputs_digest, settings_digest
from .plans import (Built, OneNode, PrecisionReport, PrecisionUnit, Session, anchor_nodes, constant_tensors,
                    layer_kinds, make_units, measure_unit_times, node_places, node_signature,
                    partition_with_node_precisions, precision_regions)
from .solver import BisectedBudget

#: the attrs of an int8 node that hold quantization values: not part of its timing key
_SCALE_ATTRS = ("src_scale", "src_zero_point", "weight_scales", "dst_scale", "dst_zero_point", "precision")


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
        built for llvm with those values as outputs, run on each sample (the int8 choice's slowest
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


def _anchors(partitioned: tvm.IRModule) -> list[tuple[str, tuple[str, ...], bool, str | None]]:
    """``(node key, the layer kinds it may be, is int8, weight digest)`` of every conv2d / dense /
    matmul of the regions whose backend has a precision knob, in order; the layer kinds are what
    the region's backend declares for the node's op (:func:`.plans.layer_kinds`)."""
    found, kinds = [], layer_kinds(partitioned)
    for symbol, graph, knob, ops in precision_regions(partitioned):
        known, keys = constant_tensors(graph), knob.keys(symbol, graph)
        for i, node in enumerate(graph.get("nodes", [])):
            if node["op"] in ops and keys[i] is not None:
                found.append((keys[i], kinds[symbol].get(node["op"], ()), "src_scale" in node.get("attrs", {}),
                              _weight_source(graph, node, known)))
    return found


def _fits(layer: Any, kinds: tuple[str, ...]) -> bool:
    """Whether a node that may be a layer of ``kinds`` can be ``layer``."""
    return layer.op in kinds


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
    for key, kinds, quantized, digest in _anchors(partitioned):
        layer = by_index.get(quantizer.digests.get(digest, -1))
        if layer is not None and (layer.index in int8) == quantized and _fits(layer, kinds) \
                and layer.index not in out[quantized]:
            out[quantized][layer.index] = key
        elif digest is None:
            rest[quantized].append((key, kinds))
    for quantized in (False, True):
        wanted = [lyr for lyr in quantizer.layers if lyr.weight is None and (lyr.index in int8) == quantized]
        mine = rest[quantized]
        if len(mine) == len(wanted) and all(_fits(lyr, kinds) for lyr, (_, kinds) in zip(wanted, mine)):
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
        graphs = {symbol: entry.graph for symbol, entry in region_table(self.built.module).items() if entry.graph}
        places = node_places(keys.values(), graphs)
        return {i: (graphs[places[k][0]], places[k][1]) for i, k in keys.items() if k in places}

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


class QuantizedSpace:
    """The precision level's plan space with int8 among the choices: the units are the quantizer's
    layers that became a float node of their own, grouped; a plan (layer index -> precision) is the
    QDQ module of its int8 layers, partitioned with its bf16 nodes named (:class:`MixBuilder`).

    What the level's one search (:func:`.precision.choose_precisions`) asks of a space:
    :attr:`units`, :attr:`layers` and :attr:`layer_of` (node key -> layer index), :meth:`build`,
    :meth:`prebuilt`, :meth:`time_units`, :attr:`edges` / :attr:`edge_costs` (the int8 / float
    conversions between units, :mod:`.edges`) and :meth:`schedule` (how the error budget is
    searched: bisected, :class:`.solver.BisectedBudget`)."""

    def __init__(self, session: Session, quantizer: Quantizer, float_keys: Mapping[int, str], all_int8: AllInt8,
                 int8_keys: Mapping[int, str], maps: NodeMaps, units: list[PrecisionUnit]):
        self.session, self.all_int8, self.int8_keys, self.units = session, all_int8, dict(int8_keys), units
        self.builder = MixBuilder(session, quantizer, float_keys, maps)
        self.layers = sorted(float_keys)
        self.layer_of = {k: i for i, k in float_keys.items()}
        self.edges: UnitEdges | None = None
        self.edge_costs: dict[tuple[str, str, int], float] | None = None

    def schedule(self) -> BisectedBudget:
        return BisectedBudget()

    def build(self, assignment: Mapping[int, str]) -> Built:
        """The plan ``assignment`` (layer index -> precision), built when first used."""
        return self.builder.build(assignment)

    def prebuilt(self, precision: str) -> Built | None:
        """The all-``precision`` plan where it is made already (all int8: the partition the int8
        nodes are timed on), else None."""
        return self.all_int8.built if precision == "int8" else None

    def time_units(self, report: PrecisionReport, graphs: Mapping[str, Any], cache: TimingCache,
                   repeat: int) -> None:
        """Each unit's f32 / bf16 time (its float nodes alone), int8 time (its int8 nodes alone) and
        the int8 / float edges between units with each size's conversion time."""
        floats = [p for p in ("f32", "bf16") if p in report.precisions]
        measure_unit_times(self.units, graphs, cache, repeat, floats)
        measure_int8_times(self.units, self.layer_of, self.int8_keys, lambda layer: self.all_int8.nodes[layer],
                           cache, repeat)
        for unit in self.units:  # a unit that could not be timed in int8 stays out of int8
            unit.times.setdefault("f32", 0.0)
        self._measure_edges(report, graphs, cache, repeat)
        cache.save()

    def _measure_edges(self, report: PrecisionReport, graphs: Mapping[str, Any], cache: TimingCache,
                       repeat: int) -> None:
        """The tensors between units in the float partition (``graphs``) and each size's quantize and
        dequantize time (:mod:`.edges`), for the search to count what a mix's int8 / float edges cost."""
        from ..errors import first_line

        try:
            self.edges = unit_edges({u.name: u.keys for u in self.units}, graphs)
            self.edge_costs = measure_edge_costs(self.edges.sizes(), cache, repeat)
        except (RuntimeError, ValueError, KeyError) as err:
            self.edges = self.edge_costs = None
            report.notes.append(f"int8 / float edges not counted (units add up alone): {first_line(err)}")
            return
        largest = max(self.edges.sizes(), default=0)
        if largest:
            report.notes.append(
                f"int8 / float edges counted: {len(self.edges.elements)} tensors between units, a conversion of the "
                f"largest ({largest} elements) measured at quantize "
                f"{self.edge_costs[(FLOAT, 'int8', largest)] * 1e6:.1f} µs, dequantize "
                f"{self.edge_costs[('int8', FLOAT, largest)] * 1e6:.1f} µs")


def _matched(report: PrecisionReport, session: Session, quantizer: Quantizer, base: tvm.IRModule,
             max_units: int, maps: NodeMaps) -> QuantizedSpace:
    """The space over the float nodes of ``base`` the layers became, the all-int8 partition of those
    layers (lazy) and its int8 nodes' timing keys: a :class:`MatchError` where no layer became a
    node of its own (a layer that did not keeps float32, and a note says how many)."""
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
    int8_keys = all_int8.timing_keys(maps)
    labels = dict(anchor_nodes(base))
    units = make_units([(float_keys[lyr.index], labels.get(float_keys[lyr.index], lyr.name))
                        for lyr in quantizer.layers if lyr.index in float_keys], max_units)
    return QuantizedSpace(session, quantizer, float_keys, all_int8, int8_keys, maps, units)


def quantized_space(report: PrecisionReport, session: Session, base: tvm.IRModule, calibration: list,
                    cache: TimingCache, max_units: int, skipped: Mapping[str, str]) -> QuantizedSpace | None:
    """The plan space with int8 among the choices (:class:`QuantizedSpace`; ``base``: the float32
    partition the float nodes are keyed on), or None with a note saying why int8 cannot apply here
    (no layer to quantize, the backend says int8 runs as another precision here: ``skipped``, no
    layer matched to a node of its own): the level then chooses among the float precisions."""
    other = [p for p in report.precisions if p in report.quantized and p != INT8]
    if other:  # a backend declares another precision applied by quantizing: not one this quantizer writes
        report.notes.append(f"{', '.join(other)} candidates skipped: the tuner's quantizer writes int8 only")
        report.precisions = tuple(p for p in report.precisions if p not in other)
    if INT8 not in report.precisions:
        return None
    quantizer = Quantizer(session.mod, session.params, calibration, cache, session.model_digest())
    if not quantizer.layers:
        report.notes.append("int8 candidates skipped: no conv2d or matmul layer to quantize")
        return None
    if skipped.get("int8"):
        report.notes.append(f"int8 candidates skipped: {skipped['int8']}")
        return None
    maps = NodeMaps(cache, quantizer.identity, settings_digest(session.targets, session.options, None))
    try:
        return _matched(report, session, quantizer, base, max_units, maps)
    except MatchError as err:
        report.notes.append(f"int8 candidates skipped: {err}")
        return None


__all__ = ["AllInt8", "MatchError", "MixBuilder", "QuantizedSpace", "Quantizer", "int8_timing_key", "layer_keys",
           "measure_int8_times", "quantized_space"]
