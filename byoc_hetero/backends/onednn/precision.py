"""Which dtypes the oneDNN runtime computes in: the one place checks and lowering ask.

Tensors the runtime reads and writes are float32 (:data:`RUNTIME_DTYPES`): a check asks
:func:`dtype_reason` instead of comparing with ``"float32"``. Separately, a partition has a compute
*precision* (:data:`PRECISIONS`): with ``"bf16"`` the codegen writes ``"precision": "bf16"`` into
each region graph and the runtime runs conv2d / dense / matmul on bf16 copies of their inputs
(weights converted once at load) with f32 accumulation, where the CPU has native bf16
(:func:`effective_precision`).
"""

from __future__ import annotations

from tvm import relax

from ..._relax import static_shape, tensor_dtype

RUNTIME_DTYPES: tuple[str, ...] = ("float32",)
"""Tensor dtypes the runtime's kernels read and write."""

DEFAULT_DTYPE = RUNTIME_DTYPES[0]


def dtype_reason(dtype: str, name: str) -> str | None:
    """Why a tensor of ``dtype`` (named ``name`` in the message) cannot run; None if it can."""
    if dtype in RUNTIME_DTYPES:
        return None
    return f"{name} has dtype {dtype or 'non-tensor'}; the runtime runs {', '.join(RUNTIME_DTYPES)} only"


def out_dtype_reason(out_dtype, op: str) -> str | None:
    """Why an op's ``out_dtype`` attribute cannot be honoured; None if the default or supported."""
    if out_dtype is None or str(out_dtype) in ("", "void", *RUNTIME_DTYPES):
        return None
    return f"{op} out_dtype {out_dtype}; the runtime writes {', '.join(RUNTIME_DTYPES)}"


def tensor_reason(expr: relax.Expr, name: str) -> str | None:
    """Why a value cannot be a runtime tensor (dtype, or a shape that is not static); None if it can."""
    reason = dtype_reason(tensor_dtype(expr), name)
    if reason:
        return reason
    if static_shape(expr) is None:
        return f"{name} has a symbolic or unknown shape {expr.ty}; the runtime needs static shapes"
    return None


# -- compute precision of a partition (bf16) ------------------------------------------------------
PRECISIONS: tuple[str, ...] = ("f32", "bf16")
"""What ``precision=`` may say: ``f32`` (default) or ``bf16`` (bf16 weights and activations with f32
accumulation in conv2d / dense / matmul; region inputs and outputs, softmax, normalizations,
pooling and reductions stay float32)."""

DEFAULT_PRECISION = PRECISIONS[0]

_warned: set[str] = set()


def check_precision(precision: str) -> str:
    """``precision`` itself when it is one of :data:`PRECISIONS`; else a :class:`RuleError`."""
    from ...errors import RuleError

    if precision not in PRECISIONS:
        raise RuleError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def effective_precision(precision: str) -> tuple[str, str]:
    """``(precision the runtime computes in now, why it differs or "")`` for a request.

    A bf16 request runs float32 where oneDNN has no native bf16 (below ``avx512_core_bf16``: its
    emulation would be slower than float32) or where ``BYOC_HETERO_BF16=off`` switches it off.
    """
    from ..._native import _C

    effective, reason = _C.effective_precision(check_precision(precision))
    return effective, reason


def warn_if_fallback(precision: str) -> str:
    """The effective precision of a request; warns once per reason when bf16 runs as float32."""
    import warnings

    effective, reason = effective_precision(precision)
    if reason and reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"precision='bf16' requested, the regions run float32: {reason}",
                      RuntimeWarning, stacklevel=3)
    return effective
