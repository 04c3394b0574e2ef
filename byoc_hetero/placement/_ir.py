"""Placement-specific helpers over Relax IR: what a rule calls a call, device-typed tensor types,
object keys, copy sizes, and the attributes placement writes.

Facts about Relax that are not about placement (op names, static shapes, entry functions, the
region table) live in :mod:`byoc_hetero._relax`."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import tvm
from tvm import relax

from .._relax import op_name, static_shape

#: Relax ops whose first argument names the callee (an ExternFunc or a PrimFunc's GlobalVar).
CALL_OPS = ("relax.call_tir", "relax.call_dps_packed", "relax.call_pure_packed", "relax.call_packed",
            "relax.call_tir_inplace", "relax.call_tir_with_grad")
#: Relax ops that call a kernel (a PrimFunc's GlobalVar) with explicit output types.
TIR_CALLS = ("relax.call_tir", "relax.call_tir_inplace")
COPY_OP = "relax.to_vdevice"
HINT_OP = "relax.hint_on_device"

#: Function attributes placement writes and reads.
ATTR_CONSTANTS = "byoc_hetero.device_constants"   # on an entry function: the name of its loader
ATTR_CONSTANTS_FOR = "byoc_hetero.constants_for"  # on a loader: the entry function it feeds
ATTR_NUM_CONSTANTS = "byoc_hetero.num_device_constants"  # on an entry function: trailing lifted params


def key(obj) -> int:
    """Identity key of a TVM object (its address), for dictionaries keyed by IR nodes.

    (Some TVM classes override ``__eq__``/``__hash__``; the handle address never lies.)"""
    return obj.__chandle__()


def callee_name(expr) -> str | None:
    """The symbol of an ExternFunc or the name of a GlobalVar; None otherwise."""
    if isinstance(expr, relax.ExternFunc):
        return str(expr.global_symbol)
    if isinstance(expr, relax.GlobalVar):
        return expr.name_hint
    return None


def site_name(call: relax.Call) -> str:
    """What a placement rule calls this call: the op name, or the callee of call_tir/call_dps_packed/
    call_pure_packed (``"my.cpu_only_op"``), or the called function's name."""
    op = op_name(call)
    if op in CALL_OPS and call.args:
        name = callee_name(call.args[0])
        if name is not None:
            return name
    if op is not None:
        return op
    return callee_name(call.op) or type(call.op).__name__


def tensor_leaves(ty) -> Iterator[relax.TensorType]:
    """The tensor types inside a (possibly nested tuple) type."""
    if isinstance(ty, relax.TensorType):
        yield ty
    elif isinstance(ty, relax.TupleType):
        for field in ty.fields:
            yield from tensor_leaves(field)


def has_tensor(ty) -> bool:
    return next(tensor_leaves(ty), None) is not None


def with_vdevice(ty, vdevice: relax.VDevice):
    """``ty`` with every tensor in it on ``vdevice``."""
    if isinstance(ty, relax.TensorType):
        if ty.shape is not None:
            return relax.TensorType(ty.shape, ty.dtype, vdevice)
        return relax.TensorType(None, ty.dtype, vdevice, ndim=ty.ndim)
    if isinstance(ty, relax.TupleType):
        return relax.TupleType([with_vdevice(f, vdevice) for f in ty.fields])
    return ty


def with_vdevice_tree(ty, tree, vdevice_of):
    """``ty`` with each tensor leaf on the device given by the matching leaf of ``tree``
    (``vdevice_of(leaf)`` → VDevice); a non-tuple ``tree`` applies to every leaf."""
    if isinstance(ty, relax.TupleType) and isinstance(tree, tuple):
        return relax.TupleType([with_vdevice_tree(f, t, vdevice_of) for f, t in zip(ty.fields, tree)])
    if tree is None or isinstance(tree, tuple):
        return ty
    return with_vdevice(ty, vdevice_of(tree))


def vdevices_in(ty) -> list:
    """The vdevice of each tensor leaf of ``ty`` (None where a tensor has none)."""
    return [t.vdevice for t in tensor_leaves(ty)]


def nbytes(ty) -> int | None:
    """Bytes of the tensors in ``ty`` (None when a shape or dtype is not static)."""
    total = 0
    for t in tensor_leaves(ty):
        shape = static_shape(t)
        if shape is None or t.dtype is None or str(t.dtype) == "":
            return None
        dt = tvm.runtime.DataType(str(t.dtype))
        total += int(np.prod(shape, dtype=np.int64)) * ((dt.bits * dt.lanes + 7) // 8)
    return total


def bindings(func: relax.Function) -> Iterator[tuple[relax.BindingBlock, relax.Binding]]:
    """Every binding of a function's top-level body, with its block."""
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return
    for block in body.blocks:
        for binding in block.bindings:
            yield block, binding
