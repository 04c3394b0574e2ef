"""checked_take: every ``take`` in "fast" mode reads indices that a run-time check has passed.

What it rewrites. ``take(table, ids, axis)`` with Relax's default mode "fast" becomes
``take(table, check(ids), axis)``, where ``check`` is a ``call_tir`` of a TIR extern calling the
packed function ``byoc_hetero.runtime.check_indices`` (cpp/index_check.cc): it raises
:class:`InputError` naming the index, its position and the axis length when an index is out of
range, and otherwise returns a copy of the indices. (A ``call_pure_packed`` inside the dataflow block
would do the same, but TVM's MergeCompositeFunctions cannot group an ``ExternFunc``; a ``call_tir``
is an ordinary op to every pass.) For the form TVM's ONNX importer writes for ``Gather`` --
``take(table, where(less(ids, 0), add(ids, n), ids))``, negative indices counted from the end --
the check reads ``ids`` as the model wrote them (so an index of -11 into 10 rows is reported as -11,
not as the -1 the adjustment makes of it) and allows ``[-n, n)``; any other ``take`` allows ``[0, n)``.
Constant indices that lie in range are left alone (nothing to check at run time, and the constant
folding of index bookkeeping still sees constants).

Why. "fast" mode does not check bounds: a Gather left on TVM's llvm (alone, or below the cost gate)
with an index of 100 into a 10-row table returned garbage rows, and 2**40 died with SIGSEGV
(issue 27). Regions check their own indices (cpp/kernels/take.cc); this pass covers every path.
``bh.from_onnx`` and ``bh.from_torch`` run it, so a module the project imports is checked whether
it is partitioned or built for llvm alone.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, te

from .._relax import constant_value

CHECK_FUNC = "byoc_hetero.runtime.check_indices"
#: Name hint of the TIR functions that call it.
CHECK_PRIMFUNC = "byoc_hetero_check_indices"

__all__ = ["CHECK_FUNC", "CHECK_PRIMFUNC", "checked_take"]


def _op(expr, name: str) -> bool:
    return isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == f"relax.{name}"


def _static_in_range(ids: relax.Expr, table: relax.Expr, axis: int, negative: bool) -> bool:
    """Whether ``ids`` is a constant whose every index lies in range of a static axis length."""
    values = constant_value(ids)
    if values is None:
        return False
    shape = getattr(table.ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr) or not isinstance(shape.values[axis], tvm.tirx.IntImm):
        return False
    n = int(shape.values[axis])
    return bool(values.size == 0 or (values.min() >= (-n if negative else 0) and values.max() < n))


@relax.expr_functor.mutator
class _CheckTakes(relax.PyExprMutator):
    """Puts the check in front of each fast-mode take it visits (module docstring); ``changed`` says
    whether it did."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.changed = False

    def _onnx_negative_form(self, ids: relax.Expr):
        """``(raw, n, zero)`` when ``ids`` is ``where(less(raw, zero), add(raw, n), raw)`` with a constant
        zero (TVM's ONNX importer's negative-index adjustment), else None."""
        value = self.lookup_binding(ids) if isinstance(ids, relax.Var) else None
        if not _op(value, "where"):
            return None
        cond, adjusted, raw = value.args
        cond = self.lookup_binding(cond) if isinstance(cond, relax.Var) else cond
        adjusted = self.lookup_binding(adjusted) if isinstance(adjusted, relax.Var) else adjusted
        if not (_op(cond, "less") and _op(adjusted, "add")):
            return None
        if not (cond.args[0].same_as(raw) and adjusted.args[0].same_as(raw)):
            return None
        zero = cond.args[1]
        value = constant_value(zero)
        if value is None or value.size != 1 or value.item() != 0:
            return None
        return raw, adjusted.args[1], zero

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D102
        call = super().visit_call_(call)
        if not _op(call, "take") or str(call.attrs.mode) != "fast":
            return call
        table, ids = call.args
        axis = 0 if call.attrs.axis is None else int(call.attrs.axis)
        rank = len(table.ty.shape.values) if isinstance(getattr(table.ty, "shape", None), relax.ShapeExpr) else None
        if rank is not None and axis < 0:
            axis += rank
        onnx_form = self._onnx_negative_form(ids)
        raw = onnx_form[0] if onnx_form else ids
        if _static_in_range(raw, table, axis, onnx_form is not None):
            return call
        where = f"take along axis {axis} of a table of shape {_shape_text(table)}"
        negative = 1 if onnx_form else 0

        def check(ids_t, table_t):
            return te.extern(ids_t.shape, [ids_t, table_t], lambda ins, outs: tvm.tirx.call_packed(
                CHECK_FUNC, ins[0], outs[0], ins[1], axis, where, negative), dtype=str(ids_t.dtype),
                name="checked_indices")

        checked = self.builder_.emit_te(check, raw, table, primfunc_name_hint=CHECK_PRIMFUNC)
        if onnx_form:
            _, n, zero = onnx_form
            ids = self.builder_.emit(relax.op.where(
                self.builder_.emit(relax.op.less(checked, zero)),
                self.builder_.emit(relax.op.add(checked, n)), checked))
        else:
            ids = checked
        self.changed = True
        return relax.op.take(table, ids, call.attrs.axis, mode="fast")


def _shape_text(expr: relax.Expr) -> str:
    shape = getattr(expr.ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr):
        return "?"
    return "(" + ", ".join(str(int(d)) if isinstance(d, tvm.tirx.IntImm) else str(d) for d in shape.values) + ")"


def checked_take(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every "fast" ``take`` of its Relax functions reading checked indices (see the
    module docstring); ``mod`` itself when there is none. A function that already calls a check
    (the pass ran on it before) is left as it is."""
    mutator = _CheckTakes(mod)
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or _already_checked(func):
            continue
        if func.attrs is not None and ("Composite" in func.attrs or "Codegen" in func.attrs):
            continue
        new = mutator.visit_expr(func)
        if mutator.changed:
            mutator.builder_.update_func(gv, new)
    if not mutator.changed:
        return mod
    out = mutator.builder_.get()
    names = [gv.name_hint for gv, f in out.functions_items() if isinstance(f, relax.Function)
             and f.attrs is not None and "global_symbol" in f.attrs]
    return relax.transform.DeadCodeElimination(names)(out) if names else out


def _already_checked(func: relax.Function) -> bool:
    """Whether ``func`` calls a check this pass wrote (the pass ran before)."""
    found = []

    def visit(expr):
        if _op(expr, "call_tir") and expr.args[0].name_hint.startswith(CHECK_PRIMFUNC):
            found.append(expr)

    relax.analysis.post_order_visit(func, visit)
    return bool(found)

