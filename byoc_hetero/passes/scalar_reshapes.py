"""Pass ``scalar_reshapes`` (ONNX protobuf, before import): a scalar reshaped to one element becomes
an ``Unsqueeze``."""

from __future__ import annotations

from typing import Any

from ._onnx import copy_of, inferred_shapes, integer_constants


def scalar_reshapes(model: Any, shape: Any = None) -> Any:  # noqa: ARG001 - every ONNX pass takes shape
    """``model`` with each ``Reshape`` of a rank-0 tensor to ``[1]`` or ``[-1]`` written as
    ``Unsqueeze`` on axis 0 (the same value); ``model`` itself when there is none.

    Why: the default (dynamo) exporter of torch 2.13 computes the bounds of slices from the
    sequence length as scalars (``sym_size + 1``) and reshapes them to one element before a
    ``Concat`` or ``Slice``. With a symbolic sequence dim TVM's importer holds such a scalar as a
    TIR expression and its ``Reshape`` converter rejects it ("Reshape expects the input data to be
    a Tensor. However, the given input is ir.PrimType"); its ``Unsqueeze`` converter turns a scalar
    expression into a one-element shape, which the ``Slice`` / ``Concat`` converters read. A file
    with static shapes has constants there (folded before TVM sees them), so nothing changes.
    """
    from onnx import helper

    candidates = [n for n in model.graph.node if n.op_type == "Reshape" and n.domain in ("", "ai.onnx")]
    if not candidates:
        return model
    constants = integer_constants(model)
    targets = {n.output[0] for n in candidates
               if n.input[1] in constants and constants[n.input[1]].reshape(-1).tolist() in ([1], [-1])}
    if not targets:
        return model
    shapes = inferred_shapes(model)
    scalars = {n.output[0] for n in candidates if n.output[0] in targets and shapes.get(n.input[0]) == []}
    if not scalars:
        return model
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    copy = copy_of(model)
    nodes = []
    for node in copy.graph.node:
        if node.op_type == "Reshape" and node.output[0] in scalars:
            name = node.name or node.output[0]
            if opset >= 13:
                axes = f"{node.output[0]}__axes"
                nodes.append(helper.make_node("Constant", [], [axes], name=f"{name}__axes",
                                              value=helper.make_tensor(axes, 7, [1], [0])))
                node = helper.make_node("Unsqueeze", [node.input[0], axes], list(node.output), name=name)
            else:
                node = helper.make_node("Unsqueeze", [node.input[0]], list(node.output), name=name, axes=[0])
        nodes.append(node)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy
