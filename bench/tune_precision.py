"""The precision level of bh.tune against the single-precision builds (issue 26 targets).

For a built-in model: tune with precisions=("f32", "bf16") at each tolerance (cold timing cache,
then warm), then time side by side, interleaved in one process, the default float32 partition,
the all-bf16 partition and each tuned module; errors are max |y - y_f32| / max |y_f32| against
the llvm-only float32 build on held-out inputs the tuner never saw.

    python3 bench/tune_precision.py --model resnet18 --image-size 128 --tolerances 1e-2 auto
    python3 bench/tune_precision.py --model resnet18 --precisions f32 bf16 int8 --tunes 1

``auto`` is half of the all-bf16 build's held-out error: a tolerance all-bf16 misses; with int8
among ``--precisions``, half of the all-int8 build's (``bh.quantize`` of every layer on the same
calibration inputs): a tolerance all-int8 misses. The int8 rows add the all-int8 build.

``--model zoo:NAME`` (bench/zoo_models.py, full size; ``--small`` for its small config) is imported by
``bh.from_torch``, or with ``--import onnx`` through ``torch.onnx.export``'s default exporter and
``bh.from_onnx`` (issue 35's path); its float inputs are drawn at random, its integer inputs (BERT's
token ids, attention mask) kept as the zoo gives them, and errors are against torch's float32 output.

    python3 bench/tune_precision.py --model zoo:bert_base --import onnx --tolerances 1e-2 \
        --precisions f32 bf16 int8
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import tempfile
import time
import warnings

import numpy as np
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.tune.measure import time_alternately
from byoc_hetero.tune.plan_errors import relative_error
from byoc_hetero.tune.plans import Built


def _machine() -> str:
    lines = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines()
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")]
    model = names[0] if names else platform.processor()
    return (f"{model}, {os.cpu_count()} CPUs, oneDNN {bh._C.onednn_version()} ISA {bh._C.isa()}, "
            f"load average {os.getloadavg()[0]:.1f} at start (a shared machine: times are noisy)")


def _load(name: str, image_size: int, small: bool = False, importer: str = "torch"):
    """``(mod, params, zoo model or None)``: a built-in model (``resnet18``) at ``image_size``, or
    ``zoo:NAME`` (bench/zoo_models.py, its own input size: torchvision's ResNet-50 with random
    weights at 224x224) through bh.from_torch, or (``importer="onnx"``) the default ONNX exporter
    and bh.from_onnx."""
    if not name.startswith("zoo:"):
        mod, params = getattr(bh.models, name)(image_size=image_size)
        return mod, params, None
    import sys

    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from zoo_models import build

    zm = build(name[4:], small=small)
    if importer == "torch":
        return (*bh.from_torch(zm.module, zm.inputs), zm)
    path = os.path.join(tempfile.mkdtemp(), f"{zm.name}.onnx")
    torch.onnx.export(zm.module, zm.inputs, path, input_names=list(zm.input_names))
    return (*bh.from_onnx(path), zm)


def _samples(mod, zm, n: int, rng) -> list[list[np.ndarray]]:
    """``n`` samples (each a list of arrays in input order): float inputs standard normal, integer
    inputs (token ids, masks) as the zoo model gives them."""
    if zm is None:
        shape = [int(d) for d in mod["main"].params[0].ty.shape.values]
        return [[rng.standard_normal(shape).astype("float32")] for _ in range(n)]
    out = []
    for _ in range(n):
        arrays = [t.numpy() for t in zm.inputs]
        out.append([rng.standard_normal(a.shape).astype(a.dtype) if a.dtype == np.float32 else a for a in arrays])
    return out


def _reference(mod, params, zm, samples) -> list[list[np.ndarray]]:
    """The float32 outputs of ``samples``: torch's for a zoo model, else the llvm-only build's."""
    if zm is not None:
        import torch

        with torch.no_grad():
            return [[zm.module(*[torch.from_numpy(a) for a in s]).numpy()] for s in samples]
    vm = relax.VirtualMachine(relax.build(bh.bind_params(mod, params), target="llvm"), tvm.cpu())
    return [[vm["main"](*[tvm.runtime.tensor(a) for a in s]).numpy()] for s in samples]


def _tune(args, mod, params, tol, cal, held, cache):
    """Each tune of ``args.tunes`` at ``tol`` (the second reads the timing cache): the module and
    report of the last, each tune's line printed."""
    for run in ("first", "second")[:args.tunes]:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m, report = bh.tune(mod, params, precisions=tuple(args.precisions), tolerance=tol, calibration=cal,
                                holdout=held, cache=cache, budget_s=args.budget_s)
        print(f"tune tolerance {tol:.2g} ({run} tune, timing cache {report.cache_hits} hits / "
              f"{report.cache_misses} misses): {time.perf_counter() - t0:.1f} s, kept {report.precision.kept}",
              flush=True)
    print(report, flush=True)
    return m, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--calibration", type=int, default=4)
    ap.add_argument("--holdout", type=int, default=2)
    ap.add_argument("--tolerances", nargs="+", default=["1e-2", "auto"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--precisions", nargs="+", default=["f32", "bf16"])
    ap.add_argument("--tunes", type=int, default=2, help="tunes per tolerance (the second reads the timing cache)")
    ap.add_argument("--budget-s", type=float, default=None, help="bh.tune's budget_s (the search's time bound)")
    ap.add_argument("--cache", default=None, help="timing cache file (default: a new empty one)")
    ap.add_argument("--small", action="store_true", help="a zoo model's small config")
    ap.add_argument("--import", dest="importer", choices=("torch", "onnx"), default="torch",
                    help="a zoo model through bh.from_torch or the default ONNX exporter and bh.from_onnx")
    args = ap.parse_args()
    mod, params, zm = _load(args.model, args.image_size, args.small, args.importer)
    rng = np.random.default_rng(0)
    cal, held = _samples(mod, zm, args.calibration, rng), _samples(mod, zm, args.holdout, rng)
    ref = _reference(mod, params, zm, held)
    builds = {"default f32": Built(bh.partition(mod, params)),
              "all bf16": Built(bh.partition(mod, params, precision="bf16"))}
    auto_err = relative_error(builds["all bf16"].run(held), ref)
    if "int8" in args.precisions:
        q = bh.quantize(mod, params, calibration=cal, verbose=False)
        builds["all int8"] = Built(bh.partition(q.mod, q.params))
        auto_err = relative_error(builds["all int8"].run(held), ref)
    print(f"# {args.model} ({args.importer}) inputs {[a.shape for a in cal[0]]}: {_machine()}", flush=True)
    cache = args.cache or os.path.join(tempfile.mkdtemp(), "timings.json")
    for tol_text in args.tolerances:
        tol = auto_err / 2 if tol_text == "auto" else float(tol_text)
        m, report = _tune(args, mod, params, tol, cal, held, cache)
        builds[f"tuned tol {tol:.2g} (kept: {report.precision.kept}; guard: {report.kept})"] = Built(m)
    timings = time_alternately([b.caller(cal[0]) for b in builds.values()], args.rounds, 15)
    base = timings[0].median_s
    print("\n| build | median ms | / default | / all bf16 | held-out error vs f32 |\n|---|---|---|---|---|")
    for (name, b), t in zip(builds.items(), timings):
        err = relative_error(b.run(held), ref)
        print(f"| {name} | {t.median_s * 1e3:.3f} | {t.median_s / base:.2f} | "
              f"{t.median_s / timings[1].median_s:.2f} | {err:.2g} |")


if __name__ == "__main__":
    main()
