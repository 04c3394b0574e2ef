"""Region-graph pass :func:`fuse_elementwise_chains`: element-wise float32 ops and the per-tensor
(de)quantizations between them as one ``elementwise_chain`` node (cpp/kernels/elementwise_chain.cc).

Why: ``quantize_static`` puts a QuantizeLinear -> DequantizeLinear pair after every op it can
quantize, so what a QDQ transformer computes in float32 between its int8 dense layers — GELU's
Div, Erf, Add, Mul, Mul and the residual adds — is, after :func:`.qdq.fuse_quantize_dequantize`, a
run of one-op nodes, each one pass over the activations: 11 passes per GELU of a [128, 3072]
tensor, about a third of a 2-layer int8 BERT-base call at 1 thread (bench/INT8.md, session 3). The
fused node runs the same ops in the same order, the roundings included, block by block while the
block is in cache: the same bits as the nodes it replaces.

A chain is a set of such nodes of one output shape whose intermediate values only the chain reads
(so it has one exit, the last node, and no path leaves it and comes back). Its inputs are tensors
of that shape (float32, or 8-bit read by a dequantize of the chain); a binary operand of one
element that is a known constant becomes an immediate, and one that repeats whole over the chain's
shape (an attention mask [1, 1, S, S] over the scores [1, H, S, S]) is read modulo its size.
Other broadcasts end a chain: they stay separate nodes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..table import graph_pass
from .qdq import QUANTIZED_DTYPES, per_tensor_qparams, restore_order, drop_dead_nodes

QDQ_MEMBERS = ("dequantize", "quantize_dequantize", "quantize")
"""Chain members that make a chain a quantized model's: a chain of float32 ops alone (a float model's
GELU, a broadcast add) is left to the oneDNN binary / eltwise kernels and their post-op fusions,
which the float32 benchmarks were measured with. Measured (session 9, loaded 2-core Skylake-SP,
interleaved calls): ConvNeXt-V2's GRN tail ``gamma * (x * Nx) + beta + x`` over ``[1, 56, 56, 96]``
with ``[1, 1, 1, C]`` operands took 2-4x the time as one chain as it did as four oneDNN binaries
(6.1 against 1.5 ms and 11.2 against 5.6 ms in two runs; 2x at 28x28x192 and 14x14x384, bench/ZOO.md
"session 9"): the chain's per-block copies of the operands read modulo their size cost more than
the passes it saves, so float32-only chains stay unjoined."""

BINARY_OPS = ("add", "sub", "mul", "div")
"""The binary algorithms a chain computes (the ``binary`` node's ``algorithm``)."""

UNARY_OPS = ("erf",)
"""The ``unary`` node algorithms a chain computes."""


def scalar_constants(graph) -> dict[int, float]:
    """tensor id -> value, for the one-element float32 values known when the graph is built:
    constants, the dequantize of a one-element 8-bit constant (how ``quantize_static`` writes an
    initializer such as GELU's 1 and 0.5) and the quantize -> dequantize round trip of a one-element
    float32 constant (how it writes a Constant node's value), computed as the kernels do."""
    values = {t: float(v) for t, v in graph.scalar_values.items()}
    for t, v in graph.small_constants.items():
        if v.size == 1 and str(v.dtype) == "float32":
            values[t] = float(v.reshape(-1)[0])
    for node in graph.nodes:  # in graph order: a round trip of a dequantized constant folds too
        data = values.get(node.inputs[0]) if node.inputs else None
        if node.inputs and node.inputs[0] in graph.small_constants:
            data = graph.small_constants[node.inputs[0]]
        if data is None or np.size(data) != 1:
            continue
        data = np.asarray(data).reshape(-1)[0]
        q = per_tensor_qparams(graph, node, node.op) if node.op in ("dequantize", "quantize_dequantize") else None
        if q is None:
            continue
        if node.op == "dequantize" and str(graph.tensors[node.inputs[0]]["dtype"]) in QUANTIZED_DTYPES:
            values[node.output] = float(np.float32(int(data) - q[1]) * np.float32(q[0]))
        elif node.op == "quantize_dequantize":  # ONNX's formulas in float32, as quantize.cc computes them
            info = np.iinfo(graph.tensors[node.inputs[2]]["dtype"])
            level = np.clip(np.rint(np.float32(data) / np.float32(q[0])) + q[1], info.min, info.max)
            values[node.output] = float(np.float32(level - q[1]) * np.float32(q[0]))
    return values


def _shape(graph, t: int) -> list:
    return list(graph.tensors[t]["shape"])


def repeats_over(operand: list, shape: list) -> bool:
    """Whether a tensor of shape ``operand`` broadcasts over ``shape`` by repeating whole: its dims
    are ``shape``'s trailing dims after leading 1s (an attention mask [1, 1, S, S] over the scores
    [1, H, S, S]), so element i of the result reads its element i mod its size."""
    if not operand or len(operand) > len(shape) or not all(isinstance(d, int) for d in operand + shape):
        return False
    k = 0
    while k < len(operand) and operand[k] == 1:  # leading 1s broadcast: drop them
        k += 1
    rest = operand[k:]
    return rest == shape[len(shape) - len(rest):]


def _member(graph, node, shape: list, scalars: dict[int, float]) -> bool:
    """Whether ``node`` computes one element-wise step a chain of output shape ``shape`` can hold."""
    if _shape(graph, node.output) != shape:
        return False
    if node.op in ("dequantize", "quantize_dequantize", "quantize"):
        q = per_tensor_qparams(graph, node, node.op)
        data = graph.tensors[node.inputs[0]]["dtype"]
        want = QUANTIZED_DTYPES if node.op == "dequantize" else ("float32",)
        return q is not None and len(node.inputs) == 3 and data in want and _shape(graph, node.inputs[0]) == shape
    if graph.tensors[node.output]["dtype"] != "float32":
        return False
    if node.op == "unary":
        return node.attrs.get("algorithm") in UNARY_OPS and set(node.attrs) == {"algorithm"}
    if node.op == "binary":
        if node.attrs.get("algorithm") not in BINARY_OPS or set(node.attrs) - {"algorithm", "activation"} or \
                node.attrs.get("activation", "none") != "none" or len(node.inputs) != 2:
            return False
        return all(_shape(graph, t) == shape or t in scalars or
                   (repeats_over(_shape(graph, t), shape) and graph.tensors[t]["dtype"] == "float32")
                   for t in node.inputs)
    return False


def _data_inputs(node) -> list[int]:
    """The inputs of a member that carry data (not a Q/DQ's scale and zero point)."""
    return node.inputs[:1] if node.op in ("dequantize", "quantize_dequantize", "quantize", "unary") else node.inputs


def _grow(graph, last, assigned: set[int], scalars: dict[int, float]) -> list:
    """The chain ending at ``last``: its members, in graph order."""
    shape = _shape(graph, last.output)
    producers, readers = graph.producers(), graph.readers()
    group = {id(last): last}
    changed = True
    while changed:
        changed = False
        for member in list(group.values()):
            for t in _data_inputs(member):
                p = producers.get(t)
                if p is None or id(p) in group or id(p) in assigned or p.op == "quantize" or \
                        t in graph.outputs or not _member(graph, p, shape, scalars):
                    continue
                inside = sum(n.inputs.count(t) for n in group.values())
                if inside == readers.get(t, 0):  # only the chain reads it
                    group[id(p)] = p
                    changed = True
    return [n for n in graph.nodes if id(n) in group]


def _program(graph, members: list, scalars: dict[int, float]) -> tuple[list[int], dict[str, Any]]:
    """The chain node's inputs and attrs (the instruction list elementwise_chain.cc reads)."""
    inputs: list[int] = []
    ops, lhs, rhs, scales, zeros = [], [], [], [], []
    value_of: dict[int, int] = {}  # tensor id -> instruction index holding its float32 value

    def emit(op: str, a: int = -1, b: int = -1, scale: float = 0.0, zero: int = 0) -> int:
        ops.append(op), lhs.append(a), rhs.append(b), scales.append(scale), zeros.append(zero)
        return len(ops) - 1

    def operand(t: int) -> int:
        if t not in value_of:
            if t in scalars and _shape(graph, t) != _shape(graph, members[-1].output):
                value_of[t] = emit("const", scale=scalars[t])
            else:
                inputs.append(t)
                value_of[t] = emit("load", len(inputs) - 1)
        return value_of[t]

    out_attrs: dict[str, Any] = {}
    for node in members:
        if node.op == "dequantize":
            s, z = per_tensor_qparams(graph, node, "dequantize")
            if node.inputs[0] not in inputs:
                inputs.append(node.inputs[0])
            value_of[node.output] = emit("dequantize", inputs.index(node.inputs[0]), scale=s, zero=z)
        elif node.op == "quantize_dequantize":
            s, z = per_tensor_qparams(graph, node, "quantize_dequantize")
            kind = "u8" if graph.tensors[node.inputs[2]]["dtype"] == "uint8" else "s8"
            value_of[node.output] = emit(f"requantize_{kind}", operand(node.inputs[0]), scale=s, zero=z)
        elif node.op == "quantize":  # the last member only (_grow never takes one as a producer)
            s, z = per_tensor_qparams(graph, node, "quantize")
            operand(node.inputs[0])
            out_attrs = {"out_scale": s, "out_zero_point": z}
        elif node.op == "unary":
            value_of[node.output] = emit(node.attrs["algorithm"], operand(node.inputs[0]))
        else:
            value_of[node.output] = emit(node.attrs["algorithm"], operand(node.inputs[0]), operand(node.inputs[1]))
    attrs = {"ops": ",".join(ops), "lhs": lhs, "rhs": rhs, "scales": scales, "zero_points": zeros, **out_attrs}
    return inputs, attrs


@graph_pass
def fuse_elementwise_chains(graph) -> None:
    """Join each chain of two or more element-wise nodes (``dequantize``, ``quantize_dequantize``,
    a last ``quantize``, ``binary`` add / sub / mul / div of same-shape, one-element constant or
    whole-repeating (:func:`repeats_over`) operands, ``unary`` erf) into one ``elementwise_chain`` node computing the same bits in one
    pass over the data (see the module docstring). Runs after :func:`.qdq.fuse_int8_anchors` and
    :func:`.qdq.fuse_quantize_dequantize`, which take the Q/DQ nodes they can make int8 first. Only
    chains with a Q/DQ member (:data:`QDQ_MEMBERS`) are joined."""
    assigned: set[int] = set()
    chains = []
    scalars = scalar_constants(graph)
    for node in reversed(list(graph.nodes)):
        if id(node) in assigned or not _member(graph, node, _shape(graph, node.output), scalars):
            continue
        members = _grow(graph, node, assigned, scalars)
        assigned.update(id(n) for n in members)
        quantized = any(n.op in QDQ_MEMBERS for n in members)  # float32-only chains keep oneDNN's kernels
        if len(members) >= 2 and quantized and any(n.op not in ("dequantize", "quantize") for n in members):
            chains.append(members)
    for members in chains:
        inputs, attrs = _program(graph, members, scalars)
        last = members[-1]
        for dead in members[:-1]:
            graph.nodes.remove(dead)
        last.op, last.inputs, last.attrs = "elementwise_chain", inputs, attrs
    if chains:
        drop_dead_nodes(graph)  # the dequantizes of scalar constants the chains now hold as immediates
        restore_order(graph)
