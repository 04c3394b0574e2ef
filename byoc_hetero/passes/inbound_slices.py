"""Pass ``inbound_slices`` (Relax, after the torch import): slices whose end the declared range of
its symbol keeps in bound are marked so."""

from __future__ import annotations

from typing import Any

import tvm

from ..inputs import dim_ranges


def inbound_slices(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each ``strided_slice`` whose symbolic end is within the sliced dim for every
    declared value of its symbol marked ``assume_inbound``, and the shapes after it re-inferred.

    Why: Hugging Face models slice a fixed table by the sequence length (BERT's
    ``position_ids[:, :seq_len]``, a (1, 512) buffer). TVM clips the end, so the slice's shape is
    ``(1, min(S, 512))``; adding that to a ``(B, S, 64)`` value gives a tensor of unknown shape,
    which TVM can neither legalize nor build ("CodeGenVM cannot emit this Relax operator"), and
    every op after it has an unknown shape. ``torch.export.Dim("S", max=512)`` says ``S <= 512``
    (TVM's importer keeps it as ``tir_var_upper_bound``), so the clip is the identity: marked in
    bound, the slice is ``(1, S)`` and every shape after it is known again.
    """
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    func = mod["main"]
    upper = {name: hi for name, (_, hi) in dim_ranges(func).items() if hi is not None}
    if not upper:
        return mod

    def within(end: Any, extent: Any, begin: Any, stride: Any) -> bool:
        return (isinstance(end, tvm.tirx.Var) and str(end.name) in upper and isinstance(extent, tvm.tirx.IntImm)
                and upper[str(end.name)] <= int(extent.value) and isinstance(begin, tvm.tirx.IntImm)
                and 0 <= int(begin.value) and isinstance(stride, tvm.tirx.IntImm) and int(stride.value) == 1)

    def unclip(e: Any) -> Any:
        # min(S, c) with S <= c declared: S (the importer writes it into reshape targets too)
        if isinstance(e, tvm.tirx.Min):
            for v, c in ((e.a, e.b), (e.b, e.a)):
                if isinstance(v, tvm.tirx.Var) and isinstance(c, tvm.tirx.IntImm) and \
                        upper.get(str(v.name), int(c.value) + 1) <= int(c.value):
                    return v
        return e

    changed = []  # (the @mutator class keeps no class attributes)

    @mutator
    class Inbound(PyExprMutator):

        def visit_call_(self, call):  # noqa: N802 - TVM's visitor naming
            call = super().visit_call_(call)
            if not isinstance(call.op, tvm.ir.Op):
                return call
            if any(isinstance(a, relax.ShapeExpr) and any(not unclip(d).same_as(d) for d in a.values)
                   for a in call.args):
                changed.append(True)
                args = [relax.ShapeExpr([unclip(d) for d in a.values]) if isinstance(a, relax.ShapeExpr) else a
                        for a in call.args]
                return relax.Call(call.op, args, call.attrs, call.ty_args)
            if call.op.name != "relax.strided_slice":
                return call
            if bool(call.attrs.assume_inbound) or len(call.args) != 5:
                return call
            x, axes, begin, end, strides = call.args
            shape = getattr(x.ty, "shape", None)
            if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(t, relax.Tuple) for t in call.args[1:]):
                return call
            for a, b, e, st in zip(axes.fields, begin.fields, end.fields, strides.fields):
                if not isinstance(a, tvm.tirx.IntImm) or not within(e, shape.values[int(a.value)], b, st):
                    return call
            changed.append(True)
            return relax.op.strided_slice(x, axes, begin, end, strides, assume_inbound=True)

    new = Inbound().visit_expr(func)
    if not changed:
        return mod
    out = mod.clone()
    out["main"] = new
    return out
