"""Ops that only relabel memory: reshape, flatten, squeeze, expand_dims, and a broadcast_to that
keeps the shape. Free inside a region: no step runs.

No node is emitted when the value is read by an anchor that absorbs it (a flatten before a dense,
a bias reshaped to [1, C, 1, 1]); otherwise a ``reshape`` node (an alias of the producer's plain
bytes) is written when a node or another composite reads the value (``RegionLowering.data_of``).
Each op has a single-op rule (``reshape``, ``flatten``, ``squeeze``, ``expand_dims``,
``broadcast_to``) at the lowest priority, so that such calls join the regions around them
instead of splitting them (a region made only of them is still left to TVM by the cost gate).
"""

from __future__ import annotations

import math

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...._relax import static_shape
from ....rules import Match
from ..precision import tensor_reason
from ..table import PatternSpec, lowers, pattern_rules

#: Relax ops that keep the row-major bytes and change only the shape (rule name → op).
RELABELS = {
    "reshape": "relax.reshape",
    "flatten": "relax.flatten",
    "squeeze": "relax.squeeze",
    "expand_dims": "relax.expand_dims",
    "broadcast_to": "relax.broadcast_to",
}


def check_reshape(match: Match) -> str | None:
    """A relabel of a float32 tensor with static shapes and the same number of elements."""
    call = match.expr("root")
    reason = tensor_reason(call.args[0], "data") or tensor_reason(call, "result")
    if reason:
        return reason
    before, after = static_shape(call.args[0]), static_shape(call)
    if call.op.name == "relax.broadcast_to" and tuple(before) != tuple(after):
        return (
            f"broadcast_to {list(before)} -> {list(after)} repeats elements; "
            "only a broadcast_to that keeps the shape is free"
        )
    if math.prod(before) != math.prod(after):
        return f"{call.op.name.removeprefix('relax.')} {list(before)} -> {list(after)} changes the number of elements"
    return None


@pattern_rules
def _rules():
    for name, op in RELABELS.items():
        data = wildcard()
        if op in ("relax.reshape", "relax.broadcast_to"):
            call = is_op(op)(data, wildcard())
        else:
            call = is_op(op)(data)
        yield PatternSpec(name, call, {"data": data, "root": call}, check_reshape, priority=10)


@lowers(*RELABELS.values(), check=check_reshape)
def lower_reshape(ctx, var: relax.Var, call: relax.Call) -> int:
    """No node yet: the value is the source's bytes under ``var``'s shape (materialized on read)."""
    source = ctx.lookup(call.args[0])  # a pending relabel of a relabel keeps the first source
    ctx.flattened[var] = (source, static_shape(var))
    return source
