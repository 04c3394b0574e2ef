"""The C++ runtime on its own: hand-written region documents, numpy references, bad inputs.

Each test builds a region JSON (docs/region-format.md) by hand, creates the module through the TVM
global ``byoc_hetero.runtime.create``, loads its constants through ``__init_<symbol>`` and calls
the region symbol the way the Relax VM does (inputs, then preallocated outputs).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import tvm


def _load_extension():
    """``byoc_hetero._C``; if the package itself does not import, load the extension directly."""
    try:
        import byoc_hetero

        return byoc_hetero._C
    except Exception:  # noqa: BLE001  (the Python half may be mid-edit; the runtime is tested alone)
        import ctypes
        import glob
        import importlib.machinery
        import importlib.metadata as md
        import importlib.util
        import os
        import site

        for f in md.distribution("onednn-cpu-gomp").files or []:
            if f.name.startswith("libdnnl.so"):
                ctypes.CDLL(str(f.locate()), mode=ctypes.RTLD_GLOBAL)
                break
        roots = site.getsitepackages() + [site.getusersitepackages()]
        roots.append(os.path.join(os.path.dirname(__file__), ".."))
        for root in roots:
            for path in glob.glob(os.path.join(root, "byoc_hetero", "_C*.so")):
                spec = importlib.util.spec_from_file_location("byoc_hetero._C", path)
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                return module
        raise


_C = _load_extension()
create = tvm.get_global_func("byoc_hetero.runtime.create")
load_from_bytes = tvm.get_global_func("ffi.Module.load_from_bytes.byoc_hetero")
save_to_bytes = tvm.get_global_func("byoc_hetero.runtime.save_to_bytes")

RTOL = 1e-4
rng = np.random.default_rng(0)


# ------------------------------------------------------------------------------------------------
# Helpers: a tiny region builder and numpy references


class Region:
    """Builds a region document; tensors are added in the order they are declared."""

    def __init__(self, symbol: str = "region0"):
        self.symbol = symbol
        self.tensors: list[dict] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.constants: list[dict] = []
        self.nodes: list[dict] = []
        self.const_values: list[np.ndarray] = []

    def tensor(self, shape) -> int:
        self.tensors.append({"shape": list(shape), "dtype": "float32"})
        return len(self.tensors) - 1

    def input(self, shape) -> int:
        tid = self.tensor(shape)
        self.inputs.append(tid)
        return tid

    def const(self, value: np.ndarray) -> int:
        tid = self.tensor(value.shape)
        self.constants.append({"tensor": tid, "name": f"{self.symbol}_const_{len(self.constants)}"})
        self.const_values.append(value.astype("float32"))
        return tid

    def node(self, op: str, inputs, out_shape, **attrs) -> int:
        out = self.tensor(out_shape)
        self.nodes.append({"op": op, "inputs": list(inputs), "output": out, "attrs": attrs})
        return out

    def doc(self) -> dict:
        return {
            "format": "byoc_hetero.region",
            "version": 1,
            "symbol": self.symbol,
            "tensors": self.tensors,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "constants": self.constants,
            "nodes": self.nodes,
        }

    def json(self) -> str:
        return json.dumps(self.doc())

    def module(self, init: bool = True):
        mod = create(self.json())
        if init:
            assert mod[f"__init_{self.symbol}"]([tvm.runtime.tensor(v) for v in self.const_values]) == 0
        return mod

    def run(self, mod, *inputs: np.ndarray) -> list[np.ndarray]:
        outs = [tvm.runtime.tensor(np.full(self.tensors[t]["shape"], np.nan, "float32")) for t in self.outputs]
        mod[self.symbol](*[tvm.runtime.tensor(np.array(x, "float32", order="C")) for x in inputs], *outs)
        return [o.numpy() for o in outs]


def rand(*shape) -> np.ndarray:
    return rng.standard_normal(shape).astype("float32")


def conv_out_size(size, k, stride, pad_lo, pad_hi, dilation):
    return (size + pad_lo + pad_hi - ((k - 1) * dilation + 1)) // stride + 1


def conv2d_ref(x, w, b=None, strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1, relu=False):
    """Reference conv2d: one einsum per kernel position and group (no per-element loops)."""
    x = x.astype("float64")
    w = w.astype("float64")
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    top, left, bottom, right = padding
    sh, sw = strides
    dh, dw = dilation
    oh = conv_out_size(h, kh, sh, top, bottom, dh)
    ow = conv_out_size(wd, kw, sw, left, right, dw)
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for g in range(groups):
        xg = xp[:, g * cg : (g + 1) * cg]
        wg = w[g * og : (g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xg[:, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw]
                out[:, g * og : (g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, i, j])
    if b is not None:
        out += b.astype("float64").reshape(1, o, 1, 1)
    return np.maximum(out, 0) if relu else out


def dense_ref(x, w, b=None, layout="KN", relu=False):
    wk = w.astype("float64") if layout == "KN" else w.astype("float64").T
    out = x.astype("float64") @ wk
    if b is not None:
        out = out + b.astype("float64").reshape(-1)
    return np.maximum(out, 0) if relu else out


def assert_close(got, want):
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * max(1.0, float(np.abs(want).max())))


# ------------------------------------------------------------------------------------------------
# The extension


def test_extension_info():
    assert _C.__version__ == "0.1.0"
    assert _C.onednn_version().startswith("3.")
    assert isinstance(_C.isa(), str) and _C.isa()
    # each kernels/<op>.cc registers itself: the binary lists exactly what the sources register
    # (a kernel file missing from the build, or a registration lost by the linker, fails here)
    kernels_dir = os.path.join(os.path.dirname(__file__), os.pardir, "cpp", "kernels")
    registered = []
    for name in sorted(os.listdir(kernels_dir)):
        if name.endswith(".cc"):
            with open(os.path.join(kernels_dir, name)) as f:
                registered += re.findall(r'^BYOC_HETERO_REGISTER_KERNEL\("(\w+)"', f.read(), re.M)
    ops = sorted(registered)
    assert {"conv2d", "dense", "matmul", "pool2d", "eltwise", "binary", "softmax", "reshape"} <= set(ops)
    assert _C.kernels() == ops
    assert list(tvm.get_global_func("byoc_hetero.runtime.supported_ops")()) == ops


def test_enum_names_are_the_runtime_tables():
    """_C.enum_names() is what the kernels accept: every activation name runs as an eltwise."""
    names = _C.enum_names()
    assert names["activation"] == _C.activation_names()
    assert names["activation"][0] == "none"
    assert set(names) == {"activation", "pool_algorithm", "binary_algorithm", "dense_weight_layout"}
    for act in names["activation"][1:]:
        attrs = {"algorithm": act, **({"clip": [0.0, 6.0]} if act == "clip" else {})}
        doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "enum_" + act,
               "tensors": [{"shape": [2, 3], "dtype": "float32"}] * 2, "inputs": [0], "outputs": [1],
               "constants": [], "nodes": [{"op": "eltwise", "inputs": [0], "output": 1, "attrs": attrs}]}
        create(json.dumps(doc))
    with pytest.raises(ValueError, match="relu"):
        create(json.dumps(dict(doc, nodes=[dict(doc["nodes"][0], attrs={"algorithm": "swish"})])))


# ------------------------------------------------------------------------------------------------
# conv2d


@pytest.mark.parametrize("bias_shape", ["flat", "nchw"])
def test_conv2d_bias_relu(bias_shape):
    r = Region("conv_bias_relu")
    x = rand(2, 3, 10, 10)
    w, b = rand(8, 3, 3, 3), rand(8)
    xi = r.input(x.shape)
    wi = r.const(w)
    bi = r.const(b if bias_shape == "flat" else b.reshape(1, 8, 1, 1))
    y = r.node("conv2d", [xi, wi, bi], (2, 8, 10, 10), strides=[1, 1], padding=[1, 1, 1, 1],
               dilation=[1, 1], groups=1, has_bias=1, activation="relu")
    r.outputs = [y]
    mod = r.module()
    (got,) = r.run(mod, x)
    assert_close(got, conv2d_ref(x, w, b, padding=(1, 1, 1, 1), relu=True))


@pytest.mark.parametrize(
    "case",
    [
        dict(c=8, o=16, k=3, strides=(2, 2), padding=(1, 1, 1, 1), dilation=(1, 1), groups=1),
        dict(c=8, o=8, k=3, strides=(1, 1), padding=(2, 2, 2, 2), dilation=(2, 2), groups=1),
        dict(c=8, o=12, k=3, strides=(1, 2), padding=(0, 1, 2, 1), dilation=(1, 1), groups=1),
        dict(c=8, o=16, k=3, strides=(1, 1), padding=(1, 1, 1, 1), dilation=(1, 1), groups=4),
        dict(c=16, o=16, k=3, strides=(2, 2), padding=(1, 0, 1, 0), dilation=(1, 1), groups=16),
        dict(c=6, o=4, k=1, strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=2),
        dict(c=3, o=5, k=5, strides=(3, 2), padding=(2, 1, 0, 3), dilation=(2, 1), groups=1),
    ],
    ids=["stride2", "dilation2", "asym_pad", "groups4", "depthwise", "1x1_groups2", "mixed"],
)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_conv2d_variants(case, bias):
    n, h, wd = 2, 13, 11
    c, o, k, groups = case["c"], case["o"], case["k"], case["groups"]
    strides, padding, dilation = case["strides"], case["padding"], case["dilation"]
    x, w, b = rand(n, c, h, wd), rand(o, c // groups, k, k), rand(o)
    oh = conv_out_size(h, k, strides[0], padding[0], padding[2], dilation[0])
    ow = conv_out_size(wd, k, strides[1], padding[1], padding[3], dilation[1])
    r = Region("conv_variant")
    inputs = [r.input(x.shape), r.const(w)] + ([r.const(b)] if bias else [])
    y = r.node("conv2d", inputs, (n, o, oh, ow), strides=list(strides), padding=list(padding),
               dilation=list(dilation), groups=groups, has_bias=int(bias), activation="none")
    r.outputs = [y]
    (got,) = r.run(r.module(), x)
    want = conv2d_ref(x, w, b if bias else None, strides, padding, dilation, groups)
    assert_close(got, want)


def test_conv_conv_chain_keeps_blocked_intermediate():
    r = Region("conv_chain")
    x = rand(1, 16, 12, 12)
    w1, b1, w2, b2 = rand(32, 16, 3, 3), rand(32), rand(16, 32, 3, 3), rand(16)
    t = r.node("conv2d", [r.input(x.shape), r.const(w1), r.const(b1)], (1, 32, 12, 12),
               padding=[1, 1, 1, 1], has_bias=1, activation="relu")
    y = r.node("conv2d", [t, r.const(w2), r.const(b2)], (1, 16, 6, 6),
               strides=[2, 2], padding=[1, 1, 1, 1], has_bias=1, activation="relu")
    r.outputs = [y]
    mod = r.module()
    (got,) = r.run(mod, x)
    mid = conv2d_ref(x, w1, b1, padding=(1, 1, 1, 1), relu=True)
    assert_close(got, conv2d_ref(mid, w2, b2, strides=(2, 2), padding=(1, 1, 1, 1), relu=True))
    run_steps = [line for line in mod["get_plan"]() if line.startswith("run")]
    # the intermediate (tensor 3) goes from conv 0 to conv 1 in oneDNN's layout, untouched:
    # run = boundary reorder in (maybe), conv, conv, boundary reorder out (maybe)
    assert not any(f"tensor {t}" in line for line in run_steps), run_steps
    assert sum("reorder" not in line and "output tensor" not in line for line in run_steps) == 2


def test_mobilenet_block_follows_a_channel_blocked_input():
    """Stem conv -> depthwise 3x3 + relu6 -> 1x1 projection -> 1x1 expansion + residual, as in
    MobileNetV2. Without AVX-512 the 1x1 and depthwise convs keep the blocked layout the stem
    writes (oneDNN's jit kernels for it), with no reorder between them."""
    r = Region("mbv2_block")
    x = rand(1, 3, 18, 18)
    ws, bs = rand(16, 3, 3, 3), rand(16)
    wd, bd = rand(16, 1, 3, 3), rand(16)
    wp, bp = rand(8, 16, 1, 1), rand(8)
    we, be = rand(16, 8, 1, 1), rand(16)
    stem = r.node("conv2d", [r.input(x.shape), r.const(ws), r.const(bs)], (1, 16, 9, 9),
                  strides=[2, 2], padding=[1, 1, 1, 1], has_bias=1, activation="relu")
    dw = r.node("conv2d", [stem, r.const(wd), r.const(bd)], (1, 16, 9, 9), padding=[1, 1, 1, 1], groups=16,
                has_bias=1, activation="clip", clip=[0.0, 6.0])
    proj = r.node("conv2d", [dw, r.const(wp), r.const(bp)], (1, 8, 9, 9), has_bias=1)
    y = r.node("conv2d", [proj, r.const(we), r.const(be), stem], (1, 16, 9, 9), has_bias=1, residual=1)
    r.outputs = [y]
    mod = r.module()
    (got,) = r.run(mod, x)
    s_ref = conv2d_ref(x, ws, bs, strides=(2, 2), padding=(1, 1, 1, 1), relu=True)
    d_ref = np.clip(conv2d_ref(s_ref, wd, bd, padding=(1, 1, 1, 1), groups=16), 0, 6)
    p_ref = conv2d_ref(d_ref, wp, bp)
    assert_close(got, conv2d_ref(p_ref, we, be) + s_ref)
    run_steps = [line for line in mod["get_plan"]() if line.startswith("run")]
    convs = [line for line in run_steps if "(conv2d) |" in line]
    assert len(convs) == 4, run_steps
    if "avx512" not in _C.isa():
        assert convs[0].endswith("dst=[1,16,9,9]:aBcd8b"), convs[0]
        for line in convs[1:]:
            assert "src=[1,16,9,9]:aBcd8b" in line or "src=[1,8,9,9]:aBcd8b" in line, line
            assert "jit_" in line and "ref" not in line, line
        assert not any("reorder" in line for line in run_steps[1:-1]), run_steps


def test_multi_output_region_and_intermediate_output():
    """An intermediate that is also a region output; two outputs in a given order."""
    r = Region("two_outputs")
    x = rand(1, 8, 6, 6)
    w1, w2 = rand(16, 8, 3, 3), rand(8, 16, 1, 1)
    t = r.node("conv2d", [r.input(x.shape), r.const(w1)], (1, 16, 6, 6), padding=[1, 1, 1, 1], activation="relu")
    y = r.node("conv2d", [t, r.const(w2)], (1, 8, 6, 6))
    r.outputs = [y, t]
    got_y, got_t = r.run(r.module(), x)
    want_t = conv2d_ref(x, w1, padding=(1, 1, 1, 1), relu=True)
    assert_close(got_t, want_t)
    assert_close(got_y, conv2d_ref(want_t, w2))


def test_dense_output_also_read_by_a_later_node():
    """dense writes plain: the region output buffer itself feeds the next node."""
    x, w1, w2 = rand(3, 8), rand(8, 8), rand(8, 5)
    r = Region("dense_out_reused")
    t = r.node("dense", [r.input(x.shape), r.const(w1)], (3, 8), weight_layout="KN", activation="relu")
    y = r.node("dense", [t, r.const(w2)], (3, 5), weight_layout="KN")
    r.outputs = [t, y]
    got_t, got_y = r.run(r.module(), x)
    want_t = dense_ref(x, w1, relu=True)
    assert_close(got_t, want_t)
    assert_close(got_y, dense_ref(want_t, w2))


def test_shared_constant_weight():
    """One constant read by two nodes (and by one of them in two layouts)."""
    x, w = rand(2, 6), rand(6, 6)
    r = Region("shared_weight")
    wi = r.const(w)
    t = r.node("dense", [r.input(x.shape), wi], (2, 6), weight_layout="KN")
    y = r.node("dense", [t, wi], (2, 6), weight_layout="NK")
    r.outputs = [y]
    (got,) = r.run(r.module(), x)
    assert_close(got, dense_ref(dense_ref(x, w), w, layout="NK"))


def test_conv_with_runtime_weight():
    """Weight and bias passed at run time (not constants): reordered per call."""
    r = Region("conv_runtime_weight")
    x, w, b = rand(1, 4, 7, 7), rand(6, 4, 3, 3), rand(6)
    xi, wi, bi = r.input(x.shape), r.input(w.shape), r.input(b.shape)
    r.outputs = [r.node("conv2d", [xi, wi, bi], (1, 6, 5, 5), has_bias=1, activation="relu")]
    mod = r.module(init=False)  # no constants: runs without __init_
    assert list(mod["get_const_vars"]()) == []
    (got,) = r.run(mod, x, w, b)
    assert_close(got, conv2d_ref(x, w, b, relu=True))
    (got2,) = r.run(mod, x, 2 * w, b)
    assert_close(got2, conv2d_ref(x, 2 * w, b, relu=True))


# ------------------------------------------------------------------------------------------------
# dense


@pytest.mark.parametrize("layout", ["KN", "NK"])
@pytest.mark.parametrize("data_shape", [(4, 24), (2, 3, 24)], ids=["2d", "3d"])
def test_dense(layout, data_shape):
    k, n = data_shape[-1], 10
    x = rand(*data_shape)
    w = rand(k, n) if layout == "KN" else rand(n, k)
    b = rand(n)
    r = Region("dense_" + layout)
    y = r.node("dense", [r.input(x.shape), r.const(w), r.const(b)], data_shape[:-1] + (n,),
               weight_layout=layout, has_bias=1, activation="relu")
    r.outputs = [y]
    mod = r.module()
    (got,) = r.run(mod, x)
    assert_close(got, dense_ref(x, w, b, layout, relu=True))
    # Where oneDNN runs it as its jit SGEMM (no AVX-512), the constant weight is kept transposed.
    (step,) = [line for line in mod["get_plan"]() if line.startswith("run") and "(dense) |" in line]
    if "| gemm:" in step:
        assert f"wei=[{k},{n}]:ba" in step, step


@pytest.mark.parametrize("layout", ["KN", "NK"])
def test_dense_runtime_weight_no_bias(layout):
    x = rand(3, 16)
    w = rand(16, 8) if layout == "KN" else rand(8, 16)
    r = Region("dense_rt")
    r.outputs = [r.node("dense", [r.input(x.shape), r.input(w.shape)], (3, 8), weight_layout=layout)]
    (got,) = r.run(r.module(init=False), x, w)
    assert_close(got, dense_ref(x, w, layout=layout))


def test_square_nk_weight_is_transposed():
    """K == N: the NK view must not be mistaken for KN."""
    x, w = rand(5, 12), rand(12, 12)
    for layout in ("KN", "NK"):
        r = Region("dense_square")
        r.outputs = [r.node("dense", [r.input(x.shape), r.const(w)], (5, 12), weight_layout=layout)]
        (got,) = r.run(r.module(), x)
        assert_close(got, dense_ref(x, w, layout=layout))


def test_conv_then_dense_reads_flattened_output():
    """dense flattens the conv's 4-D output: the planner makes a plain copy of it first."""
    x = rand(2, 3, 6, 6)
    w1, b1 = rand(8, 3, 3, 3), rand(8)
    w2, b2 = rand(10, 4), rand(10)
    r = Region("conv_dense")
    t = r.node("conv2d", [r.input(x.shape), r.const(w1), r.const(b1)], (2, 8, 4, 4), has_bias=1, activation="relu")
    y = r.node("dense", [t, r.const(w2), r.const(b2)], (2, 8, 4, 10), weight_layout="NK", has_bias=1)
    r.outputs = [y]
    (got,) = r.run(r.module(), x)
    assert_close(got, dense_ref(conv2d_ref(x, w1, b1, relu=True), w2, b2, "NK"))


def test_dense_chain_mlp():
    x = rand(4, 32)
    w1, b1, w2, b2 = rand(64, 32), rand(64), rand(64, 16), rand(16)
    r = Region("mlp")
    t = r.node("dense", [r.input(x.shape), r.const(w1), r.const(b1)], (4, 64), weight_layout="NK", has_bias=1, activation="relu")
    r.outputs = [r.node("dense", [t, r.const(w2), r.const(b2)], (4, 16), weight_layout="KN", has_bias=1)]
    (got,) = r.run(r.module(), x)
    assert_close(got, dense_ref(dense_ref(x, w1, b1, "NK", relu=True), w2, b2, "KN"))


# ------------------------------------------------------------------------------------------------
# Module surface, serialization, concurrency


def small_conv_region(symbol="small_conv"):
    r = Region(symbol)
    x = rand(1, 4, 8, 8)
    y = r.node("conv2d", [r.input(x.shape), r.const(rand(8, 4, 3, 3)), r.const(rand(8))], (1, 8, 8, 8),
               padding=[1, 1, 1, 1], has_bias=1, activation="relu")
    r.outputs = [y]
    return r, x


def test_module_functions():
    r, _ = small_conv_region()
    mod = r.module(init=False)
    assert mod.kind == "byoc_hetero"
    assert mod.is_binary_serializable() and mod.is_runnable()
    assert mod["get_symbol"]() == r.symbol
    assert list(mod["get_const_vars"]()) == [c["name"] for c in r.constants]
    assert json.loads(mod["get_graph_json"]()) == r.doc()
    assert mod.implements_function(r.symbol) and mod.implements_function(f"__init_{r.symbol}")
    assert not mod.implements_function("no_such_function")
    assert any("conv2d" in line for line in mod["get_plan"]())


def test_reinit_replaces_constants():
    r, x = small_conv_region()
    mod = r.module()
    (first,) = r.run(mod, x)
    doubled = [2 * v for v in r.const_values]
    mod[f"__init_{r.symbol}"]([tvm.runtime.tensor(v) for v in doubled])
    (second,) = r.run(mod, x)
    assert_close(second, conv2d_ref(x, doubled[0], doubled[1], padding=(1, 1, 1, 1), relu=True))
    assert not np.allclose(first, second)


def test_bytes_round_trip_in_process():
    r, x = small_conv_region()
    mod = r.module()
    blob = save_to_bytes(mod)
    assert bytes(blob[:8]) == b"BYOCHG02"
    text = bytes(blob[24:])  # after the magic, the document's digest (16 hex digits, cpp/digest.h)
    assert bytes(blob[8:24]).decode() == _C.digest(np.frombuffer(text, np.uint8))
    assert json.loads(text.decode()) == r.doc()
    mod2 = load_from_bytes(blob)
    assert mod2.kind == "byoc_hetero" and mod2["get_symbol"]() == r.symbol
    mod2[f"__init_{r.symbol}"]([tvm.runtime.tensor(v) for v in r.const_values])
    assert_close(r.run(mod2, x)[0], r.run(mod, x)[0])


def test_bytes_round_trip_in_a_fresh_process(tmp_path):
    r, x = small_conv_region()
    mod = r.module()
    (want,) = r.run(mod, x)
    (tmp_path / "region.bin").write_bytes(bytes(save_to_bytes(mod)))
    np.savez(tmp_path / "data.npz", x=x, *r.const_values)
    script = textwrap.dedent(
        f"""
        import numpy as np, tvm
        import byoc_hetero  # registers ffi.Module.load_from_bytes.byoc_hetero
        blob = open({str(tmp_path / "region.bin")!r}, "rb").read()
        mod = tvm.get_global_func("ffi.Module.load_from_bytes.byoc_hetero")(blob)
        d = np.load({str(tmp_path / "data.npz")!r})
        mod["__init_{r.symbol}"]([tvm.runtime.tensor(d["arr_0"]), tvm.runtime.tensor(d["arr_1"])])
        y = tvm.runtime.tensor(np.zeros({tuple(want.shape)!r}, "float32"))
        mod["{r.symbol}"](tvm.runtime.tensor(d["x"]), y)
        np.save({str(tmp_path / "y.npy")!r}, y.numpy())
        """
    )
    # cwd=tmp_path: the fresh process imports the installed package, not a source checkout
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_close(np.load(tmp_path / "y.npy"), want)


def test_concurrent_callers_share_one_module():
    r, _ = small_conv_region()
    mod = r.module()
    fn = mod[r.symbol]
    xs = [rand(1, 4, 8, 8) for _ in range(4)]
    wants = [conv2d_ref(x, *r.const_values, padding=(1, 1, 1, 1), relu=True) for x in xs]
    errors = []

    def worker(i):
        try:
            x = tvm.runtime.tensor(xs[i])
            y = tvm.runtime.tensor(np.zeros((1, 8, 8, 8), "float32"))
            for _ in range(20):
                fn(x, y)
                assert_close(y.numpy(), wants[i])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ------------------------------------------------------------------------------------------------
# Bad inputs: Python exceptions naming the region, never a crash


def test_run_rejects_bad_arguments():
    r, x = small_conv_region("bad_args")
    mod = r.module()
    fn = mod[r.symbol]
    good_x = tvm.runtime.tensor(x)
    good_y = tvm.runtime.tensor(np.zeros((1, 8, 8, 8), "float32"))
    with pytest.raises(ValueError, match=r"bad_args.*expected 2 arguments.*got 1"):
        fn(good_x)
    with pytest.raises(ValueError, match=r"bad_args.*expected 2 arguments.*got 3"):
        fn(good_x, good_y, good_y)
    with pytest.raises(ValueError, match=r"bad_args.*argument 0.*expected shape \[1, 4, 8, 8\], got shape \[1, 4, 8, 9\]"):
        fn(tvm.runtime.tensor(np.zeros((1, 4, 8, 9), "float32")), good_y)
    with pytest.raises(ValueError, match=r"bad_args.*argument 1 \(output 0.*expected shape"):
        fn(good_x, tvm.runtime.tensor(np.zeros((1, 8, 8), "float32")))
    with pytest.raises(ValueError, match=r"bad_args.*argument 0.*expected dtype float32, got dtype float64"):
        fn(tvm.runtime.tensor(np.zeros((1, 4, 8, 8), "float64")), good_y)
    with pytest.raises(ValueError, match=r"bad_args.*argument 0.*expected a Tensor"):
        fn(1.5, good_y)
    import tvm_ffi

    strided = np.zeros((1, 4, 8, 16), "float32")[..., ::2]
    with pytest.raises(ValueError, match=r"bad_args.*compact row-major"):
        fn(tvm_ffi.from_dlpack(strided), good_y)
    fn(good_x, good_y)  # still usable
    assert_close(good_y.numpy(), conv2d_ref(x, *r.const_values, padding=(1, 1, 1, 1), relu=True))


def test_run_before_init_raises():
    r, x = small_conv_region("never_initialized")
    mod = r.module(init=False)
    with pytest.raises(RuntimeError, match=r"never_initialized.*__init_never_initialized"):
        r.run(mod, x)


def test_init_rejects_bad_constants():
    r, _ = small_conv_region("bad_init")
    mod = r.module(init=False)
    init = mod["__init_bad_init"]
    with pytest.raises(ValueError, match=r"bad_init.*expected 2 constants.*got 1"):
        init([tvm.runtime.tensor(r.const_values[0])])
    with pytest.raises(ValueError, match=r"bad_init.*constant 1 .*expected shape \[8\]"):
        init([tvm.runtime.tensor(r.const_values[0]), tvm.runtime.tensor(np.zeros(7, "float32"))])
    with pytest.raises(ValueError, match=r"bad_init.*constant 0 .*float32"):
        init([tvm.runtime.tensor(r.const_values[0].astype("float64")), tvm.runtime.tensor(r.const_values[1])])


def conv_doc():
    r, _ = small_conv_region("doc_check")
    return r.doc()


def mutate(path, value):
    doc = conv_doc()
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("{not json", r"malformed JSON"),
        ("[1, 2]", r"must be a JSON object"),
        (mutate(["format"], "other"), r"doc_check.*'format'"),
        (mutate(["version"], 5), r"doc_check.*'version'.*expected 1 to 4"),
        (mutate(["tensors", 0, "dtype"], "float64"), r"doc_check.*'tensors\[0\]\.dtype'"),
        # float16 is a region dtype, for dense_wq's scales only
        (mutate(["tensors", 0, "dtype"], "float16"), r"doc_check.*tensor 0 has dtype float16, which op 'conv2d' does not read"),
        (mutate(["tensors", 0, "shape"], [1, -4, 8, 8]), r"doc_check.*'tensors\[0\]\.shape'"),
        (mutate(["nodes", 0, "inputs"], [0, 7, 2]), r"doc_check.*'nodes\[0\]\.inputs\[1\]'.*out of range"),
        (mutate(["nodes", 0, "output"], 99), r"doc_check.*'nodes\[0\]\.output'.*out of range"),
        (mutate(["nodes", 0, "output"], 0), r"doc_check.*'nodes\[0\]\.output'.*region input"),
        (mutate(["outputs"], [0]), r"doc_check.*'outputs\[0\]'.*written by a node"),
        (mutate(["inputs"], [3]), r"doc_check.*read before it is written"),
        (mutate(["constants", 0, "tensor"], -1), r"doc_check.*'constants\[0\]\.tensor'.*out of range"),
        (mutate(["nodes", 0, "op"], "no_such_op"), r"doc_check.*unknown op 'no_such_op'"),
        (mutate(["nodes", 0, "attrs", "activation"], "gelu"), r"doc_check.*attrs\.activation.*gelu"),
        (mutate(["nodes", 0, "attrs", "padding"], [1, 1]), r"doc_check.*attrs\.padding.*4 integers"),
        (mutate(["nodes", 0, "attrs", "activaton"], "relu"), r"doc_check.*attrs\.activaton.*unknown attribute"),
        (mutate(["nodes", 0, "attrs", "groups"], 3), r"doc_check.*groups=3"),
        (mutate(["nodes", 0, "attrs", "has_bias"], 0), r"doc_check.*expected 2 inputs"),
        (mutate(["tensors", 3, "shape"], [1, 8, 6, 6]), r"doc_check.*declared with shape \[1, 8, 6, 6\].*produces \[1, 8, 8, 8\]"),
        (mutate(["symbol"], KeyError), r"'symbol'.*missing"),
    ],
    ids=lambda v: v if len(str(v)) < 30 else None,
)
def test_bad_documents_raise(text, pattern):
    with pytest.raises(ValueError, match=pattern):
        create(text)


def test_dense_needs_weight_layout():
    r = Region("dense_no_layout")
    r.outputs = [r.node("dense", [r.input((2, 4)), r.const(rand(4, 3))], (2, 3))]
    with pytest.raises(ValueError, match=r"dense_no_layout.*weight_layout.*missing"):
        create(r.json())
    r.nodes[0]["attrs"]["weight_layout"] = "NK"  # [4, 3] read as N=4, K=3: K does not match data
    with pytest.raises(ValueError, match=r"dense_no_layout.*K=3.*K=4"):
        create(r.json())


def test_onednn_failure_is_a_python_error_naming_the_node():
    """A 1 PiB constant weight: it cannot be allocated; the error names region and node."""
    r = Region("too_big")
    wi = r.tensor((1 << 24, 1 << 24))
    r.constants.append({"tensor": wi, "name": "too_big_const_0"})
    r.outputs = [r.node("dense", [r.input((1, 1 << 24)), wi], (1, 1 << 24), weight_layout="KN")]
    with pytest.raises(RuntimeError, match=r"too_big' node 0 \(dense\).*(oneDNN failed|out of memory)"):
        create(r.json())


def test_load_from_bytes_rejects_bad_blobs():
    from byoc_hetero.errors import IntegrityError

    def signed(text: bytes) -> bytes:
        return b"BYOCHG02" + _C.digest(np.frombuffer(text, np.uint8)).encode() + text

    with pytest.raises(IntegrityError, match="BYOCHG02"):
        load_from_bytes(b"NOTMAGIC{}")
    with pytest.raises(IntegrityError, match="BYOCHG01.*older byoc_hetero.*damaged.*re-export"):
        load_from_bytes(b"BYOCHG01" + b"0" * 16 + b"{}")  # the format before digests, with a digest: damage
    # a library exported before the digests still loads (unchecked): its document follows the magic
    old = Region("old_format")
    old.outputs = [old.node("eltwise", [old.input((2, 3))], (2, 3), algorithm="relu")]
    legacy = load_from_bytes(b"BYOCHG01" + json.dumps(dict(old.doc(), version=3)).encode())
    np.testing.assert_array_equal(old.run(legacy, np.array([[-1, 2, -3], [4, -5, 6]], "float32"))[0],
                                  [[0, 2, 0], [4, 0, 6]])
    with pytest.raises(ValueError, match="malformed JSON"):
        load_from_bytes(signed(b"{"))
    damaged = bytearray(signed(b'{"symbol": "r1", "x": 1}'))
    damaged[-3] ^= 4
    with pytest.raises(IntegrityError, match=r"region 'r1' .*damaged.*re-export"):
        load_from_bytes(bytes(damaged))


def test_validate_helper():
    assert _C.validate(json.dumps(conv_doc())) == "doc_check"
    with pytest.raises(ValueError, match=r"doc_check.*'version'"):
        _C.validate(mutate(["version"], 5))


# ------------------------------------------------------------------------------------------------
# The ops beyond conv2d and dense: hand-written nodes vs numpy


def pool2d_ref(x, kernel, strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), ceil_mode=False,
               algorithm="max"):
    """Direct pooling over padded windows (count_include_pad semantics per algorithm)."""
    n, c, h, w = x.shape
    top, left, bottom, right = padding
    out = []
    for axis, (size, k, s, lo, hi, d) in enumerate(zip((h, w), kernel, strides, (top, left), (bottom, right), dilation)):
        extent = (k - 1) * d + 1
        span = size + lo + hi - extent
        o = (span + s - 1) // s + 1 if ceil_mode else span // s + 1
        out.append(o)
    oh, ow = out
    res = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            vals, in_pad = [], 0
            for a in range(kernel[0]):
                for b in range(kernel[1]):
                    y = i * strides[0] - top + a * dilation[0]
                    z = j * strides[1] - left + b * dilation[1]
                    if 0 <= y < h and 0 <= z < w:
                        vals.append(x[:, :, y, z].astype("float64"))
                    elif y < h + bottom and z < w + right:
                        in_pad += 1  # a position of the declared padding
            stack = np.stack(vals)
            if algorithm == "max":
                res[:, :, i, j] = stack.max(0)
            elif algorithm == "avg_include_padding":
                res[:, :, i, j] = stack.sum(0) / (len(vals) + in_pad)
            else:
                res[:, :, i, j] = stack.mean(0)
    return res


def act_ref(name, x, clip=None):
    import math

    x = x.astype("float64")
    if name == "relu":
        return np.maximum(x, 0)
    if name == "clip":
        return np.clip(x, clip[0], clip[1])
    if name == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if name == "tanh":
        return np.tanh(x)
    if name == "gelu_erf":
        return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    if name == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if name == "silu":
        return x / (1 + np.exp(-x))
    raise ValueError(name)


ACTS = [("relu", None), ("clip", [0.0, 6.0]), ("clip", [-0.5, 0.25]), ("sigmoid", None), ("tanh", None),
        ("gelu_erf", None), ("gelu_tanh", None), ("silu", None)]


@pytest.mark.parametrize("act, clip", ACTS, ids=lambda v: str(v))
def test_conv2d_fused_activations(act, clip):
    x, w, b = rand(1, 4, 6, 6), rand(8, 4, 3, 3), rand(8)
    r = Region("conv_act")
    attrs = dict(padding=[1, 1, 1, 1], has_bias=1, activation=act)
    if clip:
        attrs["clip"] = clip
    r.outputs = [r.node("conv2d", [r.input(x.shape), r.const(w), r.const(b)], (1, 8, 6, 6), **attrs)]
    (got,) = r.run(r.module(), x)
    assert_close(got, act_ref(act, conv2d_ref(x, w, b, padding=(1, 1, 1, 1)), clip))


@pytest.mark.parametrize("act, clip", ACTS, ids=lambda v: str(v))
def test_eltwise_and_dense_activations(act, clip):
    x, w = rand(3, 16), rand(16, 8)
    r = Region("eltwise_act")
    extra = {"clip": clip} if clip else {}
    t = r.node("dense", [r.input(x.shape), r.const(w)], (3, 8), weight_layout="KN", activation=act, **extra)
    r.outputs = [t, r.node("eltwise", [t], (3, 8), algorithm=act, **extra)]
    got_t, got_y = r.run(r.module(), x)
    want_t = act_ref(act, dense_ref(x, w), clip)
    assert_close(got_t, want_t)
    assert_close(got_y, act_ref(act, want_t, clip))


@pytest.mark.parametrize("order", ["in_place", "copy"])
def test_conv2d_residual_sum_post_op(order):
    """act2(act1(conv + b) + residual): in place when the residual dies there, else copied."""
    x, w1, w2, b2 = rand(1, 8, 6, 6), rand(8, 8, 3, 3), rand(8, 8, 3, 3), rand(8)
    r = Region("conv_residual_" + order)
    xi = r.input(x.shape)
    t = r.node("conv2d", [xi, r.const(w1)], (1, 8, 6, 6), padding=[1, 1, 1, 1])
    y = r.node("conv2d", [t, r.const(w2), r.const(b2), t if order == "copy" else xi], (1, 8, 6, 6),
               padding=[1, 1, 1, 1], has_bias=1, activation="tanh", residual=1, post_activation="relu")
    r.outputs = [y]
    mod = r.module()
    (got,) = r.run(mod, x)
    mid = conv2d_ref(x, w1, padding=(1, 1, 1, 1))
    res = mid if order == "copy" else x
    assert_close(got, np.maximum(np.tanh(conv2d_ref(mid, w2, b2, padding=(1, 1, 1, 1))) + res, 0))
    plan = [line for line in mod["get_plan"]() if line.startswith("run")]
    # a region input is never written: its value is copied into the output first
    assert any("copied into the output" in line for line in plan)


def test_residual_accumulates_in_place_into_a_dying_intermediate():
    x, w0, w1, w2 = rand(1, 8, 6, 6), rand(8, 8, 1, 1), rand(8, 8, 3, 3), rand(8, 8, 3, 3)
    r = Region("conv_in_place")
    t0 = r.node("conv2d", [r.input(x.shape), r.const(w0)], (1, 8, 6, 6), activation="relu")
    t1 = r.node("conv2d", [t0, r.const(w1)], (1, 8, 6, 6), padding=[1, 1, 1, 1], activation="relu")
    y = r.node("conv2d", [t1, r.const(w2), t0], (1, 8, 6, 6), padding=[1, 1, 1, 1], residual=1)
    r.outputs = [y]
    mod = r.module()
    (got,) = r.run(mod, x)
    a = np.maximum(conv2d_ref(x, w0), 0)
    bb = np.maximum(conv2d_ref(a, w1, padding=(1, 1, 1, 1)), 0)
    assert_close(got, conv2d_ref(bb, w2, padding=(1, 1, 1, 1)) + a)
    plan = [line for line in mod["get_plan"]() if line.startswith("run")]
    assert not any("copied into the output" in line for line in plan), plan
    (again,) = r.run(mod, x)  # no state left over from the previous call
    assert_close(again, got)


def test_dense_residual_and_post_activation():
    x, w, b, res = rand(4, 8), rand(8, 8), rand(8), rand(4, 8)
    r = Region("dense_res")
    r.outputs = [r.node("dense", [r.input(x.shape), r.const(w), r.const(b), r.input(res.shape)], (4, 8),
                        weight_layout="NK", has_bias=1, residual=1, post_activation="clip", post_clip=[0, 1])]
    (got,) = r.run(r.module(), x, res)
    assert_close(got, np.clip(dense_ref(x, w, b, "NK") + res, 0, 1))


@pytest.mark.parametrize(
    "case",
    [
        dict(algorithm="max", kernel=(2, 2), strides=(2, 2)),
        dict(algorithm="max", kernel=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1)),
        dict(algorithm="max", kernel=(3, 3), strides=(2, 2), padding=(0, 1, 1, 0), ceil_mode=True),
        dict(algorithm="max", kernel=(2, 3), strides=(1, 2), dilation=(2, 1)),
        dict(algorithm="avg_include_padding", kernel=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1)),
        dict(algorithm="avg_exclude_padding", kernel=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1)),
        dict(algorithm="avg_exclude_padding", kernel=(3, 3), strides=(2, 2), padding=(1, 1, 0, 0), ceil_mode=True),
        dict(algorithm="avg_exclude_padding", kernel=(7, 9), strides=(1, 1)),
    ],
    ids=["max2x2", "max3x3pad", "max_ceil_asym", "max_dilated", "avg_incl", "avg_excl", "avg_excl_ceil", "global"],
)
@pytest.mark.parametrize("after_conv", [False, True], ids=["plain_in", "blocked_in"])
def test_pool2d(case, after_conv):
    x = rand(2, 16, 7, 9)
    r = Region("pool")
    src = r.input(x.shape)
    if after_conv:  # the pool reads the conv's blocked layout
        w = rand(16, 16, 1, 1)
        src = r.node("conv2d", [src, r.const(w)], x.shape)
        x_in = conv2d_ref(x, w)
    else:
        x_in = x
    want = pool2d_ref(x_in, **case)
    attrs = {k: (list(v) if isinstance(v, tuple) else int(v) if isinstance(v, bool) else v) for k, v in case.items()}
    r.outputs = [r.node("pool2d", [src], want.shape, **attrs)]
    (got,) = r.run(r.module(), x)
    assert_close(got, want)


def test_pool2d_bad_attrs():
    r = Region("bad_pool")
    r.outputs = [r.node("pool2d", [r.input((1, 4, 6, 6))], (1, 4, 3, 3), algorithm="max", kernel=[2, 2], strides=[2, 2])]
    create(r.json())
    r.nodes[0]["attrs"]["algorithm"] = "median"
    with pytest.raises(ValueError, match=r"bad_pool.*attrs\.algorithm.*median"):
        create(r.json())
    r.nodes[0]["attrs"].update(algorithm="max", kernel=[2, 2, 2])
    with pytest.raises(ValueError, match=r"bad_pool.*attrs\.kernel"):
        create(r.json())
    r.nodes[0]["attrs"].update(kernel=[2, 2], strides=[1, 1])
    with pytest.raises(ValueError, match=r"bad_pool.*declared with shape \[1, 4, 3, 3\].*produces \[1, 4, 5, 5\]"):
        create(r.json())


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (2, 3, 5)[1:]), ((1, 8, 1, 1), (2, 8, 5, 5)),
     ((2, 8, 5, 5), (8, 1, 1)), ((), (3, 4))],
    ids=["same", "row", "col_first", "channel_first", "channel", "scalar"],
)
@pytest.mark.parametrize("algorithm", ["add", "mul"])
def test_binary_broadcasting(a_shape, b_shape, algorithm):
    a, b = rand(*a_shape), rand(*b_shape)
    want = a.astype("float64") + b if algorithm == "add" else a.astype("float64") * b
    r = Region("binary")
    r.outputs = [r.node("binary", [r.input(a.shape), r.input(b.shape)], want.shape, algorithm=algorithm,
                        activation="sigmoid")]
    (got,) = r.run(r.module(), a, b)
    assert_close(got, 1 / (1 + np.exp(-want)))


@pytest.mark.parametrize("alg", ["add", "sub", "div", "max"])
def test_binary_broadcasts_both_sides(alg):
    """Neither input has the output shape: input 0 is expanded first (kernels/binary.cc)."""
    a, b = rand(3, 1), rand(1, 4) + 2
    r = Region("two_sided_" + alg)
    r.outputs = [r.node("binary", [r.input((3, 1)), r.input((1, 4))], (3, 4), algorithm=alg)]
    (got,) = r.run(r.module(), a, b)
    ref = {"add": np.add, "sub": np.subtract, "div": np.divide, "max": np.maximum}[alg]
    assert_close(got, ref(a, b))


def test_binary_of_blocked_conv_outputs():
    """Both operands come out of convolutions in oneDNN's blocked layout."""
    x, w1, w2 = rand(1, 16, 5, 5), rand(16, 16, 3, 3), rand(16, 16, 1, 1)
    r = Region("binary_blocked")
    xi = r.input(x.shape)
    t1 = r.node("conv2d", [xi, r.const(w1)], x.shape, padding=[1, 1, 1, 1])
    t2 = r.node("conv2d", [xi, r.const(w2)], x.shape)
    scale = rand(1, 16, 1, 1)
    s = r.node("binary", [t1, t2], x.shape, algorithm="add", activation="relu")
    r.outputs = [r.node("binary", [r.const(scale), s], x.shape, algorithm="mul")]
    (got,) = r.run(r.module(), x)
    assert_close(got, scale * np.maximum(conv2d_ref(x, w1, padding=(1, 1, 1, 1)) + conv2d_ref(x, w2), 0))


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(axis):
    x = rand(3, 7) * 4
    r = Region("softmax")
    r.outputs = [r.node("softmax", [r.input(x.shape)], x.shape, axis=axis)]
    (got,) = r.run(r.module(), x)
    e = np.exp(x.astype("float64") - x.max(axis=axis, keepdims=True))
    assert_close(got, e / e.sum(axis=axis, keepdims=True))


def test_reshape_flatten_before_dense_and_as_output():
    x, w = rand(2, 16, 3, 3), rand(16, 16, 3, 3)
    wd = rand(10, 144)
    r = Region("flatten")
    t = r.node("conv2d", [r.input(x.shape), r.const(w)], (2, 16, 3, 3), padding=[1, 1, 1, 1], activation="relu")
    f = r.node("reshape", [t], (2, 144))
    y = r.node("dense", [f, r.const(wd)], (2, 10), weight_layout="NK")
    r.outputs = [y, f]
    got_y, got_f = r.run(r.module(), x)
    want_f = np.maximum(conv2d_ref(x, w, padding=(1, 1, 1, 1)), 0).reshape(2, 144)
    assert_close(got_f, want_f)
    assert_close(got_y, dense_ref(want_f, wd, layout="NK"))
    bad = Region("bad_reshape")
    bad.outputs = [bad.node("reshape", [bad.input((2, 3))], (7,))]
    with pytest.raises(ValueError, match=r"bad_reshape.*cannot reshape \[2, 3\] \(6 elements\) to \[7\]"):
        create(bad.json())


@pytest.mark.parametrize(
    "a_shape, b_shape, transpose_b",
    [((2, 4, 8), (2, 8, 5), False), ((2, 4, 8), (2, 5, 8), True), ((1, 4, 8), (3, 8, 5), False),
     ((4, 8), (3, 2, 8, 5), False), ((2, 1, 4, 8), (1, 3, 5, 8), True)],
    ids=["batched", "transposed", "broadcast_a", "rank_up", "broadcast_both"],
)
@pytest.mark.parametrize("b_const", [False, True], ids=["b_runtime", "b_const"])
def test_batched_matmul(a_shape, b_shape, transpose_b, b_const):
    a, b, bias = rand(*a_shape), rand(*b_shape), rand(5)
    bm = np.swapaxes(b, -1, -2) if transpose_b else b
    want = np.matmul(a.astype("float64"), bm) + bias
    r = Region("bmm")
    ai = r.input(a.shape)
    bi = r.const(b) if b_const else r.input(b.shape)
    r.outputs = [r.node("matmul", [ai, bi, r.const(bias)], want.shape, transpose_b=int(transpose_b), has_bias=1,
                        activation="gelu_tanh")]
    mod = r.module()
    (got,) = r.run(mod, a) if b_const else r.run(mod, a, b)
    assert_close(got, act_ref("gelu_tanh", want))


def test_batch_norm_folding_runs_once_at_init():
    """bn_fold_weight / bn_fold_bias of constants run in __init_, the convolution sees the result."""
    x, w, b = rand(1, 4, 6, 6), rand(8, 4, 3, 3), rand(8)
    gamma, beta, mean = rand(8), rand(8), rand(8)
    var = rng.uniform(0.5, 1.5, 8).astype("float32")
    r = Region("folded_conv")
    wi, bi = r.const(w), r.const(b)
    stats = [r.const(v) for v in (gamma, beta, mean, var)]
    fw = r.node("bn_fold_weight", [wi, stats[0], stats[3]], w.shape, epsilon=1e-3)
    fb = r.node("bn_fold_bias", stats + [bi], (8,), epsilon=1e-3, has_bias=1)
    r.outputs = [r.node("conv2d", [r.input(x.shape), fw, fb], (1, 8, 6, 6), padding=[1, 1, 1, 1], has_bias=1,
                        activation="clip", clip=[0, 6])]
    mod = r.module()
    (got,) = r.run(mod, x)
    y = conv2d_ref(x, w, b, padding=(1, 1, 1, 1))
    scale = (gamma / np.sqrt(var.astype("float64") + 1e-3)).reshape(1, 8, 1, 1)
    want = np.clip((y - mean.reshape(1, 8, 1, 1)) * scale + beta.reshape(1, 8, 1, 1), 0, 6)
    assert_close(got, want)
    plan = mod["get_plan"]()
    assert any(line.startswith("init") and "bn_fold_weight" in line for line in plan)
    assert not any(line.startswith("run") and "bn_fold" in line for line in plan), plan
    # re-init with other statistics replaces the folded weights
    gamma2 = 2 * gamma
    consts = list(r.const_values)
    consts[2] = gamma2
    mod["__init_folded_conv"]([tvm.runtime.tensor(v) for v in consts])
    (got2,) = r.run(mod, x)
    assert_close(got2, np.clip((y - mean.reshape(1, 8, 1, 1)) * 2 * scale + beta.reshape(1, 8, 1, 1), 0, 6))


def test_batch_norm_folding_of_runtime_statistics_runs_per_call():
    x, w = rand(1, 4, 5, 5), rand(6, 4, 1, 1)
    gamma, beta, mean = rand(6), rand(6), rand(6)
    var = rng.uniform(0.5, 1.5, 6).astype("float32")
    r = Region("runtime_stats")
    xi, wi = r.input(x.shape), r.input(w.shape)
    stats = [r.input(v.shape) for v in (gamma, beta, mean, var)]
    fw = r.node("bn_fold_weight", [wi, stats[0], stats[3]], w.shape, epsilon=1e-5)
    fb = r.node("bn_fold_bias", stats, (6,), epsilon=1e-5)
    r.outputs = [r.node("conv2d", [xi, fw, fb], (1, 6, 5, 5), has_bias=1)]
    mod = r.module(init=False)
    assert any(line.startswith("run") and "bn_fold_weight" in line for line in mod["get_plan"]())
    for k in (1.0, 3.0):
        (got,) = r.run(mod, x, w, k * gamma, beta, mean, var)
        scale = (k * gamma / np.sqrt(var.astype("float64") + 1e-5)).reshape(1, 6, 1, 1)
        assert_close(got, (conv2d_ref(x, w) - mean.reshape(1, 6, 1, 1)) * scale + beta.reshape(1, 6, 1, 1))


@pytest.mark.parametrize(
    "attrs, pattern",
    [
        (dict(activation="clip"), r"attrs\.clip.*missing"),
        (dict(activation="relu", clip=[0, 6]), r"attrs\.clip.*only allowed"),
        (dict(activation="clip", clip=[6, 0]), r"attrs\.clip.*min <= max"),
        (dict(post_activation="relu"), r"attrs\.post_activation.*needs residual"),
        (dict(residual=1), r"expected 4 inputs \(data, weight, bias, residual\), got 3"),
    ],
)
def test_bad_epilogue_attrs(attrs, pattern):
    r = Region("bad_epilogue")
    r.outputs = [r.node("conv2d", [r.input((1, 4, 6, 6)), r.const(rand(8, 4, 3, 3)), r.const(rand(8))], (1, 8, 6, 6),
                        padding=[1, 1, 1, 1], has_bias=1, **attrs)]
    with pytest.raises(ValueError, match=r"bad_epilogue.*" + pattern):
        create(r.json())


def test_run_rejects_misaligned_data():
    import tvm_ffi

    r, x = small_conv_region("misaligned")
    mod = r.module()
    raw = np.zeros(x.size * 4 + 4, np.uint8)
    view = raw[2 : 2 + x.size * 4].view(np.float32).reshape(x.shape)
    assert not view.flags.aligned
    y = tvm.runtime.tensor(np.zeros((1, 8, 8, 8), "float32"))
    with pytest.raises(ValueError, match=r"misaligned.*argument 0 \(input 0.*expected data aligned to 4 bytes.*misaligned by 2"):
        mod[r.symbol](tvm_ffi.from_dlpack(view), y)


def test_runtime_info_and_profile():
    r, x = small_conv_region("profiled")
    mod = r.module()
    info = json.loads(mod["get_runtime_info"]())
    assert info["threads"] >= 1 and info["contexts"] == 1 and info["shared_bytes"] > 0
    mod["set_profiling"](True)
    for _ in range(3):
        r.run(mod, x)
    steps = json.loads(mod["get_profile"]())
    conv = [s for s in steps if s["phase"] == "run" and s["op"] == "conv2d"]
    assert len(conv) == 1 and conv[0]["calls"] == 3 and conv[0]["seconds"] > 0
    mod["reset_profile"]()
    mod["set_profiling"](False)
    r.run(mod, x)
    assert all(s["calls"] == 0 for s in json.loads(mod["get_profile"]()))


def test_intermediates_share_memory_by_lifetime():
    """A chain of 8 convolutions: each intermediate dies at the next node, so the context holds
    far fewer than 7 intermediates' bytes; results are still right call after call."""
    x = rand(1, 16, 10, 10)
    ws = [rand(16, 16, 3, 3) * 0.3 for _ in range(8)]
    r = Region("chain8")
    t = r.input(x.shape)
    for w in ws:
        t = r.node("conv2d", [t, r.const(w)], x.shape, padding=[1, 1, 1, 1], activation="tanh")
    r.outputs = [t]
    mod = r.module()
    want = x
    for w in ws:
        want = np.tanh(conv2d_ref(want, w, padding=(1, 1, 1, 1)))
    for _ in range(2):
        (got,) = r.run(mod, x)
        assert_close(got, want)
    one = x.size * 4
    info = json.loads(mod["get_runtime_info"]())
    assert info["context_bytes"] < 4 * one, info  # 7 intermediates + the output's blocked copy otherwise


# ------------------------------------------------------------------------------------------------
# conv2d by Winograd F(4x4, 3x3): chosen for 3x3 stride-1 convolutions with constant weights,
# channels in multiples of 16 and at least 25 output tiles (BYOC_HETERO_CONV_ALGO=auto), forced
# for every such convolution with =winograd, never with =direct.


def winograd_steps(mod) -> list[str]:
    return [line for line in mod["get_plan"]() if "winograd" in line]


def conv_region(x_shape, w, b=None, residual=None, symbol="wino", **attrs):
    r = Region(symbol)
    inputs = [r.input(x_shape), r.const(w)] + ([r.const(b)] if b is not None else [])
    if residual is not None:
        inputs.append(r.input(residual.shape))
    attrs.setdefault("padding", [1, 1, 1, 1])
    pad, stride, dil = attrs["padding"], attrs.get("strides", [1, 1]), attrs.get("dilation", [1, 1])
    oh = conv_out_size(x_shape[2], 3, stride[0], pad[0], pad[2], dil[0])
    ow = conv_out_size(x_shape[3], 3, stride[1], pad[1], pad[3], dil[1])
    r.outputs = [r.node("conv2d", inputs, (x_shape[0], w.shape[0], oh, ow), has_bias=int(b is not None),
                        residual=int(residual is not None), **attrs)]
    return r


@pytest.mark.parametrize(
    "n, c, o, h, wd, padding",
    [
        (1, 16, 32, 16, 16, [1, 1, 1, 1]),   # 16 whole tiles
        (2, 32, 16, 13, 11, [1, 1, 1, 1]),   # partial tiles at the far edges, two images
        (1, 16, 16, 18, 17, [0, 0, 0, 0]),   # no padding
        (1, 48, 32, 15, 19, [0, 1, 2, 1]),   # asymmetric padding
        (1, 16, 16, 9, 30, [2, 2, 2, 2]),    # padding wider than the kernel's reach
    ],
    ids=["whole_tiles", "edges_batch2", "no_pad", "asym_pad", "wide_pad"],
)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("layout", ["nChw16c", "nhwc"])
def test_winograd_conv2d_matches_numpy(monkeypatch, n, c, o, h, wd, padding, bias, layout):
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "winograd")
    monkeypatch.setenv("BYOC_HETERO_WINOGRAD_LAYOUT", layout)
    x, w, b = rand(n, c, h, wd), rand(o, c, 3, 3), rand(o) if bias else None
    r = conv_region(x.shape, w, b, padding=padding)
    mod = r.module()
    steps = winograd_steps(mod)
    assert len(steps) == 4, mod["get_plan"]()  # weights at init; 3 steps per call
    tag = "aBcd16b" if layout == "nChw16c" or o == 16 else "acdb"  # the same bytes for 16 channels
    assert f"out=[{n},{o},{r.tensors[r.outputs[0]]['shape'][2]},{r.tensors[r.outputs[0]]['shape'][3]}]:{tag}" in steps[-1]
    (got,) = r.run(mod, x)
    assert_close(got, conv2d_ref(x, w, b, padding=padding))
    (again,) = r.run(mod, x)
    np.testing.assert_array_equal(again, got)


@pytest.mark.parametrize("act, clip", ACTS, ids=lambda v: str(v))
def test_winograd_conv2d_activations(monkeypatch, act, clip):
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "winograd")
    x, w, b = rand(1, 16, 10, 10), rand(16, 16, 3, 3) * 0.3, rand(16)
    attrs = dict(padding=[1, 1, 1, 1], activation=act, **({"clip": clip} if clip else {}))
    r = conv_region(x.shape, w, b, **attrs)
    mod = r.module()
    assert winograd_steps(mod)
    (got,) = r.run(mod, x)
    assert_close(got, act_ref(act, conv2d_ref(x, w, b, padding=(1, 1, 1, 1)), clip))


@pytest.mark.parametrize("order", ["in_place", "copy"])
@pytest.mark.parametrize("layout", ["nChw16c", "nhwc"])
def test_winograd_conv2d_residual_and_post_activation(monkeypatch, order, layout):
    """act2(act1(conv + b) + residual): in place into a dying intermediate, else copied first."""
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "winograd")
    monkeypatch.setenv("BYOC_HETERO_WINOGRAD_LAYOUT", layout)
    x = rand(1, 16, 12, 12)
    (w0, w1, w2), b2 = (rand(16, 16, 3, 3) * 0.3 for _ in range(3)), rand(16)
    r = Region("wino_residual_" + order)
    xi = r.input(x.shape)
    t0 = r.node("conv2d", [xi, r.const(w0)], x.shape, padding=[1, 1, 1, 1], activation="relu")
    t1 = r.node("conv2d", [t0, r.const(w1)], x.shape, padding=[1, 1, 1, 1], activation="relu")
    y = r.node("conv2d", [t1, r.const(w2), r.const(b2), t0 if order == "in_place" else xi], x.shape,
               padding=[1, 1, 1, 1], has_bias=1, activation="sigmoid", residual=1, post_activation="relu")
    r.outputs = [y]
    mod = r.module()
    assert len(winograd_steps(mod)) == 12
    plan = [line for line in mod["get_plan"]() if line.startswith("run")]
    assert any("copied into the output" in line for line in plan) == (order == "copy"), plan
    (got,) = r.run(mod, x)
    a = np.maximum(conv2d_ref(x, w0, padding=(1, 1, 1, 1)), 0)
    bb = np.maximum(conv2d_ref(a, w1, padding=(1, 1, 1, 1)), 0)
    res = a if order == "in_place" else x
    sig = 1 / (1 + np.exp(-conv2d_ref(bb, w2, b2, padding=(1, 1, 1, 1))))
    assert_close(got, np.maximum(sig + res, 0))


def test_winograd_choice_follows_the_setting_and_the_shape(monkeypatch):
    x, w = rand(1, 16, 20, 20), rand(32, 16, 3, 3)
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "auto")
    assert winograd_steps(conv_region(x.shape, w).module())  # 25 tiles: pays off
    small = rand(1, 16, 16, 16)
    assert not winograd_steps(conv_region(small.shape, w).module())  # 16 tiles: direct
    assert winograd_steps(conv_region((2, 16, 16, 16), w).module())  # 32 tiles over two images
    odd = rand(8, 12, 3, 3)  # channels not multiples of 16
    assert not winograd_steps(conv_region((1, 12, 16, 16), odd).module())
    assert not winograd_steps(conv_region(x.shape, w, strides=[2, 2]).module())  # stride 2: direct
    big = rand(1, 16, 40, 40)
    assert not winograd_steps(conv_region(big.shape, w, dilation=[2, 2], padding=[2, 2, 2, 2]).module())
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "direct")
    assert not winograd_steps(conv_region(x.shape, w).module())
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "fastest")
    with pytest.raises(ValueError, match="BYOC_HETERO_CONV_ALGO must be auto, direct or winograd, got 'fastest'"):
        conv_region(x.shape, w).module()


def test_conv_algo_attribute_decides_per_node(monkeypatch):
    """A node's `algo` (a tuner's measured decision) wins over the thresholds and the process-wide
    setting; `auto` nodes follow the setting; both algorithms give the numpy result."""
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "auto")
    small, big, w = rand(1, 16, 16, 16), rand(1, 16, 20, 20), rand(32, 16, 3, 3)
    assert winograd_steps(conv_region(small.shape, w, algo="winograd").module())  # 16 tiles: forced
    assert not winograd_steps(conv_region(big.shape, w, algo="direct").module())  # 25 tiles: refused
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "direct")
    assert winograd_steps(conv_region(big.shape, w, algo="winograd").module())
    assert not winograd_steps(conv_region(big.shape, w, algo="auto").module())
    # where Winograd does not apply (stride 2), "winograd" runs the direct convolution
    assert not winograd_steps(conv_region(big.shape, w, algo="winograd", strides=[2, 2]).module())
    for algo in ("direct", "winograd"):
        r = conv_region(small.shape, w, algo=algo)
        (got,) = r.run(r.module(), small)
        assert_close(got, conv2d_ref(small, w, padding=(1, 1, 1, 1)))
    with pytest.raises(ValueError, match=r"attrs.algo': expected one of \"auto\", \"direct\", \"winograd\", got \"fft\""):
        conv_region(small.shape, w, algo="fft").module()


def test_winograd_not_chosen_when_its_tile_buffers_would_exceed_256_mib(monkeypatch):
    """112 -> 1024 channels (112 x 9 input taps: within the accuracy bound) at 168x168: 1,764 tiles,
    36 x 1,764 x 1,136 floats = 275 MiB of tiles."""
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "auto")
    w = np.zeros((1024, 112, 3, 3), "float32")
    assert not winograd_steps(conv_region((1, 112, 168, 168), w).module(init=False))
    assert winograd_steps(conv_region((1, 112, 160, 160), w).module(init=False))  # 1,600 tiles: 250 MiB


def _relative_to_float64(got: np.ndarray, want64: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype("float64") - want64)) / np.max(np.abs(want64)))


def test_auto_keeps_wide_3x3_convs_within_1e5_of_float64(monkeypatch):
    """Winograd F(4x4, 3x3)'s float32 error grows with the input taps C x 9 (bench/ZOO.md, session
    10: 1.1e-5 relative to float64 at 1024 channels, the direct convolution 1.5e-6): "auto" runs a
    1024-channel 3x3 conv (25 tiles: Winograd by the speed thresholds) direct and stays within 1e-5;
    an explicit "winograd" still runs Winograd there, less exactly."""
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "auto")
    c = 1024
    assert 16 * 9 <= _C.winograd_auto_max_taps() < c * 9
    x = np.maximum(rand(1, c, 20, 20), 0)  # post-relu data, as between a network's convs
    w = rand(16, c, 3, 3) * np.float32(np.sqrt(2.0 / (9 * c)))  # He-scaled weights
    want = conv2d_ref(x, w, padding=(1, 1, 1, 1))
    r = conv_region(x.shape, w)
    mod = r.module()
    assert not winograd_steps(mod), mod["get_plan"]()
    auto_err = _relative_to_float64(r.run(mod, x)[0], want)
    assert auto_err <= 1e-5, auto_err
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "winograd")
    mod = r.module()
    assert winograd_steps(mod)
    wino_err = _relative_to_float64(r.run(mod, x)[0], want)
    assert auto_err < wino_err <= 1e-4, (auto_err, wino_err)
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "auto")
    assert winograd_steps(conv_region(x.shape, w, algo="winograd").module())  # a tuner's / user's choice


def test_auto_runs_winograd_up_to_the_accuracy_bound(monkeypatch):
    """The bound counts input taps per output: the widest 3x3 conv under it still gets Winograd."""
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "auto")
    widest = _C.winograd_auto_max_taps() // 9 // 16 * 16
    w = np.zeros((16, widest, 3, 3), "float32")
    assert winograd_steps(conv_region((1, widest, 20, 20), w).module(init=False))
    w = np.zeros((16, widest + 16, 3, 3), "float32")
    assert not winograd_steps(conv_region((1, widest + 16, 20, 20), w).module(init=False))


def test_winograd_not_used_for_runtime_weights(monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "winograd")
    x, w = rand(1, 16, 16, 16), rand(16, 16, 3, 3)
    r = Region("wino_runtime_weight")
    r.outputs = [r.node("conv2d", [r.input(x.shape), r.input(w.shape)], x.shape, padding=[1, 1, 1, 1])]
    mod = r.module()
    assert not winograd_steps(mod)
    (got,) = r.run(mod, x, w)
    assert_close(got, conv2d_ref(x, w, padding=(1, 1, 1, 1)))


def test_winograd_chain_with_direct_neighbours_and_profile(monkeypatch):
    """Winograd conv between direct convs: blocked intermediates pass through; the profile
    names the three steps of the Winograd conv and the bytes round-trip."""
    monkeypatch.setenv("BYOC_HETERO_CONV_ALGO", "auto")
    x = rand(1, 16, 20, 20)
    w0, w1, w2, b1 = rand(32, 16, 1, 1) * 0.3, rand(32, 32, 3, 3) * 0.2, rand(16, 32, 3, 3) * 0.2, rand(32)
    r = Region("wino_chain")
    t0 = r.node("conv2d", [r.input(x.shape), r.const(w0)], (1, 32, 20, 20), activation="relu")
    t1 = r.node("conv2d", [t0, r.const(w1), r.const(b1)], (1, 32, 20, 20), padding=[1, 1, 1, 1],
                has_bias=1, activation="relu")
    y = r.node("conv2d", [t1, r.const(w2)], (1, 16, 10, 10), strides=[2, 2], padding=[1, 1, 1, 1])
    r.outputs = [y]
    mod = r.module()
    a = np.maximum(conv2d_ref(x, w0), 0)
    bb = np.maximum(conv2d_ref(a, w1, b1, padding=(1, 1, 1, 1)), 0)
    want = conv2d_ref(bb, w2, strides=(2, 2), padding=(1, 1, 1, 1))
    (got,) = r.run(mod, x)
    assert_close(got, want)
    run_steps = [line for line in mod["get_plan"]() if line.startswith("run")]
    assert not any(f"reorder of tensor {t}" in line for t in (t0, t1) for line in run_steps), run_steps
    mod["set_profiling"](True)
    r.run(mod, x)
    prof = [s for s in json.loads(mod["get_profile"]()) if s["phase"] == "run" and "winograd" in s["label"]]
    assert [s["label"].split(": ")[-1] for s in prof] == [
        "winograd input transform", "winograd batched GEMM", "winograd output transform"]
    assert all(s["op"] == "conv2d" and s["calls"] == 1 for s in prof)
    again = load_from_bytes(save_to_bytes(mod))
    assert again[f"__init_{r.symbol}"]([tvm.runtime.tensor(v) for v in r.const_values]) == 0
    (got2,) = r.run(again, x)
    assert_close(got2, want)


@pytest.fixture(scope="module")
def bench_module(tmp_path_factory):
    """The benchmark's native module (not shipped in the package), built once from this checkout."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import native

    missing = native.missing_tools()
    if missing:
        pytest.skip(f"cannot build bench/native.py's _bench here: missing {', '.join(missing)}")
    return native.load(str(tmp_path_factory.mktemp("build-bench")))


def test_bare_chain_times_each_layer_and_rejects_bad_layers(bench_module):
    """The benchmark's bare-oneDNN reference (bench/run.py): one timing per layer of a chain."""
    assert not hasattr(_C, "bench_chain")  # benchmark code is not in the shipped extension
    conv = dict(op="conv2d", data_shape=[1, 8, 10, 10], weight_shape=[16, 8, 3, 3], padding=[1, 1, 1, 1],
                bias=True, activation="relu")
    conv2 = dict(conv, data_shape=[1, 16, 10, 10], weight_shape=[16, 16, 1, 1], padding=[0, 0, 0, 0],
                 residual=True)
    dense = dict(op="dense", m=2, k=32, n=8, bias=False, activation="none")
    out = bench_module.bench_chain([conv, conv2, dense], threads=1, number=2, repeat=3)
    assert len(out) == 3
    for seconds, impl in out:
        assert 0 < seconds < 1 and impl
    ((alone_s, alone_impl),) = bench_module.bench_chain([conv], threads=1, number=2, repeat=3)
    assert 0 < alone_s < 1 and alone_impl == out[0][1]
    with pytest.raises(ValueError, match="unknown op 'pool2d'"):
        bench_module.bench_chain([dict(op="pool2d")])
    with pytest.raises(ValueError, match="4-d data and weight shapes"):
        bench_module.bench_chain([dict(conv, weight_shape=[16, 8, 3])])
    with pytest.raises(ValueError, match="m, k, n >= 1"):
        bench_module.bench_chain([dict(dense, k=0)])
    with pytest.raises(ValueError, match="no layers"):
        bench_module.bench_chain([])
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        bench_module.bench_chain([dict(dense, activation="swish")])
    ((clip_s, _),) = bench_module.bench_chain([dict(dense, activation="clip", clip=[0, 6])], number=2, repeat=3)
    assert 0 < clip_s < 1
    with pytest.raises(ValueError, match="needs clip"):
        bench_module.bench_chain([dict(dense, activation="clip")])
    with pytest.raises(ValueError, match="unknown layer key 'stride'"):
        bench_module.bench_chain([dict(conv, stride=[2, 2])])
    with pytest.raises(ValueError, match="needs 'op'"):
        bench_module.bench_chain([dict(m=1, k=2, n=3)])
    r, x = small_conv_region("timed")
    mod = r.module()
    args = [tvm.runtime.tensor(x), tvm.runtime.tensor(np.zeros((1, 8, 8, 8), "float32"))]
    assert 0 < tvm.get_global_func("byoc_hetero.bench.time_call")(mod[r.symbol], args, 3) < 1


def test_reshape_of_a_permuted_value_is_a_view(monkeypatch):
    """SegFormer's Mix-FFN: tokens [S, C] from a dense, permuted to [1, C, S] and reshaped to the
    image [1, C, H, W] for a depthwise 3x3 conv, then back to tokens. The reshapes split / merge dims
    that lie next to each other in the permuted storage, so they view the same bytes (NHWC): no
    reorder runs between the dense and the conv, nor after it; the result matches numpy."""
    h, wd, c = 6, 5, 16
    x, w1, wdw = rand(h * wd, 8), rand(8, c), rand(c, 1, 3, 3)
    r = Region("token_image_views")
    tok = r.node("dense", [r.input(x.shape), r.const(w1)], (h * wd, c), weight_layout="KN")
    t3 = r.node("reshape", [tok], (1, h * wd, c))
    cs = r.node("permute", [t3], (1, c, h * wd), axes=[0, 2, 1])
    img = r.node("reshape", [cs], (1, c, h, wd))
    y = r.node("conv2d", [img, r.const(wdw)], (1, c, h, wd), padding=[1, 1, 1, 1], groups=c)
    back = r.node("reshape", [y], (1, c, h * wd))
    r.outputs = [r.node("permute", [back], (1, h * wd, c), axes=[0, 2, 1])]
    mod = r.module()
    run_steps = [line for line in mod["get_plan"]() if line.startswith("run")]
    assert not any("reorder of tensor" in line for line in run_steps[:2]), run_steps  # dense, then the conv
    assert "(conv2d) |" in run_steps[1] and "src=[1,16,6,5]:acdb" in run_steps[1], run_steps
    (got,) = r.run(mod, x)
    image = (x.astype("float64") @ w1).T.reshape(1, c, h, wd)
    want = conv2d_ref(image, wdw, padding=(1, 1, 1, 1), groups=c).reshape(1, c, h * wd).transpose(0, 2, 1)
    assert_close(got, want)


def test_channels_last_concat_is_written_in_place():
    """SegFormer's decode head: token maps [S, C] from denses, viewed as NHWC images (permute +
    reshape), resized 2x (nearest, NHWC) but for the largest one (what an identity resize lowers to:
    the reshape view), concatenated along the channels and read by a 1x1 conv. The concat's buffer is
    NHWC, as its first producer writes: each map is copied into its channel run without a transpose
    (oneDNN 3.2 resamples into a strided run only with its reference kernel, so the resizes write
    dense), and the conv reads the buffer as it is (main: a oneDNN concat, then the conv reordered
    it); the result matches numpy."""
    h, wd, c = 3, 4, 8
    x, x_big = rand(h * wd, 8), rand(4 * h * wd, 8)
    w1, w2, w3, wf = rand(8, c), rand(8, c), rand(8, c), rand(4, 3 * c, 1, 1)
    r = Region("channels_last_concat")
    src, src_big = r.input(x.shape), r.input(x_big.shape)

    def image(tokens, weight, rows, cols):
        tok = r.node("dense", [tokens, r.const(weight)], (rows * cols, c), weight_layout="KN")
        cs = r.node("permute", [r.node("reshape", [tok], (1, rows * cols, c))], (1, c, rows * cols), axes=[0, 2, 1])
        return r.node("reshape", [cs], (1, c, rows, cols))

    up = [r.node("resize", [image(src, w, h, wd)], (1, c, 2 * h, 2 * wd), algorithm="nearest") for w in (w1, w2)]
    cat = r.node("concat", [up[0], image(src_big, w3, 2 * h, 2 * wd), up[1]], (1, 3 * c, 2 * h, 2 * wd), axis=1)
    r.outputs = [r.node("conv2d", [cat, r.const(wf)], (1, 4, 2 * h, 2 * wd), padding=[0, 0, 0, 0])]
    mod = r.module()
    plan = mod["get_plan"]()
    (note,) = [line for line in plan if line.startswith("note") and "(concat)" in line]
    assert "written in place by their producers: []; copied: [0, 1, 2]" in note and "output [1,24,6,8]:acdb" in note
    copies = [line for line in plan if line.startswith("run") and "(concat)" in line]
    assert len(copies) == 3 and all(line.endswith("dst=[1,8,6,8]:acdb") for line in copies), copies  # same layout
    (conv,) = [line for line in plan if line.startswith("run") and "(conv2d) |" in line]
    assert "src=[1,24,6,8]:acdb" in conv, plan  # the buffer as it is, no reorder before the conv
    assert not any(line.startswith("run") and "(conv2d): reorder of tensor" in line for line in plan), plan
    (got,) = r.run(mod, x, x_big)
    small = [(x.astype("float64") @ w).T.reshape(1, c, h, wd).repeat(2, axis=2).repeat(2, axis=3) for w in (w1, w2)]
    big = (x_big.astype("float64") @ w3).T.reshape(1, c, 2 * h, 2 * wd)
    assert_close(got, conv2d_ref(np.concatenate([small[0], big, small[1]], axis=1), wf))
