"""Pass ``inbound_slices`` (Relax, after the torch import): slices whose end the declared range of
its symbol keeps in bound are marked so, and clips the declared ranges make the identity go."""

from __future__ import annotations

from typing import Any

import tvm

from ..inputs import dim_ranges


def bounded_analyzer(func: Any) -> Any | None:
    """A TIR analyzer that knows the declared ranges of ``func``'s symbols; None without any."""
    ranges = dim_ranges(func)
    if not ranges:
        return None
    symbols = {}
    for p in func.params:
        shape = getattr(p.ty, "shape", None)
        for d in getattr(shape, "values", []):
            if isinstance(d, tvm.tirx.Var):
                symbols[str(d.name)] = d
    analyzer = tvm.sym.Analyzer()
    for name, (lo, hi) in ranges.items():
        if name in symbols:
            var = symbols[name]
            low = tvm.tirx.IntImm("int64", lo if lo is not None else 0)
            if hi is None:
                analyzer.bind(var, tvm.ir.Range(low, tvm.tirx.IntImm("int64", 2**40)))
            else:
                analyzer.bind(var, tvm.ir.Range(low, tvm.tirx.IntImm("int64", hi + 1)))
    return analyzer


def _subexpressions(e: Any) -> list[Any]:
    """``e`` and the operands below it (binary TIR nodes: ``a`` and ``b``)."""
    found, stack = [], [e]
    while stack:
        x = stack.pop()
        found.append(x)
        stack.extend(getattr(x, k) for k in ("a", "b") if hasattr(x, k))
    return found


def inbound_slices(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each ``strided_slice`` whose symbolic end is within the sliced dim for every
    declared value of its symbol marked ``assume_inbound``, and the shapes after it re-inferred.

    Why: Hugging Face models slice a fixed table by the sequence length (BERT's
    ``position_ids[:, :seq_len]``, a (1, 512) buffer). TVM clips the end, so the slice's shape is
    ``(1, min(S, 512))``; adding that to a ``(B, S, 64)`` value gives a tensor of unknown shape,
    which TVM can neither legalize nor build ("CodeGenVM cannot emit this Relax operator"), and
    every op after it has an unknown shape. ``torch.export.Dim("S", max=512)`` says ``S <= 512``
    (TVM's importer keeps it as ``tir_var_upper_bound``), so the clip is the identity: marked in
    bound, the slice is ``(1, S)`` and every shape after it is known again. Lower bounds count
    too: transformers' packed-sequence check slices ``position_ids[:, :1]``, ``(1, min(1, S))``
    until ``S >= 1`` is known (then a bool ``cumsum`` of unknown shape failed to build).
    """
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    func = mod["main"]
    analyzer = bounded_analyzer(func)
    if analyzer is None:
        return mod

    def within(end: Any, extent: Any, begin: Any, stride: Any) -> bool:
        return (isinstance(stride, tvm.tirx.IntImm) and int(stride.value) == 1
                and bool(analyzer.can_prove(begin >= 0)) and bool(analyzer.can_prove(end <= extent))
                and bool(analyzer.can_prove(begin <= end)))

    def unclip(e: Any) -> Any:
        # min(S, c) with S <= c declared: S; min(1, S) with S >= 1: 1 (the importer writes such
        # clips into reshape targets too)
        if isinstance(e, (tvm.tirx.Min, tvm.tirx.Max)) or any(
                isinstance(x, (tvm.tirx.Min, tvm.tirx.Max)) for x in _subexpressions(e)):
            simpler = analyzer.simplify(e)
            if not any(isinstance(x, (tvm.tirx.Min, tvm.tirx.Max)) for x in _subexpressions(simpler)):
                return simpler
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
            dims = shape.values
            for a, b, e, st in zip(axes.fields, begin.fields, end.fields, strides.fields):
                if not isinstance(a, tvm.tirx.IntImm) or not within(e, dims[int(a.value) % len(dims)], b, st):
                    return call
            changed.append(True)
            # non-negative axes: TVM's in-bound legalization rejects -1 ("axis < src_tensor_dim")
            rank = len(shape.values)
            axes = [int(a.value) % rank for a in axes.fields]
            return relax.op.strided_slice(x, axes, begin, end, strides, assume_inbound=True)

    new = Inbound().visit_expr(func)
    if not changed:
        return mod
    out = mod.clone()
    out["main"] = new
    return out
