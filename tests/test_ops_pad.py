"""The runtime's ``pad`` node (cpp/kernels/pad.cc, ops/pad.py): a constant pad of any axes with any
value, inside a region, against numpy; the ONNX importer's TIR pad read back as ``nn.pad``
(:mod:`byoc_hetero.passes.te_pads`), against ONNX Runtime; what stays on llvm and why.

Issue 39 item 1: torchvision's Swin-V2 pads its channels-last activations ``[N, H, W, C]`` on H and W
up to a multiple of the window; on llvm each pad split the model (11 regions on Swin-V2-T)."""

from __future__ import annotations

import numpy as np
import pytest
from fuzz_graphs import graphs
from hypothesis import HealthCheck, given, settings
from test_fuzz import differential
from tvm import relax, topi

import byoc_hetero as bh
from byoc_hetero import passes
from byoc_hetero._relax import op_calls, op_name, region_table
from byoc_hetero.timing import build, run
from model_paths import dataflow_module

R = relax.op


def _graph_ops(part) -> list[str]:
    return [n["op"] for entry in region_table(part).values() for n in entry.graph["nodes"]]


def _between_matmuls(shape, widths, value, mode="constant"):
    """main(x) = reshape(pad(x @ w1), [-1, C]) @ w2, x of ``shape`` (channels last), and a numpy
    reference of it."""
    rng = np.random.default_rng(len(widths) + int(value * 4))
    c = shape[-1]
    w1 = (rng.standard_normal((c, c)) * 0.5).astype("float32")
    w2 = (rng.standard_normal((c, 5)) * 0.5).astype("float32")
    x = relax.Var("x", relax.TensorType(shape, "float32"))

    def body(bb, x):
        padded = bb.emit(R.nn.pad(bb.emit(R.matmul(x, relax.const(w1))), widths, mode, value))
        return R.matmul(bb.emit(R.reshape(padded, (-1, padded.ty.shape[-1]))), relax.const(w2))

    def reference(data):
        pairs = [(widths[2 * k], widths[2 * k + 1]) for k in range(len(shape))]
        padded = np.pad(data @ w1, pairs, constant_values=np.float32(value))
        return padded.reshape(-1, padded.shape[-1]) @ w2

    return dataflow_module([x], body), reference


@pytest.mark.parametrize(("shape", "widths", "value"), [
    ((1, 7, 7, 8), [0, 0, 0, 1, 0, 1, 0, 0], 0.0),          # Swin-V2: H and W up to the window
    ((1, 5, 6, 8), [0, 0, 2, 1, 0, 3, 0, 0], -1.5),         # both sides, another value
    ((2, 3, 4, 8), [1, 0, 0, 2, 1, 1, 0, 0], 0.25),         # the batch too
    ((3, 5, 8), [0, 0, 0, 0, 0, 0], 0.0),                   # nothing: a copy
])
def test_pad_node_in_a_region_matches_numpy(shape, widths, value):
    mod, reference = _between_matmuls(shape, widths, value)
    part = bh.partition(mod)
    rep = bh.report(part)
    assert len(rep.regions) == 1 and not rep.fallbacks, str(rep)
    assert "pad" in _graph_ops(part) or not any(widths)
    data = np.random.default_rng(1).standard_normal(shape).astype("float32")
    np.testing.assert_allclose(run(build(part), [data]), reference(data), rtol=1e-5, atol=1e-5)


def test_pad_of_the_last_axis_with_nan_value_matches_numpy():
    """The value is written as it is (NaN included): only the pad, not the data, is NaN."""
    x = relax.Var("x", relax.TensorType((2, 3, 4), "float32"))
    mod = dataflow_module([x], lambda bb, x: R.nn.pad(bb.emit(R.multiply(x, x)), [0, 0, 1, 0, 2, 1], "constant",
                                                      float("nan")))
    part = bh.partition(mod, require_heavy_op=False)
    assert _graph_ops(part) == ["binary", "pad"] and not bh.report(part).fallbacks, str(bh.report(part))
    data = np.random.default_rng(2).standard_normal((2, 3, 4)).astype("float32")
    want = np.pad(data * data, [(0, 0), (1, 0), (2, 1)], constant_values=np.nan)
    np.testing.assert_array_equal(run(build(part), [data]), want)


@pytest.mark.parametrize(("widths", "mode", "reason"), [
    ([0, 0, 0, 1, 0, 1, 0, 0], "reflect", "pad mode reflect"),
    ([0, 0, 0, -1, 0, 1, 0, 0], "constant", "crop"),
])
def test_pad_the_runtime_cannot_run_stays_on_llvm_with_its_reason(widths, mode, reason):
    mod, reference = _between_matmuls((1, 6, 6, 8), widths, 0.0, mode)
    part = bh.partition(mod)
    pads = [f for f in bh.report(part).fallbacks if f.op == "nn.pad"]
    assert len(pads) == 1 and reason in pads[0].reason, str(bh.report(part))
    if mode == "constant":
        data = np.random.default_rng(3).standard_normal((1, 6, 6, 8)).astype("float32")
        want = run(build(mod), [data])
        np.testing.assert_allclose(run(build(part), [data]), want, rtol=1e-5, atol=1e-5)


# -- the ONNX importer's TIR pad ------------------------------------------------------------------------
@pytest.mark.parametrize(("before", "after", "value"), [([0, 1, 0, 2], [1, 0, 3, 0], 0.0), ([0, 0, 0, 0], [0, 2, 2, 0], -2.5)])
def test_te_pads_reads_the_tir_pad_as_nn_pad(before, after, value):
    x = relax.Var("x", relax.TensorType([1, 3, 4, 2], "float32"))
    mod = dataflow_module([x], lambda bb, x: bb.emit_te(topi.nn.pad, x, before, after, value))
    out = passes.te_pads(mod)
    (pad,) = [c for c in op_calls(out["main"])]
    assert op_name(pad) == "relax.nn.pad"
    assert [int(w) for w in pad.attrs.pad_width] == [w for pair in zip(before, after) for w in pair]
    data = np.random.default_rng(4).standard_normal((1, 3, 4, 2)).astype("float32")
    want = np.pad(data, list(zip(before, after)), constant_values=np.float32(value))
    np.testing.assert_array_equal(run(build(out), [data]), want)


def test_te_pads_leaves_other_tir_functions():
    x = relax.Var("x", relax.TensorType([2, 3], "float32"))
    mirror = dataflow_module([x], lambda bb, x: bb.emit_te(topi.nn.mirror_pad, x, [1, 1], [1, 1], "REFLECT"))
    assert passes.te_pads(mirror) is mirror
    clip = dataflow_module([x], lambda bb, x: bb.emit_te(topi.maximum, x, relax.const(0.5, "float32")))
    assert passes.te_pads(clip) is clip


def test_onnx_channels_last_pad_is_in_the_region():
    """A ``Pad`` of H and W of [N, H, W, C] data between two MatMuls (torch's default exporter's form of
    Swin-V2's window pad): one region with a ``pad`` node, as ONNX Runtime computes it."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.5).astype("float32"), "w1"),
             numpy_helper.from_array((rng.standard_normal((8, 4)) * 0.5).astype("float32"), "w2"),
             numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 1, 1, 0], "int64"), "pads"),
             numpy_helper.from_array(np.array(0.5, "float32"), "value")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]),
         helper.make_node("Pad", ["h", "pads", "value"], ["p"], mode="constant"),
         helper.make_node("MatMul", ["p", "w2"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7, 7, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    part = bh.partition(*bh.from_onnx(model))
    rep = bh.report(part)
    assert len(rep.regions) == 1 and not rep.fallbacks, str(rep)
    assert "pad" in _graph_ops(part)
    x = rng.standard_normal((1, 7, 7, 8)).astype("float32")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(run(build(part), [x]), want, rtol=1e-5, atol=1e-5)


@settings(max_examples=12, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=graphs(max_ops=4, kinds=("pad", "matmul", "layer_norm", "permute", "reshape", "binary")))
def test_fuzz_pads_between_other_steps(case):
    """Pads of any axes and values after and before the steps Swin-V2 puts around its (differential
    against the llvm-only build)."""
    mod, inputs, _recipe = case
    differential(mod, inputs, require_heavy_op=False)
