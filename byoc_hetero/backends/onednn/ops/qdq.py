"""quantize / dequantize (ONNX QuantizeLinear / DequantizeLinear, Relax ``relax.quantize`` /
``relax.dequantize``) and the int8 anchors they form with conv2d and dense.

Each Q/DQ call whose runtime semantics are exact becomes a ``quantize`` / ``dequantize`` node
(host kernels, round half to even and saturation as ONNX says), so a QDQ model is one region and
not cut at every Q/DQ. The region-graph pass :func:`fuse_int8_anchors` then turns
``dequantize(x) -> conv2d | dense (weight = dequantize(int8 constant)) [-> quantize]`` into one
int8 node (u8/s8 data x s8 weights, oneDNN scales and zero points; cpp/kernels/int8.h) and
``dequantize -> pool2d (max) -> quantize`` with one scale into a pool2d over the 8-bit values.
What is left runs in float32 between its own Q/DQ nodes, inside the region (docs/int8.md).

Rejected, with the reason, so they stay on llvm: 16-bit and float8 types, blocked (rank >= 2)
scales, scales or zero points that are not constants, a zero point of another type than the data.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...._relax import shape_of, tensor_dtype
from ....rules import Match
from ..precision import tensor_reason
from ..table import PatternSpec, graph_pass, lowers, pattern_rules

QUANTIZED_DTYPES = ("uint8", "int8")
"""The quantized types the runtime reads and writes (oneDNN's u8 / s8)."""


def _constant(expr: relax.Expr) -> np.ndarray | None:
    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    if isinstance(expr, tvm.ir.Constant):
        return expr.data.numpy()
    return None


def qparams_reason(call: relax.Call, quantized: str, data: relax.Expr) -> str | None:
    """Why the scale / zero point of a Q/DQ call cannot run exactly; None if they can."""
    op = "quantize" if call.op.name == "relax.quantize" else "dequantize"
    scale, zero_point = _constant(call.args[1]), _constant(call.args[2])
    if scale is None or zero_point is None:
        return f"{op} with a scale or zero point computed at run time; the runtime needs constants"
    if scale.dtype != np.float32:
        return f"{op} scale of dtype {scale.dtype}; the runtime takes float32 scales"
    if scale.ndim > 1 or zero_point.ndim > 1:
        return f"{op} with blocked scales {list(scale.shape)}; the runtime takes per-tensor or per-axis scales"
    if zero_point.dtype != np.dtype(quantized):
        return f"{op} zero point of dtype {zero_point.dtype} for {quantized} data"
    if zero_point.size != scale.size:
        return f"{op} with {scale.size} scales and {zero_point.size} zero points"
    shape = shape_of(data)
    if scale.size > 1:
        axis = int(call.attrs.axis)
        if shape is None or not -len(shape) <= axis < len(shape) or shape[axis] != scale.size:
            return f"{op} with {scale.size} scales along axis {axis} of {list(shape or [])}"
    return None


def check_quantize(match: Match) -> str | None:
    """float32 data -> uint8 / int8 with constant per-tensor or per-axis scale and zero point."""
    call = match.expr("root")
    out = str(call.attrs.out_dtype)
    if out not in QUANTIZED_DTYPES:
        return f"quantize to {out}; the runtime quantizes to {' or '.join(QUANTIZED_DTYPES)} only"
    return tensor_reason(call.args[0], "quantize data", symbolic=True) or qparams_reason(call, out, call.args[0])


def check_dequantize(match: Match) -> str | None:
    """uint8 / int8 data (int32: a bias) -> float32 with constant scale and zero point."""
    call = match.expr("root")
    data = call.args[0]
    dtype = tensor_dtype(data)
    if dtype not in (*QUANTIZED_DTYPES, "int32"):
        return f"dequantize of {dtype}; the runtime dequantizes {', '.join(QUANTIZED_DTYPES)} and int32 only"
    if str(call.attrs.out_dtype) != "float32":
        return f"dequantize to {call.attrs.out_dtype}; the runtime dequantizes to float32 only"
    if shape_of(data) is None:
        return f"dequantize data of the shape {data.ty}, which the runtime cannot evaluate"
    return qparams_reason(call, dtype, data)


@pattern_rules
def _rules():
    for op, check in (("quantize", check_quantize), ("dequantize", check_dequantize)):
        data = wildcard()
        call = is_op(f"relax.{op}")(data, wildcard(), wildcard())
        yield PatternSpec(op, call, {"data": data, "root": call}, check, priority=10)


@lowers("relax.quantize", "relax.dequantize")
def lower_qdq(ctx, var: relax.Var, call: relax.Call) -> int:
    op = call.op.name.removeprefix("relax.")
    inputs = [ctx.data_of(call.args[0]), ctx.lookup(call.args[1]), ctx.lookup(call.args[2])]
    return ctx.emit(op, inputs, var, {"axis": int(call.attrs.axis)})
