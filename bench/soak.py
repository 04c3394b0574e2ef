"""Soak test: one process calls exported libraries for a long time from several threads, at mixed
batch sizes and both precisions, and samples its resident memory.

    nice python bench/soak.py --minutes 30 --threads 3 --markdown bench/SOAK.md

Not part of the tests (no asserts on time; it reports). A small network (conv → batch norm → relu →
pool → attention-like matmul/softmax → dense) is imported through ``torch.export`` with a symbolic
batch ``N`` in [1, 8], partitioned twice (``precision="f32"`` and ``"bf16"``), and each build exported
with ``export_library`` and loaded back with :func:`byoc_hetero.load_module` (one library per
precision, both loaded in this one process: a partition has one precision). Before the soak, the
answer for every (precision, batch) pair is computed once and checked against the llvm-only build
(f32: relative error 1e-4; bf16: 3e-2). During the soak each of ``--threads`` threads owns a VM per
library and calls ``main`` with a random precision and batch; a call whose output is not bitwise
the precomputed answer, or that raises, is an error. Every ``--sample`` seconds the resident set
size (VmRSS), the calls so far and the errors are recorded. The result (a table of RSS over time, the
totals, the machine) is printed and, with ``--markdown``, written to a file.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

import byoc_hetero as bh  # noqa: E402
from byoc_hetero.timing import build, relative_error  # noqa: E402

BATCHES = (1, 2, 3, 5, 8)
TOLERANCE = {"f32": 1e-4, "bf16": 3e-2}


def rss_mb() -> float:
    """This process's resident set size in MB (VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def network():
    """The torch module soaked: conv, batch norm, relu, pool, a self-attention-like block, dense."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(16)
            self.q = torch.nn.Linear(16, 16)
            self.k = torch.nn.Linear(16, 16)
            self.head = torch.nn.Linear(16, 10)

        def forward(self, x):
            y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)  # [N, 16, 8, 8]
            t = y.flatten(2).transpose(1, 2)  # [N, 64, 16]
            att = torch.softmax(self.q(t) @ self.k(t).transpose(1, 2) / 4.0, dim=-1)
            return self.head((att @ t).mean(1))

    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-0.5, 0.5)
        net.bn.running_var.uniform_(0.5, 1.5)
    return net


def prepare(tmp: Path):
    """(libraries by precision, inputs by batch, answers by (precision, batch))."""
    import torch

    n = torch.export.Dim("N", min=1, max=8)
    mod, params = bh.from_torch(network(), (torch.randn(2, 3, 16, 16),), dynamic_shapes=({0: n},))
    rng = np.random.default_rng(0)
    inputs = {b: rng.standard_normal((b, 3, 16, 16)).astype("float32") for b in BATCHES}
    reference = relax.VirtualMachine(build(bh.bind_params(mod, params)), tvm.cpu())
    libraries, answers = {}, {}
    for precision in ("f32", "bf16"):
        path = tmp / f"soak_{precision}.so"
        build(bh.partition(mod, params, precision=precision)).export_library(str(path))
        libraries[precision] = bh.load_module(path)
        vm = relax.VirtualMachine(libraries[precision], tvm.cpu())
        for b, x in inputs.items():
            got = vm["main"](tvm.runtime.tensor(x)).numpy()
            want = reference["main"](tvm.runtime.tensor(x)).numpy()
            error = relative_error(got, want)
            if error > TOLERANCE[precision]:
                raise SystemExit(f"{precision} batch {b}: relative error {error:.1e} against llvm before the soak")
            answers[(precision, b)] = got
    return libraries, inputs, answers


class Soak:
    """The worker threads and their counters."""

    def __init__(self, libraries, inputs, answers, seconds: float):
        self.libraries, self.inputs, self.answers = libraries, inputs, answers
        self.deadline = time.monotonic() + seconds
        self.lock = threading.Lock()
        self.calls = 0
        self.errors: list[str] = []

    def worker(self, tid: int) -> None:
        rng = random.Random(tid)
        vms = {p: relax.VirtualMachine(lib, tvm.cpu()) for p, lib in self.libraries.items()}
        args = {b: tvm.runtime.tensor(x) for b, x in self.inputs.items()}
        while time.monotonic() < self.deadline:
            precision, b = rng.choice(sorted(vms)), rng.choice(BATCHES)
            try:
                got = vms[precision]["main"](args[b]).numpy()
                ok = np.array_equal(got, self.answers[(precision, b)])
                problem = None if ok else f"{precision} batch {b}: output differs from the answer"
            except Exception as err:  # noqa: BLE001 - every failure is counted and reported
                problem = f"{precision} batch {b}: {type(err).__name__}: {err}"
            with self.lock:
                self.calls += 1
                if problem:
                    self.errors.append(problem)


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{model}, {os.cpu_count()} CPUs, oneDNN {bh._C.onednn_version()} ({bh._C.isa()}), "
            f"bf16 {'native' if bh._C.bf16_native() else 'emulated (runs f32)'}, {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.1f} at the end")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="how long to soak (default 30)")
    ap.add_argument("--threads", type=int, default=3, help="calling threads (default 3)")
    ap.add_argument("--sample", type=float, default=60.0, help="seconds between RSS samples (default 60)")
    ap.add_argument("--markdown", type=Path, help="write the report here too")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="byoc_soak_") as tmp:
        start = time.monotonic()
        libraries, inputs, answers = prepare(Path(tmp))
        print(f"prepared in {time.monotonic() - start:.0f} s; RSS {rss_mb():.0f} MB", flush=True)
        soak = Soak(libraries, inputs, answers, args.minutes * 60)
        threads = [threading.Thread(target=soak.worker, args=(t,), daemon=True) for t in range(args.threads)]
        begin = time.monotonic()
        for t in threads:
            t.start()
        samples = [(0.0, 0, 0, rss_mb())]
        while any(t.is_alive() for t in threads):
            time.sleep(min(args.sample, max(0.1, soak.deadline - time.monotonic() + 0.5)))
            with soak.lock:
                samples.append((time.monotonic() - begin, soak.calls, len(soak.errors), rss_mb()))
            print(f"  {samples[-1][0] / 60:6.1f} min  {samples[-1][1]:8d} calls  {samples[-1][2]} errors  "
                  f"RSS {samples[-1][3]:.0f} MB", flush=True)
        for t in threads:
            t.join()
    report = render(args, samples, soak, machine())
    print(report)
    if args.markdown:
        args.markdown.write_text(report)
    return 1 if soak.errors else 0


def render(args, samples, soak: Soak, where: str) -> str:
    lines = [f"Soak: {args.minutes:g} min asked, {samples[-1][0] / 60:.1f} min run, {args.threads} threads, "
             f"batches {list(BATCHES)}, precisions f32 and bf16 (bench/soak.py).", "",
             f"Machine: {where}.", "",
             f"Calls: {soak.calls}; errors: {len(soak.errors)}"
             + (f" (first: {soak.errors[0]})" if soak.errors else "") + "; "
             f"RSS from {samples[1][3] if len(samples) > 1 else samples[0][3]:.0f} MB at the first sample to "
             f"{samples[-1][3]:.0f} MB at the end.", "",
             "| minute | calls | errors | RSS (MB) |", "|---:|---:|---:|---:|"]
    lines += [f"| {t / 60:.1f} | {c} | {e} | {r:.0f} |" for t, c, e, r in samples]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
