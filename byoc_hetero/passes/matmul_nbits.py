"""Pass ``matmul_nbits`` (ONNX protobuf, before import): ONNX Runtime's ``MatMulNBits``
(``com.microsoft``; int4 / int8 weights in blocks along K) spelled out in standard ops as the
weight-only form of :mod:`byoc_hetero.quant.weight_only`.

What: ``Y = MatMulNBits(A, B, scales[, zero_points][, g_idx][, bias])`` with constant B [N, K/block,
block*bits/8] (uint8; 4-bit codes two a byte, the even k low), scales [N * K/block] (float32 / float16)
and uint8 zero points (4-bit ones two a byte) becomes::

    c = Cast<float>(codes [N, K*bits/8])
    # bits 4: hi = Floor(c * 1/16); lo = c - hi * 16; c = Concat(Unsqueeze(lo, 2), Unsqueeze(hi, 2), axis 2)
    w = Reshape((Reshape(c, [N, K/block, block]) - zero) * Cast<float>(Reshape(scales, [N, K/block, 1])), [N, K])
    Y = MatMul(A, Transpose(w)) [+ bias]

with ``zero`` ``Cast<float>(Reshape(zero_points unpacked to one byte each, [N, K/block, 1]))``, or the
constant 2^(bits-1) when the node has none (MatMulNBits' default). TVM's importer reads these ops;
the oneDNN backend runs the chain as one ``dense_wq`` node on the codes as stored, llvm dequantizes.

Why: TVM's importer has no converter for ``MatMulNBits`` (the op ONNX Runtime GenAI's int4 models and
``MatMulNBitsQuantizer`` write). A node whose B, scales or zero points are not initializers, with a
``g_idx`` (act-order), float zero points, a K not divisible by its block, or ``bits`` other than 4 / 8
is left as it is (the importer's error names it); malformed values (scales of the wrong size, NaN,
infinite or zero scales) are a :class:`~byoc_hetero.errors.QuantizationError` naming the node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import QuantizationError
from ..weight_codes import WeightCodes


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def codes_of(node: Any, inits: dict[str, np.ndarray]):
    """The node's WeightCodes and bias name, or None when it is left for the importer."""
    a = _attrs(node)
    bits, block, k, n = int(a.get("bits", 4)), int(a.get("block_size", 0)), int(a.get("K", 0)), int(a.get("N", 0))
    inputs = list(node.input) + [""] * (6 - len(node.input))
    if bits not in (4, 8) or block < 16 or k % block or inputs[4] or any(
            x and x not in inits for x in inputs[1:4]) or not inputs[1] or not inputs[2]:
        return None
    zero = inits.get(inputs[3]) if inputs[3] else None
    if zero is not None and zero.dtype != np.uint8:
        return None
    where = f"MatMulNBits {node.name or node.output[0]}"
    nb = k // block
    b, scales = inits[inputs[1]], inits[inputs[2]]
    if b.dtype != np.uint8 or b.size != n * k * bits // 8:
        raise QuantizationError(f"{where}: B must be uint8 with N * K * bits / 8 = {n * k * bits // 8} bytes, got "
                                f"{b.dtype}{list(b.shape)}")
    if scales.size != n * nb:
        raise QuantizationError(f"{where}: scales must have N * K / block_size = {n * nb} elements, got {scales.size}")
    zp = None
    if zero is not None:
        per_row = -(-nb * bits // 8)
        if zero.size != n * per_row:
            raise QuantizationError(f"{where}: zero_points must have {n * per_row} bytes, got {zero.size}")
        rows = zero.reshape(n, per_row)
        zp = np.stack([rows & 0x0F, rows >> 4], axis=2).reshape(n, -1)[:, :nb] if bits == 4 else rows
        zp = np.ascontiguousarray(zp, dtype=np.uint8)
    codes = WeightCodes(bits, block, np.ascontiguousarray(b.reshape(n, k * bits // 8)),
                        np.ascontiguousarray(scales.reshape(n, nb)), zp)
    codes.check(where)
    return codes, inputs[5]


class _Emitter:
    """Appends standard nodes and initializers for one MatMulNBits node (names prefixed by its output)."""

    def __init__(self, graph: Any, prefix: str):
        self.graph, self.prefix, self.nodes, self.count = graph, prefix, [], 0

    def const(self, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = f"{self.prefix}/c{self.count}"
        self.count += 1
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        from onnx import helper

        out = out or f"{self.prefix}/v{self.count}"
        self.count += 1
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out


def _spelled_out(graph: Any, node: Any, codes, bias: str) -> list[Any]:
    from onnx import TensorProto

    n, k = codes.shape
    nb = k // codes.block
    e = _Emitter(graph, node.output[0])
    c = e.op("Cast", [e.const(codes.codes)], to=TensorProto.FLOAT)
    if codes.bits == 4:
        hi = e.op("Floor", [e.op("Mul", [c, e.const(np.float32(1 / 16))])])
        lo = e.op("Sub", [c, e.op("Mul", [hi, e.const(np.float32(16))])])
        axes = e.const(np.array([2], np.int64))
        c = e.op("Concat", [e.op("Unsqueeze", [lo, axes]), e.op("Unsqueeze", [hi, axes])], axis=2)
    u = e.op("Reshape", [c, e.const(np.array([n, nb, codes.block], np.int64))])
    per_block = e.const(np.array([n, nb, 1], np.int64))
    if codes.zero_points is not None:
        zero = e.op("Cast", [e.op("Reshape", [e.const(codes.zero_points), per_block])], to=TensorProto.FLOAT)
    else:
        zero = e.const(np.float32(codes.implicit_zero))
    scale = e.op("Reshape", [e.const(codes.scales), per_block])
    if codes.scales.dtype != np.float32:
        scale = e.op("Cast", [scale], to=TensorProto.FLOAT)
    w = e.op("Reshape", [e.op("Mul", [e.op("Sub", [u, zero]), scale]), e.const(np.array([n, k], np.int64))])
    wt = e.op("Transpose", [w], perm=[1, 0])
    if bias:
        e.op("Add", [e.op("MatMul", [node.input[0], wt]), bias], out=node.output[0])
    else:
        e.op("MatMul", [node.input[0], wt], out=node.output[0])
    return e.nodes


def matmul_nbits(model: Any, shape: Any = None) -> Any:  # noqa: ARG001 - every ONNX pass takes shape
    """``model`` with each ``MatMulNBits`` of the main graph spelled out as the module docstring says;
    ``model`` itself (not a copy) when it has none."""
    from onnx import numpy_helper

    if not any(nd.op_type == "MatMulNBits" and nd.domain == "com.microsoft" for nd in model.graph.node):
        return model
    copy = type(model)()
    copy.CopyFrom(model)  # the caller's ModelProto stays as it was
    graph = copy.graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    nodes, replaced = [], set()
    for node in graph.node:
        found = codes_of(node, inits) if node.op_type == "MatMulNBits" and node.domain == "com.microsoft" else None
        if found is None:
            nodes.append(node)
            continue
        nodes.extend(_spelled_out(graph, node, *found))
        replaced.update(node.input[1:4])
    still_read = {x for nd in nodes for x in nd.input}
    kept = [i for i in graph.initializer if i.name not in replaced or i.name in still_read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(nd.domain == "com.microsoft" for nd in graph.node):
        ms = [o for o in copy.opset_import if o.domain == "com.microsoft"]
        for o in ms:
            copy.opset_import.remove(o)
    return copy
