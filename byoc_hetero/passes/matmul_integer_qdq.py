"""Pass ``matmul_integer_qdq`` (Relax, in ``partition`` after the weights are bound): ONNX's
``MatMulInteger`` + scale multiply, as ``quantize_dynamic`` writes them, into the QDQ form.

What: TVM's importer writes ``MatMulInteger(A, B, a_zp, b_zp)`` followed by ``Cast(float)`` and
``Mul(a_scale * b_scale)`` as

    acc = matmul(astype(A, i32) - astype(a_zp, i32), astype(B, i32) - astype(b_zp, i32), out_dtype=i32)
    y = multiply(astype(acc, f32), multiply(a_scale, b_scale))

and where ``A`` is a ``quantize(x, a_scale, a_zp)`` (a ``DynamicQuantizeLinear``'s, or a static one's)
and the other factor of the scale product is ``B``'s scale (a scalar, or one per column with a
zero point of that shape), ``y``'s binding becomes

    y = matmul(dequantize(A, a_scale, a_zp), dequantize(B, b_scale, b_zp, axis=-1))

Why: the int32 matmul and its casts have no oneDNN kernel and stay on llvm (a ``quantize_dynamic``
transformer ran entirely on llvm: 0 regions); in the QDQ form the matmul is an ordinary float matmul
between dequantized operands — offloaded like the float model's, and the form the int8 patterns read
(a quantized activation times an int8 weight) as they read a ``quantize_static`` file's. The value
is the same up to float32 rounding: the sum of products is accumulated in float32 instead of int32
(relative difference ~1e-6 measured on K = 64 against ONNX Runtime). A ``MatMulInteger`` whose
operands are not so identified (a per-row ``a_zp``, an unquantized ``A``, a scale product of other
factors) is left as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tvm
from tvm import relax

from .._relax import bound_values, entry_functions, op_name, updated


def _call(values: Mapping[relax.Var, Any], expr: relax.Expr, name: str) -> relax.Call | None:
    value = values.get(expr) if isinstance(expr, relax.Var) else expr
    return value if isinstance(value, relax.Call) and op_name(value) == name else None


def _operand(values: Mapping[relax.Var, Any], expr: relax.Expr) -> tuple[relax.Expr, relax.Expr | None] | None:
    """``astype(Q, i32) [- astype(zp, i32) [expand_dims]]`` → (Q, zp or None); None for anything else."""
    sub = _call(values, expr, "relax.subtract")
    cast = _call(values, sub.args[0] if sub is not None else expr, "relax.astype")
    if cast is None or str(cast.ty.dtype) != "int32" or str(cast.args[0].ty.dtype) not in ("uint8", "int8"):
        return None
    if sub is None:
        return cast.args[0], None
    zp_expr = sub.args[1]
    expand = _call(values, zp_expr, "relax.expand_dims")
    zp_cast = _call(values, expand.args[0] if expand is not None else zp_expr, "relax.astype")
    if zp_cast is None:
        return None
    return cast.args[0], zp_cast.args[0]


def _rewrite(values: Mapping[relax.Var, Any], call: relax.Call) -> relax.Expr | None:
    """The QDQ form of ``call`` (a ``multiply`` of an int32 matmul's float cast by a scale product)."""
    if op_name(call) != "relax.multiply":
        return None
    for acc_f, scales in (call.args, call.args[::-1]):
        cast = _call(values, acc_f, "relax.astype")
        matmul = _call(values, cast.args[0], "relax.matmul") if cast is not None else None
        product = _call(values, scales, "relax.multiply")
        if matmul is None or product is None or str(matmul.ty.dtype) != "int32" or str(cast.ty.dtype) != "float32":
            continue
        a, b = _operand(values, matmul.args[0]), _operand(values, matmul.args[1])
        quantize = _call(values, a[0], "relax.quantize") if a is not None else None
        if b is None or quantize is None or (a[1] is not None and a[1].ty.ndim != 0):
            continue
        a_scale = quantize.args[1]
        b_scale = next((s for s, o in ((product.args[1], product.args[0]), (product.args[0], product.args[1]))
                        if o.same_as(a_scale)), None)
        if b_scale is None or b_scale.ty.ndim > 1 or str(b_scale.ty.dtype) != "float32":
            continue
        b_zp = b[1] if b[1] is not None else relax.const(0, str(b[0].ty.dtype))
        if b_zp.ty.ndim not in (0, b_scale.ty.ndim):
            continue
        a_zp = a[1] if a[1] is not None else relax.const(0, str(a[0].ty.dtype))
        a_ndim = a[0].ty.ndim
        lhs = relax.op.dequantize(a[0], a_scale, a_zp, axis=1 if a_ndim > 1 else 0, out_dtype="float32")
        rhs = relax.op.dequantize(b[0], b_scale, b_zp, axis=b[0].ty.ndim - 1, out_dtype="float32")
        return relax.op.matmul(lhs, rhs, out_dtype="float32")
    return None


def matmul_integer_qdq(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each ``MatMulInteger`` + scale multiply in QDQ form (see the module docstring);
    ``mod`` itself when there is none."""
    from ._ir import map_calls as _map_calls

    changes = {}
    for name in entry_functions(mod):
        func = mod[name]
        values = bound_values(func)
        new = _map_calls(func, lambda _var, call, values=values: _rewrite(values, call))
        if not new.same_as(func):
            changes[mod.get_global_var(name)] = new
    if not changes:
        return mod
    mod = relax.transform.Normalize()(updated(mod, changes))
    return relax.transform.DeadCodeElimination(entry_functions(mod))(mod)
