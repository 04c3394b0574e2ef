"""Scaled dot-product attention as one ``attention`` node (a pass over the lowered region graph,
:func:`fuse_attention`).

Rewrites ``matmul(Q, K) [scale, mask] -> softmax(last axis) -> matmul(P, V)`` (the reshapes between
them adding or dropping leading 1s only, each value read by the next step only) into one node
``attention(q, k, v[, mask])`` that reads Q, K and V through the views the matmuls had (the
permutes of the torch and dynamo ONNX paths, already folded into ``a_shape`` / ``b_shape`` strides
by ``fold_views``), with the first matmul's ``scale`` and mask (its mask post-op, a scores-shaped
residual, or one binary add between it and the softmax: per-head masks that stayed binary nodes) and
the softmax's ``safe`` mode (torch's safe softmax, the dynamo exporter's isnan guard). A scalar
multiply of Q or K before the product (Whisper's query scaling) joins the ``scale`` too. Grouped-query
attention as Llama's exporters write it (5-D matmuls over [1, kv heads, group, S, D] with K / V
broadcast over the group, the scores reshaped to [1, heads, S, S] for the mask add and the softmax
and back) matches as well: those reshapes keep the rows and their order. Its kernel (cpp/kernels/attention.cc)
computes a block of query rows at a time, so the [heads, S, S] scores never reach memory.

Why: Whisper-tiny's encoder (S = 1500) wrote 54 MB of scores per layer, read by the softmax, its
special-row scan and the second matmul again; a per-step profile had the attention matmuls at 29%
of the call and the softmax at 18%. Fused, those memory passes go (bench/ZOO.md, "session 4,
attention").

When it stays unfused (the old matmul -> softmax -> matmul path): bf16 regions or nodes (the
unfused path rounds Q, K, V and the probabilities to bf16, this kernel computes f32); symbolic
shapes (the views are static strides); a first matmul with a bias or an activation; a second one with anything but a plain P; and rows of at most :data:`MIN_KEYS` keys (tiny scores,
differences within the noise: see MIN_KEYS).
"""

from __future__ import annotations

import os

import numpy as np

from ....errors import RuleError
from ..lowering import Node, RegionGraph
from ..table import graph_pass
from .attention import absorb_operand_scalar, in_anchor_frame, reshaped_operand
from .layout import drop_dead_nodes, strided_view

MIN_KEYS = 64
"""Fuse only when a score row has more keys than this. Measured side by side (interleaved A/B of the
same model built with BYOC_HETERO_ATTENTION=off and fused, medians of 5; 2-vCPU Sapphire Rapids,
heavily loaded; bench/ZOO.md, "session 4, attention"): fused/unfused whole-model latency 0.66 and
0.80 (two runs) for GPT-2 (S = 128, causal), 0.99 for BERT-base (S = 128), 0.94 for ViT-B/16
(S = 197), 0.72 for the Whisper-tiny encoder (S = 1500); one attention block alone 0.46-0.79 from
S = 512 up, 0.86-0.92 at S = 128. Fused was never the slower side. Below 64 keys the calls are
sub-millisecond and the differences within the noise (one block: 0.82-0.94 at S = 16-50), the
[heads, S, S] scores are a few KiB per head either way, and the unfused path (matmul scale / mask
post-ops) stays what earlier sessions measured quietly and the small test graphs pin."""


ENV = "BYOC_HETERO_ATTENTION"
"""Environment knob, read each time the pass runs: ``auto`` (the default: fused above
:data:`MIN_KEYS` keys), ``fused`` (wherever the pattern allows, whatever the size: how the tests
and the differential fuzzer reach the kernel with small shapes) or ``off`` (never)."""


def _min_keys() -> int | None:
    """Fewest keys a fused score row has (exclusive), or None when the pass is switched off."""
    mode = os.environ.get(ENV, "auto")
    if mode not in ("auto", "fused", "off"):
        raise RuleError(f"{ENV} must be auto, fused or off, got {mode!r}")
    return {"auto": MIN_KEYS, "fused": 0, "off": None}[mode]


def _strip(shape: list) -> list:
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return list(shape[i:])


def _plain_strides(shape: list) -> list[int]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.insert(0, step)
        step *= d
    return strides


def _align(shape: list, strides: list, rank: int) -> tuple[list, list] | None:
    """A view as ``rank`` dims: leading 1s dropped or added (their stride is never used)."""
    shape, strides = list(shape), list(strides)
    while len(shape) > rank:
        if shape[0] != 1:
            return None
        shape, strides = shape[1:], strides[1:]
    pad = rank - len(shape)
    return [1] * pad + shape, [1] * pad + strides


def _operand_view(graph: RegionGraph, node: Node, k: int, key: str, rank: int,
                  transpose: bool) -> tuple[list, list] | None:
    """Input ``k`` of a matmul as the view it reads (``key``: "a" or "b"), aligned to ``rank``,
    the last two dims swapped when ``transpose``; None for a symbolic or axes view."""
    attrs = node.attrs
    if f"{key}_axes" in attrs:
        return None
    if f"{key}_shape" in attrs:
        shape, strides = attrs[f"{key}_shape"], attrs[f"{key}_strides"]
    else:
        shape = graph.tensors[node.inputs[k]]["shape"]
        strides = _plain_strides(shape) if all(isinstance(d, int) for d in shape) else None
    if strides is None or not all(isinstance(d, int) for d in shape):
        return None
    view = _align(shape, strides, rank)
    if view is None or len(view[0]) < 2:
        return None
    if transpose:
        view[0][-2:], view[1][-2:] = view[0][-2:][::-1], view[1][-2:][::-1]
    return view


def _reader_through(graph: RegionGraph, t: int) -> tuple[Node, list[Node]] | None:
    """The one node reading tensor ``t`` past reshapes, and those reshapes; None when a value on
    the way has another reader or is a region output."""
    count = graph.readers()
    chain: list[Node] = []
    while count.get(t, 0) == 1 and t not in graph.outputs:
        reader = next(n for n in graph.nodes if t in n.inputs)
        if reader.op != "reshape":
            return reader, chain
        chain.append(reader)
        t = reader.output
    return None


def _plain_anchor(node: Node, residual: bool = False) -> bool:
    """A float matmul without bias, activation (or, unless ``residual``, a residual sum)."""
    a = node.attrs
    return node.op == "matmul" and not a.get("has_bias") and (residual or not a.get("residual")) \
        and a.get("activation", "none") == "none" and a.get("post_activation", "none") == "none" \
        and a.get("precision", "f32") == "f32" and "src_scale" not in a


def _float32(graph: RegionGraph, *tensors: int) -> bool:
    return all(graph.tensors[t]["dtype"] == "float32" for t in tensors)


def _views(graph: RegionGraph, scores: Node, mix: Node, rank: int) -> dict | None:
    """The attention node's q / k / v view attrs, or None."""
    q = _operand_view(graph, scores, 0, "a", rank, False)
    k = _operand_view(graph, scores, 1, "b", rank, not scores.attrs.get("transpose_b"))
    v = _operand_view(graph, mix, 1, "b", rank, bool(mix.attrs.get("transpose_b")))
    if q is None or k is None or v is None:
        return None
    return {"q_shape": q[0], "q_strides": q[1], "k_shape": k[0], "k_strides": k[1],
            "v_shape": v[0], "v_strides": v[1]}


def _scores_source(graph: RegionGraph, softmax: Node) -> tuple[Node, list[Node], tuple[int, list] | None] | None:
    """(the Q K^T matmul, the nodes between it and ``softmax`` that the fused node replaces, the
    additive mask as (tensor, its shape in the matmul output's frame) or None) for the scores this
    softmax reads; None when they are not a plain matmul's (+ its mask post-op, or + one binary
    add of a value broadcasting to them). Changes nothing."""
    count = graph.readers()
    found = graph.producer_through(softmax.inputs[0])
    if found is None or count.get(softmax.inputs[0], 0) != 1 or softmax.inputs[0] in graph.outputs:
        return None
    node, chain = found
    if node.op == "matmul" and _plain_anchor(node, residual=True) and count.get(node.output, 0) == 1:
        # a mask of the scores' own shape arrives as the matmul's residual (fuse_matmul_epilogues):
        # added after the scale as the mask post-op is
        mask = node.inputs[2] if node.attrs.get("has_mask") or node.attrs.get("residual") else None
        return node, chain, (mask, list(graph.tensors[mask]["shape"])) if mask is not None else None
    if node.op != "binary" or node.attrs.get("algorithm") != "add" \
            or node.attrs.get("activation", "none") != "none" or count.get(node.output, 0) != 1:
        return None
    for k in (0, 1):
        scores_t, other = node.inputs[k], node.inputs[1 - k]
        inner = graph.producer_through(scores_t)
        if scores_t == other or inner is None or count.get(scores_t, 0) != 1 or scores_t in graph.outputs:
            continue
        scores, reshapes = inner
        shape = list(graph.tensors[scores_t]["shape"])
        if scores.op != "matmul" or not _plain_anchor(scores) or scores.attrs.get("has_mask") \
                or count.get(scores.output, 0) != 1 or shape != list(graph.tensors[node.output]["shape"]):
            continue
        frame = _mask_frame(list(graph.tensors[other]["shape"]), shape,
                            list(graph.tensors[scores.output]["shape"]))
        if frame is not None and all(isinstance(d, int) for d in frame):
            return scores, [*reshapes, node, *chain], (other, frame)
    return None


def _same_rows(shape: list, frame: list) -> bool:
    """``shape`` is ``frame`` (static, leading 1s stripped) up to a reshape of the dims before
    the last two: GQA's [kv heads, group, S, keys] scores read as [heads, S, keys] around the
    softmax (a no-copy reshape of a row-major tensor, the same rows in the same order)."""
    shape = _strip(list(shape))
    return shape[-2:] == frame[-2:] and len(shape) >= 2 \
        and int(np.prod(shape[:-2], dtype=np.int64)) == int(np.prod(frame[:-2], dtype=np.int64))


def _mask_frame(shape: list, chain: list, out: list) -> list | None:
    """A mask of ``shape`` added to the scores as ``chain`` (a reshape of the matmul's ``out``),
    as the shape broadcasting the same way to ``out``; None when there is none. Besides
    :func:`in_anchor_frame`'s leading-1 reshapes, ``chain`` may merge ``out``'s head dims (GQA's
    5-D product read as [1, heads, S, keys]): a mask shared by every head or one per merged head."""
    frame = in_anchor_frame(shape, chain, out)
    if frame is not None or len(shape) > len(chain) or len(chain) < 2 or len(out) < 2 \
            or not all(isinstance(d, int) for d in [*shape, *chain, *out]) or not _same_rows(chain, _strip(out)):
        return frame
    aligned = [1] * (len(chain) - len(shape)) + list(shape)
    rows = [d if d == c else 1 for d, c in zip(aligned[-2:], chain[-2:])]
    if any(d not in (1, c) for d, c in zip(aligned[-2:], chain[-2:])):
        return None
    if all(d == 1 for d in aligned[:-2]):
        return [1] * (len(out) - 2) + rows
    if aligned[:-2] == list(chain[:-2]):
        return list(out[:-2]) + rows
    return None


def _mask_shape(shape: list, rank: int) -> list | None:
    """A mask's shape as at most ``rank`` dims (dropping leading 1s), or None."""
    extra = len(shape) - rank
    if not all(isinstance(d, int) for d in shape) or any(d != 1 for d in shape[:max(extra, 0)]):
        return None
    return shape[max(extra, 0):]


def _fuse_one(graph: RegionGraph, softmax: Node, min_keys: int) -> bool:
    """Replace the matmul -> ``softmax`` -> matmul around this softmax by one attention node."""
    after = _reader_through(graph, softmax.output)
    out = list(graph.tensors[after[0].output]["shape"]) if after else []
    data = list(graph.tensors[softmax.inputs[0]]["shape"])
    if after is None or not all(isinstance(d, int) for d in out + data) or len(out) < 2 or not data \
            or data[-1] <= min_keys or int(softmax.attrs.get("axis", -1)) % len(data) != len(data) - 1:
        return False
    mix, between = after
    if not _plain_anchor(mix) or mix.inputs[0] == mix.inputs[1] \
            or mix.inputs[0] != (between[-1].output if between else softmax.output) \
            or mix.attrs.get("has_mask") or mix.attrs.get("scale", 1.0) != 1.0 \
            or any(k in mix.attrs for k in ("a_shape", "a_axes")):
        return False
    source = _scores_source(graph, softmax)
    views = _views(graph, source[0], mix, len(out)) if source else None
    if views is None:
        return False
    scores, before, mask = source
    frame = _strip(out[:-2] + [views["q_shape"][-2], views["k_shape"][-2]])
    same = [graph.tensors[t]["shape"] for t in (scores.output, softmax.inputs[0], mix.inputs[0])]
    inputs = [scores.inputs[0], scores.inputs[1], mix.inputs[1], *([mask[0]] if mask is not None else [])]
    mask_shape = _mask_shape(mask[1], len(out)) if mask is not None else None
    if not all(_same_rows(s, frame) for s in same) or not _float32(graph, *inputs, mix.output) \
            or (mask is not None and mask_shape is None):
        return False
    attrs = {**views, "scale": float(scores.attrs.get("scale", 1.0)), "safe": int(softmax.attrs.get("safe", 0))}
    if mask is not None:
        inputs[3] = reshaped_operand(graph, mask[0], mask_shape, mix)
        attrs["has_mask"] = 1
    fused = Node("attention", inputs, mix.output, attrs)
    graph.nodes[graph.nodes.index(mix)] = fused
    for n in [scores, *before, softmax, *between]:
        graph.nodes.remove(n)
    for k, key, transpose in ((0, "q", False), (1, "k", not scores.attrs.get("transpose_b"))):
        plain = ("a", "b")[k] + "_shape" not in scores.attrs
        if _absorb_scalar(graph, fused, k) and plain:
            _read_through_permute(graph, fused, k, key, transpose)
    return True


def _read_through_permute(graph: RegionGraph, fused: Node, k: int, key: str, transpose: bool) -> None:
    """Input ``k`` (read plainly) a permute (through reshapes) of a base tensor: the attention
    reads the base through strides and the permute goes, as ``fold_views`` does for matmul
    operands. The scalar absorbed by :func:`_absorb_scalar` stood between them when that pass ran:
    Llama's K^T scaled after the transpose (torch's sdpa decomposition) kept a [kv heads, D, S]
    copy per layer."""
    t = fused.inputs[k]
    if graph.readers().get(t, 0) != 1 or t in graph.outputs:
        return
    view = strided_view(graph, graph.producers(), t)
    rank = len(fused.attrs[f"{key}_shape"])
    aligned = _align(graph.tensors[t]["shape"], view[1], rank) if view is not None else None
    if aligned is None:
        return
    if transpose:
        aligned[0][-2:], aligned[1][-2:] = aligned[0][-2:][::-1], aligned[1][-2:][::-1]
    if aligned[0] != fused.attrs[f"{key}_shape"]:
        return
    fused.attrs[f"{key}_strides"] = aligned[1]
    fused.inputs[k] = view[0]
    drop_dead_nodes(graph)


def _absorb_scalar(graph: RegionGraph, fused: Node, k: int) -> bool:
    """Q (``k`` 0) or K (1) computed as ``x * c`` or ``x / c`` (a one-element constant, through
    reshapes, read by nothing else): the attention reads x and multiplies its ``scale`` by c.
    Whisper scales Q by d^-0.5 after its projection, the dynamo exporter both Q and K by d^-0.25:
    a pass over [S, d] each, and (q c) k^T equals c (q k^T) within rounding."""
    return absorb_operand_scalar(graph, fused, k)


@graph_pass
def fuse_attention(graph: RegionGraph) -> None:
    """matmul (+scale, +mask) -> softmax -> matmul becomes one ``attention`` node (module doc)."""
    min_keys = _min_keys()
    if min_keys is None or graph.precision != "f32":
        return  # bf16 attention stays on the matmuls that round their operands as bf16 does
    for node in list(graph.nodes):
        if node.op == "softmax" and node in graph.nodes:
            _fuse_one(graph, node, min_keys)
