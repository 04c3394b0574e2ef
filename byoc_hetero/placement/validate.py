"""Validation of a placed module, before and after lowering.

:func:`validate` checks what :func:`~byoc_hetero.placement.place` promises, on any module that
declares virtual devices (placed by us, written by hand in TVMScript, or placed and then
partitioned):

* every device used is declared in the module's ``vdevice`` list;
* every parameter and every bound value has a device;
* every call has its operands and its output on one device (TVM 0.27 infers a device-less output
  for ``R.matmul`` with operands on two devices and compiles it without complaint);
* ``R.to_vdevice`` produces a value on its destination;
* offloaded regions of a CPU runtime (``byoc_hetero``) run on a CPU device;
* constants used in a function live on VM device 0, where the VM loads them.

:func:`check_lowered` checks the module after legalization: every ``call_tir`` has an output
device, operands on that device, and calls a kernel whose target is that device's target (TVM
0.27 drops the device of ``R.nn.conv2d`` and of ops without tensor operands during legalization,
which would compile the kernel for the host and allocate its output on device 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from .. import _relax
from ..errors import PlacementError
from . import _ir
from .devices import Device, device_of_vdevice, module_vdevices
from .regions import cpu_regions

_MAX_SHOWN = 12


@dataclass
class Violation:
    """One broken placement rule: where, which op, what is wrong."""

    function: str
    binding: str
    op: str
    message: str

    def __str__(self) -> str:
        return f"{self.function}: {self.op} bound to {self.binding!r}: {self.message}"


def _raise(violations: list[Violation], what: str) -> None:
    if not violations:
        return
    lines = [str(v) for v in violations[:_MAX_SHOWN]]
    more = len(violations) - len(lines)
    if more > 0:
        lines.append(f"... and {more} more")
    raise PlacementError(f"{what}: {len(violations)} violation(s)\n  " + "\n  ".join(lines))


def _dev(vdevice) -> Device | None:
    return None if vdevice is None else device_of_vdevice(vdevice)


def _operand_leaves(expr):
    """(name, type) of every tensor inside an operand expression (vars, constants, tuples)."""
    if isinstance(expr, relax.Tuple):
        for f in expr.fields:
            yield from _operand_leaves(f)
        return
    if isinstance(expr, relax.Var):
        name = expr.name
    elif isinstance(expr, tvm.ir.Constant):
        name = "constant"
    else:
        return
    for t in _ir.tensor_leaves(expr.ty):
        yield name, t


def _fmt(pairs) -> str:
    return ", ".join(f"{name} on {dev if dev is not None else 'no device'}" for name, dev in pairs)


def check(mod: tvm.IRModule, functions=None) -> list[Violation]:
    """All placement violations of ``mod`` (empty when it is consistent)."""
    vdevices = module_vdevices(mod)
    out: list[Violation] = []
    if not vdevices:
        return [Violation("module", "-", "-", "declares no virtual devices (global_infos['vdevice']); "
                          "place() it first")]
    declared = [device_of_vdevice(v) for v in vdevices]
    home = declared[0]
    regions = cpu_regions(mod)
    names = functions if functions is not None else _relax.entry_functions(mod)
    for name in names:
        func = mod[name]
        for p in func.params:
            for t in _ir.tensor_leaves(p.ty):
                if t.vdevice is None:
                    out.append(Violation(name, p.name, "parameter", "has no device"))
                elif _dev(t.vdevice) not in declared:
                    out.append(Violation(name, p.name, "parameter", f"on undeclared device {_dev(t.vdevice)}"))
        for _block, binding in _ir.bindings(func):
            out.extend(_check_binding(name, binding, declared, home, regions))
    return out


def _check_binding(fname, binding, declared, home, regions) -> list[Violation]:
    var, value = binding.var, binding.value
    out: list[Violation] = []
    op = _ir.site_name(value) if isinstance(value, relax.Call) else type(value).__name__
    outs = [_dev(t.vdevice) for t in _ir.tensor_leaves(var.ty)]
    for d in outs:
        if d is None:
            operands = []
            if isinstance(value, relax.Call):
                operands = [(n, _dev(t.vdevice)) for a in value.args for n, t in _operand_leaves(a)]
            detail = f" (operands: {_fmt(operands)})" if operands else ""
            out.append(Violation(fname, var.name, op, f"output has no device{detail}"))
            return out
        if d not in declared:
            out.append(Violation(fname, var.name, op, f"output on undeclared device {d}"))
            return out
    if not isinstance(value, relax.Call):
        return out
    kind = _relax.op_name(value)
    if kind == _ir.HINT_OP:
        return [Violation(fname, var.name, op,
                          "R.hint_on_device left in a placed module; place() turns hints into copies")]
    if kind == _ir.COPY_OP:
        dst = device_of_vdevice(value.attrs.dst_vdevice)
        if outs and outs[0] != dst:
            out.append(Violation(fname, var.name, op, f"copy to {dst} typed on {outs[0]}"))
        return out
    if not outs:
        return out
    if len(set(outs)) > 1:
        several = ", ".join(map(str, sorted(set(outs))))
        out.append(Violation(fname, var.name, op, f"outputs on several devices: {several}"))
        return out
    device = outs[0]
    operands = [(n, _dev(t.vdevice)) for a in value.args for n, t in _operand_leaves(a)]
    wrong = [(n, d) for n, d in operands if d != device]
    if wrong:
        out.append(Violation(fname, var.name, op, f"output on {device} but operand(s) {_fmt(wrong)}"))
    for a in value.args:
        for n, t in _operand_leaves(a):
            if n == "constant" and _dev(t.vdevice) != home:
                out.append(Violation(fname, var.name, op, f"a constant on {_dev(t.vdevice)}: the VM loads "
                                     f"constants on device 0 ({home}); place() lifts such constants"))
    if op in regions and device.is_gpu:
        out.append(Violation(fname, var.name, op, f"offloaded region of a CPU runtime placed on {device}"))
    return out


def validate(mod: tvm.IRModule, functions=None) -> None:
    """Raise :class:`PlacementError` listing every violation of the placement rules in ``mod``."""
    _raise(check(mod, functions), "invalid placement")


def check_lowered(mod: tvm.IRModule) -> list[Violation]:
    """Violations after legalization: every ``call_tir`` kernel compiled for its output's device."""
    declared = [device_of_vdevice(v) for v in module_vdevices(mod)]
    targets = {device_of_vdevice(v): v.target for v in module_vdevices(mod)}
    out: list[Violation] = []
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or _relax.is_composite_or_region(func):
            continue
        for _block, binding in _ir.bindings(func):
            value = binding.value
            if not isinstance(value, relax.Call) or _relax.op_name(value) not in _ir.TIR_CALLS:
                continue
            kernel = value.args[0]

            def bad(message: str, _binding=binding, _kernel=kernel, _gv=gv) -> None:
                out.append(Violation(_gv.name_hint, _binding.var.name, _kernel.name_hint, message))

            outs = {_dev(v) for v in _ir.vdevices_in(value.ty_args[0] if value.ty_args else binding.var.ty)}
            if None in outs or not outs:
                bad("kernel output has no device (it would be allocated on device 0 and compiled for the host)")
                continue
            if len(outs) > 1:
                bad("kernel outputs on several devices")
                continue
            device = outs.pop()
            if device not in declared:
                bad(f"kernel output on undeclared device {device}")
                continue
            operands = [(n, _dev(t.vdevice)) for a in value.args[1:] for n, t in _operand_leaves(a)]
            wrong = [(n, d) for n, d in operands if d != device]
            if wrong:
                bad(f"kernel on {device} reads {_fmt(wrong)}")
            prim = mod[kernel]
            target = prim.attrs.get("target") if prim.attrs is not None else None
            want = targets[device].kind.name
            if target is None:
                bad(f"kernel has no target; it must be compiled for {want} ({device})")
            elif target.kind.name != want:
                bad(f"kernel compiled for {target.kind.name} but runs on {device} ({want})")
    return out


def validate_lowered(mod: tvm.IRModule) -> None:
    """Raise :class:`PlacementError` when a kernel would run on a device it was not compiled for."""
    _raise(check_lowered(mod), "invalid lowering of a placed module")
