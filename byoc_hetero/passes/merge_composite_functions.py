"""Pass ``merge_composite_functions`` (Relax, merging): TVM's MergeCompositeFunctions per entry
function, with symbolic variables passed bare to an op given a group."""

from __future__ import annotations

import tvm
from tvm import relax

from .._relax import entry_functions, is_region, updated
from ._ir import map_call_args


def _merge_main(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's MergeCompositeFunctions on ``mod["main"]``, around a defect of TVM 0.27's pass.

    The pass gives every argument of every call a group; it pre-assigns groups to constants, shapes
    and PrimExprs *except variables*, so a symbolic TIR variable passed bare to an op fails with
    "Could not find memo-ized group for expression of type ir.Var" (torch.export's BERT:
    ``R.arange(0, s27, 1)``, ``R.strided_slice(..., (s27,), ...)``; in this TVM, Relax and TIR
    share one Var class). Such an argument is given to the pass as ``s27 + 0`` (an expression,
    so it gets its group; the call's type is kept) and put back afterwards: the result is
    what the pass would give if it grouped it.
    """
    wrapped: list[tuple[tvm.ir.PrimExpr, tvm.tirx.Var]] = []

    def wrap(a):
        if isinstance(a, tvm.tirx.Var) and isinstance(a.ty, tvm.ir.PrimType):
            e = tvm.tirx.Add(a, tvm.tirx.IntImm(str(a.ty.dtype), 0))
            wrapped.append((e, a))
            return e
        return None

    def unwrap(a):
        return next((v for e, v in wrapped if a.same_as(e)), None)

    main = mod.get_global_var("main")
    fixed = map_call_args(mod[main], wrap)
    if not wrapped:
        return relax.transform.MergeCompositeFunctions()(mod)
    merged = relax.transform.MergeCompositeFunctions()(updated(mod, {main: fixed}))
    main = merged.get_global_var("main")
    return updated(merged, {main: map_call_args(merged[main], unwrap)})


def merge_composite_functions(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's MergeCompositeFunctions, applied to every entry function of ``mod`` on its own.

    TVM's pass groups the composite calls of ``main`` only (but rewrites every function), so a
    second function with composites failed with "Variable ... could not be found in any group".
    Each entry function is therefore merged in a module of its own where it is ``main``, next to the
    module's other (non-entry) functions; its regions are prefixed with its name, so two functions
    never make regions of one name, and the results are put back together.
    """
    entries = entry_functions(mod)
    if entries == ["main"] or not entries:
        return _merge_main(mod)
    shared = {gv: f for gv, f in mod.functions_items() if gv.name_hint not in entries}
    results: dict[str, tuple[tvm.ir.GlobalVar, relax.BaseFunc]] = {}
    for name in entries:
        func = mod[name]
        private = func.attrs is None or "global_symbol" not in func.attrs
        sub = tvm.IRModule({**shared, tvm.ir.GlobalVar("main"): func.with_attr("global_symbol", name)})
        sub = _merge_main(sub)
        if name != "main":
            sub = updated(sub, {gv: f.with_attr("global_symbol", f"{name}_{gv.name_hint}")
                                for gv, f in sub.functions_items() if is_region(f)})
        # renames each GlobalVar after its global_symbol: main → name, regions → prefixed
        sub = relax.transform.NormalizeGlobalVar()(sub)
        for gv, f in sub.functions_items():
            if gv.name_hint == name and private:
                f = f.without_attr("global_symbol")
            results.setdefault(gv.name_hint, (gv, f))  # call sites hold these GlobalVars
    merged = mod.clone()
    for gv in list(merged.get_global_vars()):
        del merged[gv]
    for gv, func in results.values():
        merged[gv] = func
    # composites absorbed into regions of one function are still in the others' modules
    return relax.transform.DeadCodeElimination(entries)(merged)
