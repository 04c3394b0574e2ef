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
from int8 import apart_bound, int8_nodes, ort_int8_exact, output_step, reference  # noqa: E402  (bench/int8.py)
from zoo_models import build  # noqa: E402
from conftest import isa_cap_skip_reason, isa_under  # noqa: E402
from byoc_hetero._native import _C  # noqa: E402
from byoc_hetero.backends.onednn.precision import VNNI_ISAS  # noqa: E402

_OURS = """
import json, os, sys
import numpy as np
import tvm
from tvm import relax
import byoc_hetero as bh
from byoc_hetero._native import _C
from byoc_hetero.backends.onednn.precision import VNNI_ISAS
path, x = sys.argv[1], np.load(sys.argv[2])
out = {"isa": _C.isa()}
for mode in ("",) if _C.isa() in VNNI_ISAS else ("", "saturating"):  # saturating is the default on VNNI
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


def _int8_paths(isa: str) -> tuple[str, ...]:
    """The int8 paths compared on oneDNN ISA ``isa``: ``default`` (the int8 fusions as the ISA gets them) and
    ``saturating`` (``BYOC_HETERO_INT8=saturating``: oneDNN's int8 kernels even below VNNI); on a VNNI ISA
    ``default`` alone, which is the saturating path there (``precision.int8_kernels_reason``)."""
    return ("default",) if isa in VNNI_ISAS else ("default", "saturating")


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
    modes = _int8_paths(result["isa"])
    assert result[modes[-1] + "_precision"].startswith("int8"), result[modes[-1] + "_precision"]  # int8 ran
    row = {"ort_vs_f32": _relative(theirs, want), "out_step": output_step(path, theirs)}
    for mode in modes:
        ours = np.asarray(result[mode], np.float32)
        assert ours.shape == want.shape and np.isfinite(ours).all(), (result["isa"], mode)
        row[mode] = {"vs_f32": _relative(ours, want), "vs_ort": _relative(ours, theirs),
                     "precision": [result[mode + "_precision"]]}
        ref = reference(row, mode, result["isa"], ort_int8_exact())
        if ref is None:  # oneDNN's saturating kernels, ONNX Runtime exact: nothing to hold them to here
            continue
        _, ref_err, apart = ref
        assert row[mode]["vs_f32"] <= 1.25 * ref_err, (result["isa"], mode, row)
        assert apart <= apart_bound(row, ref_err), (result["isa"], mode, row)


# -- every family of the zoo, static and dynamic quantization, per ISA path (issue 35, item 3) --------------
#: one small config per family whose construction differs (bench/zoo_models.py): CNNs, transformers
#: (encoder, vision, audio, decoder), segmentation; DenseNet / DeepLabV3 need torchvision
STATIC_FAMILIES = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "densenet121", "vit_b_16",
                   "bert_base", "gpt2", "whisper_tiny_encoder", "wav2vec2_base", "deeplabv3_mobilenet_v3")
#: quantize_dynamic quantizes MatMul / Gemm (MatMulInteger) and Conv (ConvInteger: Whisper's and wav2vec2's
#: front ends, imported by passes/conv_integer_qdq.py): the transformers
DYNAMIC_FAMILIES = ("bert_base", "vit_b_16", "gpt2", "whisper_tiny_encoder", "wav2vec2_base")
#: the oneDNN ISA caps: "" is the machine's own; the VNNI ones (Zen 4 / Ice Lake class) only where the CPU has them;
#: AVX512_CORE (a Skylake-SP's path, the development machine's) only where it is not the machine's own
ISA_CAPS = ("", "AVX2", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX2_VNNI")


@pytest.fixture(scope="module")
def zoo_files(request, tmp_path_factory):
    """The quantized files of the families this session selected (``-k`` picks some; bench/int8.py's
    ``prepare``: the TorchScript exporter (torch's default one where it cannot export, GPT-2),
    ``quant_pre_process``, ``quantize_static`` QDQ per-channel or ``quantize_dynamic``) in one folder;
    a family whose model cannot be built here (torchvision missing) is left out, with the reason."""
    import int8 as bench_int8

    selected = {item.callspec.params["model"] for item in request.session.items  # a cap skipped here needs none
                if getattr(item, "originalname", "") == "test_zoo_int8_matches_the_reference_on_every_isa_path"
                and isa_cap_skip_reason(item.callspec.params["isa"], ISA_CAPS) is None}
    work, skipped, models = str(tmp_path_factory.mktemp("int8_zoo_all")), {}, []
    for model in STATIC_FAMILIES + tuple(m + "_dynamic" for m in DYNAMIC_FAMILIES):
        base = model.removesuffix("_dynamic")
        if model not in selected or base in skipped:
            continue
        try:
            bench_int8.prepare(model, True, work, pre_process=True)
            models.append(model)
        except ModuleNotFoundError as e:
            skipped[base] = str(e)
    return work, skipped, models


_RESULTS: dict[str, dict] = {}


def _differential(zoo_files, isa: str) -> dict:
    """bench/int8.py's differential mode over every prepared file, in one subprocess per ISA cap, on the
    cap's int8 paths (:func:`_int8_paths`). The llvm-only reference is built only where the test reads it
    (the dynamically quantized files below VNNI: ``--llvm-reference``), by the first cap's process, and read
    by the others (``--share-llvm-reference``: no oneDNN kernel, the same under every cap)."""
    if isa not in _RESULTS:
        work, _, models = zoo_files
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        env.pop("ONEDNN_MAX_CPU_ISA", None)
        env.pop("BYOC_HETERO_INT8", None)
        if isa:
            env["ONEDNN_MAX_CPU_ISA"] = isa
        bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "int8.py")
        proc = subprocess.run([sys.executable, bench, "--workdir", work, "--worker", "differential",
                               ",".join(models), ",".join(_int8_paths(isa_under(isa) if isa else _C.isa())),
                               "--share-llvm-reference", "--llvm-reference", "none" if ort_int8_exact() else "dynamic"],
                              env=env, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]
        _RESULTS[isa] = json.loads(proc.stdout.strip().splitlines()[-1])
    return _RESULTS[isa]


#: what the suite runs by default (each family costs about a minute per ISA cap on two cores, five caps on a
#: VNNI CPU): the CNN whose int8 was wrong (ConvNeXt-T), a depthwise / hard-swish CNN, a dynamically quantized
#: transformer; ``BYOC_HETERO_INT8_ZOO=all`` runs every family above (bench/int8.py --differential: full sizes)
SUITE_FAMILIES = ("convnext_tiny", "mobilenet_v3_large", "bert_base_dynamic")
TESTED = (STATIC_FAMILIES + tuple(m + "_dynamic" for m in DYNAMIC_FAMILIES)
          if os.environ.get("BYOC_HETERO_INT8_ZOO") == "all" else SUITE_FAMILIES)


@pytest.mark.parametrize("isa", ISA_CAPS)
@pytest.mark.parametrize("model", TESTED)
def test_zoo_int8_matches_the_reference_on_every_isa_path(zoo_files, model, isa):
    """Ours (``bh.from_onnx`` -> ``bh.partition`` -> llvm build) on the file ONNX Runtime quantized,
    each int8 path (``default``: the int8 fusions as this ISA gets them; ``saturating``: oneDNN's int8
    kernels anyway, what a VNNI CPU runs; on a VNNI ISA the two are one path, run once): its error against
    the float32 model within 1.25x the reference's, and its distance to the reference within the
    reference's own error. A cap whose int8 kernels another run covers is skipped
    (``conftest.isa_cap_skip_reason``: AVX512_CORE_BF16 where AVX512_CORE_VNNI runs).

    Which reference, and how far ours may be from it: ``bench/int8.py``'s :func:`reference` and
    :func:`apart_bound`, the rule its differential table applies too. In short: ONNX Runtime on the same file
    where its int8 is exact (a VNNI CPU) or where both saturate (below VNNI); the exact float emulation of the
    Q/DQ steps (ONNX Runtime unfused, or the llvm-only build of a dynamically quantized file) where ours is exact
    and ONNX Runtime saturates; ours within the reference's own error of it, or one output quantization step
    where the reference is closer to float32 than that (an int8 node rounds once where the emulation rounds
    twice). Where ours runs oneDNN's saturating kernels (an ISA cap below VNNI, ``saturating``) and ONNX Runtime
    is exact (a VNNI CPU) nothing computes what ours does: the path must run int8 and give finite numbers, and
    test_fuzz.py's capped int8 step checks those kernels exactly (session 14, Zen 5: small ConvNeXt-T
    saturating 0.26 from float32 against ONNX Runtime's exact 0.04, as on a Skylake-SP against ONNX Runtime's
    saturating 0.23)."""
    if model.removesuffix("_dynamic") in zoo_files[1]:
        pytest.skip(f"{model}: {zoo_files[1][model.removesuffix('_dynamic')]}")
    if isa_cap_skip_reason(isa, ISA_CAPS):
        pytest.skip(isa_cap_skip_reason(isa, ISA_CAPS))
    result = _differential(zoo_files, isa)
    row = result[model]
    assert "failed" not in row, row
    for mode in _int8_paths(result["isa"]):
        ours = row[mode]
        assert np.isfinite(ours["vs_f32"]), (result["isa"], mode, row)
        ref = reference(row, mode, result["isa"], ort_int8_exact())  # bench/int8.py: which reference, and why
        if ref is None:  # oneDNN's saturating kernels, ONNX Runtime exact: nothing to hold them to here
            assert int8_nodes(ours["precision"]), (result["isa"], mode, row)
            continue
        _, ref_err, apart = ref
        assert ours["vs_f32"] <= 1.25 * ref_err, (result["isa"], mode, ours, row)
        assert apart <= apart_bound(row, ref_err), (result["isa"], mode, ours, row)


def test_reference_rule_per_cpu_and_path(tmp_path):
    """bench/int8.py's reference rule on made-up rows: ONNX Runtime where both sides compute alike, the exact
    float emulation where only ours is exact, none for oneDNN's saturating kernels beside an exact ONNX
    Runtime; one output step allowed where the reference is closer to float32 than that."""
    import onnx
    from onnx import TensorProto, helper

    int8 = {"precision": ["int8 (3 of 3 conv2d/dense/matmul int8)"], "vs_ort": 0.2, "vs_ort_float": 0.3}
    f32 = {"precision": ["mixed (0 of 3 conv2d/dense/matmul int8)"], "vs_ort": 0.2, "vs_ort_float": 0.3}
    row = {"ort_vs_f32": 0.02, "ort_float_vs_f32": 0.03, "default": f32, "saturating": int8}
    assert reference(row, "saturating", "avx2", ort_exact=True) is None
    assert reference(row, "saturating", "avx2", ort_exact=False) == ("ORT", 0.02, 0.2)
    assert reference(row, "saturating", "avx2_vnni", ort_exact=True) == ("ORT", 0.02, 0.2)
    assert reference(row, "default", "avx2", ort_exact=False) == ("ORT unfused", 0.03, 0.3)
    assert reference(row, "default", "avx2", ort_exact=True) == ("ORT", 0.02, 0.2)
    assert reference(dict(row, llvm_vs_f32=0.04, default=dict(f32, vs_llvm=0.4)), "default", "avx2",
                     ort_exact=False) == ("llvm-only", 0.04, 0.4)
    assert apart_bound(row, 0.02) == 0.02 and apart_bound(dict(row, out_step=0.05), 0.02) > 0.05

    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
        "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [0.5]), helper.make_tensor("z", TensorProto.UINT8, [], [0])])
    onnx.save(helper.make_model(graph), tmp_path / "qdq.onnx")
    assert output_step(str(tmp_path / "qdq.onnx"), np.array([2.0, -4.0])) == 0.125
