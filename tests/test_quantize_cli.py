"""``--quantize DIR`` on the command line: bh.quantize calibrated on a folder of .npy / .npz samples."""

from __future__ import annotations

import numpy as np
import pytest
from test_cli import cli

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from test_frontends import _export_onnx, _make

    net, x = _make("cnn")
    tmp = tmp_path_factory.mktemp("qcli")
    path = _export_onnx(net, x, tmp / "cnn.onnx")
    calib = tmp / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal(tuple(x.shape)).astype("float32") for _ in range(3)]
    for i, s in enumerate(samples):
        np.save(calib / f"{i:02d}.npy", s)
    np.save(tmp / "x.npy", samples[0])
    return path, tmp / "x.npy", calib, samples


def test_run_with_quantize_computes_what_the_python_api_computes(model, tmp_path):
    import byoc_hetero as bh
    from byoc_hetero.timing import build, run

    path, x, calib, samples = model
    out = cli("run", path, "--input", x, "--quantize", calib, "--output", tmp_path / "y.npy")
    assert out.returncode == 0, out.stderr
    assert "quantizing on 3 calibration inputs (minmax)" in out.stderr and "quantized" in out.stderr
    q = bh.quantize(*bh.from_onnx(path), calibration=samples, verbose=False)
    want = run(build(bh.partition(q.mod, q.params)), [samples[0]])
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)


def test_report_with_quantize_and_npz_samples(model, tmp_path):
    path, _, _, samples = model
    for i, s in enumerate(samples[:2]):
        np.savez(tmp_path / f"{i}.npz", x=s)
    out = cli("report", path, "--quantize", tmp_path, "--quantize-method", "percentile")
    assert out.returncode == 0, out.stderr
    assert "(percentile ranges" in out.stderr and "quantize" in out.stdout


def test_a_missing_or_empty_calibration_folder_is_bad_input(model, tmp_path):
    path, x, _, _ = model
    out = cli("run", path, "--input", x, "--quantize", tmp_path / "nope")
    assert out.returncode == 2 and "calibration folder" in out.stderr and "does not exist" in out.stderr
    out = cli("run", path, "--input", x, "--quantize", tmp_path)
    assert out.returncode == 2 and "holds no .npy or .npz file" in out.stderr
