"""``quantize_dynamic`` CNNs (``ConvInteger``, issue 35): imported through passes/conv_integer_qdq.py and
offloaded whole. References: ONNX Runtime on the same file where its kernels are exact (uint8 weights
everywhere; int8 weights on a VNNI CPU only: below VNNI its u8 x s8 kernels sum pairs of products in 16
bits and saturate), ONNX's reference evaluator (numpy, the spec's int32 arithmetic) otherwise, and the
llvm-only build of our import."""

from __future__ import annotations

import numpy as np
import pytest

import byoc_hetero as bh
from byoc_hetero._relax import external_modules, region_graph_json
from byoc_hetero.timing import build, run

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")


class _Block(torch.nn.Module):
    """ResNet's basic block: two 3x3 convs with batch norms, the residual add, ReLUs."""

    def __init__(self, c: int):
        super().__init__()
        self.c1, self.b1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.c2, self.b2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


def _small_resnet() -> torch.nn.Module:
    """ResNet-18's shape at 1/4 width and 2 of its 8 blocks: stem conv 7x7/2, max pool, blocks, a
    strided conv between stages, global pool, classifier."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 7, 2, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1), _Block(16),
                              torch.nn.Conv2d(16, 32, 3, 2, 1), _Block(32), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(32, 10))
    for m in net.modules():  # trained-looking batch norms (not the identity of a fresh one)
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
    return net.eval()


@pytest.fixture(scope="module", params=["QUInt8", "QInt8"])
def quantized_cnn(request, tmp_path_factory):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    work = tmp_path_factory.mktemp("conv_integer")
    torch.onnx.export(_small_resnet(), (torch.randn(1, 3, 32, 32),), str(work / "f.onnx"), input_names=["x"],
                      output_names=["y"], dynamo=False, opset_version=17)
    quantize_dynamic(str(work / "f.onnx"), str(work / "q.onnx"), weight_type=getattr(QuantType, request.param))
    return work / "q.onnx", request.param


def _reference(path, x: np.ndarray, weight_type: str) -> np.ndarray:
    """ONNX Runtime where its int8 is exact, ONNX's reference evaluator elsewhere."""
    import subprocess

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.lower()
    if weight_type == "QUInt8" or "avx512_vnni" in lscpu or "avx_vnni" in lscpu:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(str(path)).run(None, {"x": x})[0]


def test_a_quantize_dynamic_cnn_is_one_offloaded_region_equal_to_the_reference(quantized_cnn):
    import onnx

    path, weight_type = quantized_cnn
    types = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert types.count("ConvInteger") == 6 and "DynamicQuantizeLinear" in types  # what the test is about
    mod, params = bh.from_onnx(path)
    part = bh.partition(mod, params)
    assert "llvm" not in bh.op_profile(part).counts  # the per-call quantization included
    assert len(bh.report(part).regions) == 1
    build(part)
    ops = [n["op"] for m in external_modules(part) for n in region_graph_json(m)["nodes"]]
    assert ops.count("conv2d") == 6 and ops.count("dynamic_quantize_dequantize") >= 6, ops
    ex = build(part)
    for seed in range(2):
        x = (np.random.default_rng(seed).standard_normal((1, 3, 32, 32)) * (seed + 1)).astype(np.float32)
        want = _reference(path, x, weight_type)
        got = run(ex, [x])
        # the same quantized values and integer products, summed in float32 instead of int32: measured
        # 3e-8 (uint8 weights) and 7e-7 (int8) of max |y| here; a wrong quantization is 1e-2 and more
        # (ONNX Runtime's saturating int8 on this CPU is 9e-2 away from the spec's int32 arithmetic)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (weight_type, seed)


def test_a_convinteger_without_its_scale_multiply_keeps_its_int32_meaning():
    # the fallback form: Cast<int32>(Conv(x - x_zp, w - w_zp)), w_zp per output channel; exact against
    # ONNX's reference evaluator
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-128, 128, (8, 4, 3, 3)).astype(np.int8), "w"),
             numpy_helper.from_array(np.array(7, np.uint8), "x_zp"),
             numpy_helper.from_array(rng.integers(-5, 5, (8,)).astype(np.int8), "w_zp")]
    node = helper.make_node("ConvInteger", ["x", "w", "x_zp", "w_zp"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 9, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 8, 5, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = rng.integers(0, 256, (1, 4, 9, 9)).astype(np.uint8)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    mod, params = bh.from_onnx(model)
    got = run(build(bh.partition(mod, params)), [x])
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_whispers_conv1d_front_end_quantized_dynamically_matches_onnxruntime(tmp_path):
    # Whisper's encoder front end (two Conv1d + GELU, the second strided): 1-D ConvInteger, uint8 weights
    # (ONNX Runtime exact on every CPU)
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv1d(16, 32, 3, padding=1), torch.nn.GELU(),
                              torch.nn.Conv1d(32, 32, 3, stride=2, padding=1), torch.nn.GELU()).eval()
    torch.onnx.export(net, (torch.randn(1, 16, 40),), str(tmp_path / "f.onnx"), input_names=["x"], output_names=["y"],
                      dynamo=False, opset_version=17)
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QUInt8)
    part = bh.partition(*bh.from_onnx(tmp_path / "q.onnx"))
    assert "llvm" not in bh.op_profile(part).counts
    x = np.random.default_rng(3).standard_normal((1, 16, 40)).astype(np.float32)
    want = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = run(build(part), [x])
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
