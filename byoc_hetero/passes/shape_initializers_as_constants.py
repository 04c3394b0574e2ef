"""ONNX pass ``shape_initializers_as_constants``: integer initializers of rank 0 or 1 (shapes, axes,
starts/ends, repeats, pads) become Constant nodes, so the importer reads their values."""

from __future__ import annotations

from typing import Any


#: ONNX tensor element types of shapes, axes, indices and flags (onnx.TensorProto's enum names)
_INTEGER_TYPES = ("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "BOOL")


def shape_initializers_as_constants(model: Any, shape: Any = None) -> Any:  # noqa: ARG001 - every ONNX pass takes shape
    """``model`` with each integer or bool initializer of rank 0 or 1 (a shape, axes, starts/ends,
    repeats, pads, a scalar) turned into a ``Constant`` node of the same name; ``model`` itself
    when there is none.

    Why: ``from_onnx`` imports with ``keep_params_in_input=True`` so that weights stay parameters,
    and TVM's importer then makes *every* initializer a function parameter, shape vectors included.
    An ``Expand`` / ``Reshape`` / ``Tile`` / ``Slice`` whose shape operand is a parameter has a shape
    only known at run time: TVM writes a ``match_cast`` to recover it, and TVM's
    ``MergeCompositeFunctions`` then raises ``TypeError: Invalid type: relax.expr.MatchCast``
    (the default ONNX exporter of torch 2.13 writes GQA's ``repeat_kv`` shape as an initializer).
    As constants the importer reads their values, and the shapes stay static or symbolic. Integer
    tensors of rank 2 or more (a lookup table, a position buffer) stay parameters; an initializer
    that is also a graph input (an overridable default) is left as it is.
    """
    import onnx
    from onnx import helper

    graph = model.graph
    types = {getattr(onnx.TensorProto, t) for t in _INTEGER_TYPES}
    inputs = {i.name for i in graph.input}
    moved = [init for init in graph.initializer
             if init.data_type in types and len(init.dims) <= 1 and init.name not in inputs]
    if not moved:
        return model
    copy = type(model)()
    copy.CopyFrom(model)  # the caller's ModelProto stays as it was
    names = {init.name for init in moved}
    kept = [init for init in copy.graph.initializer if init.name not in names]
    constants = [helper.make_node("Constant", [], [init.name], value=init, name=f"{init.name}__constant")
                 for init in copy.graph.initializer if init.name in names]
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(kept)
    nodes = list(copy.graph.node)
    del copy.graph.node[:]
    copy.graph.node.extend(constants + nodes)
    return copy
