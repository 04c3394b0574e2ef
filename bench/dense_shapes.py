"""A decoder layer's float32 denses at a prefill's rows, one region each, as the runtime plans them: time per call,
GFLOP/s against a large square dense (the practical f32 peak of this machine's threads), and side-by-side forms.

    PYTHONPATH=. python bench/dense_shapes.py                      # Qwen2.5-0.5B's shapes, M = 1024
    PYTHONPATH=. python bench/dense_shapes.py --hf /tmp/gen/qwen2_0_5b/hf --rows 1024,128 --rounds 7

Rows: q, k, v (with their biases), o, gate (silu post-op), up (the GLU product as its binary post-op, as
``fold_gate_products`` makes it), down; ``square``: an ``S x S x S`` dense (``--square``). Each is one region
(``byoc_hetero.runtime.create``, the weight a constant prepared once). Then the A/B ``qkv``: the three biased
projections as three denses (``separate``) against one ``[K, q + 2 kv]`` dense with the three biases concatenated and
three slices of its output (``combined``: what ``BYOC_HETERO_COMBINE_BIASES=1`` makes of Qwen2's step), the two
called alternately, ``--rounds`` rounds of ``--reps`` calls each. Prints per row the minimum and median time of a
round's mean call, and for the A/B the ratio of the medians. A loaded machine's times are loaded: read the ratio of
the forms timed side by side. ``--primitives``: per dense the inner product (the default from 64 rows) against
oneDNN's matmul (``BYOC_HETERO_DENSE_IP=off``), interleaved. Asserts nothing.
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

create = tvm.get_global_func("byoc_hetero.runtime.create")
# Qwen2.5-0.5B: hidden 896, 14 heads / 2 kv heads of 64, MLP 4864
QWEN_05B = {"hidden": 896, "q": 896, "kv": 128, "intermediate": 4864}


def _region(m: int, k: int, outs: list[tuple[int, bool, dict]], rng, slices: list[int] | None = None):
    """One region of denses of ``x [m, k]``: per entry (N, bias, extra attrs) a dense; ``slices``: the single
    dense's output cut into parts of these widths (its outputs). Returns (module, inputs, outputs)."""
    tensors = [{"shape": [m, k], "dtype": "float32"}]
    nodes, constants, values, outputs, gates = [], [], [], [], []
    for j, (n, bias, attrs) in enumerate(outs):
        ins = [0]
        for name, shape in (("w", [n, k]), ("b", [n]) if bias else (None, None)):
            if name is None:
                continue
            tensors.append({"shape": shape, "dtype": "float32"})
            constants.append({"tensor": len(tensors) - 1, "name": f"g_{name}{j}"})
            values.append((0.05 * rng.standard_normal(shape)).astype(np.float32))
            ins.append(len(tensors) - 1)
        if attrs.get("has_gate"):
            tensors.append({"shape": [m, n], "dtype": "float32"})
            gates.append(len(tensors) - 1)
            ins.append(len(tensors) - 1)
        tensors.append({"shape": [m, n], "dtype": "float32"})
        nodes.append({"op": "dense", "inputs": ins, "output": len(tensors) - 1,
                      "attrs": {"weight_layout": "NK", "has_bias": int(bias), **attrs}})
        outputs.append(len(tensors) - 1)
    if slices:
        wide, outputs, offset = outputs[0], [], 0
        for width in slices:
            tensors.append({"shape": [m, width], "dtype": "float32"})
            nodes.append({"op": "slice", "inputs": [wide], "output": len(tensors) - 1, "attrs": {"begin": [0, offset]}})
            outputs.append(len(tensors) - 1)
            offset += width
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "g", "tensors": tensors, "inputs": [0, *gates],
           "outputs": outputs, "constants": constants, "nodes": nodes}
    mod = create(json.dumps(doc))
    assert mod["__init_g"]([tvm.runtime.tensor(v) for v in values]) == 0
    args = [tvm.runtime.tensor(rng.standard_normal(tensors[i]["shape"]).astype(np.float32)) for i in [0, *gates]]
    args += [tvm.runtime.tensor(np.zeros(tensors[i]["shape"], np.float32)) for i in outputs]
    mod["g"](*args)  # planned (under the variables set now) and warmed
    return mod, args


def _round(case, reps: int) -> float:
    mod, args = case
    t0 = time.perf_counter()
    for _ in range(reps):
        mod["g"](*args)
    return (time.perf_counter() - t0) / reps


def _shapes(args) -> dict:
    if not args.hf:
        return QWEN_05B
    config = json.load(open(os.path.join(args.hf, "config.json")))
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return {"hidden": config["hidden_size"], "q": config["num_attention_heads"] * dim,
            "kv": config.get("num_key_value_heads", config["num_attention_heads"]) * dim,
            "intermediate": config["intermediate_size"]}


def _cases(s: dict, m: int, square: int, rng) -> dict:
    """name -> (FLOP per call, case)."""
    h, q, kv, f = s["hidden"], s["q"], s["kv"], s["intermediate"]
    rows = {"q": (h, q, True, {}), "k": (h, kv, True, {}), "v": (h, kv, True, {}), "o": (q, h, False, {}),
            "gate": (h, f, False, {"activation": "silu"}), "up": (h, f, False, {"has_gate": 1}),
            "down": (f, h, False, {})}
    out = {name: (2 * m * k * n, _region(m, k, [(n, bias, attrs)], rng)) for name, (k, n, bias, attrs) in rows.items()}
    if square:
        out["square"] = (2 * square ** 3, _region(square, square, [(square, False, {})], rng))
    return out


def _table(s: dict, m: int, square: int, args, rng) -> None:
    cases = _cases(s, m, square, rng)
    times = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (_, case) in cases.items():
            times[name].append(_round(case, args.reps))
    print(f"\nM = {m}: per call over {args.rounds} rounds of {args.reps} calls")
    print("| dense | FLOP | min ms | median ms | GFLOP/s (min) |")
    print("|---|---|---|---|---|")
    for name, (flop, _) in cases.items():
        lo, med = min(times[name]), float(np.median(times[name]))
        print(f"| {name} | {flop / 1e9:.2f} G | {lo * 1e3:.3f} | {med * 1e3:.3f} | {flop / lo / 1e9:.0f} |")


def _impl(mod) -> str:
    """The oneDNN implementation of the region's run step (its plan line's first word after the node)."""
    run = [line for line in mod["get_plan"]() if line.startswith("run")]
    return run[0].split(" | ")[-1].split(" ")[0] if run else "?"


def _primitives(s: dict, m: int, args, rng) -> None:
    """Per dense of the layer (and q/k/v as one): inner product against matmul, interleaved."""
    h, q, kv, f = s["hidden"], s["q"], s["kv"], s["intermediate"]
    rows = {"q": (h, q, True), "k or v": (h, kv, True), "q/k/v": (h, q + 2 * kv, True), "o": (q, h, False),
            "gate or up": (h, f, False), "down": (f, h, False)}
    print(f"\nM = {m}: inner product (BYOC_HETERO_DENSE_IP=auto) against matmul (off), median of {args.rounds} "
          f"rounds of {args.reps} calls")
    print("| dense | K x N | impls | ip ms | matmul ms | matmul / ip |")
    print("|---|---|---|---|---|---|")
    saved = os.environ.get("BYOC_HETERO_DENSE_IP")
    for name, (k, n, bias) in rows.items():
        forms = {}
        for value in ("auto", "off"):
            os.environ["BYOC_HETERO_DENSE_IP"] = value
            forms[value] = _region(m, k, [(n, bias, {})], rng)
        times = {value: [] for value in forms}
        for _ in range(args.rounds):
            for value, case in forms.items():
                times[value].append(_round(case, args.reps))
        ip, mm = (float(np.median(times[v])) for v in ("auto", "off"))
        impls = " / ".join(_impl(case[0]) for case in forms.values())
        print(f"| {name} | {k} x {n} | {impls} | {ip * 1e3:.3f} | {mm * 1e3:.3f} | {mm / ip:.3f}x |", flush=True)
    if saved is None:
        os.environ.pop("BYOC_HETERO_DENSE_IP", None)
    else:
        os.environ["BYOC_HETERO_DENSE_IP"] = saved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hf", default=None, help="a Hugging Face folder whose config.json gives the shapes "
                                               "(default: Qwen2.5-0.5B's)")
    ap.add_argument("--rows", default="1024")
    ap.add_argument("--square", type=int, default=2048, help="the peak's dense: S x S x S (0: none)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ab-only", action="store_true", help="only the qkv A/B, no per-dense table")
    ap.add_argument("--primitives", action="store_true",
                    help="per dense also the A/B of oneDNN's inner product (BYOC_HETERO_DENSE_IP=auto) against its "
                         "matmul (off), each region planned under its value")
    args = ap.parse_args(argv)
    cpu = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if ln.startswith("Model name")), "cpu ?")
    print(f"{cpu}, oneDNN ISA {bh._C.isa()}, {bh._C.num_threads()} threads, load average {os.getloadavg()[0]:.2f}")
    s, rng = _shapes(args), np.random.default_rng(0)
    for m in [int(r) for r in args.rows.split(",")]:
        if args.primitives:
            _primitives(s, m, args, rng)
        if not args.ab_only:
            _table(s, m, args.square if m == int(args.rows.split(",")[0]) else 0, args, rng)
        h, q, kv = s["hidden"], s["q"], s["kv"]
        forms = {"separate": _region(m, h, [(q, True, {}), (kv, True, {}), (kv, True, {})], rng),
                 "combined": _region(m, h, [(q + 2 * kv, True, {})], rng, slices=[q, kv, kv])}
        ab = {name: [] for name in forms}
        for _ in range(args.rounds):
            for name, case in forms.items():
                ab[name].append(_round(case, args.reps))
        med = {name: float(np.median(t)) for name, t in ab.items()}
        print(f"qkv A/B at M = {m}: " + ", ".join(f"{n} min {min(t) * 1e3:.3f} median {med[n] * 1e3:.3f} ms"
                                                  for n, t in ab.items())
              + f"; separate / combined {med['separate'] / med['combined']:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
