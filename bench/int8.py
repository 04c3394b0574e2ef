"""int8 benchmark: QDQ models (ONNX Runtime's ``quantize_static``) on byoc-hetero, ONNX Runtime and OpenVINO.

For each model of ``bench/zoo_models.py`` chosen with ``--models`` (ResNet-50, MobileNetV3-L,
EfficientNet-B0, ViT-B/16, BERT-base; ``--small`` for the scaled-down versions), a *prepare* process
exports the float32 model with ``torch.onnx.export`` and quantizes it with
``onnxruntime.quantization.quantize_static`` (QDQ format, per-channel s8 weights, u8 activations, 8
seeded calibration inputs); BERT also with ``quantize_dynamic`` (``bert_base_dynamic``). Then one
*time* process per model and thread count (1, 2) loads the same quantized file in the three engines,
times them interleaved (round-robin rounds, medians), and measures each one's error against the float32
model (ONNX Runtime on the float32 file): ``max |y - y_f32| / max |y_f32|``. Our column also gives the
number of regions and whether the compile failed (with its reason). The machine (``lscpu`` model name),
oneDNN's version and ISA are printed with the table.

    python3 bench/int8.py --small --models resnet50,mobilenet_v3_large
    python3 bench/int8.py                      # every model, full size (slow to quantize and compile)
    python3 bench/int8.py --differential ,AVX2 --pre-process --models convnext_tiny,bert_base_dynamic
    python3 bench/int8.py --differential "" --pre-process --small --default-exporter --models gpt2,wav2vec2_base_dynamic
    python3 bench/int8.py --differential ,AVX512_CORE_VNNI,AVX2_VNNI --llvm-reference none --pre-process \\
        --models resnet50

``--differential [ISAS]`` times nothing: per model, oneDNN ISA cap (``ONEDNN_MAX_CPU_ISA``, one process
each) and int8 path (the fusions as that ISA gets them; ``BYOC_HETERO_INT8=saturating``) it prints ONNX
Runtime's and ours' error against the float32 model, ours against ONNX Runtime, and the llvm-only
build of our import of the same file (the reference where ONNX Runtime's int8 is not exact: below VNNI
its u8 x s8 kernels saturate; ``--llvm-reference none`` skips that slow build where ONNX Runtime is exact, a
VNNI CPU), and whether ours is within the bounds tests/test_int8_zoo.py holds the small configs to. On a VNNI
ISA the saturating path is the default one and runs once.

``--pre-process`` first runs ``onnxruntime.quantization.shape_inference.quant_pre_process`` on the
float32 file (what ONNX Runtime's quantization guide asks for, and what ``quantize_static`` warns
about without it: shape inference and ONNX Runtime's graph optimizations, which fold Constant nodes
into initializers). Without it, OpenVINO 2026.4 fails to compile the QDQ transformers:
``[MultiplyPartialTransformation] ... Check 'index < m_inputs.size()' failed`` on the attention
scores' Mul by a quantized scalar Constant (bench/INT8.md, session 3). The pre-processed files live
in ``<workdir>/pre``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODELS = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "vit_b_16", "bert_base", "bert_base_dynamic")
ENGINES = ("ours", "ort", "openvino")


def _files(workdir: str, model: str) -> dict[str, str]:
    base = os.path.join(workdir, model)
    return {"f32": base + ".f32.onnx", "q": base + ".qdq.onnx", "inputs": base + ".inputs.npz"}


def prepare(model: str, small: bool, workdir: str, pre_process: bool = False, default_exporter: bool = False) -> dict:
    """Export the float32 model and quantize it (static QDQ, or dynamic for ``*_dynamic``), from
    the ``quant_pre_process``-ed float32 file with ``pre_process``. The export is TorchScript's
    (``dynamo=False``) unless ``default_exporter`` asks for torch's default one (``torch.export``
    based), the one a user who passes no option gets."""
    sys.path.insert(0, HERE)
    import torch
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)
    from zoo_models import build

    base = model.removesuffix("_dynamic")
    f, fb = _files(workdir, model), _files(workdir, base)
    zm = build(base, small)
    if not os.path.exists(fb["f32"]) and default_exporter:
        torch.onnx.export(zm.module, zm.inputs, fb["f32"], input_names=list(zm.input_names), output_names=["y"])
    elif not os.path.exists(fb["f32"]):
        try:
            torch.onnx.export(zm.module, zm.inputs, fb["f32"], input_names=list(zm.input_names), output_names=["y"],
                              opset_version=17, dynamo=False)
        except torch.onnx.errors.UnsupportedOperatorError:  # GPT-2's aten::diff: torch's default exporter
            torch.onnx.export(zm.module, zm.inputs, fb["f32"], input_names=list(zm.input_names), output_names=["y"])
    np.savez(f["inputs"], **{n: t.numpy() for n, t in zip(zm.input_names, zm.inputs)})
    if os.path.exists(f["q"]):
        return {"quantized": "reused " + f["q"]}
    source = fb["f32"]
    if pre_process:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        source = os.path.join(workdir, base + ".pre.onnx")
        if not os.path.exists(source):
            quant_pre_process(fb["f32"], source)
    if model.endswith("_dynamic"):
        quantize_dynamic(source, f["q"], weight_type=QuantType.QInt8)
        return {"quantized": "dynamic"}

    def sample(i: int) -> dict:
        rng = np.random.default_rng(100 + i)
        out = {}
        for name, t in zip(zm.input_names, zm.inputs):
            if t.dtype.is_floating_point:
                out[name] = rng.standard_normal(tuple(t.shape)).astype(np.float32)
            else:  # token ids / masks: the example's own values
                out[name] = t.numpy()
        return out

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.samples = iter([sample(i) for i in range(8)])

        def get_next(self):
            return next(self.samples, None)

    quantize_static(source, f["q"], Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return {"quantized": "static"}


def _engine(name: str, path: str, feed: dict, threads: int):
    """A zero-argument callable running one inference, its output reader and extra facts."""
    if name == "ours":
        import tvm
        from tvm import relax

        import byoc_hetero as bh

        mod, params = bh.from_onnx(path)
        m = bh.partition(mod, params)
        regions = len(m.attrs["external_mods"]) if m.attrs and "external_mods" in m.attrs else 0
        vm = relax.VirtualMachine(relax.build(m, target="llvm"), tvm.cpu())
        args = [tvm.runtime.tensor(feed[p.name]) for p in mod["main"].params if p.name in feed]
        rep = bh.report(m)
        facts = {"regions": regions, "llvm_ops": len(rep.fallbacks)}
        return (lambda: vm["main"](*args)), (lambda out: (out if hasattr(out, "numpy") else out[0]).numpy()), facts
    if name == "ort":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        return (lambda: sess.run(None, feed)), (lambda out: out[0]), {}
    import openvino as ov

    config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": str(threads)}
    request = ov.Core().compile_model(path, "CPU", config).create_infer_request()
    return (lambda: request.infer(feed)), (lambda _: np.array(request.get_output_tensor(0).data)), {}


def serve(engine: str, model: str, threads: int, workdir: str) -> None:
    """One engine in its own process (so that no other engine's threads spin on the cores while it
    is timed): prints its error against the float32 model, then times one round per "time <s>" line
    read from stdin, printing the round's median."""
    import onnxruntime as ort

    f, fb = _files(workdir, model), _files(workdir, model.removesuffix("_dynamic"))
    data = np.load(f["inputs"])
    feed = {k: data[k] for k in data.files}
    ref = ort.InferenceSession(fb["f32"], providers=["CPUExecutionProvider"]).run(None, feed)[0]
    try:
        call, read, facts = _engine(engine, f["q"], feed, threads)
        out = read(call())
        err = float(np.max(np.abs(out.astype(np.float64) - ref))) / (float(np.max(np.abs(ref))) or 1.0)
        print(json.dumps({"error": err, **facts}), flush=True)
    except Exception as e:  # noqa: BLE001 - an engine that cannot run the file is reported
        # the whole message (OpenVINO's first lines only name the files of its call stack)
        message = " ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())
        print(json.dumps({"failed": f"{type(e).__name__}: {message[-400:]}"}), flush=True)
        return
    for line in sys.stdin:
        if not line.startswith("time"):
            return
        t_end, times = time.perf_counter() + float(line.split()[1]), []
        while time.perf_counter() < t_end or len(times) < 3:
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        print(json.dumps({"median_s": float(np.median(times))}), flush=True)


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    """``max |a - b| / max |b|`` in float64 (the distance every row of the differential mode prints)."""
    return float(np.max(np.abs(a.astype(np.float64) - b)) / (float(np.max(np.abs(b))) or 1.0))


def _llvm_reference(mod, params, args, run, cache: str | None) -> np.ndarray:
    """The llvm-only build's output on ``args``. With ``cache`` (a .npy path): read from it when there,
    else computed and written to it, so that the processes of the other ISA caps skip that build (it runs
    no oneDNN kernel: ``ONEDNN_MAX_CPU_ISA`` cannot change it). Only for one workdir of one checkout."""
    if cache and os.path.exists(cache):
        return np.load(cache)
    import byoc_hetero as bh

    out = run(bh.bind_params(mod, params), args)
    if cache:
        np.save(cache, out)
    return out


def _ort_output(path: str, feed: dict, optimized: bool = True) -> np.ndarray:
    """ONNX Runtime's CPU output on ``feed``; ``optimized=False``: with its graph optimizations off
    (``ORT_DISABLE_ALL``), so that each QuantizeLinear / DequantizeLinear node runs on its own and the ops
    between them in float32 (no fusion into its int8 kernels)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]).run(None, feed)[0]


LLVM_REFERENCE = ("all", "dynamic", "none")
"""Which files the differential mode builds llvm-only (``--llvm-reference``): every file (the table), the
dynamically quantized ones (the suite below VNNI), none (the suite on a VNNI CPU, where ONNX Runtime is exact)."""


def differential(models: list[str], workdir: str, modes: tuple[str, ...] = ("", "saturating"),
                 share_llvm: bool = False, llvm_for: str = "all") -> dict:
    """Ours against ONNX Runtime on each prepared quantized file, under this process's oneDNN ISA
    (``ONEDNN_MAX_CPU_ISA`` is read once, when oneDNN starts: one process per cap).

    Per model: ``ort_vs_f32`` (ONNX Runtime on the quantized file against the float32 file),
    ``ort_float_vs_f32`` (ONNX Runtime with its graph optimizations off, :func:`_ort_output`: on a QDQ
    file the float emulation of its Q/DQ steps, exact on every CPU; a dynamic file's MatMulInteger /
    ConvInteger still run its int8 kernels, which saturate below VNNI), ``llvm_vs_f32`` (the llvm-only
    build of our import of the quantized file: TVM's float emulation of the Q/DQ steps, exact on every CPU;
    for the files ``llvm_for`` names, :data:`LLVM_REFERENCE`), and per int8 mode (``default``: the int8 fusions
    as this ISA gets them; ``saturating``: ``BYOC_HETERO_INT8=saturating``, oneDNN's int8 kernels even below
    VNNI, the path a VNNI CPU takes) ours against float32, against both ONNX Runtime outputs and against
    the llvm-only build, with the regions' precision. A compile or run that raises is a row's ``failed``.
    ``share_llvm``: the llvm-only output is kept in ``workdir`` for the next process (:func:`_llvm_reference`).
    """
    import tvm
    from tvm import relax

    import byoc_hetero as bh
    from byoc_hetero._native import _C
    from byoc_hetero.backends.onednn.precision import VNNI_ISAS

    if llvm_for not in LLVM_REFERENCE:
        raise ValueError(f"llvm_for must be one of {LLVM_REFERENCE}, got {llvm_for!r}")

    def run(module, feed_args):
        vm = relax.VirtualMachine(relax.build(module, target="llvm"), tvm.cpu())
        out = vm["main"](*feed_args)
        return (out if hasattr(out, "numpy") else out[0]).numpy()

    result = {"isa": _C.isa()}
    for model in models:
        f, fb = _files(workdir, model), _files(workdir, model.removesuffix("_dynamic"))
        data = np.load(f["inputs"])
        feed = {k: data[k] for k in data.files}
        want, theirs = _ort_output(fb["f32"], feed), _ort_output(f["q"], feed)
        emulated = _ort_output(f["q"], feed, optimized=False)
        row = {"ort_vs_f32": _relative(theirs, want), "ort_float_vs_f32": _relative(emulated, want),
               "out_step": output_step(f["q"], theirs)}
        try:
            mod, params = bh.from_onnx(f["q"])
            args = [tvm.runtime.tensor(feed[p.name]) for p in mod["main"].params if p.name in feed]
            llvm = None
            if llvm_for == "all" or (llvm_for == "dynamic" and model.endswith("_dynamic")):
                llvm = _llvm_reference(mod, params, args, run, f["q"] + ".llvm.npy" if share_llvm else None)
                row["llvm_vs_f32"], row["llvm_vs_ort"] = _relative(llvm, want), _relative(llvm, theirs)
            for mode in modes:
                if mode == "saturating" and "" in modes and _C.isa() in VNNI_ISAS:
                    continue  # on a VNNI ISA the default path is the saturating one (precision.int8_kernels_reason)
                os.environ["BYOC_HETERO_INT8"] = mode
                part = bh.partition(mod, params)
                ours = run(part, args)
                regions = bh.report(part).regions
                row[mode or "default"] = {"vs_f32": _relative(ours, want), "vs_ort": _relative(ours, theirs),
                                          "vs_ort_float": _relative(ours, emulated), "regions": len(regions),
                                          "precision": sorted({r.precision for r in regions})}
                if llvm is not None:
                    row[mode or "default"]["vs_llvm"] = _relative(ours, llvm)
        except Exception as e:  # noqa: BLE001 - a file we cannot compile is the row's finding
            row["failed"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        finally:
            os.environ.pop("BYOC_HETERO_INT8", None)
        result[model] = row
        print(json.dumps({"model": model, **row}), flush=True)  # each row as it comes (a slow loaded machine)
    return result


def time_model(model: str, threads: int, workdir: str, rounds: int, min_time: float) -> dict:
    """Latency and error of every engine on the quantized file: one process per engine, timed in
    turn (round-robin rounds; the median of the rounds' medians)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), BYOC_HETERO_NUM_THREADS=str(threads),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs, result = {}, {"model": model, "threads": threads}
    for engine in ENGINES:
        proc = subprocess.Popen([sys.executable, __file__, "--workdir", workdir, "--worker", "serve", model,
                                 f"{engine}:{threads}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=env)
        line = next((ln for ln in proc.stdout if ln.startswith("{")), '{"failed": "no output"}')
        result[engine] = json.loads(line)
        if "failed" in result[engine]:
            proc.kill()
        else:
            procs[engine] = proc
            result[engine]["rounds"] = []
    for _ in range(rounds):
        for engine, proc in procs.items():
            proc.stdin.write(f"time {min_time}\n")
            proc.stdin.flush()
            line = next(ln for ln in proc.stdout if ln.startswith("{"))
            result[engine]["rounds"].append(json.loads(line)["median_s"])
    for engine, proc in procs.items():
        proc.stdin.close()
        proc.wait()
        result[engine]["median_ms"] = 1e3 * float(np.median(result[engine].pop("rounds")))
    return result


def machine() -> str:
    model = "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), model)
    except OSError:
        pass
    sys.path.insert(0, ROOT)
    from byoc_hetero._native import _C

    return f"{model}, {os.cpu_count()} CPUs; oneDNN {_C.onednn_version()} ISA {_C.isa()}"


def _spawn(argv: list[str], threads: int, timeout: float, extra_env: dict | None = None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), BYOC_HETERO_NUM_THREADS=str(threads),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(extra_env or {}))
    proc = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, env=env, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"failed": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
    return json.loads(lines[-1])


def reference(row: dict, mode: str, isa: str, ort_exact: bool) -> tuple[str, float, float] | None:
    """The reference a differential row's int8 path ``mode`` is held to, under oneDNN ISA ``isa``:
    ``(name, its error against float32, ours' distance to it)``, or None where no reference computes what
    that path computes. The bounds (tests/test_int8_zoo.py, the table's last column): ours' error against
    float32 at most 1.25x the reference's, ours' distance to it at most :func:`apart_bound`.

    * exact int8 arithmetic on both sides (ONNX Runtime exact here, a VNNI CPU, and ours on a VNNI ISA or
      computing float32 between the Q/DQ steps), or saturating kernels on both (below VNNI, ONNX Runtime's
      and ours' with ``BYOC_HETERO_INT8=saturating``): ONNX Runtime on the same file;
    * ours exact, ONNX Runtime saturating (below VNNI, default path): the exact float emulation of the Q/DQ
      steps, the llvm-only build for a dynamic file (when it was built), ONNX Runtime unfused for a QDQ one;
    * ours saturating (oneDNN's int8 kernels below VNNI, forced) where ONNX Runtime is exact (an ISA cap
      below VNNI on a VNNI CPU): None. Nothing here saturates as oneDNN's kernels do (small ConvNeXt-T on a
      Zen 5: 0.26 from float32 against ONNX Runtime's exact 0.04, as on a Skylake-SP against its saturating
      ONNX Runtime's 0.23); tests/test_fuzz.py's capped int8 step checks those kernels exactly, on weights
      that cannot saturate."""
    from byoc_hetero.backends.onednn.precision import VNNI_ISAS

    o = row[mode]
    saturating = int8_nodes(o["precision"]) and isa not in VNNI_ISAS
    if saturating and ort_exact:
        return None
    if ort_exact or saturating:
        return "ORT", row["ort_vs_f32"], o["vs_ort"]
    if "llvm_vs_f32" in row:
        return "llvm-only", row["llvm_vs_f32"], o["vs_llvm"]
    return "ORT unfused", row["ort_float_vs_f32"], o["vs_ort_float"]


def apart_bound(row: dict, ref_err: float) -> float:
    """How far ours may be from the reference: the reference's own error against float32, or one quantization
    step of the model's output where that is a dequantized 8-bit tensor (``out_step``), whichever is larger.
    An int8 node rounds once where the float emulation rounds twice (a fused residual skips the rounding of the
    conv's own output, docs/int8.md "Exactness"), so two correct results may differ by a step there; a reference
    closer to float32 than one step cannot tell them apart (small MobileNetV3-L on a Zen 5: ONNX Runtime 6.0e-3
    from float32, ours 5.9e-3 and one output step, 7.1e-3, from ONNX Runtime on 2 of its 10 outputs)."""
    return max(ref_err, 1.001 * row.get("out_step", 0.0))  # 1.001: float32 rounding of the dequantized values


def _within(row: dict, mode: str, isa: str) -> str:
    """The table's verdict on path ``mode`` of a row (:func:`reference`, :func:`apart_bound`)."""
    ref = reference(row, mode, isa, ort_int8_exact())
    if ref is None:
        return "no reference (saturating kernels; ORT exact here)"
    name, ref_err, apart = ref
    ok = row[mode]["vs_f32"] <= 1.25 * ref_err and apart <= apart_bound(row, ref_err)
    return f"{'yes' if ok else '**NO**'} ({name})"


def output_step(path: str, reference_output: np.ndarray) -> float:
    """One quantization step of the model's (first) output relative to ``max |reference_output|``, where the
    output is a ``DequantizeLinear`` of a per-tensor scale (an int8 QDQ model's last Q/DQ pair); else 0."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    producer = next((n for n in model.graph.node if model.graph.output[0].name in n.output), None)
    if producer is None or producer.op_type != "DequantizeLinear":
        return 0.0
    scale = next((onnx.numpy_helper.to_array(i) for i in model.graph.initializer if i.name == producer.input[1]), None)
    if scale is None or scale.size != 1:
        return 0.0
    return float(scale) / (float(np.max(np.abs(reference_output))) or 1.0)


def int8_nodes(precisions: list[str]) -> bool:
    """Whether any region runs int8 conv2d / dense / matmul nodes (``bh.report``'s precision: "int8 (18 of 18
    ...)", "mixed (3 of 18 ...)"; "mixed (0 of ...)" or "f32" where the int8 fusions did not fire)."""
    import re

    return any(int(m.group(1)) > 0 for p in precisions for m in [re.search(r"\((\d+) of \d+", p)] if m)


def ort_int8_exact() -> bool:
    """Whether ONNX Runtime's u8 x s8 kernels are exact on this CPU (VNNI: ``lscpu`` lists avx512_vnni or
    avx_vnni); below VNNI they sum each pair of products in 16 bits and saturate. ONNX Runtime picks its
    kernels from the CPU itself: ``ONEDNN_MAX_CPU_ISA`` does not change them."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.lower()
    return "avx512_vnni" in out or "avx_vnni" in out


def differential_table(models: list[str], small: bool, workdir: str, isas: list[str], pre_process: bool,
                       default_exporter: bool = False, llvm_for: str = "all") -> None:
    """The differential mode's table: per model, ISA cap and int8 path the distances (ONNX Runtime, its
    unfused float emulation of the Q/DQ steps, the llvm-only build of our import where ``llvm_for`` asks for
    it, and ours, against float32; ours against ONNX Runtime) and whether ours is within the bounds
    (:func:`_within`). On a VNNI ISA the saturating path is the default one and runs once. The llvm-only
    output (no oneDNN kernel) is built once per file and shared by the caps' processes."""
    print("| model | ISA | int8 path | ORT vs f32 | ORT unfused vs f32 | llvm-only vs f32 | ours vs f32 | ours vs ORT |"
          " regions, precision | within bounds (reference) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in models:
        size = ("small" if small else "full") + ("+pre" if pre_process else "") + ("+default" if default_exporter else "")
        prep = _spawn(["--workdir", workdir, "--worker", "prepare", model, size], 2, 3600)
        if "failed" in prep:
            print(f"| {model} | - | - | quantization failed: {prep['failed']} |||||||", flush=True)
            continue
        for isa in isas:
            env = {"ONEDNN_MAX_CPU_ISA": isa} if isa else {}
            r = _spawn(["--workdir", workdir, "--worker", "differential", model, "default,saturating",
                        "--share-llvm-reference", "--llvm-reference", llvm_for], 2, 7200, env)
            row = r.get(model, r)
            if "failed" in row:
                print(f"| {model} | {isa or 'own'} | - | failed: {row['failed'][-200:]} |||||||", flush=True)
                continue
            llvm = f"{row['llvm_vs_f32']:.2e}" if "llvm_vs_f32" in row else "-"
            for mode in ("default", "saturating"):
                if mode not in row:
                    continue
                o = row[mode]
                print(f"| {model} | {r['isa']} | {mode} | {row['ort_vs_f32']:.2e} | {row['ort_float_vs_f32']:.2e} | "
                      f"{llvm} | {o['vs_f32']:.2e} | {o['vs_ort']:.2e} | {o['regions']}, "
                      f"{'; '.join(o['precision'])} | {_within(row, mode, r['isa'])} |", flush=True)


def _cell(r: dict) -> str:
    if "failed" in r:
        return "failed: " + r["failed"][-160:]
    extra = f", {r['regions']} regions" if "regions" in r else ""
    return f"{r['median_ms']:.2f} ms (err {r['error']:.1e}{extra})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--small", action="store_true", help="the scaled-down models of zoo_models.py")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-time", type=float, default=0.5, help="seconds per engine per round")
    p.add_argument("--workdir", default=None)
    p.add_argument("--pre-process", action="store_true",
                   help="quant_pre_process the float32 file before quantizing (files in <workdir>/pre)")
    p.add_argument("--default-exporter", action="store_true",
                   help="export with torch's default (torch.export-based) exporter, not TorchScript's")
    p.add_argument("--differential", nargs="?", const=",AVX2", default=None, metavar="ISAS",
                   help="print ours / ONNX Runtime / float32 / llvm-only distances instead of timing, per oneDNN "
                        "ISA cap (comma-separated ONEDNN_MAX_CPU_ISA values, empty: the CPU's own; default ',AVX2')")
    p.add_argument("--worker", nargs=3, metavar=("KIND", "MODEL", "ARG"), help=argparse.SUPPRESS)
    p.add_argument("--share-llvm-reference", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--llvm-reference", choices=LLVM_REFERENCE, default="all",
                   help="with --differential: which quantized files also get the llvm-only build of our import as a "
                        "reference (slow at full size; 'none' where ONNX Runtime's int8 is exact, a VNNI CPU)")
    args = p.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="bh-int8-")
    if args.pre_process and not args.worker:
        workdir = os.path.join(workdir, "pre")
    os.makedirs(workdir, exist_ok=True)
    if args.worker:
        kind, model, arg = args.worker
        if kind == "differential":
            modes = tuple("" if m == "default" else m for m in arg.split(","))
            print(json.dumps(differential(model.split(","), workdir, modes, args.share_llvm_reference,
                                          args.llvm_reference)))
            return 0
        if kind == "serve":
            engine, threads = arg.split(":")
            serve(engine, model, int(threads), workdir)
            return 0
        print(json.dumps(prepare(model, arg.startswith("small"), workdir, "+pre" in arg, "+default" in arg)))
        return 0
    print(f"machine: {machine()}; {'small' if args.small else 'full-size'} models"
          f"{', quant_pre_process-ed' if args.pre_process else ''}; workdir {workdir}")
    if args.differential is not None:
        differential_table(args.models.split(","), args.small, workdir, args.differential.split(","),
                           args.pre_process, args.default_exporter, args.llvm_reference)
        return 0
    print("| model | threads | byoc-hetero | ONNX Runtime | OpenVINO |")
    print("|---|---|---|---|---|")
    for model in args.models.split(","):
        size = (("small" if args.small else "full") + ("+pre" if args.pre_process else "")
                + ("+default" if args.default_exporter else ""))
        prep = _spawn(["--workdir", workdir, "--worker", "prepare", model, size], 2, 3600)
        if "failed" in prep:
            print(f"| {model} | - | quantization failed: {prep['failed']} | | |", flush=True)
            continue
        for threads in [int(t) for t in args.threads.split(",")]:
            r = time_model(model, threads, workdir, args.rounds, args.min_time)
            print(f"| {model} | {threads} | " + " | ".join(_cell(r[e]) for e in ENGINES) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
