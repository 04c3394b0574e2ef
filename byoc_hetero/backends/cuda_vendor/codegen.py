"""Codegen of backend ``cuda_vendor`` (``relax.ext.cuda_vendor``): each region → one document → one runtime module.

The document (format ``byoc_hetero.cuda_region``, version 2; docs/backends.md) lists the region's
tensors (float32, static shapes), its inputs, its named constants (the bound weights and biases,
given to the module once by TVM's const loader and copied to each GPU at its first call there),
one node per composite — ``gemm`` (cuBLASLt, :func:`.gemm.gemm_node`) or ``conv2d`` (cuDNN,
:func:`.conv.conv2d_node`) — and its outputs. The codegen only translates: what it cannot
translate is a bug in the checks (:func:`.gemm.check_gemm`, :func:`.conv.check_conv2d`) and
raises :class:`CodegenError` naming the region.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tvm
from tvm import relax

from ..._relax import alias_of, function_outputs, op_name, short_op_name, static_shape, tensor_dtype
from ...errors import ByocError, CodegenError
from .conv import conv2d_node
from .gemm import DTYPES, gemm_node
from .runtime import create_module

FORMAT = "byoc_hetero.cuda_region"
VERSION = 2
"""2: conv2d nodes (cuDNN) beside gemm nodes, float16 tensors, a gemm's ``compute``; the runtime
still loads version 1 (float32 gemm nodes only)."""

NODE_KINDS = {"matmul": ("gemm", gemm_node), "nn.conv2d": ("conv2d", conv2d_node)}
"""A composite's anchor op (short name) → the node op it becomes and the function that writes the
node's inputs and attrs from the composite's calls."""


class _Region:
    """The walk of one region function: value → tensor id, and the document being written."""

    def __init__(self, func: relax.Function, constant_names: Any, options: Mapping[str, Any]):
        self.symbol = str(func.attrs["global_symbol"])
        self.func = func
        self.options = options
        self.constant_names = constant_names
        self.doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "symbol": self.symbol, "tensors": [],
                                    "inputs": [], "constants": [], "nodes": [], "outputs": [],
                                    "source": {"target": "cuda_vendor", "composites": [], "ops": {}}}
        self.tid: dict[Any, Any] = {}
        self.const_ids: dict[str, int] = {}
        self.local_funcs: dict[Any, relax.Function] = {}

    def fail(self, what: str) -> CodegenError:
        return CodegenError(f"cuda region {self.symbol}: {what}")

    def new_tensor(self, expr: relax.Expr) -> int:
        shape = static_shape(expr)
        if shape is None:
            raise self.fail(f"value {expr.ty} has no static shape")
        dtype = tensor_dtype(expr)
        if dtype not in DTYPES:
            raise self.fail(f"value {expr.ty} is {dtype or 'not a tensor'}: a region holds {' and '.join(DTYPES)}")
        self.doc["tensors"].append({"shape": [int(d) for d in shape], "dtype": dtype})
        return len(self.doc["tensors"]) - 1

    def lookup(self, expr: relax.Expr) -> Any:
        if isinstance(expr, tvm.ir.Constant):
            name = self.constant_names.get(expr) if hasattr(self.constant_names, "get") else None
            if name is None:
                raise self.fail("a constant inside the region has no name from RunCodegen")
            if str(name) not in self.const_ids:
                self.const_ids[str(name)] = self.new_tensor(expr)
                self.doc["constants"].append({"name": str(name), "tensor": self.const_ids[str(name)]})
            return self.const_ids[str(name)]
        if expr not in self.tid:
            raise self.fail(f"value {expr} is used before it is defined")
        return self.tid[expr]

    def alias(self, var: relax.Var, value: relax.Expr) -> None:
        known, self.tid[var] = alias_of(value, self.lookup)
        if not known:
            raise self.fail(f"unsupported binding {type(value).__name__}")

    def run(self) -> dict[str, Any]:
        for param in self.func.params:
            self.tid[param] = self.new_tensor(param)
            self.doc["inputs"].append(self.tid[param])
        for block in self.func.body.blocks:
            for binding in block.bindings:
                var, value = binding.var, binding.value
                if isinstance(value, relax.Function):
                    self.local_funcs[var] = value
                elif isinstance(value, relax.Call) and value.op in self.local_funcs:
                    self.tid[var] = self.composite(self.local_funcs[value.op], [self.lookup(a) for a in value.args])
                else:
                    self.alias(var, value)
        written = {n["output"] for n in self.doc["nodes"]}
        for out in function_outputs(self.func):
            tid = self.lookup(out)
            if tid not in written:
                raise self.fail("a region output that is an input or constant")
            self.doc["outputs"].append(tid)
        return self.doc

    def composite(self, func: relax.Function, arg_ids: Sequence[int]) -> int:
        """One composite (a rule of :mod:`.gemm` or :mod:`.conv`) → one node of the op its anchor
        names (:data:`NODE_KINDS`); returns its output's tensor id."""
        name = str(func.attrs["Composite"])
        self.doc["source"]["composites"].append(name)
        self.tid.update(zip(func.params, arg_ids))
        calls: dict[str, list[tuple[relax.Var, relax.Call]]] = {}
        for block in func.body.blocks:
            for b in block.bindings:
                if not isinstance(b.value, relax.Call) or op_name(b.value) is None:
                    raise self.fail(f"composite {name} binds a {type(b.value).__name__}")
                short = short_op_name(op_name(b.value))
                self.doc["source"]["ops"][short] = self.doc["source"]["ops"].get(short, 0) + 1
                calls.setdefault(short, []).append((b.var, b.value))
        anchor = next((a for a in NODE_KINDS if a in calls), None)
        if anchor is None:
            raise self.fail(f"composite {name} has none of the anchors {sorted(NODE_KINDS)}")
        op, make_node = NODE_KINDS[anchor]
        out_var = func.body.body
        try:
            inputs, attrs = make_node(calls, self.lookup, out_var, self.options)
        except ValueError as err:
            raise self.fail(f"composite {name}: {err}") from err
        node_out = self.new_tensor(out_var)
        self.doc["nodes"].append({"op": op, "inputs": inputs, "output": node_out, "attrs": attrs})
        return node_out


def region_document(func: relax.Function, constant_names: Any,
                    options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The document of one outlined region function (see the module's doc); ``options`` are the
    backend's as the stages checked them (the package's ``OPTIONS``)."""
    return _Region(func, constant_names, options or {}).run()


def relax_ext_codegen(funcs: Sequence[relax.Function], options: Mapping[str, Any] | None = None,
                      constant_names: Any = None) -> list[tvm.runtime.Module]:
    """``relax.ext.cuda_vendor``: RunCodegen's call for the regions of backend ``cuda_vendor``."""
    modules = []
    for func in funcs:
        document = region_document(func, constant_names or {}, options)
        try:
            modules.append(create_module(document))
        except ByocError as err:
            raise CodegenError(f"cuda region {document['symbol']}: {err}") from err
    return modules


__all__ = ["FORMAT", "NODE_KINDS", "VERSION", "region_document", "relax_ext_codegen"]
