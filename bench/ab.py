"""A/B latency of two checkouts of byoc-hetero, measured side by side in one run.

    python3 bench/ab.py --a /path/to/old/tree --b /path/to/new/tree [--models resnet18,mlp] [--rounds 5]
    python3 bench/ab.py --a ... --b ... --models resnet50.onnx,vit_b_16.onnx   # ONNX files: bh.from_onnx

Each tree must hold a built extension (``byoc_hetero/_C*.so``, e.g. from
``cmake -S . -B build-dev -G Ninja && ninja -C build-dev _C && cp build-dev/_C*.so byoc_hetero/``).
Every (tree, model) measurement runs in its own process that imports ``byoc_hetero`` from that
tree, partitions the built-in model with ``bh.partition``, builds it and times one call (median of
``--repeat`` calls after a warm-up). Rounds alternate the order of A and B and pause between
measurements, so a load that drifts during the run falls on both alike. The table gives each
side's median over the rounds and the ratio B / A; the header gives the CPU and oneDNN's ISA.
Used to show a refactor leaves latency unchanged (issue 23): ratios within noise of 1.0.

Every measurement also digests what the tree computed, so one run shows behaviour unchanged too
(issue 38): the outputs of one call on seeded inputs (their bytes, sha256) and the plans of the
model's regions (``_C.plan_region`` of every region document, at the run's thread count: steps,
implementations, layouts, buffers, arena offsets). The columns ``outputs`` and ``plans`` say
``equal`` when A's and B's digests agree in every round, ``DIFFER`` when they do not, and
``unstable`` when one tree gave different digests in different rounds (then equality means nothing).
``--repeat 0`` digests without timing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

WORKLOADS = {
    "vgg11": {},
    "resnet18": {},
    "mobilenet_v2": {},
    "mlp": {},
}

WORKER = r"""
import hashlib, json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np, tvm
from tvm import relax
import byoc_hetero as bh
from byoc_hetero._relax import region_table
assert bh.__file__.startswith(sys.argv[1]), bh.__file__
name, repeat, threads = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if name.endswith(".onnx"):  # a model file (e.g. a zoo model exported once for both trees)
    mod, params = bh.from_onnx(name)
else:
    mod, params = getattr(bh.models, name)(batch=1)
part = bh.partition(mod, params)
ex = relax.build(part, target="llvm")
vm = relax.VirtualMachine(ex, tvm.cpu())
rng = np.random.default_rng(0)

def _arg(v):
    shape, dtype = [int(d) for d in v.ty.shape.values], str(v.ty.dtype)
    if dtype.startswith("int"):  # token ids, attention masks: 0 or 1 is valid for both
        return tvm.runtime.tensor(rng.integers(0, 2, shape).astype(dtype))
    return tvm.runtime.tensor(rng.standard_normal(shape).astype(dtype))

def _leaves(out):
    return [out] if hasattr(out, "numpy") else [x for o in out for x in _leaves(o)]

args = [_arg(v) for v in mod["main"].params if v.name not in params]
digest = hashlib.sha256()
for o in _leaves(vm["main"](*args)):
    a = o.numpy()
    digest.update(f"{a.dtype}{a.shape}".encode() + a.tobytes())
plans = hashlib.sha256()
regions = 0
for symbol, entry in sorted(region_table(part).items()):
    if entry.graph is None:
        continue
    try:
        plan = bh._C.plan_region(json.dumps(entry.graph), threads=threads)
    except Exception as e:  # a symbolic region needs shapes: its error's class stands for it
        plan = {"error": type(e).__name__}
    plans.update(symbol.encode() + json.dumps(plan, sort_keys=True).encode())
    regions += 1
for _ in range(3):
    vm["main"](*args)
times = []
for _ in range(repeat):
    t0 = time.perf_counter(); vm["main"](*args); times.append(time.perf_counter() - t0)
print(json.dumps({"median_ms": 1e3 * float(np.median(times)) if times else float("nan"),
                  "outputs": digest.hexdigest(), "plans": plans.hexdigest(), "regions": regions}))
"""


def _measure(tree: str, model: str, threads: int, repeat: int) -> dict:
    """One process: ``{median_ms, outputs, plans, regions}`` (the digests: see the module's doc)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TVM_NUM_THREADS=str(threads),
               BYOC_HETERO_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", WORKER, os.path.abspath(tree), model, str(repeat), str(threads)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _agreement(a_runs: list[dict], b_runs: list[dict], key: str) -> str:
    """``equal`` / ``DIFFER`` / ``unstable`` for one digest over all rounds of both sides."""
    a, b = {r[key] for r in a_runs}, {r[key] for r in b_runs}
    if len(a) > 1 or len(b) > 1:
        return "unstable"
    return "equal" if a == b else "DIFFER"


def _machine() -> str:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    isa = subprocess.run([sys.executable, "-c", "import byoc_hetero as bh; print(bh._C.isa())"],
                         capture_output=True, text=True).stdout.strip() or "unknown"
    return f"{model}; oneDNN ISA {isa}; load average {os.getloadavg()[0]:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="the reference tree")
    ap.add_argument("--b", required=True, help="the tree under test")
    ap.add_argument("--models", default=",".join(WORKLOADS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=50, help="timed calls per process (0: digests only)")
    ap.add_argument("--pause", type=float, default=1.0, help="seconds of rest before each measurement")
    args = ap.parse_args()
    print(f"# A/B: {args.a} vs {args.b}; {_machine()}; {args.threads} threads", flush=True)
    print("| model | A (ms) | B (ms) | B / A | rounds B/A | outputs | plans (regions) |\n"
          "|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        a_runs, b_runs = [], []
        for r in range(args.rounds):
            order = [("a", args.a), ("b", args.b)] if r % 2 == 0 else [("b", args.b), ("a", args.a)]
            for side, tree in order:
                time.sleep(args.pause)
                (a_runs if side == "a" else b_runs).append(_measure(tree, model, args.threads, args.repeat))
        a_ms, b_ms = [r["median_ms"] for r in a_runs], [r["median_ms"] for r in b_runs]
        per_round = " ".join(f"{b / a:.3f}" for a, b in zip(a_ms, b_ms))
        a_med, b_med = float(np.median(a_ms)), float(np.median(b_ms))
        print(f"| {model} | {a_med:.3f} | {b_med:.3f} | {b_med / a_med:.3f} | {per_round} | "
              f"{_agreement(a_runs, b_runs, 'outputs')} | {_agreement(a_runs, b_runs, 'plans')} "
              f"({b_runs[0]['regions']}) |", flush=True)


if __name__ == "__main__":
    main()
