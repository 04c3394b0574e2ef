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
    ({"dtype": "bfloat16"}, "dtype bfloat16"),
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
                   "activation": "relu", "compute": "fp32"}),
        (_gemm(transpose=True, weight=(16, 32), act="gelu_tanh"),
         {"batch": 1, "m": 6, "n": 16, "k": 32, "transpose_b": 1, "batched_weight": 0, "activation": "gelu_tanh",
          "compute": "fp32"}),
        (_gemm(data=(2, 4, 8), weight=(2, 8, 5), bias=False, act=None),
         {"batch": 2, "m": 4, "n": 5, "k": 8, "transpose_b": 0, "batched_weight": 1, "activation": "none",
          "compute": "fp32"}),
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


def _region_of(mod):
    [region] = [f for _, f in _after(mod, 3).functions_items() if is_region(f)]
    return region


def test_float16_gemms_run_with_fp32_accumulation_and_gemm_compute_is_an_option():
    """float16 tensors make a float16 document whose gemm accumulates in FP32 whatever the option;
    ``gemm_compute`` (tf32 / fp16) changes a float32 gemm's compute only, and is checked."""
    from byoc_hetero.stages import codegen_options

    half = _region_of(_gemm(dtype="float16"))
    doc = region_document(half, {}, {"gemm_compute": "tf32"})
    assert {t["dtype"] for t in doc["tensors"]} == {"float16"} and doc["nodes"][0]["attrs"]["compute"] == "fp32"
    single = _region_of(_gemm())
    assert region_document(single, {}, {"gemm_compute": "fp16"})["nodes"][0]["attrs"]["compute"] == "fp16"
    assert region_document(single, {})["nodes"][0]["attrs"]["compute"] == "fp32"
    with pytest.raises(bh.RuleError, match="gemm_compute: expected one of"):
        codegen_options([TARGET], None, {TARGET: {"gemm_compute": "int8"}})
    assert _composites(_after(_gemm(dtype="float16"), 1)) == [f"{TARGET}.gemm_bias_relu"]
    bb = relax.BlockBuilder()  # float16 in, float32 out: refused with the reason
    x, w = (relax.Var(n, relax.TensorType(s, "float16")) for n, s in (("x", (4, 8)), ("w", (8, 2))))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(R.matmul(x, w, out_dtype="float32")))
        bb.emit_func_output(out)
    reasons = [r.reason for r in bh.rules.rejections(_after(bb.get(), 1))]
    assert any("writes the dtype it reads" in r for r in reasons), reasons


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


# ---- conv2d on cuDNN ------------------------------------------------------------------------------
def _conv(data=(1, 8, 10, 10), weight=(16, 8, 3, 3), bias=True, residual=False, relu=True, groups=1,
          padding=(1, 1, 1, 1), strides=(1, 1), dilation=(1, 1), dtype="float32", relu_first=False,
          layout="NCHW"):
    """main(x, w[, b][, z]) = relu(conv2d(x, w) [+ b] [+ z]) (b of shape [1, K, 1, 1]); with
    ``relu_first`` the residual is added after the relu (a post-activation residual)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(data, dtype))
    w = relax.Var("w", relax.TensorType(weight, dtype))
    params = [x, w]
    kernel_layout = "OIHW" if layout == "NCHW" else "HWIO"
    with bb.function("main"):  # the parameters grow below, and are given at emit_func_output
        with bb.dataflow():
            y = bb.emit(R.nn.conv2d(x, w, strides=strides, padding=padding, dilation=dilation, groups=groups,
                                    data_layout=layout, kernel_layout=kernel_layout))
            if bias:
                params.append(relax.Var("b", relax.TensorType((1, weight[0], 1, 1), dtype)))
                y = bb.emit(R.add(params[-1], y))  # the bias first, as PyTorch's frontend adds it
            z = None
            if residual:
                z = relax.Var("z", relax.TensorType([int(d) for d in y.ty.shape], dtype))
                params.append(z)
            if residual and not relu_first:
                y = bb.emit(R.add(y, z))
            if relu:
                y = bb.emit(R.nn.relu(y))
            if residual and relu_first:
                y = bb.emit(R.add(y, z))
            out = bb.emit_output(y)
        bb.emit_func_output(out, params)
    return bb.get()


@pytest.mark.parametrize("kwargs, composite", [
    ({}, "conv2d_add_relu"),
    ({"residual": True}, "conv2d_add_add_relu"),
    ({"bias": False, "residual": True, "relu": False}, "conv2d_add"),
    ({"bias": False, "relu": True, "groups": 8, "weight": (8, 1, 3, 3)}, "conv2d_relu"),  # depthwise
    ({"bias": False, "relu": False, "strides": (2, 2), "dilation": (2, 2), "padding": (2, 2, 2, 2)}, "conv2d"),
])
def test_conv2d_rules_take_bias_residual_and_relu(kwargs, composite):
    assert _composites(_after(_conv(**kwargs), 1)) == [f"{TARGET}.{composite}"]


def test_a_relu_before_the_residual_leaves_the_residual_add_to_llvm():
    mod = _after(_conv(residual=True, relu_first=True), 1)
    assert _composites(mod) == [f"{TARGET}.conv2d_add_relu"]  # the bias and relu; cuDNN applies relu last
    assert sum(c.op.name == "relax.add" for c in _main_calls(mod)) == 1


def _main_calls(mod):
    return [b.value for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


@pytest.mark.parametrize("kwargs, reason", [
    ({"padding": (1, 1, 0, 0)}, "asymmetric"),
    ({"dtype": "float16"}, "dtype float16"),
    ({"layout": "NHWC", "data": (1, 10, 10, 8), "weight": (3, 3, 8, 16), "bias": False}, "NCHW data with OIHW weights"),
    ({"data": (tvm.tirx.Var("n", "int64"), 8, 10, 10)}, "symbolic shape"),
])
def test_conv2d_checks_say_why_a_conv_stays_on_llvm(kwargs, reason):
    mod = _after(_conv(**kwargs), 1)
    reasons = [r.reason for r in bh.rules.rejections(mod)]
    assert any(reason in r for r in reasons), reasons
    assert _composites(mod) == []


def test_add_roles_tell_bias_from_residual():
    from byoc_hetero.backends.cuda_vendor.conv import add_roles

    out = (2, 16, 5, 5)
    assert add_roles(out, [(1, 16, 1, 1), out]) == ["bias", "residual"]
    assert add_roles(out, [out, (16, 1, 1)]) == ["residual", "bias"]
    assert "one bias" in add_roles(out, [(1, 16, 1, 1), (16, 1, 1)])  # two biases
    assert "one bias" in add_roles(out, [(1, 1, 5, 5)])  # neither


def test_conv2d_region_document_orders_bias_then_residual():
    """The document of a conv2d + bias + residual + relu region: inputs (data, weight, bias,
    residual) whatever the adds' order, attrs as cuDNN is told them, a version-2 document."""
    mod = _conv(residual=True, strides=(2, 2), data=(2, 8, 9, 9))
    [region] = [f for _, f in _after(mod, 3).functions_items() if is_region(f)]
    doc = region_document(region, {})
    assert doc["version"] == 2
    [node] = doc["nodes"]
    assert node["op"] == "conv2d"
    assert node["attrs"] == {"strides": [2, 2], "padding": [1, 1], "dilation": [1, 1], "groups": 1,
                             "activation": "relu", "bias": 1, "residual": 1}
    shapes = [doc["tensors"][t]["shape"] for t in node["inputs"]]
    assert shapes == [[2, 8, 9, 9], [16, 8, 3, 3], [1, 16, 1, 1], [2, 16, 5, 5]]
    assert doc["tensors"][node["output"]]["shape"] == [2, 16, 5, 5]


def _create(doc):
    return cuda_vendor.runtime.create_module(doc)


@requires_lib
def test_conv2d_documents_round_trip_through_the_strict_parser():
    """create → get_graph_json gives the document back; what the parser must refuse it refuses,
    naming the node and the field (ValueError: the document is wrong, not the input)."""
    import copy
    import json

    [region] = [f for _, f in _after(_conv(residual=True), 3).functions_items() if is_region(f)]
    doc = region_document(region, {})
    assert json.loads(_create(doc)["get_graph_json"]()) == doc
    bad = []
    v1 = copy.deepcopy(doc)
    v1["version"] = 1
    bad.append((v1, "version 1 document holds gemm nodes"))
    node = doc["nodes"][0]
    wrong_w = copy.deepcopy(doc)
    wrong_w["tensors"][node["inputs"][1]]["shape"] = [16, 8, 3, 4]
    bad.append((wrong_w, "the attrs give 10x9"))  # a 3x4 kernel makes another output width
    no_res = copy.deepcopy(doc)
    no_res["nodes"][0]["attrs"]["residual"] = 0
    bad.append((no_res, "expected 3 inputs (data, weight, bias), got 4"))
    pad = copy.deepcopy(doc)
    pad["nodes"][0]["attrs"]["padding"] = [1, 1, 1, 1]
    bad.append((pad, "field 'padding' must hold 2 integers"))
    groups = copy.deepcopy(doc)
    groups["nodes"][0]["attrs"]["groups"] = 3
    bad.append((groups, "groups 3 must divide"))
    for broken, words in bad:
        with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
            _create(broken)


@requires_lib
def test_a_conv2d_region_without_a_gpu_says_what_is_missing(tmp_path):
    mod = _conv(residual=True)
    xs = _inputs(mod)
    part = bh.partition(mod, {"w": xs[1], "b": xs[2]}, target=TARGET)
    [module] = _cuda_modules(part)
    doc = cuda_vendor.runtime.region_graph(module)
    assert [n["op"] for n in doc["nodes"]] == ["conv2d"] and len(doc["constants"]) == 2
    path = tmp_path / "conv.so"
    relax.build(part, target="llvm").export_library(str(path))
    [loaded] = _cuda_modules(tvm.runtime.load_module(str(path)))
    assert loaded["get_graph_json"]() == module["get_graph_json"]()
    args = [tvm.runtime.tensor(a) for a in (xs[0], xs[3], np.zeros_like(xs[3]))]
    with pytest.raises(bh.ByocError) as err:
        loaded[doc["symbol"]](*args)
    if WHY_NOT:
        assert "cuda_vendor backend" in str(err.value) and ("GPU" in str(err.value) or "found none" in str(err.value))
    else:
        assert "expected a tensor on a CUDA device" in str(err.value)


@requires_gpu
@pytest.mark.parametrize("kwargs", [
    {},
    {"residual": True},
    {"bias": False, "relu": False},
    {"bias": False, "residual": True, "relu": False},
    {"groups": 8, "weight": (8, 1, 3, 3), "strides": (2, 2)},
    {"dilation": (2, 2), "padding": (2, 2, 2, 2), "data": (2, 8, 12, 12)},
])
def test_gpu_conv2d_matches_llvm(kwargs):
    """The cuDNN region against the same module built by TVM for the CPU (llvm)."""
    mod = _conv(**kwargs)
    xs = _inputs(mod, seed=2)
    names = [p.name for p in mod["main"].params]
    bound = {n: x for n, x in zip(names, xs) if n in ("w", "b")}
    free = [x for n, x in zip(names, xs) if n not in bound]
    want = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())["main"](
        *[tvm.runtime.tensor(x) for x in xs]).numpy()
    part = bh.partition(mod, bound, target=TARGET)
    got = vm(compile(place(part, {TARGET: "cuda"}, fallback="cpu")))["main"](*free).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ---- the tuner: a cuda backend is timed on no CPU --------------------------------------------------
def test_the_codegen_level_times_no_cuda_region_on_the_cpu():
    """A cuda_vendor region is no candidate of the codegen level (it times on the CPU): the cost
    gate's rule decides and the report says why; asked beside onednn, cuda_vendor is 'unable'."""
    from byoc_hetero.tune.cache import TimingCache
    from byoc_hetero.tune.codegen import candidate_regions, measure_region

    mod = _gemm(data=(4, 16), weight=(16, 8))
    xs = _inputs(mod)
    params = {"w": xs[1], "b": xs[2]}
    [c] = candidate_regions(mod, params, targets=[TARGET])
    assert c.target == TARGET and "cuda_vendor runs on cuda" in c.untimeable
    d = measure_region(c, TimingCache(), backends=[TARGET])
    assert d.timings == {} and d.chosen == c.default and "not timed here" in d.why()
    [c] = candidate_regions(mod, params, targets=["onednn"])
    d = measure_region(c, TimingCache(), repeat=3, budget_s=0.1, backends=["onednn", TARGET])
    assert "runs on cuda" in d.unable[TARGET] and TARGET not in d.timings
    assert set(d.timings) == {"onednn", "llvm"}


@requires_lib
def test_the_device_level_asks_no_cpu_time_of_a_gpu_region(partitioned):
    """device_units marks a cuda_vendor region GPU-only; the measurer is never asked its CPU time,
    and the solver places it on cuda (without a GPU here: a cost table decides)."""
    from byoc_hetero.tune.devices import device_units, tune_devices

    part, _ = partitioned
    units, _, _, _ = device_units(part)
    [region] = [u for u in units if u.what.startswith("region")]
    assert region.gpu_only and not region.cpu_only
    asked = []

    class Table:
        def time(self, unit, device):
            asked.append((unit.name, device))
            return 1e-4

        def link(self, src, dst):
            return 1e-6, 1e10

    _, report = tune_devices(part, ["cpu", "cuda"], Table())
    assert (region.name, "cpu:0") not in asked and (region.name, "cuda:0") in asked
    assert report.placement[region.name] == "cuda:0"
    assert "GPU only" in report.decisions[0].why()


@requires_lib
def test_float16_documents_round_trip_and_the_parser_checks_their_dtypes():
    import copy

    doc = region_document(_region_of(_gemm(dtype="float16")), {})
    assert cuda_vendor.runtime.region_graph(_create(doc)) == doc
    mixed = copy.deepcopy(doc)
    mixed["tensors"][doc["nodes"][0]["inputs"][1]]["dtype"] = "float32"
    fast = copy.deepcopy(doc)
    fast["nodes"][0]["attrs"]["compute"] = "tf32"
    bf16 = copy.deepcopy(doc)
    bf16["tensors"][0]["dtype"] = "bfloat16"
    for broken, words in ((mixed, "a node reads and writes one dtype"), (fast, "compute 'tf32' on float16"),
                          (bf16, "dtype 'bfloat16'")):
        with pytest.raises(ValueError, match=words):
            _create(broken)


@requires_gpu
@pytest.mark.parametrize("dtype, compute, tol", [("float16", "fp32", 2e-2), ("float32", "tf32", 2e-2),
                                                 ("float32", "fp16", 2e-2)])
def test_gpu_reduced_precision_gemms_match_numpy_within_their_tolerance(dtype, compute, tol):
    """float16 tensors, or float32 ones with TF32 / FP16 products: against numpy in float64 on the
    same (rounded) inputs, within a 10-bit mantissa's error."""
    mod = _gemm(dtype=dtype)
    xs = [x.astype(dtype) for x in _inputs(mod, seed=3)]
    part = bh.partition(mod, {"w": xs[1], "b": xs[2]}, target=TARGET, options={TARGET: {"gemm_compute": compute}})
    got = vm(compile(place(part, {TARGET: "cuda"}, fallback="cpu")))["main"](xs[0]).numpy().astype("float64")
    want = _reference([x.astype("float64") for x in xs])
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
