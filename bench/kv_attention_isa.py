"""kv_attention's row implementations side by side: the decode step's attention of one layer (one new row,
grouped-query heads, a cache of ``context`` positions) through the packed function, per ISA cap
(``BYOC_HETERO_KV_ISA`` = generic / avx2 / avx512), in one process, interleaved.

    python bench/kv_attention_isa.py                       # SmolLM-135M and Llama-3.2-1B head shapes
    python bench/kv_attention_isa.py --contexts 128,1024 --reps 200
    python bench/kv_attention_isa.py --prefill 128,1024 --reps 5    # a prefill's rows: rows, blocked, wide forms

Prints microseconds per call (the fastest call of ``--rounds`` x ``--reps``) and the speedup over generic. Not part of the
tests: it asserts nothing (the tests check each ISA against numpy).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time

import numpy as np
import tvm

import byoc_hetero as bh

SHAPES = {"smollm_135m": (9, 3, 64), "qwen2_0_5b": (14, 2, 64), "llama_1b": (32, 8, 64)}  # query heads, kv heads, head_dim
ISAS = ("generic", "avx2", "avx512")


def _args(heads: int, kv_heads: int, dim: int, context: int):
    rng = np.random.default_rng(0)
    f = lambda *s: tvm.runtime.tensor(rng.standard_normal(s).astype("float32"))  # noqa: E731
    length = context + 1
    inv = (1.0 / 10000 ** (np.arange(0, dim, 2) / dim)).astype("float32")
    return [f(1, 1, heads, dim), f(1, 1, kv_heads, dim), f(1, 1, kv_heads, dim), f(1, kv_heads, length, dim),
            f(1, kv_heads, length, dim), tvm.runtime.tensor(np.array([context], "int64")),
            tvm.runtime.tensor(np.array([1], "int64")), tvm.runtime.tensor(inv), dim ** -0.5, 0, 1.0]


def _prefill_args(heads: int, kv_heads: int, dim: int, rows: int):
    """One layer's prefill of ``rows`` new rows from an empty cache."""
    rng = np.random.default_rng(0)
    f = lambda *s: tvm.runtime.tensor(rng.standard_normal(s).astype("float32"))  # noqa: E731
    inv = (1.0 / 10000 ** (np.arange(0, dim, 2) / dim)).astype("float32")
    return [f(1, rows, heads, dim), f(1, rows, kv_heads, dim), f(1, rows, kv_heads, dim), f(1, kv_heads, rows, dim),
            f(1, kv_heads, rows, dim), tvm.runtime.tensor(np.array([0], "int64")),
            tvm.runtime.tensor(np.array([rows], "int64")), tvm.runtime.tensor(inv), dim ** -0.5, 0, 1.0]


PREFILL_FORMS = {"rows": {"BYOC_HETERO_KV_PREFILL": "rows"},
                 "blocked": {"BYOC_HETERO_KV_PREFILL": "blocked", "BYOC_HETERO_KV_TILES": "narrow"},
                 "wide": {"BYOC_HETERO_KV_PREFILL": "blocked", "BYOC_HETERO_KV_TILES": "wide"}}
"""A prefill's forms: the per-row one, the blocked one with its narrow score tiles (8 vectors x 16 keys) and with
its wide ones (8 x 48)."""


def _prefill_table(fn, lengths: list[int], reps: int, rounds: int) -> None:
    """The prefill forms (PREFILL_FORMS) on a prefill's rows, interleaved (the CPU's best ISA); GFLOP/s counts the
    causal products (2 * 2 * dim multiply-adds per query head and key it sees)."""
    forms = tuple(PREFILL_FORMS)
    print("| shape | heads / kv / dim | rows | " + " | ".join(f"{f} ms" for f in forms) + " | rows / blocked | "
          "blocked / wide | wide GFLOP/s |")
    print("|---|---|---|" + "---|" * (len(forms) + 3))
    saved = {n: os.environ.get(n) for env in PREFILL_FORMS.values() for n in env}
    for name, (heads, kv_heads, dim) in SHAPES.items():
        for rows in lengths:
            call = _prefill_args(heads, kv_heads, dim, rows)
            best = {f: float("inf") for f in forms}
            for _ in range(rounds):
                for form in forms:
                    os.environ.update(PREFILL_FORMS[form])
                    best[form] = min(best[form], _best_us(fn, call, reps) / 1e3)
            flops = 4.0 * dim * heads * rows * (rows + 1) / 2
            print(f"| {name} | {heads} / {kv_heads} / {dim} | {rows} | " + " | ".join(f"{best[f]:.2f}" for f in forms)
                  + f" | {best['rows'] / best['blocked']:.2f}x | {best['blocked'] / best['wide']:.2f}x | "
                  f"{flops / best['wide'] / 1e6:.0f} |")
    for n, value in saved.items():
        if value is None:
            os.environ.pop(n, None)
        else:
            os.environ[n] = value


def _best_us(fn, args, reps: int) -> float:
    """The fastest of ``reps`` calls (the least disturbed one: these machines are shared)."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="128,1024")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prefill", default="", help="prompt lengths: time a prefill's forms instead of the ISAs")
    args = ap.parse_args(argv)
    fn = tvm.get_global_func("byoc_hetero.runtime.kv_attention")
    cpu = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if ln.startswith("Model name")), "cpu ?")
    print(f"{cpu}, oneDNN ISA {bh._C.isa()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    if args.prefill:
        _prefill_table(fn, [int(n) for n in args.prefill.split(",")], args.reps, args.rounds)
        return 0
    print("| shape | heads / kv / dim | context | " + " | ".join(f"{i} us" for i in ISAS) + " | avx512 / generic |")
    print("|---|---|---|" + "---|" * (len(ISAS) + 1))
    for name, (heads, kv_heads, dim) in SHAPES.items():
        for context in (int(c) for c in args.contexts.split(",")):
            call = _args(heads, kv_heads, dim, context)
            best = {isa: float("inf") for isa in ISAS}
            for _ in range(args.rounds):
                for isa in ISAS:
                    os.environ["BYOC_HETERO_KV_ISA"] = isa
                    best[isa] = min(best[isa], _best_us(fn, call, args.reps))
            cells = " | ".join(f"{best[i]:.1f}" for i in ISAS)
            print(f"| {name} | {heads} / {kv_heads} / {dim} | {context} | {cells} | "
                  f"{best['generic'] / best['avx512']:.2f}x |")
    os.environ.pop("BYOC_HETERO_KV_ISA", None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
