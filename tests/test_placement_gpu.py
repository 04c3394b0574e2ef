"""Placement with a CUDA device: code generation (no GPU needed), CUDA compile-only with nvcc
(where nvcc is installed), execution (where a GPU is present)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero._relax import runtime_kinds
from byoc_hetero.placement import PlacementError, compile, gpu_sources, lower, place, validate_lowered, vm
from byoc_hetero.placement.devices import DEFAULT_CUDA_ARCH
from byoc_hetero.timing import build, random_inputs, relative_error, run

NVCC = shutil.which("nvcc")
HAS_GPU = tvm.cuda(0).exist

requires_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed: CUDA compile-only check skipped")
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU on this machine: GPU execution skipped")

KERNEL = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(')


@pytest.fixture(scope="module")
def conv_on_cuda():
    mod, params = bh.models.small_convnet(image_size=16)
    bound = bh.bind_params(mod, params)
    placed = place(bound, {"relax.nn.conv2d": "cuda"}, fallback="cpu")
    return mod, params, bound, placed


def test_kernels_are_generated_for_the_device_of_their_op(conv_on_cuda):
    *_, placed = conv_on_cuda
    lowered = lower(placed)
    targets = {gv.name_hint: f.attrs["target"].kind.name
               for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert {n for n, t in targets.items() if t == "cuda"} == {"conv2d_cuda", "conv2d1_cuda", "conv2d2_cuda"}
    assert all(t == "llvm" for n, t in targets.items() if not n.startswith("conv2d"))
    for gv, f in lowered.functions_items():  # GPU schedules applied to the GPU kernels only
        if isinstance(f, tvm.tirx.PrimFunc):
            assert bool(f.attrs.get("tirx.is_scheduled")) == (targets[gv.name_hint] == "cuda")
    ex = compile(placed)
    assert "cuda" in runtime_kinds(ex.executable.mod)
    kernels = sorted(set(KERNEL.findall(gpu_sources(ex)["cuda"])))
    assert kernels == ["conv2d1_cuda_kernel", "conv2d2_cuda_kernel", "conv2d_cuda_kernel"]  # no host op


def test_stock_compile_silently_runs_gpu_kernels_on_the_host(conv_on_cuda):
    """What our compile() prevents: TVM's own compile of the same placed module emits no GPU code."""
    *_, placed = conv_on_cuda
    stock = tvm.compile(placed)
    assert "cuda" not in runtime_kinds(stock.mod)
    with pytest.raises(PlacementError, match="conv2d.*(no device|no target)"):
        validate_lowered(relax.transform.LegalizeOps()(placed))


def test_hand_written_kernel_on_both_kinds_of_device():
    from test_placement import HandWritten

    placed = place(HandWritten, {lambda s: s.op_name == "twice" and s.index == 1: "cuda"}, fallback="cpu")
    lowered = lower(placed)
    kinds = {gv.name_hint: f.attrs["target"].kind.name
             for gv, f in lowered.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert kinds == {"twice_llvm": "llvm", "twice_cuda": "cuda", "add_llvm": "llvm"}
    assert set(KERNEL.findall(gpu_sources(compile(placed))["cuda"])) == {"twice_cuda_kernel"}


@requires_nvcc
def test_cuda_code_compiles_with_nvcc(conv_on_cuda, tmp_path):
    *_, placed = conv_on_cuda
    source = gpu_sources(compile(placed))["cuda"]
    cu, ptx = tmp_path / "kernels.cu", tmp_path / "kernels.ptx"
    cu.write_text(source)
    proc = subprocess.run([NVCC, "--ptx", f"-arch={DEFAULT_CUDA_ARCH}", str(cu), "-o", str(ptx)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entries = sorted(re.findall(r"\.entry (\w+)\(", ptx.read_text()))
    assert entries == ["conv2d1_cuda_kernel", "conv2d2_cuda_kernel", "conv2d_cuda_kernel"]


@requires_gpu
def test_conv_on_gpu_matches_single_device_build(conv_on_cuda):
    mod, params, bound, placed = conv_on_cuda
    inputs = random_inputs(mod, params)
    want = run(build(bound), inputs)
    got = vm(compile(placed))["main"](*inputs).numpy()
    assert relative_error(got, want) <= 1e-4


@requires_gpu
def test_shared_input_across_cpu_and_gpu():
    from test_placement import SharedInput as Shared

    placed = place(Shared, {lambda s: s.op_name == "relax.add" and s.index == 1: "cuda"}, fallback="cpu")
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((2, 3)).astype("float32") for _ in range(3))
    got = vm(compile(placed))["main"](a, b, c).numpy()
    np.testing.assert_allclose(got, (a + b) - (b + c), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_vm_without_the_gpu_says_so(conv_on_cuda):
    *_, placed = conv_on_cuda
    with pytest.raises(PlacementError, match="device cuda:0 .* is not available"):
        vm(compile(placed))
