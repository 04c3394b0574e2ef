"""Threads: several VMs on one executable at once, the thread knob, no oversubscription.

What is asserted is behaviour, never timing: every concurrent call returns the right result; the
admission gate never lets more OpenMP threads run region calls at once than there are CPUs; the
knob decides how many threads a module is built for.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.codegen import region_modules
from byoc_hetero.timing import build, random_inputs, run

_C = bh._C


@pytest.fixture(scope="module")
def resnet():
    mod, params = bh.models.resnet18(image_size=32, num_classes=10)
    ex = build(bh.partition(mod, params))
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 3, 32, 32)).astype("float32") for _ in range(4)]
    want = [run(build(bh.bind_params(mod, params)), [x]) for x in xs[:1]]
    want += [run(ex, [x]) for x in xs[1:]]
    return ex, xs, want


def _hammer(ex, xs, want, num_threads=4, calls=8):
    """num_threads threads, each with its own VM on the one executable, each its own input."""
    errors = []
    barrier = threading.Barrier(num_threads)

    def worker(i):
        try:
            vm = relax.VirtualMachine(ex, tvm.cpu())
            x = tvm.runtime.tensor(xs[i % len(xs)])
            barrier.wait()
            for _ in range(calls):
                got = vm["main"](x).numpy()
                np.testing.assert_allclose(got, want[i % len(xs)], rtol=1e-4, atol=1e-4)
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(num_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_vms_on_one_executable_from_several_threads(resnet):
    ex, xs, want = resnet
    _C.reset_concurrency_stats()
    errors = _hammer(ex, xs, want)
    assert not errors, errors
    stats = _C.concurrency_stats()
    assert stats["calls"] == 4 * 8
    # the admission gate: never more busy OpenMP threads than CPUs (a call alone may be wider)
    threads = max(json.loads(m["get_runtime_info"]())["threads"] for m in region_modules(ex))
    assert stats["max_active_threads"] <= max(_C.available_cpus(), threads)
    # each concurrent caller got its own execution context; never more than the callers
    (region,) = region_modules(ex)
    assert 1 <= json.loads(region["get_runtime_info"]())["contexts"] <= 4


def test_reinit_while_other_threads_run():
    """A caller sees either the old or the new constants, never a mix (or a crash)."""
    mod, params = bh.models.mlp(batch=2, features=64, hidden=(32,), num_classes=8)
    ex = build(bh.partition(mod, params))
    (region,) = region_modules(ex)
    x = random_inputs(mod, params)[0]
    old = run(ex, [x])
    # the constants in __init_ order: each dense layer's weight, then its bias
    values = [params[k] for k in ("fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")]
    graph = json.loads(region["get_graph_json"]())
    assert [graph["tensors"][c["tensor"]]["shape"] for c in graph["constants"]] == [list(v.shape) for v in values]
    doubled = [2 * v for v in values]
    new = run(build(bh.partition(mod, {k: 2 * v for k, v in params.items()})), [x])
    stop = threading.Event()
    seen, errors, calls = set(), [], []
    vms = [relax.VirtualMachine(ex, tvm.cpu()) for _ in range(3)]
    for vm in vms:  # creating a VM loads the executable's constants: do it before re-initializing
        vm["main"](tvm.runtime.tensor(x))

    def worker(vm):
        xt = tvm.runtime.tensor(x)
        try:
            while not stop.is_set():
                got = vm["main"](xt).numpy()
                calls.append(1)
                if np.allclose(got, old, rtol=1e-4, atol=1e-4):
                    seen.add("old")
                elif np.allclose(got, new, rtol=1e-4, atol=1e-4):
                    seen.add("new")
                else:
                    errors.append(got)
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(vm,)) for vm in vms[1:]]
    for t in threads:
        t.start()
    init = region[f"__init_{region['get_symbol']()}"]
    # re-initialize until the workers have made calls in between (on a loaded machine 20 re-inits
    # could finish before a worker thread was scheduled at all), within a time limit
    deadline = time.monotonic() + 30
    i = 0
    while (i < 20 or len(calls) < 20) and time.monotonic() < deadline:
        init([tvm.runtime.tensor(v) for v in (doubled if i % 2 == 0 else values)])
        i += 1
        time.sleep(0.001)  # lets the workers take the GIL between re-inits
    init([tvm.runtime.tensor(v) for v in doubled])
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:1]
    assert seen  # the workers ran
    assert np.allclose(vms[0]["main"](tvm.runtime.tensor(x)).numpy(), new, rtol=1e-4, atol=1e-4)


def test_thread_knob():
    assert _C.num_threads() >= 1
    assert _C.available_cpus() >= 1
    assert _C.max_concurrent_calls(1) == _C.available_cpus()
    # one binding path: the thread functions are _C's (no TVM globals)
    assert tvm.get_global_func("byoc_hetero.runtime.num_threads", allow_missing=True) is None
    with pytest.raises(ValueError, match="must be >= 1"):
        _C.set_num_threads(0)


def test_knob_decides_threads_per_module_and_concurrency(tmp_path):
    """In a fresh process: BYOC_HETERO_NUM_THREADS=1 builds 1-thread modules, and two callers may
    then run region calls side by side (as many as CPUs); set_num_threads applies to modules
    created afterwards."""
    script = textwrap.dedent(
        """
        import json, threading
        import numpy as np, tvm
        from tvm import relax
        import byoc_hetero as bh
        from byoc_hetero.timing import build, random_inputs, run

        def threads_of(ex):
            found, stack = [], [ex.jit()]
            while stack:
                m = stack.pop()
                found += [m] if m.kind == "byoc_hetero" else []
                stack.extend(m.imports)
            return [json.loads(m["get_runtime_info"]())["threads"] for m in found]

        mod, params = bh.models.small_convnet(batch=2)
        ex = build(bh.partition(mod, params))
        x = random_inputs(mod, params)[0]
        want = run(ex, [x])
        bh._C.reset_concurrency_stats()
        errors = []
        def work():
            vm = relax.VirtualMachine(ex, tvm.cpu())
            for _ in range(20):
                if not np.allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), want, atol=1e-5):
                    errors.append("wrong")
        ts = [threading.Thread(target=work) for _ in range(3)]
        [t.start() for t in ts]; [t.join() for t in ts]
        first = threads_of(ex)
        bh._C.set_num_threads(2)
        second = threads_of(build(bh.partition(mod, params)))
        print(json.dumps({"knob": bh._C.num_threads(), "first": first, "second": second,
                          "stats": bh._C.concurrency_stats(), "cpus": bh._C.available_cpus(),
                          "errors": errors}))
        """
    )
    env = dict(os.environ, BYOC_HETERO_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["first"] == [1] and out["second"] == [2] and out["knob"] == 2
    assert not out["errors"]
    assert out["stats"]["calls"] == 60
    assert out["stats"]["max_active_threads"] <= out["cpus"]
    assert out["stats"]["max_active"] <= out["cpus"]


# ------------------------------------------------------------------------------------------------
# Contention: calls found contended run with fewer threads, on plans made for that count. The
# "reduced" mode forces that path on every call, so what it computes can be checked on any machine.


@contextlib.contextmanager
def _adaptation(mode: str):
    saved = _C.thread_adaptation()
    _C.set_thread_adaptation(mode)
    _C.reset_adaptation()
    try:
        yield
    finally:
        _C.set_thread_adaptation(saved)
        _C.reset_adaptation()


@contextlib.contextmanager
def _module_threads(n: int):
    saved = _C.num_threads()
    _C.set_num_threads(n)
    try:
        yield
    finally:
        _C.set_num_threads(saved)


def _contention_plans(ex) -> list[list[int]]:
    return [json.loads(m["get_runtime_info"]())["contention_plans"] for m in region_modules(ex)]


@pytest.mark.parametrize("model", ["resnet18", "mobilenet_v2"])
def test_reduced_threads_compute_what_llvm_computes(model):
    """A 2-thread module run on its 1-thread plan (Winograd and direct convs, depthwise, batch-norm
    folding, pooling, dense) gives the llvm-only build's output, and the full-thread plan's."""
    mod, params = getattr(bh.models, model)(image_size=32, num_classes=10)
    x = random_inputs(mod, params)
    want = run(build(bh.bind_params(mod, params)), x)
    with _module_threads(2):
        ex = build(bh.partition(mod, params))
    with _adaptation("off"):
        full = run(ex, x)
        assert _contention_plans(ex) == [[]]
    with _adaptation("reduced"):
        reduced = run(ex, x)
        assert _C.adaptation_stats()["reduced"] >= 1
    assert _contention_plans(ex) == [[1]]
    np.testing.assert_allclose(reduced, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(reduced, full, rtol=1e-5, atol=1e-5)


def test_reduced_plan_follows_reinit():
    """__init_ with new constants refills the plans made for fewer threads too."""
    mod, params = bh.models.mlp(batch=2, features=64, hidden=(32,), num_classes=8)
    with _module_threads(2):
        ex = build(bh.partition(mod, params))
    (region,) = region_modules(ex)
    x = random_inputs(mod, params)[0]
    vm = relax.VirtualMachine(ex, tvm.cpu())
    xt = tvm.runtime.tensor(x)
    with _adaptation("reduced"):
        old = vm["main"](xt).numpy()  # makes the 1-thread plan with the old constants
    values = [params[k] for k in ("fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")]
    region[f"__init_{region['get_symbol']()}"]([tvm.runtime.tensor(2 * v) for v in values])
    new = run(build(bh.partition(mod, {k: 2 * v for k, v in params.items()})), [x])
    assert not np.allclose(old, new)
    for mode in ("reduced", "off"):
        with _adaptation(mode):
            np.testing.assert_allclose(vm["main"](xt).numpy(), new, rtol=1e-4, atol=1e-4)


def test_concurrent_calls_while_the_mode_changes(resnet):
    """Several VMs call while another thread flips the mode: plans for fewer threads are made
    once under concurrent demand, and every call returns the right result."""
    ex, xs, want = resnet
    stop = threading.Event()

    def flip():
        modes = ("reduced", "auto", "off")
        i = 0
        while not stop.is_set():
            _C.set_thread_adaptation(modes[i % 3])
            i += 1
            stop.wait(0.002)

    saved = _C.thread_adaptation()
    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        errors = _hammer(ex, xs, want, num_threads=4, calls=8)
    finally:
        stop.set()
        flipper.join()
        _C.set_thread_adaptation(saved)
        _C.reset_adaptation()
    assert not errors, errors
    (region,) = region_modules(ex)
    threads = json.loads(region["get_runtime_info"]())["threads"]
    assert _contention_plans(ex) in ([[]], [[max(1, threads // 2)]])


def _symbolic_dense():
    """x [n, 64] @ W^T with a symbolic n: each new n makes a plan at its first call."""
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 64), "float32"))
    w = relax.Var("w", relax.TensorType((32, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            y = bb.emit_output(bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w, [1, 0])))))
        bb.emit_func_output(y)
    return bb.get(), {"w": np.random.default_rng(5).standard_normal((32, 64)).astype("float32")}


def test_a_call_that_makes_its_plan_is_no_evidence_of_contention():
    """The first call of a new shape plans it (primitives created, weights prepared, partly on one
    thread): its CPU share measures that, so it is not a watched call and cannot drop the process
    to fewer threads; the next call of that shape is watched. Counts, not timings: whatever the
    machine's load, a watched call is counted (contended or not)."""
    mod, params = _symbolic_dense()
    with _module_threads(2):
        ex = build(bh.partition(mod, params))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(6)
    with _adaptation("auto"):
        watched = []
        for rows in (4, 4, 9, 9):
            x = rng.standard_normal((rows, 64)).astype("float32")
            np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), x @ params["w"].T,
                                       rtol=1e-4, atol=1e-4)
            watched.append(_C.adaptation_stats()["watched"])
    assert watched == [0, 1, 1, 2], watched


def test_adaptation_knob():
    assert _C.thread_adaptation() in ("auto", "off", "reduced")
    with pytest.raises(ValueError, match="'auto', 'off' or 'reduced'.*got 'sometimes'"):
        _C.set_thread_adaptation("sometimes")
    stats = _C.adaptation_stats()
    assert set(stats) == {"watched", "contended", "reduced", "probes", "level"}


@pytest.mark.parametrize("mode", ["off", "reduced", "wrong"])
def test_adaptation_env(mode, tmp_path):
    """BYOC_HETERO_ADAPT_THREADS, read once: off never makes a plan for fewer threads, reduced
    always runs on one; a wrong value is a ValueError naming the three modes."""
    script = textwrap.dedent(
        """
        import json
        import byoc_hetero as bh
        from byoc_hetero.codegen import region_modules
        from byoc_hetero.timing import build, random_inputs, run

        mod, params = bh.models.small_convnet(batch=1)
        bh._C.set_num_threads(2)
        ex = build(bh.partition(mod, params))
        x = random_inputs(mod, params)
        for _ in range(3):
            run(ex, x)
        plans = [json.loads(m["get_runtime_info"]())["contention_plans"] for m in region_modules(ex)]
        print(json.dumps({"mode": bh._C.thread_adaptation(), "plans": plans,
                          "reduced": bh._C.adaptation_stats()["reduced"]}))
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(bh.__file__)))
    env = dict(os.environ, BYOC_HETERO_ADAPT_THREADS=mode,
               PYTHONPATH=os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=env)
    if mode == "wrong":
        assert proc.returncode != 0
        assert "'auto', 'off' or 'reduced'" in proc.stderr and "got 'wrong'" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["mode"] == mode
    if mode == "off":
        assert out["plans"] == [[]] * len(out["plans"]) and out["reduced"] == 0
    else:
        assert out["plans"] == [[1]] * len(out["plans"]) and out["reduced"] >= 3


def test_profiling_runs_the_modules_own_plan():
    """While profiling is on, calls run the module's own plan, so its profile counts every call
    even when contention (here forced) would have run them with fewer threads."""
    mod, params = bh.models.small_convnet(batch=1)
    with _module_threads(2):
        ex = build(bh.partition(mod, params))
    regions = region_modules(ex)
    x = random_inputs(mod, params)
    with _adaptation("reduced"):
        for m in regions:
            m["set_profiling"](True)
        try:
            run(ex, x)
        finally:
            for m in regions:
                m["set_profiling"](False)
        assert _C.adaptation_stats()["reduced"] == 0
    assert _contention_plans(ex) == [[]] * len(regions)
    for m in regions:
        assert all(s["calls"] == 1 for s in json.loads(m["get_profile"]()) if s["phase"] == "run")
