"""Pass ``drop_constant_selects`` (Relax, before the stages): a ``where`` whose condition is a
constant that is all true (or all false) is the operand it always picks.

Why: Hugging Face attention masks its scores with ``where(~mask, finfo.min, scores)`` even when the
caller gives no mask: the mask is then ``ones`` of the input's shape, folded to a constant by
:mod:`.fold_weight_subgraphs`, and the condition is all false. The ``where`` still ran on every call
(DeBERTa-v2/v3: once per layer over ``[1, heads, seq, seq]``, an extra pass over the scores between
their sum and the softmax).

What: ``where(cond, a, b)`` with a constant boolean ``cond`` whose elements are all equal becomes
``a`` (all true) or ``b`` (all false) when that operand already has the result's static shape and
dtype (a broadcast operand stays: the ``where`` is then also its broadcast). Anything else stays.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .._relax import constant_value, op_name, static_shape
from ._ir import map_entry_calls
from .fold_int_constants import stored


def _picked(call: relax.Call, lookup) -> relax.Expr | None:
    if op_name(call) != "relax.where":
        return None
    cond = call.args[0]
    value = constant_value(cond)
    if value is None and isinstance(cond, relax.Var):
        bound = lookup(cond)
        value = constant_value(bound) if bound is not None else None
    if value is None:
        return None
    part = stored(np.asarray(value))
    if part.dtype != np.bool_ or part.size == 0 or not (part.all() or not part.any()):
        return None
    chosen = call.args[1] if bool(part.flat[0]) else call.args[2]
    want, got = static_shape(call), static_shape(chosen)
    if want is None or got is None or [int(d) for d in want] != [int(d) for d in got]:
        return None
    if str(getattr(chosen.ty, "dtype", "")) != str(getattr(call.ty, "dtype", "")):
        return None
    return chosen


def drop_constant_selects(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each ``where`` of an all-true or all-false constant condition replaced by the
    operand it picks (see the module doc); ``mod`` itself when none."""
    out = map_entry_calls(mod, lambda _var, call, lookup: _picked(call, lookup))
    return out if out is mod else relax.transform.CanonicalizeBindings()(out)
