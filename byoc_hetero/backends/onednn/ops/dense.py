"""dense / matmul: ``matmul(x, W)`` or ``matmul(x, permute_dims(W))``, optionally after a flatten.

A 2-D W is a dense layer (node ``dense``, weight layout ``KN`` or ``NK`` for the transposed form);
a W of rank >= 3 a batched matmul (node ``matmul``; both operands may be run-time values). Rules
``dense[_flat][_bias][_act][_res|_res2[_act]]`` and the classic relu-only names
(``dense_bias_relu``, ``dense_flat_bias_relu``, ...). The ``permute_dims`` of the weight is no node:
the weight is read transposed (the permute node :mod:`.layout` emits is dropped); any other
permutation of a batched operand is read through strides (:func:`.layout.fold_views`).
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from ...._relax import static_shape
from ....rules import Match
from ..epilogue import anchor_rules, epilogue_reason, tensors_reason
from ..precision import out_dtype_reason
from ..table import lowers, pattern_rules
from .layout import permute_axes, swapped_last


def dense_anchor(flatten: bool) -> tuple[DFPattern, dict[str, DFPattern]]:
    """matmul(data, W | permute_dims(W)), with ``flatten`` a reshape of the data first."""
    data, weight = wildcard(), wildcard()
    names = {"weight": weight}
    if flatten:
        flat_in = wildcard()
        data = is_op("relax.reshape")(flat_in, wildcard())
        names["flat_in"] = flat_in
        names["flatten"] = data
    transpose = is_op("relax.permute_dims")(weight)
    anchor = is_op("relax.matmul")(data, transpose | weight)
    names.update(data=data, anchor=anchor, transpose=transpose)
    return anchor, names


def _batch_dims_reason(match: Match, data_shape, weight_shape) -> str | None:
    """The batch dims of a batched matmul must broadcast."""
    rank = max(len(data_shape), len(weight_shape))
    a = (1,) * (rank - len(data_shape)) + tuple(data_shape[:-2])
    b = (1,) * (rank - len(weight_shape)) + tuple(weight_shape[:-2])
    if match.has("transpose"):
        b = (1,) * (rank - len(weight_shape)) + tuple(static_shape(match.expr("transpose"))[:-2])
    for x, y in zip(a, b):
        if x != y and 1 not in (x, y):
            return f"batch dims of {list(data_shape)} and {list(weight_shape)} do not broadcast"
    return None


def check_dense(match: Match) -> str | None:
    """matmul of data by a weight (2-D: dense; rank >= 3: batched), optional epilogue."""
    reason = tensors_reason(match, ["data", "weight", "anchor", "flat_in"])
    if reason:
        return reason
    data_shape, weight_shape = match.shape("data"), match.shape("weight")
    if len(data_shape) < 2 or len(weight_shape) < 2:
        return (
            f"matmul needs operands of rank >= 2, got shapes {list(data_shape)} and "
            f"{list(weight_shape)}"
        )
    if len(data_shape) > 12 or len(weight_shape) > 12:
        return "matmul operands of rank > 12"
    reason = out_dtype_reason(match.expr("anchor").attrs.out_dtype, "matmul")
    if reason:
        return reason
    if match.has("transpose"):
        axes = permute_axes(match.expr("transpose"))
        if len(weight_shape) == 2 and axes != [1, 0]:
            return f"permute_dims axes {axes} of a 2-D weight"
        # any other permutation is a permute node the matmul reads through strides (ops/layout.py)
    if len(weight_shape) > 2:
        reason = _batch_dims_reason(match, data_shape, weight_shape)
        if reason:
            return reason
    return epilogue_reason(match, match.shape("anchor"), channel_axis=-1)


@pattern_rules
def _rules():
    yield from anchor_rules("dense_flat", lambda: dense_anchor(True), check_dense, with_bn=False,
                            extra_ops=1)
    yield from anchor_rules("dense", lambda: dense_anchor(False), check_dense, with_bn=False)


@lowers("relax.matmul", check=check_dense)
def lower_matmul(ctx, var: relax.Var, call: relax.Call) -> int:
    data, weight = call.args[0], call.args[1]
    weight_id = ctx.data_of(weight)
    # a permute node of this composite swapping the last two axes: read its input transposed (the
    # permute node, then unread, is dropped by ops/layout.py's fold_views)
    permute = ctx.open_node.get(weight_id)
    transposed = permute is not None and permute.op == "permute" and swapped_last(permute.attrs["axes"])
    if transposed:
        weight_id = permute.inputs[0]
    if len(static_shape(weight)) == 2:
        attrs = {"weight_layout": "NK" if transposed else "KN", "has_bias": 0, "activation": "none"}
        return ctx.emit("dense", [ctx.data_of(data), weight_id], var, attrs)
    attrs = {"transpose_b": int(transposed), "has_bias": 0, "activation": "none"}
    return ctx.emit("matmul", [ctx.data_of(data), weight_id], var, attrs)
