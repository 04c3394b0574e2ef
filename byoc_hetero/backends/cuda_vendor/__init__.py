"""Backend ``cuda_vendor``: regions run on an NVIDIA GPU by cuBLASLt, through this package's CUDA runtime
library (``cpp/cuda/``, ``libbyoc_hetero_cuda.so``).

What it runs (:mod:`.gemm`): float32 ``matmul`` with static shapes — a dense layer (2-D weight, as
given or ``permute_dims``-transposed; the data's leading dims fold into M) or a batched matmul of
equal batch dims — with its bias (one value per output column) and a ``relu`` or ``gelu_tanh``,
all in one ``cublasLtMatmul`` (bias and activation as its epilogue). Everything else stays with
TVM, and ``bh.rules.rejections`` / ``bh.report`` say why (dtype, symbolic shape, broadcast batch,
the erf ``gelu``, ...). It is not the default target: name it, ``bh.partition(mod, params,
target="cuda_vendor")``, then place its regions on a GPU (``bh.place(part, {"cuda_vendor": "cuda"},
fallback="cpu")``, or leave them unnamed: a region of a GPU backend goes to a GPU device). The
target is not called ``cuda``: that is a device name (placement maps, ``bh.tune(devices=...)``).

Building and running are split: the codegen and ``export_library`` work on any machine where the
runtime library is built (``pip install 'byoc-hetero[cuda]'`` provides the headers CMake looks
for); the CUDA runtime and cuBLASLt are loaded with dlopen when a region first runs, and running
without them, or without a driver or GPU, raises :class:`~byoc_hetero.ByocError` naming what is
missing. TVM's own CUDA code (placement's default for ops on ``cuda``) stays the fallback and the
reference.
"""

from __future__ import annotations

from typing import Any

from ...rules import Variant, register_pattern, register_target
from . import codegen, gemm, runtime
from .gemm import check_gemm
from .runtime import RUNTIME_KIND, availability, built, region_graph

TARGET = "cuda_vendor"
DEVICE = "cuda"
"""The device kind this backend's regions run on (placement keeps them there)."""

VARIANTS = {
    "dense": (Variant("dense", "cublaslt", "cuBLASLt matmul, FP32 compute, bias / relu / gelu_tanh as its epilogue",
                      "target='cuda_vendor'", "float32, static shapes, a CUDA GPU at run time"),),
    "matmul": (Variant("matmul", "cublaslt", "cuBLASLt strided-batched matmul, FP32 compute",
                       "target='cuda_vendor'", "float32, static shapes, equal batch dims, a CUDA GPU at run time"),),
}
"""The implementations the cuda_vendor backend offers per op."""


def register() -> Any:
    """Register backend ``cuda_vendor`` and its rules (idempotent). Loads no library."""
    backend = register_target(TARGET, codegen=codegen.relax_ext_codegen, variants=VARIANTS,
                              runtime_kind=RUNTIME_KIND, region_graph=region_graph, device=DEVICE)
    if not backend.patterns:
        for name, pattern, names, priority in gemm.pattern_rules():
            register_pattern(TARGET, name, pattern, names, check_gemm, priority)
    return backend


BACKEND = register()
"""The cuda_vendor backend object."""

__all__ = ["BACKEND", "DEVICE", "RUNTIME_KIND", "TARGET", "VARIANTS", "availability", "built", "check_gemm",
           "codegen", "gemm", "register", "runtime"]
