"""Heterogeneous placement on a real GPU, for a machine that has one but no TVM compiler.

    python3 tools/gpu_check.py prepare DIR     # here: build, export, references, runtime bundle
    python3 tools/gpu_check.py run DIR         # on the GPU machine (TVM_USE_RUNTIME_LIB=1)

``prepare`` compiles three placements with ``byoc_hetero.placement.compile`` and exports them:
the small conv net with every conv2d on ``cuda`` (the rest on ``cpu``), the seed case
``(a + b) - (b + c)`` with the second add on ``cuda`` (``b`` feeds both devices), and a partitioned
net whose oneDNN regions stay on ``cpu`` while ``sin`` runs on ``cuda``. It saves each case's
inputs and the llvm-only (single CPU device) build's output, and packs a runtime bundle: TVM's
Python package without the compiler library, apache-tvm-ffi for the GPU machine's Python (a wheel
under ``.whl/``), oneDNN, and our extension (loaded for its runtime globals only).

``run`` loads each library with TVM's runtime alone, makes the VM on the placement's devices (the
plan embedded by ``compile``), runs it and prints the relative error against the reference. The
CPU-only suite cannot do this: CI has no GPU (tests/test_placement_gpu.py skips there).
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
import time

import numpy as np

PLAN_FUNCTION = "__byoc_hetero_placement__"


def prepare(out: str) -> None:
    import glob
    import importlib.metadata as md
    import tempfile
    import zipfile

    import tvm
    from tvm import relax

    import byoc_hetero as bh
    from byoc_hetero.placement import compile as compile_placed
    from byoc_hetero.placement import place
    from byoc_hetero.placement.build import PLAN_FUNCTION as plan_function
    from byoc_hetero.timing import build, random_inputs, run

    assert plan_function == PLAN_FUNCTION, "tools/gpu_check.py: plan function name changed"
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from test_placement import SharedInput, sin_net

    os.makedirs(out, exist_ok=True)
    cases = {}
    mod, params = bh.models.small_convnet(image_size=16)
    bound = bh.bind_params(mod, params)
    inputs = random_inputs(mod, params)
    cases["conv_on_cuda"] = (place(bound, {"relax.nn.conv2d": "cuda"}, fallback="cpu"), inputs,
                             run(build(bound), inputs))
    rng = np.random.default_rng(0)
    abc = [rng.standard_normal((2, 3)).astype("float32") for _ in range(3)]
    cases["shared_input"] = (place(SharedInput, {lambda s: s.op_name == "relax.add" and s.index == 1: "cuda"},
                                   fallback="cpu"), abc, (abc[0] + abc[1]) - (abc[1] + abc[2]))
    smod, sparams, _, sinputs, swant = sin_net()
    part = bh.partition(smod, sparams)
    cases["onednn_regions_cpu_sin_cuda"] = (place(part, {"relax.sin": "cuda"}, fallback="cpu"), sinputs, swant)
    for name, (placed, xs, want) in cases.items():
        compile_placed(placed).executable.export_library(os.path.join(out, f"{name}.so"))
        np.savez(os.path.join(out, f"{name}.npz"), want=np.asarray(want),
                 **{f"x{i}": np.asarray(x) for i, x in enumerate(xs)})
        print(f"prepared {name}")

    site = os.path.dirname(os.path.dirname(tvm.__file__))
    with tarfile.open(os.path.join(out, "runtime.tar.xz"), "w:xz", preset=1) as tar:
        skip = ("libtvm_compiler.so", os.sep + "3rdparty", os.sep + "src" + os.sep)
        tar.add(os.path.join(site, "tvm"), "tvm",
                filter=lambda ti: None if any(s in ti.name for s in skip) or "__pycache__" in ti.name else ti)
        wheels = glob.glob(os.path.join(os.path.dirname(__file__), "..", ".whl", "apache_tvm_ffi-*-cp312-*.whl"))
        if not wheels:
            raise SystemExit("put the apache-tvm-ffi wheel for the GPU machine's Python under .whl/ (see README)")
        with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheels[0]) as z:
            z.extractall(tmp)
            tar.add(os.path.join(tmp, "tvm_ffi"), "tvm_ffi")
        tar.add(bh._C.__file__, "byoc_hetero_rt/_C.so")
        lib = next(str(f.locate()) for f in md.distribution("onednn-cpu-gomp").files or [] if f.name == "libdnnl.so.3")
        tar.add(os.path.realpath(lib), "byoc_hetero_rt/libdnnl.so.3")
    print(f"bundle: {os.path.getsize(os.path.join(out, 'runtime.tar.xz')) / 2**20:.1f} MiB")


def _device(name: str):
    import tvm

    kind, _, index = name.partition(":")
    return tvm.cuda(int(index or 0)) if kind == "cuda" else tvm.cpu(int(index or 0))


def run_cases(path: str) -> int:
    """On the GPU machine: extract the bundle, run every case, print the errors; 1 if any is off."""
    site = "/tmp/byoc_hetero_site"
    with tarfile.open(os.path.join(path, "runtime.tar.xz")) as tar:
        tar.extractall(site)
    sys.path.insert(0, site)
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"
    import ctypes

    import tvm
    from tvm.runtime.vm import VirtualMachine

    cuda_rt = os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so")
    ctypes.CDLL(cuda_rt, mode=ctypes.RTLD_GLOBAL)  # the runtime library alone has no CUDA device API
    print("tvm", tvm.__version__, "cuda available:", tvm.cuda(0).exist)

    # A library exported on a machine without a GPU driver carries its kernels as CUDA source
    # (TVM's codegen compiles them only where its CUDA runtime loads); TVM compiles them when the
    # library is loaded, through tvm.support.nvcc, which needs the compiler library. Here: nvcc.
    import subprocess
    import tempfile

    import tvm_ffi

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _compile(code):
        major, minor = tvm.cuda(0).compute_version.split(".")
        with tempfile.TemporaryDirectory() as tmp:
            src, out = os.path.join(tmp, "k.cu"), os.path.join(tmp, "k.fatbin")
            with open(src, "w") as f:
                f.write(code)
            subprocess.run(["nvcc", "--fatbin", "-O3", "-w", f"-arch=sm_{major}{minor}", src, "-o", out], check=True)
            with open(out, "rb") as f:
                return bytearray(f.read())
    ctypes.CDLL(os.path.join(site, "byoc_hetero_rt", "libdnnl.so.3"), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(os.path.join(site, "byoc_hetero_rt", "_C.so"), mode=ctypes.RTLD_GLOBAL)  # registers the loader
    failed = 0
    for lib_path in sorted(p for p in os.listdir(path) if p.endswith(".so")):
        name = lib_path[:-3]
        data = np.load(os.path.join(path, f"{name}.npz"))
        lib = tvm.runtime.load_module(os.path.join(path, lib_path))
        plan = json.loads(str(VirtualMachine(lib, tvm.cpu())[PLAN_FUNCTION]()))
        devices = [_device(d) for d in plan["devices"]]
        vm = VirtualMachine(lib, devices)
        entry = plan["functions"]["main"]
        n_const = entry.get("num_constants", 0)
        params = entry["params"]
        consts = []
        if entry.get("constants"):
            values = vm[entry["constants"]]()
            consts = [values[i].copyto(_device(d)) for i, d in enumerate(params[len(params) - n_const:])]
        xs = [data[f"x{i}"] for i in range(len(params) - n_const)]
        args = [tvm.runtime.tensor(x, _device(d)) for x, d in zip(xs, params)]
        got = vm["main"](*args, *consts).numpy()
        start = time.perf_counter()
        for _ in range(20):
            vm["main"](*args, *consts)
        per_call = (time.perf_counter() - start) / 20
        want = data["want"]
        err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
        kinds, stack = set(), [lib]
        while stack:  # every module linked into the library: the GPU kernels must be among them
            m = stack.pop()
            kinds.add(str(m.kind))
            stack.extend(m.imports)
        kinds = sorted(kinds)
        ok = err <= 1e-4 and "cuda" in kinds
        failed += not ok
        print(f"{name:32s} devices={plan['devices']} modules={kinds} rel.err={err:.1e} "
              f"{per_call * 1e3:.2f} ms/call {'OK' if ok else 'MISMATCH'}")
    return 1 if failed else 0


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("prepare", "run"):
        print(__doc__)
        return 2
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
        return 0
    return run_cases(sys.argv[2])


if __name__ == "__main__":
    sys.exit(main())
