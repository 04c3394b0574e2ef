"""``byoc-hetero tune``: tunes an ONNX file, prints the report, draws progress on stderr, writes a
library that reloads and computes what ONNX Runtime computes; errors are one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

# the small CNN exported to ONNX, and its input, as the other commands' tests use them
from test_cli import _one_line_error, cli, model  # noqa: E402,F401


def test_tune_writes_a_library_that_reloads_and_matches_onnxruntime(model, tmp_path):
    import tvm
    from tvm import relax

    import byoc_hetero as bh

    path, x = model
    lib, cache = tmp_path / "tuned.so", tmp_path / "timings.json"
    out = cli("tune", path, "-o", lib, "--cache", cache, "--repeat", "3", "--guard-rounds", "1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("tuning report") and "codegen:" in out.stdout and "timing cache:" in out.stdout
    # stderr is a pipe here: the progress comes as plain lines, one per step
    steps = [ln for ln in out.stderr.splitlines() if ln.startswith("tune [")]
    assert any(" codegen " in ln for ln in steps) and "\r" not in out.stderr
    assert json.loads(cache.read_text())["entries"]
    vm = relax.VirtualMachine(bh.load_module(lib), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(np.load(x))).numpy()
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": np.load(x)})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # the library runs through 'run' too, and a second tune reads the cache back
    ran = cli("run", lib, "--input", x, "--output", tmp_path / "y.npy")
    assert ran.returncode == 0, ran.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-4)
    again = cli("tune", path, "--cache", cache, "--repeat", "3", "--guard-rounds", "1")
    assert again.returncode == 0, again.stderr
    assert "[cached]" in again.stdout and " 0 misses" in again.stdout


def test_tune_errors_are_one_line(model, tmp_path):
    path, _ = model
    _one_line_error(cli("tune", path, "-o", tmp_path / "tuned.txt"), 2, "tuned.txt", ".so")
    _one_line_error(cli("tune", tmp_path / "nope.onnx"), 2, "nope.onnx")
    _one_line_error(cli("tune", path, "--shape", "x=1,0"), 2, "x=1,0")
    dynamic = tmp_path / "dynamic.onnx"
    from test_frontends import _make

    net, x = _make("cnn")
    torch.onnx.export(net, (x,), str(dynamic), dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    _one_line_error(cli("tune", dynamic), 2, "'x'", "static shapes", "--shape")
    fixed = cli("tune", dynamic, "--shape", f"x={','.join(map(str, x.shape))}", "--repeat", "3", "--guard-rounds", "1")
    assert fixed.returncode == 0, fixed.stderr
