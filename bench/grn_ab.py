"""ConvNeXt-V2's Global Response Normalization before and after its two-pass form, A/B in one process.

    python3 bench/grn_ab.py [--calls 60] [--rounds 5]                 # GRN alone, ConvNeXt-V2-T's four stage shapes
    python3 bench/grn_ab.py --model [--openvino] [--threads 2]        # also the whole ConvNeXt-V2-T, 224x224

A is the region graph as main wrote it before (the norm's square a step of its own before the sum,
the tail ``gamma * (x * Nx) + beta + x`` four full binaries): the region passes' new rewrites are
switched off for that build (``fuse_rms_statistics`` folding only a mean's square,
``fuse_affine_tails`` a no-op). B is this tree as it is. Both run in this process from the same
extension; rounds alternate A and B (``--calls`` calls each, the median per side per round), and
the table gives each side's median over the rounds. ``--openvino`` times OpenVINO f32 (latency hint,
one stream, ``--threads`` threads) on the dynamo exporter's ONNX file of the same model in the same
rounds (needs the ``openvino`` package). Prints the CPU and oneDNN's ISA.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import byoc_hetero as bh  # noqa: E402
from byoc_hetero.backends.onednn import table  # noqa: E402
from byoc_hetero.backends.onednn.ops import rms_statistic  # noqa: E402

STAGES = [(1, 56, 56, 96), (1, 28, 28, 192), (1, 14, 14, 384), (1, 7, 7, 768)]
"""GRN's input shapes in ConvNeXt-V2-T at 224x224 (channels last), one per stage."""


@contextlib.contextmanager
def before():
    """The region passes as they were before the two-pass GRN (side A)."""
    squares, tails = dict(rms_statistic._OF_SQUARES), table.TABLE.passes["fuse_affine_tails"]
    rms_statistic._OF_SQUARES.pop("sum")
    table.TABLE.passes["fuse_affine_tails"] = lambda graph: None
    try:
        yield
    finally:
        rms_statistic._OF_SQUARES.clear()
        rms_statistic._OF_SQUARES.update(squares)
        table.TABLE.passes["fuse_affine_tails"] = tails


def compiled(part):
    ex = relax.build(part, target="llvm")
    return ex, relax.VirtualMachine(ex, tvm.cpu())


def full_passes(ex, shape) -> int:
    """Region nodes writing a tensor of ``shape``."""
    n = 0
    for m in bh.codegen.region_modules(ex):
        g = json.loads(m["get_graph_json"]())
        n += sum(1 for node in g["nodes"] if g["tensors"][node["output"]]["shape"] == list(shape))
    return n


def median_ms(call, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def interleaved(calls_by_side: dict, calls: int, rounds: int) -> dict:
    """Each side's median over ``rounds`` of its per-round median, the order alternating."""
    per_side = {k: [] for k in calls_by_side}
    for c in calls_by_side.values():
        for _ in range(3):
            c()
    for r in range(rounds):
        order = list(calls_by_side) if r % 2 == 0 else list(reversed(list(calls_by_side)))
        for side in order:
            per_side[side].append(median_ms(calls_by_side[side], calls))
    return {k: float(np.median(v)) for k, v in per_side.items()}


def grn_alone(args) -> None:
    from test_grn import grn_module

    print("| GRN input | full passes A -> B | A (ms) | B (ms) | B / A |")
    print("|---|---|---|---|---|")
    for shape in STAGES:
        mod = grn_module(shape)
        with before():
            ex_a, vm_a = compiled(bh.partition(mod, require_heavy_op=False))
        ex_b, vm_b = compiled(bh.partition(mod, require_heavy_op=False))
        x = tvm.runtime.tensor(np.random.default_rng(0).standard_normal(shape).astype("float32"))
        ya, yb = vm_a["main"](x).numpy(), vm_b["main"](x).numpy()
        assert np.abs(ya - yb).max() <= 1e-5 * np.abs(ya).max(), "A and B disagree"
        t = interleaved({"A": lambda: vm_a["main"](x), "B": lambda: vm_b["main"](x)}, args.calls, args.rounds)
        print(f"| {list(shape)} | {full_passes(ex_a, shape)} -> {full_passes(ex_b, shape)} | {t['A']:.3f} | "
              f"{t['B']:.3f} | {t['B'] / t['A']:.2f} |", flush=True)


def _without_broken_torchvision() -> None:
    """transformers imports torchvision for its image utilities wherever it is installed; where that
    torchvision does not load against this torch (a venv with OpenVINO and its own torch over the
    system packages), transformers is told it is absent (ConvNeXt-V2 needs none of it)."""
    try:
        importlib.import_module("torchvision")
    except Exception:  # noqa: BLE001 (torchvision raises RuntimeError on a torch it was not built for)
        import transformers.utils as tu
        import transformers.utils.import_utils as iu

        tu.is_torchvision_available = iu.is_torchvision_available = lambda: False


def whole_model(args) -> None:
    import torch

    _without_broken_torchvision()
    from test_grn import convnextv2_model

    model = convnextv2_model()  # the default config: ConvNeXt-V2-T
    pixels = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        want = model(pixels).numpy()
    mod, params = bh.from_torch(model, (pixels,))
    with before():
        _, vm_a = compiled(bh.partition(mod, params))
    part = bh.partition(mod, params)
    rep = bh.report(part)
    print(f"B: {len(rep.regions)} region(s), {len(rep.fallbacks)} ops on llvm", flush=True)
    _, vm_b = compiled(part)
    x = tvm.runtime.tensor(pixels.numpy())
    sides = {"A": lambda: vm_a["main"](x), "B": lambda: vm_b["main"](x)}
    for side, call in sides.items():
        out = call()
        got = (out if hasattr(out, "numpy") else out[0]).numpy()
        print(f"{side}: max |y - torch| / max |torch| = {np.abs(got - want).max() / np.abs(want).max():.1e}")
    if args.openvino:
        import openvino as ov

        path = os.path.join(tempfile.mkdtemp(), "convnextv2_tiny.onnx")
        torch.onnx.export(model, (pixels,), path, input_names=["pixel_values"], output_names=["out"], dynamo=True)
        config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": str(args.threads),
                  "INFERENCE_PRECISION_HINT": "f32"}
        request = ov.Core().compile_model(path, "CPU", config).create_infer_request()
        feed = {"pixel_values": pixels.numpy()}
        sides["OpenVINO f32"] = lambda: request.infer(feed)
    t = interleaved(sides, args.model_calls, args.rounds)
    print("| ConvNeXt-V2-T 224x224 | " + " | ".join(f"{k} {v:.1f} ms" for k, v in t.items())
          + f" | B / A {t['B'] / t['A']:.2f}" + (f" | B / OpenVINO f32 {t['B'] / t['OpenVINO f32']:.2f}"
                                                 if "OpenVINO f32" in t else "") + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=60, help="calls per side per round (GRN alone)")
    ap.add_argument("--model-calls", type=int, default=10, help="calls per side per round (whole model)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", action="store_true", help="also the whole ConvNeXt-V2-T")
    ap.add_argument("--openvino", action="store_true", help="with --model: OpenVINO f32 in the same rounds")
    ap.add_argument("--skip-grn", action="store_true", help="only the whole model")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("TVM_NUM_THREADS", "2")))
    args = ap.parse_args()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"CPU: {cpu}; oneDNN ISA {bh._C.isa()}; load average {os.getloadavg()[0]:.1f}; "
          f"threads {args.threads} (TVM_NUM_THREADS / OMP_NUM_THREADS as set)")
    if not args.skip_grn:
        grn_alone(args)
    if args.model:
        whole_model(args)


if __name__ == "__main__":
    main()
