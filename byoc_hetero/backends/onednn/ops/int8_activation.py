"""Activations between two quantizations of an int8 anchor's output, as the anchor's post-op.

``quantize_static`` puts a ``QuantizeLinear -> DequantizeLinear`` pair on every tensor, so the
activation after an int8 conv reaches the region graph as

    int8 conv (dst s1) -> dequantize(s1) -> hardswish -> quantize(s2)
    int8 conv (dst s1) -> dequantize(s1) -> sigmoid -> quantize(s2) -> dequantize(s2) -+-> mul -> quantize(s3)
                       -> dequantize(s1) -------------------------------------------+   (SiLU, EfficientNet)

which runs as three to six host steps over float32 copies of the tensor. The pass
:func:`fuse_int8_activations` makes the activation the anchor's oneDNN eltwise post-op (applied in
float32 to the accumulated value, before the output scale) and the anchor writes the last
quantize's 8-bit output directly: one primitive instead of the chain.

The intermediate roundings inside the chain (to ``s1`` before the activation, to ``s2`` of the
sigmoid in SiLU) are skipped: the result is the activation of the exact accumulator rounded once, as
OpenVINO computes it. Their saturation is not skipped: the ``s1`` quantize's range stays as a clip
post-op before the activation (attr ``saturate_range``; a uint8 quantize with zero point 0 is a
relu), and a sigmoid's round trip is looked through only when its range covers [0, 1] within one
step (else :mod:`.int8_lookup` takes the chain, exactly). The result is within one step of
``s_out`` of that computation; against ONNX's reference, which rounds at ``s1`` first, it differs by
up to ``max|f'| * s1 / 2`` more (hardswish: 0.75 ``s1``). The error vs the float32 model does not
grow (one rounding fewer): bench/INT8.md, session 3.
"""

from __future__ import annotations

import numpy as np

from ..table import graph_pass
from .activation import FUSES_ACTIVATION
from .qdq import QUANTIZED_DTYPES, per_tensor_qparams, restore_order

GATES = {"sigmoid": "silu", "hardsigmoid": "hardswish"}
"""``x * gate(x)`` written as a multiply: the oneDNN eltwise it is (x * sigmoid(x) is swish with
alpha 1, x * hardsigmoid(x) is hardswish, both with the alpha / beta of cpp/enums.cc)."""


class NoChain(Exception):
    """The tensor is not computed by an element-wise chain the caller accepts."""


def chain_expr(graph, t: int, producers, visited: list, leaf, through) -> tuple:
    """The element-wise chain computing tensor ``t`` as a tuple: ``leaf(dq)`` for a per-tensor
    dequantize ``dq`` it accepts, ``("act", name, clip, e)`` for an eltwise, ``("mul", a, b)``,
    ``("qdq", scale, zero, dtype, e)`` for a ``quantize -> dequantize`` round trip of one per-tensor
    scale that ``through(quantize)`` accepts. ``visited`` collects the nodes on the way; raises
    :class:`NoChain` for anything else. Shared with the lookup tables of :mod:`.int8_lookup`."""
    node = producers.get(t)
    if node is None:
        raise NoChain
    visited.append(node)
    if node.op == "dequantize":
        dq = per_tensor_qparams(graph, node, "dequantize")
        found = leaf(node) if dq is not None else None
        if found is not None:
            return found
        source = producers.get(node.inputs[0])
        if dq is None or source is None or per_tensor_qparams(graph, source, "quantize") != dq or not through(source):
            raise NoChain
        visited.append(source)
        inner = chain_expr(graph, source.inputs[0], producers, visited, leaf, through)
        return ("qdq", dq[0], dq[1], graph.tensors[source.output]["dtype"], inner)
    if node.op == "eltwise" and len(node.inputs) == 1:
        inner = chain_expr(graph, node.inputs[0], producers, visited, leaf, through)
        return ("act", node.attrs["algorithm"], node.attrs.get("clip"), inner)
    if node.op == "binary" and node.attrs.get("algorithm") == "mul" and len(node.inputs) == 2 and \
            node.attrs.get("activation", "none") == "none":
        return ("mul", *(chain_expr(graph, i, producers, visited, leaf, through) for i in node.inputs))
    raise NoChain


def _anchor_leaf(graph, producers):
    """``("x", anchor)`` for a dequantize of an int8 anchor's output with its own output scale."""
    def leaf(dq) -> tuple | None:
        source = producers.get(dq.inputs[0])
        if source is None or source.op not in FUSES_ACTIVATION or "dst_scale" not in source.attrs:
            return None
        if (float(source.attrs["dst_scale"]), int(source.attrs["dst_zero_point"])) != per_tensor_qparams(graph, dq, "dequantize"):
            raise NoChain
        return ("x", source)
    return leaf


def _strip(expr: tuple) -> tuple:
    """``expr`` without its outer round trips (their rounding is what a post-op skips)."""
    while expr[0] == "qdq":
        expr = expr[4]
    return expr


def _saturation(graph, node) -> tuple[float, float]:
    """The float range [lo, hi] a per-tensor quantize (or the int8 output it wrote) saturates to."""
    scale, zero = per_tensor_qparams(graph, node, node.op) if node.op in ("quantize", "dequantize") else \
        (float(node.attrs["dst_scale"]), int(node.attrs["dst_zero_point"]))
    info = np.iinfo(graph.tensors[node.output]["dtype"])
    return (info.min - zero) * scale, (info.max - zero) * scale


def _covers_unit_range(graph, q, producers) -> bool:
    """Whether the round trip at quantize ``q`` inside a chain may be skipped: it requantizes a
    sigmoid / hardsigmoid (values in [0, 1]) and its saturation range reaches within one step of
    both ends, so skipping it moves a value by at most one step, as its rounding would. Any other
    round trip could clip values a calibration range cut off: the chain is then left alone."""
    source = producers.get(q.inputs[0])
    if source is None or source.op != "eltwise" or source.attrs.get("algorithm") not in GATES:
        return False
    scale = per_tensor_qparams(graph, q, "quantize")[0]
    lo, hi = _saturation(graph, q)
    return lo <= scale and hi >= 1.0 - scale


def _activation(expr: tuple) -> tuple[str, object, object] | None:
    """(activation name, its clip bounds, the anchor) when ``expr`` is one eltwise of an anchor's
    output or ``x * gate(x)``; else None."""
    expr = _strip(expr)
    if expr[0] == "act" and _strip(expr[3])[0] == "x":
        return expr[1], expr[2], _strip(expr[3])[1]
    if expr[0] == "mul":
        for x, gate in ((_strip(expr[1]), _strip(expr[2])), (_strip(expr[2]), _strip(expr[1]))):
            if x[0] == "x" and gate[0] == "act" and gate[1] in GATES and _strip(gate[3]) == x:
                return GATES[gate[1]], None, x[1]
    return None


def closed_under(graph, nodes: list, last) -> bool:
    """Whether every tensor the chain's nodes write is read only inside the chain (by the nodes
    or ``last``) and is no region output."""
    inside = [t for n in (*nodes, last) for t in n.inputs]
    readers = graph.readers()
    outputs = {n.output for n in nodes}
    return all(t not in graph.outputs and readers.get(t, 0) == inside.count(t) for t in outputs)


def _fuse_chain(graph, q, producers) -> bool:
    """Fuse the chain ending in quantize node ``q`` into its anchor; whether it did."""
    out = per_tensor_qparams(graph, q, "quantize")
    if out is None or graph.tensors[q.output]["dtype"] not in QUANTIZED_DTYPES:
        return False
    visited: list = []
    try:
        found = _activation(chain_expr(graph, q.inputs[0], producers, visited, _anchor_leaf(graph, producers),
                                       lambda rq: _covers_unit_range(graph, rq, producers)))
    except NoChain:
        return False
    if found is None:
        return False
    name, clip, anchor = found
    visited = list({id(n): n for n in visited}.values())  # x may be dequantized once and read twice
    if anchor.attrs.get("residual") or anchor.attrs.get("activation", "none") != "none" or \
            anchor.output in graph.outputs:
        return False
    readers = graph.readers().get(anchor.output, 0)
    if readers != sum(n.inputs.count(anchor.output) for n in visited) or not closed_under(graph, visited, q):
        return False
    anchor.attrs["activation"] = name
    if clip is not None:
        anchor.attrs["clip"] = clip
    # the anchor's own quantize saturated before the activation: that stays, only its rounding goes
    anchor.attrs.update(saturate_range=list(_saturation(graph, anchor)), dst_scale=out[0], dst_zero_point=out[1])
    anchor.output = q.output
    for node in (*visited, q):
        graph.nodes.remove(node)
    return True


@graph_pass
def fuse_int8_activations(graph) -> None:
    """``int8 anchor -> dequantize -> activation [-> quantize -> dequantize] -> quantize`` (one
    eltwise, or ``x * sigmoid(x)`` / ``x * hardsigmoid(x)`` written as a multiply, with any round
    trips of one scale inside) becomes the anchor's eltwise post-op, and the anchor writes the last
    quantize's 8-bit output. Why: MobileNetV3's hardswish and EfficientNet's SiLU otherwise run as
    host dequantize / eltwise / (multiply) / quantize steps over float32 copies, 37% of a
    MobileNetV3-L call at 2 threads (bench/INT8.md). Runs after :func:`fuse_int8_anchors` (which
    gives the anchors their output scale) and before :func:`fuse_quantize_dequantize`."""
    changed = False
    for q in [n for n in graph.nodes if n.op == "quantize"]:
        if q in graph.nodes:
            changed |= _fuse_chain(graph, q, graph.producers())
    if changed:
        restore_order(graph)
