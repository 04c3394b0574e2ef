"""take (gather) of table slices by int64 / int32 indices along any axis: a ``take`` node.

``take(table float32, ids int64|int32, axis)``: embedding rows (axis 0), ViT's class token
``x[:, 0]`` (axis 1, which split ViT into two regions), and rows of an activation with runtime
indices -- a decoder step's ``take(reshape(h, [B * S, hidden]), last)``, the hidden state of each
sequence's last row, which kept the step's LM head in a second region behind an llvm op until the
table could have symbolic dims (the runtime plans each binding of the symbols, so the kernel sees
concrete extents). The runtime checks every index against the axis' extent at run time (an
out-of-range id raises :class:`byoc_hetero.InputError` naming it). The ``wrap`` / ``clip`` /
``nan`` modes stay on llvm.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...._relax import shape_of, static_shape, tensor_dtype
from ....rules import Match
from ..precision import tensor_reason
from ..table import PatternSpec, lowers, pattern_rules

INDEX_DTYPES = ("int64", "int32")


def _constant_index(expr: relax.Expr) -> int | None:
    """The value of a one-element integer constant, or None."""
    if isinstance(expr, (tvm.ir.Constant, tvm.ir.GenericConst)):
        data = (expr.value if isinstance(expr, tvm.ir.GenericConst) else expr.data).numpy()
        if data.size == 1 and data.dtype.kind in "iu":
            return int(data.reshape(()))
    return None


def check_take(match: Match) -> str | None:
    """A float32 table and integer indices (symbolic dims allowed in both: batch, sequence), any
    axis, the default mode."""
    call = match.expr("root")
    table, ids = call.args[0], call.args[1]
    reason = tensor_reason(table, "table", symbolic=True) or tensor_reason(call, "result", symbolic=True)
    if reason:
        return reason
    if tensor_dtype(ids) not in INDEX_DTYPES:
        return f"indices have dtype {tensor_dtype(ids)}; the runtime takes {' or '.join(INDEX_DTYPES)} indices"
    if shape_of(ids) is None:
        return f"indices have the shape {ids.ty}, which the runtime cannot evaluate"
    rank = len(shape_of(table))
    axis = call.attrs.axis
    if rank == 0 or axis is None or not -rank <= int(axis) < rank:
        return f"take along axis {axis} of a rank-{rank} table (the runtime takes along one axis of rank >= 1)"
    mode = str(getattr(call.attrs, "mode", "fast"))
    if mode != "fast":
        return f"take mode {mode!r}: the runtime checks indices instead (mode 'fast' only)"
    return None


@pattern_rules
def _rules():
    table, ids = wildcard(), wildcard()
    call = is_op("relax.take")(table, ids)
    yield PatternSpec("take", call, {"data": table, "indices": ids, "root": call}, check_take, priority=10)


@lowers("relax.take", check=check_take)
def lower_take(ctx, var: relax.Var, call: relax.Call) -> int:
    shape = list(shape_of(call.args[0]))
    axis = int(call.attrs.axis) % len(shape)
    index = _constant_index(call.args[1])
    if index is not None and static_shape(call.args[0]) is not None and 0 <= index < shape[axis]:
        # one constant index (ViT's x[:, 0]): a slice of extent 1 on the axis, then a reshape
        # dropping it -- no host step, and no int64 constant for the planner to place
        begin = [index if a == axis else 0 for a in range(len(shape))]
        box = ctx.emit("slice", [ctx.data_of(call.args[0])], None, {"begin": begin},
                       shape=[1 if a == axis else d for a, d in enumerate(shape)])
        ctx.open_node.pop(box)
        return ctx.emit("reshape", [box], var, {})
    return ctx.emit("take", [ctx.data_of(call.args[0]), ctx.data_of(call.args[1])], var, {"axis": axis})
