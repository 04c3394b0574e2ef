"""Declared dim ranges, enforced by the built module itself.

A model may declare the range of a symbolic dim (``bh.from_onnx(path, dim_ranges={"N": (1, 64)})``,
``torch.export.Dim("N", min=1, max=64)`` through ``bh.from_torch(..., dynamic_shapes=...)``): the
function attributes :func:`byoc_hetero.inputs.dim_ranges` reads. ``bh.vm``, the CLI and the placement
VM check them before a call, but a TVM user runs the built module with a plain
``relax.VirtualMachine``, possibly after ``export_library`` / ``load_module``. Two checks make that
path safe too, both raising :class:`~byoc_hetero.errors.InputError` (it crosses TVM's FFI with its
type):

* :func:`insert_range_checks` (run by ``bh.partition``'s last stage) puts a call of the runtime's
  global ``byoc_hetero.runtime.check_dim_ranges`` (C++, registered when ``byoc_hetero`` is
  imported, so it works after a reload) at the start of the function, once per input that first
  carries a ranged symbol. Why it matters beyond the regions: TVM's memory planning sizes the
  buffers of the parts that run on llvm by the declared upper bounds (``tir_var_upper_bound``), and
  the importers rely on a bound to drop clips (``byoc_hetero.passes.inbound_slices``); a call
  past the bound would write past those buffers or read past a table.
* :func:`codegen_options` hands the ranges to the codegen, which writes them into each region's
  document (``dim_ranges``, format version 3, docs/region-format.md); the runtime checks them where
  it binds the symbols from a call's shapes, i.e. only when the shapes changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import tvm
from tvm import relax

from ._relax import op_name
from .inputs import dim_ranges, tensor_spec

CHECK_FUNC = "byoc_hetero.runtime.check_dim_ranges"
"""The runtime's global that checks one input's dims (cpp/region_module.cc)."""

NO_BOUND = -1
"""An open end, as the check's arguments and the C++ side write it."""


def is_range_check(call: relax.Call) -> bool:
    """Whether ``call`` is a check :func:`with_range_checks` inserted (no op of the model: profiles
    and reports leave it out)."""
    return (op_name(call) == "relax.call_pure_packed" and len(call.args) > 0
            and isinstance(call.args[0], relax.ExternFunc) and str(call.args[0].global_symbol) == CHECK_FUNC)


def _bare_dims(var: relax.Var) -> list[tuple[int, str]]:
    """(axis, symbol) of each dim of a tensor parameter that is a bare symbolic variable."""
    spec = tensor_spec(var)
    if spec is None or spec.shape is None:
        return []
    return [(axis, d) for axis, d in enumerate(spec.shape) if isinstance(d, str)]


def with_range_checks(func: relax.Function, name: str) -> relax.Function:
    """``func`` checking its declared ranges first (itself when it declares none).

    Each parameter that is the first to carry a ranged symbol as a bare dim is replaced by a fresh
    parameter of the same name and type; the old variable is bound to the check's result (the same
    tensor) in a binding block before the body, so every use of the input follows its check.
    """
    ranges = dim_ranges(func)
    if not ranges:
        return func
    if _has_checks(func):
        return func  # the stage ran twice
    specs = [tensor_spec(p) for p in func.params]
    checked: set[str] = set()
    params, bindings = [], []
    for index, param in enumerate(func.params):
        dims = [(axis, s) for axis, s in _bare_dims(param) if s in ranges and s not in checked]
        if not dims:
            params.append(param)
            continue
        spec = specs[index]
        fresh = relax.Var(param.name, param.ty)
        args: list[relax.Expr] = [fresh, tvm.ir.StringImm(f"{name}: input {index} ({param.name!r})"),
                                  tvm.ir.StringImm(spec.shape_text())]
        for axis, symbol in dims:
            lo, hi = ranges[symbol]
            args += [relax.prim_value(axis), tvm.ir.StringImm(symbol),
                     relax.prim_value(NO_BOUND if lo is None else lo), relax.prim_value(NO_BOUND if hi is None else hi)]
            checked.add(symbol)
        bindings.append(relax.VarBinding(param, relax.op.call_pure_packed(CHECK_FUNC, *args, ty_args=param.ty)))
        params.append(fresh)
    if not bindings:
        return func  # no ranged symbol is a bare dim of an input (the VM cannot see it at entry)
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        body = relax.SeqExpr([], body)
    body = relax.SeqExpr([relax.BindingBlock(bindings)] + list(body.blocks), body.body, body.span)
    return relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs, func.span)


def _has_checks(func: relax.Function) -> bool:
    """Whether ``func`` starts with the checks :func:`with_range_checks` puts there."""
    body = func.body
    if not isinstance(body, relax.SeqExpr) or not body.blocks:
        return False
    return any(isinstance(b.value, relax.Call) and is_range_check(b.value) for b in body.blocks[0].bindings)


def insert_range_checks(mod: tvm.IRModule, functions: list[str]) -> tvm.IRModule:
    """``mod`` whose ``functions`` check their declared ranges first (:func:`with_range_checks`)."""
    out = None
    for name in functions:
        func = mod[name]
        checked = with_range_checks(func, name)
        if checked is not func:
            out = out or mod.clone()
            out[name] = checked
    return out if out is not None else mod


def codegen_options(mod: tvm.IRModule, functions: list[str]) -> dict[str, str]:
    """The codegen option ``{"dim_ranges": json}``: the declared range of each symbol of
    ``functions`` (``{"N": [1, 64]}``, null for an open end); empty without any.

    A region is outlined from one function but the codegen does not know which, so a symbol name
    declared with different ranges by two functions is left out (their own checks still hold)."""
    merged: dict[str, tuple[int | None, int | None] | None] = {}
    for name in functions:
        for symbol, lo_hi in dim_ranges(mod[name]).items():
            merged[symbol] = lo_hi if merged.get(symbol, lo_hi) == lo_hi else None
    ranges = {s: list(r) for s, r in merged.items() if r is not None}
    return {"dim_ranges": json.dumps(ranges, sort_keys=True)} if ranges else {}


def region_ranges(symbols: list[str], declared: Mapping[str, tuple[int | None, int | None]],
                  opaque: Mapping[str, str]) -> dict[str, list[int | None]]:
    """The ``dim_ranges`` of one region document: the declared range of each of its ``symbols``;
    an opaque symbol (``opaque``: name -> the product it stands for, ``B * S``) gets the product
    of its factors' ranges when each factor has one (an open end stays open)."""
    out: dict[str, list[int | None]] = {}
    for symbol in symbols:
        if symbol in declared:
            out[symbol] = list(declared[symbol])
        elif symbol in opaque:
            factors = [f.strip() for f in opaque[symbol].split("*")]
            if not all(f.isidentifier() and f in declared or f.isdigit() for f in factors):
                continue
            lo, hi = 1, 1  # an open lower end is 1: dims are >= 1
            for f in factors:
                flo, fhi = (int(f), int(f)) if f.isdigit() else declared[f]
                lo *= flo or 1
                hi = None if hi is None or fhi is None else hi * fhi
            if lo > 1 or hi is not None:
                out[symbol] = [lo if lo > 1 else None, hi]
    return out
