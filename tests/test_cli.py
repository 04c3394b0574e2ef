"""The command line: each command on a small ONNX model; errors give one line and an exit code.

``cli`` runs a command in this process (conftest.run_cli: ``byoc_hetero.cli.main``, what ``python -m
byoc_hetero`` calls, without a fresh interpreter's ~7 s of imports per call); ``cli_process`` runs the real
entry point in a subprocess, for ``--help``, bad usage and one command on a model end to end."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")


from conftest import run_cli as cli  # noqa: E402  (test_tune_cli and test_quantize_cli import it from here)


def cli_process(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "byoc_hetero", *map(str, args)], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from test_frontends import _export_onnx, _make

    net, x = _make("cnn")
    tmp = tmp_path_factory.mktemp("cli")
    path = _export_onnx(net, x, tmp / "cnn.onnx")
    np.save(tmp / "x.npy", x.numpy())
    return path, tmp / "x.npy"


def test_help_lists_the_commands():
    out = cli_process("--help")
    assert out.returncode == 0
    for command in ("demo", "report", "run", "bench", "info"):
        assert command in out.stdout


def test_report_and_picture(model, tmp_path):
    import byoc_hetero as bh

    path, _ = model
    out = cli("report", path, "--render", tmp_path / "g.dot")
    assert out.returncode == 0, out.stderr
    expected = bh.report(bh.partition(*bh.from_onnx(path)))
    assert f"regions: {len(expected.regions)}," in out.stdout and "left on llvm" in out.stdout
    assert str(expected) in out.stdout
    assert "MergeCompilerRegions" in out.stderr  # progress
    assert (tmp_path / "g.dot").read_text().startswith("digraph")


def test_run_matches_onnxruntime(model, tmp_path):
    path, x = model
    out = cli_process("run", path, "--input", x, "--output", tmp_path / "y.npy")
    assert out.returncode == 0, out.stderr
    got = np.load(tmp_path / "y.npy")
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": np.load(x)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_bench(model):
    out = cli("bench", model[0], "--repeat", "2")
    assert out.returncode == 0, out.stderr
    assert "offloaded" in out.stdout and "llvm-only" in out.stdout and "speed-up" in out.stdout


def _one_line_error(out, code, *words):
    assert out.returncode == code, (out.returncode, out.stderr)
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("byoc-hetero: error:")]
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    for word in words:
        assert word in lines[0]


def test_missing_and_corrupt_model(tmp_path):
    _one_line_error(cli("report", tmp_path / "nope.onnx"), 2, "nope.onnx", "does not exist")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx model")
    _one_line_error(cli("report", bad), 2, "bad.onnx")


def test_wrong_input_shape_and_dtype(model, tmp_path):
    path, _ = model
    np.save(tmp_path / "small.npy", np.zeros((2, 3, 8, 8), "float32"))
    _one_line_error(cli("run", path, "--input", tmp_path / "small.npy"), 2, "expected shape [2, 3, 16, 16]")
    np.save(tmp_path / "f64.npy", np.zeros((2, 3, 16, 16)))
    _one_line_error(cli("run", path, "--input", tmp_path / "f64.npy"), 2, "float64")
    _one_line_error(cli("run", path, "--input", tmp_path / "none.npy"), 2, "none.npy")


def test_unsupported_op_exit_code(tmp_path):
    from onnx import TensorProto, helper, save

    node = helper.make_node("MyCustomOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                 helper.make_opsetid("com.example", 1)]), tmp_path / "c.onnx")
    _one_line_error(cli("report", tmp_path / "c.onnx"), 3, "MyCustomOp")


def test_bad_usage_exit_code():
    assert cli_process("frobnicate").returncode == 2
    out = cli("demo", "--image-size", "100")  # VGG-11 needs a multiple of 32: usage, before any work
    assert out.returncode == 2 and "not a positive multiple of 32" in out.stderr


def _tiny_vm():
    import tvm
    from tvm import relax

    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.add(x, x)))
    return relax.VirtualMachine(relax.build(bb.get(), target="llvm"), tvm.cpu())


def _tvm_value_error():
    """A real ValueError from inside TVM: its VM given a float64 input where float32 is expected."""
    import tvm

    _tiny_vm()["main"](tvm.runtime.tensor(np.zeros((2, 3), "float64")))


def _tvm_internal_error():
    """A real tvm.error.InternalError: its VM given two inputs for one parameter."""
    _tiny_vm()["main"](np.zeros((2, 3), "float32"), 1)


@pytest.mark.parametrize("failure, cls", [(_tvm_value_error, "ValueError"),
                                          (_tvm_internal_error, "InternalError")])
def test_tvm_errors_exit_1_with_their_message(failure, cls, monkeypatch, capsys, tmp_path):
    """A TVM error is not bad input: exit 1 (not 2), one line naming its class and message."""
    import byoc_hetero as bh
    from byoc_hetero import cli as cli_module

    with pytest.raises(Exception) as direct:
        failure()
    assert type(direct.value).__name__ == cls and not isinstance(direct.value, bh.ByocError)
    monkeypatch.setattr(cli_module, "_cmd_report", lambda args: failure())
    code = cli_module.main(["report", str(tmp_path / "m.onnx")])
    err = capsys.readouterr().err
    assert code == 1, err
    lines = [ln for ln in err.splitlines() if ln.startswith("byoc-hetero: error:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith(f"byoc-hetero: error: {cls}: ")
    assert str(direct.value).strip().splitlines()[0] in lines[0]


def test_exit_codes_come_from_our_exception_classes():
    import tvm

    import byoc_hetero as bh
    from byoc_hetero.cli import exit_code

    assert exit_code(bh.InputError("x")) == 2 and exit_code(bh.ModelFileError("x")) == 2
    assert exit_code(bh.UnsupportedModelError("x")) == 3
    for err in (ValueError("x"), tvm.error.InternalError("x"), bh.PlacementError("x"), bh.CodegenError("x"),
                FileNotFoundError("x")):
        assert exit_code(err) == 1, err


def test_unreadable_input_file_exit_code(model, tmp_path):
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not an array")
    _one_line_error(cli("run", model[0], "--input", bad), 2, "bad.npy", "not a readable .npy")
