"""Pass ``drop_needless_broadcasts`` (Relax, before fusion): broadcasts that copy for nothing go."""

from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from .._relax import bound_values, entry_functions, op_name, updated
from ._ir import map_calls


def drop_needless_broadcasts(mod: tvm.IRModule) -> tvm.IRModule:
    """Broadcasts that copy for nothing go: ``broadcast_to(x, s)`` where ``s`` is ``x``'s own shape
    becomes ``x``, and so does ``tile(x, [1, ...])`` (no more repeats than ``x`` has dims).

    torch.export writes one before each batched matmul operand (``expand``). With symbolic dims it
    harms: as a composite of its own, FuseOpsByPattern passes ``s`` in as a parameter, and
    broadcast_to's type inference gives the composite a result of unknown shape
    (``R.Tensor(param_0)``, rank only); that result type refers to the composite's parameter,
    which inlining the composite back into ``main`` (the cost gate) leaves undefined, and then
    MergeCompositeFunctions fails ("memo_.count", torch.export's BERT-like model with a
    dynamic batch and sequence length). The op copies nothing, so it is dropped before fusing.

    Also ``matmul(a, broadcast_to(w, [B, K, N]))`` with a 2-D ``w`` and ``a`` of shape ``[B, M, K]``
    becomes ``matmul(a, w)``: the same result (relax.matmul broadcasts), without repeating the weight
    per batch (torch.export's Linear on the attention output of a transformers BertModel with a
    dynamic batch: the broadcast stayed on llvm and split the model into regions).

    And an elementwise binary op (:data:`_BROADCASTING`) whose second operand is ``broadcast_to(x, s)``
    reads ``x``: the op broadcasts it itself (numpy rules, as oneDNN's binary does its second source),
    so the result is the same without materializing ``s``. Only where all shapes are static and
    broadcasting ``x`` against the first operand gives the op's own result shape, the dtypes agree,
    and (for add / multiply / maximum / minimum, which commute) a broadcast *first* operand swaps
    places with the other. torch's ``F.normalize`` writes ``x / norm.clamp_min(eps).expand_as(x)``:
    Swin-V2's cosine attention normalizes Q and K that way, 24 copies of the whole Q / K per call
    through both import paths.
    """
    def drop(_var, call):
        if op_name(call) == "relax.tile":  # repeats of 1 (torch's x.repeat(1, 1, 1): DeBERTa-v2)
            reps = [int(r) for r in call.attrs.repeats]
            rank = call.args[0].ty.ndim if isinstance(call.args[0].ty, relax.TensorType) else -1
            return call.args[0] if reps and all(r == 1 for r in reps) and len(reps) <= rank else None
        if op_name(call) != "relax.broadcast_to":
            return None
        data, shape = call.args
        before = getattr(data.ty, "shape", None)
        if (isinstance(shape, relax.ShapeExpr) and isinstance(before, relax.ShapeExpr)
                and isinstance(call.ty, relax.TensorType) and call.ty.dtype == data.ty.dtype
                and tvm_ffi.structural_equal(before, shape)):
            return data
        return None

    def unbroadcast_weight(values, call):
        # matmul(a, broadcast_to(w, [*lead, K, N])) with a 2-D w and a of shape [*lead, M, K]:
        # relax.matmul broadcasts w itself, so the result is the same without the copy (torch.export
        # writes it for a Linear on a 3-D non-contiguous input, as bmm with an expanded weight)
        if op_name(call) != "relax.matmul":
            return None
        lhs, rhs = call.args
        bcast = values.get(rhs) if isinstance(rhs, relax.Var) else None
        if not (isinstance(bcast, relax.Call) and op_name(bcast) == "relax.broadcast_to"):
            return None
        weight, target = bcast.args
        w_shape, a_shape = getattr(weight.ty, "shape", None), getattr(lhs.ty, "shape", None)
        if not (isinstance(target, relax.ShapeExpr) and isinstance(w_shape, relax.ShapeExpr)
                and isinstance(a_shape, relax.ShapeExpr) and len(w_shape.values) == 2
                and len(a_shape.values) == len(target.values) >= 3):
            return None
        same = tvm_ffi.structural_equal
        if not (all(same(x, y) for x, y in zip(target.values[-2:], w_shape.values))
                and all(same(x, y) for x, y in zip(target.values[:-2], a_shape.values[:-2]))):
            return None
        return relax.Call(call.op, [lhs, weight], call.attrs, call.ty_args, ret_ty=call.ty)

    changes = {}
    for name in entry_functions(mod):
        values = bound_values(mod[name])

        def change(var, call, values=values):
            new = drop(var, call)
            if new is None:
                new = unbroadcast_weight(values, call)
            return new if new is not None else _unbroadcast_operand(values, call)

        func = map_calls(mod[name], change)
        if not func.same_as(mod[name]):
            changes[mod.get_global_var(name)] = func
    return updated(mod, changes) if changes else mod


_BROADCASTING = frozenset({"relax.add", "relax.subtract", "relax.multiply", "relax.divide",
                           "relax.maximum", "relax.minimum"})
"""Elementwise binary ops that broadcast their operands (numpy rules)."""

_COMMUTING = frozenset({"relax.add", "relax.multiply", "relax.maximum", "relax.minimum"})


def _static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    """``expr``'s shape as ints, None unless it is a tensor of a fully static shape."""
    shape = getattr(expr.ty, "shape", None) if isinstance(expr.ty, relax.TensorType) else None
    if not isinstance(shape, relax.ShapeExpr):
        return None
    dims = [getattr(d, "value", None) for d in shape.values]
    return None if any(d is None for d in dims) else tuple(int(d) for d in dims)


def _unbroadcast_operand(values: dict, call: relax.Call) -> relax.Call | None:
    """``op(a, broadcast_to(x, s))`` as ``op(a, x)`` (and ``op(broadcast_to(x, s), a)`` as ``op(a, x)``
    for an op that commutes) where that computes the same tensor: :func:`drop_needless_broadcasts`."""
    if op_name(call) not in _BROADCASTING or len(call.args) != 2:
        return None
    orders = ((0, 1), (1, 0)) if op_name(call) in _COMMUTING else ((0, 1),)
    for keep, wide in orders:
        other, operand = call.args[keep], call.args[wide]
        bcast = values.get(operand) if isinstance(operand, relax.Var) else None
        if not (isinstance(bcast, relax.Call) and op_name(bcast) == "relax.broadcast_to"):
            continue
        narrow = bcast.args[0]
        shapes = [_static_shape(e) for e in (other, narrow, call)]
        if any(s is None for s in shapes) or narrow.ty.dtype != operand.ty.dtype:
            continue
        try:
            joined = tuple(np.broadcast_shapes(shapes[0], shapes[1]))
        except ValueError:
            continue
        if joined == shapes[2] and shapes[0] == shapes[2]:
            return relax.Call(call.op, [other, narrow], call.attrs, call.ty_args, ret_ty=call.ty)
    return None
