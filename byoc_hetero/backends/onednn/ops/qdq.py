"""quantize / dequantize (ONNX QuantizeLinear / DequantizeLinear, Relax ``relax.quantize`` /
``relax.dequantize``) and the int8 anchors they form with conv2d and dense.

Each Q/DQ call whose runtime semantics are exact becomes a ``quantize`` / ``dequantize`` node
(host kernels, round half to even and saturation as ONNX says), so a QDQ model is one region and
not cut at every Q/DQ. The region-graph pass :func:`fuse_int8_anchors` then turns
``dequantize(x) -> conv2d | dense (weight = dequantize(int8 constant)) [-> quantize]`` into one
int8 node (u8/s8 data x s8 weights, oneDNN scales and zero points; cpp/kernels/int8.h) and
``dequantize -> pool2d (max) -> quantize`` with one scale into a pool2d over the 8-bit values.
What is left runs in float32 between its own Q/DQ nodes, inside the region (docs/int8.md).

Rejected, with the reason, so they stay on llvm: 16-bit and float8 types, blocked (rank >= 2)
scales, scales or zero points that are not constants, a zero point of another type than the data.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from ...._relax import shape_of, tensor_dtype
from ....rules import Match
from ..precision import int8_kernels_exact, tensor_reason
from ..table import PatternSpec, graph_pass, lowers, pattern_rules

QUANTIZED_DTYPES = ("uint8", "int8")
"""The quantized types the runtime reads and writes (oneDNN's u8 / s8)."""


def constant_operand(expr: relax.Expr) -> np.ndarray | None:
    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    if isinstance(expr, tvm.ir.Constant):
        return expr.data.numpy()
    return None


def qparams_reason(call: relax.Call, quantized: str, data: relax.Expr) -> str | None:
    """Why the scale / zero point of a Q/DQ call cannot run exactly; None if they can."""
    op = "quantize" if call.op.name == "relax.quantize" else "dequantize"
    scale, zero_point = constant_operand(call.args[1]), constant_operand(call.args[2])
    if scale is None or zero_point is None:
        return f"{op} with a scale or zero point computed at run time; the runtime needs constants"
    if scale.dtype != np.float32:
        return f"{op} scale of dtype {scale.dtype}; the runtime takes float32 scales"
    if scale.ndim > 1 or zero_point.ndim > 1:
        return f"{op} with blocked scales {list(scale.shape)}; the runtime takes per-tensor or per-axis scales"
    if zero_point.dtype != np.dtype(quantized):
        return f"{op} zero point of dtype {zero_point.dtype} for {quantized} data"
    if zero_point.size != scale.size:
        return f"{op} with {scale.size} scales and {zero_point.size} zero points"
    shape = shape_of(data)
    if scale.size > 1:
        axis = int(call.attrs.axis)
        if shape is None or not -len(shape) <= axis < len(shape) or shape[axis] != scale.size:
            return f"{op} with {scale.size} scales along axis {axis} of {list(shape or [])}"
    return None


def check_quantize(match: Match) -> str | None:
    """float32 data -> uint8 / int8 with constant per-tensor or per-axis scale and zero point."""
    call = match.expr("root")
    out = str(call.attrs.out_dtype)
    if out not in QUANTIZED_DTYPES:
        return f"quantize to {out}; the runtime quantizes to {' or '.join(QUANTIZED_DTYPES)} only"
    return tensor_reason(call.args[0], "quantize data", symbolic=True) or qparams_reason(call, out, call.args[0])


def check_dequantize(match: Match) -> str | None:
    """uint8 / int8 data (int32: a bias) -> float32 with constant scale and zero point."""
    call = match.expr("root")
    data = call.args[0]
    dtype = tensor_dtype(data)
    if dtype not in (*QUANTIZED_DTYPES, "int32"):
        return f"dequantize of {dtype}; the runtime dequantizes {', '.join(QUANTIZED_DTYPES)} and int32 only"
    if str(call.attrs.out_dtype) != "float32":
        return f"dequantize to {call.attrs.out_dtype}; the runtime dequantizes to float32 only"
    if shape_of(data) is None:
        return f"dequantize data of the shape {data.ty}, which the runtime cannot evaluate"
    return qparams_reason(call, dtype, data)


@pattern_rules
def _rules():
    for op, check in (("quantize", check_quantize), ("dequantize", check_dequantize)):
        data = wildcard()
        call = is_op(f"relax.{op}")(data, wildcard(), wildcard())
        yield PatternSpec(op, call, {"data": data, "root": call}, check, priority=10)


@lowers("relax.quantize", "relax.dequantize")
def lower_qdq(ctx, var: relax.Var, call: relax.Call) -> int:
    op = call.op.name.removeprefix("relax.")
    inputs = [ctx.data_of(call.args[0]), ctx.lookup(call.args[1]), ctx.lookup(call.args[2])]
    return ctx.emit(op, inputs, var, {"axis": int(call.attrs.axis)})


# -- region-graph pass: int8 anchors ----------------------------------------------------------------
def _qparams(graph, node) -> tuple[np.ndarray, np.ndarray, int] | None:
    """(scales, zero points, axis) of a quantize / dequantize node whose scale and zero point are
    constants with known values; None otherwise."""
    scale = graph.small_constants.get(node.inputs[1])
    zero = graph.small_constants.get(node.inputs[2])
    if scale is None or zero is None:
        return None
    return scale.reshape(-1).astype(np.float32), zero.reshape(-1).astype(np.int64), int(node.attrs["axis"])


def per_tensor_qparams(graph, node, op: str) -> tuple[float, int] | None:
    """(scale, zero point) of ``node`` when it is an ``op`` node with one scale; else None."""
    if node is None or node.op != op:
        return None
    q = _qparams(graph, node)
    if q is None or q[0].size != 1:
        return None
    return float(q[0][0]), int(q[1][0])


def weight_scale_values(graph, node, out_channels: int, axis: int) -> list[float] | None:
    """The per-output-channel scales of a dequantize of a constant int8 weight with zero points 0
    along ``axis`` (or one scale for all); None when it is not one (it then stays a float32 weight
    dequantized once at load: exact, just not int8)."""
    if node is None or node.op != "dequantize" or graph.tensors[node.inputs[0]]["dtype"] != "int8":
        return None
    if not any(c["tensor"] == node.inputs[0] for c in graph.constants):
        return None
    q = _qparams(graph, node)
    if q is None or np.any(q[1] != 0):
        return None  # oneDNN 3.2 has no weight zero points for int8 conv / matmul
    scales, _, w_axis = q
    rank = len(graph.tensors[node.inputs[0]]["shape"])
    if scales.size == 1:
        return [float(scales[0])] * out_channels
    if scales.size != out_channels or w_axis % rank != axis:
        return None
    return [float(s) for s in scales]


def sole_reader(graph, t: int, readers: dict[int, int]):
    """The one node reading tensor ``t`` when exactly one node reads it and it is no region output."""
    if readers.get(t, 0) != 1 or t in graph.outputs:
        return None
    return next(n for n in graph.nodes if t in n.inputs)


def _fuse_anchor(graph, node, producers, readers) -> bool:
    """Make one conv2d / dense int8 (see :func:`fuse_int8_anchors`); whether it did."""
    if node.attrs.get("residual") or node.attrs.get("has_gate") or "src_scale" in node.attrs:
        return False  # (an int8 dense takes no gate: fold_gate_products leaves the ones that may become int8)
    if len(graph.tensors[node.inputs[0]]["shape"]) == 5:  # 3-D convolutions run in float32 only
        return False
    source = producers.get(node.inputs[0])
    src = per_tensor_qparams(graph, source, "dequantize")
    if src is None or graph.tensors[source.inputs[0]]["dtype"] not in QUANTIZED_DTYPES:
        return False
    if not int8_kernels_exact():  # without VNNI oneDNN's int8 saturates: float32 between the Q/DQ
        return False
    wshape = graph.tensors[node.inputs[1]]["shape"]
    if node.op == "conv2d":
        out_channels, axis = wshape[0], 0
    else:
        nk = node.attrs["weight_layout"] == "NK"
        out_channels, axis = (wshape[0], 0) if nk else (wshape[1], 1)
    wnode = producers.get(node.inputs[1])
    scales = weight_scale_values(graph, wnode, out_channels, axis)
    if scales is None:
        return False
    node.inputs[0], node.inputs[1] = source.inputs[0], wnode.inputs[0]
    node.attrs.update(src_scale=src[0], src_zero_point=src[1], weight_scales=scales)
    after = sole_reader(graph, node.output, readers)
    dst = per_tensor_qparams(graph, after, "quantize")
    if dst is not None:
        node.attrs.update(dst_scale=dst[0], dst_zero_point=dst[1])
        node.output = after.output
        graph.nodes.remove(after)
        if node.op == "conv2d":
            _fuse_residual(graph, node, dst)
        else:
            _fuse_bias_add(graph, node, dst, out_channels)
    return True


def _bias_operand(graph, add, dq_output: int, n: int) -> int | None:
    """The other operand of ``add`` when it is a float32 bias of ``n`` values along the last axis."""
    if add is None or add.op != "binary" or add.attrs.get("algorithm") != "add" or len(add.inputs) != 2 or \
            add.attrs.get("activation", "none") != "none" or add.inputs.count(dq_output) != 1:
        return None
    other = add.inputs[1] if add.inputs[0] == dq_output else add.inputs[0]
    info = graph.tensors[other]
    shape = [int(d) for d in info["shape"]]
    if info.get("dtype", "float32") != "float32" or not shape or shape[-1] != n or int(np.prod(shape)) != n:
        return None
    return other


def _fuse_bias_add(graph, node, dst: tuple[float, int], n: int) -> None:
    """``int8 dense -> dequantize -> add(bias [N]) -> quantize`` (how ``quantize_static`` writes a
    MatMul + Add: the MatMul's output quantized on its own) becomes the dense's bias, and the dense
    writes the add's quantized output: one step instead of three (the bias adds were 19% of a
    2-layer int8 ViT call), and the MatMul's own output is not rounded before the bias is added
    (within one step of the float emulation, as the fused residual of a conv)."""
    readers = graph.readers()
    if len(node.inputs) != 2 or node.attrs.get("has_bias"):
        return
    dq = sole_reader(graph, node.output, readers)
    if per_tensor_qparams(graph, dq, "dequantize") != dst:
        return
    add = sole_reader(graph, dq.output, readers)
    bias = _bias_operand(graph, add, dq.output, n)
    after = sole_reader(graph, add.output, readers) if bias is not None else None
    out = per_tensor_qparams(graph, after, "quantize")
    if out is None or graph.tensors[after.output]["dtype"] not in QUANTIZED_DTYPES:
        return
    node.inputs.append(bias)
    node.attrs.update(has_bias=1, dst_scale=out[0], dst_zero_point=out[1])
    node.output = after.output
    for dead in (dq, add, after):
        graph.nodes.remove(dead)


def _fuse_residual(graph, node, dst: tuple[float, int]) -> None:
    """``int8 conv -> dequantize -> add(dequantize(r)) [-> relu] -> quantize``: the add becomes the
    conv's sum post-op on ``r``'s 8-bit values (``sum_scale``, ``sum_zero_point``) and the conv writes
    the add's quantized output: the residual stream of a quantized ResNet stays 8-bit, and the conv's
    own output is rounded once instead of twice (within one step of the float emulation)."""
    producers, readers = graph.producers(), graph.readers()
    dq = sole_reader(graph, node.output, readers)
    if per_tensor_qparams(graph, dq, "dequantize") != dst:
        return
    add = sole_reader(graph, dq.output, readers)
    if add is None or add.op != "binary" or add.attrs.get("algorithm") != "add" or \
            add.attrs.get("activation", "none") not in ("none", "relu") or len(add.inputs) != 2:
        return
    other = add.inputs[1] if add.inputs[0] == dq.output else add.inputs[0]
    source = producers.get(other)
    res = per_tensor_qparams(graph, source, "dequantize")
    after = sole_reader(graph, add.output, readers)
    out = per_tensor_qparams(graph, after, "quantize")
    out_dtype = graph.tensors[node.output]["dtype"]
    if res is None or out is None or graph.tensors[source.inputs[0]]["dtype"] != out_dtype or \
            graph.tensors[after.output]["dtype"] != out_dtype or \
            graph.tensors[source.inputs[0]]["shape"] != graph.tensors[node.output]["shape"]:
        return
    node.inputs.append(source.inputs[0])
    node.attrs.update(residual=1, sum_scale=res[0], sum_zero_point=res[1], dst_scale=out[0], dst_zero_point=out[1])
    if add.attrs.get("activation", "none") != "none":
        node.attrs["post_activation"] = add.attrs["activation"]
    node.output = after.output
    for dead in (dq, add, after):
        graph.nodes.remove(dead)


def _fuse_pool(graph, node, producers, readers) -> bool:
    """A max / average pool2d between a dequantize and a quantize of one scale and zero point
    pools the 8-bit values (max pooling commutes with the monotone quantization; an average is
    rounded once, as the quantize would)."""
    source = producers.get(node.inputs[0])
    src = per_tensor_qparams(graph, source, "dequantize")
    after = sole_reader(graph, node.output, readers)
    dst = per_tensor_qparams(graph, after, "quantize")
    if src is None or dst is None or src != dst:
        return False
    if graph.tensors[source.inputs[0]]["dtype"] != graph.tensors[after.output]["dtype"]:
        return False
    node.inputs[0] = source.inputs[0]
    node.output = after.output
    graph.nodes.remove(after)
    return True


def drop_dead_nodes(graph) -> None:
    """Remove nodes whose output nothing reads (dequantizes an int8 anchor no longer reads)."""
    while True:
        readers = graph.readers()
        dead = [n for n in graph.nodes if readers.get(n.output, 0) == 0]
        if not dead:
            return
        for n in dead:
            graph.nodes.remove(n)


@graph_pass
def fuse_int8_anchors(graph) -> None:
    """``dequantize(x u8/s8) -> conv2d | dense (weight dequantize(int8 constant, zero points 0)) [->
    quantize]`` becomes one int8 node (attrs ``src_scale``, ``src_zero_point``, ``weight_scales``
    and, with the quantize, ``dst_scale``, ``dst_zero_point``: docs/region-format.md), so the
    output is requantized straight into the next int8 op's input; ``dequantize -> pool2d ->
    quantize`` of one scale pools the 8-bit values. Why: a QDQ model's convolutions otherwise run
    in float32 between host Q/DQ steps, slower than its float32 original."""
    changed = False
    for node in list(graph.nodes):
        producers, readers = graph.producers(), graph.readers()
        if node.op in ("conv2d", "dense"):
            changed |= _fuse_anchor(graph, node, producers, readers)
        elif node.op == "pool2d":
            changed |= _fuse_pool(graph, node, producers, readers)
    if changed:
        drop_dead_nodes(graph)
        restore_order(graph)


def restore_order(graph) -> None:
    """Put the nodes back in a topological order, keeping the existing one where it is one: a
    conv that took a residual computed after it (ResNet's downsampling branch) moves after it."""
    producers = graph.producers()
    done: set[int] = set()
    ordered = []

    def place(node) -> None:
        if id(node) in done:
            return
        done.add(id(node))
        for t in node.inputs:
            if t in producers:
                place(producers[t])
        ordered.append(node)

    for node in list(graph.nodes):
        place(node)
    graph.nodes[:] = ordered


# -- region-graph pass: quantize -> dequantize round trips ------------------------------------------
def _same_qparams(a, b) -> bool:
    """Whether two (scales, zero points, axis) describe the same quantization."""
    if a is None or b is None or a[0].size != b[0].size:
        return False
    same_axis = a[0].size == 1 or a[2] == b[2]
    return same_axis and bool(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))


def _round_trip_readers(graph, node, readers: dict[int, int]) -> list | None:
    """The dequantize nodes reading a quantize node's output when every reader is a dequantize of
    the same scale and zero point and only the first may be a region output; else None."""
    if node.output in graph.outputs or len(node.inputs) != 3:
        return None
    q = _qparams(graph, node)
    dqs = [n for n in graph.nodes if node.output in n.inputs]
    if q is None or not dqs or len(dqs) != readers.get(node.output, 0):
        return None
    if any(n.op != "dequantize" or len(n.inputs) != 3 or not _same_qparams(q, _qparams(graph, n)) for n in dqs):
        return None
    if any(n.output in graph.outputs for n in dqs[1:]):
        return None
    return dqs


@graph_pass
def fuse_quantize_dequantize(graph) -> None:
    """``quantize(x) -> dequantize`` of one scale and zero point, where nothing else reads the 8-bit
    values, becomes one ``quantize_dequantize`` node (float32 in and out, the same bits in one pass
    over the data: cpp/kernels/quantize.cc). Why: what the int8 anchors leave of a QDQ transformer
    (softmax, layer norms, GELU, bias adds, reshapes) runs float32 between such pairs: 2 host steps
    and an 8-bit buffer per pair, 130 steps a call in a 2-layer BERT; on a loaded machine each
    OpenMP step may wait a time slice at its barrier (docs/int8.md, bench/INT8.md). Runs after
    :func:`fuse_int8_anchors`, which takes the quantizes an int8 anchor reads."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "quantize":
            continue
        dqs = _round_trip_readers(graph, node, graph.readers())
        if dqs is None:
            continue
        first, merged = dqs[0], {n.output for n in dqs[1:]}
        for other in graph.nodes:
            other.inputs[:] = [first.output if t in merged else t for t in other.inputs]
        node.op, node.output = "quantize_dequantize", first.output
        for dq in dqs:
            graph.nodes.remove(dq)
        changed = True
    changed |= _drop_repeated_round_trips(graph)
    if changed:
        restore_order(graph)


_MOVES = ("reshape", "permute")
"""Ops that only move values: a value on a quantization grid stays on it."""


def _drop_repeated_round_trips(graph) -> bool:
    """``quantize_dequantize | dequantize (s, z) -> reshapes / permutes -> quantize_dequantize(s, z)``
    with one scale: the second is the identity (its input is already (q - z) * s, and round((q - z) * s / s) = q - z
    exactly for |q - z| <= 255), so its readers read the moved values (``quantize_static`` writes
    such a pair around every Reshape / Transpose of an attention block)."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "quantize_dequantize" or node.output in graph.outputs:
            continue
        producers = graph.producers()
        move = producers.get(node.inputs[0])
        if move is None or move.op not in _MOVES:
            continue
        first = producers.get(move.inputs[0])
        while first is not None and first.op in _MOVES:  # reshape -> permute -> ...
            first = producers.get(first.inputs[0])
        if first is None or first.op not in ("quantize_dequantize", "dequantize") or len(first.inputs) != 3:
            continue
        mine, theirs = _qparams(graph, node), _qparams(graph, first)
        same_type = graph.tensors[node.inputs[2]]["dtype"] == graph.tensors[first.inputs[2]]["dtype"]
        if mine is None or mine[0].size != 1 or not same_type or not _same_qparams(mine, theirs):
            continue
        for other in graph.nodes:
            other.inputs[:] = [move.output if t == node.output else t for t in other.inputs]
        graph.nodes.remove(node)
        changed = True
    return changed
