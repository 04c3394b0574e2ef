"""The cuda_vendor backend's gemm family: ``matmul`` (dense and batched; float32 or float16) with its
bias and activation, one cuBLASLt call each (the bias and the activation are cuBLASLt epilogues, not
kernels of ours).

Rules (largest first): ``gemm_bias_<act>``, ``gemm_<act>``, ``gemm_bias``, ``gemm`` over
``matmul(x, W | permute_dims(W))`` → [``add(bias)``] → [``relu`` | ``gelu_tanh``]; ``gelu`` (the
erf form) is matched to say why it stays on llvm (cuBLASLt's GELU epilogue is the tanh form).
A 2-D W is a dense layer whose data's leading dims fold into M; a W of rank >= 3 a batched matmul
(strided batches: equal batch dims, no broadcast). Checks return the reason a match is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from math import prod
from typing import Any

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from ..._relax import static_shape, tensor_dtype
from ...rules import Match

ACTIVATIONS = {"relu": "relax.nn.relu", "gelu_tanh": "relax.nn.gelu_tanh", "gelu": "relax.nn.gelu"}
"""Activation name → the Relax op a rule matches after the gemm (``gelu`` only to refuse it)."""

EPILOGUE_ACTIVATIONS = ("relu", "gelu_tanh")
"""The activations cuBLASLt applies as epilogues (CUBLASLT_EPILOGUE_[RELU|GELU][_BIAS])."""


def gemm_pattern(bias: bool, activation: str | None) -> tuple[DFPattern, dict[str, DFPattern]]:
    """``matmul(data, W | permute_dims(W))`` [+ bias] [activation], with its parts named."""
    data, weight = wildcard(), wildcard()
    transpose = is_op("relax.permute_dims")(weight)
    out = anchor = is_op("relax.matmul")(data, transpose | weight)
    names = {"data": data, "weight": weight, "transpose": transpose, "anchor": anchor}
    if bias:
        names["bias"] = wildcard()
        out = names["bias_add"] = is_op("relax.add")(anchor, names["bias"])
    if activation:
        out = names["activation"] = is_op(ACTIVATIONS[activation])(out)
    return out, names


def _permute_reason(match: Match, rank: int) -> str | None:
    axes = match.expr("transpose").attrs.axes
    axes = list(range(rank))[::-1] if axes is None else [int(a) for a in axes]
    if axes != list(range(rank - 2)) + [rank - 1, rank - 2]:
        return (f"permute_dims axes {axes} of the weight: the cuda_vendor backend reads a weight transposed in "
                "its last two axes only")
    return None


DTYPES = ("float32", "float16")
"""The tensor dtypes a gemm runs: float32 (FP32 compute, or TF32 / FP16 where the backend option
``gemm_compute`` says so) and float16 (FP32 accumulation); one dtype for all of its tensors."""

COMPUTE = {"fp32": "CUBLAS_COMPUTE_32F", "tf32": "CUBLAS_COMPUTE_32F_FAST_TF32", "fp16": "CUBLAS_COMPUTE_32F_FAST_16F"}
"""Backend option ``gemm_compute`` → the cuBLASLt compute type of a float32 gemm. ``tf32`` and ``fp16``
are numerics options: float32 in and out, the products rounded to TF32 (10-bit mantissa) or FP16
inputs (both a 10-bit mantissa), accumulated in FP32: faster on tensor cores, about 1e-3 relative
error where float32 has about 1e-6, and ``fp16`` overflows past 65504. Float16 gemms always
accumulate in FP32 (``fp32``)."""


def _tensors_reason(match: Match) -> str | None:
    dtypes = set()
    for name in ("data", "weight", "anchor", "bias"):
        if not match.has(name):
            continue
        dtype, shape = match.dtype(name), static_shape(match.expr(name))
        if dtype not in DTYPES:
            return (f"{name} of dtype {dtype or 'unknown'}: the cuda_vendor backend runs float32 and float16 gemms "
                    "(cuBLASLt)")
        if shape is None:
            return f"{name} of symbolic shape {match.shape(name)}: the cuda_vendor backend plans static shapes"
        dtypes.add(dtype)
    if len(dtypes) > 1:
        return f"a matmul mixing {' and '.join(sorted(dtypes))}: the cuda_vendor backend runs one dtype per gemm"
    return None


def _shape_reason(match: Match) -> str | None:
    data, weight = static_shape(match.expr("data")), static_shape(match.expr("weight"))
    if len(data) < 2 or len(weight) < 2:
        return f"matmul of shapes {list(data)} and {list(weight)}: the cuda_vendor backend needs operands of rank >= 2"
    if match.has("transpose"):
        reason = _permute_reason(match, len(weight))
        if reason:
            return reason
    if len(weight) > 2 and data[:-2] != weight[:-2]:
        return (f"batched matmul of shapes {list(data)} and {list(weight)}: the batch dims differ (cuBLASLt's "
                "strided batches need equal batch dims; broadcasting stays on llvm)")
    if match.has("bias"):
        n = static_shape(match.expr("anchor"))[-1]
        bias = static_shape(match.expr("bias"))
        if not bias or prod(bias) != n or bias[-1] != n:
            return f"bias of shape {list(bias)}: the cuda_vendor backend adds one value per output column ({n})"
    return None


def check_gemm(match: Match) -> str | None:
    """None when the cuda_vendor backend runs the match as one cuBLASLt matmul, else why not."""
    out_dtype = str(match.expr("anchor").attrs.out_dtype or "")
    if out_dtype not in ("", "void", match.dtype("data")):
        return (f"matmul of {match.dtype('data')} with out_dtype {out_dtype}: the cuda_vendor backend writes the "
                "dtype it reads")
    reason = _tensors_reason(match) or _shape_reason(match)
    if reason:
        return reason
    if match.has("activation") and match.expr("activation").op.name == ACTIVATIONS["gelu"]:
        return ("relax.nn.gelu is the erf form; cuBLASLt's GELU epilogue is the tanh form (relax.nn.gelu_tanh), "
                "so the gelu stays on llvm")
    return None


def pattern_rules() -> Iterator[tuple[str, DFPattern, dict[str, DFPattern], int]]:
    """``(name, pattern, annotations, priority)`` of every rule, largest first."""
    for bias in (True, False):
        for act in (*ACTIVATIONS, None):
            name = "gemm" + ("_bias" if bias else "") + (f"_{act}" if act else "")
            pattern, names = gemm_pattern(bias, act)
            yield name, pattern, names, 100 + 1 + bias + (act is not None)


def gemm_attrs(data: relax.Expr, weight: relax.Expr, out: relax.Expr, transposed: bool,
               activation: str) -> dict[str, Any]:
    """The document attrs of a gemm node (``batch``, ``m``, ``n``, ``k``, ...) from its operands."""
    ds, ws, os = static_shape(data), static_shape(weight), static_shape(out)
    batched = len(ws) > 2
    batch = prod(ds[:-2]) if batched else 1
    m = ds[-2] if batched else prod(ds[:-1])
    return {"batch": int(batch), "m": int(m), "n": int(os[-1]), "k": int(ds[-1]), "transpose_b": int(transposed),
            "batched_weight": int(batched), "activation": activation}


def gemm_node(calls: Mapping[str, Sequence[tuple[relax.Var, relax.Call]]], lookup: Callable[[relax.Expr], int],
              out: relax.Expr, options: Mapping[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """The document inputs (data, weight[, bias]) and attrs of a gemm composite; ``calls`` maps a
    short op name to its ``(variable, call)`` bindings, ``lookup`` a value to its tensor id,
    ``options`` are the backend's (``gemm_compute``: a float32 gemm's compute type)."""
    anchor_var, anchor = calls["matmul"][0]
    data, weight = anchor.args
    transposed = "permute_dims" in calls and weight.same_as(calls["permute_dims"][0][0])
    if transposed:
        weight = calls["permute_dims"][0][1].args[0]
    inputs = [lookup(data), lookup(weight)]
    if "add" in calls:
        add = calls["add"][0][1]
        inputs.append(lookup(add.args[1] if add.args[0].same_as(anchor_var) else add.args[0]))
    activation = next((a for a in EPILOGUE_ACTIVATIONS if f"nn.{a}" in calls), "none")
    attrs = gemm_attrs(data, weight, out, transposed, activation)
    attrs["compute"] = str(options.get("gemm_compute", "fp32")) if tensor_dtype(out) == "float32" else "fp32"
    return inputs, attrs


__all__ = ["ACTIVATIONS", "COMPUTE", "DTYPES", "EPILOGUE_ACTIVATIONS", "check_gemm", "gemm_attrs", "gemm_node",
           "gemm_pattern", "pattern_rules"]
