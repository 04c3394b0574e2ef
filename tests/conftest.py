"""Shared helpers: build a module two ways (offloaded, llvm-only) and compare."""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import byoc_hetero as bh  # noqa: E402
from byoc_hetero.timing import build, random_inputs, relative_error, run  # noqa: E402

TOLERANCE = 1e-4


def fuzz_seed() -> int:
    """The seed of this run's fuzz examples (tests/test_fuzz.py): ``BYOC_FUZZ_SEED`` where set, else today's
    UTC date as ``YYYYMMDD`` (a new slice of the example space each day; the same one all day, so a failure
    seen in CI repeats on a developer's machine that day, and with ``BYOC_FUZZ_SEED`` on any later one)."""
    import time

    return int(os.environ.get("BYOC_FUZZ_SEED") or time.strftime("%Y%m%d", time.gmtime()))


#: the CPU flags oneDNN's int8 and bf16 paths (and so the ISA-capped tests) depend on
CPU_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
             "amx_int8", "amx_bf16")


def cpu_summary() -> str:
    """The CPU's model name, CPU count, which of :data:`CPU_FLAGS` it has and lacks (``/proc/cpuinfo``, what
    ``lscpu`` reads), and the ISA oneDNN runs here: the suite's header, so that every CI log says which
    ISA-capped runs its machine could take."""
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:  # not Linux: the model and flags stay unknown, the ISA is still oneDNN's answer
        pass
    has = " ".join(f for f in CPU_FLAGS if f in flags) or "none"
    lacks = " ".join(f for f in CPU_FLAGS if f not in flags) or "none"
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    capped = f" (under ONEDNN_MAX_CPU_ISA={cap})" if cap is not None else ""
    return f"cpu: {model} ({os.cpu_count()} CPUs); has: {has}; lacks: {lacks}; oneDNN ISA: {bh._C.isa()}{capped}"


def pytest_report_header(config):
    return [cpu_summary(), f"byoc_hetero fuzz seed: {fuzz_seed()} (repeat with BYOC_FUZZ_SEED={fuzz_seed()})"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The machine again at the end: ``-q`` (the README's command) hides the header, and a CI log is read from
    its end (which oneDNN ISA and CPU flags ran decides which ISA-capped tests ran or skipped)."""
    if not hasattr(config, "workerinput"):
        terminalreporter.write_line(cpu_summary())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under a failing fuzz test, the seed that repeats it."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and item.path.name == "test_fuzz.py":
        report.sections.append(("fuzz seed", f"repeat with BYOC_FUZZ_SEED={fuzz_seed()} (BYOC_FUZZ_RANDOM unset)"))


def graph(inputs: dict, body, dtype: str = "float32"):
    """A module whose ``main(**inputs)`` dataflow block is emitted by ``body(emit, *params)``.

    ``inputs`` maps parameter names to shapes; every parameter has ``dtype``.
    """
    from tvm import relax

    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(s, dtype)) for n, s in inputs.items()]
    with bb.function("main", params):
        with bb.dataflow():
            out = body(bb.emit, *params)
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


class Compared:
    """The result of :func:`offload_and_compare`."""

    def __init__(self, partitioned, got, want):
        self.partitioned = partitioned
        self.profile = bh.op_profile(partitioned)
        self.got = got
        self.want = want
        self.error = relative_error(got, want)


def offload_and_compare(mod, params=None, inputs=None, bind=True, reference=None) -> Compared:
    """Partition+build ``mod`` with byoc_hetero and compare its output with the llvm-only build, or with
    ``reference(inputs)`` where given: an independent computation of the same model (torch, numpy) for
    full-size models, whose llvm-only build (TVM's untuned CPU schedules) costs most of the test."""
    inputs = inputs if inputs is not None else random_inputs(mod, params)
    unbound = bool(params) and not bind
    if unbound:
        # weights stay parameters of main: pass them at run time in declaration order
        names = [v.name for v in mod["main"].params]
        weights = [params[n] for n in names if n in params]
        inputs = list(inputs) + weights
        part_mod = bh.partition(mod)
    else:
        part_mod = bh.partition(mod, params)
    got = run(build(part_mod), inputs)
    if reference is not None:
        want = np.asarray(reference(inputs), dtype=got.dtype)
    else:
        want = run(build(mod if unbound else bh.bind_params(mod, params)), inputs)
    result = Compared(part_mod, got, want)
    assert got.shape == want.shape
    assert result.error <= TOLERANCE, f"relative error {result.error:.2e} > {TOLERANCE}"
    return result


def run_exported_in_fresh_process(ex, x, tmp_path):
    """``ex.export_library``, then load it and run ``main(x)`` in a new Python process that imports
    the package under test (not another installed copy); returns the output."""
    import subprocess
    import textwrap

    lib = tmp_path / "model.so"
    ex.export_library(str(lib))
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(
        f"""
        import numpy as np, tvm
        from tvm import relax
        import byoc_hetero  # registers the loader of the offloaded regions
        lib = tvm.runtime.load_module({str(lib)!r})
        vm = relax.VirtualMachine(lib, tvm.cpu())
        x = np.load({str(tmp_path / "x.npy")!r})
        np.save({str(tmp_path / "y.npy")!r}, vm["main"](tvm.runtime.tensor(x)).numpy())
        """
    )
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(bh.__file__)))
    env = dict(os.environ, PYTHONPATH=package_root)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return np.load(tmp_path / "y.npy")


@contextlib.contextmanager
def saved_rules():
    """Snapshot the rule registry and the op attributes code may change; restore afterwards."""
    import tvm

    from byoc_hetero import rules as registry
    from byoc_hetero import targets as backends
    from byoc_hetero.rules import op_rules

    saved = {name: list(t.patterns) for name, t in backends._TARGETS.items()}
    saved_targets = dict(backends._TARGETS)
    saved_checks = dict(op_rules._OP_CHECKS)
    try:
        yield
    finally:
        for name in list(backends._TARGETS):
            for op in registry.op_rule_ops(name):
                for key in map(registry.op_attr_key, registry.get_target(name).names):
                    # only keys the op has: TVM 0.27 segfaults reading a key reset but never set
                    if registry.op_rules._has_op_attr(tvm.ir.Op.get(op), key):
                        tvm.ir.Op.get(op).reset_attr(key)
        backends._TARGETS.clear()
        backends._TARGETS.update(saved_targets)
        for name, patterns in saved.items():
            backends._TARGETS[name].patterns[:] = patterns
        op_rules._OP_CHECKS.clear()
        op_rules._OP_CHECKS.update(saved_checks)
        for (name, op), check in saved_checks.items():  # the op rules registered before (tvm_cpu's)
            registry.op_rule(op, name)(check)


@pytest.fixture
def restore_rules():
    """A test may change rules freely: they are restored afterwards."""
    with saved_rules():
        yield


@pytest.fixture
def codegen_by_the_rule(monkeypatch):
    """``bh.tune``'s codegen level pinned to the cost gate's rule, untimed: each candidate region is decided
    as the rule decides it (its report line says the rule decided). For tests whose assertions need the
    regions where the rule puts them (the precision level's units, the algorithm level's sites): the level
    times tiny regions in microseconds, and once (CI, session 10) one glitch read oneDNN at 5.5 ms against
    llvm's 0.2 ms, sent a region to llvm and left the test nothing to see. No measured timing may decide
    what a test asserts (issue 35); the level's own decisions are tested on injected timings
    (tests/test_tune.py)."""
    from byoc_hetero.tune import codegen

    def by_the_rule(c, cache, options=None, repeat=15, budget_s=1.0, step=None, backends=()):
        return codegen.CodegenDecision(c, chosen=c.default, note="pinned to the cost gate's rule by the test")

    monkeypatch.setattr(codegen, "measure_region", by_the_rule)


def _int8_kernels_reason():
    from byoc_hetero.backends.onednn.precision import int8_kernels_reason

    return int8_kernels_reason()


needs_int8_kernels = pytest.mark.skipif(
    _int8_kernels_reason() is not None,
    reason=f"asserts oneDNN int8 nodes, which this CPU does not get: {_int8_kernels_reason()}")
"""For tests asserting that a region has int8 conv / dense / matmul nodes: below VNNI the int8 fusions
do not fire (their numbers are checked by the same tests where they do, and by
test_int8.py::test_without_vnni_int8_anchors_run_float32_between_their_qdq)."""


_ISA_PROBE = """
import ctypes, importlib.util, sys
import tvm_ffi  # libtvm_ffi, which the extension links (``import tvm`` would load TVM's compiler too)
for lib in sys.argv[2:]:  # oneDNN as byoc_hetero._native preloads it
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
spec = importlib.util.spec_from_file_location("_C", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(module.isa())
"""


@functools.lru_cache(maxsize=None)
def isa_under(cap: str) -> str:
    """The ISA oneDNN runs with ``ONEDNN_MAX_CPU_ISA=cap`` (read when oneDNN starts: asked in a
    subprocess). A cap above the CPU's own ISA gives the CPU's: such a cap cannot be emulated here.
    The subprocess loads this package's extension alone (:data:`_ISA_PROBE`), not ``byoc_hetero`` and TVM:
    a suite asks for up to five caps per worker."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), ONEDNN_MAX_CPU_ISA=cap)
    proc = subprocess.run([sys.executable, "-c", _ISA_PROBE, bh._C.__file__, *_onednn_libraries()], env=env,
                          capture_output=True, text=True, timeout=300)
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 else f"? ({proc.stderr[-300:]})"


def _onednn_libraries() -> list[str]:
    """The oneDNN library files this process loaded (from /proc/self/maps; none found: the extension's rpath)."""
    with contextlib.suppress(OSError), open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "/libdnnl.so" in line})
    return []


INT8_SAME_KERNELS = {"avx512_core_bf16": "avx512_core_vnni"}
"""An ISA whose int8 kernels are another's in oneDNN 3.2: avx512_core_bf16 adds bf16 kernels only, its int8
convolutions, inner products and matmuls are avx512_core_vnni's (and so is this project's int8 decision:
both are VNNI ISAs). An int8 run under one covers the other."""


def isa_cap_skip_reason(cap: str, caps: tuple[str, ...] = ()) -> str | None:
    """Why an int8 run under ``ONEDNN_MAX_CPU_ISA=cap`` adds nothing on this CPU, else None: a cap above the
    CPU's ISA cannot be emulated (oneDNN runs the CPU's own), and a cap that gives the CPU's own ISA is the
    path the uncapped run (``cap=""``) takes already (AVX512_CORE on a Skylake-SP; on a VNNI CPU it is the
    path a Skylake-SP takes, and runs); likewise a cap whose int8 kernels (:data:`INT8_SAME_KERNELS`) are
    those of the CPU's own ISA, or of another cap among the test's ``caps`` that runs here."""
    if not cap:
        return None
    ran, own = isa_under(cap), bh._C.isa()
    if ran != cap.lower():
        return f"this CPU cannot emulate {cap}: oneDNN runs {ran} under ONEDNN_MAX_CPU_ISA={cap}"
    if ran == own:
        return f"{cap} is this CPU's own ISA: the uncapped run covers it"
    kernels = INT8_SAME_KERNELS.get(ran, ran)
    if kernels == INT8_SAME_KERNELS.get(own, own):
        return f"{cap} runs the int8 kernels of this CPU's own ISA {own}: the uncapped run covers it"
    if kernels != ran and kernels.upper() in caps and isa_under(kernels.upper()) == kernels:
        return f"{cap} runs the int8 kernels of {kernels.upper()}, which runs here: that cap's run covers it"
    return None


def docs_blocks(page: str, section: str) -> tuple[str, str]:
    """The one ```py and the one ```bash block of ``section`` (a ``## `` heading's text) of docs/``page``:
    the calls the serving tests run exactly as the page shows them."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / page).read_text()
    body = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    py = re.findall(r"^```py\n(.*?)^```", body, re.S | re.M)
    sh = re.findall(r"^```bash\n(.*?)^```", body, re.S | re.M)
    assert len(py) == 1 and len(sh) == 1, (page, section, py, sh)
    return py[0], sh[0]


HANG_GUARD_S = 900.0
"""The serving tests' bound on a request whose answer a test needs, and on the waits on Ray's state and on the
metrics: a guard against a hang only, never the bound of how slow a loaded machine may be. A fixed 60 s socket
timeout failed the killed-replica test once under the full suite's load on 2 cores (issue 35), and a bound
scaled to the fixture's start (session 7) still assumed the load at the start is the load later. The waits end
on the event they need (the proxy's answer: within bs.REQUEST_TIMEOUT_S, HTTP 408 past it, later under load;
Ray's state reaching what is waited for; a metric reaching its count), and fail at once on what shows it will
not come (the deployment DEPLOY_FAILED)."""


def start_serving(application, port: int, num_cpus: int) -> None:
    """``byoc_hetero.serve.start`` of a test module's app. Ray waits a fixed 30 s for its new node to register
    with the GCS (``raylet_start_wait_time_s`` in ray/_private/node.py, not configurable) and raises "The
    current node timed out during startup"; under the full suite's load on 2 cores the raylet took longer
    (issue 35; at a load average of 24 three starts in a row failed so). The event the fixture needs is that
    registration, so a start that failed only on Ray's fixed wait is shut down and made again until one
    registers (past :data:`HANG_GUARD_S` the last error is raised); any other error is raised at once."""
    import time

    import ray

    from byoc_hetero import serve as bs

    guard = time.monotonic() + HANG_GUARD_S
    while True:
        before = descendants(os.getpid())
        try:
            bs.start(application, port=port, num_cpus=num_cpus)
            return
        except Exception as err:  # noqa: BLE001 - Ray raises a bare Exception for this
            if "timed out during startup" not in str(err) or time.monotonic() > guard:
                raise
            ray.shutdown()
            # ray.shutdown() leaves a failed start's GCS server, dashboard and monitor running (s12-suite saw
            # 7 sets after 15 min at load 20-30, feeding the load that made the starts fail): end them
            kill_all(descendants(os.getpid()) - before)


def descendants(pid: int) -> set[int]:
    """The live processes below ``pid`` (children, theirs, ...), read from /proc (empty where there is none)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), [pid]
    while frontier:
        here = frontier.pop()
        kids = [c for c, p in parent.items() if p == here and c not in found]
        found.update(kids)
        frontier.extend(kids)
    return found


def kill_all(pids) -> None:
    """SIGKILL each of ``pids`` that still lives."""
    import signal

    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def until(event, what: str, poll_s: float = 0.5, check=None) -> None:
    """Poll ``event()`` until it is true; ``check()`` (when given) runs between polls and fails at once on
    what shows the event will not come; past :data:`HANG_GUARD_S` it fails as a hang."""
    import time

    guard = time.monotonic() + HANG_GUARD_S
    while not event():
        state = check() if check is not None else None
        assert time.monotonic() < guard, f"{what}: nothing after {HANG_GUARD_S:.0f} s (a hang): {state}"
        time.sleep(poll_s)


def run_cli(*args, cwd=None):
    """``python -m byoc_hetero *args`` run in this process (``byoc_hetero.cli.main``, the function that
    entry point calls) with Python's stdout and stderr captured, as a ``subprocess.CompletedProcess``.

    A fresh interpreter costs about 7 s of CPU importing TVM and torch per call on two cores; the CLI's
    output is all Python's ``print`` (one error line, progress, reports), so the captured text is what a
    subprocess would print. tests/test_cli.py still runs the real entry point in a subprocess (``--help``,
    bad usage, and ``run`` on a model end to end)."""
    import contextlib
    import io
    import subprocess

    from byoc_hetero.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as stop:  # argparse's usage errors, and --help
                if isinstance(stop.code, str):
                    print(stop.code, file=sys.stderr)
                code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["byoc_hetero", *argv], code, out.getvalue(), err.getvalue())


# -- the suite on pytest-xdist workers (README: ``-n 2 --dist loadgroup``) -------------------------------------
SERVE_GROUP = "ray_serve"
SERVE_MODULES = frozenset({"test_serve.py", "test_serve_cli.py", "test_serve_openai.py"})
"""Modules that start Ray (one local instance per process tree, heavy on two cores) and Serve's HTTP proxy:
one xdist group, so they run one after another in one worker and never side by side. A new module that starts
Ray, binds a fixed port or otherwise must not run beside these belongs here."""

GROUP_COST_S = {
    "test_fuzz": 450, SERVE_GROUP: 350, "test_zoo_models": 350, "test_tune_zoo": 260, "test_ops_attention": 200,
    "test_notebooks": 180, "test_int8_zoo": 190, "test_gguf": 150, "test_runtime": 150, "test_tune": 150,
    "test_weight_only": 150, "test_ops_layout": 120, "test_docs": 120, "test_ops_norm": 120, "test_llm": 110,
    "test_ops_eltwise": 100, "test_ops": 100, "test_quantize": 90, "test_threads": 90, "test_ops_chains": 80,
    "test_reliability": 80, "test_llm_onnx": 80, "test_relpos": 80, "test_symbolic": 80, "test_ranges": 80,
    "test_tune_int8": 60, "test_llm_memory": 150, "test_models": 40,
}
"""Estimated seconds of the longest groups on two cores (session 12's full run with two workers: the sums of
its 80 slowest tests per group, lower bounds, with session 11's table where those say less; session 13's cuts
taken off test_int8_zoo, test_tune_int8 and test_models; rough, and only their order matters):
the groups are handed out longest first (:func:`pytest_collection_modifyitems`), so no long group starts last
and leaves the other worker idle. Other groups count :data:`PER_TEST_S` per test. Refresh from a full run's
``--durations=0``."""

PER_TEST_S = 1.0


def xdist_group(item: pytest.Item) -> str:
    """The xdist group of a test that does not name one (``@pytest.mark.xdist_group``): :data:`SERVE_GROUP`
    for the serving modules, else its module (module-scoped fixtures build a model once per group)."""
    return SERVE_GROUP if item.path.name in SERVE_MODULES else item.path.stem


def pytest_configure(config):
    # registered here too, so that the marks below are known where pytest-xdist is not installed
    config.addinivalue_line("markers", "xdist_group(name): tests of one group run in one xdist worker")


def group_cost(group: str, tests: int) -> float:
    """A group's estimated seconds: :data:`GROUP_COST_S`, else :data:`PER_TEST_S` per test."""
    return GROUP_COST_S.get(group, PER_TEST_S * tests)


def _group_name(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    return mark.args[0] if mark.args else mark.kwargs.get("name", "default")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every test without an ``xdist_group`` mark gets :func:`xdist_group`'s (before xdist's own hook of the
    same name reads the marks under ``--dist loadgroup``; without xdist the marks change nothing). In an
    xdist worker the groups are ordered longest first (:func:`group_cost`; a stable sort, so each group keeps
    its order): with ``--no-loadscope-reorder`` xdist hands them out in that order, so that no long group with
    few tests (the serving group, the tuner's zoo families) starts last while the other worker has nothing
    left (xdist's own order is by test count)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group(item)))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        counts: dict[str, int] = {}
        for item in items:
            counts[_group_name(item)] = counts.get(_group_name(item), 0) + 1
        items.sort(key=lambda item: -group_cost(_group_name(item), counts[_group_name(item)]))
