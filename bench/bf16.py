"""bf16 benchmark: byoc-hetero f32 and bf16 against OpenVINO's default and f32, and ONNX Runtime.

    python bench/bf16.py                                  # the built-in models, 224x224, batch 1, 2 threads
    python bench/bf16.py --models resnet18,mlp --rounds 3 --markdown bench/BF16.md

Contenders, each (contender, model) in its own process, interleaved round-robin for ``--rounds``
rounds (the best median of the rounds is kept: other processes on a shared machine come and go):

* ``ours-f32`` / ``ours-bf16``: ``bh.partition(mod, params, precision=...)``, built with relax.build;
* ``ov-default``: OpenVINO with no precision hint (LATENCY hint): bf16 where the CPU has it;
  the precision it chose (``INFERENCE_PRECISION_HINT`` of the compiled model) is printed;
* ``ov-f32``: OpenVINO with ``INFERENCE_PRECISION_HINT=f32``;
* ``ort``: ONNX Runtime (CPU execution provider, all graph optimizations), float32.

OpenVINO and ONNX Runtime read the ONNX model ``bench/programs.py`` builds from the same weights.
The error column is ``max |y - y_f32| / max |y_f32|`` against ONNX Runtime's float32 output (an
independent float32 reference), so the two bf16 columns' errors can be compared side by side.
Needs ``pip install ".[bench]"`` (onnx, onnxruntime, openvino).
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
sys.path.insert(0, HERE)

CONTENDERS = ["ours-f32", "ours-bf16", "ov-default", "ov-f32", "ort"]


# ------------------------------------------------------------------------------------------------
# Worker (one process per measurement)


def worker(args) -> dict:
    from run import _timed

    data = np.load(args.data)
    x = data["__input__"]
    params = {k: data[k] for k in data.files if k != "__input__"}
    timing = dict(min_time=args.min_time, min_iters=10, max_iters=2000, warmup=5)
    info: dict = {}
    if args.contender.startswith("ours"):
        import tvm
        from tvm import relax

        import byoc_hetero as bh
        from byoc_hetero.codegen import region_modules

        precision = args.contender.split("-", 1)[1]
        mod, _ = getattr(bh.models, args.model)(batch=1)
        part = bh.partition(mod, params, precision=precision)
        ex = relax.build(part, target="llvm")
        infos = [json.loads(m["get_runtime_info"]()) for m in region_modules(ex)]
        info["precision"] = sorted({i.get("precision", "f32") for i in infos})
        vm = relax.VirtualMachine(ex, tvm.cpu())
        xt = tvm.runtime.tensor(x)
        fn = lambda: vm["main"](xt)  # noqa: E731
        out = fn().numpy()
    elif args.contender.startswith("ov"):
        import openvino as ov

        core = ov.Core()
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": args.threads, "NUM_STREAMS": 1}
        if args.contender == "ov-f32":
            config["INFERENCE_PRECISION_HINT"] = "f32"
        compiled = core.compile_model(core.read_model(args.onnx), "CPU", config)
        info["precision"] = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
        info["version"] = ov.__version__
        req = compiled.create_infer_request()
        feed = {0: x}
        fn = lambda: req.infer(feed)  # noqa: E731
        out = next(iter(fn().values()))
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(args.onnx, so, providers=["CPUExecutionProvider"])
        feed = {"data": x}
        fn = lambda: sess.run(None, feed)  # noqa: E731
        out = fn()[0]
        info["precision"] = "f32"
        info["version"] = ort.__version__
    times = _timed(fn, **timing)
    np.save(args.out, np.asarray(out, dtype=np.float32))
    return {"median_s": float(np.median(times)), "min_s": float(np.min(times)), "iters": len(times), **info}


# ------------------------------------------------------------------------------------------------
# Orchestrator


def _spawn(argv: list[str], threads: int, timeout: float = 1800) -> dict:
    from run import _env

    proc = subprocess.run([sys.executable, os.path.abspath(__file__), *argv], env=_env(threads),
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-4:])}
    return json.loads(lines[-1])


def _onnx(workdir: str, name: str, data: str) -> str:
    from programs import PROGRAMS, OnnxGraph

    arrays = np.load(data)
    params = {k: arrays[k] for k in arrays.files if k != "__input__"}
    g = OnnxGraph(params)
    model = g.model(arrays["__input__"].shape, PROGRAMS[name](g, "data"))
    path = os.path.join(workdir, f"{name}.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    scale = float(np.max(np.abs(want))) or 1.0
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) / scale


def main(argv=None) -> int:
    from run import _prepare, machine, wait_quiet

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="vgg11,resnet18,mobilenet_v2,mlp")
    ap.add_argument("--contenders", default=",".join(CONTENDERS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=1.5, help="seconds of timed calls per measurement")
    ap.add_argument("--rounds", type=int, default=2, help="round-robin rounds; the best median is kept")
    ap.add_argument("--quiet-wait", type=float, default=5.0,
                    help="before each measurement wait up to this many seconds for idle CPUs")
    ap.add_argument("--markdown", help="also write the table to this file")
    # worker mode
    ap.add_argument("--worker", nargs=4, metavar=("CONTENDER", "MODEL", "DATA", "ONNX"))
    ap.add_argument("--out")
    args = ap.parse_args(argv)

    if args.worker:
        args.contender, args.model, args.data, args.onnx = args.worker
        print(json.dumps(worker(args)))
        return 0

    models = args.models.split(",")
    contenders = args.contenders.split(",")
    host = machine()
    print(host, flush=True)
    best: dict = {}
    outs: dict = {}
    with tempfile.TemporaryDirectory() as workdir:
        files = {}
        for name in models:
            data, _, _ = _prepare(workdir, name, 1)
            files[name] = (data, _onnx(workdir, name, data))
        for rnd in range(args.rounds):
            for name in models:
                for c in contenders:
                    wait_quiet(args.quiet_wait)
                    out = os.path.join(workdir, f"{name}_{c}.npy")
                    r = _spawn(["--worker", c, name, *files[name], "--out", out,
                                "--min-time", str(args.min_time), "--threads", str(args.threads)], args.threads)
                    key = (name, c)
                    if "error" in r:
                        print(f"round {rnd} {name} {c}: {r['error']}", flush=True)
                        best.setdefault(key, r)
                        continue
                    outs[key] = np.load(out)
                    if "error" in best.get(key, {}) or key not in best:
                        best[key] = r
                    else:
                        best[key]["median_s"] = min(best[key]["median_s"], r["median_s"])
                        best[key]["min_s"] = min(best[key]["min_s"], r["min_s"])
                    print(f"round {rnd} {name:<13} {c:<10} median {r['median_s'] * 1e3:8.2f} ms  "
                          f"min {r['min_s'] * 1e3:8.2f} ms  {r.get('precision')}", flush=True)

    lines = [f"Machine: {host}; {args.threads} threads, batch 1, 224x224 images (MLP 784-512-256-10). "
             f"Each cell: the best of {args.rounds} interleaved rounds (one process each) of the median latency, "
             "then the fastest single call (a shared, noisy machine: the minimum is the steadier figure), "
             "then the error.", ""]
    for stat, title in (("median_s", "median"), ("min_s", "minimum")):
        lines += [f"**{title} latency, ms (error)**", ""]
        lines += ["| model | " + " | ".join(contenders) + " | ours-bf16 / ov-default | ours-bf16 / ours-f32 |",
                  "|" + "---|" * (len(contenders) + 3)]
        for name in models:
            ref = outs.get((name, "ort"))
            cells = []
            for c in contenders:
                r = best.get((name, c), {"error": "not run"})
                if "error" in r:
                    cells.append("error")
                    continue
                err = f"{rel_err(outs[(name, c)], ref):.1e}" if ref is not None else "—"
                cells.append(f"{r[stat] * 1e3:.2f} ({err})")

            def ratio(a, b):
                ra, rb = best.get((name, a), {}), best.get((name, b), {})
                return f"{ra[stat] / rb[stat]:.2f}x" if stat in ra and stat in rb else "—"

            lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratio('ours-bf16', 'ov-default')} | "
                         f"{ratio('ours-bf16', 'ours-f32')} |")
        lines.append("")
    precisions = {c: sorted({str(best.get((n, c), {}).get("precision")) for n in models}) for c in contenders}
    lines += ["", "Precision each contender reported: " +
              "; ".join(f"{c}: {', '.join(p)}" for c, p in precisions.items()),
              "Error: max |y - y_ort| / max |y_ort| against ONNX Runtime's float32 output."]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
