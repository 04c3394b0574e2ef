"""Heterogeneous placement on a real GPU, for a machine that has one but no TVM compiler.

    python3 tools/gpu_check.py prepare DIR           # here: build, export, references, runtime bundle
    python3 tools/gpu_check.py run DIR [RESULTS]     # on the GPU machine (TVM_USE_RUNTIME_LIB=1)

``prepare`` compiles three placements with ``byoc_hetero.placement.compile`` and exports them:
the small conv net with every conv2d on ``cuda`` (the rest on ``cpu``), the seed case
``(a + b) - (b + c)`` with the second add on ``cuda`` (``b`` feeds both devices), and a partitioned
net whose oneDNN regions stay on ``cpu`` while ``sin`` runs on ``cuda``. It saves each case's
inputs and the llvm-only (single CPU device) build's output, and packs a runtime bundle: TVM's
Python package without the compiler library, apache-tvm-ffi for the GPU machine's Python (a wheel
under ``.whl/``), oneDNN, and our extension (loaded for its runtime globals only).

Where the cuda_vendor backend's runtime library is built (the ``[cuda]`` extra's headers), more
cases, all on ``cuda`` as a user places them (the backend's regions on the GPU, the rest on the
CPU): ``cuda_vendor_mlp`` (dense + bias + relu → dense + bias in one cuBLASLt region, weights
bound), ``cuda_vendor_mlp_f16`` (the same in float16, FP32 accumulation, tolerance 2e-2),
``cuda_vendor_bmm`` (a batched ``q @ kᵀ`` of two inputs) with numpy references; and on cuDNN,
against the llvm-only build, ``cuda_vendor_convnet`` (the small conv net: conv2d + bias + relu,
strided, 1x1, then dense), ``cuda_vendor_resblock`` (a ResNet basic block: the second conv's bias,
the block's input as residual and the relu in one cuDNN call) and ``cuda_vendor_depthwise`` (the
same block with groups = channels and dilation 2). The library goes into the bundle (it is small).
cuBLASLt and cuDNN themselves are NOT carried: libcublasLt is about 500 MB and cuDNN 9 about
900 MB, and the GPU machine receives at most 64 MiB beside the work tree and reaches no network.
``run`` uses the machine's own CUDA 12 or 13 libraries and cuDNN 9 (the nvidia-* wheels of its
Python, e.g. PyTorch's, or the CUDA toolkit's lib64; or the paths in BYOC_HETERO_CUBLASLT /
BYOC_HETERO_CUDART / BYOC_HETERO_CUDNN) and says which; without them those cases report what is
missing and TVM's own CUDA code (the other cases) is what runs there.

``run`` loads each library with TVM's runtime alone, makes the VM on the placement's devices (the
plan embedded by ``compile``), runs it and prints the relative error against the reference; every
line also goes to one results file (``RESULTS``, default ``DIR/results.json``). Without a GPU it
stops cleanly at that point, saying why, with the results file written (exit code 3). With
this Python's installed TVM (a rehearsal here) it uses that instead of the bundle's. The CPU-only
suite cannot do this: CI has no GPU (tests/test_placement_gpu.py and tests/test_cuda_vendor.py skip
there).
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
import time

import numpy as np

PLAN_FUNCTION = "__byoc_hetero_placement__"
CUDA_VENDOR_KIND = "byoc_hetero_cuda"  # byoc_hetero.backends.cuda_vendor.RUNTIME_KIND
NO_GPU = 3  # run's exit code when the machine has no usable GPU


def _on_gpu(part):
    """``part`` placed as a user would: its cuda_vendor regions on cuda (a GPU backend's region goes
    to a GPU), the rest on the cpu."""
    from byoc_hetero.placement import place

    return place(part, fallback="cpu", devices=["cpu", "cuda"])


def _mlp(rng, dtype: str):
    """dense + bias + relu → dense + bias, weights bound, in ``dtype``; numpy's float32 reference."""
    from tvm import relax
    from tvm.script import relax as R

    import byoc_hetero as bh

    draw = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 64), dtype))
    ws = {n: relax.Var(n, relax.TensorType(s, dtype)) for n, s in
          (("w1", (64, 128)), ("b1", (128,)), ("w2", (128, 32)), ("b2", (32,)))}
    with bb.function("main", [x, *ws.values()]):
        with bb.dataflow():
            h = bb.emit(R.nn.relu(bb.emit(R.add(bb.emit(R.matmul(x, ws["w1"])), ws["b1"]))))
            out = bb.emit_output(bb.emit(R.add(bb.emit(R.matmul(h, ws["w2"])), ws["b2"])))
        bb.emit_func_output(out)
    params = {"w1": draw(64, 128), "b1": draw(128), "w2": draw(128, 32), "b2": draw(32)}
    xs = [draw(8, 64)]
    p32 = {k: v.astype("float32") for k, v in params.items()}
    want = np.maximum(xs[0].astype("float32") @ p32["w1"] + p32["b1"], 0) @ p32["w2"] + p32["b2"]
    return _on_gpu(bh.partition(bb.get(), params, target="cuda_vendor")), xs, want


def _gemm_cases(rng) -> dict:
    from tvm import relax
    from tvm.script import relax as R

    import byoc_hetero as bh

    cases = {"cuda_vendor_mlp": _mlp(rng, "float32")}
    # float16 tensors, FP32 accumulation: a 10-bit mantissa's error against the float32 reference
    cases["cuda_vendor_mlp_f16"] = (*_mlp(rng, "float16"), 2e-2)
    bb = relax.BlockBuilder()
    q, k = (relax.Var(n, relax.TensorType((4, 16, 32), "float32")) for n in "qk")
    with bb.function("main", [q, k]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(R.matmul(q, bb.emit(R.permute_dims(k, [0, 2, 1])))))
        bb.emit_func_output(out)
    qk = [rng.standard_normal((4, 16, 32)).astype("float32") for _ in range(2)]
    cases["cuda_vendor_bmm"] = (_on_gpu(bh.partition(bb.get(), target="cuda_vendor")), qk,
                                qk[0] @ np.swapaxes(qk[1], 1, 2))
    return cases


def _conv_block(rng, channels: int, size: int, groups: int = 1, dilation: int = 1):
    """A ResNet basic block (conv + bias + relu → conv + bias + the block's input → relu), or with
    ``groups`` / ``dilation`` a depthwise-style one; weights as params."""
    from tvm import relax
    from tvm.script import relax as R

    draw = lambda *shape: (rng.standard_normal(shape) * 0.2).astype("float32")  # noqa: E731
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, channels, size, size), "float32"))
    shapes = {"w1": (channels, channels // groups, 3, 3), "b1": (1, channels, 1, 1),
              "w2": (channels, channels // groups, 3, 3), "b2": (1, channels, 1, 1)}
    ws = {n: relax.Var(n, relax.TensorType(s, "float32")) for n, s in shapes.items()}
    conv = dict(padding=dilation, dilation=dilation, groups=groups)
    with bb.function("main", [x, *ws.values()]):
        with bb.dataflow():
            h = bb.emit(R.nn.relu(bb.emit(R.add(bb.emit(R.nn.conv2d(x, ws["w1"], **conv)), ws["b1"]))))
            y = bb.emit(R.add(bb.emit(R.nn.conv2d(h, ws["w2"], **conv)), ws["b2"]))
            out = bb.emit_output(bb.emit(R.nn.relu(bb.emit(R.add(y, x)))))
        bb.emit_func_output(out)
    return bb.get(), {n: draw(*s) for n, s in shapes.items()}


def _conv_cases(rng) -> dict:
    """conv2d on cuDNN, against the llvm-only build of the same module."""
    import byoc_hetero as bh
    from byoc_hetero.timing import build, random_inputs, run

    models = {"cuda_vendor_convnet": bh.models.small_convnet(image_size=16),
              "cuda_vendor_resblock": _conv_block(rng, 16, 16),
              "cuda_vendor_depthwise": _conv_block(rng, 16, 16, groups=16, dilation=2)}
    cases = {}
    for name, (mod, params) in models.items():
        xs = random_inputs(mod, params)
        want = run(build(bh.bind_params(mod, params)), xs)
        cases[name] = (_on_gpu(bh.partition(mod, params, target="cuda_vendor")), xs, want)
    return cases


def _cuda_vendor_cases(rng) -> dict:
    """The cuda_vendor backend's cases (placed, inputs, reference[, tolerance]); {} where its
    library is not built."""
    from byoc_hetero.backends import cuda_vendor

    if not cuda_vendor.built():
        print("cuda_vendor: runtime library not built (pip install 'byoc-hetero[cuda]', then build): cases skipped")
        return {}
    return {**_gemm_cases(rng), **_conv_cases(rng)}


def _bundle(out: str) -> None:
    """runtime.tar.xz: TVM's runtime package, apache-tvm-ffi for cp312, oneDNN, our libraries."""
    import glob
    import importlib.metadata as md
    import tempfile
    import zipfile

    import tvm

    import byoc_hetero as bh
    from byoc_hetero.backends.cuda_vendor.runtime import library_path

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
        if library_path() is not None:
            tar.add(str(library_path()), "byoc_hetero_rt/libbyoc_hetero_cuda.so")
    print(f"bundle: {os.path.getsize(os.path.join(out, 'runtime.tar.xz')) / 2**20:.1f} MiB")


def prepare(out: str) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # this checkout's package
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
    cases.update(_cuda_vendor_cases(rng))
    for name, (placed, xs, want, *tol) in cases.items():  # tol: the largest relative error taken (1e-4)
        compile_placed(placed).executable.export_library(os.path.join(out, f"{name}.so"))
        np.savez(os.path.join(out, f"{name}.npz"), want=np.asarray(want), tol=np.float64(tol[0] if tol else 1e-4),
                 **{f"x{i}": np.asarray(x) for i, x in enumerate(xs)})
        print(f"prepared {name}")
    _bundle(out)


def _device(name: str):
    import tvm

    kind, _, index = name.partition(":")
    return tvm.cuda(int(index or 0)) if kind == "cuda" else tvm.cpu(int(index or 0))


def _import_tvm(path: str):
    """This Python's TVM where installed (a rehearsal), else the bundle's runtime-only package."""
    try:
        import tvm  # noqa: F401

        return tvm, "installed"
    except ImportError:
        pass
    site = "/tmp/byoc_hetero_site"
    with tarfile.open(os.path.join(path, "runtime.tar.xz")) as tar:
        tar.extractall(site)
    sys.path.insert(0, site)
    os.environ["TVM_USE_RUNTIME_LIB"] = "1"
    import tvm

    return tvm, site


def _gpu_runtime(tvm) -> str:
    """Load TVM's CUDA device API; "" when a CUDA device is there, else why not."""
    import ctypes

    cuda_rt = os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime_cuda.so")
    try:
        ctypes.CDLL(cuda_rt, mode=ctypes.RTLD_GLOBAL)  # the runtime library alone has no CUDA device API
    except OSError as err:
        return f"TVM's CUDA runtime does not load ({err})"
    return "" if tvm.cuda(0).exist else "no CUDA device (tvm.cuda(0).exist is False)"


def _find_cuda_libraries() -> dict:
    """Point the cuda_vendor runtime at this machine's libcublasLt / libcudart (CUDA 12 or 13) and
    libcudnn (cuDNN 9, for the conv2d cases)."""
    import glob

    roots = [os.path.join(p, "nvidia") for p in sys.path if p and os.path.isdir(os.path.join(p, "nvidia"))]
    roots += ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]
    found = {}
    for env, stem, versions in (("BYOC_HETERO_CUBLASLT", "libcublasLt.so", ("12", "13")),
                                ("BYOC_HETERO_CUDART", "libcudart.so", ("12", "13")),
                                ("BYOC_HETERO_CUDNN", "libcudnn.so", ("9",))):
        if os.environ.get(env):
            found[env] = os.environ[env]
            continue
        for version in versions:
            hits = sorted(h for r in roots for h in glob.glob(os.path.join(r, "**", f"{stem}.{version}"), recursive=True))
            if hits:
                found[env] = os.environ[env] = hits[0]
                break
    return found


def _register_nvcc(tvm) -> None:
    """A library exported on a machine without a GPU driver carries its kernels as CUDA source
    (TVM's codegen compiles them only where its CUDA runtime loads); TVM compiles them when the
    library is loaded, through tvm.support.nvcc, which needs the compiler library. Here: nvcc."""
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


def _load_our_libraries(tvm, site: str) -> None:
    import ctypes

    if site == "installed":  # a rehearsal: the package's own loaders
        from byoc_hetero.backends.cuda_vendor import runtime  # imports the package: its loaders

        if runtime.built():
            runtime.load()
        return
    ctypes.CDLL(os.path.join(site, "byoc_hetero_rt", "libdnnl.so.3"), mode=ctypes.RTLD_GLOBAL)
    ctypes.CDLL(os.path.join(site, "byoc_hetero_rt", "_C.so"), mode=ctypes.RTLD_GLOBAL)  # registers the loader
    cuda_lib = os.path.join(site, "byoc_hetero_rt", "libbyoc_hetero_cuda.so")
    if os.path.exists(cuda_lib):
        ctypes.CDLL(cuda_lib, mode=ctypes.RTLD_GLOBAL)  # the cuda_vendor modules' loader


def _run_case(tvm, path: str, name: str) -> dict:
    from tvm.runtime.vm import VirtualMachine

    data = np.load(os.path.join(path, f"{name}.npz"))
    lib = tvm.runtime.load_module(os.path.join(path, f"{name}.so"))
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
    devices[-1].sync()
    per_call = (time.perf_counter() - start) / 20
    want, tol = data["want"], float(data["tol"]) if "tol" in data.files else 1e-4
    err = float(np.max(np.abs(got.astype("float64") - want)) / max(float(np.max(np.abs(want))), 1e-30))
    kinds, stack = set(), [lib]
    while stack:  # every module linked into the library: the GPU code must be among them
        m = stack.pop()
        kinds.add(str(m.kind))
        stack.extend(m.imports)
    on_gpu = "cuda" in kinds or (name.startswith("cuda_vendor") and CUDA_VENDOR_KIND in kinds)
    return {"case": name, "devices": plan["devices"], "modules": sorted(kinds), "rel_err": err,
            "ms_per_call": per_call * 1e3, "tol": tol, "ok": err <= tol and on_gpu}


def run_cases(path: str, results: str | None = None) -> int:
    """On the GPU machine: run every case, print and save the results; 1 if any is off, 3 without a GPU."""
    results = results or os.path.join(path, "results.json")
    tvm, site = _import_tvm(path)
    report = {"tvm": tvm.__version__, "runtime": site, "cases": []}

    def save(code: int) -> int:
        with open(results, "w") as f:
            json.dump(report, f, indent=1)
        print(f"results: {results}")
        return code

    report["no_gpu"] = _gpu_runtime(tvm)
    print("tvm", tvm.__version__, f"({site})", "cuda available:", not report["no_gpu"])
    if report["no_gpu"]:
        print(f"no GPU: {report['no_gpu']}; stopping before the cases (prepared: "
              f"{sorted(p[:-3] for p in os.listdir(path) if p.endswith('.so'))})")
        return save(NO_GPU)
    _register_nvcc(tvm)
    report["cuda_libraries"] = _find_cuda_libraries()
    print("cuBLASLt / CUDA runtime for cuda_vendor:", report["cuda_libraries"] or "none found")
    _load_our_libraries(tvm, site)
    failed = 0
    for lib_path in sorted(p for p in os.listdir(path) if p.endswith(".so")):
        name = lib_path[:-3]
        try:
            row = _run_case(tvm, path, name)
        except Exception as err:  # noqa: BLE001 - one case's failure (a library missing there) is its result
            row = {"case": name, "ok": False, "error": f"{type(err).__name__}: {str(err)[:2000]}"}
        report["cases"].append(row)
        failed += not row["ok"]
        if "error" in row:
            print(f"{name:32s} ERROR {row['error'][:400]}")
        else:
            print(f"{name:32s} devices={row['devices']} modules={row['modules']} rel.err={row['rel_err']:.1e} "
                  f"{row['ms_per_call']:.2f} ms/call {'OK' if row['ok'] else 'MISMATCH'}")
    return save(1 if failed else 0)


def main() -> int:
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in ("prepare", "run") or (sys.argv[1] == "prepare"
                                                                                  and len(sys.argv) == 4):
        print(__doc__)
        return 2
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
        return 0
    return run_cases(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else None)


if __name__ == "__main__":
    sys.exit(main())
