"""Declared dim ranges are enforced by the built module itself (issue 16, "Bad input").

``bh.vm``, the CLI and the placement VM check declared ranges before a call (tests/test_symbolic.py);
these tests run the module as a TVM user does: a plain ``relax.VirtualMachine``, also after
``export_library`` / ``load_module`` in a fresh process, and the region modules directly. References:
the llvm-only build of the same imported module, numpy.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero import _C
from byoc_hetero._relax import region_modules, region_table
from byoc_hetero.inputs import dim_ranges
from byoc_hetero.ranges import CHECK_FUNC, region_ranges
from byoc_hetero.timing import build, run

torch = pytest.importorskip("torch")

from test_symbolic import SmallCNN, _export_onnx, _model  # noqa: E402

LO, HI = 2, 6


@pytest.fixture(scope="module")
def cnn_onnx(tmp_path_factory):
    path = tmp_path_factory.mktemp("ranges") / "cnn.onnx"
    return _export_onnx(_model(SmallCNN), torch.randn(2, 3, 32, 32), {0: "N"}, path)


def _import(path: str, cnn_onnx):
    """The CNN with its batch declared in [LO, HI], through one import path."""
    if path == "onnx":
        return bh.from_onnx(cnn_onnx, dim_ranges={"N": (LO, HI)})
    n = torch.export.Dim("N", min=LO, max=HI)
    return bh.from_torch(_model(SmallCNN), (torch.randn(3, 3, 32, 32),), dynamic_shapes=({0: n},))


def _x(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype("float32")


def _call(vm, x):
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _out_of_range(symbol: str, n: int) -> str:
    return rf"main: input 0 \('x'\): dim 0 \({symbol}\) is {n}, outside its declared range \[{LO}, {HI}\]"


@pytest.mark.parametrize("path", ["onnx", "torch"])
def test_raw_vm_checks_declared_batch_range(path, cnn_onnx, tmp_path):
    mod, params = _import(path, cnn_onnx)
    ((symbol, declared),) = dim_ranges(mod["main"]).items()
    assert declared == (LO, HI)
    part = bh.partition(mod, params)
    (entry,) = region_table(part).values()
    assert entry.graph["version"] == 4 and entry.graph["dim_ranges"] == {symbol: [LO, HI]}
    # the check is no op of the model: the whole CNN is still one region, nothing left on llvm
    assert bh.op_profile(part).total("llvm") == 0
    ex = build(part)
    reference = build(bh.bind_params(mod, params))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for n in (LO, 3, HI):
        np.testing.assert_allclose(_call(vm, _x(n)), run(reference, [_x(n)]), rtol=1e-4, atol=1e-4)
    for n in (LO - 1, HI + 1, 64):
        with pytest.raises(bh.InputError, match=_out_of_range(symbol, n)):
            _call(vm, _x(n))
    # the VM is still usable, and the same size after a rejected one is still right
    np.testing.assert_allclose(_call(vm, _x(HI, 1)), run(reference, [_x(HI, 1)]), rtol=1e-4, atol=1e-4)

    # export_library + load_module in a fresh process that only imports byoc_hetero
    lib = tmp_path / "model.so"
    ex.export_library(str(lib))
    np.save(tmp_path / "x.npy", _x(4))
    script = textwrap.dedent(f"""
        import json, numpy as np, tvm
        from tvm import relax
        import byoc_hetero as bh
        vm = relax.VirtualMachine(tvm.runtime.load_module({str(lib)!r}), tvm.cpu())
        np.save({str(tmp_path / "y.npy")!r}, vm["main"](tvm.runtime.tensor(np.load({str(tmp_path / "x.npy")!r}))).numpy())
        errors = []
        for n in ({LO - 1}, {HI + 1}):
            try:
                vm["main"](tvm.runtime.tensor(np.zeros((n, 3, 32, 32), "float32")))
                errors.append(None)
            except bh.InputError as err:
                errors.append(str(err))
        print(json.dumps(errors))
        """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(bh.__file__)))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=root))
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), run(reference, [_x(4)]), rtol=1e-4, atol=1e-4)
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    for n, err in zip((LO - 1, HI + 1), errors):
        assert err is not None, f"batch {n} ran after reload"
        assert re.search(_out_of_range(symbol, n), err), err


def _region(cnn_onnx, ranges):
    mod, params = bh.from_onnx(cnn_onnx, dim_ranges=ranges)
    part = bh.partition(mod, params)
    (entry,) = region_table(part).values()
    ex = build(part)
    relax.VirtualMachine(ex, tvm.cpu())  # hands the region its constants (__init_)
    (module,) = region_modules(ex)
    return module, entry, part


def _region_call(module, entry, n):
    """Call the region as the VM does (its reshape's shape argument included); its output."""
    import tvm_ffi

    out = tvm.runtime.tensor(np.zeros((n, 10), "float32"))
    args = [tvm.runtime.tensor(_x(n)), out]
    for pos in entry.graph.get("shape_args", []):
        args.insert(pos, tvm_ffi.Shape((n, 32)))
    module[entry.symbol](*args)
    return out.numpy()


def test_region_checks_its_declared_range(cnn_onnx):
    """The region itself refuses a binding outside the declared range (when the shapes change;
    a repeated shape takes the one-comparison fast path, which only a checked binding reaches)."""
    module, entry, part = _region(cnn_onnx, {"N": (LO, HI)})
    ref_module, ref_entry, _ = _region(cnn_onnx, None)
    assert "dim_ranges" not in ref_entry.graph and ref_entry.graph["version"] == 4
    info = lambda: json.loads(module["get_runtime_info"]())  # noqa: E731
    for n in (LO, HI, HI):
        np.testing.assert_allclose(_region_call(module, entry, n), _region_call(ref_module, ref_entry, n),
                                   rtol=1e-5, atol=1e-5)
    made = info()["plans_made"]
    for n in (HI + 1, HI + 1, LO - 1):
        with pytest.raises(bh.InputError, match=rf"region '{entry.symbol}': argument 0 \(input 0\): dim 0 \(N\) "
                                                rf"is {n}, outside its declared range \[{LO}, {HI}\]"):
            _region_call(module, entry, n)
    assert info()["plans_made"] == made, "no plan is made for a rejected binding"
    # the module without ranges runs any batch
    assert _region_call(ref_module, ref_entry, HI + 1).shape == (HI + 1, 10)
    # and so does the planner alone
    with pytest.raises(bh.InputError, match=r"dim 0 \(N\) is 7, outside its declared range"):
        _C.plan_region(json.dumps(entry.graph), [[HI + 1, 3, 32, 32]])


def _doc(version, ranges=None, shape=("N", 4)):
    doc = {"format": "byoc_hetero.region", "version": version, "symbol": "ranges_test",
           "tensors": [{"shape": list(shape)}, {"shape": list(shape)}], "inputs": [0], "outputs": [1],
           "nodes": [{"op": "eltwise", "inputs": [0], "output": 1, "attrs": {"algorithm": "relu"}}]}
    if ranges is not None:
        doc["dim_ranges"] = ranges
    return json.dumps(doc)


def test_dim_ranges_field_is_parsed_strictly():
    create = tvm.get_global_func("byoc_hetero.runtime.create")
    create(_doc(2))  # documents without the field load as before
    create(_doc(3, {"N": [1, None]}))
    create(_doc(3, {"N": [None, None]}))
    for version, ranges, what in (
        (2, {"N": [1, 4]}, r"'dim_ranges': needs version 3"),
        (3, {"M": [1, 4]}, r"'dim_ranges.M': 'M' is no symbol of the region \(its symbols: N\)"),
        (3, {"N": [4, 1]}, r"'dim_ranges.N': expected min <= max"),
        (3, {"N": [0, 4]}, r"'dim_ranges.N': expected \[min, max\]"),
        (3, {"N": [1.5, 4]}, r"'dim_ranges.N': expected \[min, max\]"),
        (3, {"N": [1]}, r"'dim_ranges.N': expected \[min, max\]"),
        (3, [1, 4], r"'dim_ranges': expected an object"),
        (5, None, r"'version': expected 1 to 4"),
    ):
        with pytest.raises(ValueError, match=what):
            create(_doc(version, ranges))
    # open ends: only the declared side is checked
    with pytest.raises(bh.InputError, match=r"dim 0 \(N\) is 9, outside its declared range \[\.\.\., 8\]"):
        _C.plan_region(_doc(3, {"N": [None, 8]}), [[9, 4]])
    _C.plan_region(_doc(3, {"N": [None, 8]}), [[1, 4]])


def test_region_ranges_of_opaque_products():
    declared = {"B": (1, 8), "S": (2, 512), "T": (None, None)}
    assert region_ranges(["B", "S"], declared, {}) == {"B": [1, 8], "S": [2, 512]}
    assert region_ranges(["B_x_S"], declared, {"B_x_S": "B * S"}) == {"B_x_S": [2, 4096]}
    assert region_ranges(["B_x_4"], declared, {"B_x_4": "B * 4"}) == {"B_x_4": [4, 32]}
    assert region_ranges(["B_x_T"], declared, {"B_x_T": "B * T"}) == {}  # nothing known
    assert region_ranges(["X"], declared, {"X": "(B + 1) // 2"}) == {}  # only products


def test_llvm_only_function_checks_its_range(tmp_path):
    """A range guards what runs on llvm too (no region reads the dim): TVM's memory planning sizes
    buffers by the declared upper bound, so a call past it must be stopped before any op runs."""
    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType([n, 7], "float32"))
    b = relax.Var("b", relax.TensorType([n, 7], "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            gv = bb.emit_output(relax.op.add(relax.op.multiply(a, a), b))
        bb.emit_func_output(gv)
    mod = bb.get()
    mod["main"] = mod["main"].with_attr("tir_var_lower_bound", {"n": 1}).with_attr("tir_var_upper_bound", {"n": 4})
    part = bh.partition(mod)
    assert not region_table(part)
    assert str(part["main"]).count(CHECK_FUNC) == 1, "one check: b's n is the VM's to match against a's"
    lib = tmp_path / "lib.so"
    build(part).export_library(str(lib))
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    x = np.arange(28, dtype="float32").reshape(4, 7)
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(x)).numpy(), x * x + x)
    with pytest.raises(bh.InputError, match=r"main: input 0 \('a'\): dim 0 \(n\) is 5, outside its declared "
                                            r"range \[1, 4\] \(shape \[n, 7\], got \[5, 7\]\)"):
        vm["main"](tvm.runtime.tensor(np.zeros((5, 7), "float32")), tvm.runtime.tensor(np.zeros((5, 7), "float32")))
    # the last stage applied twice does not add a second check
    assert str(bh.stages()[-1](part)["main"]).count(CHECK_FUNC) == 1


def test_module_without_ranges_has_no_check(cnn_onnx):
    mod, params = bh.from_onnx(cnn_onnx)
    part = bh.partition(mod, params)
    assert CHECK_FUNC not in str(part["main"])
    assert all("dim_ranges" not in e.graph for e in region_table(part).values())
    x = _x(HI + 3)
    np.testing.assert_allclose(run(build(part), [x]), run(build(bh.bind_params(mod, params)), [x]),
                               rtol=1e-4, atol=1e-4)


def test_plan_cache_limit_from_the_environment(cnn_onnx):
    """BYOC_HETERO_PLAN_CACHE bounds the plans of a region through many distinct shapes (read when
    the first module is made); a bad value is a clear error, not a crash."""
    script = textwrap.dedent(f"""
        import json, numpy as np, tvm
        import byoc_hetero as bh
        from byoc_hetero import _C
        from byoc_hetero._relax import region_modules
        from byoc_hetero.timing import build, run
        mod, params = bh.from_onnx({str(cnn_onnx)!r})
        _C.set_thread_adaptation("off")  # one plan cache: the module's own thread count's
        ex = build(bh.partition(mod, params))
        (m,) = region_modules(ex)
        seen = []
        for n in range(1, 13):
            run(ex, [np.zeros((n, 3, 32, 32), "float32")])
            seen.append(json.loads(m["get_runtime_info"]())["plans"])
        info = json.loads(m["get_runtime_info"]())
        print(json.dumps([_C.plan_cache_limit(), max(seen), info["plans_made"], info["bindings"]]))
        """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(bh.__file__)))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=root, BYOC_HETERO_PLAN_CACHE="3"))
    assert proc.returncode == 0, proc.stderr
    limit, most, made, bindings = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (limit, most, made) == (3, 3, 12)
    assert bindings == [[12], [11], [10]]
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=root, BYOC_HETERO_PLAN_CACHE="lots"))
    assert proc.returncode != 0
    assert "BYOC_HETERO_PLAN_CACHE: expected an integer >= 1, got 'lots'" in proc.stderr
    assert "Segmentation" not in proc.stderr and "core dumped" not in proc.stderr


def test_call_whose_buffers_cannot_fit_is_an_input_error():
    """A VM call whose region would need more memory than the machine has (a 1x1 conv to 1024
    channels, then a max pool over the whole image: the intermediate is 256x the input and the
    output) is refused with InputError before anything is allocated, and the VM stays usable."""
    phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    n = tvm.tirx.Var("N", "int64")
    c = 1024
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, 1, 16, 16], "float32"))
    weight = np.random.default_rng(0).standard_normal((c, 1, 1, 1)).astype("float32")
    w = relax.const(weight)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w)))
            gv = bb.emit_output(relax.op.nn.max_pool2d(y, pool_size=(16, 16)))
        bb.emit_func_output(gv)
    part = bh.partition(bb.get())
    assert len(region_table(part)) == 1
    vm = relax.VirtualMachine(build(part), tvm.cpu())
    small = np.random.default_rng(1).standard_normal((2, 1, 16, 16)).astype("float32")
    want = np.maximum(np.einsum("oc,nchw->nohw", weight[:, :, 0, 0], small), 0).max(axis=(2, 3))
    np.testing.assert_allclose(_call(vm, small)[:, :, 0, 0], want, rtol=1e-5, atol=1e-5)
    # the intermediate alone: batch * c * 16 * 16 * 4 bytes > physical memory
    batch = phys // (c * 16 * 16 * 4) + 1
    big = np.zeros((batch, 1, 16, 16), "float32")  # batch KiB: small next to the intermediate
    with pytest.raises(bh.InputError, match=r"need more than \d+ bytes.*cannot hold them"):
        _call(vm, big)
    np.testing.assert_allclose(_call(vm, small)[:, :, 0, 0], want, rtol=1e-5, atol=1e-5)
