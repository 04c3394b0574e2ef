"""Offloaded regions as placement sees them: which calls are regions, what they contain, and
whether their runtime can only run on a CPU.

Read from the partitioned module's region table (:func:`byoc_hetero._relax.region_table`: the
regions of the backends that describe them, on the device kind of their backend: CPU-only for the
oneDNN runtime, GPU-only for the cuda_vendor backend) and, for a call into another BYOC backend's external
module, from that module (:func:`byoc_hetero._relax.external_module_for`: device unknown).
:mod:`.place`, :mod:`.validate` and :mod:`.report` all ask here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import tvm

from .. import _relax
from ..errors import RuleError
from ..targets import get_target


@dataclass
class RegionInfo:
    """An offloaded region (an external module's symbol) as placement sees it."""

    #: the codegen (target) name, e.g. ``"onednn"``
    codegen: str
    #: full Relax op name → how many times the region contains it (``{"relax.nn.conv2d": 2}``)
    ops: Counter = field(default_factory=Counter)
    #: composite (rule) names merged into the region
    composites: tuple[str, ...] = ()
    #: True when the region's runtime runs on the host CPU only
    cpu_only: bool = True
    #: True when the region's runtime runs on a GPU only (a backend whose ``device`` is a GPU kind)
    gpu_only: bool = False


def region_table(mod: tvm.IRModule) -> dict[str, RegionInfo]:
    """The byoc_hetero regions carried by ``mod`` (``external_mods``), by symbol."""
    table: dict[str, RegionInfo] = {}
    for symbol, entry in _relax.region_table(mod).items():
        ops = Counter({_full_name(op): n for op, n in entry.ops.items()})
        on_cpu = _backend_device(entry.target) == "cpu"
        table[symbol] = RegionInfo(entry.target, ops, tuple(entry.composites), cpu_only=on_cpu, gpu_only=not on_cpu)
    return table


def _backend_device(target: str) -> str:
    """The device kind a backend's regions run on (``"cpu"`` for a backend no longer registered)."""
    try:
        return get_target(target).device
    except RuleError:
        return "cpu"


def region_of(mod: tvm.IRModule, symbol: str, table: dict[str, RegionInfo]) -> RegionInfo | None:
    """The region behind an external ``symbol``: from ``table``, else any external module of ``mod``
    that implements it (another BYOC backend; its device is not known, so not CPU-only)."""
    info = table.get(symbol)
    if info is not None:
        return info
    module = _relax.external_module_for(mod, symbol)
    return RegionInfo(str(module.kind), cpu_only=False) if module is not None else None


def cpu_regions(mod: tvm.IRModule) -> set[str]:
    """Symbols of the regions of ``mod`` whose runtime runs on a CPU only."""
    return {symbol for symbol, info in region_table(mod).items() if info.cpu_only}


def _full_name(op: str) -> str:
    return op if op.startswith("relax.") else "relax." + op
