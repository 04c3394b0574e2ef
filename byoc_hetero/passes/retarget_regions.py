"""Pass ``retarget_regions`` (Relax, during merging): a region formed of one backend's composites is
handed to another registered backend, where a codegen map (``region_codegen``) says so.

Why: the stages give each op to the first backend in ``target=[...]`` whose rules take it, so a
second backend (a user's, from ``bh.register_target``) only ever gets what the first refuses.
``bh.tune`` times each region on every backend that can run it (issue 26, the codegen level) and
writes the winner into the codegen map; this pass applies a winner that is not the region's own
backend.

How: the region's composites are inlined back into plain ops (a ``main`` computing what the region
computes, from its parameters), and the first three stages run on that ``main`` for the other
backend alone, with the cost gate's heavy-op rule off. The other backend can run the region when
that leaves exactly one region of it that computes everything: ``main`` only calls it, on its own
parameters, and returns its result. That region (its parameters put in the original's order)
replaces the original under the original's global symbol, marked with :data:`RETARGET_ATTR` (the
original's key, so the codegen map and the tuner keep naming it by that key). Otherwise the
reason comes back (``region_codegen`` then raises it as a :class:`~byoc_hetero.RuleError`).
"""

from __future__ import annotations

from collections.abc import Mapping

import tvm
from tvm import relax

from .._relax import is_composite, is_region, op_calls, region_composites, updated

RETARGET_ATTR = "byoc_hetero.retargeted_from"
"""Attribute of a retargeted region: the region key of the region it replaced."""


def region_key_of(region: relax.Function) -> str:
    """The key a codegen map names ``region`` by: :func:`.cost_gate.region_key`, or for a region
    handed to another backend, the key of the region it replaced."""
    from .cost_gate import region_key

    return str(region.attrs[RETARGET_ATTR]) if RETARGET_ATTR in region.attrs else region_key(region)


def region_as_main(region: relax.Function) -> tvm.IRModule:
    """A module whose ``main`` computes what ``region`` computes, its composites inlined as plain
    ops (what ``relax.build`` compiles for llvm)."""
    from .inline_composites import inline_composites

    plain = relax.Function(region.params, region.body, region.ret_ty, region.is_pure).with_attr("global_symbol", "main")
    lifted = relax.transform.LambdaLift()(tvm.IRModule({"main": plain}))
    composites = {gv for gv, f in lifted.functions_items() if is_composite(f)}
    return inline_composites(lifted, composites)


def _op_count(region: relax.Function) -> int:
    return sum(len(op_calls(f)) for f in region_composites(region))


def retarget_region(region: relax.Function, backend: str) -> relax.Function | str:
    """``region`` as a region of ``backend`` (a registered target's name), or why it cannot be."""
    from ..stages import stages

    mod = region_as_main(region)
    try:
        for stage in stages(backend, 1, False)[:3]:
            mod = stage(mod)
    except Exception as err:  # noqa: BLE001 - a backend's rules may fail on ops they never saw
        return f"its stages failed on the region's ops: {err}"
    found = [(gv, f) for gv, f in mod.functions_items() if is_region(f)]
    if len(found) != 1:
        return f"{backend} forms {len(found)} regions of its ops, not one"
    ((gv, new),) = found
    if _op_count(new) != _op_count(region):
        return f"{backend} takes {_op_count(new)} of its {_op_count(region)} ops"
    order = _param_order(mod["main"], gv)
    if order is None:
        return f"{backend}'s region does not take the region's parameters one to one"
    params = [new.params[j] for j in order]
    out = relax.Function(params, new.body, new.ret_ty, new.is_pure, new.attrs)
    return out.with_attr("global_symbol", region.attrs["global_symbol"])


def _param_order(main: relax.Function, gv: tvm.ir.GlobalVar) -> list[int] | None:
    """For each parameter of ``main`` in order, the index of the argument of the one call of
    ``gv`` that passes it; None unless ``main`` is only that call on its parameters, returned."""
    body = main.body
    bindings = [b for block in body.blocks for b in block.bindings]
    calls = [b for b in bindings if isinstance(b.value, relax.Call) and b.value.op.same_as(gv)]
    if len(calls) != 1 or len(bindings) > 2:
        return None
    call = calls[0]
    returned = body.body
    if not (returned.same_as(call.var) or (len(bindings) == 2 and bindings[1].value.same_as(call.var)
                                           and returned.same_as(bindings[1].var))):
        return None
    args = list(call.value.args)
    order = [next((j for j, a in enumerate(args) if a.same_as(p)), -1) for p in main.params]
    return order if sorted(order) == list(range(len(args))) else None


def retarget_regions(mod: tvm.IRModule, codegen: Mapping[str, str], keys: Mapping[tvm.ir.GlobalVar, str]
                     ) -> tvm.IRModule:
    """Each region ``gv`` of ``mod`` with ``keys[gv]`` mapped by ``codegen`` to a backend other than
    its own replaced by that backend's region; a :class:`~byoc_hetero.RuleError` names the region
    and the backend where it cannot be."""
    from ..errors import RuleError
    from ..rules import get_target

    changed = {}
    for gv, key in keys.items():
        func, want = mod[gv], codegen.get(key)
        if want is None or want == get_target(str(func.attrs["Codegen"])).name:
            continue
        new = retarget_region(func, want)
        if isinstance(new, str):
            raise RuleError(f"region_codegen: region {key} ({str(func.attrs['Codegen'])}) cannot run on {want}: {new}")
        changed[gv] = new.with_attr(RETARGET_ATTR, key)
    return updated(mod, changed) if changed else mod
