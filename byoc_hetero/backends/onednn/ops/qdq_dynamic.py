"""Dynamic quantization (ONNX ``DynamicQuantizeLinear``, as ``quantize_dynamic`` writes it) in a region.

The rule ``dynamic_quantize_dequantize`` takes the whole round trip the import writes for one reader
(:func:`byoc_hetero.passes.dynamic_quantize_per_reader.dynamic_round_trip`: the min / max of ``x``,
the scale and zero-point arithmetic, ``quantize`` and ``dequantize`` with those run-time values) as
one composite, lowered to one ``dynamic_quantize_dequantize`` node (cpp/kernels/quantize.cc: the
uint8 scale and zero point computed per call, then the round trip; float32 in and out).

The region-graph pass :func:`fuse_dynamic_int8_sources` then folds that node into the int8 anchor
reading it (a kernel declaring the trait ``dynamic_int8_source``: dense): the anchor reads ``x``
float32, quantizes it per call to uint8 itself and hands the scale and zero point to oneDNN as
run-time memories (cpp/kernels/int8.h), so the matmul runs u8 x s8 with int32 accumulation, as
ONNX Runtime's ``DynamicQuantizeMatMul``.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from ....passes.dynamic_quantize_per_reader import DQL_CONSTANTS, dynamic_round_trip
from ....rules import Match
from ..precision import int8_kernels_exact, tensor_reason
from ..table import PatternSpec, graph_pass, lowers_composite, pattern_rules
from .qdq import constant_operand, restore_order, weight_scale_values, drop_dead_nodes

_PATTERN_OPS = {"relu": "relax.nn.relu", "astype_int32": "relax.astype", "astype_uint8": "relax.astype"}


def _pattern():
    """(root pattern, annotations) of :func:`dynamic_round_trip` over a wildcard ``x``."""
    x = wildcard()
    consts: dict[str, object] = {}

    def const(name: str):
        return consts.setdefault(name, is_const())

    root = dynamic_round_trip(x, lambda op, *args: is_op(_PATTERN_OPS.get(op, f"relax.{op}"))(*args), const)
    return root, {"data": x, "root": root, **consts}


def _value(expr: relax.Expr) -> float | None:
    data = constant_operand(expr)
    return float(data.reshape(-1)[0]) if data is not None and data.size == 1 else None


def check_dynamic_quantize_dequantize(match: Match) -> str | None:
    """float32 data of a known shape; every constant what DynamicQuantizeLinear's import writes."""
    reason = tensor_reason(match.expr("data"), "dynamic quantize data", symbolic=False)
    if reason:
        return reason
    for name, expected in DQL_CONSTANTS.items():
        got = _value(match.expr(name))
        if got is None or not np.float32(got) == np.float32(expected):
            return f"dynamic quantization constant {name} is {got}, not {expected} (not DynamicQuantizeLinear)"
    return None


@pattern_rules
def _rules():
    root, names = _pattern()
    # above the single-op rules of its parts (reductions, where, quantize): the round trip is one op
    yield PatternSpec("dynamic_quantize_dequantize", root, names, check_dynamic_quantize_dequantize, priority=150)


@lowers_composite("dynamic_quantize_dequantize")
def lower_dynamic_quantize_dequantize(ctx, func: relax.Function) -> int:
    """The round trip as one ``dynamic_quantize_dequantize`` node reading ``x``."""
    if len(func.params) != 1:
        raise ctx.fail(f"a dynamic quantize composite with {len(func.params)} parameters (expected x only)")
    return ctx.emit("dynamic_quantize_dequantize", [ctx.data_of(func.params[0])], func.body.body, {})


@cache
def _dynamic_source_ops() -> frozenset[str]:
    """The ops whose kernels quantize a float32 source per call (KernelTraits.dynamic_int8_source)."""
    from ...._native import _C

    return frozenset(op for op, t in _C.kernel_traits().items() if t.get("dynamic_int8_source"))


def _out_channels(graph, node) -> tuple[int, int]:
    wshape = graph.tensors[node.inputs[1]]["shape"]
    nk = node.attrs.get("weight_layout") == "NK"
    return (wshape[0], 0) if nk else (wshape[1], 1)


@graph_pass
def fuse_dynamic_int8_sources(graph) -> None:
    """``dynamic_quantize_dequantize(x) -> dense (weight dequantize(int8 constant, zero points 0))``
    becomes one int8 dense reading ``x`` with attr ``src_dynamic = 1`` (weight scales as for a static
    anchor, float32 output; a float32 residual the dense already took stays its sum post-op): the
    dense quantizes ``x`` per call and runs u8 x s8. A round trip read by
    anything else stays a node of its own. Why: without it the matmuls of a ``quantize_dynamic``
    transformer run float32 on dequantized weights (92% of a BERT region's time, bench/INT8.md)."""
    ops = _dynamic_source_ops()
    changed = False
    for node in list(graph.nodes):
        if (node.op not in ops or "src_scale" in node.attrs or node.attrs.get("src_dynamic")
                or node.attrs.get("has_gate")):
            continue
        producers = graph.producers()
        source = producers.get(node.inputs[0])
        if source is None or source.op != "dynamic_quantize_dequantize":
            continue
        if not int8_kernels_exact():  # without VNNI oneDNN's int8 saturates: float32 dense
            return
        out_channels, axis = _out_channels(graph, node)
        wnode = producers.get(node.inputs[1])
        scales = weight_scale_values(graph, wnode, out_channels, axis)
        if scales is None:
            continue
        node.inputs[0], node.inputs[1] = source.inputs[0], wnode.inputs[0]
        node.attrs.update(src_dynamic=1, weight_scales=scales)
        changed = True
    if changed:
        drop_dead_nodes(graph)
        restore_order(graph)
