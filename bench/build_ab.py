"""Same-process, interleaved A/B of two exported builds of one model (``bench/zoo.py --phase build``'s
``<model>_<path>.so``), or of one build with an environment knob off / on (read when each VM's regions
are planned: its first call).

    python3 bench/build_ab.py --a /tmp/s15/zoo/deberta_v3_base_from_torch.so \\
        --b /tmp/s16d/zoo/deberta_v3_base_from_torch.so --inputs /tmp/s15/zoo/deberta_v3_base_inputs.npz
    python3 bench/build_ab.py --a /tmp/s16d/zoo/deberta_v3_base_from_torch.so --knob BYOC_HETERO_MATMUL_PLAIN_A \\
        --inputs /tmp/s15/zoo/deberta_v3_base_inputs.npz

Both sides are loaded in this process and timed in ``--rounds`` rounds that alternate which goes first;
each round keeps the median of the calls made in ``--min-time`` seconds. ``--cpu-time``: per call the
process's CPU time instead of wall time (at 1 thread on a loaded machine it does not count the time
the thread was descheduled; at 2 threads it counts both threads' spinning too). Threads: set
``BYOC_HETERO_NUM_THREADS`` / ``OMP_NUM_THREADS`` as for any run. Prints the largest difference
between the two sides' outputs, each side's medians and the ratio A / B (> 1: B is faster), and for a
knob each side's matmul implementations and planner copies.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def _load(path: str, inputs: list, knob: str | None, value: str | None):
    """A VM on the build at ``path``, called once (planned) with ``knob`` set to ``value``; its steps."""
    import tvm
    from tvm import relax

    import byoc_hetero as bh

    if knob:
        os.environ[knob] = value
    lib = tvm.runtime.load_module(path)
    vm = relax.VirtualMachine(lib, tvm.cpu())
    regions = bh.codegen.region_modules(lib)
    for region in regions:
        region["set_profiling"](True)
    out = vm["main"](*inputs).numpy()
    counts: dict[str, int] = {}
    for region in regions:
        for step in json.loads(str(region["get_profile"]())):
            if step["phase"] == "run" and step["op"] in ("matmul", ""):
                key = f"{step['op'] or '(copy)'} {step['impl']}"
                counts[key] = counts.get(key, 0) + 1
        region["set_profiling"](False)
    return vm, out, counts


def _median_ms(vm, inputs: list, min_time: float, cpu_time: bool) -> float:
    clock = time.process_time if cpu_time else time.perf_counter
    vm["main"](*inputs)
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < min_time or len(times) < 3:
        t = clock()
        vm["main"](*inputs)
        times.append(clock() - t)
    return 1e3 * float(np.median(times))


def main() -> None:
    import tvm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="the A build (.so)")
    ap.add_argument("--b", help="the B build (.so); without it, --knob's on side of --a")
    ap.add_argument("--knob", help="an environment variable: A with it 'off', B with it 'on'")
    ap.add_argument("--inputs", required=True, help="the .npz of inputs (zoo.py's <model>_inputs.npz)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--cpu-time", action="store_true", help="process CPU time per call instead of wall time")
    args = ap.parse_args()
    if (args.b is None) == (args.knob is None):
        ap.error("give --b (two builds) or --knob (one build, off / on)")
    data = np.load(args.inputs)
    inputs = [tvm.runtime.tensor(data[k]) for k in data.files]
    sides = {"A": _load(args.a, inputs, args.knob, "off"), "B": _load(args.b or args.a, inputs, args.knob, "on")}
    if args.knob:
        for name, (_vm, _out, counts) in sides.items():
            print(f"{name} ({args.knob}={'off' if name == 'A' else 'on'}): {counts}")
    print(f"max |A - B| = {float(np.abs(sides['A'][1] - sides['B'][1]).max()):.3g}")
    times: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name in (("A", "B") if r % 2 == 0 else ("B", "A")):
            if args.knob:
                # kept set while a side runs: a region plans again for fewer threads under contention (a
                # contention plan), reading the knob then; unset, both sides' such plans took the default
                os.environ[args.knob] = "off" if name == "A" else "on"
            times[name].append(_median_ms(sides[name][0], inputs, args.min_time, args.cpu_time))
    if args.knob:
        os.environ.pop(args.knob)
    a, b = (float(np.median(times[n])) for n in ("A", "B"))
    unit = "ms CPU" if args.cpu_time else "ms"
    print(f"A {a:.2f} {unit}, B {b:.2f} {unit}, A / B {a / b:.3f}x over {args.rounds} rounds "
          f"(A {[round(t, 1) for t in times['A']]}, B {[round(t, 1) for t in times['B']]})", flush=True)


if __name__ == "__main__":
    main()
