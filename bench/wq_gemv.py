"""dense_wq's int8 decode GEMV (M = 1..4) per output channel against blocks of 32 (Q8_0's format: int8 codes, a
float16 scale per 32 k), side by side in one process: one-node dense_wq regions at Qwen2.5-0.5B's shapes, each
variant given enough copies of the weight to exceed the last-level cache (``--mib``), so that every call streams its
codes from memory as a decode step does; the variants' calls alternate call by call (copy c of each in turn), so
that the machine's load falls on all of them alike.

    PYTHONPATH=. python bench/wq_gemv.py                               # per channel vs g32, M = 1, 2 threads
    PYTHONPATH=. python bench/wq_gemv.py --variants pc,g32,g32:BYOC_HETERO_WQ_BLOCK32=on

A variant is ``pc`` (per channel, float32 scales, as ``weights="int8"``), ``g32`` (``group_size=32``, float16
scales) or ``q4`` (int4, blocks of 32, float16 scales: ``weights="int4"``, llama.cpp's Q4_0), optionally with
``:VAR=value`` environment settings, set while its modules are made and around each of its calls (a module re-plans
at its first calls for the thread count it runs with, reading the plan-time switches again).  Prints microseconds
per call (the median of the calls, each timed alone), the GB/s of codes + scales streamed, and each variant's time
over the first's.  Not a test: it asserts only that the variants of one kind (switches that must not change a
value) give the same outputs bit for bit.
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
from byoc_hetero.quant.weight_only import quantize_matrix

# Qwen2.5-0.5B (hidden 896, MLP 4864, vocab 151936): (K, N)
SHAPES = {"q/o": (896, 896), "gate_up": (896, 9728), "down": (4864, 896), "lm_head": (896, 151936)}
create = tvm.get_global_func("byoc_hetero.runtime.create")


class _Env:
    """The variant's environment for the duration of a with block (the module re-plans at its first calls for the
    thread count it runs with, reading the plan-time switches again: they must be set around every call)."""

    def __init__(self, env: dict[str, str]):
        self.env = env

    def __enter__(self):
        self.saved = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)

    def __exit__(self, *exc):
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _module(m: int, codes, threads: int, env: dict[str, str]):
    """One dense_wq region for the codes, planned with the variant's environment."""
    n, k = codes.shape
    consts = [codes.codes, codes.scales]
    tensors = [{"shape": [m, k], "dtype": "float32"}]
    tensors += [{"shape": list(c.shape), "dtype": str(c.dtype)} for c in consts]
    tensors.append({"shape": [m, n], "dtype": "float32"})
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "g", "tensors": tensors, "inputs": [0],
           "outputs": [3], "constants": [{"tensor": i + 1, "name": f"g_c{i}"} for i in range(2)],
           "nodes": [{"op": "dense_wq", "inputs": [0, 1, 2], "output": 3,
                      "attrs": {"bits": codes.bits, "block": codes.block, "has_zero_point": 0, "has_offset": 0,
                                "has_bias": 0}}]}
    os.environ["BYOC_HETERO_NUM_THREADS"] = str(threads)
    with _Env(env):
        mod = create(json.dumps(doc))
        assert mod["__init_g"]([tvm.runtime.tensor(np.ascontiguousarray(c)) for c in consts]) == 0
    return mod


def _parse(variant: str) -> tuple[str, int | None, dict[str, str]]:
    kind, *sets = variant.split(":")
    if kind not in ("pc", "g32", "q4"):
        raise SystemExit(f"unknown variant {variant!r}: expected pc, g32 or q4[:VAR=value...]")
    env = dict(s.split("=", 1) for s in sets)
    return variant, kind, env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="pc,g32")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rows", default="1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--verbose", action="store_true", help="print each variant's run step")
    ap.add_argument("--min", action="store_true", help="the 10th percentile of the calls instead of their median")
    ap.add_argument("--mib", type=float, default=160.0, help="code bytes per variant and shape, above the LLC")
    args = ap.parse_args(argv)
    cpu = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if ln.startswith("Model name")), "cpu ?")
    print(f"{cpu}, oneDNN ISA {bh._C.isa()}, {args.threads} threads, load average {os.getloadavg()[0]:.2f}")
    variants = [_parse(v) for v in args.variants.split(",")]
    print("| shape | K x N | M | " + " | ".join(f"{v[0]} us | GB/s" for v in variants) + " | "
          + " | ".join(f"{v[0]} / {variants[0][0]}" for v in variants[1:]) + " |")
    rng = np.random.default_rng(0)
    for name in args.shapes.split(","):
        k, n = SHAPES[name]
        copies = max(1, int(args.mib * 2**20 / (k * n)))
        weights = [rng.standard_normal((n, k)).astype(np.float32) * 0.05 for _ in range(min(copies, 2))]
        for m in [int(r) for r in args.rows.split(",")]:
            x = tvm.runtime.tensor(rng.standard_normal((m, k)).astype(np.float32))
            outs, mods, nbytes = [], [], []
            for _, kind, env in variants:
                bits, block = {"pc": (8, None), "g32": (8, 32), "q4": (4, 32)}[kind]
                codes = [quantize_matrix(w, bits, block, False, "float32" if block is None else "float16")
                         for w in weights]
                mods.append([_module(m, codes[i % len(codes)], args.threads, env) for i in range(copies)])
                nbytes.append(codes[0].codes.nbytes + codes[0].scales.nbytes)
                del codes
            out = tvm.runtime.tensor(np.zeros((m, n), np.float32))
            first: dict[str, np.ndarray] = {}  # per kind, its first variant's output: the others' bit for bit
            for (name_, kind, env), ms in zip(variants, mods):
                with _Env(env):
                    ms[0]["g"](x, out)
                    plan = [line for line in ms[0]["get_plan"]() if line.startswith("run")]
                if args.verbose:
                    print(f"{name_}: {plan}")
                got = out.numpy().copy()
                ref = first.setdefault(kind, got)
                assert np.array_equal(got, ref), f"{name_} differs from {kind}'s first variant"
            # call by call, the variants alternating (copy c of each in turn): the machine's load falls on all alike
            times = [[] for _ in variants]
            for _ in range(args.reps):
                for c in range(copies):
                    for i, ms in enumerate(mods):
                        with _Env(variants[i][2]):
                            t0 = time.perf_counter()
                            ms[c]["g"](x, out)
                            times[i].append(time.perf_counter() - t0)
            us = [float(np.median(t) if not args.min else np.percentile(t, 10)) * 1e6 for t in times]
            cells = " | ".join(f"{u:.1f} | {b / u / 1e3:.1f}" for u, b in zip(us, nbytes))
            ratios = " | ".join(f"{u / us[0]:.3f}" for u in us[1:])
            print(f"| {name} | {k} x {n} | {m} | {cells} | {ratios} |", flush=True)
            del mods
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
