"""Add / multiply of two 8-bit tensors, computed on the 8-bit values (node ``quantized_binary``).

``quantize_static`` writes a multiply or add between quantized tensors as
``dequantize(a), dequantize(b) -> mul | add -> quantize``; a squeeze-excitation block (MobileNetV3,
EfficientNet) multiplies its feature map by a per-channel gate this way. In the region graph that
is two dequantize steps writing float32 copies, a oneDNN binary and a quantize step. The pass
:func:`fuse_int8_binaries` makes it one ``quantized_binary`` host step (cpp/kernels/quantized_binary.cc)
reading the 8-bit operands and writing the 8-bit output, with the same float32 arithmetic in the
same order, so the same bits (ONNX Runtime runs these as QLinearMul / QLinearAdd).

Taken: per-tensor scales and zero points on all three; the larger operand of the output's shape, the
other of its shape, one element, or one axis of it (dims 1 elsewhere). Left as they are: per-channel
quantization, 16-bit types, an activation on the binary, a dequantized operand that is not 8-bit.
"""

from __future__ import annotations

import numpy as np

from ..table import graph_pass
from .qdq import QUANTIZED_DTYPES, per_tensor_qparams, restore_order, sole_reader, drop_dead_nodes

ALGORITHMS = ("add", "mul")
"""The binary algorithms the kernel computes (both commute: the full-shape operand goes first)."""


def _broadcasts(graph, big: int, small: int) -> bool:
    """Whether tensor ``small`` is ``big``'s shape, one element, or one axis of it (right-aligned)."""
    a, b = graph.tensors[big]["shape"], graph.tensors[small]["shape"]
    if any(isinstance(d, str) for d in (*a, *b)) or len(b) > len(a):
        return False
    if list(a) == list(b):
        return True
    tail = a[len(a) - len(b):]
    varying = [k for k, d in enumerate(b) if d != 1]
    return len(varying) <= 1 and all(b[k] == tail[k] for k in varying)


def _operand(graph, t: int, producers) -> tuple[int, tuple[float, int]] | None:
    """(the 8-bit tensor, its scale and zero point) when tensor ``t`` is a per-tensor dequantize of one."""
    dq = producers.get(t)
    params = per_tensor_qparams(graph, dq, "dequantize")
    if params is None or graph.tensors[dq.inputs[0]]["dtype"] not in QUANTIZED_DTYPES:
        return None
    return dq.inputs[0], params


def _elementwise(node) -> bool:
    """Whether ``node`` is a float32 element-wise op :func:`.qdq_chain.fuse_elementwise_chains` joins."""
    from .qdq_chain import BINARY_OPS, UNARY_OPS

    return node is not None and ((node.op == "binary" and node.attrs.get("algorithm") in BINARY_OPS)
                                 or (node.op == "unary" and node.attrs.get("algorithm") in UNARY_OPS))


def _inside_float_chain(graph, q, operands, producers) -> bool:
    """Whether the binary (same-shape operands) is better one link of a chain (:mod:`.qdq_chain`): an operand quantized on
    the host from a float32 value, an output only dequantized (to float32 readers), or dequantized
    into another float element-wise op (GELU's ``x * cdf(x)``). The chain pass makes such a run one
    node (one pass over the data instead of three or four); a binary between int8 layers (a
    squeeze-excitation gate, a residual add of two convs read by a conv) stays this pass's."""
    (a, _), (b, _) = operands
    if graph.tensors[a]["shape"] != graph.tensors[b]["shape"] and \
            int(np.prod(graph.tensors[b]["shape"], dtype=np.int64)) != 1:
        return False  # a broadcast (a per-channel gate) ends a chain: only this pass fuses it
    if any(producers.get(t) is not None and producers[t].op == "quantize" for t, _ in operands):
        return True  # a host quantize of a float32 value: the chain takes it in the same pass

    def reading(t: int) -> list:
        return [n for n in graph.nodes if t in n.inputs]

    readers = reading(q.output)
    only_float = bool(readers) and all(r.op == "dequantize" for r in readers) and q.output not in graph.outputs
    return only_float or any(dq.op == "dequantize" and any(_elementwise(r) for r in reading(dq.output))
                             for dq in readers)


def _fuse(graph, q, producers, readers) -> bool:
    """Make ``quantize(binary(dequantize(a), dequantize(b)))`` one quantized_binary; whether it did."""
    out = per_tensor_qparams(graph, q, "quantize")
    binary = producers.get(q.inputs[0])
    if out is None or graph.tensors[q.output]["dtype"] not in QUANTIZED_DTYPES or binary is None or \
            binary.op != "binary" or binary.attrs.get("algorithm") not in ALGORITHMS or len(binary.inputs) != 2 or \
            binary.attrs.get("activation", "none") != "none" or sole_reader(graph, binary.output, readers) is not q:
        return False
    operands = [_operand(graph, t, producers) for t in binary.inputs]
    if None in operands or _inside_float_chain(graph, q, operands, producers):
        return False
    (a, qa), (b, qb) = operands
    if graph.tensors[a]["shape"] != graph.tensors[q.output]["shape"]:
        (a, qa), (b, qb) = (b, qb), (a, qa)
    if graph.tensors[a]["shape"] != graph.tensors[q.output]["shape"] or not _broadcasts(graph, a, b):
        return False
    q.op, q.inputs = "quantized_binary", [a, b]
    q.attrs = {"algorithm": binary.attrs["algorithm"], "a_scale": qa[0], "a_zero_point": qa[1],
               "b_scale": qb[0], "b_zero_point": qb[1], "dst_scale": out[0], "dst_zero_point": out[1]}
    graph.nodes.remove(binary)
    return True


@graph_pass
def fuse_int8_binaries(graph) -> None:
    """``dequantize(a), dequantize(b) -> add | mul -> quantize``, all per-tensor and 8-bit, becomes
    one ``quantized_binary`` node on the 8-bit values (b of a's shape, one element or one axis of
    it). Why: MobileNetV3-L's and EfficientNet-B0's squeeze-excitation multiplies were each two
    dequantize steps, a float32 binary and a quantize step (bench/INT8.md, session 3). Runs after
    :func:`fuse_int8_activations`, which leaves the gates 8-bit, and before
    :func:`fuse_quantize_dequantize`, which would take the quantize; a binary inside a run of float
    element-wise ops is left to :func:`.qdq_chain.fuse_elementwise_chains` (one node for the run)."""
    changed = False
    for q in [n for n in graph.nodes if n.op == "quantize"]:
        changed |= _fuse(graph, q, graph.producers(), graph.readers())
    if changed:
        drop_dead_nodes(graph)
        restore_order(graph)
