"""ONNX pass: a ``Gather`` from a per-tensor ``DequantizeLinear`` of an initializer (a quantized
embedding table) gathers the 8-bit rows first and dequantizes only those."""

from __future__ import annotations

from typing import Any

import numpy as np


def _per_tensor_dequantize_of_initializer(node: Any, inits: dict) -> bool:
    """Whether ``node`` is a DequantizeLinear of an initializer with one scale and zero point."""
    if node is None or node.op_type != "DequantizeLinear" or not all(i in inits for i in node.input if i):
        return False
    from onnx import numpy_helper

    return all(np.asarray(numpy_helper.to_array(inits[i])).size == 1 for i in node.input[1:] if i)


def gather_before_dequantize(model: Any, shape: Any = None) -> Any:  # noqa: ARG001 - every ONNX pass takes shape
    """``model`` with each ``Gather(DequantizeLinear(table, scale, zero_point), indices)`` whose table
    is an initializer quantized per tensor, and whose dequantized table nothing else reads, turned into
    ``DequantizeLinear(Gather(table, indices), scale, zero_point)``; ``model`` itself when there is none.

    Why: ``quantize_static`` quantizes the embedding tables of a transformer; TVM imports the
    dequantize of the whole table as a per-call llvm loop (BERT-base's 30522 x 768 words: 23M
    elements a call, more than half of a 2-layer int8 BERT's call). Exact: a per-tensor dequantize is
    element-wise and the gather only picks elements, so the two commute; bad indices still fail in
    the gather.
    """
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    producers = {o: n for n in g.node for o in n.output}
    reads: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            reads[i] = reads.get(i, 0) + 1
    outputs = {o.name for o in g.output}
    found = [n for n in g.node if n.op_type == "Gather" and
             _per_tensor_dequantize_of_initializer(producers.get(n.input[0]), inits) and
             reads.get(n.input[0]) == 1 and n.input[0] not in outputs]
    if not found:
        return model
    from onnx import helper

    copy = type(model)()
    copy.CopyFrom(model)  # the caller's ModelProto stays as it was
    index = {id(n): i for i, n in enumerate(g.node)}
    nodes = list(copy.graph.node)
    dequantizes: dict[int, Any] = {}
    for gather in found:
        dq = producers[gather.input[0]]
        new = nodes[index[id(gather)]]
        rows = new.output[0] + "_quantized_rows"
        dequantizes[index[id(gather)]] = helper.make_node(
            "DequantizeLinear", [rows, *dq.input[1:]], [new.output[0]], name=new.name + "_dequantize")
        new.input[0], new.output[0] = dq.input[0], rows
    dropped = {index[id(producers[n.input[0]])] for n in found}
    kept = []
    for i, n in enumerate(nodes):
        if i not in dropped:
            kept.append(n)
        if i in dequantizes:
            kept.append(dequantizes[i])
    del copy.graph.node[:]
    copy.graph.node.extend(kept)
    return copy
