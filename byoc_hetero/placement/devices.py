"""Device names → virtual devices (``relax.VDevice``) and back.

A device is written ``"cpu"``, ``"cpu:N"``, ``"cuda"`` or ``"cuda:N"`` (``"cpu"`` means ``"cpu:0"``),
or given as a ``tvm.runtime.Device``. Each distinct name is one virtual device of the placed module;
``"cpu:0"`` and ``"cpu:1"`` are two virtual devices on the same host CPU (two VM devices, two memory
pools), which is how placement runs without a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import tvm
from tvm import relax

from ..errors import PlacementError

#: The device kinds placement knows, with the TVM target kind that compiles code for each.
KINDS: dict[str, str] = {"cpu": "llvm", "cuda": "cuda"}
_TARGET_KIND_TO_DEVICE = {"llvm": "cpu", "c": "cpu", "cuda": "cuda"}
_DLPACK_TO_KIND = {1: "cpu", 2: "cuda"}

#: CUDA architecture used when no GPU is present to ask (``compute capability 7.5``: the oldest
#: one that CUDA 12 and 13 still compile for).
DEFAULT_CUDA_ARCH = "sm_75"


@dataclass(frozen=True, order=True)
class Device:
    """A placement device: ``kind`` (``"cpu"`` or ``"cuda"``) and ``index``."""

    kind: str
    index: int = 0

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"

    @property
    def is_gpu(self) -> bool:
        return self.kind != "cpu"

    def runtime_device(self) -> tvm.runtime.Device:
        """The ``tvm.runtime.Device`` a VM runs this device's code on."""
        return tvm.cpu(self.index) if self.kind == "cpu" else tvm.cuda(self.index)


DeviceLike = str | Device | tvm.runtime.Device

_PATTERN = re.compile(r"^\s*([a-z]+)\s*(?::\s*(\d+))?\s*$")


def parse_device(value: DeviceLike) -> Device:
    """``"cpu"``, ``"cpu:N"``, ``"cuda"``, ``"cuda:N"``, a ``tvm.runtime.Device`` or a
    :class:`Device` → :class:`Device`. Raises :class:`PlacementError` for anything else."""
    if isinstance(value, Device):
        return value
    if isinstance(value, tvm.runtime.Device):
        kind = _DLPACK_TO_KIND.get(int(value.dlpack_device_type()))
        if kind is None:
            raise PlacementError(f"device {value}: only CPU and CUDA devices can be placed on")
        return Device(kind, int(value.index))
    if isinstance(value, str):
        m = _PATTERN.match(value)
        if m and m.group(1) in KINDS:
            return Device(m.group(1), int(m.group(2) or 0))
        raise PlacementError(
            f"unknown device {value!r}: write 'cpu', 'cpu:N', 'cuda' or 'cuda:N' (or pass a tvm.runtime.Device)"
        )
    raise PlacementError(f"a device is a string like 'cuda:0' or a tvm.runtime.Device, got {type(value).__name__}")


def default_target(device: Device) -> tvm.target.Target:
    """The TVM target that compiles code for ``device`` (llvm; cuda with an llvm host)."""
    if device.kind == "cpu":
        return tvm.target.Target("llvm")
    host = tvm.target.Target("llvm")
    dev = tvm.cuda(device.index)
    if dev.exist:
        return tvm.target.Target(tvm.target.Target.from_device(dev), host=host)
    return tvm.target.Target({"kind": "cuda", "arch": DEFAULT_CUDA_ARCH}, host=host)


def make_vdevice(device: Device, targets: Mapping[str, tvm.target.Target] | None = None) -> relax.VDevice:
    """The ``relax.VDevice`` of ``device`` (its ``vdevice_id`` is the device index)."""
    target = (targets or {}).get(device.kind) or default_target(device)
    if isinstance(target, str | dict):
        target = tvm.target.Target(target)
    if device.is_gpu and target.host is None:
        target = tvm.target.Target(target, host=tvm.target.Target("llvm"))
    if _TARGET_KIND_TO_DEVICE.get(target.kind.name) != device.kind:
        raise PlacementError(f"target {target.kind.name!r} cannot compile code for device {device}")
    return relax.VDevice(target, device.index, "global")


def device_of_vdevice(vdevice: relax.VDevice) -> Device:
    """The :class:`Device` a ``relax.VDevice`` stands for."""
    kind = _TARGET_KIND_TO_DEVICE.get(vdevice.target.kind.name)
    if kind is None:
        raise PlacementError(f"virtual device with target {vdevice.target.kind.name!r} is not a CPU or CUDA device")
    return Device(kind, int(vdevice.vdevice_id))


def module_vdevices(mod: tvm.IRModule) -> list[relax.VDevice]:
    """The virtual devices a module declares (``global_infos["vdevice"]``), in VM device order."""
    infos = mod.global_infos
    if infos is None or "vdevice" not in infos:
        return []
    return list(infos["vdevice"])


def module_devices(mod: tvm.IRModule) -> list[Device]:
    """The declared devices of ``mod`` in VM device order (index 0 holds the VM's constants)."""
    return [device_of_vdevice(v) for v in module_vdevices(mod)]
