"""take (gather) of table rows by int64 / int32 indices, as embeddings do: a ``take`` node.

``take(table[V, ...] float32, ids int64|int32, axis=0)``; the runtime checks every index against V
at run time (an out-of-range id raises :class:`byoc_hetero.InputError` naming it). Other axes, and
the ``wrap`` / ``clip`` / ``nan`` modes, stay on llvm.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...._relax import shape_of, static_shape, tensor_dtype
from ....rules import Match
from ..precision import tensor_reason
from ..table import PatternSpec, lowers, pattern_rules

INDEX_DTYPES = ("int64", "int32")


def check_take(match: Match) -> str | None:
    """A float32 table of static shape, integer indices (symbolic dims allowed: batch, sequence),
    axis 0, the default mode."""
    call = match.expr("root")
    table, ids = call.args[0], call.args[1]
    reason = tensor_reason(table, "table") or tensor_reason(call, "result", symbolic=True)
    if reason:
        return reason
    if tensor_dtype(ids) not in INDEX_DTYPES:
        return f"indices have dtype {tensor_dtype(ids)}; the runtime takes {' or '.join(INDEX_DTYPES)} indices"
    if shape_of(ids) is None:
        return f"indices have the shape {ids.ty}, which the runtime cannot evaluate"
    rank = len(static_shape(table))
    axis = call.attrs.axis
    if rank == 0 or axis is None or int(axis) % rank != 0:
        return f"take along axis {axis} of a rank-{rank} table: the runtime takes rows (axis 0) only"
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
    return ctx.emit("take", [ctx.data_of(call.args[0]), ctx.data_of(call.args[1])], var, {"axis": 0})
