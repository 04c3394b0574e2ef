"""Pass ``retarget_regions`` (Relax, during merging): a region formed of one backend's composites is
handed to another registered backend, where a codegen map (``region_codegen``) says so.

Why: the stages give each op to the first backend in ``target=[...]`` whose rules take it, so a
second backend (a user's, from ``bh.register_target``) only ever gets what the first refuses.
``bh.tune`` times each region on every backend that can run it (issue 26, the codegen level) and
writes the winner into the codegen map; this pass applies a winner that is not the region's own
backend.

How: the region's composites are inlined back into plain ops (a ``main`` computing what the region
computes, from its parameters), and the first three stages run on that ``main`` for the other
backend alone, with the cost gate's heavy-op rule off (:func:`byoc_hetero.stages.retarget_region`,
handed to this pass by the stage that runs it: a pass does not run the stages). The other backend can run the region when
that leaves exactly one region of it that computes everything: ``main`` only calls it, on its own
parameters, and returns its result. That region (its parameters put in the original's order)
replaces the original under the original's global symbol, marked with :data:`RETARGET_ATTR` (the
original's key, so the codegen map and the tuner keep naming it by that key). Otherwise the
reason comes back (``region_codegen`` then raises it as a :class:`~byoc_hetero.RuleError`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import tvm
from tvm import relax

from .._relax import is_composite, updated

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


def retarget_regions(mod: tvm.IRModule, codegen: Mapping[str, str], keys: Mapping[tvm.ir.GlobalVar, str],
                     retarget_region: Callable[[relax.Function, str], relax.Function | str]) -> tvm.IRModule:
    """Each region ``gv`` of ``mod`` with ``keys[gv]`` mapped by ``codegen`` to a backend other than
    its own replaced by that backend's region (``retarget_region(region, backend)``: the region
    formed by that backend's stages, :func:`byoc_hetero.stages.retarget_region`, or why it cannot
    be); a :class:`~byoc_hetero.RuleError` names the region and the backend where it cannot be."""
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
