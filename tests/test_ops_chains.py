"""hardswish / hardsigmoid / silu chains as one eltwise fused into the conv2d before them
(ops/hardswish.py, epilogue.fuse_eltwise_into_producer), and a zero pad folded into the conv2d it
feeds (ops/pad.py for the PyTorch path, byoc_hetero.passes.fold_zero_pads for ONNX), any other a
``pad`` node (tests/test_ops_pad.py has the node's own cases): offloaded vs the
llvm-only build or ONNX Runtime, the region graphs they become, and what stays on llvm with which
reason."""

from __future__ import annotations

import io

import numpy as np
import pytest
from conftest import TOLERANCE, offload_and_compare
from fuzz_graphs import CHAINS, activation_chain
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import differential
from tvm import relax

import byoc_hetero as bh
from byoc_hetero._relax import region_table
from byoc_hetero.timing import build, relative_error, run

R = relax.op
RUNTIME_NAME = {"hardswish_torch": "hardswish", "hardswish_onnx": "hardswish", "hardsigmoid_torch": "hardsigmoid",
                "hardsigmoid_onnx": "hardsigmoid", "silu_chain": "silu"}


def conv_module(tail, shape=(1, 4, 9, 9), out_c=6, pad=None, conv_padding=(1, 1, 1, 1), stride=1):
    """main(x) = tail(bb, conv2d([pad](x)) + bias) with seeded constant weights."""
    rng = np.random.default_rng(7)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    b = relax.const((rng.standard_normal((1, out_c, 1, 1)) * 0.5).astype("float32"))
    in_c = shape[1] + (pad[0][2] + pad[0][3] if pad else 0)
    w = relax.const((rng.standard_normal((out_c, in_c, 3, 3)) * 0.5).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            src = x
            if pad is not None:
                widths, value = pad
                src = bb.emit(R.nn.pad(x, widths, "constant", value))
            y = bb.emit(R.add(bb.emit(R.nn.conv2d(src, w, strides=stride, padding=conv_padding)), b))
            gv = bb.emit_output(tail(bb, y))
        bb.emit_func_output(gv)
    return bb.get()


def x_input(shape=(1, 4, 9, 9), scale=3.0):
    return [np.random.default_rng(3).standard_normal(shape).astype("float32") * scale]


def nodes(part) -> list[dict]:
    return [n for entry in region_table(part).values() for n in entry.graph["nodes"]]


@pytest.mark.parametrize("form", CHAINS)
def test_chain_is_a_post_op_of_the_conv(form):
    res = offload_and_compare(conv_module(lambda bb, y: activation_chain(bb, form, y)), inputs=x_input())
    ops = [n["op"] for n in nodes(res.partitioned)]
    assert ops == ["conv2d"], ops  # no eltwise, binary or clip step left
    assert nodes(res.partitioned)[0]["attrs"]["activation"] == RUNTIME_NAME[form]
    assert "left on llvm: 0 ops" in str(bh.report(res.partitioned))


def test_hardsigmoid_by_multiplying_with_a_sixth():
    def tail(bb, y):
        r6 = bb.emit(R.clip(bb.emit(R.add(relax.const(np.float32(3.0)), y)), 0, 6))
        return bb.emit(R.multiply(relax.const(np.float32(1 / 6)), r6))

    res = offload_and_compare(conv_module(tail), inputs=x_input())
    assert [(n["op"], n["attrs"].get("activation")) for n in nodes(res.partitioned)] == [("conv2d", "hardsigmoid")]


@pytest.mark.parametrize("what", ["add2", "alpha0.2", "clip0to5", "other_x"])
def test_other_constants_are_not_taken_for_the_activation(what):
    """Near misses run op by op (still offloaded) and give the right answer."""
    def tail(bb, y):
        if what == "add2":
            r6 = bb.emit(R.clip(bb.emit(R.add(y, relax.const(np.float32(2.0)))), 0, 6))
            return bb.emit(R.divide(bb.emit(R.multiply(y, r6)), relax.const(np.float32(6.0))))
        if what == "alpha0.2":  # ONNX HardSigmoid's default alpha
            lin = bb.emit(R.add(bb.emit(R.multiply(relax.const(np.float32(0.2)), y)), relax.const(np.float32(0.5))))
            return bb.emit(R.clip(lin, 0, 1))
        if what == "clip0to5":
            r = bb.emit(R.clip(bb.emit(R.add(y, relax.const(np.float32(3.0)))), 0, 5))
            return bb.emit(R.divide(r, relax.const(np.float32(6.0))))
        # multiplies the hard sigmoid of y by something else than y
        hs = activation_chain(bb, "hardsigmoid_torch", y)
        return bb.emit(R.multiply(bb.emit(R.negative(y)), hs))

    res = offload_and_compare(conv_module(tail), inputs=x_input())
    activations = {n["attrs"].get("activation") for n in nodes(res.partitioned)}
    assert not activations & {"hardswish", "hardsigmoid"} or what == "other_x"
    if what == "other_x":  # its hard sigmoid is a real one, the multiply is not a hardswish
        assert "hardswish" not in activations


def test_chain_rejection_reason_names_the_constant():
    from byoc_hetero.backends.onednn.ops.hardswish import parse_chain

    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    bad = R.divide(R.clip(R.add(x, relax.const(np.float32(2.0))), 0, 6), relax.const(np.float32(6.0)))
    assert "adds 2.0" in parse_chain("hardsigmoid", bad, lambda e: e)
    good = R.divide(R.clip(R.add(x, relax.const(np.float32(3.0))), 0, 6), relax.const(np.float32(6.0)))
    assert parse_chain("hardsigmoid", good, lambda e: e).same_as(x)


def test_activation_stays_separate_when_the_conv_output_has_another_reader():
    """fuse_eltwise_into_producer must not fuse when the pre-activation value is read elsewhere."""
    def tail(bb, y):
        return bb.emit(R.add(activation_chain(bb, "hardswish_onnx", y), y))

    res = offload_and_compare(conv_module(tail), inputs=x_input())
    ops = [n["op"] for n in nodes(res.partitioned)]
    assert "eltwise" in ops and nodes(res.partitioned)[0]["attrs"]["activation"] == "none", ops


# -- pad folding, PyTorch path (Relax nn.pad) ----------------------------------------------------
@pytest.mark.parametrize("widths,conv_padding,stride", [
    ([0, 0, 0, 0, 0, 1, 0, 1], (0, 0, 0, 0), 2),   # EfficientNet's stride-2 pad: bottom / right only
    ([0, 0, 0, 0, 2, 0, 1, 3], (1, 0, 0, 1), 1),   # asymmetric on top of the conv's own padding
])
def test_zero_pad_folds_into_the_conv(widths, conv_padding, stride):
    mod = conv_module(lambda bb, y: bb.emit(R.nn.relu(y)), pad=(widths, 0.0), conv_padding=conv_padding, stride=stride)
    res = offload_and_compare(mod, inputs=x_input())
    graph_nodes = nodes(res.partitioned)
    assert [n["op"] for n in graph_nodes] == ["conv2d"]
    top, left, bottom, right = conv_padding
    assert graph_nodes[0]["attrs"]["padding"] == [top + widths[4], left + widths[6], bottom + widths[5], right + widths[7]]
    rep = bh.report(res.partitioned)
    assert len(rep.regions) == 1 and not rep.fallbacks, str(rep)


@pytest.mark.parametrize("widths,value", [
    ([0, 0, 0, 0, 0, 1, 0, 1], 1.0),   # not zero
    ([0, 0, 1, 0, 0, 1, 0, 1], 0.0),   # the channels too
])
def test_pad_that_cannot_fold_is_a_pad_node_before_the_conv(widths, value):
    mod = conv_module(lambda bb, y: bb.emit(R.nn.relu(y)), shape=(1, 4, 9, 9), pad=(widths, value),
                      conv_padding=(0, 0, 0, 0))
    res = offload_and_compare(mod, inputs=x_input())
    rep = bh.report(res.partitioned)
    assert len(rep.regions) == 1 and not rep.fallbacks, str(rep)
    graph_nodes = nodes(res.partitioned)
    assert [n["op"] for n in graph_nodes] == ["pad", "conv2d"]
    assert graph_nodes[0]["attrs"] == {"pad_before": widths[0::2], "pad_after": widths[1::2], "value": value}


def test_cropping_pad_stays_on_llvm_with_its_reason():
    mod = conv_module(lambda bb, y: bb.emit(R.nn.relu(y)), shape=(1, 4, 9, 9), pad=([0, 0, 0, 0, 0, -1, 0, 1], 0.0),
                      conv_padding=(0, 0, 0, 0))
    res = offload_and_compare(mod, inputs=x_input())
    rep = bh.report(res.partitioned)
    pads = [f for f in rep.fallbacks if f.op == "nn.pad"]
    assert len(pads) == 1 and "crop" in pads[0].reason, str(rep)
    assert [n["op"] for n in nodes(res.partitioned)] == ["conv2d"]  # the conv itself still offloaded


def test_zero_pad_feeding_no_conv_is_a_pad_node():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 2, 4, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(R.nn.relu(bb.emit(R.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1], "constant", 0.0)))))
        bb.emit_func_output(gv)
    part = bh.partition(bb.get(), require_heavy_op=False)
    assert not bh.report(part).fallbacks, str(bh.report(part))
    assert [n["op"] for n in nodes(part)] == ["pad", "eltwise"]
    data = x_input((1, 2, 4, 4))[0]
    np.testing.assert_array_equal(run(build(part), [data]),
                                  np.maximum(np.pad(data, [(0, 0), (0, 0), (1, 1), (1, 1)]), 0))


# -- pad folding, ONNX path (Pad before Conv) --------------------------------------------------------
def _onnx_pad_conv(pads, value, auto_pad=None):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    w = (rng.standard_normal((6, 4, 3, 3)) * 0.5).astype("float32")
    inits = [numpy_helper.from_array(np.array(pads, "int64"), "pads"),
             numpy_helper.from_array(np.array(value, "float32"), "value"), numpy_helper.from_array(w, "w")]
    conv_attrs = {"strides": [2, 2], "kernel_shape": [3, 3]}
    if auto_pad:
        conv_attrs["auto_pad"] = auto_pad
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads", "value"], ["p"], mode="constant"),
         helper.make_node("Conv", ["p", "w"], ["c"], **conv_attrs),
         helper.make_node("Relu", ["c"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 5, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _ort(model, x):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("auto_pad", [None, "VALID"])
def test_onnx_zero_pad_folds_into_the_conv(auto_pad):
    model = _onnx_pad_conv([0, 0, 0, 0, 0, 0, 1, 1], 0.0, auto_pad)
    before = [n.op_type for n in model.graph.node]
    mod, params = bh.from_onnx(model)
    assert [n.op_type for n in model.graph.node] == before  # the caller's model is not modified
    part = bh.partition(mod, params)
    x = x_input((1, 4, 10, 10))[0]
    got = run(build(part), [x])
    assert relative_error(got, _ort(model, x)) <= TOLERANCE
    rep = bh.report(part)
    assert len(rep.regions) == 1 and not rep.fallbacks, str(rep)
    assert [n["op"] for n in nodes(part)] == ["conv2d"]


def test_onnx_pad_with_a_value_is_a_pad_node():
    """A Pad the conv cannot absorb (value 1.5) reaches the rules as nn.pad (passes.te_pads)."""
    model = _onnx_pad_conv([0, 0, 0, 0, 0, 0, 1, 1], 1.5)
    mod, params = bh.from_onnx(model)
    part = bh.partition(mod, params)
    x = x_input((1, 4, 10, 10))[0]
    assert relative_error(run(build(part), [x]), _ort(model, x)) <= TOLERANCE
    rep = bh.report(part)
    assert len(rep.regions) == 1 and not rep.fallbacks, str(rep)
    assert [n["op"] for n in nodes(part)] == ["pad", "conv2d"]


# -- differential fuzz of the chains and pads --------------------------------------------------------
@settings(max_examples=25, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(form=st.sampled_from(CHAINS), widths=st.lists(st.integers(0, 2), min_size=4, max_size=4),
       value=st.sampled_from([0.0, 0.0, 0.5]), stride=st.sampled_from([1, 2]),
       c=st.integers(1, 5), hw=st.integers(3, 8), reuse=st.booleans(), seed=st.integers(0, 100))
def test_fuzz_chains_after_padded_convs(form, widths, value, stride, c, hw, reuse, seed):
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, hw, hw), "float32"))
    w = relax.const((rng.standard_normal((3, c, 3, 3)) * 0.5).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit(R.nn.pad(x, [0, 0, 0, 0, widths[0], widths[2], widths[1], widths[3]], "constant", value))
            y = bb.emit(R.nn.conv2d(p, w, strides=stride, padding=1))
            z = activation_chain(bb, form, y)
            gv = bb.emit_output(bb.emit(R.add(z, y)) if reuse else z)
        bb.emit_func_output(gv)
    differential(bb.get(), [rng.standard_normal((1, c, hw, hw)).astype("float32") * 3])


def test_scalar_binary_on_a_blocked_conv_output_is_not_oneDNN_reference():
    """A near-miss chain after a stem-like conv (3 input channels: oneDNN writes aBcd16b) used to
    run its scalar add / divide in oneDNN's reference binary (12 ms of MobileNetV3-Large's 15)."""
    import json

    def tail(bb, y):  # add 2 is no hardswish: stays a binary op
        return bb.emit(R.divide(bb.emit(R.add(y, relax.const(np.float32(2.0)))), relax.const(np.float32(6.0))))

    mod = conv_module(tail, shape=(1, 3, 32, 32), out_c=16, stride=2)
    res = offload_and_compare(mod, inputs=x_input((1, 3, 32, 32)))
    ex = build(res.partitioned)
    vm = relax.VirtualMachine(ex, __import__("tvm").cpu())
    regions = bh.codegen.region_modules(ex)
    for m in regions:
        m["set_profiling"](True)
    vm["main"](__import__("tvm").runtime.tensor(x_input((1, 3, 32, 32))[0]))
    steps = [s for m in regions for s in json.loads(m["get_profile"]()) if s["op"] == "binary" and s["phase"] == "run"]
    assert steps and not any(s["impl"].startswith("ref") for s in steps), steps
