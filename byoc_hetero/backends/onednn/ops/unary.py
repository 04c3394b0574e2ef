"""erf (a host kernel: oneDNN 3.2 has no eltwise erf) and power by a constant exponent.

``erf`` becomes a ``unary`` node; gelu spelled out around an erf is one ``eltwise`` node
(:mod:`.gelu`; op by op it was five passes over the tensor, one of them the host erf: ConvNeXt-T
from ONNX, 10 of its 35 ms). ``power(x, c)`` with a scalar constant ``c`` of 2, 3, 0.5 or -0.5
becomes an ``eltwise`` node (``square``, ``cube``, ``sqrt``, ``rsqrt``): oneDNN 3.2 has no binary
pow, and its eltwise pow takes a fixed exponent; other exponents, or a run-time exponent, stay on llvm.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ....rules import Match
from ..epilogue import tensors_reason
from ..table import PatternSpec, lowers, pattern_rules

#: power's constant exponent -> the runtime's activation name.
POWERS = {2.0: "square", 3.0: "cube", 0.5: "sqrt", -0.5: "rsqrt"}


def scalar_constant(expr: relax.Expr) -> float | None:
    """The value of a one-element constant, or None."""
    if isinstance(expr, tvm.ir.Constant):
        data = expr.value.numpy()
        if data.size == 1:
            return float(data.reshape(()))
    return None


def check_erf(match: Match) -> str | None:
    """erf of a float32 tensor (symbolic dims too: the kernel is elementwise)."""
    return tensors_reason(match, ["data", "root"], symbolic=True)


def check_power(match: Match) -> str | None:
    """x ** c with a scalar constant c the runtime has an eltwise for (symbolic dims too: the
    kernel is elementwise; RMSNorm's square over [B, S, D])."""
    call = match.expr("root")
    reason = tensors_reason(match, ["data", "root"], symbolic=True)
    if reason:
        return reason
    exponent = scalar_constant(call.args[1])
    if exponent is None:
        return "power by a run-time or non-scalar exponent (oneDNN 3.2 has no binary pow)"
    if exponent not in POWERS:
        return f"power by {exponent}: the runtime runs exponents {sorted(POWERS)} only"
    if match.shape("root") != match.shape("data"):
        return "power broadcasts its base"
    return None


@pattern_rules
def _rules():
    x = wildcard()
    erf = is_op("relax.erf")(x)
    yield PatternSpec("erf", erf, {"data": x, "root": erf}, check_erf, priority=10)
    x = wildcard()
    power = is_op("relax.power")(x, wildcard())
    yield PatternSpec("power", power, {"data": x, "root": power}, check_power, priority=10)


@lowers("relax.erf", check=check_erf)
def lower_erf(ctx, var: relax.Var, call: relax.Call) -> int:
    return ctx.emit("unary", [ctx.data_of(call.args[0])], var, {"algorithm": "erf"})


@lowers("relax.power", check=check_power)
def lower_power(ctx, var: relax.Var, call: relax.Call) -> int:
    name = POWERS[scalar_constant(call.args[1])]
    return ctx.emit("eltwise", [ctx.data_of(call.args[0])], var, {"algorithm": name})


