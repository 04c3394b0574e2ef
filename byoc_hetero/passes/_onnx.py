"""Helpers the ONNX passes share: the constant integer tensors and the inferred shapes of a model."""

from __future__ import annotations

from typing import Any


def integer_constants(model: Any) -> dict[str, Any]:
    """{name: numpy array} of the integer tensors ``model`` holds as ``Constant`` nodes or
    initializers (shape operands, axes)."""
    from onnx import numpy_helper

    found = {}
    for init in model.graph.initializer:
        found[init.name] = numpy_helper.to_array(init)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for a in node.attribute:
                if a.name == "value":
                    found[node.output[0]] = numpy_helper.to_array(a.t)
    return {k: v for k, v in found.items() if v.dtype.kind in "iu"}


def _inferred(model: Any) -> Any:
    """``model`` with ONNX's shape inference's ``value_info`` (on top of the file's own); ``model``
    itself when the checker rejects it."""
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a model the checker rejects: the file's own value_info only
        return model


def inferred_shapes(model: Any) -> dict[str, list[int | str | None]]:
    """{value name: its dims} as ONNX's shape inference (on top of the file's own ``value_info``)
    knows them; values of unknown rank are absent."""
    inferred = _inferred(model)
    shapes: dict[str, list[int | str | None]] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
    for init in inferred.graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def inferred_elem_types(model: Any) -> dict[str, int]:
    """{value name: its ``TensorProto`` element type} as ONNX's shape inference knows them (values
    of unknown type are absent)."""
    inferred = _inferred(model)
    types = {vi.name: vi.type.tensor_type.elem_type
             for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
             if vi.type.tensor_type.elem_type}
    types.update({init.name: init.data_type for init in inferred.graph.initializer})
    return types


def copy_of(model: Any) -> Any:
    """A copy of ``model`` (the caller's ModelProto stays as it was)."""
    copy = type(model)()
    copy.CopyFrom(model)
    return copy


def detached(node: Any) -> Any:
    """A copy of ``node`` that outlives its graph's node list being cleared (passes that rebuild the
    list)."""
    copy = type(node)()
    copy.CopyFrom(node)
    return copy
