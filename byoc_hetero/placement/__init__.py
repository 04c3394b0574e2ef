"""Heterogeneous placement: put operators on devices with a simple map.

>>> placed = place(mod, {"relax.nn.conv2d": "cpu:1"}, fallback="cpu:0")
>>> ex = compile(placed)
>>> y = vm(ex)["main"](x)
"""

from .devices import Device, parse_device
from .errors import PlacementError, PlacementWarning
from .build import PlacedExecutable, compile
from .place import place
from .report import Copy, PlacementReport, placement_report
from .runtime import PlacedVM, vm
from .validate import validate
from .rules import PlacementRules, Site

__all__ = [
    "Device", "PlacedExecutable", "PlacedVM", "PlacementError", "PlacementRules", "PlacementWarning", "Site",
    "Copy", "PlacementReport", "compile", "parse_device", "place", "placement_report", "validate", "vm",
]
