"""Reliability: corrupt or foreign artifacts, concurrency, memory.

Anything that could crash the interpreter runs in a subprocess, so a crash is a test failure with
its output, not a dead test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import tvm
from conftest import TOLERANCE, run_cli
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.timing import build, random_inputs, relative_error, run

MAGIC = b"BYOCHG02"  # then the document's digest (16 hex digits), then the document
DIGEST_LEN = 16


def _python(script: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """An exported small conv net, its input, and the output of the original build."""
    mod, params = bh.models.small_convnet(batch=2)
    ex = build(bh.partition(mod, params))
    inputs = random_inputs(mod, params)
    tmp = tmp_path_factory.mktemp("exported")
    lib = tmp / "model.so"
    ex.export_library(str(lib))
    np.save(tmp / "x.npy", inputs[0])
    return lib, tmp / "x.npy", run(ex, inputs)


def _region_blob(lib) -> bytes:
    data = lib.read_bytes()
    start = data.index(MAGIC)
    body = start + len(MAGIC) + DIGEST_LEN
    depth, end = 0, body
    for i in range(body, len(data)):  # the JSON object that follows the magic and the digest
        depth += {ord("{"): 1, ord("}"): -1}.get(data[i], 0)
        if depth == 0:
            end = i + 1
            break
    return data[start:end]


def test_truncated_and_bit_flipped_regions_always_raise(exported, tmp_path):
    """Every cut and every single-bit flip of the serialized region is refused with an error (the
    document's digest, region format version 4); none loads, none crashes."""
    blob = _region_blob(exported[0])
    rng = np.random.default_rng(0)
    cases = [blob[:n] for n in sorted({0, 1, 7, 8, 9, 23, 24, 25, len(blob) // 2, len(blob) - 1} |
                                      set(rng.integers(0, len(blob), 40).tolist()))]
    for _ in range(150):
        flipped = bytearray(blob)
        pos = int(rng.integers(0, len(blob)))
        flipped[pos] ^= 1 << int(rng.integers(0, 8))
        cases.append(bytes(flipped))
    np.save(tmp_path / "cases.npy", np.array(cases, dtype=object), allow_pickle=True)
    proc = _python(f"""
        import numpy as np, tvm, byoc_hetero
        load = tvm.get_global_func("ffi.Module.load_from_bytes.byoc_hetero")
        raised = loaded = 0
        for blob in np.load({str(tmp_path / "cases.npy")!r}, allow_pickle=True):
            try:
                mod = load(bytes(blob))
                mod["get_symbol"]()
                loaded += 1
            except byoc_hetero.IntegrityError as err:
                assert str(err), "empty message"
                raised += 1
        print(raised, loaded)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    raised, loaded = map(int, proc.stdout.split())
    assert (raised, loaded) == (len(cases), 0)


def _patched_library(lib, tmp_path, old: bytes, new: bytes, name: str = "patched.so"):
    """The library with ``old`` replaced by ``new`` inside the serialized region only."""
    data = lib.read_bytes()
    blob = _region_blob(lib)
    start = data.index(blob)
    assert len(old) == len(new) and blob.count(old) >= 1
    out = tmp_path / name
    out.write_bytes(data[:start] + blob.replace(old, new) + data[start + len(blob):])
    return out


def _load_and_run(lib, x) -> subprocess.CompletedProcess:
    return _python(f"""
        import numpy as np, tvm
        from tvm import relax
        import byoc_hetero
        lib = tvm.runtime.load_module({str(lib)!r})
        vm = relax.VirtualMachine(lib, tvm.cpu())
        print(vm["main"](tvm.runtime.tensor(np.load({str(x)!r}))).numpy().sum())
    """)


def test_library_from_another_format_version_is_refused(exported, tmp_path):
    """Each patched library, loaded and run in one subprocess (one interpreter start, not three): each
    raises byoc_hetero's IntegrityError with its message, and the process lives on to the next."""
    lib, x, _ = exported
    cases = ((b'"version": 4', b'"version": 7', "the region document is damaged"),
             (MAGIC, b"BYOCHG09", "expected the magic 'BYOCHG02'"),
             (MAGIC, b"BYOCHG01", "older byoc_hetero"))
    libs = [str(_patched_library(lib, tmp_path, old, new, f"patched{i}.so")) for i, (old, new, _) in enumerate(cases)]
    proc = _python(f"""
        import numpy as np, tvm
        from tvm import relax
        import byoc_hetero
        for path in {libs!r}:
            try:
                vm = relax.VirtualMachine(tvm.runtime.load_module(path), tvm.cpu())
                print("ran", vm["main"](tvm.runtime.tensor(np.load({str(x)!r}))).numpy().sum())
            except Exception as err:
                print("raised", type(err).__name__, " ".join(str(err).split()))
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]  # Python exceptions, no crash
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == len(cases), proc.stdout
    for line, (_, _, what) in zip(lines, cases):
        assert line.startswith("raised IntegrityError ") and what in line, line


def test_region_whose_constants_are_missing_is_refused(exported, tmp_path):
    """The library's constant table lacks a weight the region needs: a clear error, no crash."""
    import json

    lib, x, _ = exported
    blob = _region_blob(lib)
    name = json.loads(blob[len(MAGIC) + DIGEST_LEN:])["constants"][0]["name"].encode()
    data = lib.read_bytes()
    at = data.index(name)  # TVM's constant table comes before the serialized region
    assert at < data.index(blob)
    broken = tmp_path / "no_const.so"
    broken.write_bytes(data[:at] + name[:-1] + b"X" + data[at + len(name):])
    proc = _load_and_run(broken, x)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "missing entry for constant" in proc.stderr and name.decode() in proc.stderr


def _cuts(size: int, rng) -> list[int]:
    """Cut points over a file of ``size`` bytes: inside the ELF header, at table edges, spread, near the end."""
    return sorted({0, 3, 16, 52, 63, 64, 65, 4096, size // 7, size // 3, size // 2, size - 4096, size - 65,
                   size - 1} | set(rng.integers(1, size, 20).tolist()))


def test_truncated_library_is_an_integrity_error_never_a_crash(exported, tmp_path):
    """A library cut short at any of ~30 points: ``bh.load_module`` raises IntegrityError naming the
    file (it was SIGBUS in 9 of 15 cuts through tvm.runtime.load_module); ``bh.vm(path)`` and the
    CLI's ``run model.so`` too (exit code 2). One subprocess for the damaged files (a crash must not end
    the test run), the CLI's ``main`` in it; the whole file's run in this process (``conftest.run_cli``)."""
    lib, x, want = exported
    data = lib.read_bytes()
    paths = []
    for n in _cuts(len(data), np.random.default_rng(1)):
        path = tmp_path / f"cut_{n}.so"
        path.write_bytes(data[:n])
        paths.append(str(path))
    proc = _python(f"""
        import byoc_hetero as bh
        for path in {paths!r}:
            try:
                bh.load_module(path)
                print("loaded", path)
            except bh.IntegrityError as err:
                assert path in str(err), err
                print("refused")
        try:
            bh.vm({paths[len(paths) // 2]!r})
            print("loaded by vm")
        except bh.IntegrityError:
            print("refused")
        import contextlib, io, sys
        from byoc_hetero.cli import main  # what `python -m byoc_hetero` calls
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                code = main(["run", {paths[-3]!r}, "--input", {str(x)!r}])
            except SystemExit as stop:
                code = stop.code
        print(err.getvalue()[-2000:], file=sys.stderr)
        print("cli", code, "damaged" in err.getvalue())
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["refused"] * (len(paths) + 1) + ["cli", "2", "True"], (proc.stdout,
                                                                                          proc.stderr[-2000:])
    whole = run_cli("run", lib, "--input", x, "--output", tmp_path / "y.npy")
    assert whole.returncode == 0, whole.stderr[-2000:]
    assert relative_error(np.load(tmp_path / "y.npy"), want) <= TOLERANCE


def test_bit_flips_in_constants_are_errors_naming_the_region(tmp_path):
    """Single-bit flips inside the weights' bytes of an exported library (3 of 34 such flips changed
    the outputs silently before the digests): every one is an IntegrityError naming the region and
    the constant, at the first call; none crashes, none computes."""
    mod, params = bh.models.small_convnet(batch=2)
    part = bh.partition(mod, params)
    lib = tmp_path / "model.so"
    build(part).export_library(str(lib))
    data = lib.read_bytes()
    spans = []
    for name, const in part.attrs["const_name_to_constant"].items():
        raw = const.numpy().tobytes()
        at = data.find(raw)
        if len(raw) >= 64 and at >= 0 and data.find(raw, at + 1) < 0:
            spans.append((str(name), at, len(raw)))
    assert len(spans) >= 2, "the weights' bytes are found in the library"
    rng = np.random.default_rng(2)
    cases = []
    for k in range(24):
        name, at, length = spans[k % len(spans)]
        flipped = bytearray(data)
        flipped[at + int(rng.integers(0, length))] ^= 1 << int(rng.integers(0, 8))
        path = tmp_path / f"flip_{k}.so"
        path.write_bytes(bytes(flipped))
        cases.append((str(path), name))
    x = random_inputs(mod, params)[0]
    np.save(tmp_path / "x.npy", x)
    proc = _python(f"""
        import numpy as np, tvm
        from tvm import relax
        import byoc_hetero as bh
        x = tvm.runtime.tensor(np.load({str(tmp_path / "x.npy")!r}))
        for path, name in {cases!r}:
            try:
                relax.VirtualMachine(bh.load_module(path), tvm.cpu())["main"](x)
                print("computed")
            except bh.IntegrityError as err:
                ok = name in str(err) and "region" in str(err) and "damaged" in str(err)
                print("refused" if ok else "unclear:" + str(err)[:300].replace(" ", "_"))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["refused"] * len(cases), proc.stdout


def test_four_threads_thousand_calls_each_match_one_thread(exported):
    mod, params = bh.models.small_convnet(batch=1)
    ex = build(bh.partition(mod, params))
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((1, 3, 16, 16)).astype("float32") for _ in range(8)]
    vm = relax.VirtualMachine(ex, tvm.cpu())
    want = [vm["main"](tvm.runtime.tensor(x)).numpy() for x in inputs]
    failures: list[str] = []

    def worker(tid: int) -> None:
        local = relax.VirtualMachine(ex, tvm.cpu())  # VMs are per thread; the executable is shared
        args = [tvm.runtime.tensor(x) for x in inputs]
        for i in range(1000):
            k = (i + tid) % len(inputs)
            got = local["main"](args[k]).numpy()
            if not np.array_equal(got, want[k]):
                failures.append(f"thread {tid} call {i}: max diff {np.abs(got - want[k]).max()}")
                return

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]


UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
needs_plain_allocator = pytest.mark.skipif(
    UNDER_ASAN, reason="AddressSanitizer's quarantine keeps freed memory: resident size is not comparable")


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@needs_plain_allocator
def test_ten_thousand_runs_keep_memory_flat():
    mod, params = bh.models.mlp(features=64, hidden=(32,), num_classes=8)
    ex = build(bh.partition(mod, params))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = tvm.runtime.tensor(np.ones((1, 64), "float32"))
    for _ in range(500):  # warm up allocators and pools
        vm["main"](x)
    before = _rss_mb()
    for _ in range(10_000):
        vm["main"](x)
    growth = _rss_mb() - before
    assert growth < 8, f"resident memory grew {growth:.1f} MB over 10,000 runs"


@needs_plain_allocator
def test_building_and_dropping_modules_does_not_leak():
    import gc

    mod, params = bh.models.mlp(features=256, hidden=(256,), num_classes=16)
    part = bh.partition(mod, params)
    (ext,) = part.attrs["external_mods"]
    graph_json = ext["get_graph_json"]()
    create = tvm.get_global_func("byoc_hetero.runtime.create")
    # the region's own constants: their digests are in the document (format version 4)
    consts = {str(name): value for name, value in part.attrs["const_name_to_constant"].items()}

    def cycle(n):
        for _ in range(n):
            m = create(graph_json)
            names = list(m["get_const_vars"]())
            m[f"__init_{m['get_symbol']()}"]([consts[str(name)] for name in names])
            del m
        gc.collect()

    cycle(50)
    before = _rss_mb()
    cycle(400)  # each module holds ~0.3 MB of reordered weights: a leak would show as > 100 MB
    growth = _rss_mb() - before
    assert growth < 20, f"resident memory grew {growth:.1f} MB after 400 create/drop cycles"


def test_offloaded_output_still_matches_after_reload(exported):
    lib, x, want = exported
    proc = _python(f"""
        import numpy as np, tvm
        from tvm import relax
        import byoc_hetero
        vm = relax.VirtualMachine(tvm.runtime.load_module({str(lib)!r}), tvm.cpu())
        np.save({str(lib.with_suffix(".y.npy"))!r}, vm["main"](tvm.runtime.tensor(np.load({str(x)!r}))).numpy())
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert relative_error(np.load(lib.with_suffix(".y.npy")), want) <= TOLERANCE
