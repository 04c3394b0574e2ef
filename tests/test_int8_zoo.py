"""Differential int8 on the zoo's ConvNeXt-T (issue 35, items 1 and 3): ours vs ONNX Runtime on one QDQ file.

The file is made as a user makes it: the small config (``bench/zoo_models.py``) exported by torch's default
exporter, ``quant_pre_process``, then ``quantize_static`` (QDQ, per-channel s8 weights, u8 activations, 8
random calibration inputs). Ours (``bh.from_onnx`` -> ``bh.partition`` -> llvm build) must be within 1.25x
of ONNX Runtime's error against the float32 torch output, and within ONNX Runtime's own distance of it.
Each oneDNN ISA path this machine can emulate runs in a subprocess (``ONEDNN_MAX_CPU_ISA`` is read when
oneDNN starts): the machine's own and AVX2, each with the int8 fusions as the CPU gets them and with
``BYOC_HETERO_INT8=saturating`` (oneDNN's int8 kernels even below VNNI, the path a VNNI CPU takes). Before
the fix in cpp/kernels/elementwise_chain.cc ours was 1.7 off ONNX Runtime on the int8-kernel path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from zoo_models import build  # noqa: E402

_OURS = """
import json, os, sys
import numpy as np
import tvm
from tvm import relax
import byoc_hetero as bh
from byoc_hetero._native import _C
path, x = sys.argv[1], np.load(sys.argv[2])
out = {"isa": _C.isa()}
for mode in ("", "saturating"):
    os.environ["BYOC_HETERO_INT8"] = mode
    mod, params = bh.from_onnx(path)
    part = bh.partition(mod, params)
    vm = relax.VirtualMachine(relax.build(part, target="llvm"), tvm.cpu())
    out[mode or "default"] = vm["main"](tvm.runtime.tensor(x)).numpy().tolist()
    out[(mode or "default") + "_precision"] = bh.report(part).regions[0].precision
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def convnext_qdq(tmp_path_factory):
    """(QDQ file, input .npy, torch's float32 output, ONNX Runtime's output on the QDQ file)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    work = tmp_path_factory.mktemp("int8_zoo")
    zm = build("convnext_tiny", small=True)
    x = zm.inputs[0].numpy()
    with torch.no_grad():
        want = zm.module(*zm.inputs).numpy()
    f32, pre, qdq = (str(work / f) for f in ("f32.onnx", "pre.onnx", "qdq.onnx"))
    torch.onnx.export(build("convnext_tiny", small=True).module, zm.inputs, f32, input_names=["pixel_values"],
                      output_names=["y"])
    quant_pre_process(f32, pre)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([{"pixel_values": np.random.default_rng(100 + i).standard_normal(x.shape)
                                  .astype(np.float32)} for i in range(8)])

        def get_next(self):
            return next(self.samples, None)

    quantize_static(pre, qdq, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    np.save(work / "x.npy", x)
    theirs = ort.InferenceSession(qdq, providers=["CPUExecutionProvider"]).run(None, {"pixel_values": x})[0]
    return qdq, str(work / "x.npy"), want, theirs


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / np.abs(b).max())


@pytest.mark.parametrize("isa", ["", "AVX2"])
def test_convnext_int8_matches_onnxruntime_on_every_isa_path(convnext_qdq, isa):
    path, x, want, theirs = convnext_qdq
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    proc = subprocess.run([sys.executable, "-c", _OURS, path, x], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if isa and result["isa"] != isa.lower():
        pytest.skip(f"oneDNN runs {result['isa']} under ONEDNN_MAX_CPU_ISA={isa}")
    assert result["saturating_precision"].startswith("int8"), result["saturating_precision"]  # the int8 path ran
    theirs_err = _relative(theirs, want)
    for mode in ("default", "saturating"):
        ours = np.asarray(result[mode], np.float32)
        assert ours.shape == want.shape
        ours_err, apart = _relative(ours, want), _relative(ours, theirs)
        assert ours_err <= 1.25 * theirs_err, (result["isa"], mode, ours_err, theirs_err)
        assert apart <= theirs_err, (result["isa"], mode, apart, theirs_err)
