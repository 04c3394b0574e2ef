"""Activations: relu, clip (relu6, and with an infinite bound), sigmoid, tanh, gelu, gelu_tanh, silu,
and the unary functions oneDNN runs as eltwise algorithms: sqrt, rsqrt, exp, log, abs, negative,
square (and ``power`` by a constant 2, 3, 0.5 or -0.5, :mod:`.unary`).

On their own they are ``eltwise`` nodes (rule ``activation``); after a conv2d / dense / matmul or a
binary node of the same composite they become that node's post-op (``activation``, or
``post_activation`` after a residual add). :data:`ACTIVATIONS` is the one table of the Relax ops and
the runtime's names for them; ``tests/test_ops.py`` checks the names against the runtime's own list.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from ...._relax import op_name
from ....rules import Match
from ..lowering import ANCHORS
from ..precision import tensor_reason
from ..table import PatternSpec, lowers, pattern_rules

#: Relax activation ops and the runtime's names for them (the runtime also knows ``"none"``).
ACTIVATIONS = {
    "relax.nn.relu": "relu",
    "relax.clip": "clip",
    "relax.sigmoid": "sigmoid",
    "relax.tanh": "tanh",
    "relax.nn.gelu": "gelu_erf",
    "relax.nn.gelu_tanh": "gelu_tanh",
    "relax.nn.silu": "silu",
    "relax.sqrt": "sqrt",
    "relax.rsqrt": "rsqrt",
    "relax.exp": "exp",
    "relax.log": "log",
    "relax.abs": "abs",
    "relax.negative": "negative",
    "relax.square": "square",
}

#: Runtime activation names with no Relax op of their own: hardswish and hardsigmoid (oneDNN's
#: eltwise_hardswish / eltwise_hardsigmoid with alpha 1/6, beta 1/2), which TVM's frontends emit
#: as chains (add 3, clip, divide by 6) that :mod:`.hardswish` recognizes; and x**3 (``power(x, 3)``, :mod:`.unary`).
UNMAPPED_ACTIVATIONS = ("hardswish", "hardsigmoid", "cube")

#: JSON has no infinity: an infinite clip bound is written as this (float32 reads it as infinity).
INFINITE_BOUND = 1e308

#: Node ops that take an activation as a post-op.
FUSES_ACTIVATION = (*ANCHORS, "binary")
#: Node ops that take only some activations (oneDNN's batch norm fuses a relu, no other post-op).
FUSES_ONLY = {"batch_norm": ("relu",)}


def _number(expr) -> float | None:
    """The value of a constant scalar argument (clip bounds), or None."""
    value = expr
    for _ in range(3):  # IntImm / FloatImm, or a wrapper of one (a PrimValue)
        if isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
            return float(value.value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        value = getattr(value, "value", None)
    return None


def activation_of(call: relax.Call) -> tuple[str, list[float] | None] | str:
    """(runtime name, clip bounds or None) of an activation call, or the reason it cannot run."""
    op = op_name(call) or str(call.op)
    if op not in ACTIVATIONS:
        return f"{op} is not an activation the runtime fuses"
    if op == "relax.clip":
        lo, hi = _number(call.args[1]), _number(call.args[2])
        if lo is None or hi is None:
            return "clip bounds must be constant numbers"
        if math.isnan(lo) or math.isnan(hi) or lo > hi:
            return f"clip bounds [{lo}, {hi}] must be numbers with min <= max"
        if lo == 0 and hi == math.inf:
            return "relu", None  # TVM's torch frontend writes relu6 as clip(x, 0, inf), clip(x, -inf, 6)
        return "clip", [max(lo, -INFINITE_BOUND), min(hi, INFINITE_BOUND)]
    return ACTIVATIONS[op], None


def activation_reason(match: Match, name: str) -> str | None:
    """Why the (optional) activation part ``name`` of a match cannot run; None if it can."""
    if not match.has(name):
        return None
    act = activation_of(match.expr(name))
    if isinstance(act, str):
        return act
    return tensor_reason(match.expr(name), name, symbolic=True)


def activation_pattern(x: DFPattern) -> DFPattern:
    """Any activation the runtime knows, applied to ``x``."""
    alts = [
        is_op(op)(x, wildcard(), wildcard()) if op == "relax.clip" else is_op(op)(x)
        for op in ACTIVATIONS
    ]
    pattern = alts[0]
    for alt in alts[1:]:
        pattern = pattern | alt
    return pattern


def check_activation(match: Match) -> str | None:
    """An activation on its own: float32 (any shape the runtime can evaluate), known to the runtime."""
    return tensor_reason(match.expr("root"), "root", symbolic=True) or activation_reason(match, "root")


@pattern_rules
def _rules():
    x = wildcard()
    act = activation_pattern(x)
    yield PatternSpec("activation", act, {"data": x, "root": act}, check_activation, priority=10)


@lowers(*ACTIVATIONS, check=check_activation)
def lower_activation(ctx, var: relax.Var, call: relax.Call) -> int:
    """A post-op of the node this composite opened on the operand, else an ``eltwise`` node."""
    act = activation_of(call)
    if isinstance(act, str):
        raise ctx.fail(act)
    name, clip = act
    node = ctx.open_node.get(ctx.lookup(call.args[0]))
    if node is not None and (node.op in FUSES_ACTIVATION or name in FUSES_ONLY.get(node.op, ())):
        key = "post_activation" if node.attrs.get("residual") else "activation"
        if node.attrs.get(key, "none") == "none":
            node.attrs[key] = name
            if clip is not None:
                node.attrs["post_clip" if key == "post_activation" else "clip"] = clip
            return node.output
    attrs = {"algorithm": name}
    if clip is not None:
        attrs["clip"] = clip
    return ctx.emit("eltwise", [ctx.data_of(call.args[0])], var, attrs)
