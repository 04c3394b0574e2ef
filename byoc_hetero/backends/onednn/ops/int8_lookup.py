"""Element-wise chains from one 8-bit tensor to another as a 256-entry lookup table (node ``lookup``).

``dequantize(x) -> (eltwise | multiply of the chain by itself | quantize -> dequantize)* ->
quantize``, where every value comes from the one 8-bit tensor ``x``, is a function of one byte:
the pass :func:`fuse_int8_lookup_tables` evaluates it once for the 256 possible inputs (float32
numpy, each quantize rounding half to even and saturating as ONNX says) and replaces the chain by
one ``lookup`` node (cpp/kernels/lookup.cc) reading and writing the 8-bit values. Unlike a post-op
(:mod:`.int8_activation`) nothing is skipped: every intermediate rounding and saturation is in the
table, so the result is the float emulation's, up to the last bit of the transcendental functions
(a value on a rounding tie may land one step apart). ONNX Runtime runs QDQ sigmoid and leaky relu
this way (QLinearSigmoid, QLinearLeakyRelu).

Why: EfficientNet-B0's SiLU is ``x * sigmoid(x)`` with the sigmoid requantized to a range
calibrated on small values (its quantize saturates at 0.5-0.7 in the file of bench/INT8.md), which
no oneDNN post-op computes; it ran as dequantize, sigmoid, quantize and multiply steps.
"""

from __future__ import annotations

import math

import numpy as np

from ..table import graph_pass
from .int8_activation import NoChain, closed_under, chain_expr
from .qdq import QUANTIZED_DTYPES, per_tensor_qparams, restore_order, drop_dead_nodes

F32 = np.float32
_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(v):
    return F32(1) / (F32(1) + np.exp(-v))


FUNCTIONS = {
    "relu": lambda v, c: np.maximum(v, F32(0)),
    "sigmoid": lambda v, c: _sigmoid(v),
    "tanh": lambda v, c: np.tanh(v),
    "silu": lambda v, c: v * _sigmoid(v),
    "hardswish": lambda v, c: v * np.clip(v * F32(1 / 6) + F32(0.5), F32(0), F32(1)),
    "hardsigmoid": lambda v, c: np.clip(v * F32(1 / 6) + F32(0.5), F32(0), F32(1)),
    "clip": lambda v, c: np.clip(v, F32(c[0]), F32(c[1])),
    "gelu_erf": lambda v, c: (F32(0.5) * v * (1 + _ERF(v / math.sqrt(2)))).astype(F32),
    "exp": lambda v, c: np.exp(v),
    "abs": lambda v, c: np.abs(v),
    "square": lambda v, c: v * v,
}
"""numpy (float32) for the eltwise algorithms a table may hold, with oneDNN's alpha / beta
(cpp/enums.cc); a chain with any other eltwise is left alone."""


def _quantize(v, scale: float, zero: int, dtype: str):
    info = np.iinfo(dtype)
    with np.errstate(invalid="ignore"):
        q = np.round(np.nan_to_num(v / F32(scale), nan=0.0)) + zero
    return np.clip(q, info.min, info.max)


def _evaluate(expr: tuple, x):
    """The chain's float32 values for the dequantized inputs ``x``."""
    kind = expr[0]
    if kind == "x":
        return x
    if kind == "act":
        if expr[1] not in FUNCTIONS:
            raise NoChain
        with np.errstate(over="ignore", invalid="ignore"):
            return FUNCTIONS[expr[1]](_evaluate(expr[3], x), expr[2]).astype(F32)
    if kind == "mul":
        return (_evaluate(expr[1], x) * _evaluate(expr[2], x)).astype(F32)
    _, scale, zero, dtype, inner = expr  # a round trip
    return ((_quantize(_evaluate(inner, x), scale, zero, dtype) - zero) * F32(scale)).astype(F32)


def _has_compute(expr: tuple) -> bool:
    return expr[0] in ("act", "mul") or (expr[0] == "qdq" and _has_compute(expr[4]))


def _table(graph, q, producers, through: bool):
    """(the 8-bit source, the table, the chain's nodes but the source's dequantizes) of the chain
    ending in quantize ``q``; ``through``: walk into round trips of the source (a SiLU's gate) rather
    than taking their 8-bit values as the source. Raises :class:`NoChain`."""
    out = per_tensor_qparams(graph, q, "quantize")
    sources: set = set()

    def leaf(dq):
        if graph.tensors[dq.inputs[0]]["dtype"] not in QUANTIZED_DTYPES:
            return None
        rq = producers.get(dq.inputs[0])
        if through and per_tensor_qparams(graph, rq, "quantize") == per_tensor_qparams(graph, dq, "dequantize") and \
                getattr(producers.get(rq.inputs[0]), "op", None) in ("eltwise", "binary"):
            return None  # a round trip of a value the chain computes (a SiLU's gate): in the table too
        sources.add((dq.inputs[0], per_tensor_qparams(graph, dq, "dequantize")))
        return ("x",)

    visited: list = []
    expr = chain_expr(graph, q.inputs[0], producers, visited, leaf, lambda _: True)
    if len(sources) != 1 or not _has_compute(expr):
        raise NoChain
    (source, (scale, zero)), = sources
    info = np.iinfo(graph.tensors[source]["dtype"])
    x = ((np.arange(info.min, info.max + 1) - zero) * F32(scale)).astype(F32)
    table = _quantize(_evaluate(expr, x), out[0], out[1], graph.tensors[q.output]["dtype"])
    inner = list({id(n): n for n in visited if not (n.op == "dequantize" and n.inputs[0] == source)}.values())
    return source, table, inner


def _fuse(graph, q, producers) -> bool:
    """Make the chain ending in quantize ``q`` one lookup node; whether it did."""
    if per_tensor_qparams(graph, q, "quantize") is None or graph.tensors[q.output]["dtype"] not in QUANTIZED_DTYPES:
        return False
    for through in (True, False):
        try:
            source, table, inner = _table(graph, q, producers, through)
        except NoChain:
            continue
        if closed_under(graph, inner, q):
            for node in inner:
                graph.nodes.remove(node)
            q.op, q.inputs, q.attrs = "lookup", [source], {"table": [int(v) for v in table]}
            return True
    return False


@graph_pass
def fuse_int8_lookup_tables(graph) -> None:
    """An element-wise chain from one per-tensor 8-bit tensor to a per-tensor quantize (eltwise ops,
    multiplies of the chain by itself, round trips) becomes one ``lookup`` node holding the 256
    results. Why: the chains no post-op can take (EfficientNet-B0's SiLU with a saturating gate,
    an activation after a pool or an add) ran as three or more host and oneDNN steps over float32
    copies. Runs after :func:`fuse_int8_activations` (a post-op costs no pass over the data) and
    before :func:`fuse_int8_binaries`."""
    changed = False
    for q in reversed([n for n in graph.nodes if n.op == "quantize"]):  # the longest chain first: a
        if q in graph.nodes:  # SiLU's gate quantize is inside the chain of the multiply after it
            changed |= _fuse(graph, q, graph.producers())
    if changed:
        drop_dead_nodes(graph)
        restore_order(graph)
