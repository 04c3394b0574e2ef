"""Build and load the benchmark's native module ``_bench`` (not part of the byoc_hetero package).

``_bench`` holds the bare oneDNN references (``bench_chain``, see cpp/bench/bench_primitives.h)
and registers the TVM global ``byoc_hetero.bench.time_call``. It is built from this checkout with
CMake (``-DBYOC_HETERO_BENCH=ON``, target ``_bench``) into ``build-bench/`` the first time it is
needed, in a few seconds; later builds are incremental.

Building needs what building the package needs, in this environment: cmake, ninja (or make),
pybind11, apache-tvm-ffi and the oneDNN headers (onednn-devel-cpu-gomp), which ``pip install
".[test]"`` and ``".[bench]"`` install. ``missing_tools()`` says what is absent.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def missing_tools() -> list[str]:
    """What building _bench needs and this environment lacks (empty: it can be built)."""
    missing = [tool for tool in ("cmake",) if shutil.which(tool) is None]
    for dist in ("pybind11", "apache-tvm-ffi", "onednn-devel-cpu-gomp", "onednn-cpu-gomp"):
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist)
    return missing


def load(build_dir: str | None = None, quiet: bool = True):
    """Build (if needed) and import ``_bench`` from ``build_dir`` (default: <repo>/build-bench)."""
    build_dir = build_dir or os.path.join(ROOT, "build-bench")
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"cannot build the benchmark module _bench: missing {', '.join(missing)} "
                           f"(pip install '.[bench]')")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    out = subprocess.DEVNULL if quiet else None
    subprocess.run(["cmake", "-S", ROOT, "-B", build_dir, *generator, "-DBYOC_HETERO_BENCH=ON",
                    f"-DPython_EXECUTABLE={sys.executable}"], check=True, stdout=out)
    subprocess.run(["cmake", "--build", build_dir, "--target", "_bench", "-j", "2"], check=True, stdout=out)
    (path,) = glob.glob(os.path.join(build_dir, "_bench*.so"))
    import tvm_ffi  # noqa: F401  (libtvm_ffi first: _bench registers a global with it)

    spec = importlib.util.spec_from_file_location("_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
