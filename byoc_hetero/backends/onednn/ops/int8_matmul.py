"""Region-graph pass :func:`fuse_int8_matmuls`: a matmul of two per-tensor dequantized 8-bit
tensors (a QDQ transformer's Q.K^T and P.V) as one int8 oneDNN matmul.

Why: ``quantize_static`` quantizes the attention's query, key, value and probabilities, but the
matmuls between them ran float32 on dequantized copies (ViT-B/16: 11% of a call at 1 thread,
plus the float32 relayouts of the permuted operands; bench/INT8.md, session 4). oneDNN 3.2's
brgemm AMX matmul reads u8 x s8 with both zero points through the permuted views, 2.3-3x faster
than float32 (cpp/kernels/matmul.cc). The result is the float32 product of the dequantized values
(integer sums, scaled once): the same value up to float32 rounding of the sum's order.

What it rewrites: ``matmul(dequantize(a8), dequantize(b8))`` -> ``matmul(a8, b8)`` with attrs
``a_scale``, ``a_zero_point``, ``b_scale``, ``b_zero_point``, where each dequantize has one scale
and an 8-bit input; an operand that is a ``quantize_dequantize`` round trip read by this matmul
alone (the softmax's probabilities) becomes a ``quantize`` to 8 bits that the matmul reads. The
matmul keeps its views (permutes read as strides) and scale; one with a bias, mask, residual or
activation, or a bf16 precision, is left alone.
"""

from __future__ import annotations

from ..precision import int8_kernels_exact
from ..table import graph_pass
from .qdq import QUANTIZED_DTYPES, per_tensor_qparams, restore_order, sole_reader, drop_dead_nodes

VIEW_ATTRS = {"transpose_b", "scale", "a_shape", "a_strides", "a_axes", "b_shape", "b_strides", "b_axes"}
"""Matmul attrs the int8 matmul keeps (cpp/kernels/matmul.cc reads them the same way)."""


def _plain_matmul(node) -> bool:
    """A matmul of two operands with no bias, mask, residual or activation (only views and a scale)."""
    extra = {k: v for k, v in node.attrs.items() if k not in VIEW_ATTRS}
    plain = {"has_bias": 0, "has_mask": 0, "activation": "none"}
    return len(node.inputs) == 2 and all(plain.get(k, object()) == v for k, v in extra.items())


def _operand(graph, t: int, producers, readers, matmul):
    """(the node producing ``t``, scale, zero point) when the matmul may read its 8-bit values
    instead: a per-tensor dequantize of an 8-bit tensor, or a round trip read by this matmul alone;
    None otherwise. Changes nothing (:func:`_eight_bit` does)."""
    node = producers.get(t)
    if node is None or len(node.inputs) != 3 or node.op not in ("dequantize", "quantize_dequantize"):
        return None
    q = per_tensor_qparams(graph, node, node.op)
    data = node.inputs[0] if node.op == "dequantize" else node.inputs[2]
    if q is None or graph.tensors[data]["dtype"] not in QUANTIZED_DTYPES:
        return None
    if node.op == "quantize_dequantize" and sole_reader(graph, t, readers) is not matmul:
        return None
    return node, q[0], q[1]


def _eight_bit(graph, node) -> int:
    """The 8-bit tensor behind operand producer ``node``: a dequantize's input, or the output of the
    round trip made a quantize."""
    if node.op == "dequantize":
        return node.inputs[0]
    graph.tensors.append({"shape": list(graph.tensors[node.output]["shape"]),
                          "dtype": graph.tensors[node.inputs[2]]["dtype"]})
    node.op, node.output = "quantize", len(graph.tensors) - 1
    return node.output


@graph_pass
def fuse_int8_matmuls(graph) -> None:
    """``matmul(dequantize(a8), dequantize(b8))`` (per-tensor scales; a round trip read by the matmul
    alone counts as a dequantize of its quantize) becomes an int8 matmul reading the 8-bit tensors
    with attrs ``a_scale``, ``a_zero_point``, ``b_scale``, ``b_zero_point`` (see the module
    docstring). Runs after :func:`.qdq.fuse_quantize_dequantize` and
    :func:`.qdq_views.move_views_to_8bit` (which leave the dequantizes next to the matmul)."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "matmul" or not _plain_matmul(node) or node.attrs.get("precision", "f32") != "f32":
            continue
        producers, readers = graph.producers(), graph.readers()
        a, b = (_operand(graph, t, producers, readers, node) for t in node.inputs)
        if a is None or b is None or a[0] is b[0]:
            continue
        if not int8_kernels_exact():  # without VNNI oneDNN's int8 saturates: float32 between the Q/DQ
            return
        node.inputs = [_eight_bit(graph, a[0]), _eight_bit(graph, b[0])]
        node.attrs.update({"a_scale": a[1], "a_zero_point": a[2], "b_scale": b[1], "b_zero_point": b[2]})
        changed = True
    if changed:
        drop_dead_nodes(graph)
        restore_order(graph)
