"""drop_empty_operands: a ``concat`` operand that holds no elements is dropped (the concat of a
single remaining operand is that operand).

What it rewrites. ``concat((a, e), axis)`` where ``e`` has a static dim of 0 (necessarily on
``axis``, or the whole output would be empty) is ``concat((a,), axis)``, which is ``a``: the empty
operand contributes nothing. The value that computed ``e`` (a ``strided_slice`` selecting nothing)
is then read by nobody and goes with the dead code. A concat whose output is empty, or whose
operands are all empty, is left alone (the rules keep every empty tensor on llvm, which computes
it: :func:`byoc_hetero.backends.onednn.table.empty_tensor_reason`).

Why. Transformers' partial rotary embedding (Phi-3, and every ``apply_rotary_pos_emb`` with a
pass-through part) writes ``cat([rotated, q[..., rotary_dim:]], -1)``; at a rotary factor of 1 the
pass-through slice is ``[B, H, S, 0]``. It reached the region format, which takes dims >= 1 only,
and the build failed (``field 'tensors[33].shape': dim 3 must be >= 1, got [1,8,128,0]``).
Both import paths write it (torch.export's ``slice`` + ``cat``, the ONNX ``Slice`` + ``Concat``), so
the pass runs in ``bh.partition``, on whatever the importer made.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .._relax import op_name, shape_of
from ._ir import map_entry_calls

__all__ = ["drop_empty_operands", "is_empty"]


def is_empty(value: relax.Expr) -> bool:
    """Whether ``value`` is a tensor with a static dim of 0 (no elements, whatever the others)."""
    shape = shape_of(value)
    return shape is not None and any(d == 0 for d in shape if isinstance(d, int))


def _without_empty(_var: relax.Var, call: relax.Call, _lookup) -> relax.Expr | None:
    """The concat of ``call``'s non-empty operands (or that operand alone); None when ``call`` is
    not a concat with an empty operand or its result is empty."""
    if op_name(call) != "relax.concat" or not isinstance(call.args[0], relax.Tuple) or is_empty(call):
        return None
    fields = list(call.args[0].fields)
    kept = [f for f in fields if not is_empty(f)]
    if len(kept) == len(fields) or not kept:
        return None
    if len(kept) == 1:
        return kept[0]
    return relax.Call(call.op, [relax.Tuple(kept)], call.attrs, call.ty_args, ret_ty=call.ty)


def drop_empty_operands(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the empty operands of each concat of its entry functions dropped (see the module
    docstring); ``mod`` itself when there is none."""
    return map_entry_calls(mod, _without_empty)
