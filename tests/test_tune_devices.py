"""The device level of ``bh.tune``: skipped without a GPU, decided from an injected cost table.

No GPU here (nor in CI): the placed modules are checked as placement's own tests check CUDA
placements on a CPU machine — which calls carry which device, which values are copied, and that
the module compiles with CUDA kernels for exactly the calls placed there.
"""

from __future__ import annotations

import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.placement import compile as compile_placed
from byoc_hetero.placement import gpu_sources, placement_report
from byoc_hetero.tune.devices import CostTable, DeviceUnit, device_problem, device_units, tune_devices
from byoc_hetero.tune.solver import plan_cost

HAS_GPU = tvm.cuda(0).exist
FAST_LINK = {("cpu:0", "cuda:0"): (1e-6, 1e10)}  # 1 µs + 0.1 ns per byte
SLOW_LINK = {("cpu:0", "cuda:0"): (1e-2, 1e10)}  # 10 ms per copy: nothing is worth moving


def _sin_net():
    from test_placement import sin_net

    mod, params, *_ = sin_net()
    return mod, params, bh.partition(mod, params)


def _on_cuda(placed):
    """Variables of ``main`` bound to a computation (not a copy) whose value lives on the GPU."""
    from byoc_hetero.placement._ir import vdevices_in

    out = set()
    for block in placed["main"].body.blocks:
        for b in block.bindings:
            if getattr(getattr(b.value, "op", None), "name", "") == "relax.to_vdevice":
                continue
            vds = vdevices_in(b.var.ty)
            if vds and all(vd.target.kind.name == "cuda" for vd in vds):
                out.add(b.var.name)
    return out


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present: the level is measured, not skipped")
def test_without_a_gpu_the_device_level_is_skipped_with_a_note():
    mod, params = bh.models.mlp()
    m, report = bh.tune(mod, params, devices=("cpu", "cuda"), repeat=3, guard_rounds=1)
    assert report.devices.skipped.startswith("no cuda:0 on this machine")
    assert "devices: among cpu:0, cuda:0: skipped: no cuda:0" in str(report)
    assert "vdevice" not in m.global_infos  # nothing placed: the CPU levels' module as it was


def test_a_call_goes_to_cuda_only_where_its_saving_beats_the_copies():
    _, _, part = _sin_net()
    units, sizes, inputs, outputs = device_units(part)
    sins = [u.name for u in units if u.what == "relax.sin"]
    assert len(sins) == 2 and all(u.cpu_only for u in units if u.what.startswith("region"))
    assert inputs == ["data"] and sizes["data"] == 3 * 8 * 8 * 4
    # the first sin saves 1 ms on cuda, the second only 1 µs: with cheap copies (2 x ~1.2 µs) only
    # the first pays; oneDNN regions have no cuda time (a CPU runtime)
    times = {u.name: {"cpu:0": 1e-3} for u in units}
    times[sins[0]]["cuda:0"], times[sins[1]]["cuda:0"] = 1e-6, 1e-3 - 1e-6
    placed, rep = tune_devices(part, ["cpu", "cuda"], CostTable(times, FAST_LINK))
    assert rep.placement == {u.name: ("cuda:0" if u.name == sins[0] else "cpu:0") for u in units}
    assert rep.copies == 2 and rep.modelled_s["chosen"] < min(rep.modelled_s["all on cpu:0"],
                                                              rep.modelled_s["all on cuda:0"])
    assert _on_cuda(placed) == {sins[0]}
    report = placement_report(placed)
    assert report.copies_per_run == 2  # its input there and its output back: the count the solver modelled
    assert dict(report.ops["cuda:0"]) == {"relax.sin": 1}
    kernels = gpu_sources(compile_placed(placed))["cuda"]
    assert "sin" in kernels and "conv" not in kernels
    # copies that cost more than any saving: everything stays, nothing is placed
    unplaced, rep = tune_devices(part, ["cpu", "cuda"], CostTable(times, SLOW_LINK))
    assert set(rep.placement.values()) == {"cpu:0"} and unplaced is part and "nothing placed" in rep.notes[-1]
    assert any("cpu:0 1000.0 µs, cuda:0 1.0 µs" in line for line in rep.lines())


def _fork(first=relax.op.exp):
    """x -> exp, x -> sin, x -> cos (three readers of x, ``first`` first), then add them: the
    shared-input case of seed 004."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            others = [f for f in (relax.op.exp, relax.op.sin, relax.op.cos) if f is not first]
            a, b, c = (bb.emit(f(x)) for f in (first, *others))
            out = bb.emit_output(bb.emit(relax.op.add(bb.emit(relax.op.add(a, b)), c)))
        bb.emit_func_output(out)
    return bb.get()


def test_an_input_read_on_two_devices_is_copied_once():
    mod = _fork()
    units, sizes, inputs, outputs = device_units(mod)
    assert [u.what for u in units] == ["relax.exp", "relax.sin", "relax.cos", "relax.add", "relax.add"]
    exp, sin, cos, add1, add2 = (u.name for u in units)
    fast_on_gpu = {"cpu:0": 1e-3, "cuda:0": 1e-5}
    table = CostTable({sin: fast_on_gpu, cos: fast_on_gpu, exp: {"cpu:0": 1e-5},  # exp: CPU only here
                       add1: {"cpu:0": 1e-5}, add2: {"cpu:0": 1e-5}}, FAST_LINK)
    placed, rep = tune_devices(mod, ["cpu", "cuda"], table)
    assert rep.placement == {sin: "cuda:0", cos: "cuda:0", exp: "cpu:0", add1: "cpu:0", add2: "cpu:0"}
    # x (first read by exp, on the CPU: it stays there) copied once to the GPU for its two readers
    # there, sin's and cos's results back: 3 copies
    copy = lambda n: 1e-6 + n / 1e10  # noqa: E731
    assert rep.copies == 3 and rep.modelled_s["chosen"] == pytest.approx(
        2e-5 + 3e-5 + copy(sizes["x"]) + copy(sizes[sin]) + copy(sizes[cos]), rel=1e-9)
    copies = placement_report(placed).copies
    assert sorted((c.value, c.src, c.dst) for c in copies if c.value == "x") == [("x", "cpu:0", "cuda:0")]
    assert len(copies) == 3 and _on_cuda(placed) == {sin, cos}
    kernels = gpu_sources(compile_placed(placed))["cuda"]
    assert "sin" in kernels and "cos" in kernels and "exp" not in kernels


def test_an_input_whose_first_reader_is_on_the_gpu_lives_there():
    """bh.place gives a parameter its first consumer's device (the VM moves it there when called):
    the solver counts that move and the copy back for a later CPU reader, as the placed module does."""
    mod = _fork(first=relax.op.sin)
    units, sizes, *_ = device_units(mod)
    sin, exp, cos, add1, add2 = (u.name for u in units)
    fast_on_gpu = {"cpu:0": 1e-3, "cuda:0": 1e-5}
    table = CostTable({sin: fast_on_gpu, cos: fast_on_gpu, exp: {"cpu:0": 1e-5}, add1: {"cpu:0": 1e-5},
                       add2: {"cpu:0": 1e-5}}, FAST_LINK)
    placed, rep = tune_devices(mod, ["cpu", "cuda"], table)
    assert rep.placement[sin] == rep.placement[cos] == "cuda:0"
    assert rep.copies == 4  # x to the GPU at the call, x back for exp, sin's and cos's results back
    assert [p.ty.vdevice.target.kind.name for p in placed["main"].params] == ["cuda"]
    copies = placement_report(placed).copies  # the copies inside main (the call's move is the VM's)
    assert "x" in [c.value for c in copies if c.src == "cuda:0" and c.dst == "cpu:0"] and len(copies) == 3


class _ByOp:
    """A measurer object (the :class:`Measurer` protocol): TVM's sin is 100x faster on cuda."""

    def time(self, unit: DeviceUnit, device: str):
        if unit.cpu_only:
            return 1e-4 if device == "cpu:0" else None
        return 1e-5 if device == "cuda:0" and unit.what == "relax.sin" else 1e-3

    def link(self, src, dst):
        return 1e-6, 1e10


def test_tune_places_its_module_from_a_measurer_object(monkeypatch):
    # the device level alone: the codegen level's own timings (tiny regions, offloaded or llvm within
    # noise on a busy machine) could move a region to llvm and change which calls there are to place
    from byoc_hetero.tune import levels
    from byoc_hetero.tune.codegen import CodegenPlan

    monkeypatch.setattr(levels, "tune_codegen", lambda *args, **kwargs: CodegenPlan())
    mod, params, part = _sin_net()
    m, report = bh.tune(mod, params, devices=("cpu", "cuda"), device_costs=_ByOp(), repeat=3, guard_rounds=1)
    rep = report.devices
    sins = [u for u in device_units(part)[0] if u.what == "relax.sin"]
    assert rep.source == "_ByOp" and {d.unit.what: d.chosen for d in rep.decisions}["relax.sin"] == "cuda:0"
    assert len(_on_cuda(m)) == len(sins) == 2
    assert set(placement_report(m).regions) == {"cpu:0"}  # the oneDNN regions stay on the CPU
    assert dict(placement_report(m).ops["cuda:0"]) == {"relax.sin": 2}
    assert "devices: among cpu:0, cuda:0, costs from _ByOp" in str(report)
    # the modelled time is the solver's cost of the placement it returned
    problem, _ = device_problem(*device_units(part), ["cpu:0", "cuda:0"], _ByOp())
    chosen = {r.name: next(c for c in r.choices if c.device == rep.placement[r.name]) for r in problem.regions}
    assert plan_cost(problem, chosen)[0] == pytest.approx(rep.modelled_s["chosen"])


def test_the_measurer_times_each_call_alone_on_a_device():
    """GpuMeasurer's path, run on CPU devices here (the same placement and compile a GPU gets): a
    call alone computes what it computes in the model, and every call and the link get a time."""
    import numpy as np

    from byoc_hetero.tune.devices import GpuMeasurer, one_call_module  # noqa: I001

    _, _, part = _sin_net()
    units = device_units(part)[0]
    sin = next(u for u in units if u.what == "relax.sin")
    alone = one_call_module(part, sin)
    x = np.random.default_rng(0).standard_normal([int(d) for d in alone["main"].params[0].ty.shape.values])
    vm = relax.VirtualMachine(relax.build(alone, target="llvm"), tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x.astype("float32"))).numpy(), np.sin(x),
                               rtol=1e-5, atol=1e-6)
    measurer = GpuMeasurer(part, repeat=2)
    assert all(measurer.time(u, "cpu:0") > 0 for u in units)  # regions (with their constants) too
    latency, bandwidth = measurer.link("cpu:0", "cpu:1")
    assert latency >= 0 and bandwidth > 0
    # the end-to-end check a measured placement gets (here the sins on a second CPU device)
    from byoc_hetero.tune.devices import apply_placement, end_to_end

    placed = apply_placement(part, units, {u.name: "cpu:1" if u is sin else "cpu:0" for u in units}, "cpu:0")
    assert dict(placement_report(placed).ops["cpu:1"]) == {"relax.sin": 1}
    assert all(t > 0 for t in end_to_end(part, placed, repeat=2, rounds=1))
