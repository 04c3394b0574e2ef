"""Pass ``conv_integer_qdq`` (ONNX protobuf, before import, after :mod:`.dynamic_quantize_linear`):
ONNX's ``ConvInteger``, as ``quantize_dynamic`` writes it for a convolution, in standard ops.

What: ``quantize_dynamic`` writes a quantized ``Conv`` as

    x_q = QuantizeLinear(x, x_scale, x_zp)            (DynamicQuantizeLinear, spelled out before)
    acc = ConvInteger(x_q, w_q, x_zp, w_zp)            (int32)
    y = Mul(Cast<float>(acc), Mul(x_scale, w_scale))

Where ``acc`` and its cast are read by that ``Mul`` alone, ``x_scale`` is one factor of the scale
product and the scale of ``x_q``'s ``QuantizeLinear``, and both factors are scalars, ``y`` becomes

    y = Conv(DequantizeLinear(x_q, x_scale, x_zp), DequantizeLinear(w_q, w_scale, w_zp))

(the ``Conv`` with the ``ConvInteger``'s attributes) — the QDQ form of a static model's conv, which
the partition reads as it reads one: the ``quantize`` / ``dequantize`` round trip of a
``DynamicQuantizeLinear`` is offloaded (:mod:`.dynamic_quantize_per_reader`), and the conv with it.
The value is ``x_scale * w_scale * acc`` up to float32 rounding: the products of integers are exact in
float32, the sum of products is accumulated in float32 instead of int32.

Any other ``ConvInteger`` (no scale multiply after it, a per-row scale, an unquantized ``x``) becomes
its integer meaning in float ops,

    acc = Cast<int32>(Conv(DequantizeLinear(x_q, 1, x_zp), DequantizeLinear(w_q, 1, w_zp)))

exact while the partial sums stay below 2^24 in magnitude (any conv of fewer than 514 input elements
per output), within float32 rounding (6e-8 relative) beyond.

Why: TVM's ONNX importer has no converter for ``ConvInteger``; a ``quantize_dynamic`` CNN failed to
import ("operators are not supported for frontend ONNX: ConvInteger").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._onnx import copy_of, inferred_shapes

_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _scalar(shapes: dict[str, list], name: str) -> bool:
    dims = shapes.get(name)
    return dims is not None and len(dims) <= 1 and all(d == 1 for d in dims)


def _scaled(node: Any, by_output: dict[str, Any], readers: dict[str, list], shapes: dict[str, list]) -> tuple | None:
    """(the Cast, the Mul whose output the conv takes, x_scale, w_scale) when ``node``'s result is
    scaled as the module docstring says; None otherwise."""
    only = lambda name: readers.get(name, [None])[0] if len(readers.get(name, [])) == 1 else None  # noqa: E731
    cast, zps = only(node.output[0]), (list(node.input) + ["", ""])[2:4]
    if getattr(cast, "op_type", None) != "Cast" or next((a.i for a in cast.attribute if a.name == "to"), None) != 1:
        return None  # 1: FLOAT
    mul = only(cast.output[0])
    if getattr(mul, "op_type", None) != "Mul" or len(mul.input) != 2:
        return None
    product = by_output.get(mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0])
    quantize = by_output.get(node.input[0])
    if product is None or product.op_type != "Mul" or quantize is None or quantize.op_type != "QuantizeLinear":
        return None
    x_scale = quantize.input[1]
    if x_scale not in product.input or len(product.input) != 2:
        return None
    w_scale = product.input[1] if product.input[0] == x_scale else product.input[0]
    if not all(_scalar(shapes, s) for s in (x_scale, w_scale, *filter(None, zps))):
        return None
    return cast, mul, x_scale, w_scale


def _scalar_one(graph: Any, name: str) -> str:
    from onnx import numpy_helper

    if not any(i.name == name for i in graph.initializer):
        graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), name))
    return name


def _ones_like_zero_point(graph: Any, shapes: dict[str, list], zp: str, name: str) -> str:
    """A float32 scale of ones shaped as the zero point ``zp`` (a scalar when there is none)."""
    from onnx import numpy_helper

    dims = shapes.get(zp) if zp else []
    if not dims:
        return _scalar_one(graph, name)
    graph.initializer.append(numpy_helper.from_array(np.ones([int(d) for d in dims], np.float32), name))
    return name


def conv_integer_qdq(model: Any, shape: Any = None) -> Any:  # noqa: ARG001 - every ONNX pass takes shape
    """``model`` with each ``ConvInteger`` of the main graph in standard ops as the module docstring
    says; ``model`` itself (not a copy) when it has none."""
    from onnx import TensorProto, helper

    if not any(n.op_type == "ConvInteger" and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    copy = copy_of(model)
    graph = copy.graph
    shapes = inferred_shapes(copy)
    old = list(graph.node)  # held here: the ids below name these objects while they live
    by_output = {o: n for n in old for o in n.output}
    readers: dict[str, list] = {}
    for n in old:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    for o in graph.output:
        readers.setdefault(o.name, []).append(o)
    replaced: dict[int, list] = {}  # id of the node whose place the new nodes take -> them
    dropped: set[int] = set()
    for k, node in enumerate(old):
        if node.op_type != "ConvInteger" or node.domain not in ("", "ai.onnx"):
            continue
        x_q, w_q, x_zp, w_zp = (list(node.input) + ["", "", ""])[:4]
        attrs = [a for a in node.attribute if a.name in _CONV_ATTRS]
        p = f"_bh_convint{k}_"
        found = _scaled(node, by_output, readers, shapes)
        if found is not None:
            cast, mul, x_scale, w_scale = found
            dropped |= {id(node), id(cast)}
            conv = helper.make_node("Conv", [p + "x", p + "w"], [mul.output[0]], name=node.name or p + "conv")
            conv.attribute.extend(attrs)
            replaced[id(mul)] = [
                helper.make_node("DequantizeLinear", [x_q, x_scale] + ([x_zp] if x_zp else []), [p + "x"]),
                helper.make_node("DequantizeLinear", [w_q, w_scale] + ([w_zp] if w_zp else []), [p + "w"]),
                conv]
            continue
        x_one = _scalar_one(graph, p + "x_one")
        w_one = _ones_like_zero_point(graph, shapes, w_zp, p + "w_one")
        conv = helper.make_node("Conv", [p + "x", p + "w"], [p + "acc"], name=node.name or p + "conv")
        conv.attribute.extend(attrs)
        replaced[id(node)] = [
            helper.make_node("DequantizeLinear", [x_q, x_one] + ([x_zp] if x_zp else []), [p + "x"]),
            helper.make_node("DequantizeLinear", [w_q, w_one] + ([w_zp] if w_zp else []), [p + "w"], axis=0),
            conv,
            helper.make_node("Cast", [p + "acc"], [node.output[0]], to=TensorProto.INT32)]
    nodes = []
    for node in old:
        if id(node) in replaced:
            nodes += replaced[id(node)]
        elif id(node) not in dropped:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return copy
