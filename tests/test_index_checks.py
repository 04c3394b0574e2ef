"""Out-of-range indices on every path (issue 27): a gather the import produces checks its indices
whether it runs on llvm or in a region, and reports the index as the model's user wrote it.

Reference: ONNX Runtime (in-range results; it rejects out-of-range indices too) and numpy.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.cli import EXIT_INPUT
from byoc_hetero.timing import build

ROWS, DIM = 10, 4


def gather_model(then_matmul: bool = False) -> onnx.ModelProto:
    """Gather(table[10, 4], ids[3]) -- alone, or followed by a MatMul (the gather then sits in a region)."""
    table = numpy_helper.from_array(np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["g" if then_matmul else "y"], axis=0)]
    inits = [table]
    if then_matmul:
        w = numpy_helper.from_array(np.linspace(-1, 1, DIM * 8, dtype=np.float32).reshape(DIM, 8), "w")
        nodes.append(helper.make_node("MatMul", ["g", "w"], ["y"]))
        inits.append(w)
    graph = helper.make_graph(nodes, "gather", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8 if then_matmul else DIM])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def onnxruntime_run(model: onnx.ModelProto, ids: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"ids": ids})[0]


def _vms(model):
    """The llvm-only build and the partitioned build of ``model`` (imported once)."""
    mod, params = bh.from_onnx(model)
    builds = {"llvm": build(bh.bind_params(mod, params)), "partitioned": build(bh.partition(mod, params))}
    return {name: relax.VirtualMachine(ex, tvm.cpu()) for name, ex in builds.items()}


@pytest.fixture(scope="module", params=["alone", "in_region"])
def vms(request):
    model = gather_model(then_matmul=request.param == "in_region")
    return model, _vms(model)


def test_in_range_indices_match_onnxruntime(vms):
    model, machines = vms
    ids = np.array([0, -1, 9], "int64")  # a negative index counts from the end, as ONNX says
    want = onnxruntime_run(model, ids)
    for name, vm in machines.items():
        got = vm["main"](tvm.runtime.tensor(ids)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("bad", [100, 2**40, -11, -(2**40)])
def test_out_of_range_index_is_an_input_error_naming_it_as_written(vms, bad):
    _, machines = vms
    ids = np.array([1, bad, 2], "int64")
    for vm in machines.values():
        with pytest.raises(bh.InputError, match=rf"index {bad} at position 1 .* axis of {ROWS} "
                                                rf"\(expected -{ROWS} <= index < {ROWS}\)"):
            vm["main"](tvm.runtime.tensor(ids))


def test_the_region_itself_still_checks(vms):
    """The in-region gather: the region's own kernel check stays (cpp/kernels/take.cc), the llvm-side
    check in front of it reads the indices as written."""
    model, _ = vms
    mod, params = bh.from_onnx(model)
    part = bh.partition(mod, params)
    ops = bh.op_profile(part)
    if model.graph.node[-1].op_type == "MatMul":
        assert ops.counts.get("byoc_hetero", {}).get("take", 0) == 1, str(ops)


def test_lone_gather_through_the_cli(tmp_path):
    """`byoc-hetero run gather.onnx` with an index of 100 or 2**40: exit code 2 and the index on
    stderr (it was exit 0 with garbage rows, and SIGSEGV: 139). The index that crashed runs the real entry
    point in a subprocess (a crash there fails this test, not the test session); the others run in this
    process (conftest.run_cli), saving an interpreter's imports each."""
    from conftest import run_cli

    path = tmp_path / "gather.onnx"
    onnx.save(gather_model(), path)
    ids = tmp_path / "ids.npy"
    np.save(ids, np.array([1, 100, 2], "int64"))
    proc = run_cli("run", path, "--input", ids)
    assert proc.returncode == EXIT_INPUT, (proc.returncode, proc.stderr[-2000:])
    assert "index 100 at position 1" in proc.stderr
    np.save(ids, np.array([1, 2**40, 2], "int64"))
    proc = subprocess.run([sys.executable, "-m", "byoc_hetero", "run", str(path), "--input", str(ids)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == EXIT_INPUT, (proc.returncode, proc.stderr[-2000:])
    assert f"index {2**40} at position 1" in proc.stderr
    np.save(ids, np.array([3, -2, 0], "int64"))
    out = tmp_path / "y.npy"
    proc = run_cli("run", path, "--input", ids, "--output", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    np.testing.assert_array_equal(np.load(out), onnxruntime_run(gather_model(), np.load(ids)))


def test_torch_embedding_checks_its_indices():
    import torch

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(ROWS, DIM)

        def forward(self, ids):
            return self.table(ids)

    net = Embed().eval()
    mod, params = bh.from_torch(net, (torch.tensor([[1, 2, 3]]),))
    vm = relax.VirtualMachine(build(bh.bind_params(mod, params)), tvm.cpu())
    ok = np.array([[0, 9, 4]], "int64")
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(ok)).numpy(),
                               net(torch.from_numpy(ok)).detach().numpy(), rtol=1e-6)
    with pytest.raises(bh.InputError, match=rf"index -1 at position 1 .*expected 0 <= index < {ROWS}"):
        vm["main"](tvm.runtime.tensor(np.array([[0, -1, 4]], "int64")))  # torch refuses negatives too


def test_constant_indices_in_range_are_left_alone():
    """Nothing to check at run time: no check is inserted, the index bookkeeping stays foldable."""
    from byoc_hetero.passes.checked_take import CHECK_PRIMFUNC, checked_take

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((ROWS, DIM), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.take(x, relax.const(np.array([0, 9], "int64")), axis=0))
        bb.emit_func_output(y)
    mod = bb.get()
    assert checked_take(mod) is mod
    assert not any(gv.name_hint.startswith(CHECK_PRIMFUNC) for gv in checked_take(mod).get_global_vars())
