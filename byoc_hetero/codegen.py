"""Codegen of target ``byoc_hetero``: each region → one runtime module of the C++ runtime.

``RunCodegen`` calls the global ``relax.ext.byoc_hetero(funcs, options, constant_names)`` with the
outlined regions. Each region is lowered here to the JSON graph described in
``docs/region-format.md`` (nodes with attributes and static shapes) and handed to the runtime's
``byoc_hetero.runtime.create``. Constants bound inside a region become named constants: TVM's
const loader gives them to the module once (``__init_<symbol>``), where the runtime reorders the
weights into oneDNN's preferred layout.

The codegen never re-decides what to offload; it only translates. An op it cannot translate is a
bug in a rule's check and raises :class:`CodegenError` naming the region and op.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm
import tvm_ffi
from tvm import relax

from .errors import CodegenError
from .rules.registry import static_shape, tensor_dtype

FORMAT = "byoc_hetero.region"
VERSION = 1


@dataclass
class _Node:
    op: str
    inputs: list[int]
    output: int
    attrs: dict[str, Any]


@dataclass
class RegionGraph:
    """A region as the runtime sees it (see docs/region-format.md)."""

    symbol: str
    tensors: list[dict[str, Any]] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    constants: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[_Node] = field(default_factory=list)
    # what the region was made of, for reports: composite names and Relax op counts
    source_composites: list[str] = field(default_factory=list)
    source_ops: dict[str, int] = field(default_factory=dict)
    target: str = "byoc_hetero"

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "version": VERSION,
                "symbol": self.symbol,
                "tensors": self.tensors,
                "inputs": self.inputs,
                "outputs": self.outputs,
                "constants": self.constants,
                "nodes": [
                    {"op": n.op, "inputs": n.inputs, "output": n.output, "attrs": n.attrs}
                    for n in self.nodes
                ],
                "source": {
                    "target": self.target,
                    "composites": self.source_composites,
                    "ops": self.source_ops,
                },
            }
        )


def _op_name(call: relax.Call) -> str:
    return call.op.name if isinstance(call.op, tvm.ir.Op) else type(call.op).__name__


class _RegionLowering:
    """Walks one region function (calls of composite functions) and emits RegionGraph nodes."""

    def __init__(self, func: relax.Function, constant_names: Mapping[Any, str]):
        self.func = func
        self.symbol = str(func.attrs["global_symbol"])
        self.graph = RegionGraph(self.symbol, target=str(func.attrs.get("Codegen", "byoc_hetero")))
        self.constant_names = constant_names
        self.const_ids: dict[str, int] = {}
        # value → tensor id; aliases (reshape of a bias, permute_dims of a weight) resolve here
        self.tid: dict[Any, int] = {}
        self.transposed: set[Any] = set()
        # tensor id → index of the node that writes it and may still absorb an epilogue
        self.open_node: dict[int, int] = {}
        self.local_funcs: dict[Any, relax.Function] = {}

    def fail(self, what: str) -> CodegenError:
        return CodegenError(f"region {self.symbol}: {what}")

    def new_tensor(self, expr: relax.Expr) -> int:
        shape = static_shape(expr)
        if shape is None:
            raise self.fail(f"value {expr.ty} has no static shape")
        self.graph.tensors.append({"shape": list(shape), "dtype": tensor_dtype(expr)})
        return len(self.graph.tensors) - 1

    def lookup(self, expr: relax.Expr) -> int:
        if isinstance(expr, tvm.ir.Constant):
            name = self.constant_names.get(expr) if hasattr(self.constant_names, "get") else None
            if name is None:
                raise self.fail("a constant inside the region has no name from RunCodegen")
            name = str(name)
            if name not in self.const_ids:
                tid = self.new_tensor(expr)
                self.const_ids[name] = tid
                self.graph.constants.append({"tensor": tid, "name": name})
            return self.const_ids[name]
        if expr in self.tid:
            return self.tid[expr]
        raise self.fail(f"value {expr} is used before it is defined")

    # -- the region function ------------------------------------------------------------------
    def run(self) -> RegionGraph:
        for param in self.func.params:
            tid = self.new_tensor(param)
            self.tid[param] = tid
            self.graph.inputs.append(tid)
        body = self.func.body
        for block in body.blocks:
            for binding in block.bindings:
                self.region_binding(binding.var, binding.value)
        outputs = body.body.fields if isinstance(body.body, relax.Tuple) else [body.body]
        for out in outputs:
            tid = self.lookup(out)
            if tid in self.graph.inputs or any(c["tensor"] == tid for c in self.graph.constants):
                raise self.fail("a region output that is an input or constant is not supported")
            self.graph.outputs.append(tid)
        return self.graph

    def region_binding(self, var: relax.Var, value: relax.Expr) -> None:
        if isinstance(value, relax.Function):
            self.local_funcs[var] = value
        elif isinstance(value, relax.Call) and value.op in self.local_funcs:
            composite = self.local_funcs[value.op]
            result = self.composite(composite, [self.lookup(a) for a in value.args])
            self.tid[var] = result
        elif isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar):
            raise self.fail(f"call of global function {value.op.name_hint} inside a region")
        elif isinstance(value, relax.Var):
            self.tid[var] = self.lookup(value)
        elif isinstance(value, relax.Tuple):
            self.tid[var] = tuple(self.lookup(f) for f in value.fields)
        elif isinstance(value, relax.TupleGetItem):
            self.tid[var] = self.lookup(value.tuple_value)[value.index]
        else:
            raise self.fail(f"unsupported binding {type(value).__name__} in a region")

    # -- one composite function -----------------------------------------------------------------
    def composite(self, func: relax.Function, arg_ids: Sequence[int]) -> int:
        self.graph.source_composites.append(str(func.attrs["Composite"]))
        for param, tid in zip(func.params, arg_ids):
            self.tid[param] = tid
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.Var):
                    self.tid[binding.var] = self.lookup(value)
                elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                    self.tid[binding.var] = self.op_call(binding.var, value)
                else:
                    raise self.fail(f"unsupported binding {type(value).__name__} in a composite")
        return self.lookup(func.body.body)

    def emit(self, op: str, inputs: list[int], out_var: relax.Var, attrs: dict[str, Any]) -> int:
        out = self.new_tensor(out_var)
        self.graph.nodes.append(_Node(op, inputs, out, attrs))
        self.open_node[out] = len(self.graph.nodes) - 1
        return out

    def op_call(self, var: relax.Var, call: relax.Call) -> int:
        op = _op_name(call)
        short = op.removeprefix("relax.")
        self.graph.source_ops[short] = self.graph.source_ops.get(short, 0) + 1
        if op == "relax.nn.conv2d":
            a = call.attrs
            attrs = {
                "strides": [int(s) for s in a.strides],
                "padding": [int(p) for p in a.padding],
                "dilation": [int(d) for d in a.dilation],
                "groups": int(a.groups),
                "has_bias": 0,
                "activation": "none",
            }
            return self.emit("conv2d", [self.lookup(call.args[0]), self.lookup(call.args[1])], var, attrs)
        if op == "relax.matmul":
            weight = call.args[1]
            layout = "NK" if weight in self.transposed else "KN"
            attrs = {"weight_layout": layout, "has_bias": 0, "activation": "none"}
            return self.emit("dense", [self.lookup(call.args[0]), self.lookup(weight)], var, attrs)
        if op == "relax.permute_dims":
            self.transposed.add(var)
            return self.lookup(call.args[0])
        if op == "relax.reshape":
            # only a bias is reshaped inside a composite: the runtime needs its values, not its shape
            return self.lookup(call.args[0])
        if op == "relax.add":
            # the bias add comes either way round: add(y, b) or add(b, y)
            first_is_node = self.lookup(call.args[0]) in self.open_node
            produced, bias = (call.args[0], call.args[1]) if first_is_node else (call.args[1], call.args[0])
            node = self.epilogue_node(produced, op)
            if node.attrs["has_bias"] or node.attrs["activation"] != "none":
                raise self.fail(f"second add after {node.op}")
            node.attrs["has_bias"] = 1
            node.inputs.append(self.lookup(bias))
            return node.output
        if op == "relax.nn.relu":
            node = self.epilogue_node(call.args[0], op)
            node.attrs["activation"] = "relu"
            return node.output
        raise self.fail(f"the runtime has no kernel for {op}")

    def epilogue_node(self, producer: relax.Expr, op: str) -> _Node:
        tid = self.lookup(producer)
        if tid not in self.open_node:
            raise self.fail(f"{op} does not follow a conv2d or dense it could be fused into")
        return self.graph.nodes[self.open_node[tid]]


def lower_region(func: relax.Function, constant_names: Mapping[Any, str]) -> RegionGraph:
    """Lower one outlined region function to its RegionGraph."""
    return _RegionLowering(func, constant_names).run()


def create_module(graph: RegionGraph) -> tvm.runtime.Module:
    """Build the runtime module of one region (parses, validates, creates oneDNN primitives)."""
    return tvm.get_global_func("byoc_hetero.runtime.create")(graph.to_json())


@tvm_ffi.register_global_func("relax.ext.byoc_hetero", override=True)
def _relax_ext_byoc_hetero(funcs, options, constant_names):  # noqa: ARG001
    """Entry point RunCodegen calls: one runtime module per region."""
    return [create_module(lower_region(func, constant_names)) for func in funcs]


def region_graph_json(module: tvm.runtime.Module) -> dict[str, Any] | None:
    """The region graph of a byoc_hetero runtime module, or None for another kind of module."""
    if module.kind != "byoc_hetero":
        return None
    return json.loads(module["get_graph_json"]())
