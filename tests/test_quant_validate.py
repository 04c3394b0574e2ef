"""Malformed quantization parameters of a QDQ model: a QuantizationError naming the node and the value,
at import (``bh.from_onnx``) and at partition (a Relax module given to ``bh.partition``) — never a
crash or a silently wrong number. The models are built here with ``onnx.helper``."""

from __future__ import annotations

import numpy as np
import pytest

import byoc_hetero as bh
from byoc_hetero.errors import FrontendError, QuantizationError


def _qdq_conv_model(w_scale=None, w_zp=None, x_scale=0.05, x_zp=128, x_zp_type=None, zp_in_int32=False):
    """x (float) -> Q/DQ (per-tensor u8) -> Conv with a DQ'd per-channel s8 weight -> y.

    ``w_scale`` / ``w_zp`` replace the weight's 4 scales / zero points; ``zp_in_int32`` writes the
    activation's uint8 zero point through ``int32_data`` (where protobuf keeps any int32)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w_q = rng.integers(-127, 128, size=(4, 3, 3, 3)).astype(np.int8)
    w_scale = np.full(4, 0.01, np.float32) if w_scale is None else np.asarray(w_scale, np.float32)
    w_zp = np.zeros(w_scale.shape, np.int8) if w_zp is None else np.asarray(w_zp, np.int8)
    if zp_in_int32:
        x_zp_tensor = TensorProto(name="x_zp", data_type=x_zp_type or TensorProto.UINT8)
        x_zp_tensor.int32_data.append(x_zp)  # helper.make_tensor would refuse the value
    else:
        x_zp_tensor = numpy_helper.from_array(np.array(x_zp, np.uint8), "x_zp")
    inits = [
        numpy_helper.from_array(np.array(x_scale, np.float32), "x_scale"), x_zp_tensor,
        numpy_helper.from_array(w_q, "w_q"), numpy_helper.from_array(w_scale, "w_scale"),
        numpy_helper.from_array(w_zp, "w_zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="quant_x"),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"], name="dequant_x"),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["wd"], name="dequant_w", axis=0),
        helper.make_node("Conv", ["xd", "wd"], ["y"], name="conv", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_wellformed_qdq_model_imports_and_matches_onnxruntime():
    import onnxruntime as ort

    model = _qdq_conv_model(w_scale=[0.01, 0.02, 0.005, 0.03])
    mod, params = bh.from_onnx(model)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    from byoc_hetero.timing import build, run

    got = run(build(bh.partition(mod, params)), [x])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("value, shown", [(0.0, "got 0 at"), (-0.02, "got -0.02 at"),
                                          (float("nan"), "got nan at"), (float("inf"), "got inf at")])
def test_a_bad_weight_scale_is_named_at_import(value, shown):
    scales = [0.01, 0.02, value, 0.03]
    with pytest.raises(QuantizationError) as info:
        bh.from_onnx(_qdq_conv_model(w_scale=scales))
    message = str(info.value)
    assert "DequantizeLinear node 'dequant_w'" in message and "'w_scale'" in message
    assert shown in message and "index 2 of 4" in message
    assert isinstance(info.value, FrontendError) and isinstance(info.value, bh.ByocError)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_a_bad_activation_scale_names_the_quantize_node(value):
    with pytest.raises(QuantizationError, match=r"QuantizeLinear node 'quant_x' \(scale 'x_scale'\)"):
        bh.from_onnx(_qdq_conv_model(x_scale=value))


def test_a_zero_point_outside_its_type_is_named():
    # 300 stored for a uint8 zero point: numpy_helper.to_array would read 44 (a silently wrong number)
    with pytest.raises(QuantizationError, match=r"'quant_x'.*uint8 zero point must lie in \[0, 255\], got 300"):
        bh.from_onnx(_qdq_conv_model(x_zp=300, zp_in_int32=True))


def test_an_int8_zero_point_below_its_range_is_named():
    from onnx import TensorProto

    with pytest.raises(QuantizationError, match=r"int8 zero point must lie in \[-128, 127\], got -129"):
        bh.from_onnx(_qdq_conv_model(x_zp=-129, x_zp_type=TensorProto.INT8, zp_in_int32=True))


def test_a_per_channel_scale_of_the_wrong_length_is_named():
    # 3 scales for a weight of 4 output channels (axis 0): TVM's importer fails with "Size mismatch"
    with pytest.raises(QuantizationError, match=r"'dequant_w'.*one value per element of axis 0 \(4 .*got 3"):
        bh.from_onnx(_qdq_conv_model(w_scale=[0.01, 0.02, 0.03]))


def test_a_zero_point_shaped_unlike_its_scale_is_named():
    with pytest.raises(QuantizationError, match=r"'dequant_w'.*zero point's shape \[2\] differs from the "
                                                r"scale's shape \[4\]"):
        bh.from_onnx(_qdq_conv_model(w_zp=[0, 0]))


def test_a_two_dimensional_scale_is_named():
    with pytest.raises(QuantizationError, match=r"'dequant_w'.*scalar or 1-D"):
        bh.from_onnx(_qdq_conv_model(w_scale=np.full((2, 2), 0.01), w_zp=np.zeros((2, 2))))


def test_matmulinteger_zero_point_range_is_checked():
    from onnx import TensorProto, helper

    a_zp = TensorProto(name="a_zp", data_type=TensorProto.UINT8)
    a_zp.int32_data.append(256)
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zp"], ["y"], name="mmi")
    graph = helper.make_graph([node], "mmi", [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 4]),
                                              helper.make_tensor_value_info("b", TensorProto.INT8, [4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 3])], [a_zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(QuantizationError, match=r"MatMulInteger node 'mmi' \(zero point 'a_zp'\).*got 256"):
        bh.from_onnx(model)


# ---------------------------------------------------------------------------------------------
# Relax modules given to bh.partition
# ---------------------------------------------------------------------------------------------
def _relax_qdq(scale: np.ndarray, zp: np.ndarray, zp_dtype: str = "int8", as_params: bool = True):
    """main(x) = conv2d(x, dequantize(w_q, scale, zp, axis=0)) with the scale / zero point given as
    parameters (bound by partition) or as constants."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    w = relax.Var("w_q", relax.TensorType((4, 3, 3, 3), "int8"))
    if as_params:
        s = relax.Var("w_scale", relax.TensorType(scale.shape, "float32"))
        z = relax.Var("w_zp", relax.TensorType(zp.shape, zp_dtype))
        args = [x, w, s, z]
    else:
        s, z = relax.const(scale.astype("float32")), relax.const(zp.astype(zp_dtype))
        args = [x, w]
    with bb.function("main", args):
        with bb.dataflow():
            wd = bb.emit(relax.op.dequantize(w, s, z, axis=0, out_dtype="float32"))
            y = bb.emit_output(relax.op.nn.conv2d(x, wd, padding=1))
        bb.emit_func_output(y)
    params = {"w_q": np.ones((4, 3, 3, 3), np.int8)}
    if as_params:
        params.update(w_scale=scale.astype("float32"), w_zp=zp.astype(zp_dtype))
    return bb.get(), params


@pytest.mark.parametrize("as_params", [True, False])
@pytest.mark.parametrize("value", [0.0, -0.5, float("nan"), float("-inf")])
def test_partition_names_a_bad_scale_of_a_relax_module(as_params, value):
    scale = np.array([0.1, value, 0.1, 0.1])
    mod, params = _relax_qdq(scale, np.zeros(4), as_params=as_params)
    with pytest.raises(QuantizationError) as info:
        bh.partition(mod, params)
    message = str(info.value)
    assert "dequantize bound to" in message and "'main'" in message and "index 1 of 4" in message
    assert ("parameter 'w_scale'" if as_params else "a constant") in message


def test_partition_names_a_zero_point_outside_the_quantized_type():
    # an int32 zero point constant for int8 data: 200 cannot be an int8 value
    mod, params = _relax_qdq(np.full(4, 0.1), np.array([0, 0, 200, 0]), zp_dtype="int32")
    with pytest.raises(QuantizationError, match=r"int8 zero point must lie in \[-128, 127\], got 200 at index 2"):
        bh.partition(mod, params)


def test_tvm_refuses_a_relax_scale_shape_that_does_not_fit_its_axis():
    # why check_relax needs no shape test of its own: Relax's type inference refuses a scale whose
    # length differs from the data's axis when the call is built (static or symbolic lengths)
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4), "int8"))
    s = relax.Var("s", relax.TensorType((tvm.tirx.Var("m", "int64"),), "float32"))
    with bb.function("main", [x, s]):
        with pytest.raises(Exception, match="size of scale param is 'm'"):
            bb.emit(relax.op.dequantize(x, s, relax.const(0, "int8"), axis=1))
        bb.emit_func_output(x)


def test_a_wellformed_relax_module_partitions_and_matches_numpy():
    from byoc_hetero.timing import build, run

    scale = np.array([0.1, 0.2, 0.05, 0.3], np.float32)
    mod, params = _relax_qdq(scale, np.array([0, 1, -2, 3]))
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    got = run(build(bh.partition(mod, params)), [x])
    import torch

    w = (np.ones((4, 3, 3, 3)) - np.array([0, 1, -2, 3])[:, None, None, None]) * scale[:, None, None, None]
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w.astype(np.float32)), padding=1)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
