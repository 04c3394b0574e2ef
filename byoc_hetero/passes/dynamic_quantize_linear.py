"""Pass ``dynamic_quantize_linear`` (ONNX protobuf, before import): each ``DynamicQuantizeLinear``
spelled out in standard ops with ONNX Runtime's guard for an all-zero input.

What: ``y, y_scale, y_zero_point = DynamicQuantizeLinear(x)`` becomes

    lo = Min(ReduceMin(x), 0);  hi = Max(ReduceMax(x), 0);  range = hi - lo
    y_scale = Where(range == 0, 1, range / 255)
    y_zero_point = Cast<uint8>(Round(0 - lo / y_scale))      (in [0, 255]: no Clip needed)
    y = QuantizeLinear(x, y_scale, y_zero_point)

Why: TVM's importer writes ``y_scale = range / 255`` unguarded. On an input of zeros (a padded
sequence, a zeroed activation) that is 0, ``lo / y_scale`` is 0/0 = NaN, and the zero point and
every quantized value are a NaN cast to uint8 — undefined (255 on x86 today). ONNX Runtime returns
scale 1, zero point 0 and zeros there (measured: ``y_scale`` 1.0 vs TVM's 0.0, ``y_zero_point`` 0 vs
255). ONNX's ``Round`` rounds half to even, as the spec's zero point asks. With a quantize whose
scale is a value computed in the graph, the int8 matmul patterns see the same QDQ form as a static
model's (:mod:`.matmul_integer_qdq`).
"""

from __future__ import annotations

from typing import Any


def dynamic_quantize_linear(model: Any, shape: Any = None) -> Any:  # noqa: ARG001 - every ONNX pass takes shape
    """``model`` with each ``DynamicQuantizeLinear`` of the main graph replaced as the module docstring
    says; ``model`` itself (not a copy) when it has none."""
    from onnx import TensorProto, helper

    if not any(n.op_type == "DynamicQuantizeLinear" and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    copy = type(model)()
    copy.CopyFrom(model)  # the caller's ModelProto stays as it was
    graph = copy.graph
    nodes = []
    for k, node in enumerate(graph.node):
        if node.op_type != "DynamicQuantizeLinear" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        x = node.input[0]
        y, scale, zp = (list(node.output) + ["", "", ""])[:3]
        p = f"_bh_dql{k}_"
        scale = scale or p + "scale"
        zp = zp or p + "zp"
        consts = {p + "zero": 0.0, p + "one": 1.0, p + "qmax": 255.0}
        for name, value in consts.items():
            nodes.append(helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.FLOAT, [], [value])))
        mk = helper.make_node
        nodes += [
            mk("ReduceMin", [x], [p + "min"], keepdims=0), mk("ReduceMax", [x], [p + "max"], keepdims=0),
            # min(m, 0) = -relu(-m) and max(m, 0) = relu(m): TVM imports Min / Max with NaN bookkeeping
            # (isnan, stack, where: 16 extra ops per node), Relu as one op
            mk("Neg", [p + "min"], [p + "neg_min"]), mk("Relu", [p + "neg_min"], [p + "neg_lo"]),
            mk("Neg", [p + "neg_lo"], [p + "lo"]), mk("Relu", [p + "max"], [p + "hi"]),
            mk("Sub", [p + "hi", p + "lo"], [p + "range"]),
            mk("Equal", [p + "range", p + "zero"], [p + "empty"]),
            mk("Div", [p + "range", p + "qmax"], [p + "step"]),
            mk("Where", [p + "empty", p + "one", p + "step"], [scale]),
            mk("Div", [p + "lo", scale], [p + "lo_steps"]),
            mk("Sub", [p + "zero", p + "lo_steps"], [p + "zp_float"]),
            # no Clip: -lo / y_scale lies in [0, 255] (lo <= 0, -lo <= range), 255 + float error at
            # most, which Round takes back to 255 (TVM imports Clip with tensor bounds as 8 ops)
            mk("Round", [p + "zp_float"], [p + "zp_rounded"]),
            mk("Cast", [p + "zp_rounded"], [zp], to=TensorProto.UINT8),
            mk("QuantizeLinear", [x, scale, zp], [y or p + "y"], name=node.name or f"DynamicQuantizeLinear_{k}"),
        ]
    del graph.node[:]
    graph.node.extend(nodes)
    return copy
