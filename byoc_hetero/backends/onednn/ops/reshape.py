"""reshape: a flatten before a dense, a bias reshaped to [1, C, 1, 1], or a composite of its own.

No node is emitted when the reshape is read: a bias reshape only needs the values, and a flatten
(or a reshape ending a composite, as an op rule makes it) becomes a ``reshape`` node when a node
or another composite reads it (``RegionLowering.data_of``).
"""

from __future__ import annotations

import math

from tvm import relax

from ...._relax import static_shape
from ....rules import Match
from ..precision import tensor_reason
from ..table import lowers


def check_reshape(match: Match) -> str | None:
    """A reshape of a float32 tensor with static shapes (any shape of the same size)."""
    call = match.expr("root")
    reason = tensor_reason(call.args[0], "data") or tensor_reason(call, "result")
    if reason:
        return reason
    before, after = static_shape(call.args[0]), static_shape(call)
    if math.prod(before) != math.prod(after):
        return f"reshape {list(before)} -> {list(after)} changes the number of elements"
    return None


@lowers("relax.reshape", check=check_reshape)
def lower_reshape(ctx, var: relax.Var, call: relax.Call) -> int:
    source = ctx.lookup(call.args[0])
    ctx.flattened[var] = (source, static_shape(var))
    return source
