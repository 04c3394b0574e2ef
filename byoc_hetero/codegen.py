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
from .rules.builtin import ACTIVATIONS, activation_of, is_per_channel, spatial_mean_axes
from ._relax import op_name, region_graph_json, region_modules, static_shape, tensor_dtype  # noqa: F401

FORMAT = "byoc_hetero.region"
VERSION = 1


@dataclass
class _Node:
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
        # tensor id → the node that writes it and may still absorb an epilogue (this composite)
        self.open_node: dict[int, _Node] = {}
        # reshaped value → (source tensor id, new shape), until a node reads it (this composite)
        self.flattened: dict[Any, tuple[int, tuple[int, ...]]] = {}
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
        # epilogues (bias, batch norm, activations, residual) fuse only into the node opened by
        # this composite: a value computed by another composite may have other readers
        self.open_node = {}
        self.flattened = {}
        for param, tid in zip(func.params, arg_ids):
            self.tid[param] = tid
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.Var):
                    self.tid[binding.var] = self.lookup(value)
                elif isinstance(value, relax.TupleGetItem):
                    self.tid[binding.var] = self.lookup(value.tuple_value)[value.index]
                elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                    self.tid[binding.var] = self.op_call(binding.var, value)
                else:
                    raise self.fail(f"unsupported binding {type(value).__name__} in a composite")
        return self.lookup(func.body.body)

    def emit(self, op: str, inputs: list[int], out_var: relax.Expr | None, attrs: dict[str, Any],
             shape: Sequence[int] | None = None, before: _Node | None = None) -> int:
        """Append (or insert before ``before``) a node writing a new tensor; returns its id."""
        out = self.new_tensor(out_var) if shape is None else self.new_tensor_shape(shape)
        node = _Node(op, inputs, out, attrs)
        if before is None:
            self.graph.nodes.append(node)
        else:
            index = next(i for i, n in enumerate(self.graph.nodes) if n is before)
            self.graph.nodes.insert(index, node)
        self.open_node[out] = node
        return out

    def new_tensor_shape(self, shape: Sequence[int]) -> int:
        self.graph.tensors.append({"shape": [int(d) for d in shape], "dtype": "float32"})
        return len(self.graph.tensors) - 1

    def data_of(self, expr: relax.Expr) -> int:
        """Tensor id of ``expr`` as a data operand: a reshape inside the composite becomes a node."""
        if expr in self.flattened:
            source, shape = self.flattened.pop(expr)
            out = self.emit("reshape", [source], None, {}, shape=shape)
            self.open_node.pop(out)
            self.tid[expr] = out
            return out
        return self.lookup(expr)

    def op_call(self, var: relax.Var, call: relax.Call) -> Any:
        op = op_name(call)
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
            return self.emit("conv2d", [self.data_of(call.args[0]), self.lookup(call.args[1])], var, attrs)
        if op == "relax.matmul":
            return self.matmul(var, call)
        if op == "relax.permute_dims":
            self.transposed.add(var)
            return self.lookup(call.args[0])
        if op == "relax.reshape":
            # a bias reshaped to [1, C, 1, 1] only needs its values; a reshape feeding a matmul
            # (a flatten) becomes a reshape node when the matmul reads it (data_of)
            source = self.lookup(call.args[0])
            self.flattened[var] = (source, static_shape(var))
            return source
        if op == "relax.add":
            return self.add(var, call)
        if op == "relax.multiply":
            return self.binary(var, call, "mul")
        if op == "relax.nn.batch_norm":
            return self.batch_norm(call)
        if op in ACTIVATIONS:
            return self.activation(var, call)
        if op in ("relax.nn.max_pool2d", "relax.nn.avg_pool2d"):
            a = call.attrs
            algorithm = "max"
            if op == "relax.nn.avg_pool2d":
                algorithm = "avg_include_padding" if bool(a.count_include_pad) else "avg_exclude_padding"
            attrs = {
                "algorithm": algorithm,
                "kernel": [int(k) for k in a.pool_size],
                "strides": [int(k) for k in a.strides],
                "padding": [int(k) for k in a.padding],
                "dilation": [int(k) for k in a.dilation],
                "ceil_mode": int(bool(a.ceil_mode)),
            }
            return self.emit("pool2d", [self.data_of(call.args[0])], var, attrs)
        if op == "relax.nn.adaptive_avg_pool2d":
            n, c, h, w = static_shape(call.args[0])
            _, _, oh, ow = static_shape(var)
            attrs = {"algorithm": "avg_exclude_padding", "kernel": [h // oh, w // ow],
                     "strides": [h // oh, w // ow]}
            return self.emit("pool2d", [self.data_of(call.args[0])], var, attrs)
        if op == "relax.mean":
            reason = spatial_mean_axes(call)
            if reason:
                raise self.fail(reason)
            n, c, h, w = static_shape(call.args[0])
            attrs = {"algorithm": "avg_exclude_padding", "kernel": [h, w], "strides": [1, 1]}
            if bool(call.attrs.keepdims):
                return self.emit("pool2d", [self.data_of(call.args[0])], var, attrs)
            pooled = self.emit("pool2d", [self.data_of(call.args[0])], None, attrs, shape=[n, c, 1, 1])
            return self.emit("reshape", [pooled], var, {})
        if op == "relax.nn.softmax":
            return self.emit("softmax", [self.data_of(call.args[0])], var, {"axis": int(call.attrs.axis)})
        raise self.fail(f"the runtime has no kernel for {op}")

    def matmul(self, var: relax.Var, call: relax.Call) -> int:
        data, weight = call.args[0], call.args[1]
        transposed = weight in self.transposed
        weight_rank = len(static_shape(weight))
        if weight_rank == 2:
            attrs = {"weight_layout": "NK" if transposed else "KN", "has_bias": 0, "activation": "none"}
            return self.emit("dense", [self.data_of(data), self.lookup(weight)], var, attrs)
        attrs = {"transpose_b": int(transposed), "has_bias": 0, "activation": "none"}
        return self.emit("matmul", [self.data_of(data), self.data_of(weight)], var, attrs)

    def add(self, var: relax.Var, call: relax.Call) -> int:
        """A bias or residual add fused into the open node it follows, or a binary node."""
        lhs, rhs = self.lookup(call.args[0]), self.lookup(call.args[1])
        chain = lhs if lhs in self.open_node else rhs if rhs in self.open_node else None
        node = self.open_node.get(chain)
        if node is None or node.op not in _ANCHORS or lhs == rhs:
            return self.binary(var, call, "add")
        operand_expr = call.args[1] if chain == lhs else call.args[0]
        operand = rhs if chain == lhs else lhs
        out_shape = self.graph.tensors[node.output]["shape"]
        operand_shape = list(static_shape(operand_expr))
        channel_axis = 1 if node.op == "conv2d" else -1
        fresh = not node.attrs["has_bias"] and node.attrs["activation"] == "none" and \
            not node.attrs.get("residual") and not node.folded
        if fresh and is_per_channel(tuple(operand_shape), tuple(out_shape), channel_axis):
            node.attrs["has_bias"] = 1
            node.inputs.insert(2, operand)
            return node.output
        if not node.attrs.get("residual") and operand_shape == out_shape:
            node.attrs["residual"] = 1
            node.attrs["post_activation"] = "none"
            node.inputs.append(operand)
            return node.output
        raise self.fail(f"add of shape {operand_shape} after {node.op} is neither a bias nor a residual")

    def binary(self, var: relax.Var, call: relax.Call, algorithm: str) -> int:
        inputs = [self.data_of(call.args[0]), self.data_of(call.args[1])]
        return self.emit("binary", inputs, var, {"algorithm": algorithm, "activation": "none"})

    def activation(self, var: relax.Var, call: relax.Call) -> int:
        act = activation_of(call)
        if isinstance(act, str):
            raise self.fail(act)
        name, clip = act
        source = self.lookup(call.args[0])
        node = self.open_node.get(source)
        if node is not None and node.op in _ANCHORS + ("binary",):
            key = "post_activation" if node.attrs.get("residual") else "activation"
            if node.attrs.get(key, "none") == "none":
                node.attrs[key] = name
                if clip is not None:
                    node.attrs["post_clip" if key == "post_activation" else "clip"] = clip
                return node.output
        attrs = {"algorithm": name}
        if clip is not None:
            attrs["clip"] = clip
        return self.emit("eltwise", [self.data_of(call.args[0])], var, attrs)

    def batch_norm(self, call: relax.Call) -> tuple[int, ...]:
        """Fold an inference batch norm into the open conv2d: two nodes computing its weight and
        bias from the statistics (run once, at load, when they are constants)."""
        source = self.lookup(call.args[0])
        node = self.open_node.get(source)
        if node is None or node.op != "conv2d" or node.attrs["activation"] != "none" or \
                node.attrs.get("residual") or node.folded:
            raise self.fail("batch_norm does not directly follow a conv2d (and its bias) it could be folded into")
        eps = float(call.attrs.epsilon)
        gamma, beta, mean, var = (self.lookup(a) for a in call.args[1:5])
        weight = node.inputs[1]
        channels = self.graph.tensors[weight]["shape"][0]
        folded_w = self.emit("bn_fold_weight", [weight, gamma, var], None, {"epsilon": eps},
                             shape=self.graph.tensors[weight]["shape"], before=node)
        bias_inputs = [gamma, beta, mean, var]
        if node.attrs["has_bias"]:
            bias_inputs.append(node.inputs[2])
        folded_b = self.emit("bn_fold_bias", bias_inputs, None,
                             {"epsilon": eps, "has_bias": int(bool(node.attrs["has_bias"]))},
                             shape=[channels], before=node)
        for tid in (folded_w, folded_b):
            self.open_node.pop(tid)
        node.inputs = [node.inputs[0], folded_w, folded_b]
        node.attrs["has_bias"] = 1
        node.folded = True
        return (node.output,)


_ANCHORS = ("conv2d", "dense", "matmul")


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
