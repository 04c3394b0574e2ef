"""Lowering one region (an outlined function of composite calls) to its region graph.

:class:`RegionLowering` walks the region and its composites, keeps the value → tensor-id map and
the state epilogues need (the node a composite opened, pending reshapes), and
hands each op call to the lowering the op's family registered in :mod:`.table`. The format written
is ``docs/region-format.md``.

The codegen never re-decides what to offload; it only translates. An op it cannot translate is a
bug in a rule's check and raises :class:`CodegenError` naming the region and op.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..._relax import (alias_of, document_tensor_text, function_outputs, op_name, opaque_dims, shape_of,
                       shape_symbols, short_op_name, tensor_dtype, tensor_view)
from ..._native import _C
from ...errors import CodegenError
from ...ranges import region_ranges
from ...rules import get_target
from .precision import DEFAULT_DTYPE, DEFAULT_PRECISION, check_precision
from .table import TARGET, composite_lowering_for, lowering_for

FORMAT = "byoc_hetero.region"
VERSION = 4
"""The version written for every region. The runtime reads 1 to 4: 1 static shapes, 2 symbolic dims,
3 declared symbol ranges (``dim_ranges``), 4 (since the integrity digests, issue 27) version 3 with
a ``digest`` on each constant, checked when the constants arrive (docs/region-format.md,
"Integrity"). One version for all: every exported document carries digests, and a runtime that
predates them must refuse it rather than load constants unchecked."""

SHAPE_ARG = "shape argument"
"""The tensor id standing for a shape parameter of a region (read by no node)."""

SMALL_CONSTANT = 8192
"""Constants up to this many elements keep their values in :attr:`RegionGraph.small_constants`."""

ANCHORS = ("conv2d", "dense", "matmul")
"""Node ops that absorb an epilogue (bias, batch norm, activations, residual) as oneDNN post-ops."""


@dataclass
class Node:
    """One node of a region graph."""

    op: str
    inputs: list[int]
    output: int
    attrs: dict[str, Any]
    folded: bool = False  # a batch norm was folded into it (codegen state, not serialized)


@dataclass
class RegionGraph:
    """A region as the runtime sees it (see docs/region-format.md)."""

    symbol: str
    tensors: list[dict[str, Any]] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    constants: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    # positions, among the call's leading (input) arguments, of shape values (R.Shape) the VM
    # passes: the symbolic dims a composite's reshape reads; the runtime skips them
    shape_args: list[int] = field(default_factory=list)
    # what the region was made of, for reports: composite names and Relax op counts
    source_composites: list[str] = field(default_factory=list)
    source_ops: dict[str, int] = field(default_factory=dict)
    target: str = TARGET
    #: the backend options of this partition (RunCodegen's, checked): region passes that act on a
    #: decision taken outside the region (a tuner's ``algorithms``) read it; not serialized
    options: dict[str, Any] = field(default_factory=dict)
    #: compute precision of the anchors ("f32" | "bf16"); written only when not f32, so f32
    #: documents stay what they were
    precision: str = DEFAULT_PRECISION
    #: symbol -> its declared [min, max] (None: an open end), checked by the runtime when the
    #: symbols are bound (byoc_hetero/ranges.py); only symbols of the region's tensors
    dim_ranges: dict[str, list[int | None]] = field(default_factory=dict)
    #: at most this many threads per call (0: the process's count): the tuner's threads level
    threads: int = 0
    #: constant tensor id -> its value, for one-element float32 constants (not serialized): what
    #: graph passes read to fold a multiply by a constant into an attr (a matmul's ``scale``)
    scalar_values: dict[int, float] = field(default_factory=dict)
    #: constant tensor id -> its value, for constants of at most SMALL_CONSTANT elements (not
    #: serialized): scales, zero points and biases that graph passes fold into attrs (int8)
    small_constants: dict[int, Any] = field(default_factory=dict)
    #: matches a region pass found and declined, for reports (written under ``source``, ignored by
    #: the runtime): {"pass", "op" (the node it would have become), "value", "reason"}
    declined: list[dict[str, str]] = field(default_factory=list)

    def decline(self, graph_pass: str, op: str, tensor: int, reason: str) -> None:
        """Record that ``graph_pass`` kept the match ending in ``tensor`` as separate steps (not one
        ``op`` node) for ``reason``: ``bh.report`` lists it as a rejection of that pass."""
        value = document_tensor_text(self.tensors[tensor])
        self.declined.append({"pass": graph_pass, "op": op, "value": value, "reason": reason})

    def readers(self) -> dict[int, int]:
        """tensor id -> how many node inputs and region outputs read it."""
        count: dict[int, int] = {}
        for t in [t for n in self.nodes for t in n.inputs] + list(self.outputs):
            count[t] = count.get(t, 0) + 1
        return count

    def producers(self) -> dict[int, Node]:
        """tensor id -> the node that writes it."""
        return {n.output: n for n in self.nodes}

    def producer_through(self, t: int, views: tuple[str, ...] = ("reshape",)) -> tuple[Node, list[Node]] | None:
        """(the node computing tensor ``t``'s bytes, the ``views`` nodes from its output to ``t``,
        nearest ``t`` first) when every tensor on the way, ``t`` excluded, is read by that way only
        and is no region output; None when no node writes ``t``."""
        producers, count = self.producers(), self.readers()
        chain: list[Node] = []
        node = producers.get(t)
        while node is not None and node.op in views:
            source = node.inputs[0]
            if count.get(source, 0) != 1:
                return None
            chain.append(node)
            node = producers.get(source)
        return (node, chain) if node is not None else None

    def replace_tensor(self, old: int, new: int) -> None:
        """Every reader of tensor ``old`` (nodes, region outputs) reads ``new`` instead."""
        for node in self.nodes:
            node.inputs = [new if t == old else t for t in node.inputs]
        self.outputs = [new if t == old else t for t in self.outputs]

    @property
    def symbolic(self) -> bool:
        """Whether a tensor has a symbolic dim."""
        return any(isinstance(d, str) for t in self.tensors for d in t["shape"])

    def to_json(self) -> str:
        """The graph as the runtime parses it."""
        precision = {} if self.precision == DEFAULT_PRECISION else {"precision": self.precision}
        return json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "symbol": self.symbol,
                **precision,
                **({"threads": self.threads} if self.threads else {}),
                "tensors": self.tensors,
                "inputs": self.inputs,
                "outputs": self.outputs,
                "constants": self.constants,
                **({"shape_args": self.shape_args} if self.shape_args else {}),
                **({"dim_ranges": self.dim_ranges} if self.dim_ranges else {}),
                "nodes": [
                    {"op": n.op, "inputs": n.inputs, "output": n.output, "attrs": n.attrs}
                    for n in self.nodes
                ],
                "source": {
                    "target": self.target,
                    "composites": self.source_composites,
                    "ops": self.source_ops,
                    **({"declined": self.declined} if self.declined else {}),
                },
            }
        )


class RegionLowering:
    """Walks one region function (calls of composite functions) and emits RegionGraph nodes.

    Op lowerings (``lower(ctx, var, call)``) use :meth:`emit`, :meth:`lookup`, :meth:`data_of`,
    :meth:`fail` and the epilogue state: ``open_node`` (tensor id → the node this composite
    opened, which may still absorb an epilogue), ``flattened`` (reshaped value → (source id,
    shape), until a node reads it).
    """

    def __init__(self, func: relax.Function, constant_names: Mapping[Any, str],
                 precision: str = DEFAULT_PRECISION,
                 dim_ranges: Mapping[str, tuple[int | None, int | None]] | None = None,
                 options: Mapping[str, Any] | None = None):
        self.func = func
        self.dim_ranges = dict(dim_ranges or {})
        self.symbol = str(func.attrs["global_symbol"])
        self.graph = RegionGraph(self.symbol, target=str(func.attrs.get("Codegen", TARGET)),
                                 precision=check_precision(precision), options=dict(options or {}))
        self.constant_names = constant_names
        self.const_ids: dict[str, int] = {}
        # value → tensor id; aliases (reshape of a bias, permute_dims of a weight) resolve here
        self.tid: dict[Any, Any] = {}
        self.open_node: dict[int, Node] = {}
        self.flattened: dict[Any, tuple[int, tuple[int, ...]]] = {}
        self.local_funcs: dict[Any, relax.Function] = {}

    def fail(self, what: str) -> CodegenError:
        """The error to raise: names the region."""
        return CodegenError(f"region {self.symbol}: {what}")

    def new_tensor(self, expr: relax.Expr) -> int:
        """A new tensor shaped like ``expr`` (symbolic dims as expressions); its id."""
        shape = shape_of(expr)
        if shape is None:
            raise self.fail(f"value {expr.ty} has a shape the runtime cannot evaluate")
        return self.new_tensor_shape(shape, tensor_dtype(expr))

    def new_tensor_shape(self, shape: Sequence[int | str], dtype: str = DEFAULT_DTYPE) -> int:
        """A new tensor of ``shape`` (ints, or expression strings for symbolic dims); its id."""
        self.graph.tensors.append({"shape": [d if isinstance(d, str) else int(d) for d in shape], "dtype": dtype})
        return len(self.graph.tensors) - 1

    def lookup(self, expr: relax.Expr) -> Any:
        """The tensor id of a value (a named constant gets its tensor on first use)."""
        if isinstance(expr, tvm.ir.Constant):
            name = self.constant_names.get(expr) if hasattr(self.constant_names, "get") else None
            if name is None:
                raise self.fail("a constant inside the region has no name from RunCodegen")
            name = str(name)
            if name not in self.const_ids:
                tid = self.new_tensor(expr)
                self.const_ids[name] = tid
                value = tensor_view(expr.value if isinstance(expr, tvm.ir.GenericConst) else expr.data)
                self.graph.constants.append({"tensor": tid, "name": name,
                                             "digest": _C.digest(np.ascontiguousarray(value))})
                if value.size == 1 and value.dtype == "float32":
                    self.graph.scalar_values[tid] = float(value.reshape(()))
                if value.size <= SMALL_CONSTANT:
                    self.graph.small_constants[tid] = value.copy()
            return self.const_ids[name]
        if expr in self.tid:
            return self.tid[expr]
        if isinstance(expr, relax.ShapeExpr):
            # a reshape's target shape bound into the region (byoc_hetero.passes.close_shape_arguments):
            # like a shape parameter, the runtime evaluates the reshape's shape itself
            return SHAPE_ARG
        raise self.fail(f"value {expr} is used before it is defined")

    # -- the region function ------------------------------------------------------------------
    def run(self) -> RegionGraph:
        """Lower the whole region."""
        for position, param in enumerate(self.func.params):
            if isinstance(param.ty, relax.ShapeType):
                # the symbolic values a reshape's target shape reads: the runtime evaluates the
                # reshape's output shape itself, from the symbols the tensors bind
                self.graph.shape_args.append(position)
                self.tid[param] = SHAPE_ARG
                continue
            tid = self.new_tensor(param)
            self.tid[param] = tid
            self.graph.inputs.append(tid)
        for block in self.func.body.blocks:
            for binding in block.bindings:
                self.region_binding(binding.var, binding.value)
        for out in function_outputs(self.func):
            tid = self.lookup(out)
            if tid in self.graph.inputs or any(c["tensor"] == tid for c in self.graph.constants):
                raise self.fail("a region output that is an input or constant is not supported")
            self.graph.outputs.append(tid)
        for _name, rewrite in get_target(TARGET).graph_passes():  # REGION_PASSES, in order
            rewrite(self.graph)
        self.bind_opaque_dims()
        return self.graph

    def bind_opaque_dims(self) -> None:
        """Give a dim expression whose symbols no input or output binds a symbol of its own
        (:func:`byoc_hetero._relax.opaque_dims`; the cost gate keeps regions where that is not
        exact on llvm, so a failure here is a bug)."""
        tensors = self.graph.tensors
        names, reason = opaque_dims([tuple(tensors[t]["shape"]) for t in self.graph.inputs + self.graph.outputs],
                                    [tuple(t["shape"]) for t in tensors])
        if reason:
            raise self.fail(reason)
        for t in tensors:
            t["shape"] = [names.get(d, d) if isinstance(d, str) else d for d in t["shape"]]
        if self.dim_ranges:
            symbols = shape_symbols(tuple(d for t in tensors for d in t["shape"]))
            self.graph.dim_ranges = region_ranges(symbols, self.dim_ranges, {n: d for d, n in names.items()})

    def region_binding(self, var: relax.Var, value: relax.Expr) -> None:
        if isinstance(value, relax.Function):
            self.local_funcs[var] = value
        elif isinstance(value, relax.Call) and value.op in self.local_funcs:
            composite = self.local_funcs[value.op]
            self.tid[var] = self.composite(composite, [self.lookup(a) for a in value.args])
        elif isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):
            raise self.fail(f"call of global function {value.op.name_hint} inside a region")
        else:
            self.alias(var, value, "region")

    def alias(self, var: relax.Var, value: relax.Expr, where: str) -> None:
        """A binding that computes nothing: a variable, tuple or tuple item of known values."""
        known, self.tid[var] = alias_of(value, self.lookup)
        if not known:
            raise self.fail(f"unsupported binding {type(value).__name__} in a {where}")

    # -- one composite function -----------------------------------------------------------------
    def composite(self, func: relax.Function, arg_ids: Sequence[int]) -> Any:
        self.graph.source_composites.append(str(func.attrs["Composite"]))
        # epilogues (bias, batch norm, activations, residual) fuse only into the node opened by
        # this composite: a value computed by another composite may have other readers
        self.open_node = {}
        self.flattened = {}
        for param, tid in zip(func.params, arg_ids):
            self.tid[param] = tid
        whole = composite_lowering_for(str(func.attrs["Composite"]))
        if whole is not None:
            for block in func.body.blocks:
                for binding in block.bindings:
                    if isinstance(binding.value, relax.Call) and isinstance(binding.value.op, tvm.ir.Op):
                        short = short_op_name(op_name(binding.value))
                        self.graph.source_ops[short] = self.graph.source_ops.get(short, 0) + 1
            return whole(self, func)
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                    self.tid[binding.var] = self.op_call(binding.var, value)
                else:
                    self.alias(binding.var, value, "composite")
        # a reshape that ends the composite (a composite of its own) is materialized here:
        # its readers, in other composites, need the new shape
        return self.data_of(func.body.body)

    def op_call(self, var: relax.Var, call: relax.Call) -> Any:
        """Lower one op call through the table (:func:`.table.lowering_for`)."""
        op = op_name(call)
        short = short_op_name(op)
        self.graph.source_ops[short] = self.graph.source_ops.get(short, 0) + 1
        lower = lowering_for(op)
        if lower is None:
            raise self.fail(f"the runtime has no kernel for {op}")
        return lower(self, var, call)

    def emit(self, op: str, inputs: list[int], out_var: relax.Expr | None, attrs: dict[str, Any],
             shape: Sequence[int] | None = None, before: Node | None = None) -> int:
        """Append (or insert before ``before``) a node writing a new tensor; returns its id.

        The tensor is shaped like ``out_var``, or ``shape`` when given.
        """
        out = self.new_tensor(out_var) if shape is None else self.new_tensor_shape(shape)
        node = Node(op, inputs, out, attrs)
        if before is None:
            self.graph.nodes.append(node)
        else:
            index = next(i for i, n in enumerate(self.graph.nodes) if n is before)
            self.graph.nodes.insert(index, node)
        self.open_node[out] = node
        return out

    def data_of(self, expr: relax.Expr) -> Any:
        """Tensor id of ``expr`` as a data operand: a pending reshape becomes a reshape node."""
        if expr in self.flattened:
            source, shape = self.flattened.pop(expr)
            out = self.emit("reshape", [source], None, {}, shape=shape)
            self.open_node.pop(out)
            self.tid[expr] = out
            return out
        return self.lookup(expr)


def lower_region(func: relax.Function, constant_names: Mapping[Any, str],
                 precision: str = DEFAULT_PRECISION,
                 dim_ranges: Mapping[str, Sequence[int | None]] | None = None,
                 options: Mapping[str, Any] | None = None) -> RegionGraph:
    """Lower one outlined region function to its RegionGraph (computing in ``precision``; the
    declared ``dim_ranges`` of its symbols, ``{"N": [1, 64]}``, written for the runtime to check;
    the partition's other backend ``options`` for the region passes that read them)."""
    ranges = {str(k): (v[0], v[1]) for k, v in (dim_ranges or {}).items()}
    return RegionLowering(func, constant_names, precision, ranges, options).run()
