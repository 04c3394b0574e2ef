"""Fold small integer / bool computations of constants and static shapes before partitioning.

Exporters and frontends spell index and mask bookkeeping as int64 / bool op chains that depend only
on constants and on static shapes: ``torch.onnx.export`` normalises ViT's class-token index
``x[:, 0]`` as ``where(less(0, 0), add(0, take(shape_to_tensor(shape_of(x)), 1)), 0)``; TVM's torch
frontend writes position ids and causal masks as ``arange``, ``expand_dims``, ``greater_equal``,
``broadcast_to``, ``full``. None of it has a runtime kernel (the runtime computes float32), so it ran
on llvm, and where it read a region's output (``shape_of``) it split the model into two regions.

This pass evaluates such bindings with numpy, replaces their uses by constants and leaves the
rest alone. It replaces only bindings whose result is an integer or bool tensor (or a shape) of at
most :data:`MAX_ELEMENTS` elements. Small float steps between such bindings are evaluated too but
not replaced: DeBERTa-v2's relative positions are int64 ``arange`` differences bucketed through
float ``log`` / ``ceil`` / ``where`` and cast back to int64 (issue 39), its attention mask a float
``ones`` cast to bool; the int64 positions and the bool mask become constants, and the float steps
between, read by nothing else, go with the dead code. Float steps that are never cast back are
:mod:`.fold_weight_subgraphs`' job. weights are never folded (TVM's ``FoldConstant`` would also fold
the transposes of every weight, measured 37 s on BERT-base, and change the layouts the rules see).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

MAX_ELEMENTS = 1 << 16
"""The largest folded result (elements): masks of a few sequences, position ids."""

_BINARY = {
    "relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
    "relax.less": np.less, "relax.less_equal": np.less_equal, "relax.greater": np.greater,
    "relax.greater_equal": np.greater_equal, "relax.equal": np.equal, "relax.not_equal": np.not_equal,
    "relax.logical_and": np.logical_and, "relax.logical_or": np.logical_or,
    "relax.bitwise_and": np.bitwise_and, "relax.bitwise_or": np.bitwise_or,
    # index arithmetic (torch.roll's indices in Swin's cyclic shift: (arange + shift) mod n)
    "relax.floor_mod": np.mod, "relax.mod": np.fmod, "relax.floor_divide": np.floor_divide,
    "relax.maximum": np.maximum, "relax.minimum": np.minimum,
}
_UNARY = {
    "relax.logical_not": np.logical_not, "relax.bitwise_not": np.invert, "relax.negative": np.negative,
    "relax.abs": np.abs, "relax.sign": np.sign,
    # float steps of position bucketing (DeBERTa-v2's log buckets)
    "relax.log": np.log, "relax.ceil": np.ceil, "relax.floor": np.floor,
    "relax.sqrt": np.sqrt, "relax.exp": np.exp,
    # the default exporter's guard before a float -> int cast: where(not isfinite(x), 0, x)
    "relax.isfinite": np.isfinite, "relax.isnan": np.isnan, "relax.isinf": np.isinf,
}


def _int(v) -> int | None:
    value = getattr(v, "value", v)
    value = getattr(value, "value", value)
    return int(value) if isinstance(value, (int, np.integer)) else None


def _ints(values) -> list[int] | None:
    out = [_int(v) for v in values]
    return None if any(v is None for v in out) else out


class Evaluator:
    """Values of the bindings seen so far that are known (numpy arrays, or tuples for shapes).

    :meth:`call` evaluates one op on the known values with numpy (None when an argument is unknown
    or the op is not one read here); :mod:`.fold_weight_subgraphs` uses it for the index and layout
    ops of float computations on constants alone."""

    def __init__(self):
        self.known: dict[relax.Var, object] = {}

    def value(self, expr):
        if isinstance(expr, relax.Var):
            return self.known.get(expr)
        if isinstance(expr, relax.ShapeExpr):
            dims = _ints(expr.values)
            return tuple(dims) if dims is not None else None
        if isinstance(expr, tvm.ir.GenericConst):
            return expr.value.numpy()
        if _int(expr) is not None and not isinstance(expr, relax.Var):
            return _int(expr)  # a PrimValue (an IntImm here)
        if isinstance(expr, tvm.ir.Constant) and hasattr(expr, "data"):
            return expr.data.numpy()
        if isinstance(expr, tvm.tirx.FloatImm):
            return float(expr.value)  # clip's float bounds
        if isinstance(expr, relax.Tuple):
            values = tuple(self.value(f) for f in expr.fields)
            return None if any(v is None for v in values) else values
        return None

    def call(self, call: relax.Call):  # noqa: C901 - one branch per op, each a line or two
        op = call.op.name if isinstance(call.op, tvm.ir.Op) else None
        if op is None:
            return None
        if op == "relax.shape_of":
            shape = getattr(call.args[0].ty, "shape", None)
            dims = _ints(shape.values) if isinstance(shape, relax.ShapeExpr) else None
            return tuple(dims) if dims is not None else None
        if op == "relax.arange":
            bounds = [self.value(a) for a in call.args[:3]]
            if any(not isinstance(b, int) for b in bounds):
                return None
            return np.arange(*bounds, dtype=str(call.attrs.dtype))
        args = [self.value(a) for a in call.args]
        if any(a is None for a in args):
            return None
        if op == "relax.shape_to_tensor":
            return np.array(args[0], dtype="int64")
        if op in _BINARY:
            return _BINARY[op](np.asarray(args[0]), np.asarray(args[1]))
        if op in _UNARY:
            return _UNARY[op](np.asarray(args[0]))
        if op == "relax.divide" and str(getattr(call.ty, "dtype", "")).startswith("float"):
            return np.true_divide(args[0], args[1])  # integer division's rounding is the op's to define
        if op == "relax.clip":
            return np.clip(args[0], args[1], args[2])
        if op in ("relax.ones", "relax.zeros") and isinstance(args[0], tuple):
            return (np.ones if op == "relax.ones" else np.zeros)(args[0], dtype=str(call.attrs.dtype))
        if op == "relax.where":
            return np.where(args[0], args[1], args[2])
        if op == "relax.astype":
            return np.asarray(args[0]).astype(str(call.attrs.dtype))
        if op == "relax.full":
            return np.full(args[0], np.asarray(args[1]).reshape(()), dtype=str(call.attrs.dtype))
        if op in ("relax.reshape", "relax.broadcast_to") and isinstance(args[1], tuple):
            fn = np.reshape if op == "relax.reshape" else np.broadcast_to
            return np.ascontiguousarray(fn(args[0], args[1]))
        if op == "relax.expand_dims":
            return np.expand_dims(args[0], tuple(int(a) for a in call.attrs.axis))
        if op == "relax.squeeze":
            axis = call.attrs.axis
            return np.squeeze(args[0], None if axis is None else tuple(int(a) for a in axis))
        if op == "relax.permute_dims":
            axes = call.attrs.axes
            return np.transpose(args[0], None if axes is None else [int(a) for a in axes])
        if op == "relax.take":
            table, axis = np.asarray(args[0]), call.attrs.axis
            axis = 0 if axis is None else int(axis)
            mode = str(getattr(call.attrs, "mode", "fast"))
            if mode == "fast" and (np.any(args[1] < 0) or np.any(args[1] >= table.shape[axis])):
                return None  # out of range: leave it to the op's own checks
            return np.take(table, args[1], axis=axis, mode="wrap" if mode == "wrap" else "clip")
        if op in _LAYOUT:
            return _LAYOUT[op](call, args)
        return None


def _strided_slice(call: relax.Call, args: list) -> np.ndarray | None:
    """``strided_slice(x, axes, begin, end, strides)`` with Python's slice semantics (negative bounds
    count from the end, bounds past it are clamped); negative strides are left alone."""
    x, axes, begin, end = np.asarray(args[0]), args[1], args[2], args[3]
    strides = args[4] if len(args) > 4 and args[4] is not None else (1,) * len(axes)
    if len(strides) == 1 and len(axes) > 1:
        strides = strides * len(axes)
    index = [slice(None)] * x.ndim
    for axis, b, e, s in zip(axes, begin, end, strides):
        if s <= 0:
            return None
        index[axis % x.ndim] = slice(b, e, s)
    return x[tuple(index)]


def _scatter_nd(call: relax.Call, args: list) -> np.ndarray | None:
    """ONNX ScatterND with reduction "update": ``out[indices[i]] = updates[i]``; indices out of range or
    repeated (whose order ONNX leaves undefined) are left alone."""
    data, indices, updates = (np.asarray(a) for a in args[:3])
    if str(getattr(call.attrs, "reduction", "update")) != "update" or indices.ndim == 0:
        return None
    depth = indices.shape[-1]
    rows = indices.reshape(-1, depth)
    bounds = np.array(data.shape[:depth])
    if np.any(rows < 0) or np.any(rows >= bounds) or len(np.unique(rows, axis=0)) != len(rows):
        return None
    out = data.copy()
    out[tuple(rows.T)] = updates.reshape(len(rows), *data.shape[depth:])
    return out


def _slice_scatter(call: relax.Call, args: list) -> np.ndarray | None:
    """torch's ``slice_scatter(x, src, start, end, step, axis)``: ``x`` with ``x[..., start:end:step]``
    (along ``axis``) replaced by ``src``."""
    x, src, start, end, step = np.asarray(args[0]), np.asarray(args[1]), args[2], args[3], args[4]
    if not all(isinstance(v, int) for v in (start, end, step)) or step <= 0:
        return None
    out = x.copy()
    index = [slice(None)] * x.ndim
    index[int(call.attrs.axis) % x.ndim] = slice(start, end, step)
    out[tuple(index)] = src
    return out


def _gather_nd(call: relax.Call, args: list) -> np.ndarray | None:
    """ONNX GatherND with ``batch_dims`` 0: ``out[i] = data[indices[i]]``; indices out of range are left
    alone (Swin-V2's relative position bias, gathered from its table by the default exporter)."""
    data, indices = np.asarray(args[0]), np.asarray(args[1])
    if int(getattr(call.attrs, "batch_dims", 0)) != 0 or indices.ndim == 0:
        return None
    depth = indices.shape[-1]
    rows = indices.reshape(-1, depth)
    if np.any(rows < 0) or np.any(rows >= np.array(data.shape[:depth])):
        return None
    return data[tuple(rows.T)].reshape(indices.shape[:-1] + data.shape[depth:])


_LAYOUT = {"relax.strided_slice": _strided_slice, "relax.scatter_nd": _scatter_nd,
           "relax.slice_scatter": _slice_scatter, "relax.gather_nd": _gather_nd}
"""Index and layout ops, evaluated for any dtype: the masks Swin's shifted windows build from zeros
(``slice_scatter`` from torch.export, ``strided_slice`` + ``scatter_nd`` from the default ONNX exporter).
``isnan`` of a constant (TVM's ONNX Clip guards its bounds with ``where(isnan(b), -inf, b)``) is in
``_UNARY``."""


def _small(var: relax.Var) -> bool:
    """Whether ``var`` is not a tensor of more than :data:`MAX_ELEMENTS` elements (as far as known)."""
    shape = getattr(var.ty, "shape", None) if isinstance(var.ty, relax.TensorType) else None
    dims = _ints(shape.values) if isinstance(shape, relax.ShapeExpr) else None
    return dims is None or int(np.prod(dims)) <= MAX_ELEMENTS


def _foldable(var: relax.Var, value, floats: bool = False) -> bool:
    """Whether ``value`` may stand for ``var``: a small tensor of ``var``'s static shape, of an integer
    or bool dtype (``floats``: or a float one)."""
    if not isinstance(value, np.ndarray) or not isinstance(var.ty, relax.TensorType):
        return False
    dtype = str(var.ty.dtype)
    kinds = ("int", "uint", "bool", "float") if floats else ("int", "uint", "bool")
    if not dtype.startswith(kinds) or value.size > MAX_ELEMENTS:
        return False
    shape = getattr(var.ty, "shape", None)
    dims = _ints(shape.values) if isinstance(shape, relax.ShapeExpr) else None
    return dims is not None and tuple(dims) == value.shape


@relax.expr_functor.mutator
class Substitute(relax.PyExprMutator):
    def __init__(self, table: dict, mod=None):
        super().__init__(mod)
        self.table = table

    def visit_var_(self, var):  # noqa: D102 - a use of a folded variable becomes its constant
        return self.table.get(var, var)

    def visit_dataflow_var_(self, var):  # noqa: D102 - likewise inside a dataflow block
        return self.table.get(var, var)


def fold_int_constants(mod: tvm.IRModule, func: str = "main") -> tvm.IRModule:
    """``mod`` with the integer / bool bindings of ``func`` that depend only on constants and static
    shapes replaced by constants (then dead, and removed)."""
    if func not in [gv.name_hint for gv in mod.get_global_vars()]:
        return mod
    fn = mod[func]
    if not isinstance(fn, relax.Function) or not isinstance(fn.body, relax.SeqExpr):
        return mod
    ev = Evaluator()
    table: dict[relax.Var, relax.Expr] = {}
    for block in fn.body.blocks:
        for binding in block.bindings:
            if not isinstance(getattr(binding, "value", None), relax.Call) or not _small(binding.var):
                continue  # match_cast and the like; a large result (a weight's) is never evaluated
            try:
                with np.errstate(all="ignore"):  # log(0) is -inf here as in the op
                    value = ev.call(binding.value)
            except (ValueError, TypeError, IndexError):
                value = None  # numpy disagrees with the op's reading of its arguments: leave it
            if value is None:
                continue
            if isinstance(value, tuple):
                ev.known[binding.var] = value
            elif _foldable(binding.var, np.asarray(value), floats=True):
                # each step rounded to its declared dtype (float32 math, as the op computes it)
                value = np.asarray(value).astype(str(binding.var.ty.dtype))
                ev.known[binding.var] = value
                if _foldable(binding.var, value):
                    table[binding.var] = relax.const(value, str(binding.var.ty.dtype))
    if not table:
        return mod
    new_fn = Substitute(table, mod).visit_expr(fn)
    mod = mod.clone()  # a pass does not change its input
    mod[func] = new_fn
    return relax.transform.DeadCodeElimination([func])(mod)
