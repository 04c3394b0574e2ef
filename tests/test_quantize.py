"""bh.quantize: our post-training quantizer.

References: a numpy simulation of the same QDQ network (the scales and zero points bh.quantize
reports, the int8 / int32 parameters it returns), the float model (an error bound), and ONNX
Runtime's quantize_static on the same ONNX model (the same Q/DQ placement)."""

from __future__ import annotations

import numpy as np
import pytest
from reference import conv2d_nchw

import byoc_hetero as bh
from byoc_hetero.errors import InputError, QuantizationError
from byoc_hetero.quant.calibrate import calibrated_range, entropy_threshold
from byoc_hetero.quant.plan import activation_qparams, weight_qparams
from byoc_hetero.timing import build, run


def _inputs(mod, count, seed=0, positive=False):
    rng = np.random.default_rng(seed)
    shape = [int(d) for d in mod["main"].params[0].ty.shape.values]
    return [(rng.random(shape) if positive else rng.standard_normal(shape)).astype("float32") for _ in range(count)]


def fake_quant(x, qp, dtype="uint8"):
    """ONNX QuantizeLinear then DequantizeLinear: round half to even, saturate."""
    scale, zp = qp
    qmin, qmax = (0, 255) if dtype == "uint8" else (-128, 127)
    q = np.clip(np.rint(x.astype(np.float32) / np.float32(scale)) + zp, qmin, qmax)
    return ((q - zp) * np.float32(scale)).astype(np.float32)


def _weight(q, layer, axis):
    w = q.params[f"{layer.weight}_quantized"].astype(np.float32)
    shape = [-1 if i == axis else 1 for i in range(w.ndim)]
    return w * layer.weight_scale.reshape(shape)


def _bias(q, layer, channels):
    b = q.params[f"{layer.bias}_quantized"].astype(np.float32)
    return b * (np.float32(layer.inputs[0][0]) * np.broadcast_to(layer.weight_scale, (channels,))).astype(np.float32)


def _simulate_small_convnet(q, x, dtype="uint8"):
    """bh.models.small_convnet's layers with fake quantization where bh.quantize put Q/DQ."""
    conv1, conv2, conv3, fc1, fc2 = q.layers
    y = fake_quant(x, conv1.inputs[0], dtype)
    y = conv2d_nchw(y, _weight(q, conv1, 0), padding=(1, 1, 1, 1)) + _bias(q, conv1, 8).reshape(1, -1, 1, 1)
    y = fake_quant(y, conv1.output, dtype)  # the relu: the range starts at 0
    y = fake_quant(conv2d_nchw(y, _weight(q, conv2, 0), stride=(2, 2), padding=(1, 1, 1, 1)), conv2.output, dtype)
    y = conv2d_nchw(y, _weight(q, conv3, 0)) + _bias(q, conv3, 16).reshape(1, -1, 1, 1)
    y = fake_quant(y, conv3.output, dtype)
    n, c, h, w = y.shape
    y = y.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5)).reshape(n, -1)  # max pool, flatten: same scale
    assert fc1.inputs[0] == conv3.output
    y = fake_quant(y @ _weight(q, fc1, 0).T + _bias(q, fc1, 32), fc1.output, dtype)
    return fake_quant(y @ _weight(q, fc2, 1) + _bias(q, fc2, 10), fc2.output, dtype)


def _assert_within_one_step(got, want, scale):
    # the same QDQ network computed in another order: a value may round to the neighbouring step
    diff = np.abs(got.astype(np.float64) - want)
    assert diff.max() <= scale * 1.01, f"max difference {diff.max()} over one step {scale}"
    assert np.mean(diff < scale * 0.01) >= 0.9  # most values agree exactly


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_small_convnet_matches_a_numpy_simulation_and_stays_near_float(dtype):
    mod, params = bh.models.small_convnet()
    calib = _inputs(mod, 4)
    q = bh.quantize(mod, params, calibration=calib, activation_dtype=dtype, verbose=False)
    assert [layer.name for layer in q.layers] == ["conv2d_0", "conv2d_1", "conv2d_2", "matmul_0", "matmul_1"]
    assert [layer.relu for layer in q.layers] == [True, True, False, True, False]
    ex = build(bh.bind_params(q.mod, q.params))
    float_ex = build(bh.bind_params(mod, params))
    for x in calib[:2] + _inputs(mod, 1, seed=7):
        got = run(ex, [x])
        _assert_within_one_step(got, _simulate_small_convnet(q, x, dtype), q.layers[-1].output[0])
        want = run(float_ex, [x])
        assert np.abs(got - want).max() <= 0.06 * np.abs(want).max()
    assert 0 < q.error <= 0.06


def test_mlp_matches_a_numpy_simulation():
    mod, params = bh.models.mlp(features=32, hidden=(48, 24), num_classes=8)
    calib = _inputs(mod, 3, positive=True)
    q = bh.quantize(mod, params, calibration=calib, verbose=False)
    x = calib[0]
    y = fake_quant(x, q.layers[0].inputs[0])
    for i, layer in enumerate(q.layers):
        assert layer.inputs[0] == (q.layers[i - 1].output if i else q.layers[0].inputs[0])
        channels = layer.weight_scale.shape[0]
        y = fake_quant(y @ _weight(q, layer, 1) + _bias(q, layer, channels), layer.output)
    got = run(build(bh.bind_params(q.mod, q.params)), [x])
    _assert_within_one_step(got, y, q.layers[-1].output[0])
    # params: float weights replaced by int8 ones, biases by int32 ones
    assert "fc1_weight" not in q.params and q.params["fc1_weight_quantized"].dtype == np.int8
    assert q.params["fc1_bias_quantized"].dtype == np.int32


class _Block:
    """A transformer encoder block (one head): attention's two matmuls of activations, softmax,
    layer norms and a GELU MLP — the ops bh.quantize leaves float between quantized layers."""

    def __new__(cls):
        import torch

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.qkv = torch.nn.Linear(32, 96)
                self.proj = torch.nn.Linear(32, 32)
                self.ln1, self.ln2 = torch.nn.LayerNorm(32), torch.nn.LayerNorm(32)
                self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

            def forward(self, x):
                q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
                att = torch.softmax(q @ k.transpose(-1, -2) / 32 ** 0.5, dim=-1)
                x = x + self.proj(att @ v)
                return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))

        torch.manual_seed(0)
        return Block().eval()


def test_transformer_block_quantizes_its_attention_matmuls_and_stays_near_float():
    import torch

    block = _Block()
    mod, params = bh.from_torch(block, (torch.randn(1, 8, 32),))
    calib = [np.random.default_rng(i).standard_normal((1, 8, 32)).astype("float32") for i in range(4)]
    q = bh.quantize(mod, params, calibration=calib, verbose=False)
    ops = [layer.op for layer in q.layers]
    weights = [layer.weight for layer in q.layers]
    assert ops.count("matmul") == 6 and weights.count(None) == 2  # q·kᵀ and att·v: both inputs quantized
    assert all(len(layer.inputs) == 2 for layer in q.layers if layer.weight is None)
    x = np.random.default_rng(9).standard_normal((1, 8, 32)).astype("float32")
    want = block(torch.from_numpy(x)).detach().numpy()
    got = run(build(bh.bind_params(q.mod, q.params)), [x])
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
    assert q.error <= 0.05
    # the offloaded build of the quantized module computes what its llvm build computes
    offloaded = run(build(bh.partition(q.mod, q.params)), [x])
    np.testing.assert_allclose(offloaded, got, atol=2 * max(layer.output[0] for layer in q.layers))


# ---------------------------------------------------------------------------------------------
# the same placement as ONNX Runtime's quantize_static
# ---------------------------------------------------------------------------------------------
def _residual_cnn_onnx(path):
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8 * 8 * 8, 10)

        def forward(self, x):
            x = torch.relu(self.c1(x))
            x = torch.relu(self.c2(x)) + x
            return self.fc(torch.nn.functional.max_pool2d(x, 2).flatten(1))

    torch.manual_seed(0)
    torch.onnx.export(Net().eval(), (torch.randn(1, 3, 16, 16),), str(path), input_names=["x"],
                      output_names=["y"], dynamo=False, opset_version=17)


def qdq_placement(mod) -> list[tuple]:
    """Per conv2d / matmul / add / max_pool2d / reshape of main, in order: the op, what each of its
    operands is (a dequantized activation, a dequantized int8 weight and its axis, a dequantized int32
    bias, or float) and whether its value is quantized next."""
    import tvm
    from tvm import relax

    from byoc_hetero._relax import bound_values, op_name

    func = mod["main"]
    values = bound_values(func)
    users: dict = {}
    for var, value in values.items():
        if isinstance(value, relax.Call):
            for a in value.args:
                users.setdefault(a, []).append(value)

    def kind(arg):
        value = values.get(arg)
        if isinstance(value, relax.Call) and op_name(value) in ("relax.permute_dims", "relax.reshape"):
            inner = kind(value.args[0])
            if inner.startswith("dq("):
                return inner
        if not (isinstance(value, relax.Call) and op_name(value) == "relax.dequantize"):
            return "float"
        src = value.args[0]
        # a constant operand (a param, or a relax.Constant the importer kept in metadata)
        if isinstance(src, tvm.ir.Constant) or (isinstance(src, relax.Var) and src in list(func.params)):
            return f"dq({src.ty.dtype} param, axis {int(value.attrs.axis)})"
        return "dq(activation)"

    placement = []
    for var, value in values.items():
        op = op_name(value) if isinstance(value, relax.Call) else None
        if op not in ("relax.nn.conv2d", "relax.matmul", "relax.add", "relax.nn.max_pool2d"):
            continue
        quantized_next = any(op_name(u) == "relax.quantize" for u in users.get(var, []))
        placement.append((op, tuple(kind(a) for a in value.args), quantized_next))
    return placement


def test_the_qdq_placement_is_the_one_quantize_static_writes(tmp_path):
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    _residual_cnn_onnx(tmp_path / "f.onnx")
    calib = [np.random.default_rng(i).standard_normal((1, 3, 16, 16)).astype("float32") for i in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"x": c} for c in calib])

        def get_next(self):
            return next(self.items, None)

    quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    theirs, their_params = bh.from_onnx(onnx.load(str(tmp_path / "q.onnx")))
    mod, params = bh.from_onnx(str(tmp_path / "f.onnx"))
    ours = bh.quantize(mod, params, calibration=calib, verbose=False)
    placement = qdq_placement(ours.mod)
    assert placement == qdq_placement(theirs)
    assert placement[0] == ("relax.nn.conv2d", ("dq(activation)", "dq(int8 param, axis 0)"), False)
    # both partition alike: the same regions and the same ops left to llvm
    ours_part, theirs_part = bh.partition(ours.mod, ours.params), bh.partition(theirs, their_params)
    assert bh.op_profile(ours_part) == bh.op_profile(theirs_part)
    # and compute nearly the same thing (minmax calibration, same inputs: ranges alike)
    x = calib[0]
    a, b = run(build(ours_part), [x]), run(build(theirs_part), [x])
    assert np.abs(a - b).max() <= 0.05 * np.abs(b).max()


# ---------------------------------------------------------------------------------------------
# options
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("keep", [["conv2d_1"], [1], ["conv2_weight"], lambda layer: layer.name == "conv2d_1"])
def test_keep_float_leaves_the_chosen_layer_float(keep):
    mod, params = bh.models.small_convnet()
    q = bh.quantize(mod, params, calibration=_inputs(mod, 2), keep_float=keep, verbose=False)
    assert q.kept_float == ["conv2d_1"] and "conv2d_1" not in [layer.name for layer in q.layers]
    assert q.params["conv2_weight"].dtype == np.float32 and "conv2_weight_quantized" not in q.params
    assert q.params["conv1_weight_quantized"].dtype == np.int8


def test_keep_float_with_an_unknown_layer_lists_the_layers():
    mod, params = bh.models.small_convnet()
    with pytest.raises(QuantizationError, match=r"keep_float names 'conv9'.*0:conv2d_0\(conv1_weight\)"):
        bh.quantize(mod, params, calibration=_inputs(mod, 1), keep_float=["conv9"], verbose=False)


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "kl"}, "method must be one of minmax, percentile, entropy"),
    ({"activation_dtype": "int16"}, "activation_dtype must be 'uint8' or 'int8'"),
    ({"percentile": 20}, "percentile must lie in"),
    ({"calibrate_on": "gpu"}, "calibrate_on must be"),
    ({"calibration": []}, "calibration is empty"),
])
def test_bad_options_are_quantization_errors(kwargs, message):
    mod, params = bh.models.small_convnet()
    args = {"calibration": _inputs(mod, 1), "verbose": False} | kwargs
    with pytest.raises(QuantizationError, match=message):
        bh.quantize(mod, params, **args)


def test_a_calibration_input_of_the_wrong_shape_is_an_input_error():
    mod, params = bh.models.small_convnet()
    with pytest.raises(InputError):
        bh.quantize(mod, params, calibration=[np.zeros((1, 3, 8, 8), np.float32)], verbose=False)


def test_a_calibration_input_with_nan_is_named():
    mod, params = bh.models.small_convnet()
    bad = _inputs(mod, 1)[0]
    bad[0, 0, 0, 0] = np.nan
    with pytest.raises(QuantizationError, match=r"tensor 'data' holds NaN or inf on a calibration input"):
        bh.quantize(mod, params, calibration=[bad], verbose=False)


def test_a_model_without_layers_is_a_quantization_error():
    from conftest import graph
    from tvm import relax

    mod = graph({"x": (2, 4)}, lambda emit, x: emit(relax.op.nn.relu(x)))
    with pytest.raises(QuantizationError, match="no layer to quantize"):
        bh.quantize(mod, {}, calibration=[np.ones((2, 4), np.float32)], verbose=False)


def test_the_error_is_printed(capsys):
    mod, params = bh.models.small_convnet()
    q = bh.quantize(mod, params, calibration=_inputs(mod, 2))
    out = capsys.readouterr().out
    assert "quantized 5 layers to int8" in out and f"{q.error:.2e}" in out


def test_calibration_builds_one_observer_and_onednn_calibrates_alike(monkeypatch):
    import byoc_hetero.quant as quant

    calls = []
    real = quant.build_observer
    monkeypatch.setattr(quant, "build_observer", lambda *a, **k: calls.append(a[3] if len(a) > 3 else k) or real(*a, **k))
    mod, params = bh.models.small_convnet()
    calib = _inputs(mod, 3)
    a = bh.quantize(mod, params, calibration=calib, verbose=False)
    b = bh.quantize(mod, params, calibration=calib, calibrate_on="onednn", verbose=False)
    assert calls == ["llvm", "onednn"]  # one build per quantize call, whatever the layer count
    for la, lb in zip(a.layers, b.layers):
        assert la.output[1] == lb.output[1] and abs(la.output[0] - lb.output[0]) <= 1e-4 * la.output[0]


# ---------------------------------------------------------------------------------------------
# the arithmetic
# ---------------------------------------------------------------------------------------------
def test_weight_quantization_is_symmetric_per_channel_with_round_half_to_even():
    w = np.array([[1.27, -0.635, 0.005], [0.0, 0.0, 0.0], [2.0, 1.0, -0.5]], np.float32)
    q, scale = weight_qparams(w, axis=0)
    np.testing.assert_allclose(scale, [0.01, 1.0, 2.0 / 127], rtol=1e-6)
    assert q.dtype == np.int8 and q[0].tolist() == [127, -64, 0]  # -63.5 -> -64, 0.5 -> 0 (to even)
    assert q[1].tolist() == [0, 0, 0] and q[2].tolist() == [127, 64, -32]
    _, one = weight_qparams(w, axis=None)
    assert one.shape == () and np.isclose(one, 2.0 / 127)


@pytest.mark.parametrize("lo, hi, dtype, scale, zp", [
    (-1.0, 3.0, "uint8", 4 / 255, 64), (0.5, 2.0, "uint8", 2 / 255, 0), (-2.0, -1.0, "uint8", 2 / 255, 255),
    (-1.0, 3.0, "int8", 4 / 255, -64), (0.0, 0.0, "uint8", 1.0, 0),
])
def test_activation_parameters_as_onnxruntime_computes_them(lo, hi, dtype, scale, zp):
    s, z = activation_qparams(lo, hi, dtype)
    assert np.isclose(s, scale, rtol=1e-6) and z == zp


def test_range_methods():
    x = np.random.default_rng(0).standard_normal(200_000).astype(np.float32)
    x[0] = 50.0  # one outlier
    assert calibrated_range(x, "minmax") == (float(x.min()), 50.0)
    lo, hi = calibrated_range(x, "percentile", 99.9)
    assert np.isclose(hi, np.percentile(x, 99.9)) and 2.8 < hi < 3.4 and -3.4 < lo < -2.8
    t = entropy_threshold(np.abs(x), signed=True)
    assert 3.0 < t < 20.0  # the outlier is clipped, the Gaussian's bulk kept
    lo, hi = calibrated_range(x, "entropy")
    assert hi == pytest.approx(t) and lo == pytest.approx(max(float(x.min()), -t))


def test_a_module_with_a_symbolic_batch_calibrates_on_any_sizes_and_runs_any_size():
    import torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    batch = torch.export.Dim("N", min=1, max=64)
    mod, params = bh.from_torch(net, (torch.randn(2, 16),), dynamic_shapes=({0: batch},))
    rng = np.random.default_rng(0)
    calib = [rng.random((3, 16), dtype=np.float32), rng.random((5, 16), dtype=np.float32)]
    q = bh.quantize(mod, params, calibration=calib, verbose=False)
    # a third size, of rows seen in calibration (a row beyond the calibrated ranges saturates: an
    # unseen random row gave 10% here, with 8 calibration rows)
    x = np.concatenate(calib)[:7]
    got = run(build(bh.partition(q.mod, q.params)), [x])
    want = net(torch.from_numpy(x)).detach().numpy()
    assert got.shape == (7, 4) and np.abs(got - want).max() <= 0.05 * np.abs(want).max()


def test_a_weight_also_read_outside_its_layer_stays_float_there():
    # an embedding table tied to the output projection (GPT-2's wte): the matmul reads the int8 copy,
    # the other reader the float parameter, as ONNX Runtime keeps the float initializer for it
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    w = relax.Var("w", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w))
            z = bb.emit(relax.op.multiply(w, relax.const(2.0, "float32")))
            out = bb.emit_output(relax.Tuple([y, z]))
        bb.emit_func_output(out)
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((4, 8)).astype(np.float32)}
    q = bh.quantize(bb.get(), params, calibration=[rng.standard_normal((2, 4)).astype(np.float32)], verbose=False)
    assert q.params["w"].dtype == np.float32 and q.params["w_quantized"].dtype == np.int8
    import tvm

    vm = relax.VirtualMachine(build(bh.bind_params(q.mod, q.params)), tvm.cpu())
    _, doubled = vm["main"](tvm.runtime.tensor(np.ones((2, 4), np.float32)))
    np.testing.assert_array_equal(doubled.numpy(), 2 * params["w"])


def test_batch_norms_fold_into_the_int8_convolutions_before_them():
    """torch.export keeps each inference batch norm after its conv: bh.quantize folds it into the
    conv's weights and bias (quant/fold_batch_norms), so the partitioned model runs the conv int8
    with nothing float32 between the layers, and stays near torch's float output."""
    import torch

    from byoc_hetero.quant.fold_batch_norms import fold_batch_norms

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                              torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                              torch.nn.ReLU()).eval()
    for m in net:
        if isinstance(m, torch.nn.BatchNorm2d):  # fresh statistics are an identity: make them matter
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.3, 0.3)
    x = torch.randn(1, 3, 12, 12)
    mod, params = bh.from_torch(net, (x,))
    folded, fparams = fold_batch_norms(mod["main"], params)
    assert "batch_norm" in str(mod["main"]) and "batch_norm" not in str(folded)
    assert not set(fparams) & {n for n in params if "running" in n or n.endswith(("1_weight", "1_bias"))}
    rng = np.random.default_rng(0)
    q = bh.quantize(mod, params, calibration=[rng.standard_normal((1, 3, 12, 12)).astype("float32")
                                              for _ in range(4)] + [x.numpy()], verbose=False)
    assert [layer.bias is not None for layer in q.layers] == [True, True]
    part = bh.partition(q.mod, q.params)
    rep = bh.report(part)
    assert len(rep.regions) == 1 and not rep.fallbacks
    assert "int8" in str(rep) and "batch_norm" not in str(rep)
    got = run(build(part), [x.numpy()])[0]
    want = net(x).detach().numpy()
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 0.05  # two int8 layers: a few steps
