"""Helpers the Relax passes share: rewrite the bound calls of a function, keeping its variables."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


def map_calls(func: relax.Function, change) -> relax.Function:
    """``func`` with the value of each binding ``v = call`` replaced by ``change(v, call)`` where
    that is not None (an expression the binding's variable can hold); the bindings keep their
    variables, so nothing else in the function changes. ``func`` itself when nothing did."""
    if not isinstance(func.body, relax.SeqExpr):
        return func
    blocks, changed = [], False
    for block in func.body.blocks:
        bindings = []
        for b in block.bindings:
            if isinstance(b, relax.VarBinding) and isinstance(b.value, relax.Call):
                new = change(b.var, b.value)
                if new is not None:
                    b = relax.VarBinding(b.var, new)
                    changed = True
            bindings.append(b)
        blocks.append((relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock)(bindings))
    if not changed:
        return func
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                          func.attrs)


def map_call_args(func: relax.Function, change) -> relax.Function:
    """``func`` with each argument ``a`` of each bound call (and each field of a tuple argument)
    replaced by ``change(a)`` where that is not None; the calls keep their types (:func:`map_calls`)."""
    def arg(a):
        new = change(a)
        if new is not None:
            return new
        if isinstance(a, relax.Tuple):
            fields = [arg(f) for f in a.fields]
            if any(not n.same_as(f) for n, f in zip(fields, a.fields)):
                return relax.Tuple(fields)
        return a

    def call(_var, value):
        args = [arg(a) for a in value.args]
        if all(n.same_as(a) for n, a in zip(args, value.args)):
            return None
        return relax.Call(value.op, args, value.attrs, value.ty_args, ret_ty=value.ty)

    return map_calls(func, call)


def map_entry_calls(mod: tvm.IRModule, change) -> tvm.IRModule:
    """:func:`map_calls` over each entry function of ``mod``, ``change(var, call, lookup)`` given
    ``lookup`` (variable -> its bound value in that function); dead code removed after (the values
    the changed calls no longer read). ``mod`` itself when nothing changed."""
    from .._relax import bound_values, entry_functions

    out = None
    for name in entry_functions(mod):
        func = mod[name]
        values = bound_values(func)
        new = map_calls(func, lambda var, call, get=values.get: change(var, call, get))
        if not new.same_as(func):
            out = out if out is not None else tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
            out[name] = new
    if out is None:
        return mod
    return relax.transform.DeadCodeElimination(entry_functions(out))(out)


def indices_in_range(values: np.ndarray, take: relax.Call) -> bool:
    """Whether constant indices ``values`` all lie in ``[0, n)`` of the static axis ``take`` reads."""
    table = take.args[0]
    shape = getattr(table.ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr):
        return False
    axis = 0 if take.attrs.axis is None else int(take.attrs.axis)
    length = shape.values[axis % len(shape.values)]
    if not isinstance(length, tvm.tirx.IntImm):
        return False
    return not values.size or bool(values.min() >= 0 and values.max() < int(length))


def readers_of(func: relax.Function) -> dict[relax.Var, int]:
    """How many times each variable is read by a binding or the function's result."""
    counts: dict[relax.Var, int] = {}

    def visit(expr):
        if isinstance(expr, relax.Var):
            counts[expr] = counts.get(expr, 0) + 1

    for block in getattr(func.body, "blocks", []):
        for binding in block.bindings:
            relax.analysis.post_order_visit(binding.value, visit)
    relax.analysis.post_order_visit(func.body.body, visit)
    return counts
