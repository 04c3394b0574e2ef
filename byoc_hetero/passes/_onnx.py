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


def inferred_shapes(model: Any) -> dict[str, list[int | str | None]]:
    """{value name: its dims} as ONNX's shape inference (on top of the file's own ``value_info``)
    knows them; values of unknown rank are absent."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - a model the checker rejects: the file's own value_info only
        inferred = model
    shapes: dict[str, list[int | str | None]] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
    for init in inferred.graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def copy_of(model: Any) -> Any:
    """A copy of ``model`` (the caller's ModelProto stays as it was)."""
    copy = type(model)()
    copy.CopyFrom(model)
    return copy
