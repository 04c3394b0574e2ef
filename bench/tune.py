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

Threads (``--threads``, e.g. ``python bench/tune.py --threads --cost-model none --models regions
mobilenet_v3_large``): instead of the latency table, ``bh.tune(..., threads=True)`` per model; the
table gives how many regions the level timed and how many it put on one thread, then three modules
timed in turn (the order rotated every round): the default, the tuned one, and the same regions all
capped at one thread (the alternative the level weighed), with the ratios default / other; below it,
each region's own two timings. ``regions`` is a built-in model of three regions of very different
sizes (:func:`three_regions`).
"""

from __future__ import annotations

import argparse
import json
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


def three_regions():
    """``regions``: three oneDNN regions of very different sizes, kept apart by ``sin`` (which only TVM
    runs): a 3x3 conv + ReLU at 64x56x56 (231 MFLOP), a 4x4 max pool and a 3x3 conv + ReLU at 64x14x14
    (14 MFLOP), a spatial mean and a 64x64 dense + ReLU (8 KFLOP). Where one thread could win a region
    (the small ones: fork / join of the team against a few microseconds of work) and where it cannot."""
    rng = np.random.default_rng(0)

    def const(*shape):
        return relax.const((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype("float32"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 64, 56, 56), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit
            y = e(relax.op.sin(e(relax.op.nn.relu(e(relax.op.nn.conv2d(x, const(64, 64, 3, 3), padding=1))))))
            y = e(relax.op.nn.max_pool2d(y, pool_size=4, strides=4))
            y = e(relax.op.sin(e(relax.op.nn.relu(e(relax.op.nn.conv2d(y, const(64, 64, 3, 3), padding=1))))))
            y = e(relax.op.nn.relu(e(relax.op.matmul(e(relax.op.mean(y, axis=[2, 3])), const(64, 64)))))
            out = bb.emit_output(e(relax.op.sin(y)))
        bb.emit_func_output(out)
    return ("three regions (conv 56x56, conv 14x14, dense 64)", bb.get(), {},
            [rng.standard_normal((1, 64, 56, 56)).astype("float32")])


def load(spec: str):
    """``name``, ``name:small``, ``island:OP`` or ``regions`` → (label, Relax module, params, inputs)."""
    name, _, size = spec.partition(":")
    if name == "island":
        return island(size)
    if name == "regions":
        return three_regions()
    zm = build(name, small=size == "small")
    mod, params = bh.from_torch(zm.module, zm.inputs)
    return f"{name} ({'small' if size else 'full'})", mod, params, [t.numpy() for t in zm.inputs]


def alternate(modules: list, inputs, rounds: int, repeat: int) -> list[float]:
    """Medians (s) of each module's round medians, the modules timed in turn (the order rotated
    every round)."""
    fns = []
    for m in modules:
        vm = relax.VirtualMachine(relax.build(m, target="llvm"), tvm.cpu())
        args = [tvm.runtime.tensor(x) for x in inputs]
        vm["main"](*args)
        fns.append(lambda vm=vm, args=args: vm["main"](*args))
    medians: list[list[float]] = [[] for _ in modules]
    for r in range(rounds):
        for i in [(r + k) % len(fns) for k in range(len(fns))]:
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                fns[i]()
                times.append(time.perf_counter() - t0)
            medians[i].append(float(np.median(times)))
    return [float(np.median(m)) for m in medians]


def side_by_side(default, tuned, inputs, rounds: int, repeat: int) -> tuple[float, float]:
    """Medians (s) of the two modules' round medians, timed alternately."""
    d, t = alternate([default, tuned], inputs, rounds, repeat)
    return d, t


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


def threads(specs: list[str], workdir: str, rounds: int, repeat: int) -> None:
    """The threads level (``bh.tune(..., threads=True)``): what it chose per region, and the default,
    the tuned and the every-region-on-one-thread modules timed side by side."""
    print(f"Regions run on {bh._C.num_threads()} threads by default (the process's count); the runtime's "
          f"adaptation to contention: {bh._C.thread_adaptation()}.\n")
    print("| model | regions timed | on 1 thread | tune time | kept | default ms | tuned ms | all regions 1 thread ms "
          "| default / tuned | default / 1 thread | region calls the runtime reduced |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    why = []
    for spec in specs:
        label, mod, params, inputs = load(spec)
        bh._C.reset_adaptation()
        t0 = time.perf_counter()
        tuned, report = bh.tune(mod, params, cache=os.path.join(workdir, "threads.json"), threads=True, repeat=repeat)
        spent = time.perf_counter() - t0
        decided = report.threads
        mapped = report.codegen.region_codegen if report.codegen.changed else None
        one = {"onednn": {"region_threads": json.dumps({d.region.key: 1 for d in decided})}} if decided else None
        modules = [bh.partition(mod, params), tuned] + ([bh.partition(mod, params, region_codegen=mapped, options=one)]
                                                        if one else [])
        times = alternate(modules, inputs, rounds, repeat) + [None]
        ms = ["—" if t is None else f"{t * 1e3:.3f}" for t in times[:3]]
        ratio = ["—" if t is None else f"{times[0] / t:.3f}" for t in times[1:3]]
        print(f"| {label} | {len(decided)} | {sum(d.chosen == 1 for d in decided)} | {spent:.1f} s | {report.kept} | "
              f"{' | '.join(ms)} | {' | '.join(ratio)} | {bh._C.adaptation_stats()['reduced']} |", flush=True)
        why += [f"{label}: {d.region}: {d.why()}" for d in decided] + [f"{label}: note: {n}" for n in report.notes]
    print("\nPer region (the threads level's own timings of each region alone):\n\n```text\n" + "\n".join(why)
          + "\n```")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="zoo names, NAME:small for small")
    ap.add_argument("--cost-model", default="resnet50", help="the model whose tuning cost is measured ('none': skip)")
    ap.add_argument("--small", action="store_true", help="every model at its small size (smoke run)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", action="store_true",
                    help="the threads level instead of the latency table: bh.tune(..., threads=True) per model, its "
                         "choice per region, and the default / tuned / all-regions-on-1-thread modules side by side")
    args = ap.parse_args()
    small = (lambda s: s if ":" in s or s == "none" else s + ":small") if args.small else (lambda s: s)
    print(f"Machine: {machine()} (shared with other engineers' work: figures are noisy)\n", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        if args.cost_model != "none":
            print("| model | cache | tune time | timing cache | result |\n|---|---|---|---|---|")
            cost(small(args.cost_model), workdir)
        (threads if args.threads else latency)([small(m) for m in args.models], workdir, args.rounds, args.repeat)
    print(f"\nLoad average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
