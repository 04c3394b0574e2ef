"""Attention-mask ops: comparisons (-> bool), where, and dtype casts (astype).

* ``less``, ``less_equal``, ``greater``, ``greater_equal``, ``equal``, ``not_equal`` of two float32,
  int64, int32 or bool tensors (one dtype, numpy broadcasting) -> a ``compare`` node writing bool;
* ``where(cond bool, x float32, y float32)`` with broadcasting -> a ``where`` node;
* ``astype``: to float32 from int64 / int32 / bool (HF's ``(1 - mask.astype(float32)) * min``), between
  int64 / int32 / bool, anything to bool -> a ``cast`` node; float32 -> float32 is no node at all.
  float32 -> an integer stays on llvm (out-of-range values have no defined result).

Bool tensors are one byte per element (0/1) in the runtime, as in DLPack.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...._relax import shape_of, tensor_dtype
from ....rules import Match
from ..table import PatternSpec, lowers, pattern_rules

#: Relax comparison op -> the compare node's algorithm.
COMPARISONS = {
    "relax.less": "less",
    "relax.less_equal": "less_equal",
    "relax.greater": "greater",
    "relax.greater_equal": "greater_equal",
    "relax.equal": "equal",
    "relax.not_equal": "not_equal",
}
MASK_DTYPES = ("float32", "int64", "int32", "bool")


def _static_reason(exprs: dict[str, relax.Expr]) -> str | None:
    """dtype and shape of each operand. Symbolic dims are allowed (elementwise kernels planned per
    binding, their broadcasting checked on the bound shapes) when the runtime can evaluate them."""
    for name, expr in exprs.items():
        if tensor_dtype(expr) not in MASK_DTYPES:
            return f"{name} has dtype {tensor_dtype(expr) or 'non-tensor'}; mask ops run on {', '.join(MASK_DTYPES)}"
        if shape_of(expr) is None:
            return (f"{name} has the shape {expr.ty}, whose rank is unknown or whose dims use more than "
                    "symbols, integers, + - * //; the runtime cannot evaluate it")
    return None


def check_compare(match: Match) -> str | None:
    call = match.expr("root")
    reason = _static_reason({"operand 0": call.args[0], "operand 1": call.args[1], "result": call})
    if reason:
        return reason
    if tensor_dtype(call.args[0]) != tensor_dtype(call.args[1]):
        return f"comparison of {tensor_dtype(call.args[0])} with {tensor_dtype(call.args[1])}"
    return None


def check_where(match: Match) -> str | None:
    call = match.expr("root")
    reason = _static_reason({"cond": call.args[0], "x": call.args[1], "y": call.args[2], "result": call})
    if reason:
        return reason
    dtypes = [tensor_dtype(a) for a in call.args[:3]]
    if dtypes != ["bool", "float32", "float32"]:
        return f"where of {dtypes}: the runtime runs where(bool, float32, float32)"
    return None


def check_astype(match: Match) -> str | None:
    call = match.expr("root")
    reason = _static_reason({"data": call.args[0], "result": call})
    if reason:
        return reason
    src, dst = tensor_dtype(call.args[0]), tensor_dtype(call)
    if src == "float32" and dst in ("int64", "int32"):
        return f"astype float32 -> {dst}: out-of-range values have no defined result"
    return None


@pattern_rules
def _rules():
    for op, name in COMPARISONS.items():
        call = is_op(op)(wildcard(), wildcard())
        yield PatternSpec(name, call, {"root": call}, check_compare, priority=10)
    call = is_op("relax.where")(wildcard(), wildcard(), wildcard())
    yield PatternSpec("where", call, {"root": call}, check_where, priority=10)
    data = wildcard()
    call = is_op("relax.astype")(data)
    yield PatternSpec("astype", call, {"data": data, "root": call}, check_astype, priority=10)


@lowers(*COMPARISONS, check=check_compare)
def lower_compare(ctx, var: relax.Var, call: relax.Call) -> int:
    inputs = [ctx.data_of(call.args[0]), ctx.data_of(call.args[1])]
    return ctx.emit("compare", inputs, var, {"algorithm": COMPARISONS[call.op.name]})


@lowers("relax.where", check=check_where)
def lower_where(ctx, var: relax.Var, call: relax.Call) -> int:
    return ctx.emit("where", [ctx.data_of(a) for a in call.args[:3]], var, {})


@lowers("relax.astype", check=check_astype)
def lower_astype(ctx, var: relax.Var, call: relax.Call) -> int:
    if tensor_dtype(call.args[0]) == tensor_dtype(call):
        return ctx.lookup(call.args[0])  # a no-op cast: the same tensor
    return ctx.emit("cast", [ctx.data_of(call.args[0])], var, {})
