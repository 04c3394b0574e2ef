"""Weight-only GEMV benchmark: the runtime's dense_wq kernels against oneDNN's float32 dense.

One-node regions built by hand (the runtime alone, no TVM build), at the shapes of SmolLM-135M's
decoder (K=576 -> N=1536, the MLP's up projection; K=1536 -> N=576, its down projection), M rows
(default 1: the decode step). Per shape: oneDNN's f32 ``dense`` (the node bh.partition writes for a
float weight), ``dense_wq`` int8 per output channel and in blocks of 32 with float16 scales (GGUF's Q8_0; also 64, 128),
int4 in groups of 32 symmetric with float32 and with float16 scales (Q4_0's form) and with zero points, each
with float32 activations and with int8 activations quantized per call (``--acts``; BYOC_HETERO_WQ_ACT).
The engines are timed interleaved (round-robin rounds of ``--calls`` calls, the median per call), each
with the GB/s of weights it streams (float32: 4 bytes a weight; the weight-only ones: codes plus
their scales and zero points as repacked: float32, but float16 scales stay 2 bytes for the int8-activation
kernels).

    python3 bench/weight_only.py                 # M = 1, the process's threads
    python3 bench/weight_only.py --rows 1,8,64 --threads 1
    python3 bench/weight_only.py --shapes 896x4864,4864x896 --mib 64 --isas auto,avx2 --acts int8

``--shapes KxN,...``: other layers (default SmolLM-135M's two above; Qwen2.5-0.5B's MLP is 896x4864 and
4864x896). ``--mib N``: each engine gets as many copies of its weights (separate modules) as fill N MiB and
the calls go round robin over them, so that each call streams its weights from memory as a decode step does
(the default, 0, calls one module: its weights stay in the caches between calls, a compute-bound figure).
``--panels 0,int``: the weight-only rows once per many-row form of dense_wq (BYOC_HETERO_WQ_PANELS: 0 the integer
tile kernels, 1 float panels, int the integer panel GEMM; from 16 rows, with ``--acts auto``).
``--isas``: the weight-only rows once per cap of our kernels' ISA switch (BYOC_HETERO_WQ_ISA, read when a
module is made: auto | avx512 | avx2 | generic). With ``--mib`` the report starts with the machine's read
bandwidth (bench/generate.py's probe: numpy, each of the threads on its share of 512 MiB) at the region's
thread count, and each row's GB/s of weights per wall second beside it. ``--variants Q8_0,Q4_0``: only the
weight-only rows whose name holds one of the words. ``--env NAME=a,b`` (repeatable): every engine once per value of
each such variable (all combinations; the variable set while its modules are made, where the runtime reads it), the
rows labelled with it: the same-process, interleaved A/B of a switch, e.g.
``--env BYOC_HETERO_HUGE_PAGES=0,1 --env BYOC_HETERO_WQ_PREFETCH=0,1024 --env BYOC_HETERO_WQ_VNNI=auto,off``.
With ``--mib`` each row also gives its wall GB/s as a percentage of the read bandwidth.

Prints ``lscpu``'s model name and oneDNN's ISA with the table. Results: bench/WEIGHT_ONLY.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # the bandwidth probe's threads are its own (--mib)
import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tvm  # noqa: E402

import byoc_hetero as bh  # noqa: E402
from byoc_hetero.quant.weight_only import quantize_matrix  # noqa: E402

SHAPES = ((576, 1536), (1536, 576))
create = tvm.get_global_func("byoc_hetero.runtime.create")


def _module(symbol: str, m: int, k: int, n: int, op: str, consts: list[np.ndarray], attrs: dict):
    tensors = [{"shape": [m, k]}] + [{"shape": list(c.shape), "dtype": str(c.dtype)} for c in consts]
    tensors.append({"shape": [m, n]})
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": symbol, "tensors": tensors, "inputs": [0],
           "outputs": [len(tensors) - 1],
           "constants": [{"tensor": i + 1, "name": f"{symbol}_{i}"} for i in range(len(consts))],
           "nodes": [{"op": op, "inputs": list(range(len(tensors) - 1)), "output": len(tensors) - 1, "attrs": attrs}]}
    mod = create(json.dumps(doc))
    mod[f"__init_{symbol}"]([tvm.runtime.tensor(c) for c in consts])
    fn = mod[symbol]
    # one call now: the plan (and the kernel's ISA, from the environment of this moment) is made here
    fn(tvm.runtime.tensor(np.zeros((m, k), np.float32)), tvm.runtime.tensor(np.zeros((m, n), np.float32)))
    return fn


VARIANTS = (("int8 per channel", 8, None, False, "float32"), ("int8 g32 f16 (Q8_0)", 8, 32, False, "float16"),
            ("int8 g64 f16", 8, 64, False, "float16"), ("int8 g128 f16", 8, 128, False, "float16"),
            ("int4 g32 f32 scales", 4, 32, False, "float32"), ("int4 g32 f16 (Q4_0)", 4, 32, False, "float16"),
            ("int4 g32 + zero points", 4, 32, True, "float32"))


def _copies(nbytes: int, mib: int) -> int:
    """How many copies of a weight of ``nbytes`` fill ``mib`` MiB (at least one)."""
    return max(1, -(-mib * 2**20 // max(nbytes, 1)))


def _env(name: str, value: str | None):
    """Set (or with None remove) an environment variable; returns the value it had."""
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    return before


def engines(m: int, k: int, n: int, rng: np.random.Generator, acts: list[str], isas: list[str] = ("auto",),
            mib: int = 0, variants: tuple = VARIANTS, panels: list[str] = ("0",)) -> dict[str, tuple]:
    """name -> (functions, bytes of weights one call streams); each weight-only variant once per activation
    mode of ``acts`` (BYOC_HETERO_WQ_ACT), ISA cap of ``isas`` (BYOC_HETERO_WQ_ISA) and many-row form of
    ``panels`` (BYOC_HETERO_WQ_PANELS), all read when the module is made; ``mib``: copies of each (separate
    modules, called round robin) filling that many MiB."""
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    f32 = [_module(f"f32c{c}", m, k, n, "dense", [w], {"weight_layout": "NK", "has_bias": 0})
           for c in range(_copies(w.nbytes, mib))]
    out = {"f32 dense (oneDNN)": (f32, w.nbytes)}
    before = {v: os.environ.get(v) for v in ("BYOC_HETERO_WQ_ACT", "BYOC_HETERO_WQ_ISA", "BYOC_HETERO_WQ_PANELS")}
    try:
        for isa, act, form in ((i, a, p) for i in isas for a in acts for p in panels):
            _env("BYOC_HETERO_WQ_ISA", isa)
            _env("BYOC_HETERO_WQ_ACT", act)
            _env("BYOC_HETERO_WQ_PANELS", form)
            for i, (name, bits, group, zp, scale_dtype) in enumerate(variants):
                codes = quantize_matrix(w, bits, group, zp, scale_dtype)
                consts = [codes.codes, codes.scales] + ([codes.zero_points] if zp else [])
                attrs = {"bits": bits, "block": codes.block, "has_zero_point": int(zp), "has_bias": 0}
                half = scale_dtype == "float16" and act != "f32"  # kept float16 by the int8-activation kernels
                streamed = codes.codes.nbytes + codes.scales.size * ((2 if half else 4) + (4 if zp else 0))
                fns = [_module(f"wq{i}{act}{isa}p{form}c{c}", m, k, n, "dense_wq", consts, attrs)
                       for c in range(_copies(streamed, mib))]
                label = (f"{name}, {act} act" + (f", {isa}" if len(isas) > 1 or isa != "auto" else "") +
                         (f", panels={form}" if len(panels) > 1 or form != "0" else ""))
                out[label] = (fns, streamed)
    finally:
        for name, value in before.items():
            _env(name, value)
    return out


def env_settings(specs: list[str]) -> list[dict[str, str]]:
    """``["NAME=a,b", "OTHER=c,d"]`` -> every combination as {NAME: a, OTHER: c}, ... ([{}] for none)."""
    axes = []
    for spec in specs:
        name, sep, values = spec.partition("=")
        if not sep or not name or not values:
            raise SystemExit(f"--env wants NAME=value[,value...], got {spec!r}")
        axes.append([(name, v) for v in values.split(",")])
    return [dict(combo) for combo in itertools.product(*axes)]


def engines_per_env(settings: list[dict[str, str]], *args, **kwargs) -> dict[str, tuple]:
    """:func:`engines` once per setting of ``settings`` (each variable set while the modules are made), the labels
    suffixed with the setting where there is more than one."""
    out = {}
    for env in settings:
        before = {name: _env(name, value) for name, value in env.items()}
        try:
            made = engines(*args, **kwargs)
        finally:
            for name, value in before.items():
                _env(name, value)
        suffix = " [" + " ".join(f"{k}={v}" for k, v in env.items()) + "]" if len(settings) > 1 else ""
        out.update({name + suffix: v for name, v in made.items()})
    return out


def time_all(fns: dict[str, tuple], x, y, rounds: int, calls: int) -> dict[str, tuple[float, float]]:
    """name -> (median wall seconds per call, median process CPU seconds per call), each engine's calls
    going round robin over its copies. On a loaded machine the CPU time (time.process_time: what this
    process's threads ran) is the steadier of the two; with one thread it is the kernel's own time plus
    the call's overhead."""
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, (copies, _) in fns.items():
            start, cpu = time.perf_counter(), time.process_time()
            for c in range(calls):
                copies[c % len(copies)](x, y)
            samples[name].append(((time.perf_counter() - start) / calls, (time.process_time() - cpu) / calls))
    return {name: (float(np.median([s[0] for s in v])), float(np.median([s[1] for s in v])))
            for name, v in samples.items()}


def read_bandwidth(threads: int) -> float:
    """The machine's read GB/s at ``threads`` threads (bench/generate.py's probe)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from generate import bandwidth_worker

    return bandwidth_worker(threads)["read_gbs"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1", help="comma-separated M values (default 1)")
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES), help="comma-separated KxN layers")
    ap.add_argument("--threads", type=int, default=0, help="region threads (default: the process's)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--acts", default="f32,int8", help="dense_wq activation modes (BYOC_HETERO_WQ_ACT values)")
    ap.add_argument("--isas", default="auto", help="our kernels' ISA caps (BYOC_HETERO_WQ_ISA values)")
    ap.add_argument("--panels", default="0", help="dense_wq's many-row forms (BYOC_HETERO_WQ_PANELS values: 0,1,int)")
    ap.add_argument("--mib", type=int, default=0, help="weights of each engine's copies, MiB (0: one module)")
    ap.add_argument("--variants", default="", help="comma-separated words; only the weight-only rows whose name has one")
    ap.add_argument("--env", action="append", default=[], help="NAME=a,b: every engine once per value (repeatable)")
    args = ap.parse_args()
    settings = env_settings(args.env)
    if args.threads:
        bh._C.set_num_threads(args.threads)
    model = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in model.splitlines() if line.startswith("Model name")), "?")
    print(f"# {model}; oneDNN {bh._C.onednn_version()} ISA {bh._C.isa()}; {bh._C.num_threads()} threads; "
          f"BYOC_HETERO_WQ_ISA={os.environ.get('BYOC_HETERO_WQ_ISA', 'auto')}; load average {os.getloadavg()[0]:.1f}")
    bandwidth = read_bandwidth(bh._C.num_threads()) if args.mib else 0.0
    if args.mib:
        print(f"# read bandwidth (numpy, {bh._C.num_threads()} threads): {bandwidth:.1f} GB/s; "
              f"each engine's calls round robin over copies of >= {args.mib} MiB of weights")
    print("| M | K -> N | weights | wall us / call | CPU us / call | GB/s of weights (wall) | "
          "GB/s of weights (CPU time) | vs f32 (CPU time) |" + (" % of read bandwidth (wall) |" if args.mib else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if args.mib else ""))
    rng = np.random.default_rng(0)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    words = [w for w in args.variants.split(",") if w]
    variants = tuple(v for v in VARIANTS if not words or any(w in v[0] for w in words))
    for m in (int(r) for r in args.rows.split(",")):
        for k, n in shapes:
            fns = engines_per_env(settings, m, k, n, rng, args.acts.split(","), args.isas.split(","), args.mib,
                                  variants, args.panels.split(","))
            x = tvm.runtime.tensor(rng.standard_normal((m, k)).astype(np.float32))
            y = tvm.runtime.tensor(np.zeros((m, n), np.float32))
            times = time_all(fns, x, y, args.rounds, args.calls)
            base = next(v for name, v in times.items() if name.startswith("f32 dense"))[1]
            for name, (_, streamed) in fns.items():
                wall, cpu = times[name]
                share = f" {streamed / wall / 1e9 / bandwidth * 100:.0f}% |" if bandwidth else ""
                print(f"| {m} | {k} -> {n} | {name} | {wall * 1e6:.1f} | {cpu * 1e6:.1f} | {streamed / wall / 1e9:.1f} | "
                      f"{streamed / cpu / 1e9:.1f} | {base / cpu:.2f}x |{share}")


if __name__ == "__main__":
    main()
