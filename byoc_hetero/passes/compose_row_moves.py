"""compose_row_moves: a chain of data movements that includes a ``take`` of constant indices is one ``take`` of rows.

What it rewrites. A chain of ``take`` (constant, in-range indices), ``permute_dims``, ``reshape``,
``expand_dims``, ``squeeze`` and ``concat`` of ``strided_slice`` calls of one value along the concat's axis
(a ``take`` along that axis: the ONNX exporters' ``torch.roll``) on static shapes, each link read only
by the next, only moves
elements: every element of its result is one element of its source. Evaluated once on the source's
flat positions (numpy, at compile time), the chain is a map from result to source positions. Where
that map moves whole runs of the source's trailing dims (rows of ``inner`` elements, ``inner`` the
product of those dims, at least the last one), the chain is
``reshape(take(reshape(source, [rows, inner]), row_index, axis=0), result_shape)``: one copy of
each element where the chain made one per ``take`` and per ``permute_dims`` the planner could not
read as a view. Chains with fewer than two such copies, or without a ``take``, are left alone: a
lone permute is often free (the runtime relabels its input's buffer, plan/layouts.cc).

Why. torchvision's Swin shifts its windows with ``torch.roll`` over H and W, which torch.export
writes as two ``take``s of constant indices ``(arange + shift) mod n`` (folded by
:mod:`.fold_int_constants`), and then partitions the shifted map into windows
(``reshape`` -> ``permute_dims`` -> ``reshape``, a copy the dense reading the windows needs); the
reverse runs after the attention. Each shifted block moved its activations six times per call;
now twice (a take of rows each way: issue 39 item 1, "the roll as two takes"). Both ONNX exporters
write the same roll as ``Concat(Slice(x, s:n), Slice(x, 0:s))`` per axis: four slices and two concats
each way, read here as the two takes they are (issue 39 through the default exporter, session 16).
"""

from __future__ import annotations

import collections

import numpy as np
import tvm
from tvm import relax

from .._relax import bound_values, constant_value, entry_functions, op_name, static_shape
from ._ir import map_calls

__all__ = ["compose_row_moves"]

MAX_POSITIONS = 1 << 24
"""The largest source whose positions are evaluated (128 MiB of int64 at compile time); a chain on a
larger one is left as it is. Swin-T's largest is 56 x 56 x 96 = 301056."""

_RESHAPES = frozenset({"relax.reshape", "relax.expand_dims", "relax.squeeze"})
"""Links that keep the row-major order (evaluated as a reshape to the link's static shape)."""
_COPIES = frozenset({"relax.take", "relax.permute_dims", "relax.concat"})
"""Links that move elements (a copy each, unless the planner views a permute)."""
_TAKES = frozenset({"relax.take", "relax.concat"})
"""Links that are a ``take`` of constant indices along one axis (a concat of slices of one value)."""


@relax.expr_functor.visitor
class _Uses(relax.PyExprVisitor):
    """How many times each variable is read in a function (its bindings' values and its result)."""

    def __init__(self):
        super().__init__()
        self.count: collections.Counter = collections.Counter()

    def visit_var_(self, var):  # noqa: D102 - one read
        self.count[var] += 1

    def visit_dataflow_var_(self, var):  # noqa: D102 - one read
        self.count[var] += 1


def _axis(take: relax.Call, ndim: int) -> int:
    """The axis a ``take`` reads along (its default, None, is 0), in ``[0, ndim)``."""
    axis = take.attrs.axis
    return (0 if axis is None else int(axis)) % ndim


def _ints(expr: relax.Expr) -> list[int] | None:
    """The integers of a ``strided_slice`` argument (a tuple of integer immediates), else None."""
    fields = expr.fields if isinstance(expr, relax.Tuple) else expr.values if isinstance(expr, relax.ShapeExpr) else None
    if fields is None or not all(isinstance(f, tvm.tirx.IntImm) for f in fields):
        return None
    return [int(f.value) for f in fields]


def _slice_index(call: relax.Expr | None, axis: int) -> tuple[relax.Expr, np.ndarray] | None:
    """``(x, index)`` for ``strided_slice(x, ...)`` of a static ``x`` along ``axis`` alone with a
    positive step: the positions along ``axis`` it keeps (Python's slice semantics)."""
    if op_name(call) != "relax.strided_slice" or len(call.args) < 4:
        return None
    shape = static_shape(call.args[0])
    axes, begin, end = (_ints(a) for a in call.args[1:4])
    strides = _ints(call.args[4]) if len(call.args) > 4 else None
    if shape is None or axes is None or begin is None or end is None or len(axes) != 1:
        return None
    step = strides[0] if strides else 1
    if axes[0] % len(shape) != axis or step <= 0 or len(begin) != 1 or len(end) != 1:
        return None
    index = np.arange(shape[axis], dtype=np.int64)[begin[0]:end[0]:step]
    return (call.args[0], index) if len(index) == static_shape(call)[axis] else None


def _concat_take(call: relax.Call, lookup, uses) -> tuple[relax.Expr, int, np.ndarray, int] | None:
    """``(x, axis, index, slices)`` where ``call`` is ``concat`` of ``slices`` ``strided_slice`` calls of
    one value ``x`` along the concat's axis, each read only by the concat: ``take(x, index, axis)``."""
    tup = call.args[0]
    if not isinstance(tup, relax.Tuple) or not tup.fields:
        return None
    axis = int(call.attrs.axis) % len(static_shape(call))
    source, indices = None, []
    for field in tup.fields:
        sliced = lookup(field) if isinstance(field, relax.Var) and uses[field] == 1 else None
        found = _slice_index(sliced, axis) if isinstance(sliced, relax.Call) else None
        if found is None or (source is not None and not found[0].same_as(source)):
            return None
        source = found[0]
        indices.append(found[1])
    return source, axis, np.concatenate(indices), len(indices)


def _link(call: relax.Expr, lookup, uses) -> tuple[relax.Expr, int, tuple[int, np.ndarray] | None] | None:
    """``(source, reads, take)`` of a call that may be a link of a chain (static shapes, constant
    in-range indices): the value it moves, how many times it reads it, and for a take-like link its
    ``(axis, index)``; None for any other call."""
    name = op_name(call) if isinstance(call, relax.Call) else None
    if name not in _RESHAPES | _COPIES or static_shape(call) is None:
        return None
    if name == "relax.concat":
        found = _concat_take(call, lookup, uses)
        return None if found is None else (found[0], found[3], (found[1], found[2]))
    if static_shape(call.args[0]) is None:
        return None
    if name == "relax.take":
        index = constant_value(call.args[1])
        if index is None or np.asarray(index).dtype.kind not in "iu":
            return None
        axis = _axis(call, len(static_shape(call.args[0])))
        n = static_shape(call.args[0])[axis]
        if np.asarray(index).size and (np.min(index) < 0 or np.max(index) >= n):
            return None  # out of range: the op's own checks report it
        return call.args[0], 1, (axis, np.asarray(index))
    return call.args[0], 1, None


def _chain(call: relax.Call, lookup, uses) -> tuple[relax.Expr, list[tuple[relax.Call, tuple | None]]] | None:
    """The chain ending in ``call``: its source and its links in order (each with its take's
    ``(axis, index)`` or None), or None when ``call`` is no link."""
    link = _link(call, lookup, uses)
    if link is None:
        return None
    links, (source, reads, take) = [(call, link[2])], link
    while isinstance(source, relax.Var) and uses[source] == reads:
        link = _link(lookup(source), lookup, uses)
        if link is None:
            break
        links.insert(0, (lookup(source), link[2]))
        source, reads = link[0], link[1]
    return source, links


def _positions(source_shape: tuple[int, ...], links: list[tuple[relax.Call, tuple | None]]) -> np.ndarray:
    """For each element of the chain's result, the flat position in the source it is read from."""
    pos = np.arange(int(np.prod(source_shape, dtype=np.int64)), dtype=np.int64).reshape(source_shape)
    for link, take in links:
        name = op_name(link)
        if take is not None:
            pos = np.take(pos, take[1], axis=take[0])
        elif name == "relax.permute_dims":
            axes = link.attrs.axes
            pos = np.transpose(pos, None if axes is None else [int(a) for a in axes])
        else:
            pos = pos.reshape(static_shape(link))
    return pos


def row_index(positions: np.ndarray, source_shape: tuple[int, ...]) -> tuple[int, np.ndarray] | None:
    """``(inner, rows)``: the longest run of the source's trailing dims (at least the last) that
    ``positions`` moves whole, as ``inner`` elements a row, and the source row each result row reads;
    None when the map splits even the last dim (single elements, which a take of rows does not move well)."""
    flat = positions.reshape(-1)
    for k in range(len(source_shape)):
        inner = int(np.prod(source_shape[k:], dtype=np.int64))
        if inner == 0 or flat.size % inner:
            continue
        rows = flat.reshape(-1, inner)
        if (rows[:, 0] % inner == 0).all() and (rows == rows[:, :1] + np.arange(inner)).all():
            return inner, rows[:, 0] // inner
    return None


def _composed(call: relax.Call, lookup, uses) -> relax.Expr | None:
    """One take of rows (or a reshape, where the chain moves nothing) for the chain ending in ``call``."""
    found = _chain(call, lookup, uses)
    if found is None:
        return None
    source, links = found
    names = [op_name(link) for link, _take in links]
    if not _TAKES & set(names) or sum(name in _COPIES for name in names) < 2:
        return None
    shape, out_shape = static_shape(source), [int(d) for d in static_shape(call)]
    if int(np.prod(shape, dtype=np.int64)) > MAX_POSITIONS:
        return None
    rows = row_index(_positions(shape, links), shape)
    if rows is None:
        return None
    inner, index = rows
    if len(index) == int(np.prod(shape, dtype=np.int64)) // inner and (index == np.arange(len(index))).all():
        return relax.op.reshape(source, out_shape)  # the moves undo each other
    table = relax.op.reshape(source, [int(np.prod(shape, dtype=np.int64)) // inner, inner])
    dtype = "int32" if index.size == 0 or index.max() < 2**31 else "int64"
    taken = relax.op.take(table, relax.const(index.astype(dtype), dtype), axis=0)
    return relax.op.reshape(taken, out_shape)


def compose_row_moves(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each chain of data movements that includes a ``take`` of constant indices written
    as one ``take`` of rows where that moves whole rows (see the module docstring); ``mod`` itself
    when there is none."""
    out = None
    for name in entry_functions(mod):
        func = mod[name]
        if not isinstance(func, relax.Function):
            continue
        uses = _Uses()
        uses.visit_expr(func)
        lookup = bound_values(func).get
        new = map_calls(func, lambda _var, call: _composed(call, lookup, uses.count))
        if not new.same_as(func):
            out = out if out is not None else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
            out[name] = new
    if out is None:
        return mod
    out = relax.transform.Normalize()(out)
    return relax.transform.DeadCodeElimination(entry_functions(out))(out)
