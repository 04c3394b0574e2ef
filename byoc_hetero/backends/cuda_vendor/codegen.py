"""Codegen of backend ``cuda_vendor`` (``relax.ext.cuda_vendor``): each region → one document → one runtime module.

The document (format ``byoc_hetero.cuda_region``, version 1; docs/backends.md) lists the region's
tensors (float32, static shapes), its inputs, its named constants (the bound weights and biases,
given to the module once by TVM's const loader and copied to each GPU at its first call there),
one ``gemm`` node per composite and its outputs. Each node's attrs say what cuBLASLt computes
(:func:`.gemm.gemm_attrs`). The codegen only translates: what it cannot translate is a bug in
:func:`.gemm.check_gemm` and raises :class:`CodegenError` naming the region.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tvm
from tvm import relax

from ..._relax import alias_of, function_outputs, op_name, short_op_name, static_shape
from ...errors import ByocError, CodegenError
from .gemm import EPILOGUE_ACTIVATIONS, gemm_attrs
from .runtime import create_module

FORMAT = "byoc_hetero.cuda_region"
VERSION = 1


class _Region:
    """The walk of one region function: value → tensor id, and the document being written."""

    def __init__(self, func: relax.Function, constant_names: Any):
        self.symbol = str(func.attrs["global_symbol"])
        self.func = func
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
        self.doc["tensors"].append({"shape": [int(d) for d in shape], "dtype": "float32"})
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
        """One composite (a rule of :mod:`.gemm`) → one gemm node; returns its output's tensor id."""
        self.doc["source"]["composites"].append(str(func.attrs["Composite"]))
        self.tid.update(zip(func.params, arg_ids))
        calls = {}
        for block in func.body.blocks:
            for b in block.bindings:
                if not isinstance(b.value, relax.Call) or op_name(b.value) is None:
                    raise self.fail(f"composite {func.attrs['Composite']} binds a {type(b.value).__name__}")
                short = short_op_name(op_name(b.value))
                self.doc["source"]["ops"][short] = self.doc["source"]["ops"].get(short, 0) + 1
                calls[short] = (b.var, b.value)
        if "matmul" not in calls:
            raise self.fail(f"composite {func.attrs['Composite']} has no matmul")
        anchor_var, anchor = calls["matmul"]
        data, weight = anchor.args
        transposed = "permute_dims" in calls and weight.same_as(calls["permute_dims"][0])
        if transposed:
            weight = calls["permute_dims"][1].args[0]
        inputs = [self.lookup(data), self.lookup(weight)]
        if "add" in calls:
            add = calls["add"][1]
            inputs.append(self.lookup(add.args[1] if add.args[0].same_as(anchor_var) else add.args[0]))
        activation = next((a for a in EPILOGUE_ACTIVATIONS if f"nn.{a}" in calls), "none")
        out_var = func.body.body
        node_out = self.new_tensor(out_var)
        self.doc["nodes"].append({"op": "gemm", "inputs": inputs, "output": node_out,
                                  "attrs": gemm_attrs(data, weight, out_var, transposed, activation)})
        return node_out


def region_document(func: relax.Function, constant_names: Any) -> dict[str, Any]:
    """The document of one outlined region function (see the module's doc)."""
    return _Region(func, constant_names).run()


def relax_ext_codegen(funcs: Sequence[relax.Function], _options: Mapping[str, Any] | None = None,
                      constant_names: Any = None) -> list[tvm.runtime.Module]:
    """``relax.ext.cuda_vendor``: RunCodegen's call for the regions of backend ``cuda_vendor``."""
    modules = []
    for func in funcs:
        document = region_document(func, constant_names or {})
        try:
            modules.append(create_module(document))
        except ByocError as err:
            raise CodegenError(f"cuda region {document['symbol']}: {err}") from err
    return modules


__all__ = ["FORMAT", "VERSION", "region_document", "relax_ext_codegen"]
