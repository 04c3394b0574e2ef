"""Pass ``bool_arith``: scans and max / min reductions of bool tensors as integer arithmetic.

What it rewrites (on every Relax function of the module, at import):

* ``cumsum(x: bool)`` / ``cumprod(x: bool)`` without an integer or float ``dtype`` ->
  ``cumsum(astype(x, int64), dtype=int64)``: torch promotes a bool scan to int64
  (``torch.tensor([True, False]).cumsum(0).dtype == torch.int64``), while TVM's torch importer
  types the result bool, which is wrong (a running count saturated to one bit) and which TVM's
  llvm codegen cannot build ("Check failed: t.MatchesCode(kDLFloat)"). Hugging Face's mask code
  writes such a scan: ``(position_ids_diff != 1).cumsum(-1)`` in ``find_packed_sequence_indices``
  (transformers' Llama, Qwen, Mistral... called without a cache and without an attention mask).
  A scan with an explicit non-bool ``dtype`` gets its input cast to that dtype.
* ``max(x: bool)`` / ``min(x: bool)`` -> ``astype(max(astype(x, int8)), bool)``: TVM cannot lower
  a max/min reduction over bool ("Cannot decide min_value for type bool"); over 0/1 int8 the
  reduction is the same logical any/all.

Values downstream of a rewritten scan are re-typed (their dtype follows the int64 result), which
is what torch computes. Everything else is left as it is.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .._relax import op_name, tensor_dtype

SCANS = {"relax.cumsum": relax.op.cumsum, "relax.cumprod": relax.op.cumprod}
REDUCTIONS = {"relax.max": relax.op.max, "relax.min": relax.op.min}


def _rewrite_call(call: relax.Call, emit) -> relax.Expr | None:
    """The integer form of a bool scan / reduction call, or None when ``call`` is none (``emit``
    binds an intermediate value: the module stays in normal form)."""
    name = op_name(call)
    if name not in SCANS and name not in REDUCTIONS or not call.args:
        return None
    data = call.args[0]
    if tensor_dtype(data) != "bool":
        return None
    attrs = call.attrs
    if name in SCANS:
        wanted = str(attrs.dtype) if attrs.dtype is not None else ""
        dtype = wanted if wanted and wanted != "bool" else "int64"
        return SCANS[name](emit(relax.op.astype(data, dtype)), axis=attrs.axis, dtype=dtype,
                           exclusive=bool(attrs.exclusive))
    axis = None if attrs.axis is None else [int(a) for a in attrs.axis]
    reduced = REDUCTIONS[name](emit(relax.op.astype(data, "int8")), axis=axis, keepdims=bool(attrs.keepdims))
    return relax.op.astype(emit(reduced), "bool")


def bool_arith(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every bool ``cumsum`` / ``cumprod`` / ``max`` / ``min`` in integer arithmetic
    (the module itself when it has none)."""
    changed = []

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):  # noqa: N802 - TVM's visitor naming
            call = super().visit_call_(call)
            new = _rewrite_call(call, self.builder_.emit) if isinstance(call.op, tvm.ir.Op) else None
            if new is None:
                return call
            changed.append(op_name(call))
            return new

    out = mod.clone()
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            new = Rewrite(mod).visit_expr(func)
            if changed:
                out[gvar] = new
    return out if changed else mod
