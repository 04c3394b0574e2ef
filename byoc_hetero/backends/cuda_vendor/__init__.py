"""Backend ``cuda_vendor``: regions run on an NVIDIA GPU by cuBLASLt and cuDNN, through this
package's CUDA runtime library (``cpp/cuda/``, ``libbyoc_hetero_cuda.so``).

What it runs, with static shapes:

- :mod:`.gemm`: ``matmul`` (float32, or float16 accumulated in FP32) — a dense layer (2-D weight,
  as given or ``permute_dims``-transposed; the data's leading dims fold into M) or a batched matmul
  of equal batch dims — with its bias (one value per output column) and a ``relu`` or
  ``gelu_tanh``, all in one ``cublasLtMatmul`` (bias and activation as its epilogue); the option
  ``gemm_compute`` (``tf32`` / ``fp16``) trades a float32 gemm's precision for tensor-core speed;
- :mod:`.conv`: float32 ``conv2d`` (NCHW / OIHW; groups, strides, dilation, symmetric padding)
  with a bias, a residual add and a ``relu``, all in one ``cudnnConvolutionBiasActivationForward``.

Everything else stays with TVM, and ``bh.rules.rejections`` / ``bh.report`` say why (dtype,
symbolic shape, broadcast batch, the erf ``gelu``, asymmetric padding, ...). It is not the default
target: name it, ``bh.partition(mod, params, target="cuda_vendor")``, then place its regions on a GPU
(``bh.place(part, {"cuda_vendor": "cuda"}, fallback="cpu")``, or leave them unnamed: a region of a
GPU backend goes to a GPU device). The target is not called ``cuda``: that is a device name
(placement maps, ``bh.tune(devices=...)``).

Building and running are split: the codegen and ``export_library`` work on any machine where the
runtime library is built (``pip install 'byoc-hetero[cuda]'`` provides the headers CMake looks
for); the CUDA runtime, cuBLASLt and (for a region with a conv2d) cuDNN are loaded with dlopen when
a region first runs, and running without them, or without a driver or GPU, raises
:class:`~byoc_hetero.ByocError` naming what is missing. TVM's own CUDA code (placement's default for
ops on ``cuda``) stays the fallback and the reference.
"""

from __future__ import annotations

from typing import Any

from ...errors import RuleError
from ...rules import Option, Variant, register_pattern, register_target
from . import codegen, conv, gemm, runtime
from .conv import check_conv2d
from .gemm import check_gemm
from .runtime import RUNTIME_KIND, availability, built, region_graph

TARGET = "cuda_vendor"
DEVICE = "cuda"
"""The device kind this backend's regions run on (placement keeps them there)."""

VARIANTS = {
    "conv2d": (Variant("conv2d", "cudnn", "cuDNN fused convolution, FP32 (FMA math), bias / residual / relu in "
                       "the same call", "target='cuda_vendor'",
                       "float32 NCHW/OIHW, static shapes, symmetric padding, a CUDA GPU at run time"),),
    "dense": (Variant("dense", "cublaslt", "cuBLASLt matmul, FP32 compute (or gemm_compute), bias / relu / gelu_tanh "
                      "as its epilogue", "target='cuda_vendor'",
                      "float32 or float16, static shapes, a CUDA GPU at run time"),),
    "matmul": (Variant("matmul", "cublaslt", "cuBLASLt strided-batched matmul, FP32 compute (or gemm_compute)",
                       "target='cuda_vendor'",
                       "float32 or float16, static shapes, equal batch dims, a CUDA GPU at run time"),),
}
"""The implementations the cuda_vendor backend offers per op."""


def _compute(value: Any) -> str:
    word = str(value).lower()
    if word not in gemm.COMPUTE:
        raise RuleError(f"cuda_vendor option gemm_compute: expected one of {sorted(gemm.COMPUTE)}, got {value!r}")
    return word


OPTIONS = {
    "gemm_compute": Option("gemm_compute", "a float32 gemm's cuBLASLt compute type: fp32 (CUBLAS_COMPUTE_32F); tf32 "
                           "or fp16 are numerics options, float32 in and out with TF32 / FP16 products and FP32 "
                           "accumulation (about 1e-3 relative error; fp16 overflows past 65504)", "fp32", _compute),
}
"""The options of backend ``cuda_vendor`` (``bh.partition(..., options={"cuda_vendor": {...}})``)."""

_CHECKS = ((gemm.pattern_rules, check_gemm), (conv.pattern_rules, check_conv2d))
"""Each op family's rules and the check its rules share."""


def register() -> Any:
    """Register backend ``cuda_vendor`` and its rules (idempotent). Loads no library."""
    backend = register_target(TARGET, codegen=codegen.relax_ext_codegen, variants=VARIANTS,
                              runtime_kind=RUNTIME_KIND, region_graph=region_graph, device=DEVICE,
                              options=OPTIONS)
    if not backend.patterns:
        for rules, check in _CHECKS:
            for name, pattern, names, priority in rules():
                register_pattern(TARGET, name, pattern, names, check, priority)
    return backend


BACKEND = register()
"""The cuda_vendor backend object."""

__all__ = ["BACKEND", "DEVICE", "OPTIONS", "RUNTIME_KIND", "TARGET", "VARIANTS", "availability", "built",
           "check_conv2d", "check_gemm", "codegen", "conv", "gemm", "register", "runtime"]
