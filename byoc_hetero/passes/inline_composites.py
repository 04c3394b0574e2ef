"""Pass ``inline_composites`` (Relax, during merging): composites the cost gate refused become
plain ops again, for TVM to compile."""

from __future__ import annotations

from collections.abc import Mapping

import tvm
from tvm import relax

from .._relax import TARGET_ATTR, entry_functions, op_calls, updated


def inline_composites(mod: tvm.IRModule, gated: set[tvm.ir.GlobalVar]) -> tvm.IRModule:
    """Turn calls of the ``gated`` composite functions back into plain ops (for TVM to compile)."""
    plain = {gv: mod[gv].without_attr("Composite").without_attr("Primitive").without_attr(TARGET_ATTR)
             for gv in gated}
    inlined = {}
    for name in entry_functions(mod):
        func = splice_calls(mod[name], plain)
        inlined[mod.get_global_var(name)] = func.inline_functions(plain)
    return updated(mod, inlined, remove=gated)


def splice_calls(func: relax.Function, plain: Mapping[tvm.ir.GlobalVar, relax.Function]) -> relax.Function:
    """``func`` with each call of a ``plain`` function whose body has dim expressions of its own
    (a target shape bound in by :func:`close_shape_arguments`) replaced by that body.

    ``Function.inline_functions`` copies a body with fresh symbolic variables and does not map
    them to the caller's dims, which only the types re-derived from the arguments hid: a
    ``reshape(x, R.shape([n * m, 16]))`` kept variables nothing in ``func`` defines, and
    ``relax.build`` failed ("has not been computed"). Here each call site gets a copy of the body
    with its symbols replaced by the caller's dims and its parameters by the arguments, spliced
    in before the call's binding. Only in dataflow blocks (a composite's body is one); other
    calls are left to ``inline_functions``.
    """
    if not isinstance(func.body, relax.SeqExpr):
        return func
    blocks, changed = [], False
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        bindings = []
        for b in block.bindings:
            call = b.value if isinstance(b, relax.VarBinding) else None
            callee = (plain.get(call.op) if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.GlobalVar)
                      else None)
            body = _spliced_body(callee, call) if callee is not None else None
            if body is None:
                bindings.append(b)
                continue
            for inner in body.blocks:
                bindings.extend(inner.bindings)
            bindings.append(relax.VarBinding(b.var, body.body))
            changed = True
        blocks.append(relax.DataflowBlock(bindings))
    if not changed:
        return func
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                          func.attrs)


def _spliced_body(callee: relax.Function, call: relax.Call) -> relax.SeqExpr | None:
    """The body of ``callee`` for ``call`` (fresh variables, the caller's symbols, the arguments),
    or None when no op in it takes a symbolic shape (inline_functions then does)."""
    if not any(isinstance(a, relax.ShapeExpr) and any(not isinstance(d, tvm.tirx.IntImm) for d in a.values)
               for c in op_calls(callee) for a in c.args):
        return None
    copy = relax.utils.copy_with_new_vars(callee)
    symbols = _caller_symbols(copy, call)
    if len(symbols) != len(relax.analysis.defined_symbolic_vars(copy)):
        return None
    copy = copy.bind_symbolic_vars(symbols)
    body = copy.bind_params(dict(zip(copy.params, call.args))).body
    if not isinstance(body, relax.SeqExpr) or not all(isinstance(k, relax.DataflowBlock) for k in body.blocks):
        return None
    return body


def _caller_symbols(func: relax.Function, call: relax.Call) -> dict[tvm.tirx.Var, tvm.ir.PrimExpr]:
    """The caller's dim for each symbolic variable of ``func`` that a parameter's shape has as a
    bare dim (``x: [n, m, 16]`` called with ``[s77, s27, 16]``: ``n -> s77``, ``m -> s27``)."""
    symbols: dict[tvm.tirx.Var, tvm.ir.PrimExpr] = {}
    for param, arg in zip(func.params, call.args):
        ours = getattr(param.ty, "shape", None) if isinstance(param.ty, relax.TensorType) else None
        theirs = getattr(arg.ty, "shape", None) if isinstance(arg.ty, relax.TensorType) else None
        if isinstance(param.ty, relax.ShapeType):
            ours = param.ty.values
            theirs = arg.values if isinstance(arg, relax.ShapeExpr) else getattr(arg.ty, "values", None)
        else:
            ours = ours.values if isinstance(ours, relax.ShapeExpr) else None
            theirs = theirs.values if isinstance(theirs, relax.ShapeExpr) else None
        if ours is None or theirs is None:
            continue
        for mine, caller in zip(ours, theirs):
            if isinstance(mine, tvm.tirx.Var) and not mine.same_as(caller):
                symbols.setdefault(mine, caller)
    return symbols
