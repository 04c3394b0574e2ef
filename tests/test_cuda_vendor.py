"""Backend ``cuda_vendor`` (cuBLASLt): its rules and checks and its region documents on any machine;
its runtime library's modules (made, exported, loaded back, refusing to run without a GPU) where
the library is built (the ``[cuda]`` extra's headers); numerics against numpy only on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import byoc_hetero as bh
from byoc_hetero._relax import imported_modules, is_region
from byoc_hetero.backends import cuda_vendor
from byoc_hetero.backends.cuda_vendor.codegen import region_document
from byoc_hetero.placement import PlacementError, compile, place, placement_report, vm

TARGET = "cuda_vendor"
BUILT = cuda_vendor.built()
WHY_NOT = cuda_vendor.availability() if BUILT else "not built"
requires_lib = pytest.mark.skipif(not BUILT, reason="libbyoc_hetero_cuda.so not built (no CUDA headers: "
                                                    "pip install 'byoc-hetero[cuda]' and build again)")
requires_gpu = pytest.mark.skipif(WHY_NOT != "", reason=f"the cuda_vendor backend cannot run here: {WHY_NOT[:200]}")


def _gemm(data=(2, 3, 32), weight=(32, 16), transpose=False, bias=True, act="relu", dtype="float32"):
    """main(x, w[, b]) = act(x @ w [+ b]) (w read through permute_dims when ``transpose``)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(data, dtype))
    w = relax.Var("w", relax.TensorType(weight, dtype))
    params = [x, w]
    if bias:
        params.append(relax.Var("b", relax.TensorType((weight[-2] if transpose else weight[-1],), dtype)))
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(R.matmul(x, bb.emit(R.permute_dims(w)) if transpose else w))
            if bias:
                y = bb.emit(R.add(y, params[2]))
            if act:
                y = bb.emit(getattr(R.nn, act)(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _inputs(mod, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32") for p in mod["main"].params]


def _reference(xs, transpose=False, act="relu"):
    x, w, *b = xs
    y = x @ (np.swapaxes(w, -1, -2) if transpose else w) + (b[0] if b else 0)
    if act == "relu":
        y = np.maximum(y, 0)
    if act == "gelu_tanh":
        y = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
    return y


def _composites(mod):
    return sorted(str(f.attrs["Composite"]) for _, f in mod.functions_items()
                  if f.attrs is not None and "Composite" in f.attrs)


def _after(mod, n):
    for stage in bh.stages(target=TARGET)[:n]:
        mod = stage(mod)
    return mod


@pytest.mark.parametrize("kwargs, composite", [
    ({}, "gemm_bias_relu"),
    ({"transpose": True, "weight": (16, 32), "act": "gelu_tanh"}, "gemm_bias_gelu_tanh"),
    ({"bias": False, "act": None}, "gemm"),
    ({"data": (2, 4, 8), "weight": (2, 8, 5), "bias": False, "act": None}, "gemm"),
])
def test_rules_take_float32_gemms_with_their_epilogue(kwargs, composite):
    assert _composites(_after(_gemm(**kwargs), 1)) == [f"{TARGET}.{composite}"]


@pytest.mark.parametrize("kwargs, reason", [
    ({"act": "gelu"}, "erf form"),
    ({"dtype": "float16"}, "dtype float16"),
    ({"data": (2, 4, 8), "weight": (1, 8, 5), "bias": False, "act": None}, "batch dims differ"),
    ({"data": (tvm.tirx.Var("n", "int64"), 32)}, "symbolic shape"),
])
def test_checks_say_why_a_gemm_stays_on_llvm(kwargs, reason):
    mod = _after(_gemm(**kwargs), 1)
    reasons = [r.reason for r in bh.rules.rejections(mod)]
    assert any(reason in r for r in reasons), reasons
    if kwargs.get("act") == "gelu":  # the gemm and its bias still go; the erf gelu stays
        assert _composites(mod) == [f"{TARGET}.gemm_bias"]


def test_region_document_says_what_cublaslt_computes():
    """The document of each region (no library needed): shapes, and M / N / K of row-major gemms."""
    cases = [
        (_gemm(), {"batch": 1, "m": 6, "n": 16, "k": 32, "transpose_b": 0, "batched_weight": 0,
                   "activation": "relu"}),
        (_gemm(transpose=True, weight=(16, 32), act="gelu_tanh"),
         {"batch": 1, "m": 6, "n": 16, "k": 32, "transpose_b": 1, "batched_weight": 0, "activation": "gelu_tanh"}),
        (_gemm(data=(2, 4, 8), weight=(2, 8, 5), bias=False, act=None),
         {"batch": 2, "m": 4, "n": 5, "k": 8, "transpose_b": 0, "batched_weight": 1, "activation": "none"}),
    ]
    for mod, attrs in cases:
        regions = [f for _, f in _after(mod, 3).functions_items() if is_region(f)]
        assert len(regions) == 1 and str(regions[0].attrs["Codegen"]) == TARGET
        doc = region_document(regions[0], {})
        [node] = doc["nodes"]
        assert node["op"] == "gemm" and node["attrs"] == attrs
        # the node reads (data, weight[, bias]): main's (x, w[, b]), all region inputs here
        params = [[int(d) for d in p.ty.shape] for p in mod["main"].params]
        assert [doc["tensors"][t]["shape"] for t in node["inputs"]] == params
        assert sorted(node["inputs"]) == sorted(doc["inputs"])
        assert doc["tensors"][node["output"]]["shape"] == [int(d) for d in mod["main"].ret_ty.shape]
        assert doc["outputs"] == [node["output"]] and doc["constants"] == []


@pytest.fixture(scope="module")
def partitioned():
    """A dense + bias + relu with bound weights, partitioned for cuda_vendor (needs the library)."""
    mod = _gemm()
    xs = _inputs(mod)
    return bh.partition(mod, {"w": xs[1], "b": xs[2]}, target=TARGET), xs


def _cuda_modules(mod_or_lib):
    modules = mod_or_lib.attrs["external_mods"] if isinstance(mod_or_lib, tvm.IRModule) else imported_modules(mod_or_lib)
    return [m for m in modules if m.kind == cuda_vendor.RUNTIME_KIND]


@requires_lib
def test_module_exports_loads_back_and_says_what_is_missing(partitioned, tmp_path):
    part, xs = partitioned
    [module] = _cuda_modules(part)
    doc = cuda_vendor.runtime.region_graph(module)
    assert [c["name"] for c in doc["constants"]] == list(module["get_const_vars"]())
    assert len(doc["constants"]) == 2  # the bound weight and bias
    path = tmp_path / "m.so"
    relax.build(part, target="llvm").export_library(str(path))
    [loaded] = _cuda_modules(tvm.runtime.load_module(str(path)))
    assert loaded["get_graph_json"]() == module["get_graph_json"]()
    args = [tvm.runtime.tensor(xs[0]), tvm.runtime.tensor(np.zeros((2, 3, 16), "float32"))]
    with pytest.raises(bh.ByocError) as err:  # no GPU: what is missing; a GPU: the tensors are on the CPU
        loaded[doc["symbol"]](*args)
    if WHY_NOT:
        assert "cuda_vendor backend" in str(err.value) and ("GPU" in str(err.value) or "found none" in str(err.value))
    else:
        assert "expected a tensor on a CUDA device" in str(err.value)


@requires_lib
def test_placement_keeps_its_regions_on_a_gpu(partitioned):
    part, _ = partitioned
    placed = place(part, fallback="cpu", devices=["cpu", "cuda"])  # no rule names the region
    report = placement_report(placed)
    assert report.regions == {"cuda:0": {TARGET: 1}}
    assert placement_report(place(part, {TARGET: "cuda"}, fallback="cpu")).regions == report.regions  # named
    with pytest.raises(PlacementError, match="GPU runtime"):
        place(part, {TARGET: "cpu"}, fallback="cpu", devices=["cpu", "cuda"])
    ex = compile(placed)  # builds and links without a GPU
    assert _cuda_modules(ex.executable.mod)
    if WHY_NOT:
        with pytest.raises(PlacementError, match="not available"):
            vm(ex)


@requires_gpu
@pytest.mark.parametrize("kwargs", [
    {},
    {"transpose": True, "weight": (16, 32), "act": "gelu_tanh"},
    {"data": (2, 4, 8), "weight": (2, 8, 5), "bias": False, "act": None},
    {"data": (3, 8), "weight": (8, 4), "act": None},
])
def test_gpu_results_match_numpy(kwargs):
    mod = _gemm(**kwargs)
    xs = _inputs(mod, seed=1)
    params = {"w": xs[1], **({"b": xs[2]} if len(xs) > 2 else {})}
    part = bh.partition(mod, params, target=TARGET)
    got = vm(compile(place(part, {TARGET: "cuda"}, fallback="cpu")))["main"](xs[0]).numpy()
    want = _reference(xs, kwargs.get("transpose", False), kwargs.get("act", "relu"))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
