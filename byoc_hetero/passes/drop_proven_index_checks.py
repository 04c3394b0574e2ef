"""drop_proven_index_checks: index checks whose indices became constants in range are removed.

What it rewrites. :mod:`.checked_take` runs right after import, when the indices of a ``take`` are
often still computed (Swin's shifted windows and relative positions: ``arange``, ``add``, ``mod``
of constants). Once the weights are bound and :mod:`.fold_int_constants` has folded that
bookkeeping, such indices are constants; a check of constant indices that lie in ``[0, n)`` of a
static axis can never fail, so the ``take`` reads the indices themselves and the check goes. Negative
constants (allowed by the ONNX ``Gather`` form, ``[-n, n)``) keep their check: this pass only
removes what it proves.

Why. The check is a TIR function, which no rule matches: left in place it stays on llvm and cuts
the region it sits in (Swin-T from PyTorch: 5 regions and 12 ops on llvm instead of one region).
"""

from __future__ import annotations

import tvm
from tvm import relax

from ._ir import indices_in_range, map_entry_calls
from .._relax import constant_value as _constant
from .checked_take import CHECK_PRIMFUNC

__all__ = ["drop_proven_index_checks"]


def _proven_indices(take: relax.Call, lookup) -> relax.Expr | None:
    """The constant indices of ``take`` when they come through a check and lie in ``[0, n)`` of
    its static axis, else None."""
    if not (isinstance(take, relax.Call) and getattr(take.op, "name", None) == "relax.take"):
        return None
    checked = take.args[1]
    check = lookup(checked) if isinstance(checked, relax.Var) else None
    if not (isinstance(check, relax.Call) and getattr(check.op, "name", None) == "relax.call_tir"
            and check.args[0].name_hint.startswith(CHECK_PRIMFUNC)):
        return None
    ids = check.args[1].fields[0]
    bound = lookup(ids) if isinstance(ids, relax.Var) else None
    ids = ids if bound is None else bound
    values = _constant(ids)
    if values is None or not indices_in_range(values, take):
        return None
    return ids


def drop_proven_index_checks(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each index check of constant, in-range indices replaced by those indices
    (``mod`` itself when there is none)."""
    def change(_var, call, lookup):
        ids = _proven_indices(call, lookup)
        return None if ids is None else relax.op.take(call.args[0], ids, call.attrs.axis, mode="fast")

    return map_entry_calls(mod, change)  # the checks nobody reads go with the dead code
