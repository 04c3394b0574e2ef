"""What ``bh.tune`` costs and what it buys: tuning time with an empty and a warm timing cache, and the
tuned module's latency against the default ``bh.partition`` module.

Run: ``python bench/tune.py`` (ResNet-50 full size for the cost; the latency table over ResNet-50,
MobileNetV3-Large, and the small GPT-2 and BERT of ``bench/zoo_models.py``, whose mask bookkeeping
leaves small islands for the codegen level to decide). ``--models`` picks others, ``--small`` uses
the zoo's small configs everywhere (a smoke run).

Cost: the first ``bh.tune`` of a model with a fresh cache file, then a second one with that file
(the warm case: every timing, and the end-to-end check, read back). Latency: the default and the
tuned module built once each, then timed alternately (``--rounds`` rounds of ``--repeat`` calls,
the order flipped every round), each side's median of its round medians; the ratio is
default / tuned (above 1: tuning paid). Where tuning kept the default plan the two modules are the
same plan, and their ratio shows the noise of the machine. The machine line (``lscpu`` model name,
oneDNN's ISA, load average at start and end) goes at the top: on the shared 2-core machines of
this project the figures are noisy, and only ratios measured side by side mean much.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import byoc_hetero as bh  # noqa: E402
from zoo_models import build  # noqa: E402

DEFAULT_MODELS = ("resnet50", "mobilenet_v3_large", "gpt2:small", "bert_base:small", "island:gelu",
                  "island:sigmoid", "island:tanh", "island:relu")


def machine() -> str:
    """``lscpu``'s model name, oneDNN's ISA, the core count and the load average now."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "unknown")
    return (f"{name}; oneDNN {bh._C.onednn_version()} ISA {bh._C.isa()}; {os.cpu_count()} cores; "
            f"load average {os.getloadavg()[0]:.2f}")


ISLANDS = {"gelu": ((1, 128, 3072), "nn.gelu"), "sigmoid": ((1, 64, 56, 56), "sigmoid"),
           "tanh": ((1, 128, 768), "tanh"), "relu": ((1, 64, 56, 56), "nn.relu")}
"""``island:OP``: sin → OP → sin, the OP an island between ops only TVM runs (no heavy op: the cost gate
keeps it on llvm)."""


def island(op: str):
    shape, name = ISLANDS[op]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    fn = relax.op.nn if name.startswith("nn.") else relax.op
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.sin(bb.emit(getattr(fn, name.split(".")[-1])(bb.emit(relax.op.sin(x))))))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return f"island {name} {list(shape)}", bb.get(), {}, [np.random.default_rng(0).standard_normal(shape)
                                                           .astype("float32")]


def load(spec: str):
    """``name``, ``name:small`` or ``island:OP`` → (label, Relax module, params, inputs)."""
    name, _, size = spec.partition(":")
    if name == "island":
        return island(size)
    zm = build(name, small=size == "small")
    mod, params = bh.from_torch(zm.module, zm.inputs)
    return f"{name} ({'small' if size else 'full'})", mod, params, [t.numpy() for t in zm.inputs]


def side_by_side(default, tuned, inputs, rounds: int, repeat: int) -> tuple[float, float]:
    """Medians (s) of the two modules' round medians, timed alternately."""
    fns = []
    for m in (default, tuned):
        vm = relax.VirtualMachine(relax.build(m, target="llvm"), tvm.cpu())
        args = [tvm.runtime.tensor(x) for x in inputs]
        vm["main"](*args)
        fns.append(lambda vm=vm, args=args: vm["main"](*args))
    medians = ([], [])
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                fns[i]()
                times.append(time.perf_counter() - t0)
            medians[i].append(float(np.median(times)))
    return float(np.median(medians[0])), float(np.median(medians[1]))


def cost(spec: str, workdir: str) -> None:
    """Cold and warm tuning time of one model."""
    label, mod, params, _ = load(spec)
    cache = os.path.join(workdir, "cost.json")
    for what in ("empty cache", "warm cache"):
        t0 = time.perf_counter()
        _, report = bh.tune(mod, params, cache=cache)
        spent = time.perf_counter() - t0
        print(f"| {label} | {what} | {spent:.1f} s | {report.cache_hits} hits, {report.cache_misses} misses | "
              f"kept the {report.kept} plan |", flush=True)
        last = report
    print("\n```text\n" + str(last) + "\n```\n", flush=True)


def latency(specs: list[str], workdir: str, rounds: int, repeat: int) -> None:
    print("| model | tune time | codegen decisions (differ from the gate) | algorithm decisions (differ) | kept "
          "| default ms | tuned ms | default / tuned |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in specs:
        label, mod, params, inputs = load(spec)
        t0 = time.perf_counter()
        tuned, report = bh.tune(mod, params, cache=os.path.join(workdir, "latency.json"))
        spent = time.perf_counter() - t0
        default = bh.partition(mod, params)
        d, t = side_by_side(default, tuned, inputs, rounds, repeat)
        cg = report.codegen.decisions
        alg = [a for a in report.algorithms if a.timings]
        print(f"| {label} | {spent:.1f} s | {len(cg)} ({sum(c.chosen != c.default for c in cg)}) | "
              f"{len(alg)} ({sum(a.chosen != a.default for a in alg)}) | {report.kept} | {d * 1e3:.2f} | "
              f"{t * 1e3:.2f} | {d / t:.3f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="zoo names, NAME:small for small")
    ap.add_argument("--cost-model", default="resnet50", help="the model whose tuning cost is measured ('none': skip)")
    ap.add_argument("--small", action="store_true", help="every model at its small size (smoke run)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    small = (lambda s: s if ":" in s or s == "none" else s + ":small") if args.small else (lambda s: s)
    print(f"Machine: {machine()} (shared with other engineers' work: figures are noisy)\n", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        if args.cost_model != "none":
            print("| model | cache | tune time | timing cache | result |\n|---|---|---|---|---|")
            cost(small(args.cost_model), workdir)
        latency([small(m) for m in args.models], workdir, args.rounds, args.repeat)
    print(f"\nLoad average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
