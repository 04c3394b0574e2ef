"""Ops that only relabel memory: reshape, flatten, squeeze, expand_dims, and a broadcast_to that
keeps the shape. Free inside a region: no step runs. A broadcast_to that repeats elements is one
``broadcast_to`` node: one copy (cpp/kernels/broadcast_to.cc).

No node is emitted when the value is read by an anchor that absorbs it (a flatten before a dense,
a bias reshaped to [1, C, 1, 1]); otherwise a ``reshape`` node (an alias of the producer's plain
bytes) is written when a node or another composite reads the value (``RegionLowering.data_of``).
Each op has a single-op rule (``reshape``, ``flatten``, ``squeeze``, ``expand_dims``,
``broadcast_to``) at the lowest priority, so that such calls join the regions around them
instead of splitting them (a region made only of them is still left to TVM by the cost gate).

A ``broadcast_to`` that repeats elements (numpy broadcasting: dims of size 1 repeated, leading dims
added) is how transformers write grouped-query attention's ``repeat_kv``: ``expand`` of K and V from
``[B, kv, 1, S, D]`` to ``[B, kv, groups, S, D]``, then a reshape to the query heads. Left on llvm it
cut each attention out of its region (SmolLM-135M: 31 / 61 regions); lowered, it is one host copy
inside the region, a few rows of ``D`` floats per head next to the attention matmuls that read them.
"""

from __future__ import annotations

import functools

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...._relax import shape_of
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
    """A relabel of a float32 tensor to a shape with the same number of elements.

    With symbolic dims the sizes must be equal for every value of the symbols
    (``[N, S, 64] -> [N, S, 4, 16]``, ``[N * S, 64] -> [N, S, 64]``). A reshape to a symbolic
    shape is a composite like any other: the partition binds its target shape inside the composite
    where the tensor's own dims define the symbols (``byoc_hetero.passes.close_shape_arguments``), and passes
    it to the region as a shape argument otherwise (region format ``shape_args``).
    """
    call = match.expr("root")
    reason = tensor_reason(call.args[0], "data", symbolic=True) or tensor_reason(call, "result", symbolic=True)
    if reason:
        return reason
    before, after = shape_of(call.args[0]), shape_of(call)
    if call.op.name == "relax.broadcast_to" and tuple(before) != tuple(after):
        return repeat_reason(call)
    if not _same_size(call.args[0], call):
        return (f"{call.op.name.removeprefix('relax.')} {list(before)} -> {list(after)} changes the number "
                "of elements (or may, for some symbol values)")
    return None


def repeats(call: relax.Call) -> bool:
    """Whether ``call`` is a ``broadcast_to`` whose output shape differs from its input's."""
    return call.op.name == "relax.broadcast_to" and tuple(shape_of(call.args[0])) != tuple(shape_of(call))


def repeat_reason(call: relax.Call) -> str | None:
    """Why a repeating ``broadcast_to`` (a float32 tensor, checked by the caller) cannot be one
    ``broadcast_to`` node: the input must broadcast to the output dim by dim (equal dims, or a
    static 1 in the input; leading dims added)."""
    before, after = call.args[0].ty.shape, call.ty.shape
    if not isinstance(before, relax.ShapeExpr) or not isinstance(after, relax.ShapeExpr):
        return "broadcast_to with an unknown shape"
    if len(before.values) > len(after.values) or not after.values:
        return f"broadcast_to {list(shape_of(call.args[0]))} -> {list(shape_of(call))} drops dims"
    analyzer = tvm.sym.Analyzer()
    for a, b in zip(reversed(before.values), reversed(after.values)):
        one = isinstance(a, tvm.tirx.IntImm) and int(a.value) == 1
        if not one and not analyzer.can_prove_equal(a, b):
            return (f"broadcast_to {list(shape_of(call.args[0]))} -> {list(shape_of(call))}: dim {a} is "
                    f"neither 1 nor {b}")
    return None


def _same_size(a: relax.Expr, b: relax.Expr) -> bool:
    """Whether two tensors have the same number of elements for every value of the symbols
    (``[N * S, 64]`` and ``[N, S, 4, 16]``: TVM's arithmetic simplifier proves the products equal)."""
    sa, sb = a.ty.shape, b.ty.shape
    if not isinstance(sa, relax.ShapeExpr) or not isinstance(sb, relax.ShapeExpr):
        return False
    one = tvm.tirx.IntImm("int64", 1)
    size_a = functools.reduce(lambda x, y: x * y, sa.values, one)
    size_b = functools.reduce(lambda x, y: x * y, sb.values, one)
    return bool(tvm.sym.Analyzer().can_prove_equal(size_a, size_b))


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
    """No node yet: the value is the source's bytes under ``var``'s shape (materialized on read);
    a repeating ``broadcast_to``: a ``broadcast_to`` node."""
    if repeats(call):
        return ctx.emit("broadcast_to", [ctx.data_of(call.args[0])], var, {})
    source = ctx.lookup(call.args[0])  # a pending relabel of a relabel keeps the first source
    ctx.flattened[var] = (source, shape_of(var))
    return source
