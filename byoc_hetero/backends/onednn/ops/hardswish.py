"""hardswish and hardsigmoid spelled out as chains of adds, clips and scalings: one ``eltwise`` node
(``hardswish`` / ``hardsigmoid``, oneDNN's eltwise with alpha 1/6, beta 1/2), which the graph pass
:func:`..epilogue.fuse_eltwise_into_producer` then makes a post-op of the conv2d / dense that
computes its operand.

TVM's frontends write them as (``relu6(v)`` being ``clip(v, 0, 6)`` or ``clip(clip(v, 0, inf), -inf, 6)``):

* PyTorch ``hardswish``: ``divide(multiply(x, relu6(add(x, 3))), 6)``;
  ``hardsigmoid``: ``divide(relu6(add(x, 3)), 6)``;
* ONNX ``HardSwish``: ``multiply(x, divide(clip(add(x, 3), 0, 6), 6))``;
  ``HardSigmoid`` (alpha 1/6, beta 1/2): ``clip(add(multiply(1/6, x), 0.5), 0, 1)``.

A division by 6 may also be a multiplication by 1/6. Run op by op these were four oneDNN steps per
activation, and on a blocked conv output the ``add 3`` / ``divide 6`` with a scalar operand fell to
oneDNN's reference binary: MobileNetV3-Large spent 25 of its 29 ms (1 thread) in the two such steps
after its stem (per-step profile, bench/zoo.py's model).

The smooth member of the family comes the same way: TVM's PyTorch frontend writes ``silu`` (EfficientNet's
swish) as ``multiply(x, sigmoid(x))``, two steps (rule ``silu_decomposed``, oneDNN's eltwise_swish).

The patterns only fix the chain's shape; :func:`parse_chain` reads the constants, so a chain with
other numbers (ONNX HardSigmoid's default alpha 0.2, an add of 2) is refused with its reason and
runs op by op as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from ...._relax import bound_values, op_name, shape_of
from ....rules import Match
from ..epilogue import tensors_reason
from ..precision import tensor_reason
from ..table import PatternSpec, lowers_composite, pattern_rules

#: Rule name -> the runtime's activation name.
KINDS = {"hardswish": "hardswish", "hardsigmoid": "hardsigmoid", "silu_decomposed": "silu"}

_CONSTANTS = (tvm.ir.Constant, tvm.ir.GenericConst)
_SIXTH = 1.0 / 6.0

Resolve = Callable[[relax.Expr], relax.Expr]
"""A variable bound inside the chain -> its value (anything else unchanged)."""


# -- patterns -------------------------------------------------------------------------------------
def _clips(v: DFPattern) -> DFPattern:
    """clip(v) or clip(clip(v)): relu6 as ONNX and as TVM's PyTorch frontend write it."""
    one = is_op("relax.clip")(v, wildcard(), wildcard())
    return is_op("relax.clip")(one, wildcard(), wildcard()) | one


def _by_six(v: DFPattern) -> DFPattern:
    """divide(v, 6) or multiply(v, 1/6) (either order)."""
    return is_op("relax.divide")(v, is_const()) | is_op("relax.multiply")(v, is_const())


def _hardsigmoid(x: DFPattern) -> DFPattern:
    plus3 = _by_six(_clips(is_op("relax.add")(x, is_const())))
    affine = _clips(is_op("relax.add")(is_op("relax.multiply")(x, is_const()), is_const()))
    return plus3 | affine


def _hardswish(x: DFPattern) -> DFPattern:
    gated = is_op("relax.multiply")(x, _hardsigmoid(x))
    scaled = _by_six(is_op("relax.multiply")(x, _clips(is_op("relax.add")(x, is_const()))))
    return gated | scaled


# -- reading the constants ------------------------------------------------------------------------
def _scalar(expr: relax.Expr) -> float | None:
    """The value of a one-element float constant, or None."""
    if not isinstance(expr, _CONSTANTS):
        return None
    data = (expr.value if isinstance(expr, tvm.ir.GenericConst) else expr.data).numpy()
    if data.size != 1 or data.dtype.kind != "f":
        return None
    return float(data.reshape(-1)[0])


def _is(value: float | None, want: float) -> bool:
    # 1/6 as float32 is 0.16666667163...: equal to within float32 rounding
    return value is not None and math.isclose(value, want, rel_tol=1e-6, abs_tol=0.0)


def _call(expr: relax.Expr, resolve: Resolve, op: str) -> relax.Call | None:
    value = resolve(expr)
    return value if isinstance(value, relax.Call) and op_name(value) == op else None


def _split(call: relax.Call) -> tuple[relax.Expr, float | None]:
    """(the non-constant operand, the scalar value of the other) of a binary call."""
    a, b = call.args[0], call.args[1]
    if isinstance(a, _CONSTANTS) and not isinstance(b, _CONSTANTS):
        return b, _scalar(a)
    return a, _scalar(b)


def _bound(value) -> float | None:
    for _ in range(3):  # FloatImm / IntImm, or a PrimValue wrapping one
        if isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
            return float(value.value)
        value = getattr(value, "value", None)
    return None


def _clip_chain(expr: relax.Expr, resolve: Resolve, lo: float, hi: float) -> relax.Expr | str:
    """The operand of clip(...) or clip(clip(...)) whose combined bounds are [lo, hi], or a reason."""
    outer = _call(expr, resolve, "relax.clip")
    if outer is None:
        return "expected a clip"
    low, high, operand = -math.inf, math.inf, None
    for clip in (outer, _call(outer.args[0], resolve, "relax.clip")):
        if clip is None:
            break
        a, b = _bound(clip.args[1]), _bound(clip.args[2])
        if a is None or b is None:
            return "clip bounds are not constant numbers"
        low, high, operand = max(low, a), min(high, b), clip.args[0]
    if (low, high) != (lo, hi):
        return f"clip bounds [{low}, {high}], not [{lo}, {hi}]"
    return operand


def _plus3_relu6(expr: relax.Expr, resolve: Resolve) -> relax.Expr | str:
    """x of relu6(add(x, 3)), or a reason."""
    operand = _clip_chain(expr, resolve, 0.0, 6.0)
    if isinstance(operand, str):
        return operand
    add = _call(operand, resolve, "relax.add")
    if add is None:
        return "relu6 of something other than an add"
    x, three = _split(add)
    if not _is(three, 3.0):
        return f"adds {three} before relu6, not 3"
    return x


def _divided_by_six(expr: relax.Expr, resolve: Resolve) -> relax.Expr | str:
    """v of divide(v, 6) / multiply(v, 1/6), or a reason."""
    value = resolve(expr)
    if isinstance(value, relax.Call) and op_name(value) == "relax.divide":
        v, six = value.args[0], _scalar(value.args[1])
        return v if _is(six, 6.0) else f"divides by {six}, not 6"
    if isinstance(value, relax.Call) and op_name(value) == "relax.multiply":
        v, sixth = _split(value)
        return v if _is(sixth, _SIXTH) else f"multiplies by {sixth}, not 1/6"
    return "expected a division by 6"


def _hardsigmoid_of(expr: relax.Expr, resolve: Resolve) -> relax.Expr | str:
    """x when ``expr`` computes hardsigmoid(x) (either form), else the reason."""
    scaled = _divided_by_six(expr, resolve)
    if not isinstance(scaled, str):
        return _plus3_relu6(scaled, resolve)
    operand = _clip_chain(expr, resolve, 0.0, 1.0)
    if isinstance(operand, str):
        return scaled if _call(expr, resolve, "relax.clip") is None else operand
    add = _call(operand, resolve, "relax.add")
    mul = None if add is None else _call(_split(add)[0], resolve, "relax.multiply")
    if mul is None:
        return "clip(.., 0, 1) of something other than add(multiply(x, alpha), beta)"
    half, (x, alpha) = _split(add)[1], _split(mul)
    if not (_is(alpha, _SIXTH) and _is(half, 0.5)):
        return f"hard sigmoid with alpha {alpha}, beta {half}; the runtime runs alpha 1/6, beta 1/2"
    return x


def _hardswish_of(expr: relax.Expr, resolve: Resolve) -> relax.Expr | str:
    """x when ``expr`` computes hardswish(x) (either form), else the reason."""
    scaled = _divided_by_six(expr, resolve)
    mul = _call(expr if isinstance(scaled, str) else scaled, resolve, "relax.multiply")
    if mul is None:
        return "expected x multiplied by its hard sigmoid"
    a, b = mul.args[0], mul.args[1]
    why = "expected x multiplied by its hard sigmoid"
    for x, gate in ((a, b), (b, a)):
        inner = _plus3_relu6(gate, resolve) if not isinstance(scaled, str) else _hardsigmoid_of(gate, resolve)
        if isinstance(inner, str):
            why = inner
        elif inner.same_as(x):
            return x
        else:
            why = "the hard sigmoid's operand is not the value it multiplies"
    return why


def _silu_of(expr: relax.Expr, resolve: Resolve) -> relax.Expr | str:
    """x when ``expr`` is multiply(x, sigmoid(x)) (either order), else the reason."""
    mul = _call(expr, resolve, "relax.multiply")
    if mul is None:
        return "expected x multiplied by its sigmoid"
    for x, gate in ((mul.args[0], mul.args[1]), (mul.args[1], mul.args[0])):
        sigmoid = _call(gate, resolve, "relax.sigmoid")
        if sigmoid is not None and sigmoid.args[0].same_as(x):
            return x
    return "the sigmoid's operand is not the value it multiplies"


_PARSERS = {"hardswish": _hardswish_of, "hardsigmoid": _hardsigmoid_of, "silu_decomposed": _silu_of}


def parse_chain(kind: str, root: relax.Expr, resolve: Resolve) -> relax.Expr | str:
    """The operand x of a ``kind`` (a rule of :data:`KINDS`) chain ending at ``root``, or the
    reason the chain is not exactly that function."""
    return _PARSERS[kind](root, resolve)


# -- rules ----------------------------------------------------------------------------------------
def _checker(kind: str):
    def check(match: Match) -> str | None:
        reason = tensors_reason(match, ["root"], symbolic=True)
        if reason:
            return reason
        x = parse_chain(kind, match.call, match.value)
        if isinstance(x, str):
            return f"not a {kind}: {x}"
        reason = tensor_reason(x, f"{kind} operand", symbolic=True)
        if reason:
            return reason
        if shape_of(x) != match.shape("root"):
            return f"{kind} chain broadcasts its operand {shape_of(x)} to {match.shape('root')}"
        return None

    check.__name__ = f"check_{kind}"
    check.__doc__ = f"A {kind} chain with exactly the constants of {kind} on a float32 tensor."
    return check


check_hardswish = _checker("hardswish")
check_hardsigmoid = _checker("hardsigmoid")
check_silu_decomposed = _checker("silu_decomposed")


@pattern_rules
def _rules():
    # above the binary / activation rules (20, 10) that would take the chain's ops one by one, below
    # the anchors (100+); hardswish contains a hardsigmoid, so it is tried first
    x = wildcard()
    swish = _hardswish(x)
    yield PatternSpec("hardswish", swish, {"data": x, "root": swish}, check_hardswish, priority=62)
    x = wildcard()
    sigmoid = _hardsigmoid(x)
    yield PatternSpec("hardsigmoid", sigmoid, {"data": x, "root": sigmoid}, check_hardsigmoid, priority=61)
    x = wildcard()
    silu = is_op("relax.multiply")(x, is_op("relax.sigmoid")(x))
    yield PatternSpec("silu_decomposed", silu, {"data": x, "root": silu}, check_silu_decomposed, priority=60)


@lowers_composite(*KINDS)
def lower_hard_activation(ctx, func: relax.Function) -> int:
    """The whole chain as one ``eltwise`` node (fused into its producer later, if it can be)."""
    kind = str(func.attrs["Composite"]).partition(".")[2]
    values = bound_values(func)
    root = func.body.body
    x = parse_chain(kind, root, lambda e: values.get(e, e) if isinstance(e, relax.Var) else e)
    if isinstance(x, str):
        raise ctx.fail(f"composite {kind} is not one: {x}")
    return ctx.emit("eltwise", [ctx.data_of(x)], root, {"algorithm": KINDS[kind]})
