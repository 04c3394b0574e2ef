"""softmax along any axis: a ``softmax`` node."""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ....rules import Match
from ..epilogue import tensors_reason
from ..table import PatternSpec, lowers, pattern_rules


def check_softmax(match: Match) -> str | None:
    """softmax of a float32 tensor (not a scalar) with a static shape."""
    reason = tensors_reason(match, ["data", "root"], symbolic=True)
    if reason:
        return reason
    if len(match.shape("data")) == 0:
        return "softmax of a scalar"
    return None


@pattern_rules
def _rules():
    data = wildcard()
    call = is_op("relax.nn.softmax")(data)
    yield PatternSpec("softmax", call, {"data": data, "root": call}, check_softmax, priority=50)


@lowers("relax.nn.softmax", check=check_softmax)
def lower_softmax(ctx, var: relax.Var, call: relax.Call) -> int:
    return ctx.emit("softmax", [ctx.data_of(call.args[0])], var, {"axis": int(call.attrs.axis)})
