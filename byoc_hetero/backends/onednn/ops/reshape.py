"""reshape: a flatten before a dense, a bias reshaped to [1, C, 1, 1], or a composite of its own.

No node is emitted when the reshape is read: a bias reshape only needs the values, and a flatten
(or a reshape ending a composite, as an op rule makes it) becomes a ``reshape`` node when a node
or another composite reads it (``RegionLowering.data_of``).
"""

from __future__ import annotations

import math

from tvm import relax

from ...._relax import shape_of
from ....rules import Match
from ..precision import tensor_reason
from ..table import lowers


def check_reshape(match: Match) -> str | None:
    """A reshape of a float32 tensor to a shape of the same size.

    With symbolic dims the sizes must be equal for every value of the symbols, which is checked
    (conservatively) as: the same symbolic dims on both sides, and equal products of the static
    ones (``[N, S, 64] -> [N, S, 4, 16]``, ``[N, 32, 1, 1] -> [N, 32]``).
    """
    call = match.expr("root")
    reason = tensor_reason(call.args[0], "data", symbolic=True) or tensor_reason(call, "result", symbolic=True)
    if reason:
        return reason
    before, after = shape_of(call.args[0]), shape_of(call)
    if _size(before) != _size(after):
        return f"reshape {list(before)} -> {list(after)} changes the number of elements (or may, for some symbol values)"
    return None


def _size(shape) -> tuple[int, list[str]]:
    """The product of a shape's static dims, and its symbolic dims (sorted)."""
    return math.prod(d for d in shape if isinstance(d, int)), sorted(d for d in shape if isinstance(d, str))


@lowers("relax.reshape", check=check_reshape)
def lower_reshape(ctx, var: relax.Var, call: relax.Call) -> int:
    source = ctx.lookup(call.args[0])
    ctx.flattened[var] = (source, shape_of(var))
    return source
