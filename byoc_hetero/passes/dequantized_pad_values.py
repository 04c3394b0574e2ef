"""ONNX pass: a ``Pad`` whose value ``quantize_static`` quantized reads a float constant again, and
the requantize pair behind a zero pad before a ``Conv`` is dropped (see the functions)."""

from __future__ import annotations

from typing import Any

import numpy as np


def dequantized_pad_values(model: Any, shape: Any = None) -> Any:  # noqa: ARG001 - every ONNX pass takes shape
    """``model`` with each ``Pad`` whose ``constant_value`` is a ``DequantizeLinear`` of initializers
    reading a float initializer of that value instead; ``model`` itself when there is none.

    Why: ``quantize_static`` quantizes a pad's value too (EfficientNet-B0's ``ZeroPad2d``), and TVM's
    importer needs a constant there ("'Call' object has no attribute 'value'"). The value is the
    DequantizeLinear's own formula, ``(q - zero_point) * scale``.
    """
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    pads = [n for n in model.graph.node if n.op_type == "Pad" and len(n.input) > 2 and n.input[2]]
    found = [(n, producers[n.input[2]]) for n in pads if n.input[2] in producers and
             producers[n.input[2]].op_type == "DequantizeLinear" and
             all(i in inits for i in producers[n.input[2]].input if i)]
    if not found:
        return model
    copy = type(model)()
    copy.CopyFrom(model)  # the caller's ModelProto stays as it was
    nodes = {id(n): i for i, n in enumerate(model.graph.node)}
    for pad, dq in found:
        q, scale = (numpy_helper.to_array(inits[i]) for i in dq.input[:2])
        zero = numpy_helper.to_array(inits[dq.input[2]]) if len(dq.input) > 2 and dq.input[2] else 0
        value = ((q.astype(np.float64) - np.asarray(zero, np.float64)) * scale).astype(np.float32)
        name = dq.output[0] + "_dequantized"
        copy.graph.initializer.append(numpy_helper.from_array(value, name))
        copy.graph.node[nodes[id(pad)]].input[2] = name
    return _drop_requantize_after_zero_pads(copy)


def _drop_requantize_after_zero_pads(model: Any) -> Any:
    """``DequantizeLinear(x) -> Pad(0) -> QuantizeLinear -> DequantizeLinear -> Conv`` with the
    same scale and zero point on both pairs: the Conv reads the Pad directly (``fold_zero_pads``
    then makes the pad the Conv's padding). Exact: the pad adds real zeros, and requantizing a
    dequantized value with its own parameters gives it back."""
    from onnx import numpy_helper

    g = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    producers = {o: n for n in g.node for o in n.output}
    readers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def params(node):
        names = list(node.input[1:3])
        if not all(n in inits for n in names) or len(names) < 2:
            return None
        return tuple(inits[n].tobytes() for n in names)

    drop = set()
    for pad in [n for n in g.node if n.op_type == "Pad"]:
        src = producers.get(pad.input[0])
        value = inits.get(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(1)
        q = readers.get(pad.output[0], [])
        if src is None or src.op_type != "DequantizeLinear" or value is None or np.any(value != 0) or \
                len(q) != 1 or q[0].op_type != "QuantizeLinear" or pad.output[0] in [o.name for o in g.output]:
            continue
        dq = readers.get(q[0].output[0], [])
        if len(dq) != 1 or dq[0].op_type != "DequantizeLinear" or \
                not all(r.op_type == "Conv" for r in readers.get(dq[0].output[0], [])) or \
                params(src) is None or not (params(src) == params(q[0]) == params(dq[0])):
            continue
        for conv in readers[dq[0].output[0]]:
            conv.input[0] = pad.output[0]
        drop.update({id(q[0]), id(dq[0])})
    if drop:
        kept = [n for n in g.node if id(n) not in drop]
        del g.node[:]
        g.node.extend(kept)
    return model
