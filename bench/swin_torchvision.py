"""torchvision's Swin-T / Swin-V2-T (random weights, 224x224): regions, ops left on llvm and latency
through ``bh.from_torch`` and ``bh.from_onnx`` of torch's default exporter's file, next to torch eager
and ONNX Runtime on the same file (issue 39 item 1; results in bench/ZOO.md).

    python bench/swin_torchvision.py [--models swin_t,swin_v2_t] [--paths from_torch,from_onnx_dynamo]
                                     [--threads 2] [--min-time 1.0] [--size 224] [--profile 0] [--ours-only]

``--ab N``: after each row, a same-process A/B of the region with its slices copied (the default)
against viewed in place (``BYOC_HETERO_SLICE_VIEWS=on`` when planned): two partitions and
builds of the imported module, timed in N interleaved rounds (alternating which goes first), medians and the
ratio copied / viewed (> 1: the views are faster); also each build's slice steps and planner copies.

``--profile N``: after each row, the region's per-step profile over N calls (``set_profiling``),
grouped by op and implementation (a planner copy between layouts is op ``(copy)``): steps per call,
ms per call and share of the region's time. ``--ours-only``: no torch eager / ONNX Runtime timing (and no
ONNX file unless a path needs it).

torchvision is imported with its C++ operators stubbed out (bench/zoo_models.py's way); OpenVINO is used
when installed. Latency: median of the calls made in at least ``--min-time`` seconds, in ms.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zoo_models import SEED  # noqa: E402 - importing it stubs torchvision's C++ operators


def _median_ms(fn, min_time: float) -> float:
    fn()  # warm-up
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < min_time or len(times) < 3:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times))


def _profile(vm, regions: list, inp, calls: int) -> None:
    """Print the regions' run steps over ``calls`` calls, grouped by (op, implementation)."""
    import json

    for region in regions:
        region["set_profiling"](True)
        region["reset_profile"]()
    for _ in range(calls):
        vm["main"](inp)
    groups: dict[tuple[str, str], list[float]] = {}
    for region in regions:
        for step in json.loads(str(region["get_profile"]())):
            if step["phase"] != "run":
                continue
            key = (step["op"] or "(copy)", step["impl"])
            entry = groups.setdefault(key, [0, 0.0])
            entry[0] += 1
            entry[1] += step["seconds"] / max(step["calls"], 1)
        region["set_profiling"](False)
    total = sum(ms for _n, ms in groups.values()) or 1.0
    print("\n| op | impl | steps | ms / call | share |\n|---|---|---|---|---|")
    for (op, impl), (n, sec) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"| {op} | {impl} | {n} | {1e3 * sec:.2f} | {100 * sec / total:.1f}% |")
    print(f"| all | | {sum(n for n, _ in groups.values())} | {1e3 * total:.2f} | 100% |\n", flush=True)


def _ab(mod, params, inp, rounds: int, min_time: float) -> None:
    """Slices copied (A) against viewed (B) in one process: two partitions and builds of ``mod`` (the
    regions are planned when the partition's codegen makes them), each with BYOC_HETERO_SLICE_VIEWS set
    for it, then timed in interleaved rounds."""
    import json

    import tvm
    from tvm import relax

    import byoc_hetero as bh

    sides = {}
    for side, knob in (("copied", "off"), ("viewed", "on")):
        os.environ["BYOC_HETERO_SLICE_VIEWS"] = knob
        ex = relax.build(bh.partition(mod, params), target="llvm")
        vm = relax.VirtualMachine(ex, tvm.cpu())
        regions = bh.codegen.region_modules(ex)
        for region in regions:
            region["set_profiling"](True)
        vm["main"](inp)  # plans the regions under this side's knob
        steps = [st for r in regions for st in json.loads(str(r["get_profile"]())) if st["phase"] == "run"]
        for region in regions:
            region["set_profiling"](False)
        ops = [st["op"] for st in steps]
        print(f"{side}: {len(steps)} run steps, {ops.count('slice')} slice steps, {ops.count('')} planner copies")
        sides[side] = (vm, [])
    os.environ.pop("BYOC_HETERO_SLICE_VIEWS")
    for r in range(rounds):
        for side in (("copied", "viewed") if r % 2 == 0 else ("viewed", "copied")):
            vm, times = sides[side]
            times.append(_median_ms(lambda: vm["main"](inp), min_time))
    a, b = (float(np.median(sides[s][1])) for s in ("copied", "viewed"))
    print(f"A/B over {rounds} rounds: copied {a:.2f} ms, viewed {b:.2f} ms, copied / viewed {a / b:.3f}x "
          f"(rounds: copied {[round(t, 2) for t in sides['copied'][1]]}, viewed {[round(t, 2) for t in sides['viewed'][1]]})",
          flush=True)


def _model(name: str):
    import torch
    import torchvision

    torch.manual_seed(SEED)
    return getattr(torchvision.models, name)(weights=None).eval()


def main() -> None:
    import torch
    import tvm
    from tvm import relax

    import byoc_hetero as bh

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="swin_t,swin_v2_t")
    ap.add_argument("--paths", default="from_torch,from_onnx_dynamo")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--profile", type=int, default=0, help="calls to profile per step after each row (0: none)")
    ap.add_argument("--ours-only", action="store_true", help="time only our build (no eager, no ONNX Runtime)")
    ap.add_argument("--ab", type=int, default=0, help="rounds of the slices copied / viewed A/B after each row (0: none)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    print("| model | path | regions | ops on llvm | ours (ms) | torch eager (ms) | ONNX Runtime (ms) | rel. error |")
    print("|---|---|---|---|---|---|---|---|")
    workdir = tempfile.mkdtemp()
    for name in args.models.split(","):
        model = _model(name)
        x = torch.randn(1, 3, args.size, args.size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            want = model(x).numpy()
            eager = float("nan") if args.ours_only else _median_ms(lambda: model(x), args.min_time)
        onnx_path = os.path.join(workdir, f"{name}.onnx")
        if not args.ours_only or args.paths != "from_torch":
            torch.onnx.export(_model(name), (x,), onnx_path, input_names=["x"], output_names=["y"])
        ort = "-"
        try:
            if args.ours_only:
                raise ImportError("not asked for")
            import onnxruntime as ort_

            so = ort_.SessionOptions()
            so.intra_op_num_threads = args.threads
            sess = ort_.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
            ort = f"{_median_ms(lambda: sess.run(None, {'x': x.numpy()}), args.min_time):.1f}"
        except ImportError:
            pass
        for path in args.paths.split(","):
            mod, params = bh.from_torch(model, (x,)) if path == "from_torch" else bh.from_onnx(onnx_path)
            part = bh.partition(mod, params)
            rep = bh.report(part)
            ex = relax.build(part, target="llvm")
            vm = relax.VirtualMachine(ex, tvm.cpu())
            inp = tvm.runtime.tensor(x.numpy())
            out = vm["main"](inp)
            got = (out if hasattr(out, "numpy") else out[0]).numpy()
            err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            ours = _median_ms(lambda: vm["main"](inp), args.min_time)
            print(f"| {name} | {path} | {len(rep.regions)} | {len(rep.fallbacks)} | {ours:.1f} | {eager:.1f} | {ort} "
                  f"| {err:.1e} |", flush=True)
            if args.profile:
                _profile(vm, bh.codegen.region_modules(ex), inp, args.profile)
            if args.ab:
                _ab(mod, params, inp, args.ab, args.min_time)


if __name__ == "__main__":
    main()
