"""fold_negative_indices: ``take(t, where(i < 0, i + n, i))`` of constant ``i`` reads the folded indices.

What it rewrites. TVM's ONNX importer writes every ``Gather`` as ``take(table, where(less(i, 0),
add(i, n), i))``: ONNX allows indices in ``[-n, n)``, counted from the end when negative. :mod:`.checked_take`
puts its run-time check on ``i`` itself (so an error names the index the model wrote), which leaves
``take(table, where(less(c, 0), add(c, n), c))`` with ``c = check(i)``. When ``i`` is a constant once the
weights are bound and :mod:`.fold_int_constants` ran (the default exporter writes Swin's pooling and
window gathers as ``Gather`` of an index initializer), and ``n`` is a constant, this pass computes
the normalised indices ``where(i < 0, i + n, i)`` with numpy; when every one of them lies in ``[0, len)``
of the table's static axis, the ``take`` reads that constant and the check, ``less``, ``add`` and
``where`` go. Indices it cannot prove in range keep their check (which then raises at run time).

Why. :mod:`.drop_proven_index_checks` proves checks whose ``take`` reads the check directly; the
normalisation in between hid the constant from it, and the four integer ops stayed on llvm, cutting
the region in two (Swin-T through the default exporter: 2 regions, the classifier's ``take`` alone in
the second).
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ._ir import indices_in_range, map_entry_calls
from .._relax import constant_value as _constant
from .checked_take import CHECK_PRIMFUNC

__all__ = ["fold_negative_indices"]


def _op(expr, name: str) -> bool:
    return isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == f"relax.{name}"


def _through_check(expr, lookup) -> np.ndarray | None:
    """The constant value of ``expr``: a constant, a variable bound to one, or an index check
    (``call_tir`` of :data:`CHECK_PRIMFUNC`) of one; else None."""
    value = lookup(expr) if isinstance(expr, relax.Var) else expr
    if value is None:
        return None
    if (_op(value, "call_tir") and isinstance(value.args[0], relax.GlobalVar)
            and value.args[0].name_hint.startswith(CHECK_PRIMFUNC)):
        ids = value.args[1].fields[0]
        value = lookup(ids) if isinstance(ids, relax.Var) else ids
        if value is None:
            return None
    return _constant(value)


def _normalised(ids, lookup) -> np.ndarray | None:
    """``where(i < 0, i + n, i)`` evaluated when ``ids`` is that form (the importer's) over a constant
    ``i`` and ``n``, else None."""
    where = lookup(ids) if isinstance(ids, relax.Var) else ids
    if not _op(where, "where"):
        return None
    def value(a):
        bound = lookup(a) if isinstance(a, relax.Var) else None
        return a if bound is None else bound

    cond, adjusted, raw_var = value(where.args[0]), value(where.args[1]), where.args[2]
    if not (_op(cond, "less") and _op(adjusted, "add")):
        return None
    if not (cond.args[0].same_as(raw_var) and adjusted.args[0].same_as(raw_var)):
        return None
    zero, n = _constant(cond.args[1]), _constant(adjusted.args[1])
    values = _through_check(raw_var, lookup)
    if zero is None or n is None or values is None or zero.size != 1 or zero.item() != 0 or n.size != 1:
        return None
    return np.where(values < 0, values + n.item(), values).astype(values.dtype)


def _folded_take(call: relax.Call, lookup) -> relax.Expr | None:
    """``take(table, <constant indices>)`` when ``call`` takes normalised constant indices that lie in
    range of its static axis, else None."""
    if not _op(call, "take"):
        return None
    values = _normalised(call.args[1], lookup)
    if values is None or not indices_in_range(values, call):
        return None
    return relax.op.take(call.args[0], relax.const(values, str(values.dtype)), call.attrs.axis, mode="fast")


def fold_negative_indices(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each ``take`` of normalised constant in-range indices reading them as a constant
    (``mod`` itself when there is none); the checks and arithmetic nobody reads then go."""
    return map_entry_calls(mod, lambda _var, call, lookup: _folded_take(call, lookup))
