"""The plans of the precision level, shared by its one search (:mod:`.precision`) and its plan
spaces (the float choices' there, the quantized one of :mod:`.int8`): units and their anchor nodes,
a plan's build (:class:`Built`) and measured result (:func:`plan_result`), the session every
candidate build of one tune shares (:class:`Session`), one node timed alone (:class:`OneNode`),
the held-out check and the end-to-end pick (never slower than the default).

Moved here from ``precision.py`` (issue 38): ``int8.py`` and ``edges.py`` took these names, some
private, from it while it imported ``int8.py`` — a circle.
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import tvm
from tvm import relax

from .cache import Timing, TimingCache, signature
from .measure import time_cached
from .knobs import backends_with, knob_of, option_value, with_option
from .plan_errors import LazyOutputs, PlanErrors, settings_digest

PRECISION = "precision"


PRECISIONS = ("f32", "bf16")


MAX_UNITS = 16


class TuneWarning(UserWarning):
    """A tuning request could not be met as asked (e.g. no plan within the tolerance)."""


def _flatten(value: Any) -> list[np.ndarray]:
    if isinstance(value, (tvm.runtime.Tensor, np.ndarray)):
        return [value.numpy() if hasattr(value, "numpy") else value]
    return [a for v in value for a in _flatten(v)]


class Built:
    """A partitioned module built for llvm, ready to run samples. Given a function that makes the
    partitioned module, it is partitioned and built on first use only (a plan whose figures all
    come from the timing cache is never built, :mod:`.plan_errors`)."""

    def __init__(self, partitioned: tvm.IRModule | Callable[[], tvm.IRModule]):
        self._module = partitioned if isinstance(partitioned, tvm.IRModule) else None
        self._make = None if self._module is not None else partitioned
        self._vm = None

    @property
    def module(self) -> tvm.IRModule:
        if self._module is None:
            self._module = self._make()
        return self._module

    @property
    def vm(self) -> relax.VirtualMachine:
        if self._vm is None:
            self._vm = relax.VirtualMachine(relax.build(self.module, target="llvm"), tvm.cpu())
        return self._vm

    def run(self, samples: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
        """The outputs (flattened to arrays) of each sample."""
        return [_flatten(self.vm["main"](*[tvm.runtime.tensor(a) for a in s])) for s in samples]

    def caller(self, sample: Sequence[np.ndarray]):
        args = [tvm.runtime.tensor(a) for a in sample]
        return lambda: self.vm["main"](*args)


def _node_text(graph: Mapping[str, Any], node: Mapping[str, Any]) -> str:
    """A short description of an anchor node: its op and the shapes its speed depends on."""
    tensors = graph["tensors"]
    shapes = [tensors[t]["shape"] for t in node["inputs"][:2]]
    attrs = node.get("attrs", {})
    if node["op"] == "conv2d" and len(shapes[1]) == 4:
        n, c, h, w = shapes[0] if len(shapes[0]) == 4 else (shapes[0][0], shapes[0][1], 1, shapes[0][-1])
        o, _, kh, kw = shapes[1]
        stride = attrs.get("strides", [1, 1])[0]
        return f"conv2d {c}->{o} {kh}x{kw} s{stride} on {h}x{w}"
    return f"{node['op']} {'x'.join(str(d) for d in shapes[0])} by {'x'.join(str(d) for d in shapes[1])}"


@dataclass
class PrecisionUnit:
    """One decision of the precision level: a node (or a run of nodes) and what was measured."""

    name: str
    keys: tuple[str, ...]  # the nodes' keys in the option node_precisions
    times: dict[str, float] = field(default_factory=dict)  # precision -> seconds per call
    error: float | None = None  # calibration error with this unit alone in bf16 (None: not measured)
    unmeasured: str = ""  # why the error was not measured
    chosen: str = "f32"
    errors: dict[str, float] = field(default_factory=dict)  # precision -> error alone in it (the others f32)

    def why(self) -> str:
        parts = ", ".join(f"{p} {t * 1e6:.1f} µs" for p, t in self.times.items())
        if "int8" in self.times:
            errs = "; ".join(f"{p} alone: error {e:.2g}" for p, e in self.errors.items())
            return f"{self.chosen}: {parts}; " + (errs or f"errors not measured ({self.unmeasured or 'search cut'})")
        err = f"{self.error:.2g}" if self.error is not None else f"not measured ({self.unmeasured or 'search cut'})"
        return f"{self.chosen}: {parts}; bf16 alone: error {err}"


def precision_regions(partitioned: tvm.IRModule) -> list[tuple[str, dict, Any, tuple[str, ...]]]:
    """``(symbol, region document, precision knob, precision ops)`` of each region of
    ``partitioned`` whose backend declares a precision knob with node keys, in region order; the
    ops are the node kinds the backend offers precisions for (:func:`precision_ops`)."""
    return [(symbol, graph, knob, precision_ops(backend)) for symbol, graph, knob, backend
            in _precision_regions(partitioned)]


def precision_ops(backend: str) -> tuple[str, ...]:
    """The node kinds whose precision ``backend`` lets the precision level choose: its ops with
    variants of level ``precision`` (``Backend.level_ops``)."""
    from ..targets import get_target

    return get_target(backend).level_ops(PRECISION)


def layer_kinds(partitioned: tvm.IRModule) -> dict[str, dict[str, tuple[str, ...]]]:
    """Region symbol -> (node op -> the quantizer's layer kinds whose node it is), for each region
    with a precision knob: what its backend declares (``Backend.quantized_layers``: the
    ``layers`` of its variants of level ``precision`` applied by quantizing)."""
    from ..targets import get_target

    return {symbol: get_target(backend).quantized_layers(PRECISION)
            for symbol, _, _, backend in _precision_regions(partitioned)}


def quantized_precisions(names: Sequence[str]) -> tuple[str, ...]:
    """The precisions the backends ``names`` declare applied by quantizing (their variants of
    level ``precision`` with ``applied="quantize"``: Q/DQ steps around the layer)."""
    from ..targets import get_target

    return tuple(dict.fromkeys(p for n in names for p in get_target(n).applied_by(PRECISION, "quantize")))


def offered_precisions(names: Sequence[str]) -> tuple[str, ...]:
    """Every precision the backends ``names`` offer (their variants of level ``precision``), f32 first."""
    from ..targets import get_target

    found = (v.name for n in names for vs in get_target(n).variants.values() for v in vs if v.level == PRECISION)
    return tuple(dict.fromkeys(("f32", *found)))


def _precision_regions(partitioned: tvm.IRModule) -> list[tuple[str, dict, Any, str]]:
    """``(symbol, region document, precision knob, backend name)`` of each region of
    ``partitioned`` whose backend declares a precision knob with node keys."""
    from .._relax import region_table

    out = []
    for symbol, entry in region_table(partitioned).items():
        knob = knob_of(entry.target, PRECISION)
        if knob is not None and knob.keys is not None and entry.graph:
            out.append((symbol, entry.graph, knob, entry.target))
    return out


@dataclass(frozen=True)
class PrecisionNode:
    """A unit of the precision level as the partition has it: one float conv2d / dense / matmul
    node (static shapes) of a region whose backend has a precision knob."""

    key: str  # the node's key in the knob's option (the backend's ``keys(symbol, graph)``: by content)
    op: str
    label: str  # what the report calls it
    backend: str  # whose knob and variants decide it


def precision_nodes(partitioned: tvm.IRModule) -> list[PrecisionNode]:
    """The float conv2d / dense / matmul nodes of the module's regions whose backend has a precision
    knob (keyed by it), with static shapes, in region and node order: what can change precision."""
    regions = _precision_regions(partitioned)
    found = []
    for r, (symbol, graph, knob, backend) in enumerate(regions):
        where = f"region {r} " if len(regions) > 1 else ""
        tensors, nodes, ops = graph.get("tensors", []), graph.get("nodes", []), precision_ops(backend)
        keys = knob.keys(symbol, graph)
        for i, node in enumerate(nodes):
            if node["op"] not in ops or keys[i] is None or \
                    (knob.node_reason is not None and knob.node_reason(nodes, i)):
                continue  # a kind the backend offers no precision for, or one it says takes none (int8)
            ins = [tensors[t] for t in node["inputs"][:2]]
            if any(t.get("dtype", "float32") != "float32" for t in ins):
                continue
            if not all(isinstance(d, int) for t in ins for d in t["shape"]):
                continue
            found.append(PrecisionNode(keys[i], node["op"], f"{where}node {i}: {_node_text(graph, node)}", backend))
    return found


def anchor_nodes(partitioned: tvm.IRModule) -> list[tuple[str, str]]:
    """``(node key, description)`` of each :func:`precision_nodes` node."""
    return [(n.key, n.label) for n in precision_nodes(partitioned)]


def region_of(key: str) -> str:
    """The region symbol a node key names (a knob's keys start with ``<symbol>#``)."""
    return str(key).rpartition("#")[0]


def node_places(keys: Iterable[str], graphs: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, int]]:
    """``key -> (region symbol, node index)`` of each of ``keys`` found in the region documents
    ``graphs`` (symbol -> document), through the knob of the region's backend (its ``keys``, then
    ``locate`` for a key of another form); a key no node of ``graphs`` has is left out."""
    by_region: dict[str, list[str]] = {}
    for key in keys:
        by_region.setdefault(region_of(key), []).append(key)
    out = {}
    for symbol, wanted in by_region.items():
        graph = graphs.get(symbol)
        knob = knob_of(str(graph.get("source", {}).get("target", "")), PRECISION) if graph else None
        if knob is None or knob.keys is None:
            continue
        index = {k: i for i, k in enumerate(knob.keys(symbol, graph)) if k is not None}
        for key in wanted:
            i = index[key] if key in index else knob.locate(key, graph) if knob.locate is not None else None
            if i is not None:
                out[key] = (symbol, i)
    return out


def precision_choices(node: PrecisionNode, asked: Sequence[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The precisions of ``asked`` that ``node`` may take — f32 (the reference) and the backend's
    variants of level ``precision`` for its op (``Backend.choices``) that run as asked on this
    machine (the knob's ``native``) — and why each other one asked may not."""
    from ..targets import get_target

    backend = get_target(node.backend)
    knob, offered = backend.knobs[PRECISION], backend.choices(PRECISION, node.op)
    out, why = ["f32"], {}
    for p in dict.fromkeys(asked):
        reason = "" if p == "f32" else (knob.native(p) if knob.native is not None else "")
        if p != "f32" and p not in offered:
            why[p] = f"backend {backend.name!r} offers no {p} {node.op}"
        elif reason:
            why[p] = reason
        elif p != "f32":
            out.append(p)
    return tuple(out), why


def make_units(anchors: Sequence[tuple[str, str]], max_units: int = MAX_UNITS) -> list[PrecisionUnit]:
    """One unit per anchor node (``(key, label)`` as :func:`anchor_nodes` gives them), or runs of
    consecutive nodes of one region (about equal counts) when there are more than ``max_units``."""
    per = max(1, math.ceil(len(anchors) / max(1, max_units)))
    units: list[PrecisionUnit] = []
    group: list[tuple[str, str]] = []

    def close() -> None:
        if group:
            last = group[-1][1].partition(":")[0]  # "node 17" of the label "node 17: conv2d ..."
            name = group[0][1] if len(group) == 1 else f"{group[0][1]} ... {last} ({len(group)} ops)"
            units.append(PrecisionUnit(name, tuple(k for k, _ in group)))
            group.clear()

    for key, text in anchors:
        if group and (len(group) == per or region_of(group[-1][0]) != region_of(key)):
            close()
        group.append((key, text))
    close()
    return units


DEFAULT_PLAN = "default (float32)"


@dataclass
class PlanResult:
    """One end-to-end alternative: its node precisions, errors and time."""

    name: str
    table: dict[str, str] = field(default_factory=dict)  # node key -> precision ({}: no override)
    calibration_error: float | None = None
    holdout_error: float | None = None
    timing: Timing | None = None
    modelled_s: float | None = None  # what the solver expected from the unit timings
    built: Built | None = field(default=None, repr=False)

    @property
    def bf16_nodes(self) -> int:
        return sum(p == "bf16" for p in self.table.values())

    def text(self) -> str:
        errs = [f"{what} {e:.2g}" for what, e in (("calibration", self.calibration_error),
                                                  ("held-out", self.holdout_error)) if e is not None]
        time_text = f"{self.timing.median_s * 1e3:.3f} ms" if self.timing else "not timed"
        int8 = sum(p == "int8" for p in self.table.values())
        nodes = f" ({self.bf16_nodes}/{len(self.table)} nodes bf16)" if self.table else ""
        if int8:
            nodes = f" ({int8} int8, {self.bf16_nodes} bf16 of {len(self.table)} layers)"
        return f"{self.name}{nodes}: {time_text}" + (f", error {', '.join(errs)}" if errs else "")


@dataclass
class PrecisionReport:
    """What the precision level measured and decided (``TuneReport.precision``)."""

    precisions: tuple[str, ...]
    tolerance: float
    quantized: tuple[str, ...] = ()  # the precisions the backends apply by quantizing (int8)
    calibration: int = 0  # how many calibration inputs
    holdout: int = 0  # how many held-out inputs
    units: list[PrecisionUnit] = field(default_factory=list)
    plans: list[PlanResult] = field(default_factory=list)
    kept: str = DEFAULT_PLAN
    search_cut: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def lowest_first(self) -> tuple[str, ...]:
        """The precisions asked other than f32, lowest first: those applied by quantizing, then the
        others as asked (the order of the all-one candidates and of each unit's sensitivities)."""
        rest = [p for p in self.precisions if p != "f32" and p not in self.quantized]
        return (*[p for p in self.precisions if p in self.quantized], *rest)

    def plan(self, name: str) -> PlanResult | None:
        return next((p for p in self.plans if p.name == name), None)

    def lines(self) -> list[str]:
        """The report's lines (indented for :class:`~.tuner.TuneReport`)."""
        lines = [f"  precision: among {', '.join(self.precisions)}, tolerance {self.tolerance:g} "
                 f"(max |y - y_f32| / max |y_f32|) on {self.calibration} calibration and "
                 f"{self.holdout} held-out inputs"]
        lines.extend(f"    {u.name}: {u.why()}" for u in self.units)
        lines.extend(f"    plan {p.text()}" for p in self.plans)
        lines.append(f"    kept the {self.kept} plan" + ("; the search was cut by budget_s" if self.search_cut else ""))
        lines.extend(f"    note: {n}" for n in self.notes)
        return lines


def partition_with_node_precisions(mod: tvm.IRModule, params: Mapping[str, Any] | None,
                                   table: Mapping[str, str] | None, *, targets: Any,
                                   options: Mapping[str, Mapping[str, Any]],
                                   region_codegen: Mapping[str, str] | None = None,
                                   skipped: dict[str, str] | None = None) -> tvm.IRModule:
    """``mod`` partitioned as a float32 plan whose nodes ``table`` names (node key -> ``"f32"`` /
    ``"bf16"``; None: none) compute in that precision (the backend option ``node_precisions``).

    The regions stay float32 and only the named nodes change: a bf16 region would run other passes
    (it leaves attention unfused, fused_attention.py), so node indices read from the float32
    partition named other nodes in it (issue 35: BERT-base's keys met a reshape). A key that still
    names no float conv2d / dense / matmul (``apply_node_precisions`` raises) is left out, its node
    keeps float32, and ``skipped`` gets the key and why: a tuner keeps the default for a decision
    it cannot apply instead of failing."""
    from ..errors import RuleError
    from ..stages import partition, target_names

    takers = backends_with(PRECISION, target_names(targets))

    def run(chosen: Mapping[str, str] | None) -> tvm.IRModule:
        opts = {k: dict(v) for k, v in options.items()}
        for backend in takers if chosen else ():  # a backend applies the keys of its own regions
            opts = with_option(opts, backend, PRECISION, chosen)
        return partition(mod, params, target=targets, options=opts, region_codegen=region_codegen)

    try:
        done = run(table)
    except RuleError as err:
        if not any(get_option(b) in str(err) for b in takers):
            raise
    else:  # a key of a region this partition does not have reached no node: say so
        symbols = {symbol for symbol, *_ in precision_regions(done)} if table else set()
        for key in dict(table or {}):
            if region_of(key) not in symbols and skipped is not None:
                skipped[key] = "names no region of the partition the plan is built on"
        return done
    regions = {symbol: (knob, graph) for symbol, graph, knob, _ in precision_regions(run(None))}
    kept = {}
    for key, precision in dict(table or {}).items():
        knob, graph = regions.get(region_of(key), (None, None))
        index = knob.locate(key, graph) if knob is not None and knob.locate is not None else None
        why = ("no region of that name" if knob is None else
               "no node with that content or index" if index is None else
               knob.node_reason(graph["nodes"], index) if knob.node_reason is not None else None)
        if why is None:
            kept[key] = precision
        elif skipped is not None:
            skipped[key] = f"names {why} in the partition the plan is built on"
    return run(kept)


def native_reason(targets: Any, precision: str) -> str:
    """Why ``precision`` runs as another on this machine in the backends of ``targets`` with a
    precision knob (their knob's ``native``; the first reason given), "" where it runs as asked."""
    from ..stages import target_names

    for backend in backends_with(PRECISION, target_names(targets)):
        knob = knob_of(backend, PRECISION)
        reason = knob.native(precision) if knob.native is not None else ""
        if reason:
            return reason
    return ""


def get_option(backend: str) -> str:
    """The option name of ``backend``'s precision knob."""
    return knob_of(backend, PRECISION).option


class Session:
    """What every candidate build of one tune shares: the model, the base options, the reference
    outputs, the deadline of the search and the progress lines."""

    def __init__(self, mod: tvm.IRModule, params: Mapping[str, Any] | None, targets: Any,
                 options: Mapping[str, Mapping[str, Any]] | None, budget_s: float | None, progress: Any,
                 region_codegen: Mapping[str, str] | None = None):
        self.mod, self.params, self.targets = mod, params, targets
        self.region_codegen = dict(region_codegen) if region_codegen else None  # the codegen level's map
        self.options = {k: dict(v) for k, v in (options or {}).items()}
        self.deadline = math.inf if budget_s is None else time.perf_counter() + float(budget_s)
        self.progress = progress
        self.errors: PlanErrors | None = None  # set by choose_precisions, with the input sets
        self.skipped: dict[str, str] = {}  # node key -> why a plan's decision for it was not applied
        self._model_digest: str | None = None

    def model_digest(self) -> str:
        """:func:`.reuse.model_digest` of the model, worked out once (hashing ResNet-50's 100 MB of
        weights took 0.1 s, and the int8 choice asked twice)."""
        from .reuse import model_digest

        if self._model_digest is None:
            self._model_digest = model_digest(self.mod, self.params)
        return self._model_digest

    def build(self, table: Mapping[str, str] | None) -> Built:
        """The model partitioned with ``table`` (node key -> precision; None: plain float32) and
        built (:func:`partition_with_node_precisions`: keys that name no anchor go to :attr:`skipped`)."""
        return Built(lambda: self.partition(self.mod, self.params, table))

    def partition(self, mod: tvm.IRModule, params: Mapping[str, Any] | None,
                  table: Mapping[str, str] | None) -> tvm.IRModule:
        """``mod`` partitioned with this tune's targets, options and codegen map, its nodes
        ``table`` names in their precision (:func:`partition_with_node_precisions`)."""
        return partition_with_node_precisions(mod, params, table, targets=self.targets, options=self.options,
                                              region_codegen=self.region_codegen, skipped=self.skipped)

    def skipped_note(self) -> str | None:
        """The report's note on :attr:`skipped`, None when every decision reached its node."""
        if not self.skipped:
            return None
        listed = "; ".join(f"{k}: {why}" for k, why in sorted(self.skipped.items()))
        return (f"{len(self.skipped)} node decisions could not be applied, those nodes kept float32 "
                f"({listed})")

    def left_s(self) -> float:
        return self.deadline - time.perf_counter()

    def say(self, text: str) -> None:
        if callable(self.progress):  # the tuner's progress bar (or a caller's callback)
            self.progress("precision", 0, 1, text)
        elif self.progress:
            print(f"tune: precision: {text}", file=sys.stderr, flush=True)


def constant_tensors(graph: Mapping[str, Any]) -> set[int]:
    """Tensors known when a region is initialized: its constants and what nodes compute from
    constants alone (a batch norm folded into a convolution's weights)."""
    known = {c["tensor"] for c in graph["constants"]}
    for node in graph["nodes"]:
        if node["inputs"] and all(t in known for t in node["inputs"]):
            known.add(node["output"])
    return known


def node_timing_key(graph: Mapping[str, Any], index: int, precision: str) -> str:
    """The timing-cache signature of node ``index`` of a region document computing in ``precision``
    (its op, input shapes and dtypes, attrs with the precision): what :meth:`OneNode.timing_key`
    gives, without creating and initializing the one-node region. A warm tune of ResNet-50 spent
    3.0-3.2 s (of 9.2, loaded machine) creating 108 one-node regions, random weights included,
    only to read their keys."""
    return node_signature(graph, index, dict(graph["nodes"][index].get("attrs", {}), precision=precision), precision)


def node_signature(graph: Mapping[str, Any], index: int, attrs: Mapping[str, Any], choice: str) -> str:
    """The timing-cache signature of node ``index`` of a region document: its op, its inputs'
    shapes and dtypes, ``attrs`` (the node's, as the caller keys them) and ``choice``."""
    node, tensors = graph["nodes"][index], graph["tensors"]
    return signature(node["op"], [list(tensors[t]["shape"]) for t in node["inputs"]],
                     [tensors[t].get("dtype", "float32") for t in node["inputs"]], attrs, choice)


class OneNode:
    """Node ``index`` of a region document alone in a region of the runtime, computing in
    ``precision``: run-time inputs become region inputs (random data), inputs known at init become
    constants (random, of their shapes), its output the region output. What a unit's time is
    measured on: no model around it, so repeated layers share one measurement (the cache)."""

    def __init__(self, graph: Mapping[str, Any], index: int, precision: str, seed: int = 0):
        from .._native import _C  # noqa: F401  (registers the runtime)

        node, known = graph["nodes"][index], constant_tensors(graph)
        ids = list(dict.fromkeys([*node["inputs"], node["output"]]))
        local = {t: i for i, t in enumerate(ids)}
        tensors = [{"shape": list(graph["tensors"][t]["shape"]), "dtype": graph["tensors"][t].get("dtype", "float32")}
                   for t in ids]
        consts = [t for t in node["inputs"] if t in known]
        attrs = dict(node.get("attrs", {}), precision=precision)
        self.doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "tune_node", "tensors": tensors,
                    "inputs": [local[t] for t in node["inputs"] if t not in known],
                    "outputs": [local[node["output"]]],
                    "constants": [{"tensor": local[t], "name": f"tune_node_c{k}"} for k, t in enumerate(consts)],
                    "nodes": [{"op": node["op"], "inputs": [local[t] for t in node["inputs"]],
                               "output": local[node["output"]], "attrs": attrs}]}
        rng = np.random.default_rng(seed)

        def data(t: int) -> tvm.runtime.Tensor:
            spec = tensors[local[t]]
            return tvm.runtime.tensor((rng.standard_normal(spec["shape"]) * 0.1).astype(spec["dtype"]))

        self.module = tvm.get_global_func("byoc_hetero.runtime.create")(json.dumps(self.doc))
        if self.module["__init_tune_node"]([data(t) for t in consts]) != 0:
            raise RuntimeError(f"could not initialize the one-node region of {node['op']}")
        out = tensors[local[node["output"]]]
        self.args = [data(t) for t in node["inputs"] if t not in known]
        self.args.append(tvm.runtime.tensor(np.zeros(out["shape"], out["dtype"])))
        self.fn = self.module["tune_node"]

    def timing_key(self) -> str:
        """The timing-cache signature: the node's op, shapes, dtypes and attrs (precision included)."""
        return node_timing_key(self.doc, 0, self.doc["nodes"][0]["attrs"]["precision"])

    def __call__(self) -> None:
        self.fn(*self.args)


def measure_unit_times(units: Sequence[PrecisionUnit], graphs: Mapping[str, Mapping[str, Any]],
                       cache: TimingCache, repeat: int = 15, precisions: Sequence[str] = PRECISIONS) -> None:
    """Each unit's seconds per call in f32 and in bf16: the sum of its nodes' times, each node
    timed alone (:class:`OneNode`, :func:`.measure.time_call`) through ``cache``."""
    from ..errors import first_line

    places = node_places((k for u in units for k in u.keys), graphs)
    for unit in units:
        try:
            for precision in precisions:
                total = 0.0
                for key in unit.keys:
                    if key not in places:
                        raise ValueError(f"no node of the timed partition is {key}")
                    symbol, index = places[key]
                    cache_key = node_timing_key(graphs[symbol], index, precision)
                    total += time_cached(cache, cache_key, functools.partial(OneNode, graphs[symbol], index,
                                                                             precision), repeat).median_s
                unit.times[precision] = total
        except (RuntimeError, ValueError) as err:  # a node the runtime cannot run alone
            unit.times = {p: 0.0 for p in precisions}  # no gain to measure: it stays f32 but in all-bf16
            unit.unmeasured = f"could not be timed alone: {first_line(err)}"


class PlanSpace(Protocol):
    """What the precision level's one search (:mod:`.precision`) asks of a plan space: how the
    per-unit choices become a plan (``FloatSpace`` there, ``QuantizedSpace`` in :mod:`.int8`)."""

    session: "Session"
    units: list[PrecisionUnit]
    layers: list[int]  # the layer indices a plan assigns a precision to
    layer_of: dict[str, int]  # float node key -> layer index
    edges: Any  # :class:`.edges.UnitEdges` between units in two domains, or None
    edge_costs: dict[tuple[str, str, int], float] | None

    def schedule(self) -> Any:
        """How the search's error budget moves (:class:`.solver.RescaledBudget` or ``BisectedBudget``)."""

    def build(self, assignment: Mapping[int, str]) -> Built:
        """The plan ``assignment`` (layer index -> precision), built when first used."""

    def prebuilt(self, precision: str) -> Built | None:
        """The all-``precision`` plan where the space made it already, else None."""

    def time_units(self, report: "PrecisionReport", graphs: Mapping[str, Any], cache: TimingCache,
                   repeat: int) -> None:
        """Each unit's seconds per call in each of its precisions, into ``unit.times``."""


def unit_layers(unit: PrecisionUnit, layer_of: Mapping[str, int]) -> list[int]:
    """The layer indices of ``unit``'s node keys (``layer_of``: node key -> layer index)."""
    return [layer_of[k] for k in unit.keys]


def assignment_of(units: Sequence[PrecisionUnit], layer_of: Mapping[str, int], chosen: Mapping[str, str]
                  ) -> dict[int, str]:
    """Layer index -> precision, from unit name -> precision."""
    return {i: chosen[u.name] for u in units for i in unit_layers(u, layer_of)}


def plan_result(name: str, units: Sequence[PrecisionUnit], assignment: Mapping[int, str],
                layer_of: Mapping[str, int], built: Built, errors: PlanErrors) -> PlanResult:
    """A measured plan: its table (float node key -> precision), calibration error (through the
    cache: :mod:`.plan_errors`) and modelled time (the sum of its units' times)."""
    table = {k: assignment[layer_of[k]] for u in units for k in u.keys}
    modelled = sum(u.times.get(assignment[layer_of[u.keys[0]]], math.nan) for u in units)
    return PlanResult(name, table, errors.error(table, "calibration", built), modelled_s=modelled, built=built)


def held_out_candidates(report: PrecisionReport, candidates: list[PlanResult],
                        find_mix: Callable[[float], PlanResult | None], errors: PlanErrors) -> list[PlanResult]:
    """Search a mix (``find_mix(target calibration error)``, appended to ``candidates``) and return
    the candidates within the tolerance on the held-out inputs. When those that met it on the
    calibration inputs miss it on the held-out ones, search once more for a calibration error
    smaller by that ratio (the held-out inputs still only check: the new mix is checked on them
    again)."""
    target = report.tolerance
    for attempt in range(2):
        mix = find_mix(target)
        if mix is not None and mix.table not in [c.table for c in candidates]:
            mix.name = "tuned mix" if attempt == 0 else "tuned mix, tighter"
            candidates.append(mix)
        valid = _check_holdout(candidates, report.tolerance, target, errors)
        missed = [c.holdout_error for c in candidates if c.holdout_error is not None and c not in valid]
        if valid or not missed or attempt:
            return valid
        target *= 0.9 * report.tolerance / max(missed)
        report.notes.append(f"a plan within the tolerance on the calibration inputs missed it on the held-out "
                            f"ones (error {max(missed):.2g}): searched again for a calibration error of at most "
                            f"{target:.2g}")
    return []


def float32_plans(session: Session, default: tvm.IRModule, calibration: list, holdout: list,
                 cache: TimingCache) -> list[PlanResult]:
    """The default float32 plan (the reference) and, where the algorithm level changed a
    convolution or the codegen level a region, the float32 plan with those decisions. Sets
    ``session.errors`` (errors against the reference's outputs, computed when first needed,
    through ``cache``: :mod:`.plan_errors`)."""
    ref = Built(default)
    reference = LazyOutputs(lambda: ref.run(calibration))
    session.errors = PlanErrors(cache, session.model_digest(),
                                settings_digest(session.targets, session.options, session.region_codegen))
    session.errors.inputs("calibration", calibration, reference)
    session.errors.inputs("holdout", holdout, LazyOutputs(lambda: ref.run(holdout)))
    plans = [PlanResult(DEFAULT_PLAN, {}, 0.0, 0.0, built=ref)]
    changed = [what for what, on in (("algorithms", option_value(session.options, "algorithm")),
                                     ("codegen", session.region_codegen)) if on]
    if changed:
        tuned = session.build(None)
        plans.append(PlanResult(f"float32, tuned {' and '.join(changed)}", {},
                                session.errors.error({"": "float32"}, "calibration", tuned), built=tuned))
    return plans


def timed_graphs(session: Session, float_plans: Sequence[PlanResult], base: tvm.IRModule,
                 cache: TimingCache) -> dict[str, Any]:
    """The region documents (symbol -> graph) the units' times and edges are read from: ``base``'s,
    or, where the other levels changed a decision, those of the float32 plan with them
    (``float_plans[-1]``). Those are kept in ``cache`` under the model and the settings they are
    made from (the key of that plan's errors, :mod:`.plan_errors`): a warm tune of ResNet-50
    partitioned the plan for nothing else, about 1 s of its 4 (loaded machine)."""
    from .._relax import region_table

    if len(float_plans) == 1:
        return {symbol: entry.graph for symbol, entry in region_table(base).items()}
    key = signature("region_graphs", attrs={"model": session.errors.model, "settings": session.errors.settings})
    found = cache.get_value(key)
    if isinstance(found, dict) and all(isinstance(g, dict) and "nodes" in g for g in found.values()):
        return found
    graphs = {symbol: entry.graph for symbol, entry in region_table(float_plans[-1].built.module).items()}
    cache.put_value(key, {symbol: g for symbol, g in graphs.items() if g})
    return graphs


def _check_holdout(plans: Sequence[PlanResult], tolerance: float, target: float,
                   errors: PlanErrors) -> list[PlanResult]:
    """The bf16 plans within ``target`` on the calibration inputs and then within ``tolerance`` on
    the held-out ones."""
    kept = []
    for plan in plans:
        if plan.calibration_error is None or plan.calibration_error > target:
            continue
        if plan.holdout_error is None:
            plan.holdout_error = errors.error(plan.table, "holdout", plan.built)
        if plan.holdout_error <= tolerance:
            kept.append(plan)
    return kept


def warn_unmet(report: PrecisionReport, tolerance: float) -> None:
    errors = [max(e for e in (p.calibration_error, p.holdout_error) if e is not None)
              for p in report.plans if p.table and p.calibration_error is not None]
    errors += [u.error for u in report.units if u.error is not None]
    best = min(errors) if errors else math.inf
    text = (f"no precision plan meets tolerance {tolerance:g}: the best error found was {best:.3g} "
            f"(max |y - y_f32| / max |y_f32|); the float32 plan is returned")
    report.notes.append(text)
    warnings.warn(f"tune: {text}", TuneWarning, stacklevel=4)


def time_plans(plans: Sequence[PlanResult], sample: Sequence[np.ndarray], rounds: int, repeat: int) -> list[Timing]:
    """Each plan's end-to-end time on ``sample``, the plans timed alternately (:func:`.measure.time_alternately`)."""
    from .measure import time_alternately

    return time_alternately([p.built.caller(sample) for p in plans], rounds, repeat)


def pick(report: PrecisionReport, float_plans: list[PlanResult], candidates: list[PlanResult],
          sample: Sequence[np.ndarray], rounds: int, repeat: int, errors: PlanErrors) -> PlanResult:
    """Time the float32 plans and the candidates end to end, alternating (or read those figures
    from the cache, :meth:`.plan_errors.PlanErrors.timings`); the fastest wins, the default unless
    another is measured faster (never slower than the default). Plans within the timings' spread
    (IQR / median) of the fastest are a tie, and a tie goes to the smaller error, a float32 plan
    first: a mix measured 1% faster than all-bf16 with twice its error on a noisy machine is not
    a win (session 14, ConvNeXt-T, loaded Zen 5: the mix was kept at 1.08x all-bf16's time)."""
    timed = float_plans + candidates
    tables = [p.table or {"": p.name} for p in timed]
    for plan, timing in zip(timed, errors.timings(tables, sample, rounds, repeat,
                                                  lambda: time_plans(timed, sample, rounds, repeat))):
        plan.timing = timing
    fastest = min(timed, key=lambda p: p.timing.median_s)

    def tied(p: PlanResult) -> bool:
        margin = max(fastest.timing.spread, p.timing.spread)
        return p.timing.median_s <= fastest.timing.median_s * (1.0 + margin)

    def error(p: PlanResult) -> float:
        if any(p is f for f in float_plans):
            return -1.0
        return max((e for e in (p.calibration_error, p.holdout_error) if e is not None), default=0.0)

    best = min((p for p in timed if tied(p)), key=lambda p: (error(p), p.timing.median_s))
    report.kept = best.name
    return best
