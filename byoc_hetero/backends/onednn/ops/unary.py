"""erf (a host kernel: oneDNN 3.2 has no eltwise erf), power by a constant exponent, and gelu spelled
out around an erf.

``erf`` becomes a ``unary`` node. ``x * (erf(x / sqrt(2)) + 1) * 0.5`` (rule ``gelu_erf_decomposed``:
what ``torch.onnx.export`` writes for ``nn.GELU``, the multiplications in any order and the division
also as a multiplication by 1/sqrt(2)) becomes one ``eltwise`` node ``gelu_erf``, which a producing
dense or conv then takes as its post-op (:func:`.layout.fold_activations`); op by op it was five
passes over the tensor, one of them the host erf (ConvNeXt-T from ONNX: 10 of its 35 ms). ``power(x, c)`` with a scalar constant ``c`` of 2, 3, 0.5 or -0.5
becomes an ``eltwise`` node (``square``, ``cube``, ``sqrt``, ``rsqrt``): oneDNN 3.2 has no binary
pow, and its eltwise pow takes a fixed exponent; other exponents, or a run-time exponent, stay on llvm.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...._relax import op_name
from ....rules import Match
from ..epilogue import tensors_reason
from ..table import PatternSpec, lowers, lowers_composite, pattern_rules

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
    """x ** c with a scalar constant c the runtime has an eltwise for."""
    call = match.expr("root")
    reason = tensors_reason(match, ["data", "root"])
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


#: One rule per order of the multiplications (a pattern is one expression tree).
GELU_ERF_RULES = ("gelu_erf_decomposed", "gelu_erf_decomposed_half_first", "gelu_erf_decomposed_half_last")


def gelu_erf_patterns():
    """(pattern, names) of every spelling of ``0.5 * x * (1 + erf(x / sqrt(2)))`` the rule matches."""

    def constant():
        return wildcard()

    forms = []
    for order in range(3):
        x = wildcard()
        scaled = is_op("relax.divide")(x, constant()) | is_op("relax.multiply")(x, constant())
        erf = is_op("relax.erf")(scaled)
        one_plus = is_op("relax.add")(erf, constant())
        if order == 0:  # (x * (1 + erf)) * 0.5: torch.onnx.export of nn.GELU
            root = is_op("relax.multiply")(is_op("relax.multiply")(x, one_plus), constant())
        elif order == 1:  # (x * 0.5) * (1 + erf): Hugging Face's gelu written in Python
            root = is_op("relax.multiply")(is_op("relax.multiply")(x, constant()), one_plus)
        else:  # x * ((1 + erf) * 0.5)
            root = is_op("relax.multiply")(x, is_op("relax.multiply")(one_plus, constant()))
        forms.append((root, {"data": x, "root": root, "scaled": scaled, "erf": erf, "one_plus": one_plus}))
    return forms


def _scalar_operand(call: relax.Call) -> float | None:
    """The value of the one scalar-constant operand of a binary ``call`` (the pattern already ties
    the other operand to x or erf), or None."""
    values = [v for v in (scalar_constant(a) for a in call.args) if v is not None]
    return values[0] if len(values) == 1 else None


def check_gelu_erf(match: Match) -> str | None:
    """0.5 * x * (1 + erf(x / sqrt(2))): the constants are sqrt(2) (or 1/sqrt(2) multiplied), 1 and
    0.5 (to float32 precision), and every step keeps x's shape (no broadcasting)."""
    reason = tensors_reason(match, ["data", "root"])
    if reason:
        return reason
    shape = match.shape("data")
    for name in ("scaled", "erf", "one_plus", "root"):
        if match.shape(name) != shape:
            return f"gelu's {name} step changes the shape {list(shape)} -> {list(match.shape(name))}"
    scaled = match.expr("scaled")
    c = _scalar_operand(scaled)
    want = math.sqrt(2.0) if op_name(scaled) == "relax.divide" else 1.0 / math.sqrt(2.0)
    if c is None or not math.isclose(c, want, rel_tol=1e-6):
        return f"erf's argument is not x / sqrt(2) (constant {c})"
    one = _scalar_operand(match.expr("one_plus"))
    if one is None or one != 1.0:
        return f"erf is not incremented by 1 (constant {one})"
    # the 0.5: the one scalar constant among the multiplications outside erf
    halves = []
    root = match.expr("root")
    for call in (root, *[match.value(a) for a in root.args]):
        if isinstance(call, relax.Call) and op_name(call) == "relax.multiply":
            halves += [v for v in (scalar_constant(a) for a in call.args) if v is not None]
    if halves != [0.5]:
        return f"the product is not scaled by exactly one constant 0.5 (found {halves})"
    return None


@lowers_composite(*GELU_ERF_RULES)
def lower_gelu_erf(ctx, func: relax.Function) -> int:
    """The whole composite: one eltwise gelu_erf of its data (the composite's only parameter)."""
    values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    erf = next(v for v in values.values() if isinstance(v, relax.Call) and op_name(v) == "relax.erf")
    scaled = erf.args[0]
    scaled = values.get(scaled, scaled)
    data = next(a for a in scaled.args if scalar_constant(a) is None)
    return ctx.emit("eltwise", [ctx.data_of(data)], func.body.body, {"algorithm": "gelu_erf"})


@pattern_rules
def _rules():
    for rule, (root, names) in zip(GELU_ERF_RULES, gelu_erf_patterns()):
        # above erf's own rule and the binary rules: the five ops become one node
        yield PatternSpec(rule, root, names, check_gelu_erf, priority=60)
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


