"""Validation of quantization parameters: scales and zero points of a QDQ model.

A scale of zero divides by zero in ``QuantizeLinear`` (inf, then an undefined cast), a negative one
flips every value's sign, NaN or inf poisons every value after it, and a zero point outside its
integer type (an ONNX ``uint8`` zero point of 300, stored in ``int32_data`` where protobuf does not
check it) wraps when read. None of these fails in TVM or in oneDNN: they give wrong numbers. So they
are checked where a model enters the project, with a :class:`~byoc_hetero.errors.QuantizationError`
naming the node (ONNX) or the bound variable (Relax), the input and the offending value:

- :func:`check_onnx` — every ``QuantizeLinear`` / ``DequantizeLinear`` (and the zero points of
  ``MatMulInteger`` / ``ConvInteger``, the scales and zero points of ``QLinearConv`` /
  ``QLinearMatMul``) whose scale or zero point is a constant of the file; called by
  :func:`byoc_hetero.from_onnx` before TVM's importer (which would otherwise fail with a bare
  "Size mismatch" on a scale of the wrong length, or import the bad value silently).
- :func:`check_relax` — every ``relax.quantize`` / ``relax.dequantize`` of a Relax module whose
  scale or zero point is a constant or a parameter given in ``params``; called by
  :func:`byoc_hetero.partition` before binding the parameters, so that a module built by hand (or
  by a frontend that does not go through :func:`check_onnx`) is checked too.

Scales or zero points computed at run time (``DynamicQuantizeLinear``'s) are not constants and
are not checked here.

(Formerly ``byoc_hetero.quant.validate``: the stages and the frontends check here, below
:mod:`byoc_hetero.quant`, which itself partitions through the stages.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .errors import QuantizationError

__all__ = ["check_onnx", "check_relax", "check_scale", "check_zero_point", "integer_range"]


def integer_range(dtype: str) -> tuple[int, int] | None:
    """The closed range of an integer dtype (``"uint8"`` -> (0, 255)); None for a float dtype."""
    dtype = str(dtype)
    if dtype in ("int4", "uint4"):
        return (-8, 7) if dtype == "int4" else (0, 15)
    try:
        info = np.iinfo(np.dtype(dtype))
    except (TypeError, ValueError):
        return None
    return int(info.min), int(info.max)


def _first_bad(values: np.ndarray, bad: np.ndarray) -> tuple[Any, str]:
    """The first offending value and where it is (``" at index 3 of 8"``, nothing for a scalar)."""
    flat = np.flatnonzero(bad.reshape(-1))
    index = int(flat[0])
    where = f" at index {index} of {values.size}" if values.size > 1 else ""
    value = values.reshape(-1)[index]
    if values.dtype.kind == "f":  # the shortest text that reads back as the stored float (-0.02, nan)
        return np.format_float_positional(value, trim="-"), where
    return value.item(), where


def check_scale(values: np.ndarray, what: str) -> None:
    """QuantizationError unless every scale is finite and > 0 (``what`` names the node and input)."""
    values = np.asarray(values)
    if values.dtype.kind not in "fc":
        raise QuantizationError(f"{what}: a scale must be a float tensor, got dtype {values.dtype}")
    if values.size == 0:
        raise QuantizationError(f"{what}: the scale is empty")
    with np.errstate(invalid="ignore"):
        bad = ~(np.isfinite(values) & (values > 0))
    if bad.any():
        value, where = _first_bad(values, bad)
        raise QuantizationError(f"{what}: a scale must be finite and > 0, got {value}{where}")


def check_zero_point(values: np.ndarray | Sequence[int], dtype: str, what: str) -> None:
    """QuantizationError unless every zero point lies in the range of ``dtype`` (its quantized type)."""
    values = np.asarray(values)
    bounds = integer_range(dtype)
    if bounds is None or values.size == 0:
        return  # float8 zero points are checked by their own storage
    if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
        value, where = _first_bad(values, ~np.isfinite(values))
        raise QuantizationError(f"{what}: a {dtype} zero point must be an integer, got {value}{where}")
    wide = values.astype(np.float64)
    bad = (wide < bounds[0]) | (wide > bounds[1])
    if bad.any():
        value, where = _first_bad(values, bad)
        raise QuantizationError(f"{what}: a {dtype} zero point must lie in [{bounds[0]}, {bounds[1]}], "
                                f"got {value}{where}")


def _check_shapes(scale_shape: Sequence[int], zp_shape: Sequence[int] | None, data_shape: Sequence[Any] | None,
                  axis: int, what: str) -> None:
    """A per-tensor scale is a scalar (or one element); a per-axis scale is 1-D with one value per
    element of the data along ``axis``; the zero point has the scale's shape (a scalar and a
    one-element vector both mean per tensor: ONNX Runtime's quantize_static writes a bias's scale
    as ``[1]`` and its zero point as a scalar)."""
    scale_shape, size = tuple(scale_shape), int(np.prod(scale_shape)) if len(scale_shape) else 1
    per_tensor_pair = size == 1 and zp_shape is not None and int(np.prod(tuple(zp_shape) or (1,))) == 1
    if zp_shape is not None and tuple(zp_shape) != scale_shape and not per_tensor_pair:
        raise QuantizationError(f"{what}: the zero point's shape {list(zp_shape)} differs from the scale's "
                                f"shape {list(scale_shape)}")
    if len(scale_shape) > 1:
        raise QuantizationError(f"{what}: the scale must be a scalar or 1-D (per axis), got shape "
                                f"{list(scale_shape)}")
    if len(scale_shape) == 0 or size == 1 or data_shape is None:
        return
    rank = len(data_shape)
    if not -rank <= axis < rank:
        raise QuantizationError(f"{what}: axis {axis} is out of range for data of rank {rank}")
    extent = data_shape[axis % rank]
    if isinstance(extent, int) and extent != size:
        raise QuantizationError(f"{what}: a per-axis scale needs one value per element of axis {axis % rank} "
                                f"({extent} for data of shape {list(data_shape)}), got {size}")


# ----------------------------------------------------------------------------------------------
# ONNX
# ----------------------------------------------------------------------------------------------
# op type -> ((data input, scale input, zero-point input), ...): the (data, scale, zero point) triples
# of its inputs; None where the op has no scale (MatMulInteger's zero points alone)
_ONNX_QPARAMS: dict[str, tuple[tuple[int | None, int | None, int], ...]] = {
    "QuantizeLinear": ((0, 1, 2),),
    "DequantizeLinear": ((0, 1, 2),),
    "MatMulInteger": ((0, None, 2), (1, None, 3)),
    "ConvInteger": ((0, None, 2), (1, None, 3)),
    "QLinearMatMul": ((0, 1, 2), (3, 4, 5), (None, 6, 7)),
    "QLinearConv": ((0, 1, 2), (3, 4, 5), (None, 6, 7)),
}

_ONNX_INT_TYPES = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 21: "uint4", 22: "int4"}


def _onnx_values(tensor: Any) -> np.ndarray:
    """An initializer's values, integers as *stored*: a uint8/int8/16-bit tensor written through
    ``int32_data`` can hold any int32 (300 for a uint8), which ``numpy_helper.to_array`` would wrap."""
    from onnx import numpy_helper

    if tensor.data_type in _ONNX_INT_TYPES and not tensor.HasField("raw_data") and len(tensor.int32_data):
        if tensor.data_type not in (21, 22):  # 4-bit values are packed two per int32
            return np.asarray(tensor.int32_data, dtype=np.int64).reshape(tuple(tensor.dims))
    return numpy_helper.to_array(tensor)


def _onnx_constants(graph: Any) -> dict[str, Any]:
    consts = {init.name: init for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for a in node.attribute:
                if a.name == "value" and a.t is not None:
                    consts[node.output[0]] = a.t
    return consts


def _onnx_shapes(model: Any) -> dict[str, list[Any]]:
    """Static shapes known for the model's tensors (inputs, inferred values, initializers)."""
    import onnx

    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - no inferred shapes: only the declared ones are checked
        pass
    shapes: dict[str, list[Any]] = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None
                               for d in vi.type.tensor_type.shape.dim]
    for init in model.graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def _onnx_node_label(node: Any, index: int) -> str:
    return f"{node.op_type} node {node.name!r}" if node.name else f"{node.op_type} node #{index}"


def check_onnx(model: Any) -> None:
    """Check the constant scales and zero points of an ``onnx.ModelProto``'s QDQ / integer nodes.

    Raises :class:`~byoc_hetero.errors.QuantizationError` naming the node, the input and the value
    for a scale that is zero, negative, NaN or infinite, a zero point outside its type's range, or a
    scale / zero point whose shape does not fit its tensor (per-tensor: a scalar; per-axis: one value
    per element of ``axis``; the zero point shaped as the scale). Blocked scales (``block_size``) are
    checked for their values only.
    """
    graph = model.graph
    if not any(n.op_type in _ONNX_QPARAMS for n in graph.node):
        return
    consts = _onnx_constants(graph)
    shapes: dict[str, list[Any]] | None = None
    for index, node in enumerate(graph.node):
        triples = _ONNX_QPARAMS.get(node.op_type)
        if triples is None or node.domain not in ("", "ai.onnx", "com.microsoft"):
            continue
        label = _onnx_node_label(node, index)
        attrs = {a.name: a for a in node.attribute}
        axis = attrs["axis"].i if "axis" in attrs else 1
        blocked = "block_size" in attrs and attrs["block_size"].i != 0
        for data_i, scale_i, zp_i in triples:
            scale_name = node.input[scale_i] if scale_i is not None and scale_i < len(node.input) else ""
            zp_name = node.input[zp_i] if zp_i < len(node.input) else ""
            scale = _onnx_values(consts[scale_name]) if scale_name in consts else None
            zp = _onnx_values(consts[zp_name]) if zp_name in consts else None
            if scale is not None:
                check_scale(scale, f"{label} (scale {scale_name!r})")
            if zp is not None:
                zp_type = _ONNX_INT_TYPES.get(consts[zp_name].data_type, str(zp.dtype))
                check_zero_point(zp, zp_type, f"{label} (zero point {zp_name!r})")
            if scale is None or blocked or node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
                continue
            if shapes is None:
                shapes = _onnx_shapes(model)
            data_shape = shapes.get(node.input[data_i]) if data_i is not None else None
            if data_shape is not None and len(data_shape) <= 1 and axis == 1:
                axis = 0  # as TVM's importer (and ONNX Runtime) read the default axis of 1-D data
            _check_shapes(scale.shape, zp.shape if zp is not None else None, data_shape, axis,
                          f"{label} (scale {scale_name!r})")


# ----------------------------------------------------------------------------------------------
# Relax
# ----------------------------------------------------------------------------------------------
_RELAX_QDQ = ("relax.quantize", "relax.dequantize")


def _relax_value(arg: relax.Expr, params: Mapping[str, Any]) -> tuple[np.ndarray | None, str]:
    """The value of a scale / zero-point argument and how to name it: a constant, or a parameter
    of the function given in ``params``; (None, name) when it is computed at run time."""
    if isinstance(arg, tvm.ir.GenericConst):
        return arg.value.numpy(), "a constant"
    if isinstance(arg, tvm.ir.Constant) and hasattr(arg, "data"):
        return arg.data.numpy(), "a constant"
    if isinstance(arg, relax.Var):
        value = params.get(arg.name)
        if value is not None:
            return (value.numpy() if hasattr(value, "numpy") else np.asarray(value)), f"parameter {arg.name!r}"
        return None, f"variable {arg.name!r}"
    return None, type(arg).__name__


def _shape_of(expr: relax.Expr) -> list[Any] | None:
    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return [int(d.value) if isinstance(d, tvm.tirx.IntImm) else None for d in ty.shape.values]


def _check_relax_call(var: relax.Var, call: relax.Call, func_name: str, params: Mapping[str, Any]) -> None:
    op = call.op.name
    label = f"{op.removeprefix('relax.')} bound to {var.name!r} in {func_name!r}"
    data, scale_arg, zp_arg = call.args
    scale, scale_name = _relax_value(scale_arg, params)
    zp, zp_name = _relax_value(zp_arg, params)
    qtype = str(call.attrs.out_dtype) if op == "relax.quantize" else str(data.ty.dtype)
    if scale is not None:
        check_scale(scale, f"{label} (scale: {scale_name})")
    if zp is not None:
        check_zero_point(zp, qtype, f"{label} (zero point: {zp_name})")
    scale_shape = scale.shape if scale is not None else _shape_of(scale_arg)
    zp_shape = zp.shape if zp is not None else _shape_of(zp_arg)
    if scale_shape is None or any(d is None for d in scale_shape):
        return
    if zp_shape is not None and any(d is None for d in zp_shape):
        zp_shape = None
    # a zero point of 0 written as a scalar constant with a per-axis scale (TVM's importer, for a
    # DequantizeLinear without zero point) broadcasts: only a zero point with elements is compared
    if zp_shape is not None and len(zp_shape) == 0 and len(scale_shape) == 1:
        zp_shape = None
    _check_shapes(scale_shape, zp_shape, _shape_of(data), int(call.attrs.axis), f"{label} (scale: {scale_name})")


def check_relax(mod: tvm.IRModule, params: Mapping[str, Any] | None = None) -> None:
    """Check the scales and zero points of every ``relax.quantize`` / ``relax.dequantize`` in
    ``mod``'s Relax functions that are constants or parameters given in ``params``.

    Raises :class:`~byoc_hetero.errors.QuantizationError` naming the op, the variable it is bound
    to, the function, the argument (constant or parameter name) and the offending value.
    """
    params = params or {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        found: list[tuple[relax.Var, relax.Call]] = []

        def visit(expr: relax.Expr, found=found) -> None:
            if isinstance(expr, relax.VarBinding) or not isinstance(expr, relax.SeqExpr):
                return
            for block in expr.blocks:
                for binding in block.bindings:
                    value = getattr(binding, "value", None)
                    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) \
                            and value.op.name in _RELAX_QDQ:
                        found.append((binding.var, value))

        relax.analysis.post_order_visit(func, visit)
        for var, call in found:
            _check_relax_call(var, call, gv.name_hint, params)
