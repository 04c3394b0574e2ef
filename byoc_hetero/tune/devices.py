"""The device level: which device runs each call of the tuned module, counting the copies.

After the other levels, the tuned module's ``main`` is a sequence of calls: offloaded regions
(a CPU backend's, oneDNN: CPU only; a GPU backend's, cuda_vendor: GPU only — no time is asked for
on a device its runtime cannot run on) and the ops TVM compiles (on the
CPU with llvm, or on a GPU with TVM's cuda code). Each call is a *device unit*. With ``devices``
naming a GPU, :func:`tune_devices` gets each unit's seconds per call on each device it can run on
and the cost of a copy between two devices, and :func:`.solver.solve` picks the placement of least
total time: the units' times plus the copies the placement implies, at the real tensor sizes —
a tensor produced on one device and read on another is copied once per reading device (seed 004),
so a unit moves to the GPU only where its saving beats the copies it adds, and an input read on two
devices is copied once. The placement is applied with :func:`byoc_hetero.place` (model inputs and
outputs on the CPU), so the returned module is an ordinary placed module.

Where the costs come from is a :class:`Measurer`:

- :class:`CostTable`: given figures (the tests' injected costs, or a table measured elsewhere and
  shipped): per unit and device the seconds per call, per device pair the latency and bandwidth;
- :class:`GpuMeasurer`: measured here, where a GPU exists: each unit alone as a one-call module
  (the same call, the partition's regions and constants, random inputs of its real shapes) placed
  on each device and timed (:func:`.measure.time_call`), and copies timed at two sizes to fit a
  latency and a bandwidth.

On a machine without a GPU and without a cost table the level is skipped and the report says so
(not an error: the same tune call works on a CPU-only CI machine and on a GPU box).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import tvm
from tvm import relax

from ..errors import PlacementError
from .solver import Choice, Problem, Region, linear_copy_cost, solve


@dataclass
class DeviceUnit:
    """A call of the tuned ``main``: its variable, what it is, the tensors it reads and writes."""

    name: str  # the variable the call is bound to (what placement's rule matches: Site.name)
    what: str  # the op name, or "region <symbol>"
    inputs: list[str]
    outputs: list[str]
    cpu_only: bool  # an offloaded region of a CPU backend (oneDNN): its runtime runs on the CPU only
    call: int = 0  # the call's identity (placement.\_ir.key): what the placement rule matches
    gpu_only: bool = False  # a region of a GPU backend (cuda_vendor): its runtime runs on a GPU only

    def runs_on(self, device: str) -> bool:
        """Whether the unit's runtime can run on ``device`` (``"cpu:0"``, ``"cuda:0"``) at all."""
        on_cpu = device.startswith("cpu")
        return not (self.cpu_only and not on_cpu) and not (self.gpu_only and on_cpu)

    def __str__(self) -> str:
        return f"{self.name} = {self.what}"


class Measurer(Protocol):
    """Where the device level's costs come from."""

    def time(self, unit: DeviceUnit, device: str) -> float | None:
        """Seconds per call of ``unit`` on ``device`` (``"cpu:0"``, ``"cuda:0"``); None: it cannot run there."""

    def link(self, src: str, dst: str) -> tuple[float, float]:
        """``(latency seconds, bytes per second)`` of a copy from ``src`` to ``dst``."""


@dataclass
class CostTable:
    """Given costs (:class:`Measurer`): ``times[unit name][device]`` seconds per call (a unit or
    device missing: it does not run there; a unit missing altogether runs on the CPU only, at no
    cost), ``links[(src, dst)] = (latency_s, bytes_per_s)`` in either order. Device names as
    :func:`byoc_hetero.placement.parse_device` writes them (``"cpu:0"``, ``"cuda:0"``)."""

    times: Mapping[str, Mapping[str, float]]
    links: Mapping[tuple[str, str], tuple[float, float]]

    def time(self, unit: DeviceUnit, device: str) -> float | None:
        if unit.name not in self.times:
            return 0.0 if device.startswith("cpu") else None
        return self.times[unit.name].get(device)

    def link(self, src: str, dst: str) -> tuple[float, float]:
        for key in ((src, dst), (dst, src)):
            if key in self.links:
                return self.links[key]
        raise PlacementError(f"tune: the cost table has no copy cost between {src} and {dst}")


def _source(value: relax.Expr, names: Mapping[int, str]) -> list[str]:
    """The tensors an argument reads, by unique name (aliases and tuple projections resolved)."""
    from ..placement._ir import key

    if isinstance(value, relax.Var):
        return [names[key(value)]] if key(value) in names else []
    if isinstance(value, relax.Tuple):
        return [n for f in value.fields for n in _source(f, names)]
    if isinstance(value, relax.TupleGetItem):
        return _source(value.tuple_value, names)
    return []


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name.K`` when a variable of ``main`` already has it (Relax names need not be unique)."""
    k, out = 1, name
    while out in taken:
        k, out = k + 1, f"{name}.{k}"
    taken.add(out)
    return out


def device_units(partitioned: tvm.IRModule) -> tuple[list[DeviceUnit], dict[str, int], list[str], list[str]]:
    """The calls of ``main`` as device units, the bytes of each tensor between them, and the
    model's inputs and outputs, by unique name (the variable's, ``.K`` added to a repeated one).
    Tuple projections and aliases are no units: they name their source tensor."""
    from ..placement._ir import key, nbytes, site_name
    from ..placement.regions import region_table

    func = partitioned["main"]
    table = region_table(partitioned)
    names: dict[int, str] = {}
    taken: set[str] = set()
    units, sizes = [], {}
    for p in func.params:
        names[key(p)] = _unique(p.name, taken)
        sizes[names[key(p)]] = nbytes(p.ty) or 0
    for block in func.body.blocks:
        for b in block.bindings:
            value = b.value
            if isinstance(value, (relax.Var, relax.TupleGetItem)):
                source = _source(value, names)
                if source:
                    names[key(b.var)] = source[0]
                continue
            if not isinstance(value, relax.Call):
                continue
            name = names[key(b.var)] = _unique(b.var.name, taken)
            sizes[name] = nbytes(b.var.ty) or 0
            region = isinstance(value.op, tvm.ir.Op) and value.op.name == "relax.call_dps_packed"
            what = f"region {site_name(value)}" if region else site_name(value)
            args = value.args[1].fields if region and isinstance(value.args[1], relax.Tuple) else value.args
            reads = list(dict.fromkeys(n for a in args for n in _source(a, names)))
            info = table.get(site_name(value)) if region else None
            gpu_only = info is not None and info.gpu_only
            units.append(DeviceUnit(name, what, reads, [name], cpu_only=region and not gpu_only, call=key(value),
                                    gpu_only=gpu_only))
    inputs = [names[key(p)] for p in func.params]
    return units, sizes, inputs, _source(func.body.body, names)


@dataclass
class DeviceDecision:
    """One unit's placement: the device chosen and every device's time (None: cannot run there)."""

    unit: DeviceUnit
    chosen: str
    times: dict[str, float | None]

    def why(self) -> str:
        parts = ", ".join(f"{d} {'-' if t is None else f'{t * 1e6:.1f} µs'}" for d, t in self.times.items())
        note = " (an offloaded region: CPU only)" if self.unit.cpu_only else \
            " (a GPU backend's region: GPU only)" if self.unit.gpu_only else ""
        return f"{self.unit}: {self.chosen}: {parts}{note}"


@dataclass
class DeviceReport:
    """What the device level measured and decided (``TuneReport.devices``)."""

    devices: tuple[str, ...]
    source: str = ""  # "a given cost table" / "measured on this machine"
    decisions: list[DeviceDecision] = field(default_factory=list)
    modelled_s: dict[str, float] = field(default_factory=dict)  # plan -> modelled seconds (units + copies)
    copies: int = 0  # copies per call in the chosen placement
    skipped: str = ""  # why the level did not run
    notes: list[str] = field(default_factory=list)

    @property
    def placement(self) -> dict[str, str]:
        return {d.unit.name: d.chosen for d in self.decisions}

    def lines(self) -> list[str]:
        if self.skipped:
            return [f"  devices: among {', '.join(self.devices)}: skipped: {self.skipped}"]
        lines = [f"  devices: among {', '.join(self.devices)}, costs from {self.source}"]
        lines += [f"    {d.why()}" for d in self.decisions if len([t for t in d.times.values() if t is not None]) > 1]
        plans = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in self.modelled_s.items())
        lines.append(f"    modelled (units + copies): {plans}; {self.copies} copies per call in the chosen plan")
        lines += [f"    note: {n}" for n in self.notes]
        return lines


def device_problem(units: Sequence[DeviceUnit], sizes: Mapping[str, int], inputs: Sequence[str],
                   outputs: Sequence[str], devices: Sequence[str], measurer: Measurer
                   ) -> tuple[Problem, list[DeviceDecision]]:
    """The solver's problem: per unit one choice per device it runs on, copies from the measurer's
    links (``latency + bytes / bandwidth``), model inputs and outputs on the first device."""
    decisions, regions = [], []
    for unit in units:
        times = {d: (measurer.time(unit, d) if unit.runs_on(d) else None) for d in devices}
        choices = [Choice(d, d, t) for d, t in times.items() if t is not None]
        if not choices:
            raise PlacementError(f"tune: {unit} runs on none of the devices {list(devices)}")
        decisions.append(DeviceDecision(unit, choices[0].device, times))
        regions.append(Region(unit.name, choices, unit.inputs, unit.outputs))
    pairs = [(a, b) for a in devices for b in devices if a < b]
    links = {p: measurer.link(*p) for p in pairs}
    copy = linear_copy_cost({p: lat for p, (lat, _) in links.items()}, {p: bw for p, (_, bw) in links.items()})
    return Problem(regions, dict(sizes), copy, list(inputs), list(outputs), input_device=devices[0],
                   inputs_follow_first_reader=True), decisions


def count_copies(problem: Problem, placement: Mapping[str, str]) -> int:
    """Copies per call a placement implies, as the solver counts them (:func:`.solver.plan_copies`)."""
    from .solver import plan_copies

    chosen = {r.name: next(c for c in r.choices if c.device == placement[r.name]) for r in problem.regions}
    return len(plan_copies(problem, chosen))


def apply_placement(partitioned: tvm.IRModule, units: Sequence[DeviceUnit], placement: Mapping[str, str],
                    fallback: str) -> tvm.IRModule:
    """``partitioned`` placed by :func:`byoc_hetero.place`: each unit (by its call) on its device;
    ``fallback`` is device 0 (the model's inputs as the caller gives them, the constants)."""
    from ..placement import place
    from ..placement._ir import key

    device_of = {u.call: placement[u.name] for u in units}
    # a rule for every device, the fallback's too: a call no rule names follows its inputs' device
    rules = [(lambda s, d=d: s.function == "main" and device_of.get(key(s.call)) == d, d)
             for d in sorted(set(placement.values()))]
    devices = [fallback, *sorted(set(placement.values()) - {fallback})]
    return place(partitioned, rules, fallback=fallback, devices=devices)


def one_call_module(partitioned: tvm.IRModule, unit: DeviceUnit) -> tvm.IRModule:
    """``partitioned`` whose ``main`` is the unit's call alone (its free variables the parameters;
    the regions, their external modules and constants kept): what :class:`GpuMeasurer` times."""
    from ..placement._ir import key

    binding = next(b for block in partitioned["main"].body.blocks for b in block.bindings
                   if isinstance(b.value, relax.Call) and key(b.value) == unit.call)
    params = list(relax.analysis.free_vars(binding.value))
    out = relax.Var(binding.var.name, binding.var.ty)
    body = relax.SeqExpr([relax.BindingBlock([relax.VarBinding(out, binding.value)])], out)
    mod = partitioned.clone()
    mod["main"] = relax.Function(params, body, binding.var.ty).with_attr("global_symbol", "main")
    return mod


class GpuMeasurer:
    """Costs measured on this machine (:class:`Measurer`; needs the GPUs it is asked about): each
    unit alone (:func:`one_call_module`) placed on the device with :func:`byoc_hetero.place`,
    compiled (:func:`byoc_hetero.placement.compile`), its inputs already on the device, timed with
    :func:`.measure.time_call`; a copy timed at 4 KiB and 16 MiB, fitted as latency + bytes / bandwidth."""

    def __init__(self, partitioned: tvm.IRModule, repeat: int = 15):
        self.partitioned, self.repeat = partitioned, repeat

    def time(self, unit: DeviceUnit, device: str) -> float | None:
        from ..placement import compile as compile_placed
        from ..placement import parse_device, place, vm
        from ..errors import first_line
        from .measure import time_call

        dev = parse_device(device)
        try:
            placed = place(one_call_module(self.partitioned, unit), {}, fallback=device)
            machine = vm(compile_placed(placed))
        except (PlacementError, RuntimeError, ValueError) as err:  # an op TVM cannot compile for the device
            unit.what += f" (not on {device}: {first_line(err)})"
            return None
        rng = np.random.default_rng(0)
        args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape.values])
                                   .astype(str(p.ty.dtype)), device=dev.runtime_device())
                for p in placed["main"].params if isinstance(p.ty, relax.TensorType)]
        fn = machine["main"]
        return time_call(lambda: fn(*args), warmup=3, repeat=self.repeat).median_s

    def link(self, src: str, dst: str) -> tuple[float, float]:
        from ..placement import parse_device
        from .measure import time_call

        a, b = parse_device(src).runtime_device(), parse_device(dst).runtime_device()
        times = []
        for n in (4096, 16 << 20):
            host = tvm.runtime.tensor(np.zeros(n, "uint8"), device=a)
            there = tvm.runtime.empty((n,), "uint8", device=b)
            times.append(time_call(lambda: (host.copyto(there), b.sync()), warmup=2, repeat=self.repeat).median_s)
        per_byte = max((times[1] - times[0]) / ((16 << 20) - 4096), 1e-15)
        return max(times[0] - 4096 * per_byte, 0.0), 1.0 / per_byte


def check_devices(devices: Sequence[str]) -> list[str]:
    """The devices as ``kind:index`` strings, the first CPU first (the model's inputs live there);
    :class:`PlacementError` for an unknown device or none on a CPU."""
    from ..placement import parse_device

    names = list(dict.fromkeys(str(parse_device(d)) for d in devices))
    cpus = [d for d in names if d.startswith("cpu")]
    if not cpus:
        raise PlacementError(f"tune: devices {list(devices)} name no CPU; the model's inputs and outputs and the "
                             "offloaded regions live on one: add 'cpu'")
    return [cpus[0]] + [d for d in names if d != cpus[0]]


def _modelled(problem: Problem, device: str) -> float | None:
    """The modelled time of everything on ``device`` where it can run (the rest on the CPU)."""
    from .solver import plan_cost

    chosen = {r.name: next((c for c in r.choices if c.device == device), r.choices[0]) for r in problem.regions}
    return plan_cost(problem, chosen)[0]


def tune_devices(partitioned: tvm.IRModule, devices: Sequence[str], measurer: Measurer | None = None, *,
                 budget_s: float | None = None,
                 progress: Callable[[str, int, int, str], None] | None = None) -> tuple[tvm.IRModule, DeviceReport]:
    """The device level (module docstring): ``partitioned`` placed on ``devices`` where the
    measured (or given, ``measurer``) costs say it pays, and the report. Without a GPU of
    ``devices`` on this machine and without a ``measurer``, the level is skipped: ``partitioned``
    comes back unplaced and the report says why."""
    from ..placement import parse_device

    names = check_devices(devices)
    report = DeviceReport(tuple(names))
    gpus = [d for d in names if not d.startswith("cpu")]
    if measurer is None:
        missing = [d for d in gpus if not parse_device(d).runtime_device().exist]
        if missing:
            report.skipped = (f"no {', '.join(missing)} on this machine: everything stays on {names[0]} (a cost "
                              "table, device_costs=, decides without one)")
            return partitioned, report
        measurer, report.source = GpuMeasurer(partitioned), "measurements on this machine"
    else:
        report.source = "the given cost table" if isinstance(measurer, CostTable) else type(measurer).__name__
    units, sizes, inputs, outputs = device_units(partitioned)
    if progress:
        progress("devices", 0, 1, f"{len(units)} calls on {', '.join(names)}")
    problem, report.decisions = device_problem(units, sizes, inputs, outputs, names, measurer)
    solution = solve(problem, None, budget_s)
    placement = {name: c.device for name, c in solution.choices.items()}
    for d in report.decisions:
        d.chosen = placement[d.unit.name]
    report.modelled_s = {"chosen": solution.time_s, **{f"all on {d}": _modelled(problem, d) for d in names}}
    report.copies = count_copies(problem, placement)
    report.notes += solution.notes
    if set(placement.values()) == {names[0]}:
        report.notes.append(f"every call is fastest on {names[0]} once its copies are counted: nothing placed")
        return partitioned, report
    placed = apply_placement(partitioned, units, placement, names[0])
    if isinstance(measurer, GpuMeasurer):  # the devices are here: the placement must be measured faster
        if progress:
            progress("devices", 1, 2, "end to end: placed and unplaced, alternating")
        before, after = end_to_end(partitioned, placed, measurer.repeat)
        report.notes.append(f"end to end: unplaced {before * 1e3:.3f} ms, placed {after * 1e3:.3f} ms")
        if after >= before:
            report.notes.append("the placement was not measured faster end to end: the unplaced module is kept")
            return partitioned, report
    return placed, report


def end_to_end(unplaced: tvm.IRModule, placed: tvm.IRModule, repeat: int, rounds: int = 3) -> tuple[float, float]:
    """Both modules' median seconds per call, timed alternately on random inputs (the model's inputs
    on the CPU, as a caller holds them). Needs the devices ``placed`` uses."""
    from ..placement import compile as compile_placed
    from ..placement import vm
    from .measure import time_alternately

    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype(str(p.ty.dtype))
              for p in unplaced["main"].params]
    plain = relax.VirtualMachine(relax.build(unplaced, target="llvm"), tvm.cpu())["main"]
    moved = vm(compile_placed(placed))["main"]
    args = [tvm.runtime.tensor(x) for x in inputs]
    t = time_alternately([lambda: plain(*args), lambda: moved(*args)], rounds, repeat)
    return t[0].median_s, t[1].median_s
