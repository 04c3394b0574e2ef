"""Tail latency under CPU contention: byoc-hetero vs ONNX Runtime, quiet, with a twin, with a busy loop.

    python bench/contention.py                                   # resnet18, 2 threads, 60 calls per cell
    python bench/contention.py --models resnet18,mobilenet_v2 --markdown bench/CONTENTION.md
    python bench/contention.py --env OMP_WAIT_POLICY=passive     # a diagnostic environment for our workers

Not part of the tests (it asserts nothing; it reports).  For each framework one *measuring* process
and one *twin* process serve the same model, on the same weights and input, at ``--threads``
threads (OMP_NUM_THREADS / BYOC_HETERO_NUM_THREADS / ORT's intra_op_num_threads).  Three loads:

* quiet: nothing else of ours runs;
* twin: the framework's twin process calls the same model in a loop (two servers on the same cores);
* busy: one single-threaded busy-loop process (``while True: pass``).

The measurement is interleaved so that every cell sees the same machine: ``--rounds`` rounds, each
visiting every (framework, load) pair in turn (order alternated), ``--calls / --rounds`` timed calls
per visit after a short settling time.  Per cell: median and p90 of the call latency, and the CPU time
the measuring process burnt per call (user+sys, all its threads: about threads x latency when every
thread works or spins through the call).  The machine (CPU model, usable CPUs, oneDNN ISA) and the
load average before and after go into the report.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from run import LABELS, TOLERANCE, Report, _env, _prepare, fmt_ms, machine, make_runner, wait_quiet  # noqa: E402

LOADS = ("quiet", "twin", "busy")
LOAD_LABELS = {"quiet": "quiet", "twin": "with a twin", "busy": "with a busy loop"}
SETTLE_S = 0.3  # after a load starts, before timing: the twin's calls and the scheduler settle


# ------------------------------------------------------------------------------------------------
# Worker side: a server of one framework, commanded line by line on stdin, answering JSON lines.


def serve(args) -> int:
    data = np.load(args.data)
    x = data["__input__"]
    params = {k: data[k] for k in data.files if k != "__input__"}
    info: dict = {}
    fn, out = make_runner(args.framework, args.model, params, x, args.threads, info)
    if args.framework == "byoc":
        import byoc_hetero

        info["package"] = os.path.dirname(byoc_hetero.__file__)
        info["adaptation"] = byoc_hetero._C.thread_adaptation() if hasattr(byoc_hetero._C, "thread_adaptation") \
            else "none (before it existed)"
    np.save(args.out, out)
    for _ in range(3):
        fn()
    adaptation = None
    if args.framework == "byoc":
        import byoc_hetero

        adaptation = getattr(byoc_hetero._C, "adaptation_stats", None)
    print(json.dumps({"ready": True, **info}), flush=True)
    while True:
        line = sys.stdin.readline()  # line by line: select() below must see what is still unread
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "run":  # run K: K timed calls
            times, cpu = [], []
            before = adaptation() if adaptation else None
            for _ in range(int(cmd[1])):
                c0, t0 = time.process_time(), time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            answer = {"times": times, "cpu": cpu}
            if adaptation:  # region calls run with fewer threads, and tries of more
                after = adaptation()
                answer["reduced"] = after["reduced"] - before["reduced"]
                answer["probes"] = after["probes"] - before["probes"]
            print(json.dumps(answer), flush=True)
        elif cmd[0] == "loop":  # calls until the next line arrives (the twin's load)
            calls = 0
            while not select.select([sys.stdin], [], [], 0)[0]:
                fn()
                calls += 1
            sys.stdin.readline()
            print(json.dumps({"calls": calls}), flush=True)
        else:
            print(json.dumps({"error": f"unknown command {line.strip()!r}, expected run K | loop | quit"}),
                  flush=True)
    return 0


# ------------------------------------------------------------------------------------------------
# Driver side


class Server:
    """A worker process (see serve) of one framework."""

    def __init__(self, framework: str, model: str, data: str, out: str, threads: int, env: dict):
        argv = [sys.executable, os.path.abspath(__file__), "--serve", framework, model, str(threads),
                "--data", data, "--out", out]
        self.framework = framework
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        while line and not line.startswith("{"):
            line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{LABELS[self.framework]} worker exited with {self.proc.wait()} before answering")
        answer = json.loads(line)
        if "error" in answer:
            raise SystemExit(f"{LABELS[self.framework]} worker: {answer['error']}")
        return answer

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def run(self, calls: int) -> dict:
        self.send(f"run {calls}")
        return self._answer()

    def start_loop(self) -> None:
        self.send("loop")

    def stop_loop(self) -> int:
        self.send("stop")
        return self._answer()["calls"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class Load:
    """Starts and stops one kind of background load around a measurement."""

    def __init__(self, kind: str, twin: Server | None):
        self.kind, self.twin, self.busy = kind, twin, None
        self.twin_calls = 0

    def __enter__(self):
        if self.kind == "twin":
            self.twin.start_loop()
        elif self.kind == "busy":
            self.busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        if self.kind != "quiet":
            time.sleep(SETTLE_S)
        return self

    def __exit__(self, *exc):
        if self.kind == "twin":
            self.twin_calls += self.twin.stop_loop()
        elif self.kind == "busy":
            self.busy.kill()
            self.busy.wait()
        return False


def split_variant(fw: str) -> tuple[str, dict]:
    """'byoc@KEY=VALUE' -> ('byoc', {KEY: VALUE}): a framework run with one more variable."""
    base, _, kv = fw.partition("@")
    return base, dict([kv.split("=", 1)]) if kv else {}


def label(fw: str) -> str:
    base, variant = split_variant(fw)
    return LABELS[base] + "".join(f" ({k}={v})" for k, v in variant.items())


def stats(times: list[float]) -> tuple[float, float]:
    return float(np.median(times)), float(np.percentile(times, 90))


def measure(model: str, frameworks: list[str], args, workdir: str, log) -> dict:
    data, _, _ = _prepare(workdir, model, 1)
    env = _env(args.threads)
    extra = dict(kv.split("=", 1) for kv in args.env)
    servers: dict[str, Server] = {}
    twins: dict[str, Server] = {}
    try:
        for fw in frameworks:
            base, variant = split_variant(fw)
            fw_env = {**env, **extra, **variant} if base == "byoc" else {**env, **variant}
            for role, table in (("", servers), ("_twin", twins)):
                table[fw] = Server(base, model, data, os.path.join(workdir, f"{model}_{len(table)}{role}.npy"),
                                   args.threads, fw_env)
        outs = {fw: np.load(os.path.join(workdir, f"{model}_{i}.npy")) for i, fw in enumerate(frameworks)}
        ref = outs[frameworks[0]]
        diffs = {fw: float(np.max(np.abs(o - ref)) / max(np.max(np.abs(ref)), 1e-30)) for fw, o in outs.items()}
        cells = {(fw, load): {"times": [], "cpu": [], "reduced": 0, "probes": 0}
                 for fw in frameworks for load in args.loads}
        twin_calls = {fw: 0 for fw in frameworks}
        per_round = max(1, args.calls // args.rounds)
        wait_quiet(args.quiet_wait)
        for rnd in range(args.rounds):
            order = [(fw, load) for fw in frameworks for load in args.loads]
            if rnd % 2:
                order.reverse()
            for fw, load in order:
                with Load(load, twins[fw]) as active:
                    r = servers[fw].run(per_round)
                twin_calls[fw] += active.twin_calls
                cells[(fw, load)]["times"] += r["times"]
                cells[(fw, load)]["cpu"] += r["cpu"]
                cells[(fw, load)]["reduced"] += r.get("reduced", 0)
                cells[(fw, load)]["probes"] += r.get("probes", 0)
            log(f"  {model} round {rnd + 1}/{args.rounds}: " + ", ".join(
                f"{fw}/{load} {fmt_ms(stats(cells[(fw, load)]['times'])[0])}"
                for fw in frameworks for load in args.loads))
        return {"cells": cells, "diffs": diffs, "twin_calls": twin_calls,
                "info": {fw: s.info for fw, s in servers.items()}}
    finally:
        for s in list(servers.values()) + list(twins.values()):
            s.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet18", help="comma-separated, from byoc_hetero.models")
    ap.add_argument("--frameworks", default="byoc,ort",
                    help="comma-separated: byoc, ort, torch; FRAMEWORK@KEY=VALUE runs it with one more "
                         "environment variable (e.g. byoc@BYOC_HETERO_ADAPT_THREADS=off)")
    ap.add_argument("--loads", default=",".join(LOADS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=60, help="timed calls per (framework, load)")
    ap.add_argument("--rounds", type=int, default=6, help="interleaving rounds the calls are split into")
    ap.add_argument("--quiet-wait", type=float, default=20.0,
                    help="before starting, wait up to this many seconds for idle CPUs")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for byoc-hetero's processes (diagnostics), repeatable")
    ap.add_argument("--note", default="", help="a line to put under the machine description")
    ap.add_argument("--markdown", help="also write the report as markdown to this file")
    ap.add_argument("--serve", nargs=3, metavar=("FRAMEWORK", "MODEL", "THREADS"), help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.serve:
        args.framework, args.model, args.threads = args.serve[0], args.serve[1], int(args.serve[2])
        return serve(args)

    args.loads = args.loads.split(",")
    for load in args.loads:
        if load not in LOADS:
            ap.error(f"--loads: unknown load {load!r}, expected some of {', '.join(LOADS)}")
    frameworks = args.frameworks.split(",")
    for kv in args.env + [fw.partition("@")[2] for fw in frameworks if "@" in fw]:
        if "=" not in kv:
            ap.error(f"--env / --frameworks: expected KEY=VALUE, got {kv!r}")
    for fw in frameworks:
        if split_variant(fw)[0] not in LABELS or fw.startswith("llvm"):
            ap.error(f"--frameworks: unknown framework {fw!r}, expected byoc, ort or torch (optionally @KEY=VALUE)")
    report = Report()
    out = report.out

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    out("# Latency under CPU contention")
    out()
    out(f"Machine: {machine()}.")
    if args.env:
        out(f"Extra environment of byoc-hetero's processes: `{' '.join(args.env)}`.")
    if args.note:
        out(args.note)
    out()
    out(f"{args.threads} threads per process; {args.calls} calls per cell in {args.rounds} interleaved rounds; "
        "latency of one call from Python in ms, median / p90; *cpu* = CPU time (all threads, user+sys) the "
        "measuring process used per call, median, in ms; *fewer threads*: region calls our runtime ran with fewer threads than the module's (contention), *tries*: calls that tried more again. Twin: a second process of the same framework calling "
        "the same model in a loop; busy: one `while True: pass` process.")
    out()
    head = "| model | framework | " + " | ".join(LOAD_LABELS[load] for load in args.loads) + " |"
    rows = []
    infos: dict = {}
    with tempfile.TemporaryDirectory() as workdir:
        for model in args.models.split(","):
            r = measure(model, frameworks, args, workdir, log)
            infos[model] = r["info"]
            for fw in frameworks:
                cells = []
                for load in args.loads:
                    c = r["cells"][(fw, load)]
                    med, p90 = stats(c["times"])
                    extra = f", fewer threads {c['reduced']}, tries {c['probes']}" if c["reduced"] or c["probes"] else ""
                    cells.append(f"{fmt_ms(med)} / {fmt_ms(p90)} (cpu {fmt_ms(float(np.median(c['cpu'])))}{extra})")
                diff = "" if fw == frameworks[0] else f" (max rel. diff {r['diffs'][fw]:.1e})"
                rows.append(f"| {model} | {label(fw)}{diff} | " + " | ".join(cells) + " |")
            bad = [fw for fw, d in r["diffs"].items() if d > TOLERANCE]
            if bad:
                rows.append(f"| {model} | **outputs of {', '.join(bad)} disagree beyond {TOLERANCE:g}** | |")
    out(head)
    out("|" + "---|" * (2 + len(args.loads)))
    for row in rows:
        out(row)
    out()
    for model, info in infos.items():
        for fw, i in info.items():
            if "package" in i:
                out(f"{model}, {label(fw)}: from `{i['package']}`, thread adaptation {i['adaptation']}.")
    out(f"Load average at the end: {os.getloadavg()[0]:.2f}.")
    report.save(args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
