"""compose_row_moves: a chain of data movements that includes a ``take`` of constant indices is one ``take`` of rows.

What it rewrites. A chain of ``take`` (constant, in-range indices), ``permute_dims``, ``reshape``,
``expand_dims`` and ``squeeze`` on static shapes, each link read only by the next, only moves
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
now twice (a take of rows each way: issue 39 item 1, "the roll as two takes").
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
_COPIES = frozenset({"relax.take", "relax.permute_dims"})
"""Links that move elements (a copy each, unless the planner views a permute)."""


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


def _link(call: relax.Expr) -> str | None:
    """The op of a call that may be a link of a chain (static shapes, constant in-range indices)."""
    name = op_name(call) if isinstance(call, relax.Call) else None
    if name not in _RESHAPES | _COPIES or static_shape(call) is None or static_shape(call.args[0]) is None:
        return None
    if name == "relax.take":
        index = constant_value(call.args[1])
        if index is None or np.asarray(index).dtype.kind not in "iu":
            return None
        n = static_shape(call.args[0])[_axis(call, len(static_shape(call.args[0])))]
        if np.asarray(index).size and (np.min(index) < 0 or np.max(index) >= n):
            return None  # out of range: the op's own checks report it
    return name


def _chain(call: relax.Call, lookup, uses) -> tuple[relax.Expr, list[relax.Call]] | None:
    """The chain ending in ``call``: its source and its links in order, or None when ``call`` is no link."""
    if _link(call) is None:
        return None
    links, source = [call], call.args[0]
    while isinstance(source, relax.Var) and uses[source] == 1 and _link(lookup(source)) is not None:
        links.insert(0, lookup(source))
        source = links[0].args[0]
    return source, links


def _positions(source_shape: tuple[int, ...], links: list[relax.Call]) -> np.ndarray:
    """For each element of the chain's result, the flat position in the source it is read from."""
    pos = np.arange(int(np.prod(source_shape, dtype=np.int64)), dtype=np.int64).reshape(source_shape)
    for link in links:
        name = op_name(link)
        if name == "relax.take":
            axis = _axis(link, pos.ndim)
            pos = np.take(pos, np.asarray(constant_value(link.args[1])), axis=axis)
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
    names = [op_name(link) for link in links]
    if "relax.take" not in names or sum(name in _COPIES for name in names) < 2:
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
