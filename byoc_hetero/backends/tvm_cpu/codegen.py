"""Codegen of backend ``tvm_cpu`` (``relax.ext.tvm_cpu``): each region compiled by TVM itself.

A region (a Relax function of one-op composites) becomes one PrimFunc: its composites inlined back
to plain ops (:func:`~byoc_hetero.passes.retarget_regions.region_as_main`), legalized to TIR
(``LegalizeOps``), the whole region marked as one primitive function and fused (``FuseTIR``): one
PrimFunc in destination-passing style, its parameters the region's inputs then its outputs — the
calling convention of RunCodegen's ``call_dps_packed``. It is scheduled for this CPU
(:func:`.schedule.schedule_func`: parallel, vectorized) and named by the region's global symbol;
all regions of a module are compiled by one ``tvm.tirx.build`` for the host's llvm target into one
runtime module, which ``relax.build`` links like any external module (and ``export_library``
compiles into the shared library: it is an llvm module). With the option ``fast_math`` the region's
float32 exp and softmax are first rewritten into :mod:`.fast_math`'s guarded polynomial exp.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tvm
from tvm import relax, tirx

from ...errors import CodegenError
from ...passes.retarget_regions import region_as_main, region_key_of
from ...targets import get_target
from . import meta_schedule
from .fast_math import fast_math
from .schedule import host_target, schedule_func


def _as_primitive(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` (a legalized ``main`` of ``call_tir`` bindings) with ``main``'s body moved into a
    primitive function ``fused`` that ``main`` calls, so that ``FuseTIR`` makes it one PrimFunc."""
    main = mod["main"]
    params = [relax.Var(p.name, p.ty) for p in main.params]
    inner = relax.Function(main.params, main.body, main.ret_ty, True).with_attr("Primitive", 1)
    bb = relax.BlockBuilder(tvm.IRModule({gv: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}))
    gv = bb.add_func(inner, "fused")
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.Call(gv, params))
        bb.emit_func_output(out)
    return bb.get()


def _compact(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each parameter buffer of a symbolic element offset (what ``te.extern``
    kernels such as scatter_nd declare) given offset 0, as every other legalized kernel declares
    it: FuseTIR refuses one tensor seen through buffers of two types. The region's tensors are
    compact and start at their data pointer (TVM's argument checks say so otherwise)."""
    remap = {}
    for param in func.params:  # in TVM 0.27 a parameter is its buffer
        offset = getattr(param, "elem_offset", None)
        if offset is not None and not isinstance(offset, tirx.IntImm):
            remap[param] = tirx.decl_buffer(param.shape, param.dtype, param.name)
    return func.specialize(remap) if remap else func


def region_prim_func(region: relax.Function, fast: bool = False) -> tirx.PrimFunc:
    """The region as one PrimFunc: inputs, then outputs (one per tensor of its result); ``fast``:
    its float32 exp and softmax through :func:`.fast_math.fast_math` first."""
    main = region_as_main(region)
    mod = relax.transform.LegalizeOps()(fast_math(main) if fast else main)
    for gv, func in list(mod.functions_items()):
        if isinstance(func, tirx.PrimFunc):
            mod[gv] = _compact(func)
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    mod = relax.transform.FuseTIR()(_as_primitive(mod))
    prims = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    calls = [b.value for block in mod["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and b.value.op.same_as(tvm.ir.Op.get("relax.call_tir"))]
    if len(prims) != 1 or len(calls) != 1:
        raise CodegenError(f"tvm_cpu: region {region.attrs['global_symbol']} did not fuse into one PrimFunc "
                           f"({len(prims)} PrimFuncs, {len(calls)} call_tir)")
    ret = region.ret_ty
    outputs = len(ret.fields) if isinstance(ret, relax.TupleType) else 1
    func = prims[0]
    if len(func.params) != len(region.params) + outputs:
        raise CodegenError(f"tvm_cpu: region {region.attrs['global_symbol']} fused into a PrimFunc of "
                           f"{len(func.params)} parameters, expected {len(region.params)} inputs + {outputs} outputs "
                           "(an input the region does not read?)")
    return func


def compile_regions(funcs: Sequence[relax.Function], target: tvm.target.Target | None = None,
                    fast: bool | Callable[[relax.Function], bool] = False,
                    schedule: str | Callable[[relax.Function], str] = "dlight") -> tvm.runtime.Module:
    """One llvm runtime module holding each region of ``funcs`` as a scheduled PrimFunc under the
    region's global symbol (``fast``: the option ``fast_math``; ``schedule``: the option ``schedule``,
    ``"dlight"`` for the fixed rules of :mod:`.schedule`, ``"meta_schedule"`` for
    :func:`.meta_schedule.schedule_func`, falling back to the fixed rules where it finds nothing; each
    for every region or per region)."""
    target = target or host_target()
    prims = {}
    for region in funcs:
        symbol = str(region.attrs["global_symbol"])
        func = region_prim_func(region, fast(region) if callable(fast) else fast)
        how = schedule(region) if callable(schedule) else schedule
        tuned = meta_schedule.schedule_func(func, target) if how == "meta_schedule" else None
        func = tuned or schedule_func(func, target) or func
        prims[symbol] = func.with_attr("global_symbol", symbol).with_attr("target", target)
    return tvm.tirx.build(tvm.IRModule(prims), target=target)


def relax_ext_codegen(funcs: Sequence[relax.Function], options: Mapping[str, Any] | None = None,
                      _constant_names: Any = None) -> list[tvm.runtime.Module]:
    """``relax.ext.tvm_cpu``: RunCodegen's call for the regions of backend ``tvm_cpu``; ``options``
    as the backend checked them (a default left out; ``fast_math`` and ``schedule`` for every region
    or per region key)."""
    if not funcs:
        return []
    backend = get_target("tvm_cpu")

    def per_region(name: str) -> Callable[[relax.Function], Any]:
        given = options.get(name) if options else None
        default = backend.options[name].default

        def value(region: relax.Function) -> Any:  # a region's key is read only where the option is given
            return default if given is None else backend.region_option(options, name, region_key_of(region))
        return value

    fast, schedule = per_region("fast_math"), per_region("schedule")
    try:
        return [compile_regions(list(funcs), fast=lambda r: bool(fast(r)), schedule=lambda r: str(schedule(r)))]
    except CodegenError:
        raise
    except Exception as err:  # noqa: BLE001 - TVM's errors name no region
        names = ", ".join(str(f.attrs["global_symbol"]) for f in funcs)
        raise CodegenError(f"tvm_cpu: compiling regions {names} failed: {err}") from err


__all__ = ["compile_regions", "region_prim_func", "relax_ext_codegen"]
