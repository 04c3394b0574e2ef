"""``vm``: run a compiled placement — a VM with the right device list, inputs moved to their devices.

The VM's devices are the placement's devices in order (``cpu:1`` is ``tvm.cpu(1)``, ``cuda:0`` is
``tvm.cuda(0)``), as TVM's VM requires; TVM appends the host CPU when the last device is a GPU.
Each call moves its inputs to the devices of the parameters they fill (numpy arrays are uploaded
there, tensors elsewhere are copied) and appends the function's device constants, which were
copied to their devices once, when the VM was made.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relax

from ..errors import InputError, PlacementError
from ..inputs import TensorSpec, check, check_count
from .build import PLAN_FORMAT, PLAN_FUNCTION, PlacedExecutable
from .devices import Device, parse_device


def _read_plan(executable) -> dict[str, Any]:
    """The plan embedded in an executable (or a loaded library) by :func:`compile`."""
    probe = relax.VirtualMachine(executable, tvm.cpu())
    try:
        text = probe[PLAN_FUNCTION]()
    except Exception as err:  # noqa: BLE001  (TVM raises its own error types for unknown functions)
        raise PlacementError(
            "this executable carries no placement plan: compile it with byoc_hetero.placement.compile"
        ) from err
    plan = json.loads(str(text))
    if plan.get("format") != PLAN_FORMAT:
        raise PlacementError(f"unknown placement plan format {plan.get('format')!r}")
    return plan


class PlacedVM:
    """A VM over a compiled placement. ``vm["main"](*inputs)`` or ``vm.run("main", ...)``."""

    def __init__(self, compiled, memory_cfg: str | None = None):
        if isinstance(compiled, str | os.PathLike):  # an exported library: structure checked first
            from ..library import load_module

            compiled = load_module(compiled)
        if isinstance(compiled, PlacedExecutable):
            executable, plan = compiled.executable, compiled.plan
        else:
            executable, plan = compiled, _read_plan(compiled)
        self.plan = plan
        #: the placement devices in VM order
        self.devices: list[Device] = [parse_device(d) for d in plan["devices"]]
        # TVM's copies name the physical device by the virtual device's index (vm.builtin.to_device
        # gets cuda:1 as device id 1), so the runtime devices are fixed by the placement
        runtime_devices = [d.runtime_device() for d in self.devices]
        for dev, rt in zip(self.devices, runtime_devices):
            if not rt.exist:
                raise PlacementError(f"device {dev} ({rt}) is not available on this machine")
        #: the runtime device of each placement device
        self.runtime_devices: list[tvm.runtime.Device] = runtime_devices
        self._rt = {str(d): rt for d, rt in zip(self.devices, runtime_devices)}
        #: the underlying ``relax.VirtualMachine``
        self.vm = relax.VirtualMachine(executable, list(runtime_devices), memory_cfg=memory_cfg)
        self._constants: dict[str, list] = {}
        for name, entry in plan["functions"].items():
            loader = entry.get("constants")
            if loader:
                values = self.vm[loader]()
                where = entry["params"][len(entry["params"]) - entry["num_constants"]:]
                self._constants[name] = [values[i].copyto(self._rt[d]) for i, d in enumerate(where)]

    def device_constants(self, function: str = "main") -> list:
        """The device constants of ``function``, already on their devices (copied once, at load)."""
        return list(self._constants.get(function, []))

    def input_devices(self, function: str = "main") -> list[tvm.runtime.Device | None]:
        """The runtime device of each input of ``function`` (None for non-tensor inputs)."""
        entry = self._entry(function)
        n = len(entry["params"]) - entry.get("num_constants", 0)
        return [self._rt[p] if p is not None else None for p in entry["params"][:n]]

    def input_specs(self, function: str = "main") -> list[TensorSpec | None]:
        """The expected name, dtype and shape of each input of ``function`` (None for a non-tensor
        input, or for every input of a library compiled before the plan carried them)."""
        entry = self._entry(function)
        n = len(entry["params"]) - entry.get("num_constants", 0)
        specs = entry.get("inputs") or [None] * n
        return [TensorSpec.from_json(s) if s is not None else None for s in specs]

    def output_specs(self, function: str = "main") -> list[TensorSpec | None]:
        """The name (``output0``...), dtype and shape of each output of ``function`` (empty for a library
        compiled before the plan carried them)."""
        return [TensorSpec.from_json(s) if s is not None else None for s in self._entry(function).get("outputs", [])]

    def dim_ranges(self, function: str = "main") -> dict[str, tuple[int | None, int | None]]:
        """The declared range of each symbolic dim of ``function``'s inputs (empty if none)."""
        return {name: (lo, hi) for name, (lo, hi) in self._entry(function).get("dim_ranges", {}).items()}

    def _entry(self, function: str) -> dict:
        try:
            return self.plan["functions"][function]
        except KeyError:
            raise PlacementError(
                f"no function {function!r} in this placement (has: {', '.join(self.plan['functions'])})"
            ) from None

    def _move(self, value, device: tvm.runtime.Device | None, function: str, i: int):
        if device is None:
            return value
        if isinstance(value, tvm.runtime.Tensor):
            if value.device == device:
                return value
            return value.copyto(device)
        if isinstance(value, np.ndarray | np.generic | list | float | int):
            return tvm.runtime.tensor(np.asarray(value), device)
        if hasattr(value, "__dlpack__"):
            return tvm.runtime.from_dlpack(value).copyto(device)
        raise InputError(f"{function}: input {i} is a {type(value).__name__}; give a numpy array or a tvm tensor")

    def run(self, function: str, *inputs):
        """Run ``function`` on ``inputs`` (numpy arrays or tensors on any device).

        Raises :class:`~byoc_hetero.errors.InputError` naming the input when the count, a dtype or
        a shape does not match ``function``'s signature (a symbolic dimension takes any value in its
        declared range, the same value wherever the same variable appears)."""
        devices, specs = self.input_devices(function), self.input_specs(function)
        check_count(function, specs, len(inputs))
        args = [self._move(x, d, function, i) for i, (x, d) in enumerate(zip(inputs, devices))]
        check(function, specs, args, self.dim_ranges(function))
        return self.vm[function](*args, *self._constants.get(function, []))

    def __getitem__(self, function: str) -> Callable:
        self._entry(function)
        return lambda *inputs: self.run(function, *inputs)


def vm(compiled, memory_cfg: str | None = None) -> PlacedVM:
    """A VM for a compiled placement (:func:`compile`'s result, its exported library loaded with
    :func:`byoc_hetero.load_module`, or the library's path, which is loaded that way: a damaged
    file is an :class:`~byoc_hetero.errors.IntegrityError`): ``cpu:N`` runs on ``tvm.cpu(N)``,
    ``cuda:N`` on ``tvm.cuda(N)``.

    ``memory_cfg`` is passed to ``relax.VirtualMachine`` (``"naive"`` or ``"pooled"``).
    """
    return PlacedVM(compiled, memory_cfg)
