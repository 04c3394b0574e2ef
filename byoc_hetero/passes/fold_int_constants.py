"""Fold small integer / bool computations of constants and static shapes before partitioning.

Exporters and frontends spell index and mask bookkeeping as int64 / bool op chains that depend only
on constants and on static shapes: ``torch.onnx.export`` normalises ViT's class-token index
``x[:, 0]`` as ``where(less(0, 0), add(0, take(shape_to_tensor(shape_of(x)), 1)), 0)``; TVM's torch
frontend writes position ids and causal masks as ``arange``, ``expand_dims``, ``greater_equal``,
``broadcast_to``, ``full``. None of it has a runtime kernel (the runtime computes float32), so it ran
on llvm, and where it read a region's output (``shape_of``) it split the model into two regions.

This pass evaluates such bindings with numpy, replaces their uses by constants and leaves the
rest alone. It replaces only bindings whose result is an integer or bool tensor (or a shape) that
*stores* at most :data:`MAX_ELEMENTS` elements: a value repeated along some dims (``broadcast_to``,
``expand``, ``full``) is held as its :func:`stored` part (those dims cut to length 1) and a numpy
view, element-wise steps compute on the stored parts, and a result larger than the bound in full but
not stored becomes ``broadcast_to(constant, shape)`` (DeBERTa-v3-base's relative-position index,
one [1, 128, 128] bucket table expanded to its 12 heads: 196608 elements in full, 16384 stored;
:mod:`.gather_elements_as_take` reads it so). The bound is on the work, not on the declared size:
each step evaluated computes at most :data:`MAX_ELEMENTS` elements (element-wise ones on the stored
parts; views none; any other op, which writes its full result, only when that is within the bound).
The steps an index is computed from (the index operand of a gather, and what it reads) have the
larger bound :data:`MAX_INDEX_ELEMENTS`: left computed, the gather stays on llvm and splits the
model (DeBERTa-v3 at sequence 512); past that bound the gather stays on llvm, and the report's reason
for it names the index, its size and the bound (a rejection of rule ``fold_int_constants``).

Small float steps between such bindings are evaluated too but not replaced: DeBERTa-v2's relative
positions are int64 ``arange`` differences bucketed through float ``log`` / ``ceil`` / ``where`` and
cast back to int64 (issue 39), its attention mask a float ``ones`` cast to bool; the int64 positions and the bool mask become constants, and the float steps
between, read by nothing else, go with the dead code. Float steps that are never cast back are
:mod:`.fold_weight_subgraphs`' job. weights are never folded (TVM's ``FoldConstant`` would also fold
the transposes of every weight, measured 37 s on BERT-base, and change the layouts the rules see).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .._relax import op_name, static_shape, tensor_view
from ..errors import CodegenError
from ..rules.decisions import DecisionLog
from ._ir import map_calls

MAX_ELEMENTS = 1 << 16
"""The most elements one evaluated step computes and one folded constant stores: 512 KiB of int64.
Enough for masks of a few sequences, position ids, and a relative-position table of sequence 256
(65536 positions, stored once however many heads read it); numpy's work per step and the constants
the module carries stay that small. (Counting the declared size instead left DeBERTa-v3-base's
index, 196608 elements at sequence 128, on llvm; folding it in full would carry 1.5 MB per index,
which :mod:`.gather_elements_as_take` reduces to the one shared table anyway.) A table of a longer
sequence (262144 positions at 512) is folded under :data:`MAX_INDEX_ELEMENTS` when it is an index."""

MAX_INDEX_ELEMENTS = 1 << 20
"""The bound instead of :data:`MAX_ELEMENTS` for the bindings an index is computed from (the index
operand of ``gather_elements``, ``take`` or ``gather_nd``, and what it is computed from): 4 MiB of
int32 offsets once :mod:`.gather_elements_as_take` has read it, 1024 x 1024 relative positions.
Left computed, such an index keeps the gather on llvm at run time and splits the model there
(DeBERTa-v3 at sequence 512: one [512, 512] bucket table, 262144 positions, per layer and direction);
folded, it costs one constant of its stored size. An index over this bound too stays computed, the
gather on llvm, and the report's reason for that gather names this bound."""

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


def _elementwise_ops() -> dict:
    """Element-wise ops by name: each maps the call to the numpy function of its arguments."""
    ops = {name: (lambda _call, fn=fn: fn) for name, fn in {**_BINARY, **_UNARY}.items()}
    ops["relax.where"] = lambda _call: np.where
    ops["relax.clip"] = lambda _call: np.clip
    ops["relax.astype"] = lambda call: (lambda x, dtype=str(call.attrs.dtype): x.astype(dtype))
    # integer division's rounding is the op's to define: only a float divide is evaluated
    ops["relax.divide"] = lambda call: np.true_divide if str(getattr(call.ty, "dtype", "")).startswith("float") else None
    return ops


_ELEMENTWISE = _elementwise_ops()
"""Element-wise ops (numpy broadcasting): evaluated on the stored parts of their arguments."""


def _int(v) -> int | None:
    value = getattr(v, "value", v)
    value = getattr(value, "value", value)
    return int(value) if isinstance(value, (int, np.integer)) else None


def _ints(values) -> list[int] | None:
    out = [_int(v) for v in values]
    return None if any(v is None for v in out) else out


def stored(value) -> np.ndarray:
    """The elements ``value`` stores: a numpy view with each dim it repeats along (stride 0, a
    ``broadcast_to`` view's) cut to length 1; ``np.broadcast_to(stored(v), v.shape)`` is ``v``."""
    value = np.asarray(value)
    if value.ndim == 0:
        return value  # (indexing would make it a numpy scalar)
    return value[tuple(slice(0, 1) if step == 0 and n > 1 else slice(None)
                       for step, n in zip(value.strides, value.shape))]


def _elements(ty) -> int | None:
    """The element count of a tensor type with a static shape, else None."""
    shape = getattr(ty, "shape", None) if isinstance(ty, relax.TensorType) else None
    dims = _ints(shape.values) if isinstance(shape, relax.ShapeExpr) else None
    return None if dims is None else int(np.prod(dims, dtype=np.int64))


_VIEWS = frozenset({"relax.broadcast_to", "relax.expand_dims", "relax.squeeze", "relax.permute_dims",
                    "relax.reshape", "relax.full", "relax.ones", "relax.zeros", "relax.shape_of"})
"""Ops evaluated as numpy views of their input (``full`` / ``ones`` / ``zeros``: of one element), which
compute nothing: a ``reshape`` that needs a copy counts as work (:meth:`Evaluator.call`)."""


class Evaluator:
    """Values of the bindings seen so far that are known (numpy arrays, or tuples for shapes).

    :meth:`call` evaluates one op on the known values with numpy (None when an argument is unknown
    or the op is not one read here); :mod:`.fold_weight_subgraphs` uses it for the index and layout
    ops of float computations on constants alone. A value repeated along some dims is a numpy view
    (:func:`stored`); element-wise ops compute on the stored parts. With ``max_work``, a step that
    would compute more elements than that is not evaluated (None)."""

    def __init__(self, max_work: int | None = None):
        self.known: dict[relax.Var, object] = {}
        self.max_work = max_work
        self.over_bound = False  # a step was refused for max_work alone (since the caller last cleared it)

    def _too_much(self, elements: int | None) -> bool:
        too_much = self.max_work is not None and elements is not None and elements > self.max_work
        self.over_bound = self.over_bound or too_much
        return too_much

    def _elementwise(self, fn, args: list):
        """``fn`` of ``args`` computed on their stored parts, as a view of the full broadcast shape."""
        if fn is None:
            return None
        arrays = [np.asarray(a) for a in args]
        full = np.broadcast_shapes(*(a.shape for a in arrays))
        parts = [stored(a) for a in arrays]
        if self._too_much(int(np.prod(np.broadcast_shapes(*(p.shape for p in parts)), dtype=np.int64))):
            return None
        out = np.asarray(fn(*parts))
        return out if out.shape == full else np.broadcast_to(out, full)

    def value(self, expr):
        if isinstance(expr, relax.Var):
            return self.known.get(expr)
        if isinstance(expr, relax.ShapeExpr):
            dims = _ints(expr.values)
            return tuple(dims) if dims is not None else None
        if isinstance(expr, tvm.ir.GenericConst):
            return tensor_view(expr.value)  # read-only, no copy: a weight read here is not doubled (issue 36)
        if _int(expr) is not None and not isinstance(expr, relax.Var):
            return _int(expr)  # a PrimValue (an IntImm here)
        if isinstance(expr, tvm.ir.Constant) and hasattr(expr, "data"):
            return tensor_view(expr.data)
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
        if op not in _ELEMENTWISE and op not in _VIEWS and self._too_much(_elements(call.ty)):
            return None  # it would write its whole result
        if any(self._too_much(_elements(a.ty)) for a in call.args if not isinstance(a, relax.Var)):
            if op in _ELEMENTWISE or op in _VIEWS:
                return None  # of a large constant (a weight), which it would store whole
        if op == "relax.arange":
            bounds = [self.value(a) for a in call.args[:3]]
            if any(not isinstance(b, int) for b in bounds):
                return None
            return np.arange(*bounds, dtype=str(call.attrs.dtype))
        if any(isinstance(a, relax.Var) and a not in self.known for a in call.args):
            return None  # an argument known only at run time (the embedding's take of the input ids)
        args = [self.value(a) for a in call.args]
        if any(a is None for a in args):
            return None
        if op == "relax.shape_to_tensor":
            return np.array(args[0], dtype="int64")
        if op in _ELEMENTWISE:
            return self._elementwise(_ELEMENTWISE[op](call), args)
        if op in ("relax.ones", "relax.zeros") and isinstance(args[0], tuple):
            one = np.full((1,) * len(args[0]), 1 if op == "relax.ones" else 0, dtype=str(call.attrs.dtype))
            return np.broadcast_to(one, args[0])
        if op == "relax.full" and isinstance(args[0], tuple):
            one = np.asarray(args[1]).reshape((1,) * len(args[0])).astype(str(call.attrs.dtype))
            return np.broadcast_to(one, args[0])
        if op == "relax.broadcast_to" and isinstance(args[1], tuple):
            return np.broadcast_to(args[0], args[1])
        if op == "relax.reshape" and isinstance(args[1], tuple):
            try:
                return np.reshape(args[0], args[1], copy=False)  # a view where the strides allow one
            except ValueError:
                return None if self._too_much(_elements(call.ty)) else np.reshape(args[0], args[1])
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


def _foldable(var: relax.Var, value, floats: bool = False, bound: int = MAX_ELEMENTS) -> bool:
    """Whether ``value`` may stand for ``var``: a tensor of ``var``'s static shape storing at most
    ``bound`` elements (:func:`stored`), of an integer or bool dtype (``floats``: or a float one)."""
    if not isinstance(value, np.ndarray) or not isinstance(var.ty, relax.TensorType):
        return False
    dtype = str(var.ty.dtype)
    kinds = ("int", "uint", "bool", "float") if floats else ("int", "uint", "bool")
    if not dtype.startswith(kinds) or stored(value).size > bound:
        return False
    shape = getattr(var.ty, "shape", None)
    dims = _ints(shape.values) if isinstance(shape, relax.ShapeExpr) else None
    return dims is not None and tuple(dims) == value.shape


def _as_dtype(value: np.ndarray, dtype: str) -> np.ndarray:
    """``value`` in ``dtype``, converting only its stored elements (a view stays a view)."""
    part = stored(value).astype(dtype)
    return part if part.shape == value.shape else np.broadcast_to(part, value.shape)


def dense(value, dtype: str | None = None) -> np.ndarray:
    """``value`` as a C-contiguous array of its own shape (a copy of a view): what a constant holds.
    Not ``np.ascontiguousarray``, which makes a 0-d value 1-d: a scalar index folded as shape (1,)
    made ViT's class-token ``take`` read [1, 1, C] where its type says [1, C] (issue 39)."""
    return np.array(value, dtype=dtype, order="C")


def _folded(value: np.ndarray, dtype: str) -> relax.Expr:
    """The expression standing for a folded value: a constant, or ``broadcast_to`` of its stored part
    where the value in full would be over :data:`MAX_ELEMENTS` elements."""
    if value.size <= MAX_ELEMENTS or stored(value).size == value.size:
        return relax.const(dense(value), dtype)  # small, or stored in full anyway (an index)
    part = relax.const(dense(stored(value)), dtype)
    return relax.op.broadcast_to(part, relax.ShapeExpr([int(d) for d in value.shape]))


@relax.expr_functor.mutator
class Substitute(relax.PyExprMutator):
    """Uses of the variables in ``table`` replaced by their expressions. Each must have its
    variable's static shape where both are known: a use of another shape would leave the module
    typed wrong (and the stages failing far from here), so a mismatch is a CodegenError here."""

    def __init__(self, table: dict, mod=None):
        super().__init__(mod)
        for var, expr in table.items():
            want, got = static_shape(var), static_shape(expr)
            if want is not None and got is not None and want != got:
                raise CodegenError(f"folding {var.name}: a value of shape {list(got)} for its declared "
                                   f"shape {list(want)}")
        self.table = table

    def visit_var_(self, var):  # noqa: D102 - a use of a folded variable becomes its constant
        return self.table.get(var, var)

    def visit_dataflow_var_(self, var):  # noqa: D102 - likewise inside a dataflow block
        return self.table.get(var, var)


_INDEXED = {"relax.gather_elements": 1, "relax.take": 1, "relax.gather_nd": 1}
"""Ops by the position of their index operand."""


def index_cones(fn: relax.Function) -> list[tuple[relax.Call, set]]:
    """Each gather of ``fn`` (:data:`_INDEXED`) whose index is a bound variable, with the variables
    that index is computed from (itself included)."""
    values = {b.var: b.value for block in fn.body.blocks for b in block.bindings}
    out = []
    for value in values.values():
        position = _INDEXED.get(op_name(value)) if isinstance(value, relax.Call) else None
        if position is None or value.args[position] not in values:
            continue
        cone: set = set()
        todo = [value.args[position]]
        while todo:
            v = todo.pop()
            if v in cone or v not in values:
                continue
            cone.add(v)
            if isinstance(values[v], relax.Call):
                todo.extend(a for a in values[v].args if isinstance(a, relax.Var))
        out.append((value, cone))
    return out


def _note_over_bound(mod: tvm.IRModule, cones: list, folded: dict, over: set) -> tvm.IRModule:
    """``mod`` recording, for each gather whose index stays computed because a step it is computed
    from was over :data:`MAX_INDEX_ELEMENTS`, why it stays on llvm (the reason the report gives)."""
    log = DecisionLog.from_module(mod)
    for call, cone in cones:
        index = call.args[_INDEXED[op_name(call)]]
        if index in folded or not cone & over:
            continue
        log.add("fold_int_constants", call,
                f"its index {index.name} ({_elements(index.ty)} elements) is computed from constants at run "
                f"time: folding it would evaluate or store more than MAX_INDEX_ELEMENTS = {MAX_INDEX_ELEMENTS} "
                "elements in one step (byoc_hetero.passes.fold_int_constants)")
    return log.attach(mod)


def _over_bound(ev: Evaluator, call: relax.Call, value, bound: int) -> bool:
    """Whether ``call``, its arguments known, was left unevaluated or unfolded for ``bound`` alone."""
    if not all(a in ev.known for a in call.args if isinstance(a, relax.Var)):
        return False
    if value is None:
        return ev.over_bound
    return isinstance(value, np.ndarray) and stored(value).size > bound


def fold_int_constants(mod: tvm.IRModule, func: str = "main") -> tvm.IRModule:
    """``mod`` with the integer / bool bindings of ``func`` that depend only on constants and static
    shapes replaced by constants (then dead, and removed)."""
    if func not in [gv.name_hint for gv in mod.get_global_vars()]:
        return mod
    fn = mod[func]
    if not isinstance(fn, relax.Function) or not isinstance(fn.body, relax.SeqExpr):
        return mod
    ev = Evaluator(max_work=MAX_ELEMENTS)
    cones = index_cones(fn)
    cone = set().union(*(c for _call, c in cones))
    over: set = set()  # index steps left unevaluated or unfolded for MAX_INDEX_ELEMENTS alone
    table: dict[relax.Var, relax.Expr] = {}  # uses replaced by a constant
    rebound: dict[relax.Var, relax.Expr] = {}  # bindings whose value becomes broadcast_to(constant)
    for block in fn.body.blocks:
        for binding in block.bindings:
            if not isinstance(getattr(binding, "value", None), relax.Call):
                continue  # match_cast and the like
            bound = MAX_INDEX_ELEMENTS if binding.var in cone else MAX_ELEMENTS
            ev.max_work, ev.over_bound = bound, False
            try:
                with np.errstate(all="ignore"):  # log(0) is -inf here as in the op
                    value = ev.call(binding.value)
            except (ValueError, TypeError, IndexError):
                value = None  # numpy disagrees with the op's reading of its arguments: leave it
            if binding.var in cone and _over_bound(ev, binding.value, value, bound):
                over.add(binding.var)
            if value is None:
                continue
            if isinstance(value, tuple):
                ev.known[binding.var] = value
            elif _foldable(binding.var, np.asarray(value), floats=True, bound=bound):
                # each step rounded to its declared dtype (float32 math, as the op computes it)
                dtype = str(binding.var.ty.dtype)
                value = _as_dtype(np.asarray(value), dtype)
                ev.known[binding.var] = value
                if _foldable(binding.var, value, bound=bound):
                    folded = _folded(value, dtype)
                    (rebound if isinstance(folded, relax.Call) else table)[binding.var] = folded
    if over:
        mod = _note_over_bound(mod, cones, {**table, **rebound}, over)
    if rebound:
        fn = map_calls(fn, lambda var, _call: rebound.get(var))
    if not table and not rebound:
        return mod
    new_fn = Substitute(table, mod).visit_expr(fn)
    mod = mod.clone()  # a pass does not change its input
    mod[func] = new_fn
    if rebound:
        mod = relax.transform.Normalize()(mod)
    return relax.transform.DeadCodeElimination([func])(mod)
