"""te_clips: a TIR ``maximum`` / ``minimum`` of a tensor and a constant scalar is a ``clip``.

Why: TVM's ONNX importer writes ``Clip(x, min, max)`` of opset 11+ (bounds as inputs) as
``call_tir`` of TE ``maximum`` / ``minimum`` functions, whatever the bounds are; no rule sees a
``call_tir``, so every such Clip ran on llvm and split its region in two. Torch's default ONNX
exporter writes Swin-V2's cosine attention normalisation (``F.normalize``: ``x / max(||x||, eps)``)
so, 2 per block: torchvision's Swin-V2-T came out as 25 regions. Once the weights are bound and
:mod:`.fold_weight_subgraphs` has folded the importer's NaN guard of the bound
(``where(isnan(b), -inf, b)``) into a constant, the bound is a number.

What: in the entry functions, ``call_tir(f, (x, b))`` where ``f`` is structurally the PrimFunc TE's
``topi.maximum`` (or ``minimum``) writes for ``x`` and ``b`` (the importer's own way), ``b`` a float
scalar constant that is not NaN and the output ``x``'s shape and dtype, becomes ``clip(x, b, inf)`` (or ``clip(x, -inf, b)``), which the
activation rules read. Any other ``call_tir`` is left as it is.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import relax, topi

from .._relax import entry_functions


def _bound(expr: relax.Expr) -> float | None:
    """The number of a float scalar constant, else None (NaN included)."""
    if not isinstance(expr, tvm.ir.GenericConst):
        return None
    value = expr.value.numpy()
    if value.ndim != 0 or value.dtype.kind != "f" or math.isnan(float(value)):
        return None
    return float(value)


def _te_function(fn, x_ty: relax.TensorType, b_ty: relax.TensorType) -> tvm.tirx.PrimFunc:
    """The PrimFunc ``emit_te(fn, x, b)`` writes for tensors of these types (the importer's way)."""
    bb = relax.BlockBuilder()
    x, b = relax.Var("x", x_ty), relax.Var("b", b_ty)
    with bb.function("main", [x, b]):
        bb.emit_func_output(bb.emit_te(fn, x, b))
    return next(f for _, f in bb.get().functions_items() if isinstance(f, tvm.tirx.PrimFunc))


def _elementwise_extreme(func: tvm.tirx.PrimFunc, x_ty: relax.TensorType, b_ty: relax.TensorType) -> str | None:
    """``"max"`` / ``"min"`` when ``func`` is TE's ``maximum`` / ``minimum`` of tensors of these
    types (structurally: the same loops and the one store ``out[i] = max(x[i], b[()])``); else None."""
    for kind, fn in (("max", topi.maximum), ("min", topi.minimum)):
        if tvm_ffi.structural_equal(func, _te_function(fn, x_ty, b_ty)):
            return kind
    return None


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod = mod
        self.count = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102 - see the module doc
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.call_tir" or not isinstance(call.args[0], relax.GlobalVar):
            return call
        func = self.mod.functions.get(call.args[0])
        args = call.args[1]
        if not isinstance(func, tvm.tirx.PrimFunc) or not isinstance(args, relax.Tuple) or len(args.fields) != 2:
            return call
        x, bound = args.fields[0], _bound(args.fields[1])
        if bound is None or not isinstance(x.ty, relax.TensorType) or not tvm_ffi.structural_equal(x.ty, call.ty):
            return call
        kind = _elementwise_extreme(func, x.ty, args.fields[1].ty)
        if kind is None:
            return call
        self.count += 1
        if kind == "max":
            return relax.op.clip(x, bound, math.inf)
        return relax.op.clip(x, -math.inf, bound)


def te_clips(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each TIR maximum / minimum of a tensor and a constant scalar written as ``clip``
    (see the module doc); ``mod`` itself when there is none."""
    out, changed = mod.clone(), []  # a pass does not change its input
    for name in entry_functions(mod):
        rewriter = _Rewriter(mod)
        func = rewriter.visit_expr(mod[name])
        if rewriter.count:
            out[name] = func
            changed.append(name)
    return relax.transform.DeadCodeElimination(changed)(out) if changed else mod
