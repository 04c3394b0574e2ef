"""Pass ``close_shape_arguments`` (Relax, during merging): shape arguments bound into composites
and regions where their tensor parameters define the symbols."""

from __future__ import annotations

from typing import Any

import tvm
import tvm_ffi
from tvm import relax

from .._relax import called_function, entry_functions, is_composite, is_region, updated
from ._ir import map_calls


def close_shape_arguments(mod: tvm.IRModule, regions: bool = False) -> tvm.IRModule:
    """Composites that FuseOpsByPattern gave a shape argument (``R.shape([s77, s27, 4, 16])`` of a
    reshape) take it inside where their tensor parameters define its symbols.

    FuseOpsByPattern lifts every non-constant argument to a parameter, a reshape's target shape
    too. A composite with a shape parameter makes a region that the VM calls with the shape as an
    argument (region format ``shape_args``), and inlining such a composite back into ``main``
    (the cost gate) can leave its parameter in types (``R.Tensor(param_0)``). Where each symbol
    of the shape is a bare dim of a tensor parameter (``[B, S, 64] -> [B, S, 4, 16]``), the shape
    is bound into the composite instead (``Function.bind_params``; a copy per distinct shape); a
    shape whose symbols only products give (``[B * S, 64] -> [B, S, 64]``) stays an argument.

    ``regions=True`` does the same for the regions MergeCompositeFunctions made: such a shape
    becomes a region parameter, and where the region's tensor parameters define its symbols (the
    input ``[B, S, 64]`` of a region whose inner composites reshape ``[B * S, 64] -> [B, S, 64]``)
    it is bound inside the region, so the VM does not build and pass it at every call (the
    torch.export'ed BERT-like model passed 16 shapes per call). A region keeps its name (its
    external symbol); one called with two different shapes is left as it is.
    """
    entries = entry_functions(mod)
    plans, open_calls = _plan(mod, entries, is_region if regions else is_composite)
    if not any(plans.values()):
        return mod
    # distinct bound functions per composite, in call order
    variants: dict[str, list[relax.Function]] = {}
    for plan in plans.values():
        for func, _args, old in plan.values():
            known = variants.setdefault(old.name_hint, [])
            if not any(tvm_ffi.structural_equal(func, f) for f in known):
                known.append(func)
    # a composite every call of which binds one shape keeps its name (a new GlobalVar: the old
    # one carries the old signature as its type); others get numbered copies
    keep = {name for name, funcs in variants.items() if len(funcs) == 1 and name not in open_calls}
    if regions:
        variants = {name: funcs for name, funcs in variants.items() if name in keep}
        plans = {entry: {v: p for v, p in plan.items() if p[2].name_hint in keep} for entry, plan in plans.items()}
        if not keep:
            return mod
    builder = relax.BlockBuilder(updated(mod, remove=[mod.get_global_var(n) for n in keep]))
    gvs = _add_variants(builder, variants, keep, {gv.name_hint for gv in mod.get_global_vars()})
    for name in entries:
        func = map_calls(mod[name], _rewriter(plans[name], variants, gvs))
        if not func.same_as(mod[name]):
            builder.update_func(builder.get().get_global_var(name), func)
    # a composite no call takes any more (every call got a bound copy of another name)
    return relax.transform.DeadCodeElimination(entries)(builder.get())


_Plan = dict[Any, tuple[relax.Function, list[relax.Expr], tvm.ir.GlobalVar]]


def _plan(mod: tvm.IRModule, entries: list[str], which) -> tuple[dict[str, _Plan], set[str]]:
    """Per entry function, each binding whose call of a ``which`` function binds its shapes ->
    (bound function, arguments left, callee); and the callees some call keeps a shape argument of."""
    plans: dict[str, _Plan] = {}
    open_calls: set[str] = set()
    for name in entries:
        plan = plans.setdefault(name, {})

        def visit(var, call, plan=plan):
            func = called_function(mod, call)
            if func is None or not which(func) or not any(isinstance(a, relax.ShapeExpr) for a in call.args):
                return None
            bound = bind_shape_arguments(func, call)
            if bound is None:
                open_calls.add(call.op.name_hint)
                return None
            plan[var] = (bound[0], bound[1], call.op)
            return None

        map_calls(mod[name], visit)
    return plans, open_calls


def _add_variants(builder: relax.BlockBuilder, variants: dict[str, list[relax.Function]], keep: set[str],
                  taken: set[str]) -> dict[str, list[tvm.ir.GlobalVar]]:
    """Add each bound function: under its callee's name where kept, else numbered copies."""
    gvs: dict[str, list[tvm.ir.GlobalVar]] = {}
    for name, funcs in variants.items():
        for func in funcs:
            new_name, k = name, 0
            while name not in keep and new_name in taken:
                k += 1
                new_name = f"{name}_{k}"
            taken.add(new_name)
            gvs.setdefault(name, []).append(builder.add_func(func, new_name))
    return gvs


def _rewriter(plan: _Plan, variants: dict[str, list[relax.Function]], gvs: dict[str, list[tvm.ir.GlobalVar]]):
    """The :func:`map_calls` change calling each planned binding's bound function."""

    def rewrite(var, call):
        if var not in plan:
            return None
        func, args, old = plan[var]
        index = next(i for i, f in enumerate(variants[old.name_hint]) if tvm_ffi.structural_equal(func, f))
        return relax.Call(gvs[old.name_hint][index], args)

    return rewrite


def bind_shape_arguments(func: relax.Function, call: relax.Call
                          ) -> tuple[relax.Function, list[relax.Expr]] | None:
    """``func`` with the shape arguments of ``call`` bound inside, and the arguments left; None
    when a symbol of a shape argument is no bare dim of a tensor argument."""
    # the composite has symbolic variables of its own: rename them to the caller's, read off
    # the tensor parameters' dims, so that the caller's shape is valid inside
    rename: dict[tvm.tirx.Var, tvm.tirx.Var] = {}
    defined: list[tvm.tirx.Var] = []
    shape_positions = []
    for i, (param, arg) in enumerate(zip(func.params, call.args)):
        if isinstance(arg, relax.ShapeExpr) and isinstance(param.ty, relax.ShapeType):
            shape_positions.append(i)
            continue
        ours, theirs = getattr(param.ty, "shape", None), getattr(arg.ty, "shape", None)
        if not isinstance(ours, relax.ShapeExpr) or not isinstance(theirs, relax.ShapeExpr):
            continue
        for mine, caller in zip(ours.values, theirs.values):
            if isinstance(mine, tvm.tirx.Var):
                if not isinstance(caller, tvm.tirx.Var):
                    return None  # the composite is more general than this call: leave it
                if mine in rename and not rename[mine].same_as(caller):
                    return None
                rename[mine] = caller
                defined.append(caller)
    if not shape_positions:
        return None
    for i in shape_positions:
        for dim in call.args[i].values:
            if tvm.tirx.analysis.undefined_vars(dim, defined):
                return None
    renamed = {m: c for m, c in rename.items() if not m.same_as(c)}
    bound = func.bind_symbolic_vars(renamed) if renamed else func
    bound = bound.bind_params({bound.params[i]: call.args[i] for i in shape_positions})
    # ... and back to variables of its own, as every composite has: splice_calls (the cost
    # gate's inlining) maps a composite's variables to the caller's dims, which it cannot do
    # for variables that already are the caller's
    own = {v: tvm.tirx.Var(str(v.name), v.ty) for v in relax.analysis.defined_symbolic_vars(bound)}
    bound = bound.bind_symbolic_vars(own) if own else bound
    return bound, [a for i, a in enumerate(call.args) if i not in shape_positions]
