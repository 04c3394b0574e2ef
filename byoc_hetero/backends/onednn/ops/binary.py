"""add / multiply / subtract / divide / maximum / minimum with numpy broadcasting on either side,
[activation]: ``binary`` nodes (how the runtime handles a broadcast first operand: cpp/kernels/binary.cc).

Rules ``<op>[_act]`` come after every conv2d / dense epilogue had its pick of
the adds (lower priority). An add inside a conv2d / dense composite becomes the anchor's bias or
residual instead (:func:`..epilogue.fuse_add`).
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ....rules import Match
from ..epilogue import fuse_add
from ..precision import tensor_reason
from ..table import PatternSpec, lowers, pattern_rules
from .activation import activation_pattern, activation_reason

#: Relax op → the runtime's binary algorithm.
ALGORITHMS = {
    "relax.add": "add",
    "relax.multiply": "mul",
    "relax.subtract": "sub",
    "relax.divide": "div",
    "relax.maximum": "max",
    "relax.minimum": "min",
}


def check_binary(match: Match) -> str | None:
    """A float32 binary op with static shapes that broadcast (either side)."""
    call = match.expr("binary")
    for i, arg in enumerate(call.args[:2]):
        reason = tensor_reason(arg, f"operand {i}")
        if reason:
            return reason
    reason = tensor_reason(call, "result")
    if reason:
        return reason
    return activation_reason(match, "act")


@pattern_rules
def _rules():
    for op in ALGORITHMS:
        name = op.removeprefix("relax.")
        for act in (True, False):
            call = is_op(op)(wildcard(), wildcard())
            names = {"binary": call}
            pattern = call
            if act:
                pattern = activation_pattern(call)
                names["act"] = pattern
            names["root"] = pattern
            yield PatternSpec(name + ("_act" if act else ""), pattern, names, check_binary,
                              priority=21 if act else 20)


@lowers(*ALGORITHMS, check=check_binary)
def lower_binary(ctx, var: relax.Var, call: relax.Call) -> int:
    if call.op.name == "relax.add":
        fused = fuse_add(ctx, call)
        if fused is not None:
            return fused
    inputs = [ctx.data_of(call.args[0]), ctx.data_of(call.args[1])]
    return ctx.emit("binary", inputs, var, {"algorithm": ALGORITHMS[call.op.name], "activation": "none"})
