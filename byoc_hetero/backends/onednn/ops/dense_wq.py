"""dense_wq: a dense layer on weight-only quantized weights (int8 / int4 codes, block scales, optional
zero points or per-block offsets).

The pattern is the weight-only form :mod:`byoc_hetero.quant.weight_only` writes (and the ONNX
``MatMulNBits`` import will): the constant codes unpacked and dequantized in Relax, then
``matmul(x, permute_dims(W))`` with an optional constant bias; the dequantized blocks may add a float
offset per block (llama.cpp's Q4_1 / Q5_1 and K-quants: ``w = s * q + o``). The whole chain becomes one
``dense_wq`` node reading the codes, scales and zero points as they are (the runtime repacks them
once, at load, into the tiles its kernels stream: cpp/kernels/dense_wq.h). Rules ``dense_wq8``,
``dense_wq4`` and their ``_bias`` forms, above every dense rule (priority 200), so the matmul is never
taken alone with a float weight computed per call.

The same dequantized table read by ``take(table, indices, axis=0)`` (an embedding lookup on codes:
:func:`byoc_hetero.quant.weight_only.emit_weight_only_take`) becomes one ``take_wq`` node (rules
``take_wq8``, ``take_wq4``; cpp/kernels/take_wq.cc) that dequantizes only the rows the indices name,
reading the codes in place: a table tied to the LM head is one constant of codes for both nodes.

After the lowering, the region pass :func:`fold_gate_products` makes a gated linear unit's product with a
``dense_wq``'s output that node's ``gate`` input, and ``fold_residual_adds`` (ops/layout.py) an add of its
output its ``residual``: in an int8 / int4 decoder's MLP, ``down(silu(gate(x)) * up(x)) + h`` runs as the
three ``dense_wq`` nodes and the silu, not also a multiply and an add step.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op, is_tuple, wildcard

from ...._relax import constant_value, shape_of, static_shape, tensor_dtype
from ....rules import Match
from ..lowering import Node, RegionGraph
from ..precision import tensor_reason
from ..table import PatternSpec, graph_pass, lowers_composite, pattern_rules
from .gather import INDEX_DTYPES


def _dequantized(bits: int) -> tuple[DFPattern, dict[str, DFPattern]]:
    """codes → float [N, K] as quant/weight_only.py emits it; the parts by name."""
    codes = is_const()
    unpacked = is_op("relax.astype")(codes)
    if bits == 4:
        as_float = unpacked
        high = is_op("relax.floor")(is_op("relax.multiply")(as_float, is_const()))
        low = is_op("relax.subtract")(as_float, is_op("relax.multiply")(high, is_const()))
        # stacked (quant/weight_only.py), or concatenated after expand_dims (ONNX's Unsqueeze + Concat:
        # passes/matmul_nbits.py)
        unpacked = is_op("relax.stack")(is_tuple([low, high])) | is_op("relax.concat")(
            is_tuple([is_op("relax.expand_dims")(low), is_op("relax.expand_dims")(high)]))
    blocks = is_op("relax.reshape")(unpacked, wildcard())
    zero_points = is_const()
    # the partition folds the reshape of small integer constants (passes/fold_int_constants.py)
    zero = is_op("relax.astype")(is_op("relax.reshape")(zero_points, wildcard()) | zero_points) | is_const()
    scales = is_const()
    scale_view = is_op("relax.reshape")(scales, wildcard())
    scale = is_op("relax.astype")(scale_view) | scale_view
    scaled = is_op("relax.multiply")(is_op("relax.subtract")(blocks, zero), scale)
    offsets = is_const()  # llama.cpp's Q4_1 / Q5_1 / K-quants: + offset per block (the codes' zero 0)
    dequantized = is_op("relax.add")(scaled, is_op("relax.reshape")(offsets, wildcard()) | offsets) | scaled
    weight = is_op("relax.reshape")(dequantized, wildcard())
    return weight, {"codes": codes, "scales": scales, "zero_points": zero_points, "zero": zero, "blocks": blocks,
                    "offsets": offsets, "dequantized": dequantized}


@pattern_rules
def _rules():
    for bits in (8, 4):
        for with_bias in (True, False):
            weight, names = _dequantized(bits)
            data = wildcard()
            anchor = is_op("relax.matmul")(data, is_op("relax.permute_dims")(weight))
            root = anchor
            names.update(data=data, anchor=anchor)
            if with_bias:
                names["bias"] = bias = is_const()
                root = is_op("relax.add")(anchor, bias)
            names["root"] = root
            yield PatternSpec(f"dense_wq{bits}" + ("_bias" if with_bias else ""), root, names, check_dense_wq,
                              priority=200 + with_bias)


def check_dense_wq(match: Match) -> str | None:
    """The weight-only chain with the shapes and dtypes the runtime's dense_wq reads."""
    reason = tensor_reason(match.expr("data"), "data", symbolic=True, static_dims=(-1,))
    if reason:
        return reason
    data_shape, blocks = match.shape("data"), static_shape(match.expr("blocks"))
    if len(data_shape) < 2 or tensor_dtype(match.expr("data")) != "float32":
        return f"weight-only dense data must be float32 of rank >= 2, got {tensor_dtype(match.expr('data'))}{list(data_shape)}"
    if blocks is None or len(blocks) != 3:
        return "weight-only dense: the codes' block view is not [N, K / block, block]"
    n, nb, block = blocks
    if data_shape[-1] != nb * block:
        return f"weight-only dense: K {nb * block} of the weight does not match data {list(data_shape)}"
    reason = _codes_reason(match, "weight-only dense")
    if reason:
        return reason
    if match.has("bias"):
        bias = match.shape("bias")
        if bias is None or int(np.prod(bias)) != n or tensor_dtype(match.expr("bias")) != "float32":
            return f"weight-only dense: bias {tensor_dtype(match.expr('bias'))}{list(bias or [])} is not N = {n} floats"
    return None


def _codes_reason(match: Match, what: str) -> str | None:
    """Why the matched codes, scales, zero points and offsets are not what the runtime's weight-only
    kernels (dense_wq, take_wq) read, or None; ``what`` starts the reason."""
    blocks = static_shape(match.expr("blocks"))
    if blocks is None or len(blocks) != 3:
        return f"{what}: the codes' block view is not [N, K / block, block]"
    n, nb, block = blocks
    k = nb * block
    bits = 4 if tensor_dtype(match.expr("codes")) == "uint8" and static_shape(match.expr("codes"))[1] * 2 == k else 8
    codes_shape = static_shape(match.expr("codes"))
    if tuple(codes_shape) != (n, k * bits // 8):
        return f"{what}: codes of shape {list(codes_shape)} for a [{n}, {k}] weight"
    if block != k and (block < 16 or block & (block - 1)):
        return f"{what}: block {block} is neither K nor a power of two >= 16"
    if tensor_dtype(match.expr("scales")) not in ("float32", "float16"):
        return f"{what}: scales of dtype {tensor_dtype(match.expr('scales'))}"
    if static_shape(match.expr("scales")) not in ((n, nb),):
        return f"{what}: scales of shape {list(static_shape(match.expr('scales')) or [])}, expected [{n}, {nb}]"
    scales = constant_value(match.expr("scales"))
    if scales is not None and (~np.isfinite(scales) | (scales == 0)).any():
        return f"{what}: a scale is zero, NaN or infinite"
    offsets = _offsets(match)
    if offsets is not None:
        if tensor_dtype(offsets) != "float32" or tuple(static_shape(offsets) or ()) not in ((n, nb), (n, nb, 1)):
            return (f"{what}: offsets {tensor_dtype(offsets)}{list(static_shape(offsets) or [])}, expected "
                    f"float32 [{n}, {nb}]")
        value = constant_value(offsets)
        if value is not None and not np.isfinite(value).all():
            return f"{what}: an offset is NaN or infinite"
    if _zero_kind(match, bits, offsets is not None) is None:
        return f"{what}: the zero point is neither the codes' implicit one nor uint8 [N, K / block]"
    return None


def _offsets(match: Match) -> relax.Expr | None:
    """The constant of offsets added to the dequantized blocks, or None (no offset term)."""
    dequantized = match.value(match.expr("dequantized"))
    if not (isinstance(dequantized, relax.Call) and dequantized.op.name == "relax.add"):
        return None
    term = match.value(dequantized.args[1])
    return term if isinstance(term, tvm.ir.Constant) else match.value(term.args[0])


def _zero_kind(match: Match, bits: int, with_offsets: bool = False) -> str | None:
    """"explicit" (uint8 zero points of [N, blocks]), "implicit" (the constant the runtime assumes
    without zero points: 0 for int8 codes and for codes with offsets, 2^(bits-1) for other uint8 ones),
    or None."""
    zero = match.value(match.expr("zero"))
    codes_dtype = tensor_dtype(match.expr("codes"))
    if isinstance(zero, tvm.ir.Constant):
        value = constant_value(zero)
        implicit = 0.0 if codes_dtype == "int8" or with_offsets else float(1 << (bits - 1))
        return "implicit" if value.size == 1 and float(value.reshape(())) == implicit else None
    zp = match.expr("zero_points")
    if with_offsets or tensor_dtype(zp) != "uint8" or codes_dtype != "uint8":
        return None
    blocks = static_shape(match.expr("blocks"))
    return "explicit" if tuple(static_shape(zp) or ()) in ((blocks[0], blocks[1]), (blocks[0], blocks[1], 1)) else None


def _weight_operands(ctx, func: relax.Function, reader: relax.Call | None) -> tuple[list[int], dict[str, int]]:
    """(tensor ids of the codes, scales [, zero points] [, offsets], the attrs bits / block /
    has_zero_point / has_offset) of the weight-only chain in ``func``; ``reader``: the matmul whose
    bias adds are not the chain's offset add (None: a take, which has none)."""
    bindings = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    ops = [(v, c) for v, c in bindings.items() if isinstance(c, relax.Call) and isinstance(c.op, tvm.ir.Op)]

    def first(name: str) -> relax.Call:
        return next(c for _, c in ops if c.op.name == name)

    def through(expr: relax.Expr) -> relax.Expr:
        return bindings.get(expr, expr) if isinstance(expr, relax.Var) else expr

    codes = first("relax.astype").args[0]
    reshapes = [c for _, c in ops if c.op.name == "relax.reshape"]
    block = int(static_shape(reshapes[0])[2])  # the codes' [N, K / block, block] view comes first
    bits = 4 if any(c.op.name in ("relax.stack", "relax.concat") for _, c in ops) else 8
    sub = first("relax.subtract") if bits == 8 else [c for _, c in ops if c.op.name == "relax.subtract"][-1]
    zero = through(sub.args[1])
    mul = [c for _, c in ops if c.op.name == "relax.multiply"][-1]
    scale = through(mul.args[1])
    scales = through(scale.args[0]) if scale.op.name == "relax.astype" else scale
    inputs = [ctx.lookup(codes), ctx.lookup(scales.args[0])]
    has_zp = not isinstance(zero, tvm.ir.Constant)
    if has_zp:
        zp = through(zero.args[0])
        inputs.append(ctx.lookup(zp.args[0] if isinstance(zp, relax.Call) else zp))
    reader_var = next((v for v, c in ops if reader is not None and c.same_as(reader)), None)
    offsets = [c for _, c in ops if c.op.name == "relax.add" and not (reader_var is not None and
                                                                          c.args[0].same_as(reader_var))]
    if offsets:  # the dequantized blocks + offsets
        term = through(offsets[0].args[1])
        inputs.append(ctx.lookup(term.args[0] if isinstance(term, relax.Call) else term))
    return inputs, {"bits": bits, "block": block, "has_zero_point": int(has_zp), "has_offset": int(bool(offsets))}


@lowers_composite("dense_wq8", "dense_wq8_bias", "dense_wq4", "dense_wq4_bias")
def lower_dense_wq(ctx, func: relax.Function) -> int:
    """The whole weight-only chain as one ``dense_wq`` node."""
    bindings = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    ops = [(v, c) for v, c in bindings.items() if isinstance(c, relax.Call) and isinstance(c.op, tvm.ir.Op)]
    matmul_var, matmul = next((v, c) for v, c in ops if c.op.name == "relax.matmul")
    weight, attrs = _weight_operands(ctx, func, matmul)
    inputs = [ctx.data_of(matmul.args[0]), *weight]
    biases = [c for _, c in ops if c.op.name == "relax.add" and c.args[0].same_as(matmul_var)]
    if biases:
        inputs.append(ctx.lookup(biases[0].args[1]))
    return ctx.emit("dense_wq", inputs, func.body.body, {**attrs, "has_bias": int(bool(biases))})


# ---- take_wq: rows of a weight-only table (an embedding lookup on codes) ---------------------------


@pattern_rules
def _take_rules():
    for bits in (8, 4):
        weight, names = _dequantized(bits)
        ids = wildcard()
        root = is_op("relax.take")(weight, ids)
        names.update(indices=ids, root=root)
        yield PatternSpec(f"take_wq{bits}", root, names, check_take_wq, priority=200)


def check_take_wq(match: Match) -> str | None:
    """``take(dequantized table, indices, axis=0)`` of the weight-only form with the shapes and dtypes
    the runtime's take_wq reads (rows of the table dequantized per lookup, never the whole table)."""
    call, ids = match.expr("root"), match.expr("indices")
    if tensor_dtype(ids) not in INDEX_DTYPES:
        return f"weight-only take: indices of dtype {tensor_dtype(ids)}; the runtime takes {' or '.join(INDEX_DTYPES)}"
    if shape_of(ids) is None:
        return f"weight-only take: indices of shape {ids.ty}, which the runtime cannot evaluate"
    if call.attrs.axis is None or int(call.attrs.axis) != 0:
        return f"weight-only take along axis {call.attrs.axis}: the runtime takes rows (axis 0)"
    mode = str(getattr(call.attrs, "mode", "fast"))
    if mode != "fast":
        return f"weight-only take mode {mode!r}: the runtime checks indices instead (mode 'fast' only)"
    return _codes_reason(match, "weight-only take")


@lowers_composite("take_wq8", "take_wq4")
def lower_take_wq(ctx, func: relax.Function) -> int:
    """The table's dequantize and the take as one ``take_wq`` node on the codes as stored."""
    take = next(b.value for block in func.body.blocks for b in block.bindings
                if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.take")
    weight, attrs = _weight_operands(ctx, func, None)
    return ctx.emit("take_wq", [ctx.data_of(take.args[1]), *weight], func.body.body, attrs)


# ---- region pass: a GLU's product as the dense_wq's gate ------------------------------------------------


def _plain_product(node: Node) -> bool:
    """A ``binary mul`` of two tensors and nothing else (no activation, shift or addend)."""
    return (node.op == "binary" and node.attrs.get("algorithm") == "mul" and len(node.inputs) == 2
            and node.inputs[0] != node.inputs[1] and set(node.attrs) <= {"algorithm", "activation"}
            and node.attrs.get("activation", "none") == "none")


#: ops whose data or weight, made by one of these, may yet become an int8 dense (ops/qdq.py, ops/qdq_dynamic.py)
_INT8_SOURCES = ("dequantize", "dynamic_quantize_dequantize")


def _gated(graph: RegionGraph, node: Node, producers: dict) -> bool:
    """Whether ``node`` can take a gate input: a ``dense_wq``, or a float32 ``dense`` (no int8 attrs, its data
    and weight no dequantized values the int8 passes after this one would make it int8 from)."""
    if node.op == "dense_wq":
        return True
    if node.op != "dense" or "src_scale" in node.attrs or node.attrs.get("src_dynamic"):
        return False
    if graph.tensors[node.output].get("dtype", "float32") != "float32":
        return False
    return all(getattr(producers.get(t), "op", None) not in _INT8_SOURCES for t in node.inputs[:2])


@graph_pass
def fold_gate_products(graph: RegionGraph) -> None:
    """``mul(g, d(x))`` with ``d`` a ``dense_wq`` or a float32 ``dense``, its output read by that multiply only
    (and no region output), ``g`` float32 of the output's shape and computed before the dense, becomes the
    dense's ``gate`` input (``has_gate``): the kernel multiplies each output by ``g`` as it stores it (dense:
    oneDNN's binary multiply post-op, after its activation; the GEMV in its own loop), where the multiply was a
    step of its own reading and writing the whole tensor. That is a gated linear unit's product (SwiGLU's
    ``silu(x W_gate) * (x W_up)`` in every Llama / Qwen / Mistral MLP: one step a layer; at a 1024-token
    prefill of Qwen2.5-0.5B a pass over three [1024, 4864] float32 tensors). Runs before
    :func:`.layout.fold_residual_adds`, whose residual input comes after the gate."""
    for mul in [n for n in graph.nodes if _plain_product(n)]:
        producers, outputs = graph.producers(), set(graph.outputs)
        position = {id(n): i for i, n in enumerate(graph.nodes)}
        for k in (0, 1):
            value, gate = mul.inputs[k], mul.inputs[1 - k]
            dense, made_by = producers.get(value), producers.get(gate)
            shape = graph.tensors[value]["shape"]
            if (dense is None or not _gated(graph, dense, producers) or dense.attrs.get("has_gate")
                    or dense.attrs.get("residual") or graph.readers().get(value, 0) != 1 or value in outputs
                    or graph.tensors[gate]["shape"] != shape or graph.tensors[mul.output]["shape"] != shape
                    or graph.tensors[gate].get("dtype", "float32") != "float32"
                    or (made_by is not None and position[id(made_by)] > position[id(dense)])):
                continue
            dense.inputs.append(gate)
            dense.attrs["has_gate"] = 1
            dense.output = mul.output
            graph.nodes[:] = [m for m in graph.nodes if m is not mul]
            break
