"""Pass ``ranges_from_dims`` (ONNX protobuf, before import): an integer ``Range`` up to a dim becomes
a cumulative sum of ones, whose length TVM's importer keeps symbolic."""

from __future__ import annotations

from typing import Any

from ._onnx import copy_of, integer_constants

#: ops whose integer output is non-negative when their inputs are (dims in, dims out)
_KEEPS_SIGN = ("Gather", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Identity", "Cast", "Add", "Mul", "Max",
               "Concat")


def ranges_from_dims(model: Any, shape: Any = None) -> Any:  # noqa: ARG001 - every ONNX pass takes shape
    """``model`` with each integer ``Range(start, limit, 1)`` whose ``start`` is a constant <= 0 and
    whose ``limit`` is computed from dims (``Shape``) and non-negative constants written as
    ``CumSum(ConstantOfShape([limit - start], 1)) + (start - 1)``: the same values; ``model`` itself
    when there is none.

    Why: every transformers model builds its position ids and causal mask with ``arange(S)``. With a
    symbolic ``S`` TVM's importer computes a ``Range`` whose bounds are not constants as a length
    *tensor* read back by ``match_cast`` into a fresh symbol (``range_len_0``), unrelated to ``S``:
    the position embeddings and masks then have shapes that differ from the hidden states', adding
    them gives tensors of unknown shape, and a ``Reshape`` with -1 after them fails at import ("the
    given input has no shape"); ``MergeCompositeFunctions`` also rejects the ``match_cast``. The
    importer keeps the shape of a ``ConstantOfShape`` of a one-element shape symbolic (``[S]``), and
    a cumulative sum keeps it. The length ``limit - start`` is not negative here (a dim minus a
    constant <= 0), so no empty range becomes a negative shape.
    """
    from onnx import TensorProto, helper

    ranges = [n for n in model.graph.node if n.op_type == "Range" and n.domain in ("", "ai.onnx")]
    if not ranges:
        return model
    constants = integer_constants(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    chosen = []
    for node in ranges:
        start, delta = constants.get(node.input[0]), constants.get(node.input[2])
        if (start is None or delta is None or start.size != 1 or delta.size != 1 or int(delta.reshape(-1)[0]) != 1
                or int(start.reshape(-1)[0]) > 0 or node.input[1] in constants
                or not _non_negative(node.input[1], producers, constants, 0)):
            continue
        chosen.append(node.output[0])
    if not chosen:
        return model
    copy = copy_of(model)
    nodes = []
    for node in copy.graph.node:
        if node.op_type != "Range" or node.output[0] not in chosen:
            nodes.append(node)
            continue
        start = int(constants[node.input[0]].reshape(-1)[0])
        dtype = constants[node.input[0]].dtype
        elem = helper.np_dtype_to_tensor_dtype(dtype)
        p = node.output[0]

        def const(name: str, values: list[int], dims: list[int], t: int = elem) -> Any:
            return helper.make_node("Constant", [], [f"{p}__{name}"], name=f"{p}__{name}",
                                    value=helper.make_tensor(f"{p}__{name}", t, dims, values))
        nodes += [
            const("start", [start], []), const("axis0", [0], [1], TensorProto.INT64),
            const("offset", [start - 1], []),
            helper.make_node("Sub", [node.input[1], f"{p}__start"], [f"{p}__length"], name=f"{p}__length"),
            helper.make_node("Cast", [f"{p}__length"], [f"{p}__length64"], name=f"{p}__length64", to=TensorProto.INT64),
            helper.make_node("Unsqueeze", [f"{p}__length64", f"{p}__axis0"], [f"{p}__shape"], name=f"{p}__shape"),
            helper.make_node("ConstantOfShape", [f"{p}__shape"], [f"{p}__ones"], name=f"{p}__ones",
                             value=helper.make_tensor("one", elem, [1], [1])),
            helper.make_node("CumSum", [f"{p}__ones", f"{p}__axis0"], [f"{p}__counts"], name=f"{p}__counts"),
            helper.make_node("Add", [f"{p}__counts", f"{p}__offset"], [p], name=node.name or p),
        ]
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy


def _non_negative(name: str, producers: dict[str, Any], constants: dict[str, Any], depth: int) -> bool:
    """Whether the integer value ``name`` is >= 0 by how it is computed: from ``Shape`` and
    non-negative constants through ops that keep the sign."""
    if name in constants:
        return bool((constants[name] >= 0).all())
    node = producers.get(name)
    if node is None or depth > 12:
        return False
    if node.op_type == "Shape":
        return True
    if node.op_type not in _KEEPS_SIGN:
        return False
    # Gather / Slice / Reshape...: only the data operand carries the values (indices, shapes do not)
    operands = node.input if node.op_type in ("Add", "Mul", "Max", "Concat") else node.input[:1]
    return all(_non_negative(i, producers, constants, depth + 1) for i in operands if i)
