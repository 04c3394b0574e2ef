"""Edge inputs from issue 27: a batch of 0, a check returning numpy.bool_, ``bh.partition(None)``.

Reference for the empty batch: ONNX Runtime and the llvm-only build (both return an empty result).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.rules.match import run_check
from byoc_hetero.timing import build


def conv_model() -> onnx.ModelProto:
    """x[N, 3, 8, 8] -> Conv(8, 3x3, pad 1) -> Relu."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    inits = [w]
    out_shape = ["N", 8, 8, 8]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def onnxruntime_run(model, x):
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_batch_of_zero_returns_an_empty_result_like_onnxruntime():
    model = conv_model()
    mod, params = bh.from_onnx(model)
    part = bh.partition(mod, params)
    assert bh.op_profile(part).total("byoc_hetero") >= 2, "conv and relu run in a region"
    offloaded = relax.VirtualMachine(build(part), tvm.cpu())
    llvm = relax.VirtualMachine(build(bh.bind_params(mod, params)), tvm.cpu())
    for n in (0, 2, 0):  # an empty call between two real ones changes nothing
        x = np.random.default_rng(n).standard_normal((n, 3, 8, 8)).astype("float32")
        want = onnxruntime_run(model, x)
        got = offloaded["main"](tvm.runtime.tensor(x)).numpy()
        assert got.shape == want.shape == llvm["main"](tvm.runtime.tensor(x)).numpy().shape == (n, 8, 8, 8)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_batch_of_zero_through_bh_vm_input_check():
    from byoc_hetero.inputs import check_inputs

    mod, params = bh.from_onnx(conv_model())
    check_inputs(mod, [np.zeros((0, 3, 8, 8), "float32")], params)  # accepted: an empty batch
    with pytest.raises(bh.InputError, match=r"expected shape"):
        check_inputs(mod, [np.zeros((0, 3, 8, 9), "float32")], params)


def test_check_returning_numpy_bool_is_a_bool():
    assert run_check(lambda m: np.bool_(True), None, "rule") is None
    assert "rejected" in run_check(lambda m: np.bool_(False), None, "rule")
    with pytest.raises(bh.RuleError, match="got int"):
        run_check(lambda m: 3, None, "rule")


@pytest.mark.parametrize("bad", [None, "model.onnx", 3])
def test_partition_of_something_else_is_a_clear_error(bad):
    with pytest.raises(bh.FrontendError, match=rf"partition expects a tvm.IRModule .*got {type(bad).__name__}"):
        bh.partition(bad)
