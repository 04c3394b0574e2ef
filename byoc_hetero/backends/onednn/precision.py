"""Which dtypes the oneDNN runtime computes in: the one place checks and lowering ask.

Today the runtime runs float32 only. This is the hook for more precisions (bf16, int8): a check
asks :func:`dtype_reason` instead of comparing with ``"float32"``, so widening the runtime's
dtypes changes this module, not every op family.
"""

from __future__ import annotations

from tvm import relax

from ..._relax import shape_of, static_shape, tensor_dtype

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


def tensor_reason(expr: relax.Expr, name: str, symbolic: bool = False,
                  static_dims: tuple[int, ...] = ()) -> str | None:
    """Why a value cannot be a runtime tensor; None if it can.

    By default its shape must be static. With ``symbolic=True`` (an op whose kernel plans any
    binding of the dims, docs/region-format.md "Symbolic shapes") dims may be symbolic when they
    are written in the region format's dim language (symbols, ints, + - * //), except the axes
    ``static_dims`` (negative: from the end), which the op needs static (e.g. a dense's K).
    """
    reason = dtype_reason(tensor_dtype(expr), name)
    if reason:
        return reason
    if static_shape(expr) is not None:
        return None
    if not symbolic:
        return f"{name} has a symbolic or unknown shape {expr.ty}; the runtime needs static shapes for this op"
    shape = shape_of(expr)
    if shape is None:
        return (f"{name} has the shape {expr.ty}, whose rank is unknown or whose dims use more than "
                "symbols, integers, + - * //; the runtime cannot evaluate it")
    for axis in static_dims:
        if -len(shape) <= axis < len(shape) and not isinstance(shape[axis], int):
            return f"{name} has the shape {list(shape)}, whose dim {axis} must be static for this op"
    return None
