"""Import from PyTorch and ONNX: small models the test builds itself, checked against torch / ORT."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TOLERANCE

import byoc_hetero as bh
from byoc_hetero.frontends import ModelFileError, UnsupportedModelError, from_onnx, from_torch
from byoc_hetero.inputs import check_inputs
from byoc_hetero.timing import build, relative_error, run

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


class SmallMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 5)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


CASES = {"cnn": (SmallCNN, (2, 3, 16, 16)), "mlp": (SmallMLP, (4, 32))}


def _make(name):
    torch.manual_seed(0)
    cls, shape = CASES[name]
    return cls().eval(), torch.randn(*shape)


def _export_onnx(model, x, path):
    torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"], output_names=["y"])
    return path


@pytest.mark.parametrize("name", sorted(CASES))
def test_from_torch_matches_pytorch(name):
    model, x = _make(name)
    with torch.no_grad():
        want = model(x).numpy()
    mod, params = from_torch(model, (x,))
    assert all(isinstance(v, np.ndarray) for v in params.values())
    part = bh.partition(mod, params)
    prof = bh.op_profile(part)
    assert prof.regions["byoc_hetero"] >= 1
    assert prof.counts["byoc_hetero"]["matmul"] == 2 if name == "mlp" else prof.counts["byoc_hetero"]["nn.conv2d"] == 2
    assert relative_error(run(build(part), [x.numpy()]), want) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(CASES))
def test_from_onnx_matches_onnxruntime(name, tmp_path):
    model, x = _make(name)
    path = _export_onnx(model, x, tmp_path / f"{name}.onnx")
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    for source in (path, onnx.load(str(path))):  # a path or a ModelProto
        mod, params = from_onnx(source)
        part = bh.partition(mod, params)
        assert bh.op_profile(part).regions["byoc_hetero"] >= 1
        assert relative_error(run(build(part), [x.numpy()]), want) <= TOLERANCE


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(ModelFileError, match="does not exist"):
        from_onnx(tmp_path / "nope.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf \xff\xfe")
    with pytest.raises(ModelFileError, match="bad.onnx"):
        from_onnx(bad)


def test_unsupported_onnx_op_is_named():
    from onnx import TensorProto, helper

    node = helper.make_node("MyCustomOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedModelError, match="MyCustomOp"):
        from_onnx(model)


def test_check_inputs_names_the_problem():
    model, x = _make("mlp")
    mod, params = from_torch(model, (x,))
    check_inputs(mod, [x.numpy()], params)
    with pytest.raises(bh.InputError, match="expected shape \\[4, 32\\], got \\[4, 31\\]"):
        check_inputs(mod, [np.zeros((4, 31), "float32")], params)
    with pytest.raises(bh.InputError, match="expected dtype float32, got float64"):
        check_inputs(mod, [np.zeros((4, 32))], params)
    with pytest.raises(bh.InputError, match="takes 1 inputs"):
        check_inputs(mod, [], params)
