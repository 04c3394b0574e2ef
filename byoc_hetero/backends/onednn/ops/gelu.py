"""gelu spelled out, as exporters write it, recognised as one ``eltwise`` gelu.

* erf form (``torch.onnx.export`` of ``nn.GELU()``, HF's ``GELUActivation``):
  ``x * 0.5 * (1 + erf(x / sqrt(2)))`` with ``erf(x * (1/sqrt(2)))`` too, the three products in any
  grouping and operand order, or ``(x * (1 + erf(..))) / 2`` -> rule ``gelu_erf_chain*`` -> an
  ``eltwise`` node ``gelu_erf``;
* tanh form (``nn.GELU(approximate="tanh")`` exported, GPT-2's ``NewGELU``):
  ``x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))`` with ``x**3`` as ``power(x, 3)``
  -> rule ``gelu_tanh_chain*`` -> ``eltwise`` ``gelu_tanh``.

Every constant is checked against its expected value (relative 1e-6, float32 rounding of the
exporter): a chain with another constant is no gelu and runs op by op.

Why: TVM imports the ONNX erf chain as five ops; the runtime ran them as five passes over the
[tokens, 4*hidden] activations, one of them a host ``erf`` — 12% of BERT-base's and ViT-B/16's
time through ``from_onnx`` (per-step profile), the whole gap to the ``from_torch`` path, whose
``nn.gelu`` is one op.

The region-graph pass :func:`..epilogue.fuse_eltwise_into_producer` then turns the ``eltwise`` node
into the activation post-op of the dense / matmul before it (through reshapes: TVM's torch
frontend writes ``linear`` on 3-D data as reshape, matmul, reshape, so the gelu of BERT's and
ViT's MLP sat in another composite than its dense).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from ....rules import Match
from ..epilogue import tensors_reason
from ..table import PatternSpec, lowers_composite, pattern_rules

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
TANH_CUBIC = 0.044715

#: Relative tolerance of a chain constant: an exporter's float32 rounding of the exact value.
RTOL = 1e-6

# (erf-argument form, constant name -> expected value) of the erf chain
_ERF_ARGS = {"div": SQRT2, "mul": 1.0 / SQRT2}
#: how the three factors x, 1/2 and (1 + f) are grouped: (name, builder)
_GROUPINGS = ("xh_a", "xa_h", "x_ha", "div2")


def _value(expr: relax.Expr) -> float | None:
    """The value of a one-element float constant, or None."""
    if isinstance(expr, (tvm.ir.Constant, tvm.ir.GenericConst)):
        data = (expr.value if isinstance(expr, tvm.ir.GenericConst) else expr.data).numpy()
        if data.size == 1 and data.dtype.kind == "f":
            return float(data.reshape(()))
    return None


def _close(value: float | None, expected: float) -> bool:
    return value is not None and abs(value - expected) <= RTOL * abs(expected)


def _product(x: DFPattern, one_plus: DFPattern, grouping: str, names: dict[str, DFPattern]) -> DFPattern:
    """x * 1/2 * one_plus in one grouping (multiply matches either operand order)."""
    half = is_const()
    names["half"] = half
    if grouping == "xh_a":
        return is_op("relax.multiply")(is_op("relax.multiply")(x, one_plus), half)
    if grouping == "xa_h":
        return is_op("relax.multiply")(is_op("relax.multiply")(x, half), one_plus)
    if grouping == "x_ha":
        return is_op("relax.multiply")(x, is_op("relax.multiply")(one_plus, half))
    return is_op("relax.divide")(is_op("relax.multiply")(x, one_plus), half)  # "div2": half is 2


def _erf_chain(arg: str, grouping: str) -> tuple[DFPattern, dict[str, DFPattern]]:
    x, scale, one = wildcard(), is_const(), is_const()
    op = "relax.divide" if arg == "div" else "relax.multiply"
    inner = is_op("relax.erf")(is_op(op)(x, scale))
    names = {"data": x, "scale": scale, "one": one}
    root = _product(x, is_op("relax.add")(inner, one), grouping, names)
    names["root"] = root
    return root, names


def _tanh_chain(grouping: str) -> tuple[DFPattern, dict[str, DFPattern]]:
    x, three, cubic, scale, one = wildcard(), is_const(), is_const(), is_const(), is_const()
    cube = is_op("relax.multiply")(is_op("relax.power")(x, three), cubic)
    inner = is_op("relax.tanh")(is_op("relax.multiply")(is_op("relax.add")(x, cube), scale))
    names = {"data": x, "three": three, "cubic": cubic, "scale": scale, "one": one}
    root = _product(x, is_op("relax.add")(inner, one), grouping, names)
    names["root"] = root
    return root, names


def _half_reason(match: Match, grouping: str) -> str | None:
    expected = 2.0 if grouping == "div2" else 0.5
    if not _close(_value(match.expr("half")), expected):
        return f"the gelu chain's halving constant is {_value(match.expr('half'))}, not {expected}"
    return None


def _shape_reason(match: Match) -> str | None:
    reason = tensors_reason(match, ["data", "root"], symbolic=True)
    if reason:
        return reason
    if match.shape("data") != match.shape("root"):
        return f"the gelu chain broadcasts {list(match.shape('data'))} to {list(match.shape('root'))}"
    return None


def _erf_check(arg: str, grouping: str):
    def check_gelu_erf_chain(match: Match) -> str | None:
        """x * 0.5 * (1 + erf(x / sqrt 2)): every constant what the erf form needs."""
        reason = _shape_reason(match) or _half_reason(match, grouping)
        if reason:
            return reason
        if not _close(_value(match.expr("one")), 1.0):
            return f"the gelu chain adds {_value(match.expr('one'))} to erf, not 1"
        if not _close(_value(match.expr("scale")), _ERF_ARGS[arg]):
            return f"the gelu chain's erf argument is x {'/' if arg == 'div' else '*'} " \
                   f"{_value(match.expr('scale'))}, not x {'/' if arg == 'div' else '*'} {_ERF_ARGS[arg]:.8g}"
        return None

    return check_gelu_erf_chain


def _tanh_check(grouping: str):
    def check_gelu_tanh_chain(match: Match) -> str | None:
        """x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x**3))): every constant as expected."""
        reason = _shape_reason(match) or _half_reason(match, grouping)
        if reason:
            return reason
        for name, expected in (("one", 1.0), ("three", 3.0), ("cubic", TANH_CUBIC), ("scale", SQRT_2_OVER_PI)):
            if not _close(_value(match.expr(name)), expected):
                return f"the tanh gelu chain's constant {name} is {_value(match.expr(name))}, not {expected:.8g}"
        return None

    return check_gelu_tanh_chain


ERF_RULES = [f"gelu_erf_chain_{arg}_{g}" for arg in _ERF_ARGS for g in _GROUPINGS]
TANH_RULES = [f"gelu_tanh_chain_{g}" for g in _GROUPINGS]


@pattern_rules
def _rules():
    # above the anchors' epilogues (100+) and the decomposed norms (130+): a chain is one op
    for arg in _ERF_ARGS:
        for grouping in _GROUPINGS:
            root, names = _erf_chain(arg, grouping)
            yield PatternSpec(f"gelu_erf_chain_{arg}_{grouping}", root, names, _erf_check(arg, grouping), priority=140)
    for grouping in _GROUPINGS:
        root, names = _tanh_chain(grouping)
        yield PatternSpec(f"gelu_tanh_chain_{grouping}", root, names, _tanh_check(grouping), priority=145)


def _lower_chain(ctx, func: relax.Function, algorithm: str) -> int:
    """The chain's x is the composite's one parameter (every other operand is a constant)."""
    if len(func.params) != 1:
        raise ctx.fail(f"a {algorithm} chain composite with {len(func.params)} parameters (expected x only)")
    return ctx.emit("eltwise", [ctx.data_of(func.params[0])], func.body.body, {"algorithm": algorithm})


@lowers_composite(*ERF_RULES)
def lower_gelu_erf_chain(ctx, func: relax.Function) -> int:
    """The erf chain as one ``eltwise`` ``gelu_erf``."""
    return _lower_chain(ctx, func, "gelu_erf")


@lowers_composite(*TANH_RULES)
def lower_gelu_tanh_chain(ctx, func: relax.Function) -> int:
    """The tanh chain as one ``eltwise`` ``gelu_tanh``."""
    return _lower_chain(ctx, func, "gelu_tanh")
