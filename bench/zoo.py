"""Zoo benchmark: byoc-hetero on eight real architectures, every import path, vs ONNX Runtime, OpenVINO, torch.

    python bench/zoo.py --markdown bench/ZOO.md                 # everything (hours on 2 busy cores)
    python bench/zoo.py --small --rounds 1 --threads 2          # scaled-down configs: a smoke run
    python bench/zoo.py --models resnet50,bert_base --threads 2 --frameworks byoc_torch,ort,torch
    python bench/zoo.py --keep /tmp/z --phase build ...; python bench/zoo.py --keep /tmp/z --phase time ...
                                                                # compile while busy, time when quiet
    python bench/zoo.py --models issue39 ...                    # issue 39's families (zoo_models.ISSUE39_MODELS)

Needs ``pip install ".[zoo]"`` (transformers, openvino, onnx, onnxruntime, torch 2.13.0). Not part of the
tests: it asserts nothing, it reports.

Models (``bench/zoo_models.py``, seeded random weights, batch 1, float32): ResNet-50, MobileNetV3-Large,
EfficientNet-B0, ConvNeXt-T, ViT-B/16 (224x224 images), BERT-base (sequence 128, int64 ``input_ids``
and ``attention_mask``), GPT-2 and a Llama-family decoder with SmolLM-135M's sizes (sequence 128,
``input_ids``; ``bench/llm.py`` runs the decoder with a dynamic sequence). Per model:

1. a *prepare* process builds the model, runs it in torch eager (the reference output) and exports it twice
   with ``torch.onnx.export``, each time from a fresh copy of the model (tracing can change a module): the
   TorchScript exporter (opset 17) and the default one (torch 2.13: dynamo, opset 20, needs ``onnxscript``);
   ONNX Runtime and OpenVINO run the TorchScript file, or the default
   exporter's where TorchScript's fails (GPT-2, the Llama decoder); with ``--baseline dynamo`` the default
   exporter's file, the one ``byoc_onnx_dynamo`` builds from;
2. a *compile* process per import path — ``bh.from_torch`` (torch.export) and ``bh.from_onnx`` (each exported
   file) — partitions (``bh.partition``), reports (``bh.report``: regions; every op left on llvm with its
   reason), builds for llvm, checks the output against torch's and exports the library;
3. timing: each framework in its own process with ``OMP_NUM_THREADS`` / ``TVM_NUM_THREADS`` /
   ``BYOC_HETERO_NUM_THREADS`` / ``MKL_NUM_THREADS`` set to the thread count, in ``--rounds`` interleaved
   rounds (every framework once per round); the table gives the median over the rounds of each
   process's median call latency. Frameworks: ``byoc_torch`` / ``byoc_onnx`` / ``byoc_onnx_dynamo`` (the
   exported library of each path, loaded in a Relax VM), ``ort`` (CPU execution provider, all graph optimizations,
   ``intra_op_num_threads``), ``openvino`` (CPU, ``INFERENCE_PRECISION_HINT=f32``, latency hint, one
   stream, ``INFERENCE_NUM_THREADS``), ``openvino_default`` (the same without the precision hint: bf16 on
   CPUs with avx512_bf16 — reported beside, not comparable in accuracy), ``torch`` (eager,
   ``torch.set_num_threads``, inference mode), all on the ONNX file or the same module.

Failures (import, partition, build, a wrong output shape, a timeout) are caught per model and path and
written into the tables with the error's first line; the run always goes to the end. With
``--markdown`` the report is rewritten after every model, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import json
import os
import sys
import tempfile
import time
from collections import Counter

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run import _spawn, _timed, fmt_ms, machine, package_versions, wait_quiet  # noqa: E402
from zoo_models import ISSUE39_MODELS, MODELS, build  # noqa: E402

FRAMEWORKS = ["byoc_torch", "byoc_onnx", "byoc_onnx_dynamo", "ort", "openvino", "openvino_default", "torch"]
LABELS = {"byoc_torch": "ours (from_torch)", "byoc_onnx": "ours (from_onnx)",
          "byoc_onnx_dynamo": "ours (from_onnx, default exporter)", "ort": "ONNX Runtime",
          "openvino": "OpenVINO f32", "openvino_default": "OpenVINO default", "torch": "torch eager"}
PATHS = {"byoc_torch": "from_torch", "byoc_onnx": "from_onnx", "byoc_onnx_dynamo": "from_onnx_dynamo"}
TOLERANCE = 1e-3
BF16_TOLERANCE = 2e-2  # --precision bf16: the bound README "bf16" documents for bf16 vs float32
VERSIONED = ("apache-tvm", "torch", "transformers", "onnx", "onnxruntime", "openvino", "numpy")


def _first_line(err: BaseException | str) -> str:
    text = str(err).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[0] if lines else type(err).__name__)[:300]


def _files(workdir: str, model: str) -> dict[str, str]:
    base = os.path.join(workdir, model)
    return {"inputs": base + "_inputs.npz", "ref": base + "_torch.npy", "onnx": base + ".onnx",
            "onnx_dynamo": base + "_dynamo.onnx",
            "lib": base + "_{path}.so", "out": base + "_{fw}_{threads}.npy"}


# ------------------------------------------------------------------------------------------------
# Workers (each in its own process)


def prepare_worker(model: str, small: bool, workdir: str) -> dict:
    """Torch reference output, inputs and the ONNX export of ``model``."""
    import torch

    f = _files(workdir, model)
    zm = build(model, small)
    with torch.inference_mode():
        ref = zm.module(*zm.inputs).numpy()
    np.savez(f["inputs"], **{n: t.numpy() for n, t in zip(zm.input_names, zm.inputs)})
    np.save(f["ref"], ref)
    info: dict = {"description": zm.description, "inputs": {n: list(t.shape) for n, t in zip(zm.input_names, zm.inputs)},
                  "output_shape": list(ref.shape),
                  "params_m": sum(p.numel() for p in zm.module.parameters()) / 1e6}
    # both exporters: TorchScript's (opset 17) and torch.onnx.export's default (torch 2.13: dynamo, opset 20),
    # each on its own copy of the model: TorchScript's trace can change the module it runs. HF Swin's
    # set_shift_and_window_size stores torch.min(torch.tensor(resolution)) in `window_size` when
    # torch.jit.is_tracing(), so after the TorchScript export the last stage's window size is a 0-d
    # tensor, and torch.export of the same object stops at `min(input_resolution) <= self.window_size`
    # (GuardOnDataDependentSymNode: Eq(u0, 1)); a fresh copy exports (bench/ZOO.md, "session 6, harness")
    pristine = copy.deepcopy(zm.module)
    for key, kwargs in (("onnx", {"opset_version": 17, "dynamo": False}), ("onnx_dynamo", {})):
        t0 = time.perf_counter()
        try:
            torch.onnx.export(copy.deepcopy(pristine), zm.inputs, f[key], input_names=list(zm.input_names),
                              output_names=["y"], **kwargs)
            info[f"{key}_export_s"] = time.perf_counter() - t0
        except Exception as err:  # noqa: BLE001 - any exporter failure is reported, not fatal
            info[f"{key}_error"] = f"torch.onnx.export({'dynamo' if key == 'onnx_dynamo' else 'TorchScript'}): " \
                                   f"{_first_line(err)}"
    return info


def baseline_file(f: dict[str, str], baseline: str = "torchscript") -> str:
    """The ONNX file ONNX Runtime and OpenVINO run: with ``baseline`` "torchscript" TorchScript's, or the
    default exporter's where TorchScript's exporter failed (GPT-2, the Llama decoder: ``aten::diff``);
    with "dynamo" the default exporter's."""
    if baseline == "dynamo":
        return f["onnx_dynamo"]
    return f["onnx"] if os.path.exists(f["onnx"]) else f["onnx_dynamo"]


def compile_worker(model: str, path: str, small: bool, workdir: str, precision: str = "f32") -> dict:
    """Import ``model`` by ``path`` (from_torch / from_onnx), partition (in ``precision``), report, build,
    check, export."""
    import tvm
    from tvm import relax

    import byoc_hetero as bh
    from byoc_hetero.timing import relative_error

    f = _files(workdir, model)
    data = np.load(f["inputs"])
    inputs = [data[k] for k in data.files]
    ref = np.load(f["ref"])
    info: dict = {}
    stage = "import"
    try:
        t0 = time.perf_counter()
        if path == "from_torch":
            zm = build(model, small)
            mod, params = bh.from_torch(zm.module, zm.inputs)
        else:
            mod, params = bh.from_onnx(f["onnx_dynamo" if path == "from_onnx_dynamo" else "onnx"])
        info["import_s"] = time.perf_counter() - t0
        stage = "partition"
        t0 = time.perf_counter()
        part = bh.partition(mod, params, precision=precision)
        info["partition_s"] = time.perf_counter() - t0
        stage = "report"
        rep = bh.report(part)
        info["regions"] = len(rep.regions)
        info["offloaded_mflop"] = rep.offloaded_flops / 1e6
        info["ops_offloaded"] = sum(sum(r.ops.values()) for r in rep.regions)
        groups = Counter((fb.op, fb.reason, fb.rule or "") for fb in rep.fallbacks)
        info["llvm_ops"] = [[op, reason, rule, n] for (op, reason, rule), n in groups.most_common()]
        stage = "build"
        t0 = time.perf_counter()
        ex = relax.build(part, target="llvm")
        info["build_s"] = time.perf_counter() - t0
        ex.export_library(f["lib"].format(path=path))
        stage = "run"
        vm = relax.VirtualMachine(ex, tvm.cpu())
        out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
        out = (out if hasattr(out, "numpy") else out[0]).numpy()
        info["output_shape"] = list(out.shape)
        if out.shape == ref.shape:
            info["max_rel_err"] = relative_error(out, ref)
        elif out.size == ref.size:
            info["max_rel_err"] = relative_error(out.reshape(ref.shape), ref)
    except Exception as err:  # noqa: BLE001 - every failure becomes a table entry
        info["error"] = f"{stage}: {type(err).__name__}: {_first_line(err)}"
    return info


def _adaptation_stats() -> dict:
    from byoc_hetero import _C

    return dict(_C.adaptation_stats())


def time_worker(fw: str, model: str, threads: int, small: bool, workdir: str, min_time: float,
                baseline: str = "torchscript") -> dict:
    """Median latency of one call of ``model`` on framework ``fw`` (ONNX Runtime and OpenVINO on
    :func:`baseline_file`'s ``baseline`` file); saves the output for the error check."""
    f = _files(workdir, model)
    data = np.load(f["inputs"])
    feed = {k: data[k] for k in data.files}
    info: dict = {}
    if fw in PATHS:
        import tvm
        from tvm import relax

        import byoc_hetero  # noqa: F401 - registers the loader of our region modules

        vm = relax.VirtualMachine(tvm.runtime.load_module(f["lib"].format(path=PATHS[fw])), tvm.cpu())
        args = [tvm.runtime.tensor(x) for x in feed.values()]

        def call():
            return vm["main"](*args)

        def result(out):
            return (out if hasattr(out, "numpy") else out[0]).numpy()
    elif fw == "ort":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(baseline_file(f, baseline), so, providers=["CPUExecutionProvider"])

        def call():
            return sess.run(None, feed)

        def result(out):
            return out[0]
    elif fw in ("openvino", "openvino_default"):
        import openvino as ov

        config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": str(threads)}
        if fw == "openvino":
            config["INFERENCE_PRECISION_HINT"] = "f32"
        compiled = ov.Core().compile_model(baseline_file(f, baseline), "CPU", config)
        precision = compiled.get_property("INFERENCE_PRECISION_HINT")
        info["precision"] = precision.to_string() if hasattr(precision, "to_string") else str(precision)
        request = compiled.create_infer_request()

        def call():
            return request.infer(feed)

        def result(_):
            return np.array(request.get_output_tensor(0).data)
    elif fw == "torch":
        import torch

        torch.set_num_threads(threads)
        zm = build(model, small)
        torch_inputs = tuple(torch.from_numpy(feed[n]) for n in zm.input_names)

        def call():
            with torch.inference_mode():
                return zm.module(*torch_inputs)

        def result(out):
            return out.numpy()
    else:
        raise SystemExit(f"unknown framework {fw}")
    t0 = time.perf_counter()
    out = result(call())
    first = time.perf_counter() - t0
    slow = first > 0.5
    stats = _adaptation_stats() if fw in PATHS else None
    times = _timed(call, min_time=min_time, min_iters=3 if slow else 10, max_iters=5 if slow else 400,
                   warmup=1 if slow else 3)
    if stats is not None:
        # region calls the runtime ran with fewer threads (contention from other processes): a
        # median that mixes 1- and 2-thread calls is no 2-thread figure (bench/LLM.md, session 5)
        after = _adaptation_stats()
        info["reduced_calls"] = after["reduced"] - stats["reduced"]
    np.save(f["out"].format(fw=fw, threads=threads), np.asarray(out))
    return {"median_s": float(np.median(times)), "min_s": float(np.min(times)), "iters": len(times), **info}


# ------------------------------------------------------------------------------------------------
# Orchestrator


def versions() -> str:
    """Versions of the frameworks and libraries compared."""
    text = package_versions(VERSIONED)
    try:
        return f"byoc-hetero {importlib.metadata.version('byoc-hetero')}, {text}"
    except importlib.metadata.PackageNotFoundError:
        return text


def _err_cell(err: float | None) -> str:
    if err is None:
        return "—"
    return f"{err:.1e}" + ("" if err <= TOLERANCE else " **!**")


class Zoo:
    """Runs the stages for each model and renders the tables from what has been measured so far."""

    def __init__(self, args, workdir: str):
        self.args = args
        self.workdir = workdir
        self.models = args.models.split(",")
        self.threads = [int(t) for t in args.threads.split(",")]
        self.frameworks = args.frameworks.split(",")
        self.paths = [p for fw, p in PATHS.items() if fw in self.frameworks]
        self.prepared: dict[str, dict] = {}
        self.compiled: dict[tuple[str, str], dict] = {}
        self.timings: dict[tuple[str, str, int], list[dict]] = {}
        self.errors: dict[tuple[str, str, int], float | None] = {}
        self.machine = machine()
        self.started = time.time()

    def spawn(self, argv: list[str], threads: int, timeout: float) -> dict:
        common = ["--workdir", self.workdir, "--min-time", str(self.args.min_time),
                  "--precision", self.args.precision, "--baseline", self.args.baseline] + (["--small"] if self.args.small else [])
        return _spawn(argv + common, threads, timeout=timeout, script=os.path.abspath(__file__))

    def log(self, msg: str) -> None:
        print(f"[{time.time() - self.started:7.0f}s] {msg}", file=sys.stderr, flush=True)

    def run_model(self, model: str) -> None:
        state = os.path.join(self.workdir, model + "_built.json")
        if self.args.phase == "time" and os.path.exists(state):
            with open(state) as f:  # built by an earlier `--phase build` run in this --keep folder
                saved = json.load(f)
            self.prepared[model] = saved["prepared"]
            self.compiled.update({tuple(k.split("|")): r for k, r in saved["compiled"].items()})
            self.log(f"{model}: reusing the build of {state}")
        else:
            self.build_model(model)
            with open(state, "w") as f:
                json.dump({"prepared": self.prepared[model],
                           "compiled": {f"{m}|{p}": r for (m, p), r in self.compiled.items() if m == model}}, f)
        if "error" not in self.prepared[model] and self.args.phase != "build":
            self.time_model(model, self.prepared[model])

    def build_model(self, model: str) -> None:
        """Prepare (torch reference, ONNX exports) and compile every import path of ``model``."""
        self.log(f"{model}: prepare")
        prep = self.spawn(["--prepare", model], 2, self.args.timeout)
        self.prepared[model] = prep
        if "error" in prep:
            return
        for path in self.paths:
            if path == "from_onnx" and "onnx_error" in prep:
                self.compiled[(model, path)] = {"error": prep["onnx_error"]}
                continue
            if path == "from_onnx_dynamo" and "onnx_dynamo_error" in prep:
                self.compiled[(model, path)] = {"error": prep["onnx_dynamo_error"]}
                continue
            self.log(f"{model}: compile {path}")
            t0 = time.time()
            r = self.spawn(["--compile", model, path], max(self.threads), self.args.timeout)
            r["wall_s"] = time.time() - t0
            self.compiled[(model, path)] = r
            self.log(f"{model}: {path}: " + (r.get("error") or f"{r['regions']} regions, "
                                              f"{sum(n for *_, n in r['llvm_ops'])} ops on llvm, {r['wall_s']:.0f} s"))

    def time_model(self, model: str, prep: dict) -> None:
        """Every framework at every thread count, in interleaved rounds, each after a quiet wait."""
        ref = np.load(_files(self.workdir, model)["ref"])
        for threads in self.threads:
            for rnd in range(self.args.rounds):
                for fw in self.frameworks:
                    if fw in PATHS and ("error" in self.compiled.get((model, PATHS[fw]), {"error": 1})):
                        continue
                    if fw != "torch" and fw not in PATHS and "onnx_error" in prep and "onnx_dynamo_error" in prep:
                        continue
                    busy = wait_quiet(self.args.quiet_wait)
                    r = self.spawn(["--worker", fw, model, str(threads)], threads, self.args.timeout)
                    r["busy_before"] = busy
                    self.timings.setdefault((model, fw, threads), []).append(r)
                    msg = r.get("error", "").splitlines()[-1:] or [f"{fmt_ms(r['median_s'])} ms" + (
                        f", {r['reduced_calls']} region calls with fewer threads" if r.get("reduced_calls") else "")]
                    self.log(f"  {model} {LABELS[fw]} {threads}T round {rnd + 1}: {msg[0]} (CPUs {busy:.0%} busy before)")
                    out_file = _files(self.workdir, model)["out"].format(fw=fw, threads=threads)
                    if "error" not in r and (model, fw, threads) not in self.errors and os.path.exists(out_file):
                        out = np.load(out_file)
                        self.errors[(model, fw, threads)] = (
                            float(np.max(np.abs(out.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
                            if out.shape == ref.shape else None)

    def latency(self, model: str, fw: str, threads: int, best: bool = False) -> float | None:
        """Median (or with ``best`` the lowest) over the rounds of each process's median latency."""
        runs = [r["median_s"] for r in self.timings.get((model, fw, threads), []) if "median_s" in r]
        return (float(np.min(runs)) if best else float(np.median(runs))) if runs else None

    def dump(self, path: str) -> None:
        """Everything measured, as JSON (the tables can be rebuilt from it)."""
        data = {"machine": self.machine, "versions": versions(), "args": vars(self.args),
                "prepared": self.prepared,
                "compiled": {f"{m}|{p}": r for (m, p), r in self.compiled.items()},
                "timings": {f"{m}|{fw}|{t}": runs for (m, fw, t), runs in self.timings.items()},
                "errors_vs_torch": {f"{m}|{fw}|{t}": e for (m, fw, t), e in self.errors.items()}}
        with open(path, "w") as f:
            json.dump(data, f, indent=1)

    def render(self, done: bool) -> list[str]:
        a = self.args
        lines = ["# byoc-hetero model zoo", ""]
        lines.append(f"Machine: {self.machine}.")
        lines.append("")
        lines.append(f"Versions: {versions()}.")
        lines.append("")
        lines.append(f"Run: `python bench/zoo.py --models {a.models} --threads {a.threads} --frameworks {a.frameworks} "
                     f"--rounds {a.rounds} --min-time {a.min_time:g}{' --small' if a.small else ''}"
                     f"{' --precision ' + a.precision if a.precision != 'f32' else ''}"
                     f"{' --baseline ' + a.baseline if a.baseline != 'torchscript' else ''}`; "
                     f"{'finished' if done else 'in progress'} after {(time.time() - self.started) / 60:.0f} min, "
                     f"load average now {os.getloadavg()[0]:.2f}."
                     + (" **Scaled-down configs (`--small`)**: the figures say nothing about the full models."
                        if a.small else ""))
        lines.append("")
        lines += self.render_latency() + self.render_partition() + self.render_llvm_ops()
        return lines

    def latency_table(self, best: bool) -> list[str]:
        """One latency table (median or best over the rounds) with the ratios to ours."""
        fws = self.frameworks
        others = [fw for fw in fws if fw not in PATHS]
        head = ["model", "threads"] + [LABELS[fw] for fw in fws] + [f"{LABELS[fw]} / ours" for fw in others]
        lines = ["Best round:" if best else "Median over the rounds:", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for model in self.models:
            for threads in self.threads:
                ours = next((lat for fw in PATHS if (lat := self.latency(model, fw, threads, best))), None)
                cells = []
                for fw in fws:
                    lat = self.latency(model, fw, threads, best)
                    runs = self.timings.get((model, fw, threads), [])
                    if lat is None:
                        cells.append("error" if any("error" in r for r in runs) else "—")
                        continue
                    precision = next((r["precision"] for r in runs if "precision" in r), None)
                    cells.append(fmt_ms(lat) + (f" ({precision})" if fw == "openvino_default" and precision else ""))
                ratios = []
                for fw in others:
                    lat = self.latency(model, fw, threads, best)
                    ratios.append(f"{lat / ours:.2f}x" if lat and ours else "—")
                lines.append(f"| {model} | {threads} | " + " | ".join(cells + ratios) + " |")
        lines.append("")
        return lines

    def render_latency(self) -> list[str]:
        fws = self.frameworks
        lines = ["## Latency", "",
                 "Latency of one call from Python in ms (batch 1, float32). Each process times at least "
                 f"{self.args.min_time:g} s of calls and keeps their median; every framework runs in "
                 f"{self.args.rounds} interleaved round(s); the first table gives the median over the rounds, "
                 "the second the best round (the least disturbed by other processes). Ratio = other / ours, "
                 "where ours is the from_torch build (else the from_onnx build, else the default exporter's: the "
                 "first that ran); > 1 means "
                 "we are faster. OpenVINO default runs in the precision in brackets (bf16 on CPUs with "
                 "avx512_bf16) and is not held to f32 accuracy.", ""]
        lines += self.latency_table(best=False) + self.latency_table(best=True)
        lines.append("Max relative error vs torch eager (max |y - y_torch| / max |y_torch|, first round at the "
                     f"first thread count; **!** above {TOLERANCE:g}):")
        lines.append("")
        errs = [fw for fw in fws if fw != "torch"]
        lines += ["| model | " + " | ".join(LABELS[fw] for fw in errs) + " |", "|" + "---|" * (len(errs) + 1)]
        for model in self.models:
            cells = []
            for fw in errs:
                got = [self.errors[k] for k in sorted(self.errors) if k[0] == model and k[1] == fw]
                cells.append(_err_cell(got[0]) if got else "—")
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
        lines.append("")
        busy = [r["busy_before"] for runs in self.timings.values() for r in runs if "busy_before" in r]
        if busy:
            lines.append(f"Other processes kept the CPUs {np.median(busy):.0%} busy (median; {min(busy):.0%}-"
                         f"{max(busy):.0%}) just before the measurements: on a shared machine, timings at 2 "
                         "threads in particular are distorted (an OpenMP team waits for its descheduled threads).")
            lines.append("")
        failed = [(k, r["error"]) for k, runs in self.timings.items() for r in runs if "error" in r]
        for (model, fw, threads), err in failed:
            lines.append(f"* {model}, {LABELS[fw]}, {threads} thread(s): {_first_line(err.splitlines()[-1])}")
        if failed:
            lines.append("")
        return lines

    def render_partition(self) -> list[str]:
        lines = ["## Partition", "",
                 "Per model and import path: offloaded regions (`bh.report`), Relax ops offloaded / left on llvm, "
                 "offloaded GFLOP, the compile process's seconds (import + partition + build + export), the output "
                 "shape against torch's, and the max relative error of the output vs torch eager.", "",
                 "| model | params (M) | import | regions | ops offloaded | ops on llvm | GFLOP offloaded | compile s "
                 "| output shape | error vs torch | status |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
        for model in self.models:
            prep = self.prepared.get(model)
            if prep is None:
                continue
            if "error" in prep:
                lines.append(f"| {model} | — | — | | | | | | | | prepare failed: {_first_line(prep['error'].splitlines()[-1])} |")
                continue
            for path in self.paths:
                r = self.compiled.get((model, path), {})
                want = prep["output_shape"]
                got = r.get("output_shape")
                shape = "—" if got is None else (f"{tuple(got)}" if got == want else f"**{tuple(got)}** (torch {tuple(want)})")
                status = "ok"
                if "error" in r:
                    status = _first_line(r["error"].splitlines()[-1] if r["error"].startswith("exit") else r["error"])
                elif got != want:
                    status = "wrong output shape"
                elif r.get("max_rel_err") is not None and r["max_rel_err"] > (
                        BF16_TOLERANCE if self.args.precision == "bf16" else TOLERANCE):
                    status = "error above tolerance"
                llvm = sum(n for *_, n in r["llvm_ops"]) if "llvm_ops" in r else "—"
                gflop = f"{r['offloaded_mflop'] / 1e3:.2f}" if "offloaded_mflop" in r else "—"
                wall = f"{r['wall_s']:.0f}" if "wall_s" in r else "—"
                lines.append(f"| {model} | {prep['params_m']:.1f} | {path} | {r.get('regions', '—')} "
                             f"| {r.get('ops_offloaded', '—')} | {llvm} | {gflop} | {wall} | {shape} "
                             f"| {_err_cell(r.get('max_rel_err'))} | {status} |")
        lines.append("")
        return lines

    def render_llvm_ops(self) -> list[str]:
        lines = ["## Ops left on llvm, and why", "",
                 "Grouped by op and the reason `bh.report` gives (the rule that rejected it in brackets).", ""]
        for model in self.models:
            for path in self.paths:
                r = self.compiled.get((model, path), {})
                if "llvm_ops" not in r:
                    continue
                total = sum(n for *_, n in r["llvm_ops"])
                lines.append(f"* **{model}, {path}**: {r['regions']} regions, {total} ops on llvm")
                for op, reason, rule, n in r["llvm_ops"]:
                    lines.append(f"  * {op} x{n}: {reason}" + (f" [{rule}]" if rule else ""))
        lines.append("")
        return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every framework")
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds of timed calls per measurement")
    ap.add_argument("--small", action="store_true", help="scaled-down configs (zoo_models' small=True)")
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32",
                    help="what our builds compute in (bh.partition's precision=); errors vs torch show its cost")
    ap.add_argument("--baseline", choices=("torchscript", "dynamo"), default="torchscript",
                    help="the ONNX file ONNX Runtime and OpenVINO run: TorchScript's (the default exporter's where "
                         "it fails) or the default exporter's")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed to each process (compile, timing)")
    ap.add_argument("--quiet-wait", type=float, default=10.0, help="wait up to this long for idle CPUs before a timing")
    ap.add_argument("--markdown", help="write the report as markdown to this file (rewritten after every model)")
    ap.add_argument("--json", help="also write every measurement as JSON to this file (after every model)")
    ap.add_argument("--keep", metavar="DIR", help="keep exports and builds in DIR (default: a temporary folder)")
    ap.add_argument("--phase", choices=("all", "build", "time"), default="all",
                    help="build: prepare and compile only (into --keep DIR); time: time what a build phase left in "
                         "--keep DIR, so that compiling can run while the machine is busy and timing when it is quiet")
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", metavar="MODEL", help=argparse.SUPPRESS)
    ap.add_argument("--compile", nargs=2, metavar=("MODEL", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--worker", nargs=3, metavar=("FRAMEWORK", "MODEL", "THREADS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.prepare:
        print(json.dumps(prepare_worker(args.prepare, args.small, args.workdir)))
        return 0
    if args.compile:
        print(json.dumps(compile_worker(*args.compile, args.small, args.workdir, args.precision)))
        return 0
    if args.worker:
        fw, model, threads = args.worker
        print(json.dumps(time_worker(fw, model, int(threads), args.small, args.workdir, args.min_time, args.baseline)))
        return 0

    # "issue39": issue 39's families (zoo_models.ISSUE39_MODELS)
    args.models = ",".join(m for name in args.models.split(",")
                           for m in (ISSUE39_MODELS if name == "issue39" else (name,)))
    for name in args.models.split(","):
        if name not in MODELS:
            ap.error(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    for fw in args.frameworks.split(","):
        if fw not in FRAMEWORKS:
            ap.error(f"unknown framework {fw!r}; known: {', '.join(FRAMEWORKS)}")
    def save(zoo: Zoo, lines: list[str]) -> None:
        if args.json:
            zoo.dump(args.json)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write("\n".join(lines) + "\n")

    if args.phase != "all" and not args.keep:
        ap.error("--phase build/time needs --keep DIR (where the build phase leaves its files)")
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    with (contextlib.nullcontext(os.path.abspath(args.keep)) if args.keep
          else tempfile.TemporaryDirectory(prefix="zoo-")) as workdir:
        zoo = Zoo(args, workdir)
        for model in zoo.models:
            zoo.run_model(model)
            save(zoo, zoo.render(done=False))
        report = zoo.render(done=True)
        save(zoo, report)
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
