"""Reductions: mean, sum, max, min over any axes, keepdims or not → a ``reduce`` node (oneDNN's
reduction primitive), followed by a ``reshape`` when the reduced axes are dropped.

A mean over the spatial axes of 4-D NCHW data keeps its own rule (``global_avg_pool``,
:mod:`.pool`, priority 50, tried before the ``reduce_*`` rules) and its ``pool2d`` lowering:
oneDNN's global average pooling reads the channel-blocked layout a convolution writes as it is.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...._relax import shape_of, static_shape
from ....rules import Match
from ..epilogue import tensors_reason
from ..table import PatternSpec, lowers, pattern_rules
from .pool import lower_mean, spatial_mean_axes

#: Relax reductions and the runtime's ``reduce`` algorithm names.
REDUCTIONS = {
    "relax.mean": "mean",
    "relax.sum": "sum",
    "relax.max": "max",
    "relax.min": "min",
}


def reduced_axes(call: relax.Call) -> list[int]:
    """The axes a reduction call reduces, non-negative and sorted (None = every axis)."""
    rank = len(shape_of(call.args[0]))
    axes = call.attrs.axis
    if axes is None:
        return list(range(rank))
    return sorted({int(a) % rank for a in axes})


def check_reduce(match: Match) -> str | None:
    """A reduction of float32 data (rank >= 1). Symbolic dims are allowed outside the reduced
    axes when the reduced dims are kept (``keepdims``: RMSNorm's ``mean(x * x, -1, keepdims=True)``
    over [B, S, D]); the kernel is planned per binding."""
    reason = tensors_reason(match, ["data", "root"], symbolic=True)
    if reason:
        return reason
    call, shape = match.expr("root"), match.shape("data")
    if len(shape) == 0:
        return f"{call.op.name} of a scalar"
    if static_shape(call.args[0]) is None:
        axes = reduced_axes(call)
        if any(not isinstance(shape[a], int) for a in axes):
            return f"{call.op.name} over the symbolic axes {axes} of {list(shape)}; the reduced dims must be static"
        if not bool(call.attrs.keepdims):
            return f"{call.op.name} of the symbolic shape {list(shape)} that drops the reduced axes"
    return None


@pattern_rules
def _rules():
    for op, name in REDUCTIONS.items():
        data = wildcard()
        call = is_op(op)(data)
        yield PatternSpec(f"reduce_{name}", call, {"data": data, "root": call}, check_reduce, priority=40)


@lowers(*REDUCTIONS, check=check_reduce)
def lower_reduce(ctx, var: relax.Var, call: relax.Call) -> int:
    if call.op.name == "relax.mean" and spatial_mean_axes(call) is None:
        return lower_mean(ctx, var, call)
    attrs = {"algorithm": REDUCTIONS[call.op.name]}
    if bool(call.attrs.keepdims):
        return ctx.emit("reduce", [ctx.data_of(call.args[0])], var, attrs)
    axes = reduced_axes(call)
    kept = [1 if i in axes else d for i, d in enumerate(static_shape(call.args[0]))]
    out = ctx.emit("reduce", [ctx.data_of(call.args[0])], None, attrs, shape=kept)
    return ctx.emit("reshape", [out], var, {})
