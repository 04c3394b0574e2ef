"""The placement decision for one function, as plain data.

:mod:`.place` fills a :class:`FunctionPlan` (a device for every parameter and binding, the calls
it placed, the constants it found); :mod:`.copies` reads it to rebuild the function. A *device
tree* mirrors a value's type: a :class:`~.devices.Device` for a tensor, a tuple of trees for a
tuple, None for a non-tensor value, :data:`CONST` for a bound constant (each consumer gets it on
its own device) and :class:`Pending` for a parameter whose first consumer has not been seen yet.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from tvm import relax

from .devices import Device
from .rules import Site


class Pending:
    """The device of a parameter not decided yet (its first consumer decides)."""

    __slots__ = ("param",)

    def __init__(self, param: int):
        self.param = param


#: marker: a value bound to a constant; each consumer gets it on its own device
CONST = "constant"

DevTree = Device | Pending | str | tuple | None


@dataclass
class FunctionPlan:
    """The placement decision for one function: a device per parameter and per binding."""

    name: str
    params: list[DevTree]
    bindings: dict[int, DevTree] = field(default_factory=dict)  # key(var) → device tree
    const_vars: dict[int, relax.Expr] = field(default_factory=dict)  # key(var) → bound constant
    sites: dict[int, Site] = field(default_factory=dict)  # key(var) → the call placed there


def fill(ty, device: Device) -> DevTree:
    """A device tree with ``device`` at every tensor of ``ty``."""
    if isinstance(ty, relax.TupleType):
        return tuple(fill(f, device) for f in ty.fields)
    return device if isinstance(ty, relax.TensorType) else None


def devices_in(tree: DevTree) -> Iterator[Device]:
    """The :class:`~.devices.Device` leaves of a device tree, in order."""
    if isinstance(tree, tuple):
        for t in tree:
            yield from devices_in(t)
    elif isinstance(tree, Device):
        yield tree
