"""The float32 dense of few rows, our GEMV (cpp/kernels/dense_gemv.h) against oneDNN's matmul, side by side in one
process: one-node dense regions at the SmolLM-135M decoder's shapes, the same weights, made once with
``BYOC_HETERO_GEMV_ROWS=0`` (oneDNN) and once with it at the row count (ours), called interleaved.  Each engine
gets enough copies of the weight to exceed the last-level cache (``--mib``), called round-robin, so that every
call streams its weight from memory as a decode step does.

    PYTHONPATH=. python bench/gemv.py             # M = 1, 2, 4, 8 at 1 and 2 threads
    PYTHONPATH=. python bench/gemv.py --rows 1 --threads 1 --reps 50
    ONEDNN_MAX_CPU_ISA=AVX2 BYOC_HETERO_GEMV_ISA=avx2 PYTHONPATH=. python bench/gemv.py --layout prefill --shapes qwen

``--layout prefill`` builds ours with ``BYOC_HETERO_GEMV_LAYOUT=prefill`` (where the matmul keeps the weight plain,
without AVX-512: the prefill inner product's panels at 2 threads, the [N, K] rows at 1), ``--layout rows`` with
``rows`` (the rows at every thread count); ``--shapes qwen`` takes Qwen2.5-0.5B's shapes.

Prints microseconds per call (the median of ``--reps`` rounds over the copies), the GB/s of weight it streams,
oneDNN / ours, and numpy's one-thread read of the same copies (``w.sum()``) in the same rounds.  Not part of the tests: it asserts nothing (tests/test_gemv.py checks the numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

import numpy as np
import tvm

import byoc_hetero as bh

# SmolLM-135M (hidden 576, 9 heads / 3 kv heads of 64, MLP 1536): q/o, k/v, gate/up, down (K, N)
SHAPES = {"q_proj/o_proj": (576, 576), "k_proj/v_proj": (576, 192), "gate/up": (576, 1536), "down": (1536, 576)}
# Qwen2.5-0.5B (hidden 896, 14 heads / 2 kv heads of 64, MLP 4864)
QWEN_SHAPES = {"q_proj/o_proj": (896, 896), "k_proj/v_proj": (896, 128), "gate/up": (896, 4864), "down": (4864, 896)}
create = tvm.get_global_func("byoc_hetero.runtime.create")


def _module(m: int, k: int, n: int, w: np.ndarray, gemv_rows: int, threads: int, layout: str = "matmul"):
    """One dense region (weight [N, K] constant, M rows) planned with BYOC_HETERO_GEMV_ROWS = gemv_rows and
    BYOC_HETERO_GEMV_LAYOUT = layout."""
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "g",
           "tensors": [{"shape": [m, k], "dtype": "float32"}, {"shape": [n, k], "dtype": "float32"},
                       {"shape": [m, n], "dtype": "float32"}],
           "inputs": [0], "outputs": [2], "constants": [{"tensor": 1, "name": "g_w"}],
           "nodes": [{"op": "dense", "inputs": [0, 1], "output": 2, "attrs": {"weight_layout": "NK"}}]}
    os.environ["BYOC_HETERO_GEMV_ROWS"] = str(gemv_rows)
    os.environ["BYOC_HETERO_NUM_THREADS"] = str(threads)
    os.environ["BYOC_HETERO_GEMV_LAYOUT"] = layout
    mod = create(json.dumps(doc))
    assert mod["__init_g"]([tvm.runtime.tensor(w)]) == 0
    plan = " ".join(mod["get_plan"]())
    return mod, ": gemv (" in plan


def _numpy_read_us(weights, reps: int) -> float:
    """numpy's one-thread read of the same weight copies (``w.sum()``), per copy: the reference bandwidth."""
    times = []
    for _ in range(max(1, reps // 3)):
        t0 = time.perf_counter()
        for w in weights:
            w.sum()
        times.append((time.perf_counter() - t0) / len(weights))
    return float(np.median(times)) * 1e6


def _median_us(mods, x, out, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for mod in mods:
            mod["g"](x, out)
        times.append((time.perf_counter() - t0) / len(mods))
    return float(np.median(times)) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--mib", type=float, default=96.0, help="weight bytes per engine and shape, above the LLC")
    ap.add_argument("--layout", default="matmul",
                    help="BYOC_HETERO_GEMV_LAYOUT of ours, comma-separated for several of ours interleaved (without "
                         "AVX-512, prefill: the 2-thread prefill inner product's panels, at 1 thread the rows; rows: "
                         "the sgemm's [N, K] rows)")
    ap.add_argument("--shapes", default="smollm", choices=["smollm", "qwen"])
    args = ap.parse_args(argv)
    layouts = args.layout.split(",")
    cpu = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if ln.startswith("Model name")), "cpu ?")
    print(f"{cpu}, oneDNN ISA {bh._C.isa()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print("| shape | K x N | M | threads | oneDNN us | " + " | ".join(f"ours ({lay}) us" for lay in layouts) +
          " | oneDNN GB/s | " + " | ".join(f"ours ({lay}) GB/s | oneDNN / ours ({lay})" for lay in layouts) +
          " | numpy 1-thread read GB/s |")
    print("|---" * (7 + 3 * len(layouts)) + "|")
    rng = np.random.default_rng(0)
    for threads in [int(t) for t in args.threads.split(",")]:
        for name, (k, n) in (QWEN_SHAPES if args.shapes == "qwen" else SHAPES).items():
            copies = max(1, int(args.mib * 2**20 / (4 * k * n)))
            weights = [rng.standard_normal((n, k)).astype(np.float32) for _ in range(copies)]
            for m in [int(r) for r in args.rows.split(",")]:
                x = tvm.runtime.tensor(rng.standard_normal((m, k)).astype(np.float32))
                out = tvm.runtime.tensor(np.zeros((m, n), np.float32))
                engines = [[_module(m, k, n, w, 0, threads)[0] for w in weights]]
                for lay in layouts:
                    built = [_module(m, k, n, w, max(m, 1), threads, lay) for w in weights]
                    missing = [i for i, (mod, g) in enumerate(built) if not g]
                    assert not missing, f"no GEMV in copies {missing}: {list(built[missing[0]][0]['get_plan']())}"
                    engines.append([mod for mod, _ in built])
                times = [[] for _ in engines]
                t_numpy = []
                for _ in range(3):  # interleaved rounds
                    for engine, t in zip(engines, times):
                        t.append(_median_us(engine, x, out, args.reps))
                    t_numpy.append(_numpy_read_us(weights, args.reps))
                best = [min(t) for t in times]
                gb = 4 * k * n / 1e3
                print(f"| {name} | {k} x {n} | {m} | {threads} | " + " | ".join(f"{b:.1f}" for b in best) +
                      f" | {gb / best[0]:.1f} | " + " | ".join(f"{gb / b:.1f} | {best[0] / b:.2f}x" for b in best[1:]) +
                      f" | {gb / min(t_numpy):.1f} |", flush=True)
                del engines
    os.environ.pop("BYOC_HETERO_GEMV_ROWS", None)
    os.environ.pop("BYOC_HETERO_GEMV_LAYOUT", None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
