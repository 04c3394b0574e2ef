"""Fast exp for the tvm_cpu backend's regions (its option ``fast_math``, off by default).

TVM lowers ``exp`` to LLVM's ``llvm.exp.f32``, which LLVM turns into one scalar ``expf`` call per
element even in a vectorized loop (no vector math library): exp and softmax stay scalar. TVM ships a
polynomial exp in TIR (``topi.fast_exp``: range reduction to ``2^n * e^r``, a degree-7 polynomial
on ``r``; what TVM's own ``relax.transform.FastMathTransform`` substitutes), which vectorizes. Used
as it is, it clamps its argument to +-88.376, so it is wrong at the edges: NaN comes out as
``e^88.4`` (the clamp's compare drops NaN) and the finite range above 88.376 as ``e^88.376``.
:func:`fast_math` substitutes a guarded form instead:

- above 88, ``exp(x) = 2 * fast_exp(x - ln 2)``: the doubling is exact, and the clamp now bounds
  ``x`` at 89.07, past float32's overflow (88.72), so a large ``x`` overflows to ``inf`` as
  ``expf`` does; below -87.68 the result is 0 (exp is a denormal there), ``-inf`` included;
- a NaN argument gives NaN (``isnan`` selects it through);
- ``softmax`` is spelled max / subtract / (that) exp / sum / divide.

Accuracy against numpy's float64 exp (``tests/test_tvm_cpu.py``): relative error at most
:data:`TOLERANCE` over float32's normal range of exp, absolute error below 1e-37 where exp
underflows to denormals (``x`` < -87.3); softmax within a few times that relative error.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, te, tirx, topi

TOLERANCE = 2e-6
"""The largest relative error of the fast exp against float64's, over float32's normal range
(tested): a few float32 ulps."""

_LN2 = math.log(2.0)
_SHIFT_ABOVE = 88.0  # below TVM's clamp (88.376): exp(x) = 2 * exp(x - ln 2) from here on


def fast_exp(x: te.Tensor) -> te.Tensor:
    """``exp(x)`` of a float32 tensor, by TVM's polynomial exp guarded as the module says."""
    high = te.compute(x.shape, lambda *i: x(*i) > tirx.const(_SHIFT_ABOVE, x.dtype), name="fast_exp_high")
    shifted = te.compute(x.shape, lambda *i: x(*i) - tirx.Select(high(*i), tirx.const(_LN2, x.dtype),
                                                                tirx.const(0.0, x.dtype)), name="fast_exp_arg")
    fast = topi.fast_exp(shifted)
    return te.compute(x.shape, lambda *i: tirx.Select(
        tirx.isnan(x(*i)), x(*i),
        fast(*i) * tirx.Select(high(*i), tirx.const(2.0, x.dtype), tirx.const(1.0, x.dtype))), name="fast_exp_guarded")


def fast_softmax(x: te.Tensor, axis: int) -> te.Tensor:
    """``softmax(x, axis)``: max, subtract, :func:`fast_exp`, sum, divide."""
    axis = axis % len(x.shape)
    e = fast_exp(topi.subtract(x, topi.max(x, axis=axis, keepdims=True)))
    return topi.divide(e, topi.sum(e, axis=axis, keepdims=True))


def _float32(expr: relax.Expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32"


@relax.expr_functor.mutator
class _FastMath(relax.PyExprMutator):
    """Each float32 ``exp`` / ``nn.softmax`` call as a ``call_te`` of :func:`fast_exp` / :func:`fast_softmax`."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        name = call.op.name if isinstance(call.op, tvm.ir.Op) else ""
        if name == "relax.exp" and _float32(call.args[0]):
            return self.builder_.call_te(fast_exp, call.args[0])
        if name == "relax.nn.softmax" and _float32(call.args[0]):
            return self.builder_.call_te(fast_softmax, call.args[0], int(call.attrs.axis))
        return super().visit_call_(call)


def fast_math(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each float32 exp and softmax of its Relax functions in the fast, guarded form."""
    mutator = _FastMath(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


__all__ = ["TOLERANCE", "fast_exp", "fast_math", "fast_softmax"]
