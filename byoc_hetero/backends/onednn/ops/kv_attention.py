"""The generation step's attention over a KV cache (bh.llm) as one ``kv_attention`` region node.

``bh.llm`` writes each layer's attention as ``R.call_tir_inplace(byoc_hetero_kv_attention, (q, k, v,
k_cache, v_cache, past, lengths, inv_freq, kv_params), inplace_indices=[0, 3, 4])``: a TIR function
that hands its buffers to the runtime's packed ``byoc_hetero.runtime.kv_attention`` (what the
llvm-only build runs). In a region the same call is one ``kv_attention`` node (the kernel of
``cpp/kernels/kv_attention.cc``), so that a decode step is one region call: its inputs ``k_cache``
and ``v_cache`` are region inputs the node writes in place (docs/region-format.md, "written inputs").

The check accepts the call only when the callee is that TIR function and ``kv_params`` (scale,
window, rope scale) is a constant the node takes as attrs.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, is_tuple, wildcard

from ....rules import Match
from ..table import PatternSpec, lowers, pattern_rules

KERNEL_FUNC = "byoc_hetero_kv_attention"
"""The name hint of the TIR function bh.llm calls (byoc_hetero/llm/model.py)."""

ARGS = 9


def _operands(call: relax.Call) -> list[relax.Expr] | None:
    args = call.args[1] if len(call.args) > 1 else None
    return list(args.fields) if isinstance(args, relax.Tuple) else None


def _params(ctx, expr: relax.Expr) -> np.ndarray | None:
    """kv_params' three values: a constant in the call, or a region constant it was bound to."""
    if isinstance(expr, tvm.ir.Constant):
        return (expr.value if isinstance(expr, tvm.ir.GenericConst) else expr.data).numpy()
    if ctx is not None:
        return ctx.graph.small_constants.get(ctx.lookup(expr))
    return None


def check_kv_attention(match: Match) -> str | None:
    """The call is bh.llm's kv_attention with a constant kv_params."""
    call = match.expr("root")
    callee = call.args[0]
    if not isinstance(callee, tvm.ir.GlobalVar) or callee.name_hint != KERNEL_FUNC:
        return "a call_tir_inplace of a TIR function other than bh.llm's kv_attention"
    operands = _operands(call)
    if operands is None or len(operands) != ARGS:
        return f"kv_attention takes {ARGS} arguments"
    if not isinstance(operands[-1], tvm.ir.Constant):
        return "kv_attention's kv_params (scale, window, rope scale) is not a constant"
    return None


@pattern_rules
def _rules():
    args = [wildcard() for _ in range(ARGS)]
    call = is_op("relax.call_tir_inplace")(wildcard(), is_tuple(args))
    yield PatternSpec("kv_attention", call, {"root": call}, check_kv_attention, priority=10)


@lowers("relax.call_tir_inplace", check=check_kv_attention)
def lower_kv_attention(ctx, var: relax.Var, call: relax.Call):
    operands = _operands(call)
    params = _params(ctx, operands[-1])
    inputs = [ctx.data_of(a) for a in operands[:-1]]
    q_shape = ctx.graph.tensors[inputs[0]]["shape"]
    out = ctx.emit("kv_attention", inputs, None,
                   {"scale": float(params[0]), "window": int(params[1]), "rope_scale": float(params[2])},
                   shape=q_shape)
    return out, inputs[3], inputs[4]
