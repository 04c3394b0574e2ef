"""Pass ``integer_clips`` (ONNX protobuf, before import): a ``Clip`` of integers becomes ``Where`` selects.

Why: TVM's importer writes ``Clip`` with its bounds as inputs (opset 11+) as ``call_tir`` of TE
``maximum`` / ``minimum`` functions, which no Relax fold reads. torch's default exporter writes
DeBERTa-v2/v3's clamp of the bucketed relative positions (``torch.clamp`` of int64 indices, taken
once the sequence is longer than the position buckets) as such a ``Clip``: the index stayed computed
at run time, and the ``gather_elements`` reading it stayed on llvm (3 regions at sequence 128, issue
39). ``Less`` / ``Greater`` and ``Where`` are imported as the Relax ops of those names, which
:mod:`.fold_int_constants` evaluates when their operands are constants. (Not ``Max`` / ``Min``: on
static shapes TVM's importer writes those as ``broadcast_to`` + ``stack`` + a ``max`` reduction.) A
float ``Clip`` stays: its bounds' NaN handling is its own, and :mod:`.te_clips` reads it.

What: each ``Clip`` with a bound given as an input whose data (by ONNX's type inference, or its
bounds' constant values) is an integer tensor becomes ``y = Where(Less(x, min), min, x)``, then
``Where(Greater(y, max), max, y)`` (only the bounds it has; ``Identity`` with none): ``min(max(x, min),
max)``, as ONNX defines Clip. Anything else is left as it is.
"""

from __future__ import annotations

from typing import Any

from ._onnx import copy_of, detached, inferred_elem_types, integer_constants

_INTEGER_TYPES = frozenset({2, 3, 4, 5, 6, 7, 12, 13})
"""TensorProto's UINT8, INT8, UINT16, INT16, INT32, INT64, UINT32, UINT64."""


def _is_integer_clip(node: Any, types: dict[str, int], constants: dict[str, Any]) -> bool:
    if node.op_type != "Clip" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return False
    if node.input[0] in types:
        return types[node.input[0]] in _INTEGER_TYPES
    return any(b and b in constants for b in node.input[1:3])


def _selects(node: Any) -> list[Any]:
    from onnx import helper

    name = node.name or node.output[0]
    bounds = [(cmp, b) for cmp, b in zip(("Less", "Greater"), list(node.input[1:3])) if b]
    if not bounds:
        return [helper.make_node("Identity", [node.input[0]], list(node.output), name=f"{name}_identity")]
    nodes, value = [], node.input[0]
    for k, (cmp, bound) in enumerate(bounds):
        tag = f"{name}_{cmp.lower()}"
        out = node.output[0] if k == len(bounds) - 1 else f"{tag}_clamped"
        nodes.append(helper.make_node(cmp, [value, bound], [f"{tag}_outside"], name=tag))
        nodes.append(helper.make_node("Where", [f"{tag}_outside", bound, value], [out], name=f"{tag}_where"))
        value = out
    return nodes


def integer_clips(model: Any, shape: Any = None) -> Any:  # noqa: ARG001 - every ONNX pass takes shape
    """``model`` with each integer ``Clip`` written as ``Where`` selects (see the module doc);
    ``model`` itself when there is none."""
    if not any(n.op_type == "Clip" and len(n.input) >= 2 for n in model.graph.node):
        return model
    types, constants = inferred_elem_types(model), integer_constants(model)
    integer = [_is_integer_clip(n, types, constants) for n in model.graph.node]
    if not any(integer):
        return model
    copy = copy_of(model)
    nodes = []
    for node, is_integer in zip(copy.graph.node, integer):
        if is_integer:
            nodes.extend(_selects(node))
        else:
            nodes.append(detached(node))
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy
