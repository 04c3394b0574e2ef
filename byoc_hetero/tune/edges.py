"""What an int8 / float boundary costs, for the precision search with int8 among its choices (:mod:`.int8`).

The unit times the search adds up are each layer alone (:class:`.precision.OneNode`): they do not
see that a tensor between an int8 layer and a float one must be quantized (float -> uint8) or
dequantized (uint8 -> float) on the way. On ResNet-50 the search picked a mix of 32 int8 and 22
bf16 layers that the unit times made 1.5x faster than all bf16 and that ran 2.4x slower end to end
(bench/TUNE.md, session 4): dozens of such edges, each a pass over a tensor of up to 800K elements.

This module gives the solver those edges. Precision *domains* play the part of devices in
:mod:`.solver`: a unit's choice runs in the ``"int8"`` or the ``"float"`` domain, a tensor between
two units in different domains is converted once per reading domain (a quantize serves every int8
reader, as one copy serves every reader on a device), model inputs arrive float and model outputs
leave float. The conversion of ``n`` elements is measured on this machine: one quantize and one
dequantize node alone in a region of the runtime, at each tensor size the model has, through the
timing cache like every other timing. The runtime keeps the float side of such an edge in bf16 in a
bf16 region (kernels/quantize.cc), which a float32 one-node measurement overstates by at most the
float32 bytes; the overstatement errs towards contiguous int8 runs, and the end-to-end check
decides anyway.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

from .cache import TimingCache, signature
from .measure import time_cached
from .plans import constant_tensors, node_places

INT8, FLOAT = "int8", "float"
#: the direction of a conversion: (source domain, destination domain) -> the runtime op doing it
CONVERSIONS = {(FLOAT, INT8): "quantize", (INT8, FLOAT): "dequantize"}


def domain(precision: str) -> str:
    """The domain a unit's precision runs in: ``"int8"`` or ``"float"`` (f32 and bf16)."""
    return INT8 if precision == INT8 else FLOAT


@dataclass
class UnitEdges:
    """The tensors between units: per unit the tensors it reads from another unit (or the model)
    and those it produces for another unit (or the model), and each tensor's element count."""

    inputs: dict[str, list[str]] = field(default_factory=dict)
    outputs: dict[str, list[str]] = field(default_factory=dict)
    elements: dict[str, int] = field(default_factory=dict)
    model_inputs: list[str] = field(default_factory=list)
    model_outputs: list[str] = field(default_factory=list)

    def sizes(self) -> set[int]:
        return set(self.elements.values())


def _constants(graph: Mapping[str, Any]) -> set[int]:
    """Tensors known at init (constants, and what nodes compute from them: a batch norm folded
    into weights), which no conversion touches per call."""
    return constant_tensors({"constants": graph.get("constants", []), "nodes": graph["nodes"]})


def _nearest_anchor(graph: Mapping[str, Any], tensor: int, anchors: set[int], memo: dict,
                    consts: set[int] = frozenset()) -> int | None:
    """The node index of the anchor whose output ``tensor`` derives from through non-anchor ops
    (depth first, inputs in order), or None when it comes from the region's inputs only."""
    if tensor in memo:
        return memo[tensor]
    memo[tensor] = None  # cycles cannot happen in a region graph; this also stops repeats
    producer = next((i for i, n in enumerate(graph["nodes"]) if n["output"] == tensor), None)
    found = None
    if producer is not None:
        if producer in anchors:
            found = producer
        else:
            for t in graph["nodes"][producer]["inputs"]:
                if t not in consts:
                    found = _nearest_anchor(graph, t, anchors, memo, consts)
                    if found is not None:
                        break
    memo[tensor] = found
    return found


def unit_edges(unit_keys: Mapping[str, Sequence[str]], graphs: Mapping[str, Mapping[str, Any]]) -> UnitEdges:
    """The tensors between units (``unit name -> its nodes' keys``, :func:`.plans.node_places`) in the region
    graphs ``graphs`` (symbol -> region document): every run-time input of a unit's node traced
    back to the nearest anchor node of another unit (a model input when none), and each region
    output traced back to the unit producing it (a model output)."""
    edges = UnitEdges({u: [] for u in unit_keys}, {u: [] for u in unit_keys})
    places = node_places((key for keys in unit_keys.values() for key in keys), graphs)
    owner = {places[key]: u for u, keys in unit_keys.items() for key in keys if key in places}
    for symbol, graph in graphs.items():
        anchors = {index for where, index in owner if where == symbol}
        if not anchors:
            continue
        memo: dict = {}
        consts, tensors = _constants(graph), graph["tensors"]

        def name(t: int) -> str:
            edges.elements[f"{symbol}:{t}"] = int(np.prod(tensors[t]["shape"], dtype=np.int64))
            return f"{symbol}:{t}"

        for index in sorted(anchors):
            unit = owner[(symbol, index)]
            for t in dict.fromkeys(graph["nodes"][index]["inputs"]):
                if t in consts:
                    continue
                source = _nearest_anchor(graph, t, anchors, memo, consts)
                src_unit = owner[(symbol, source)] if source is not None else None
                if src_unit == unit:
                    continue
                tensor = name(t)
                _add(edges.inputs[unit], tensor)
                if src_unit is None:
                    _add(edges.model_inputs, tensor)
                elif tensor not in edges.outputs[src_unit]:
                    edges.outputs[src_unit].append(tensor)
        for t in graph.get("outputs", []):
            source = _nearest_anchor(graph, t, anchors, memo, consts)
            if source is not None:
                tensor = name(t)
                _add(edges.outputs[owner[(symbol, source)]], tensor)
                _add(edges.model_outputs, tensor)
    return edges


def _add(items: list[str], item: str) -> None:
    if item not in items:
        items.append(item)


def _conversion_doc(op: str, elements: int) -> dict[str, Any]:
    """A region of one quantize (float32 -> uint8) or dequantize (uint8 -> float32) node over
    ``elements`` values with a per-tensor scale and zero point (int8 activations)."""
    data, out = ("float32", "uint8") if op == "quantize" else ("uint8", "float32")
    return {"format": "byoc_hetero.region", "version": 1, "symbol": "tune_edge",
            "tensors": [{"shape": [elements], "dtype": data}, {"shape": [1], "dtype": "float32"},
                        {"shape": [1], "dtype": "uint8"}, {"shape": [elements], "dtype": out}],
            "inputs": [0], "outputs": [3],
            "constants": [{"tensor": 1, "name": "tune_edge_scale"}, {"tensor": 2, "name": "tune_edge_zero"}],
            "nodes": [{"op": op, "inputs": [0, 1, 2], "output": 3, "attrs": {}}]}


class Conversion:
    """One quantize or dequantize of ``elements`` values alone in a region of the runtime: what
    an int8 / float edge of that size costs (callable: one run)."""

    def __init__(self, op: str, elements: int, seed: int = 0):
        from .._native import _C  # noqa: F401  (registers the runtime)

        doc = _conversion_doc(op, elements)
        rng = np.random.default_rng(seed)
        self.module = tvm.get_global_func("byoc_hetero.runtime.create")(json.dumps(doc))
        consts = [tvm.runtime.tensor(np.array([0.05], "float32")), tvm.runtime.tensor(np.array([128], "uint8"))]
        if self.module["__init_tune_edge"](consts) != 0:
            raise RuntimeError(f"could not initialize the one-node region of {op} over {elements} elements")
        data = rng.standard_normal(elements).astype("float32") if op == "quantize" else \
            rng.integers(0, 256, elements).astype("uint8")
        self.args = [tvm.runtime.tensor(data),
                     tvm.runtime.tensor(np.zeros(elements, "uint8" if op == "quantize" else "float32"))]
        self.fn = self.module["tune_edge"]

    def __call__(self) -> None:
        self.fn(*self.args)


def edge_timing_key(op: str, elements: int) -> str:
    """The timing-cache key of a conversion: the op and the element count."""
    return signature("int8_edge", [[elements]], [], {"op": op}, "int8")


def measure_edge_costs(sizes: Iterable[int], cache: TimingCache, repeat: int = 15
                       ) -> dict[tuple[str, str, int], float]:
    """Seconds per conversion, ``(source domain, destination domain, elements) -> s``, for each
    element count in ``sizes`` and both directions, through ``cache``."""
    costs = {}
    for n in sorted(set(sizes)):
        for (src, dst), op in CONVERSIONS.items():
            timing = time_cached(cache, edge_timing_key(op, n), functools.partial(Conversion, op, n), repeat,
                                 min_total_s=0.02)
            costs[(src, dst, n)] = timing.median_s
    return costs


def edge_cost(costs: Mapping[tuple[str, str, int], float]):
    """The solver's copy cost (:data:`.solver.CopyCost`) from measured conversions: same domain
    free, else the conversion measured at that element count (the solver passes the count where
    it passes bytes for device copies)."""

    def cost(src: str, dst: str, elements: int) -> float:
        return 0.0 if src == dst else costs[(src, dst, int(elements))]

    return cost
