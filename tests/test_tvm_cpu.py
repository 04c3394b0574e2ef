"""Backend tvm_cpu (TVM's own code, scheduled for this CPU) and the scheduled llvm fallback
(``bh.build``): outputs against the llvm-only build of stock ``relax.build``."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx

import byoc_hetero as bh
from byoc_hetero.backends import tvm_cpu
from byoc_hetero.backends.tvm_cpu.schedule import cpu_pipeline, host_target
from byoc_hetero.timing import random_inputs, relative_error

from conftest import graph, run_exported_in_fresh_process

TOLERANCE = 1e-5


def _outputs(ex, inputs):
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return [out.numpy()] if isinstance(out, tvm.runtime.Tensor) else [o.numpy() for o in out]


def _regions(mod):
    return [str(f.attrs["global_symbol"]) for _, f in mod.functions_items()
            if isinstance(f, relax.Function) and f.attrs is not None and f.attrs.get("Codegen") == "tvm_cpu"]


def _on_tvm_cpu(mod, inputs=None):
    """Partition ``mod`` for tvm_cpu alone (cost gate's heavy-op rule off), build, and compare with
    the llvm-only build; returns the partitioned module."""
    inputs = inputs if inputs is not None else random_inputs(mod)
    merged = mod
    for stage in bh.stages("tvm_cpu", 1, False)[:3]:
        merged = stage(merged)
    assert _regions(merged), f"nothing went to tvm_cpu: {bh.rules.rejections(merged)}"
    part = bh.partition(mod, target="tvm_cpu", require_heavy_op=False)
    assert _regions_of(part) >= 1
    got = _outputs(relax.build(part, target="llvm"), inputs)
    want = _outputs(relax.build(mod, target="llvm"), inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert relative_error(g, w) <= TOLERANCE, relative_error(g, w)
    return part


def test_registered_through_the_public_api():
    backend = bh.rules.get_target("tvm-cpu")
    assert backend is bh.rules.get_target("tvm_cpu") is tvm_cpu.BACKEND
    assert tvm.get_global_func("relax.ext.tvm_cpu", allow_missing=True) is not None
    assert "relax.permute_dims" in bh.rules.op_rule_ops("tvm_cpu")


def test_elementwise_chain():
    _on_tvm_cpu(graph({"x": (4, 64, 96)}, lambda emit, x: relax.op.sigmoid(
        emit(relax.op.add(emit(relax.op.multiply(emit(relax.op.exp(x)), relax.const(0.5))), x)))))


def test_concat_of_a_tuple():
    _on_tvm_cpu(graph({"x": (2, 7, 96), "y": (2, 5, 96)}, lambda emit, x, y: relax.op.sin(
        emit(relax.op.concat([x, y], axis=1)))))


def test_transpose_and_reshape():
    # a window partition as Swin spells it: reshape, permute, reshape
    def body(emit, x):
        a = emit(relax.op.reshape(x, (1, 2, 7, 2, 7, 96)))
        b = emit(relax.op.permute_dims(a, [0, 1, 3, 2, 4, 5]))
        return relax.op.reshape(b, (4, 49, 96))

    _on_tvm_cpu(graph({"x": (1, 14, 14, 96)}, body))


def test_strided_slice():
    _on_tvm_cpu(graph({"x": (2, 14, 14, 96)}, lambda emit, x: relax.op.strided_slice(
        x, axes=[1, 2], begin=[3, 1], end=[14, 13], strides=[1, 2])))


def test_roll_as_scatter_nd_and_where():
    """A roll by 3 along axis 1 spelled with scatter_nd (rows moved to their rolled index) and
    a where choosing between two shifted copies."""
    n = 14
    idx = np.array([[(i + 3) % n] for i in range(n)], dtype="int64")
    x = relax.Var("x", relax.TensorType((n, 96), "float32"))
    z = relax.Var("z", relax.TensorType((n, 96), "float32"))
    i = relax.Var("i", relax.TensorType((n, 1), "int64"))
    c = relax.Var("c", relax.TensorType((n, 96), "bool"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, z, i, c]):
        with bb.dataflow():
            rolled = bb.emit(relax.op.scatter_nd(z, i, x))
            shifted = bb.emit(relax.op.strided_slice(rolled, axes=[0], begin=[0], end=[n]))
            out = bb.emit_output(relax.op.where(c, shifted, x))
        bb.emit_func_output(out)
    mod = bb.get()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((n, 96)).astype("float32"), np.zeros((n, 96), "float32"), idx,
              rng.random((n, 96)) > 0.5]
    part = _on_tvm_cpu(mod, inputs)
    want = np.where(inputs[3], np.roll(inputs[0], 3, axis=0), inputs[0])
    got = _outputs(relax.build(part, target="llvm"), inputs)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=0)


def test_torch_roll_by_the_default_exporter_on_the_scheduled_fallback():
    """torch.roll as the default exporter spells it (a take of constant rolled indices per axis)
    stays on llvm (the tvm_cpu backend takes no constant tensors, and says so); bh.build schedules
    it there, and the result is numpy's roll."""
    torch = pytest.importorskip("torch")

    class Roll(torch.nn.Module):
        def forward(self, x):
            return torch.roll(x, shifts=(-3, -3), dims=(1, 2)) * 2.0

    x = np.random.default_rng(1).standard_normal((1, 14, 14, 32)).astype("float32")
    mod, params = bh.from_torch(Roll(), (torch.from_numpy(x),))
    part = bh.partition(mod, params, target="tvm_cpu", require_heavy_op=False)
    reasons = [r.reason for r in bh.rules.rejections(part) if r.op == "relax.take"]
    assert reasons and all("constant argument" in r for r in reasons)
    want = np.roll(x, (-3, -3), axis=(1, 2)) * 2.0
    for ex in (bh.build(part), relax.build(part, target="llvm")):
        np.testing.assert_allclose(_outputs(ex, [x])[0], want, rtol=1e-6, atol=0)


def _regions_of(part):
    """How many region calls RunCodegen left in ``main``."""
    return str(part["main"]).count("R.call_dps_packed(")


def test_reductions():
    _on_tvm_cpu(graph({"x": (8, 96, 49)}, lambda emit, x: relax.op.add(
        emit(relax.op.sum(x, axis=[2], keepdims=True)), emit(relax.op.max(x, axis=[2], keepdims=True)))))
    _on_tvm_cpu(graph({"x": (8, 96, 49)}, lambda emit, x: relax.op.mean(x, axis=[1])))


def test_softmax_and_layer_norm_with_input_weights():
    _on_tvm_cpu(graph({"x": (4, 3, 49, 49)}, lambda emit, x: relax.op.nn.softmax(x, axis=-1)))

    def norm(emit, x, g, b):
        return relax.op.nn.layer_norm(x, g, b, axes=[-1])

    bb_mod = graph({"x": (2, 49, 96), "g": (96,), "b": (96,)}, norm)
    _on_tvm_cpu(bb_mod)


def test_constant_tensor_argument_stays_on_llvm_with_the_reason():
    w = np.arange(96, dtype="float32")
    mod = graph({"x": (2, 96)}, lambda emit, x: relax.op.add(x, relax.const(w)))
    merged = mod
    for stage in bh.stages("tvm_cpu", 1, False)[:3]:
        merged = stage(merged)
    assert not _regions(merged)
    reasons = [r.reason for r in bh.rules.rejections(merged) if r.op == "relax.add"]
    assert reasons and "constant argument of shape [96]" in reasons[0]


def test_exported_library_runs_in_a_fresh_process(tmp_path):
    mod = graph({"x": (2, 14, 14, 96)}, lambda emit, x: relax.op.nn.softmax(
        emit(relax.op.permute_dims(x, [0, 3, 1, 2])), axis=-1))
    part = bh.partition(mod, target="tvm_cpu", require_heavy_op=False)
    x = random_inputs(mod)[0]
    got = run_exported_in_fresh_process(relax.build(part, target="llvm"), x, tmp_path)
    want = _outputs(relax.build(mod, target="llvm"), [x])[0]
    assert relative_error(got, want) <= TOLERANCE


def _loop_kinds(mod: tvm.IRModule) -> set:
    kinds = set()
    for _, f in mod.functions_items():
        if isinstance(f, tirx.PrimFunc):
            tvm_ffi.structural_walk(f.body, [(tirx.For, lambda n: kinds.add(n.kind))], order="post")
    return kinds


def test_llvm_fallback_scheduled_by_bh_build():
    """What stays on llvm: bh.build's pipeline gives its PrimFuncs parallel and vectorized loops
    (the threads TVM's runtime launches), and the outputs equal stock relax.build's."""
    def body(emit, x):
        a = emit(relax.op.permute_dims(x, [0, 3, 1, 2]))
        b = emit(relax.op.nn.softmax(a, axis=-1))
        return relax.op.add(emit(relax.op.sum(b, axis=[1])), emit(relax.op.exp(emit(relax.op.max(a, axis=[1])))))

    mod = graph({"x": (2, 28, 28, 96)}, body)
    lowered = cpu_pipeline(host_target())(mod)
    kinds = _loop_kinds(lowered)
    assert tirx.ForKind.PARALLEL in kinds and tirx.ForKind.VECTORIZED in kinds
    plain = tvm.relax.backend.cpu_generic.get_default_pipeline(host_target())(mod)
    assert tirx.ForKind.PARALLEL not in _loop_kinds(plain)
    inputs = random_inputs(mod)
    got = _outputs(bh.build(mod), inputs)[0]
    want = _outputs(relax.build(mod, target="llvm"), inputs)[0]
    assert relative_error(got, want) <= TOLERANCE


def test_tuner_measures_tvm_cpu_per_region_and_applies_its_decisions(tmp_path):
    """The codegen level with targets onednn and tvm_cpu: the matmul region (a constant weight:
    oneDNN's, which tvm_cpu cannot take) and the flip / tile / log_softmax region oneDNN refuses
    (tvm_cpu's) are each timed on their backends and on plain llvm; the returned module is the one
    the decisions make, and its outputs equal the llvm-only build's."""
    w = np.random.default_rng(2).standard_normal((96, 96)).astype("float32") / 10

    def body(emit, x):
        d = emit(relax.op.nn.relu(emit(relax.op.matmul(x, relax.const(w)))))
        f = emit(relax.op.flip(d, 1))
        t = emit(relax.op.tile(f, [1, 2, 1]))
        return relax.op.nn.log_softmax(t, axis=-1)

    mod = graph({"x": (4, 196, 96)}, body)
    targets = ["onednn", "tvm_cpu"]
    tuned, rep = bh.tune(mod, targets=targets, cache=str(tmp_path / "cache.json"), repeat=6, guard_rounds=1)
    by_target = {d.region.target: d for d in rep.codegen.decisions}
    assert set(by_target) == {"onednn", "tvm_cpu"}, rep
    assert {"tvm_cpu", "llvm"} <= set(by_target["tvm_cpu"].timings), rep
    assert "takes 1 of its 2 ops" in by_target["onednn"].unable["tvm_cpu"]  # not the matmul of a constant
    for d in rep.codegen.decisions:
        assert d.chosen in d.timings and d.chosen in ("onednn", "tvm_cpu", "llvm")
    applied = bh.partition(mod, target=targets, region_codegen=rep.codegen.region_codegen)
    kinds = sorted(str(m.kind) for m in applied.attrs["external_mods"])
    assert ("llvm" in kinds) == (by_target["tvm_cpu"].chosen == "tvm_cpu"), (kinds, rep)
    expected = applied if rep.kept == "tuned" else bh.partition(mod, target=targets)
    assert tvm_ffi.structural_equal(tuned["main"], expected["main"], map_free_vars=True), rep
    inputs = random_inputs(mod)
    want = _outputs(relax.build(mod, target="llvm"), inputs)[0]
    for module in (tuned, applied):
        assert relative_error(_outputs(relax.build(module, target="llvm"), inputs)[0], want) <= 1e-4


FAST = {"tvm_cpu": {"fast_math": True}}


def _region_ir(part) -> str:
    """The LLVM IR of the tvm_cpu region module a partition carries."""
    (module,) = [m for m in part.attrs["external_mods"] if str(m.kind) == "llvm"]
    return module.inspect_source("ll")


def test_fast_math_option_is_declared_checked_and_documented():
    """The option as the backend declares it, its check, and docs/backends.md's table of it."""
    backend = tvm_cpu.BACKEND
    assert backend.check_options({"fast_math": "on"}) == {"fast_math": True}
    assert backend.check_options({"fast_math": 0}) == {"fast_math": False}
    for bad in ("maybe", 2, 0.5, None):
        with pytest.raises(bh.RuleError, match="tvm_cpu option fast_math: expected true or false"):
            backend.check_options({"fast_math": bad})
    text = (Path(__file__).resolve().parents[1] / "docs" / "backends.md").read_text()
    heading = "### Every option of the `tvm_cpu` backend"
    assert heading in text, "docs/backends.md lost the tvm_cpu options table"
    table = text[text.index(heading):].split("\n\n")[2]  # heading, its sentence, the table
    rows = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert {r[0]: r[1] for r in rows} == {n: str(o.default) for n, o in backend.options.items()}


MS = {"tvm_cpu": {"schedule": "meta_schedule"}}


@pytest.fixture
def small_search(monkeypatch):
    """MetaSchedule's search kept small (4 candidates, 60 s), this process's records emptied before and after;
    skipped with the reason where this TVM cannot run the route."""
    why = tvm_cpu.meta_schedule.unavailable()
    if why:
        pytest.skip(why)
    monkeypatch.setattr(tvm_cpu.meta_schedule, "TRIALS", 4)
    monkeypatch.setattr(tvm_cpu.meta_schedule, "SECONDS", 60.0)
    tvm_cpu.meta_schedule.forget()
    yield tvm_cpu.meta_schedule
    tvm_cpu.meta_schedule.forget()


def _code(part) -> str:
    """The region module's LLVM IR without the addresses its metadata names (they differ between builds)."""
    return re.sub(r'"0x[0-9a-f]+"', '"0x"', _region_ir(part))


def _no_search(*_args, **_kwargs):
    raise AssertionError("MetaSchedule searched where a stored record should have been replayed")


def test_schedule_option_is_checked():
    """schedule: dlight (the default) or meta_schedule; anything else names the values."""
    backend = tvm_cpu.BACKEND
    assert backend.options["schedule"].default == "dlight"
    assert backend.check_options({"schedule": "dlight"}) == {"schedule": "dlight"}
    with pytest.raises(bh.RuleError, match="expected one of dlight, meta_schedule, got 'ansor'"):
        backend.check_options({"schedule": "ansor"})
    assert backend.options["schedule"].tune.values == ("dlight", "meta_schedule")


def test_meta_schedule_searches_a_region_and_replays_its_record(small_search, monkeypatch):
    """schedule="meta_schedule": the region's PrimFunc searched by MetaSchedule (a record with its timed
    candidates and a trace that samples MetaSchedule's space), outputs equal to the llvm-only build's; a second
    partition replays the record without searching and compiles the same code."""
    mod = graph({"x": (64, 256)}, lambda emit, v: relax.op.nn.softmax(emit(relax.op.exp(v)), axis=-1))
    part = bh.partition(mod, target="tvm_cpu", require_heavy_op=False, options=MS)
    (record,) = small_search.stored().values()  # one region, one search
    assert 1 <= record.trials <= 4 and 0 < record.median_s < 1, record
    assert any(inst[0] == "SampleCategorical" for inst in record.trace[0]), record.trace
    inputs = random_inputs(mod)
    want = _outputs(relax.build(mod, target="llvm"), inputs)[0]
    assert relative_error(_outputs(relax.build(part, target="llvm"), inputs)[0], want) <= TOLERANCE
    monkeypatch.setattr(small_search, "search", _no_search)
    again = bh.partition(mod, target="tvm_cpu", require_heavy_op=False, options=MS)
    assert _code(again) == _code(part)


def test_meta_schedule_search_stops_at_its_time_budget(small_search, monkeypatch):
    """With no time left (meta_schedule.SECONDS 0) no candidate is built: the search finds nothing, nothing is
    stored, and the region compiles to the fixed rules' code."""
    monkeypatch.setattr(small_search, "SECONDS", 0.0)
    mod = graph({"x": (64, 256)}, lambda emit, v: relax.op.exp(v))
    part = bh.partition(mod, target="tvm_cpu", require_heavy_op=False, options=MS)
    assert small_search.stored() == {}
    assert _code(part) == _code(bh.partition(mod, target="tvm_cpu", require_heavy_op=False))


def test_meta_schedule_search_stops_at_the_tunes_budget(small_search, tmp_path):
    """Inside a bh.tune whose budget_s is spent (the active deadline passed), the search builds nothing although
    its own SECONDS are left: nothing stored, the fixed rules' code."""
    import time

    from byoc_hetero.tune.cache import TimingCache, active, active_deadline

    mod = graph({"x": (64, 256)}, lambda emit, v: relax.op.exp(v))
    assert active_deadline() is None
    with active(TimingCache(tmp_path / "c.json"), deadline=time.monotonic() - 1.0):
        part = bh.partition(mod, target="tvm_cpu", require_heavy_op=False, options=MS)
    assert active_deadline() is None
    assert small_search.stored() == {}
    assert _code(part) == _code(bh.partition(mod, target="tvm_cpu", require_heavy_op=False))


def test_meta_schedule_record_replays_a_tiled_matmul(small_search):
    """A matmul's search samples tile sizes; its record (the trace as plain JSON) replays into the same PrimFunc
    each time, which computes the product (numpy's, float64); the PrimFunc searched is left unchanged."""
    from tvm import te

    a, b = te.placeholder((64, 48), name="a"), te.placeholder((48, 32), name="b")
    k = te.reduce_axis((0, 48), name="k")
    matmul = te.create_prim_func([a, b, te.compute((64, 32), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k))])
    target, before = host_target(), matmul.script()
    record = small_search.search(matmul, target, trials=3)
    assert record is not None and record.trials >= 1
    assert any(inst[0] == "SamplePerfectTile" for inst in record.trace[0]), record.trace
    replayed = small_search.apply_record(matmul, record)
    assert tvm_ffi.structural_equal(replayed, small_search.apply_record(matmul, record))
    assert matmul.script() == before  # the search and the replays left the PrimFunc they were given as it was
    x, y = np.random.default_rng(0).standard_normal((64, 48)), np.random.default_rng(1).standard_normal((48, 32))
    f = tvm.tirx.build(tvm.IRModule({"main": replayed}), target=target)
    out = tvm.runtime.tensor(np.zeros((64, 32), "float32"))
    f["main"](tvm.runtime.tensor(x.astype("float32")), tvm.runtime.tensor(y.astype("float32")), out)
    np.testing.assert_allclose(out.numpy(), x @ y, rtol=1e-4, atol=1e-4)


def test_fast_exp_against_float64_with_nan_inf_and_large_inputs():
    """fast_math: exp within fast_math.TOLERANCE (relative, against numpy's float64 exp) over
    float32's normal range, absolute below 1e-37 where exp underflows; NaN stays NaN, +inf and an
    overflowing x give inf, -inf gives 0. The region's LLVM IR calls no scalar exp (it does
    without the option)."""
    normal = np.linspace(-87.0, 88.7, 20001, dtype="float32")
    edges = np.array([np.nan, np.inf, -np.inf, 89.0, 88.5, -87.9, -100.0, 0.0, -0.0, 1e30, -1e30],
                     dtype="float32")
    x = np.concatenate([normal, edges, np.zeros(4, "float32")]).reshape(4, -1)
    mod = graph({"x": x.shape}, lambda emit, v: relax.op.exp(v))
    part = bh.partition(mod, target="tvm_cpu", require_heavy_op=False, options=FAST)
    got = _outputs(relax.build(part, target="llvm"), [x])[0].reshape(-1)
    with np.errstate(over="ignore"):
        want = np.exp(x.reshape(-1).astype("float64"))
    n = normal.size
    assert np.max(np.abs(got[:n] - want[:n]) / want[:n]) <= tvm_cpu.fast_math.TOLERANCE
    nan, inf, minf, over, high, low, lower, zero, mzero, huge, mhuge = got[n:n + edges.size]
    assert np.isnan(nan) and inf == np.inf and minf == 0.0 and over == np.inf and huge == np.inf and mhuge == 0.0
    assert abs(high / want[n + 4] - 1) <= tvm_cpu.fast_math.TOLERANCE
    assert abs(low - want[n + 5]) < 1e-37 and 0.0 <= lower < 1e-37 and zero == mzero == 1.0
    assert "expf" not in _region_ir(part) and "llvm.exp" not in _region_ir(part)
    plain = bh.partition(mod, target="tvm_cpu", require_heavy_op=False)
    assert "expf" in _region_ir(plain) or "llvm.exp" in _region_ir(plain)


def test_fast_softmax_against_numpy_and_nan_rows_stay_nan():
    x = np.random.default_rng(0).standard_normal((6, 49)).astype("float32") * 8
    x[2, 5] = np.nan
    x[4, :10] = -np.inf
    mod = graph({"x": x.shape}, lambda emit, v: relax.op.nn.softmax(v, axis=-1))
    part = bh.partition(mod, target="tvm_cpu", require_heavy_op=False, options=FAST)
    got = _outputs(relax.build(part, target="llvm"), [x])[0]
    x64 = x.astype("float64")
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    want = e / e.sum(axis=-1, keepdims=True)
    assert np.isnan(got[2]).all()
    rows = [0, 1, 3, 4, 5]
    assert not np.isnan(got[rows]).any() and (got[4, :10] == 0).all()
    assert np.max(np.abs(got[rows] - want[rows]) / np.maximum(want[rows], 1e-30)) <= 4 * tvm_cpu.fast_math.TOLERANCE
