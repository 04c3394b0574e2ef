"""quantize_dynamic models run their dense layers int8 in one region: the DynamicQuantizeLinear round
trip is one composite (passes/dynamic_quantize_per_reader.py, ops/qdq_dynamic.py) that the int8 dense
reading it absorbs (attr src_dynamic: the source quantized per call, cpp/kernels/int8.cc). References:
ONNX Runtime on the same file, numpy for the per-call quantization, an llvm-only build."""

from __future__ import annotations

import numpy as np
import pytest

import byoc_hetero as bh
from byoc_hetero._relax import external_modules, region_graph_json
from byoc_hetero.timing import build, run
from conftest import needs_int8_kernels

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")


def _quantized(tmp_path, net, example, per_channel=False):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    names = [f"x{i}" for i in range(len(example))]
    torch.onnx.export(net, example, str(tmp_path / "f.onnx"), input_names=names, output_names=["y"],
                      dynamo=False, opset_version=17)
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8,
                     per_channel=per_channel)
    return tmp_path / "q.onnx"


def _ort(path, feeds):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: f for i, f in zip(sess.get_inputs(), feeds)})[0]


def _region_nodes(part):
    build(part)  # the regions' graphs exist once built
    return [n for m in external_modules(part) for n in region_graph_json(m)["nodes"]]


@pytest.fixture(scope="module", params=[False, True], ids=["per-tensor", "per-channel"])
def mlp(request, tmp_path_factory):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 16)).eval()
    path = _quantized(tmp_path_factory.mktemp("mlp"), net, (torch.randn(4, 32),), request.param)
    return path, net


def _step_bound(net, x):
    """How far ONNX Runtime's result may be from ours: the second layer's source is quantized from
    the first layer's output, which the two engines compute with float32 sums in different orders;
    a value that lands on a rounding tie either way moves one step (scale s2) on one element, which
    moves an output by at most s2 * max_n sum_k |W2[k, n]|. The first layer's source is the input
    itself: the same bits in both, exact int32 sums, so only the float scaling rounds (1e-5 relative)."""
    h = np.maximum(x @ net[0].weight.detach().numpy().T + net[0].bias.detach().numpy(), 0)
    s2 = (h.max() - min(h.min(), 0)) / 255 or 1.0
    return s2 * np.abs(net[2].weight.detach().numpy()).sum(axis=1).max()


@needs_int8_kernels
def test_dense_layers_run_int8_in_one_region_and_match_onnxruntime(mlp):
    path, net = mlp
    mod, params = bh.from_onnx(path)
    part = bh.partition(mod, params)
    profile = bh.op_profile(part)
    assert "llvm" not in profile.counts, profile  # the DynamicQuantizeLinear arithmetic included
    assert len(bh.report(part).regions) == 1
    dense = [n for n in _region_nodes(part) if n["op"] == "dense"]
    assert len(dense) == 2 and all(n["attrs"].get("src_dynamic") == 1 for n in dense)
    ex = build(part)
    for seed in range(3):
        x = (np.random.default_rng(seed).standard_normal((4, 32)) * (seed + 1)).astype(np.float32)
        want = _ort(path, [x])
        got = run(ex, [x])
        assert np.abs(got - want).max() <= _step_bound(net, x) + 1e-5 * np.abs(want).max()


@needs_int8_kernels
def test_an_all_zero_input_is_quantized_with_scale_one(mlp):
    # DynamicQuantizeLinear of zeros: range 0, scale 1 and zero point 0 (not 0/0): the dense reads
    # zeros and the output is the bias path, exactly as ONNX Runtime computes it
    path, _ = mlp
    x = np.zeros((4, 32), np.float32)
    got = run(build(bh.partition(*bh.from_onnx(path))), [x])
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, _ort(path, [x]))


@needs_int8_kernels
def test_a_nan_input_makes_the_quantized_dense_nan(tmp_path):
    # ONNX leaves DynamicQuantizeLinear of NaN undefined: ONNX Runtime and TVM's llvm code return
    # different finite numbers (0.13 and 0.23 apart on this model's row with the NaN). The region
    # makes the scale NaN, so everything dequantized with it is NaN: never a finite number that
    # looks right (docs/int8.md)
    torch.manual_seed(0)
    path = _quantized(tmp_path, torch.nn.Linear(32, 48).eval(), (torch.randn(4, 32),))
    part = bh.partition(*bh.from_onnx(path))
    assert any(n["attrs"].get("src_dynamic") == 1 for n in _region_nodes(part))
    ex = build(part)
    x = np.random.default_rng(5).standard_normal((4, 32)).astype(np.float32)
    assert not np.isnan(run(ex, [x])).any()
    x[1, 3] = np.nan
    assert np.isnan(run(ex, [x])).all()


def test_a_scale_computed_otherwise_is_not_taken_for_dynamicquantizelinear():
    # quantize(x, max(x) / 127, 0): a run-time scale, but not DynamicQuantizeLinear's: it stays on
    # llvm with the runtime's reason, and the results are llvm's
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.integers(-128, 128, (8, 4)).astype(np.int8), "w")
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
             helper.make_node("Div", ["m", "c"], ["s"]),
             helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"]),
             helper.make_node("MatMul", ["d", "wd"], ["y"])]
    inits = [w, numpy_helper.from_array(np.array(127, np.float32), "c"),
             numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(np.array(0.01, np.float32), "ws")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    mod, params = bh.from_onnx(model)
    part = bh.partition(mod, params)
    assert bh.op_profile(part).counts["llvm"].get("quantize") == 1
    assert not any(n["op"] == "dynamic_quantize_dequantize" for n in _region_nodes(part))
    x = rng.standard_normal((2, 8)).astype(np.float32)
    want = run(build(bh.bind_params(mod, params)), [x])
    np.testing.assert_allclose(run(build(part), [x]), want, rtol=1e-6, atol=1e-6)


@needs_int8_kernels
def test_a_two_layer_bert_is_one_region_with_int8_dense_layers(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=16)
    torch.manual_seed(0)
    bert = transformers.BertModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids):
            return self.bert(input_ids=ids).last_hidden_state

    ids = torch.randint(0, 64, (1, 8))
    path = _quantized(tmp_path, Hidden().eval(), (ids,))
    mod, params = bh.from_onnx(path)
    part = bh.partition(mod, params)
    assert len(bh.report(part).regions) == 1
    dense = [n for n in _region_nodes(part) if n["op"] == "dense"]
    assert len(dense) == 2 * 6 and all(n["attrs"].get("src_dynamic") == 1 for n in dense)  # Q, K, V, out, FFN x2
    x = ids.numpy()
    want = _ort(path, [x])
    got = run(build(part), [x])
    # one quantization step of a source moves a hidden value by s * sum|w| (test above); the layer
    # norms rescale it by up to 1/std: measured max 2e-6 here, bound well above ORT-vs-llvm's own
    llvm = run(build(bh.bind_params(mod, params)), [x])
    assert np.abs(got - want).max() <= max(2 * np.abs(llvm - want).max(), 1e-4 * np.abs(want).max())


def test_uint8_weights_keep_a_float32_dense_after_the_round_trip(tmp_path):
    # weight_type=QUInt8: weight zero points != 0, which oneDNN 3.2's int8 matmul lacks: the dense
    # stays float32 on dequantized weights, reading the round trip's float32 output (one
    # dynamic_quantize_dequantize node), still one region and ONNX Runtime's numbers
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch.manual_seed(0)
    net = torch.nn.Linear(32, 24).eval()
    torch.onnx.export(net, (torch.randn(4, 32),), str(tmp_path / "f.onnx"), input_names=["x"], output_names=["y"],
                      dynamo=False, opset_version=17)
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QUInt8)
    part = bh.partition(*bh.from_onnx(tmp_path / "q.onnx"))
    assert "llvm" not in bh.op_profile(part).counts
    ops = [n["op"] for n in _region_nodes(part)]
    assert "dynamic_quantize_dequantize" in ops and "dense" in ops
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    want = _ort(tmp_path / "q.onnx", [x])
    # the same 8-bit products, summed in float32 instead of int32
    assert np.abs(run(build(part), [x]) - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("mode", ["", "saturating"])
def test_the_report_counts_dense_layers_quantized_per_call_as_int8(mlp, monkeypatch, mode):
    # a quantize_dynamic region was reported "f32" even where its dense layers ran int8 (src_dynamic), so
    # tests/test_int8_zoo.py held the saturating path to the wrong reference (issue 35, session 9). With
    # BYOC_HETERO_INT8=saturating (or a VNNI CPU) both dense layers quantize their source per call; where
    # the fusions do not fire the region still has the per-call round trips: "mixed (0 of 2 ...)"
    from byoc_hetero.backends.onednn.precision import int8_kernels_reason

    monkeypatch.setenv("BYOC_HETERO_INT8", mode)
    part = bh.partition(*bh.from_onnx(mlp[0]))
    build(part)
    region = bh.report(part).regions[0]
    dense = [n for n in _region_nodes(part) if n["op"] == "dense"]
    fused = int8_kernels_reason() is None
    assert sum(n["attrs"].get("src_dynamic") == 1 for n in dense) == (2 if fused else 0)
    assert region.precision == ("int8 (2 of 2" if fused else "mixed (0 of 2") + " conv2d/dense/matmul int8)"
    assert "dynamic_quantize_dequantize" not in region.float32_ops
