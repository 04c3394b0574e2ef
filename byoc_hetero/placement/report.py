"""``placement_report``: what runs where, and what moves between devices.

Read from a placed module (or a compiled one): ops per device (offloaded regions count as one
op each, named by their codegen, plus the ops inside them), and every copy — the ones each run
performs (``R.to_vdevice`` in the function) with their bytes, and the ones done once at load
(constants used off device 0).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import tvm
from tvm import relax

from .._relax import op_name, short_op_name
from . import _ir
from .devices import device_of_vdevice, module_devices
from .regions import region_table

_COPY_OPS = (_ir.COPY_OP, _ir.HINT_OP)


@dataclass
class Copy:
    """One copy between devices."""

    value: str  # the copied value's name
    src: str
    dst: str
    nbytes: int | None  # None when a shape is not static
    at_load: bool = False  # True: done once when the VM is made (a device constant)


@dataclass
class PlacementReport:
    """Ops per device and the copies of one function of a placed module."""

    function: str
    devices: list[str]
    #: device → op name → count (ops TVM compiles and offloaded regions alike)
    ops: dict[str, Counter] = field(default_factory=dict)
    #: device → codegen → number of offloaded regions
    regions: dict[str, Counter] = field(default_factory=dict)
    #: device → op name → count of the ops inside offloaded regions there
    region_ops: dict[str, Counter] = field(default_factory=dict)
    copies: list[Copy] = field(default_factory=list)

    @property
    def copies_per_run(self) -> int:
        """Copies each call of the function performs."""
        return sum(1 for c in self.copies if not c.at_load)

    @property
    def bytes_per_run(self) -> int:
        """Bytes moved between devices by each call (copies of unknown size count 0)."""
        return sum(c.nbytes or 0 for c in self.copies if not c.at_load)

    @property
    def load_copies(self) -> int:
        """Copies done once, when the VM is made (constants used off device 0)."""
        return sum(1 for c in self.copies if c.at_load)

    @property
    def load_bytes(self) -> int:
        return sum(c.nbytes or 0 for c in self.copies if c.at_load)

    def __str__(self) -> str:
        lines = [f"placement of {self.function} on {', '.join(self.devices)}"]
        for dev in self.devices:
            ops = self.ops.get(dev, Counter())
            regions = self.regions.get(dev, Counter())
            extra = "".join(f", {n} {cg} region(s)" for cg, n in sorted(regions.items()))
            lines.append(f"{dev}: {sum(ops.values())} ops{extra}")
            lines.extend(_count_lines(ops, "    "))
            inner = self.region_ops.get(dev, Counter())
            if inner:
                lines.append(f"    inside the regions: {sum(inner.values())} ops")
                lines.extend(_count_lines(inner, "        "))
        lines.append(f"copies per run: {self.copies_per_run} ({_fmt_bytes(self.bytes_per_run)})")
        for c in self.copies:
            if not c.at_load:
                lines.append(f"    {c.value:<24} {c.src} -> {c.dst}  {_fmt_bytes(c.nbytes)}")
        lines.append(f"copies at load: {self.load_copies} ({_fmt_bytes(self.load_bytes)})")
        return "\n".join(lines)

    __repr__ = __str__


def _count_lines(counts: Counter, indent: str) -> list[str]:
    """``op  n`` lines, the most frequent first, op names without ``relax.``."""
    return [f"{indent}{short_op_name(op):<32} {n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "? bytes"
    if n < 10 * 1024:
        return f"{n} B"
    if n < 10 * 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"


def placement_report(placed, function: str = "main") -> PlacementReport:
    """The placement report of ``function`` in a placed module (or a :class:`PlacedExecutable`)."""
    mod: tvm.IRModule = getattr(placed, "module", placed)
    devices = [str(d) for d in module_devices(mod)]
    report = PlacementReport(function, devices)
    func = mod[function]
    regions = region_table(mod)
    for _block, binding in _ir.bindings(func):
        value = binding.value
        if not isinstance(value, relax.Call):
            continue
        op = op_name(value)
        if op in _COPY_OPS:
            src = [t.vdevice for t in _ir.tensor_leaves(value.args[0].ty)]
            dst = [t.vdevice for t in _ir.tensor_leaves(binding.var.ty)]
            report.copies.append(Copy(
                _name(value.args[0]),
                str(device_of_vdevice(src[0])) if src and src[0] is not None else "?",
                str(device_of_vdevice(dst[0])) if dst and dst[0] is not None else "?",
                _ir.nbytes(binding.var.ty),
            ))
            continue
        vds = _ir.vdevices_in(binding.var.ty)
        dev = str(device_of_vdevice(vds[0])) if vds and vds[0] is not None else "?"
        name = _ir.site_name(value)
        info = regions.get(name)
        if info is not None:
            report.ops.setdefault(dev, Counter())[info.codegen] += 1
            report.regions.setdefault(dev, Counter())[info.codegen] += 1
            report.region_ops.setdefault(dev, Counter()).update(info.ops)
        else:
            report.ops.setdefault(dev, Counter())[name] += 1
    attrs = func.attrs if func.attrs is not None else {}
    if _ir.ATTR_NUM_CONSTANTS in attrs:
        n = int(attrs[_ir.ATTR_NUM_CONSTANTS])
        home = devices[0] if devices else "?"
        for p in list(func.params)[len(func.params) - n:]:
            vds = _ir.vdevices_in(p.ty)
            report.copies.append(Copy(p.name, home, str(device_of_vdevice(vds[0])), _ir.nbytes(p.ty), at_load=True))
    return report


def _name(expr) -> str:
    if isinstance(expr, relax.Var):
        return expr.name
    if isinstance(expr, tvm.ir.Constant):
        return "constant"
    return type(expr).__name__
