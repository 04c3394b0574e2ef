"""Heterogeneous placement: put operators on devices with a simple map, with a fallback device
and automatic copies.

>>> from byoc_hetero import placement as pl
>>> placed = pl.place(mod, {"relax.nn.conv2d": "cuda", "my.cpu_only_op": "cpu"}, fallback="cpu")
>>> placed = pl.place(mod, lambda site: "cuda" if site.op_name == "relax.nn.conv2d" else None)  # a policy
>>> ex = pl.compile(placed)          # llvm for the CPU, scheduled CUDA for the GPU
>>> y = pl.vm(ex)["main"](x)         # VM with the right device list; inputs moved for you
>>> print(pl.placement_report(placed))

One job per module, imports flowing one way (devices → rules → decision → copies → place;
regions → validate → build → runtime): :mod:`.devices` (device names ↔ virtual devices),
:mod:`.rules` (placement maps and policies), :mod:`.regions` (offloaded regions as placement sees
them), :mod:`.decision` (the per-function plan, as data), :mod:`.place` (deciding devices),
:mod:`.copies` (typing values and inserting copies), :mod:`.validate` (checks before and after
lowering), :mod:`.build` (``compile``), :mod:`.runtime` (``vm``), :mod:`.report`
(``placement_report``); :mod:`._ir` holds the placement-specific IR helpers, and facts about
Relax in general come from :mod:`byoc_hetero._relax`. Errors are :class:`PlacementError` and
:class:`PlacementWarning` of :mod:`byoc_hetero.errors`.
"""

from .build import PlacedExecutable, compile, gpu_sources, lower  # noqa: A004  (compile is the public name)
from .devices import Device, parse_device
from ..errors import PlacementError, PlacementWarning
from .place import place
from .report import Copy, PlacementReport, placement_report
from .rules import PlacementMap, PlacementPolicy, PlacementRules, Site
from .runtime import PlacedVM, vm
from .validate import validate, validate_lowered

__all__ = [
    "Copy",
    "Device",
    "PlacedExecutable",
    "PlacedVM",
    "PlacementError",
    "PlacementMap",
    "PlacementPolicy",
    "PlacementReport",
    "PlacementRules",
    "PlacementWarning",
    "Site",
    "compile",
    "gpu_sources",
    "lower",
    "parse_device",
    "place",
    "placement_report",
    "validate",
    "validate_lowered",
    "vm",
]
