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

from ..table import graph_pass
from .qdq import QUANTIZED_DTYPES, _per_tensor, _restore_order, _sole_reader, drop_dead_nodes

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
    params = _per_tensor(graph, dq, "dequantize")
    if params is None or graph.tensors[dq.inputs[0]]["dtype"] not in QUANTIZED_DTYPES:
        return None
    return dq.inputs[0], params


def _fuse(graph, q, producers, readers) -> bool:
    """Make ``quantize(binary(dequantize(a), dequantize(b)))`` one quantized_binary; whether it did."""
    out = _per_tensor(graph, q, "quantize")
    binary = producers.get(q.inputs[0])
    if out is None or graph.tensors[q.output]["dtype"] not in QUANTIZED_DTYPES or binary is None or \
            binary.op != "binary" or binary.attrs.get("algorithm") not in ALGORITHMS or len(binary.inputs) != 2 or \
            binary.attrs.get("activation", "none") != "none" or _sole_reader(graph, binary.output, readers) is not q:
        return False
    operands = [_operand(graph, t, producers) for t in binary.inputs]
    if None in operands:
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
    :func:`fuse_quantize_dequantize`, which would take the quantize."""
    changed = False
    for q in [n for n in graph.nodes if n.op == "quantize"]:
        changed |= _fuse(graph, q, graph.producers(), graph.readers())
    if changed:
        drop_dead_nodes(graph)
        _restore_order(graph)
