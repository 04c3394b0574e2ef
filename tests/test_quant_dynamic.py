"""Dynamic quantization as ONNX Runtime's quantize_dynamic writes it (DynamicQuantizeLinear,
MatMulInteger, a scale multiply): imported to compute what ONNX Runtime computes, partitioned with
its matmuls offloaded (byoc_hetero/passes/dynamic_quantize_linear.py, matmul_integer_qdq.py)."""

from __future__ import annotations

import numpy as np
import pytest

import byoc_hetero as bh
from byoc_hetero.timing import build, run
from conftest import needs_int8_kernels

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")


def _dql_model():
    from onnx import TensorProto, helper

    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"], name="dql")
    graph = helper.make_graph([node], "dql", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 5]),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info("z", TensorProto.UINT8, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("name, x", [
    ("zeros", np.zeros((2, 5))),  # TVM's import alone: scale 0, zero point 255 (a NaN cast)
    ("halves", [[-2.5, 252.5, 0.5, 1.5, 2.5], [3.5, 4.5, 5.5, 6.5, 7.5]]),  # zero point 2.5 -> 2 (half to even)
    ("positive", np.full((2, 5), 2.0)), ("negative", np.full((2, 5), -3.0)),
    ("random", np.random.default_rng(0).standard_normal((2, 5)) * 10),
])
def test_dynamic_quantize_linear_equals_onnxruntime(name, x):
    import tvm
    from tvm import relax

    model = _dql_model()
    x = np.asarray(x, np.float32)
    mod, params = bh.from_onnx(model)
    vm = relax.VirtualMachine(build(bh.bind_params(mod, params)), tvm.cpu())
    got = [t.numpy() for t in vm["main"](tvm.runtime.tensor(x))]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


class _Encoder(torch.nn.Module):
    """A small transformer encoder layer (two heads): every Linear a MatMul for quantize_dynamic."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(32, 2, dim_feedforward=64, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.layer(x)


@pytest.fixture(scope="module", params=[False, True], ids=["per-tensor", "per-channel"])
def dynamic_model(request, tmp_path_factory):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = tmp_path_factory.mktemp("dyn")
    torch.manual_seed(0)
    net = _Encoder().eval()
    torch.onnx.export(net, (torch.randn(1, 8, 32),), str(tmp / "f.onnx"), input_names=["x"], output_names=["y"],
                      dynamo=False, opset_version=17)
    quantize_dynamic(str(tmp / "f.onnx"), str(tmp / "q.onnx"), weight_type=QuantType.QInt8,
                     per_channel=request.param)
    return tmp / "q.onnx"


def _ort(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@needs_int8_kernels
def test_quantize_dynamic_model_is_offloaded_and_matches_onnxruntime(dynamic_model):
    import onnx

    types = [n.op_type for n in onnx.load(str(dynamic_model)).graph.node]
    assert types.count("MatMulInteger") >= 4 and "DynamicQuantizeLinear" in types
    mod, params = bh.from_onnx(dynamic_model)
    part = bh.partition(mod, params)
    profile = bh.op_profile(part)
    assert profile.counts.get("llvm", {}).get("matmul", 0) == 0, profile  # no int32 matmul left on llvm
    assert profile.counts["byoc_hetero"]["matmul"] >= types.count("MatMulInteger"), profile
    ex_part, ex_llvm = build(part), build(bh.bind_params(mod, params))
    for seed in range(2):
        x = np.random.default_rng(seed).standard_normal((1, 8, 32)).astype(np.float32)
        want = _ort(dynamic_model, x)
        scale = np.abs(want).max()
        # TVM's int32 matmul on llvm: ONNX Runtime's numbers up to float rounding of the rest
        assert np.abs(run(ex_llvm, [x]) - want).max() <= 1e-5 * scale
        # int8 dense layers quantizing their source per call (test_int8_dynamic.py); what is left
        # (attention matmuls, softmax) in the QDQ form: float32 accumulation of the same products
        assert np.abs(run(ex_part, [x]) - want).max() <= 1e-4 * scale


@needs_int8_kernels
def test_a_zero_input_to_a_dynamically_quantized_matmul(dynamic_model):
    # the token positions a padded batch zeroes: DynamicQuantizeLinear's range is empty there
    mod, params = bh.from_onnx(dynamic_model)
    x = np.zeros((1, 8, 32), np.float32)
    got = run(build(bh.partition(mod, params)), [x])
    want = _ort(dynamic_model, x)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, want, atol=1e-4 * max(1.0, np.abs(want).max()))


def test_a_matmulinteger_without_a_quantized_operand_is_left_alone():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    b = numpy_helper.from_array(rng.integers(-128, 128, (4, 3)).astype(np.int8), "b")
    nodes = [helper.make_node("MatMulInteger", ["a", "b"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "s"], ["y"])]
    s = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    graph = helper.make_graph(nodes, "mmi", [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [b, s])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    mod, params = bh.from_onnx(model)
    a = rng.integers(0, 256, (2, 4)).astype(np.uint8)
    got = run(build(bh.partition(mod, params)), [a])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    np.testing.assert_array_equal(got, want)
