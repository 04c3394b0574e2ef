"""``compile``: build every device's code of a placed module into one VM executable.

The steps, each guarding against a way TVM 0.27 silently misplaces work:

1. :func:`~.validate.validate` the placement (operands and outputs of each op on one device).
2. Legalize with the device kept: each op's legalization is wrapped so that the ``call_tir`` it
   produces states the op's device (TVM drops it for ``R.nn.conv2d`` and ops without tensor
   operands); TVM then tags each kernel with that device's target.
3. Schedule the GPU kernels — only those whose target is a GPU (dlight's default GPU rules, then
   ``DefaultGPUSchedule`` for the rest); host kernels are left to llvm.
4. :func:`~.validate.validate_lowered`: every kernel compiled for its output's device.
5. ``relax.build`` with per-function targets; a GPU module must be in the result when a GPU
   device runs a kernel.

The result carries the placement plan (devices in VM order, each parameter's device, the loaders
of device constants) as data, also embedded in the executable as the function
``__byoc_hetero_placement__`` so an exported library can be run by :func:`~.runtime.vm`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm import relax

from .. import _relax
from ..errors import PlacementError
from ..inputs import dim_ranges, output_signature, signature
from . import _ir
from .devices import Device, device_of_vdevice, module_vdevices, parse_device
from .validate import validate, validate_lowered

PLAN_FUNCTION = "__byoc_hetero_placement__"
PLAN_FORMAT = "byoc_hetero.placement"


@dataclass
class PlacedExecutable:
    """A compiled placed module: the VM executable and its placement plan."""

    executable: relax.VMExecutable
    #: the placed module that was compiled (before lowering)
    module: tvm.IRModule
    #: the plan: ``{"devices": [...], "functions": {name: {"params": [...], "inputs": [...],
    #: "constants": loader, ...}}}`` (``inputs``/``outputs``: each input's and output's name, dtype and shape)
    plan: dict[str, Any] = field(default_factory=dict)

    @property
    def devices(self) -> list[Device]:
        """The devices in VM order."""
        return [parse_device(d) for d in self.plan["devices"]]

    def export_library(self, path: str, **kwargs) -> None:
        """Export the executable (the plan travels inside it; load with ``tvm.runtime.load_module``
        and run with :func:`byoc_hetero.placement.vm`)."""
        self.executable.export_library(path, **kwargs)


def gpu_sources(compiled) -> dict[str, str]:
    """The generated source of each GPU module of a compiled placement (``{"cuda": "..."}``).

    Where TVM's CUDA runtime is not linked (no GPU driver), TVM keeps the generated CUDA source in
    the module instead of compiling it; this is how to get it for an offline ``nvcc`` check.
    """
    executable = getattr(compiled, "executable", compiled)
    out: dict[str, str] = {}
    for m in _relax.imported_modules(executable.mod):
        if str(m.kind) == "cuda":
            out[str(m.kind)] = out.get(str(m.kind), "") + str(m.inspect_source(""))
    return out


def make_plan(mod: tvm.IRModule) -> dict[str, Any]:
    """The placement plan of a placed module (plain JSON-able data)."""
    devices = [str(device_of_vdevice(v)) for v in module_vdevices(mod)]
    functions: dict[str, Any] = {}
    for name in _relax.entry_functions(mod, (_ir.ATTR_CONSTANTS_FOR,)):
        func = mod[name]
        attrs = func.attrs if func.attrs is not None else {}
        if "global_symbol" not in attrs:
            continue
        params = []
        for p in func.params:
            vds = [t.vdevice for t in _ir.tensor_leaves(p.ty)]
            if isinstance(p.ty, relax.TensorType) and vds[0] is not None:
                params.append(str(device_of_vdevice(vds[0])))
            else:
                params.append(None)
        entry: dict[str, Any] = {"params": params}
        num_inputs = len(params)
        if _ir.ATTR_CONSTANTS in attrs:
            entry["constants"] = str(attrs[_ir.ATTR_CONSTANTS])
            entry["num_constants"] = int(attrs[_ir.ATTR_NUM_CONSTANTS])
            num_inputs -= entry["num_constants"]
        specs = signature(func)[:num_inputs]
        entry["inputs"] = [spec.to_json() if spec is not None else None for spec in specs]
        entry["outputs"] = [spec.to_json() if spec is not None else None for spec in output_signature(func)]
        ranges = dim_ranges(func)
        if ranges:
            entry["dim_ranges"] = {name: list(r) for name, r in ranges.items()}
        functions[name] = entry
    return {"format": PLAN_FORMAT, "version": 1, "devices": devices, "functions": functions}


# -- legalization that keeps devices ----------------------------------------------------------------

def _single_vdevice(call: relax.Call):
    vds = _ir.vdevices_in(call.ty)
    if vds and all(v is not None for v in vds) and all(_ir.key(v) == _ir.key(vds[0]) for v in vds):
        return vds[0]
    for arg in call.args:
        for t in _ir.tensor_leaves(getattr(arg, "ty", None)):
            if t.vdevice is not None:
                return t.vdevice
    return None


def _keep_device(legalize):
    def wrapped(bb: relax.BlockBuilder, call: relax.Call):
        result = legalize(bb, call)
        vdevice = _single_vdevice(call)
        if (vdevice is None or not isinstance(result, relax.Call)
                or _relax.op_name(result) not in _ir.TIR_CALLS):
            return result
        ty_args = [_ir.with_vdevice(t, vdevice) if any(v is None for v in _ir.vdevices_in(t)) else t
                   for t in result.ty_args]
        return relax.Call(result.op, result.args, result.attrs, ty_args)

    return wrapped


def legalize(mod: tvm.IRModule) -> tvm.IRModule:
    """``LegalizeOps`` whose kernels keep the device of the op they implement."""
    cmap = {}
    for name in sorted(_relax.ops_in(mod)):
        fn = tvm.ir.Op.get(name).get_attr("FLegalize")
        if fn is not None:
            cmap[name] = _keep_device(fn)
    return bind_kernel_targets(relax.transform.LegalizeOps(cmap)(mod))


def bind_kernel_targets(mod: tvm.IRModule) -> tvm.IRModule:
    """Give each ``call_tir`` kernel that has no target (a PrimFunc written by hand, called from the
    model) the target of the device it is called on; one copy per target kind when it is called
    on devices of different kinds."""
    uses: dict[str, dict[str, Any]] = {}  # kernel name → target kind → target
    for _gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for _block, binding in _ir.bindings(func):
            call = binding.value
            if not (isinstance(call, relax.Call) and _relax.op_name(call) in _ir.TIR_CALLS and call.ty_args):
                continue
            vds = _ir.vdevices_in(call.ty_args[0])
            kernel = mod[call.args[0]]
            if vds and vds[0] is not None and (kernel.attrs is None or "target" not in kernel.attrs):
                uses.setdefault(call.args[0].name_hint, {})[vds[0].target.kind.name] = vds[0].target
    if not uses:
        return mod
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
    renamed: dict[tuple[str, str], relax.GlobalVar] = {}
    for name, by_kind in uses.items():
        gv = out.get_global_var(name)
        kernel = out[gv]
        if len(by_kind) == 1:
            out[gv] = kernel.with_attr("target", next(iter(by_kind.values())))
            continue
        for kind, target in by_kind.items():
            new_gv = relax.GlobalVar(f"{name}_{kind}")
            relax.expr._update_type(new_gv, gv.ty)
            out[new_gv] = kernel.with_attr("target", target).with_attr("global_symbol", f"{name}_{kind}")
            renamed[(name, kind)] = new_gv
    if renamed:
        out = _retarget_calls(out, renamed)
        # the target-less originals are no longer called
        dropped = {name for name, _kind in renamed}
        out = tvm.IRModule({gv: f for gv, f in out.functions_items() if gv.name_hint not in dropped},
                           attrs=out.attrs, global_infos=out.global_infos)
    return out


def _retarget_calls(mod: tvm.IRModule, renamed) -> tvm.IRModule:
    @relax.expr_functor.mutator
    class Retarget(relax.PyExprMutator):
        def visit_call_(self, call):
            call = self.visit_expr_post_order(call)
            if _relax.op_name(call) in _ir.TIR_CALLS and call.ty_args and isinstance(call.args[0], relax.GlobalVar):
                vds = _ir.vdevices_in(call.ty_args[0])
                key = (call.args[0].name_hint, vds[0].target.kind.name if vds and vds[0] is not None else "")
                if key in renamed:
                    return relax.Call(call.op, [renamed[key], *call.args[1:]], call.attrs, call.ty_args)
            return call

    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            out[gv] = Retarget(out).visit_expr(func)
    return out


# -- GPU scheduling ------------------------------------------------------------------------------------

def _is_gpu_target(target) -> bool:
    return target is not None and "gpu" in [str(k) for k in target.keys]


def schedule_gpu_kernels(mod: tvm.IRModule) -> tvm.IRModule:
    """Apply default GPU schedules to the kernels whose target is a GPU, and only to them."""
    from tvm.s_tir import dlight as dl

    by_target: dict[str, tuple[Any, dict]] = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None:
            target = func.attrs.get("target")
            if _is_gpu_target(target):
                by_target.setdefault(str(target), (target, {}))[1][gv] = func
    if not by_target:
        return mod
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
    for target, funcs in by_target.values():
        sub = tvm.IRModule(funcs)
        with target:
            sub = dl.ApplyDefaultSchedule(
                dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback(),
            )(sub)
            sub = tvm.s_tir.transform.DefaultGPUSchedule()(sub)
        for gv, func in sub.functions_items():
            out[gv] = func
    return out


def lower(placed: tvm.IRModule) -> tvm.IRModule:
    """Legalize a placed module keeping devices, schedule its GPU kernels, and check that every
    kernel is compiled for its output's device (:func:`~.validate.validate_lowered`)."""
    lowered = schedule_gpu_kernels(legalize(placed))
    validate_lowered(lowered)
    return lowered


# -- compile ----------------------------------------------------------------------------------------------

def _with_plan(mod: tvm.IRModule, plan: dict[str, Any]) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    with bb.function(PLAN_FUNCTION, params=[]):
        bb.emit_func_output(tvm.ir.StringImm(json.dumps(plan)))
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
    out[PLAN_FUNCTION] = bb.get()[PLAN_FUNCTION]
    return out


def _gpu_devices_with_kernels(mod: tvm.IRModule) -> set[Device]:
    used = set()
    for _gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and _is_gpu_target(func.attrs.get("target")):
            used.add(str(func.attrs["target"].kind.name))
    return used


def compile(placed: tvm.IRModule, *, check: bool = True) -> PlacedExecutable:  # noqa: A001
    """Build a placed module for all its devices: llvm for CPU devices, CUDA (scheduled) for GPUs.

    ``placed`` is the result of :func:`~byoc_hetero.placement.place` (optionally partitioned
    afterwards with :func:`byoc_hetero.partition`, whose offloaded regions are linked in) or any
    module whose every value is typed on a declared virtual device.

    Raises :class:`PlacementError` when the placement is inconsistent (``check=False`` skips only
    the checks before lowering, never the kernel-target and GPU-module checks).
    """
    if check:
        validate(placed)
    elif not module_vdevices(placed):
        raise PlacementError("module declares no virtual devices; place() it first")
    plan = make_plan(placed)
    lowered = lower(placed)
    gpu_kinds = _gpu_devices_with_kernels(lowered)
    ex = relax.build(_with_plan(lowered, plan), target=None)
    kinds = _relax.runtime_kinds(ex.mod)
    missing = sorted(k for k in gpu_kinds if k not in kinds)
    if missing:
        raise PlacementError(
            f"kernels placed on {', '.join(missing)} but the executable has no {', '.join(missing)} module "
            f"(it has: {', '.join(sorted(kinds))})"
        )
    return PlacedExecutable(ex, placed, plan)
