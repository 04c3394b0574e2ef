"""Rotary position embedding ``x * cos + rotate_half(x) * sin`` as one ``rope`` node.

transformers writes RoPE (Llama, Mistral, Qwen, Phi-3, ...) as ``x * cos + rotate_half(x) * sin``
with ``rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2])``; both import paths lower it to
eight region steps per query and key tensor: the head permute ``[B, S, H, D] -> [B, H, S, D]``, the
cos product, two slices of the last axis, a negate, a concat, the sin product and the add (480
steps per call of the SmolLM-135M decoder, 2 threads' fork / join each; bench/LLM.md session 5),
where OpenVINO runs one RoPE node. The runtime's ``rope`` (``cpp/kernels/rope.cc``) computes
``y[..., j] = x[..., j] * cos[..., j] + (-x[..., j + D/2]) * sin[..., j]`` for ``j < D/2`` and
``x[..., j] * cos[..., j] + x[..., j - D/2] * sin[..., j]`` after, reading ``x`` once, and ``cos`` /
``sin`` broadcast (numpy rules) over the leading axes (the heads).

What: an ``add`` of two ``mul`` nodes, one ``x * cos`` and one ``concat(-hi, lo) * sin`` where
``hi`` / ``lo`` slice ``x``'s last axis at ``D/2`` / ``0`` to ``D/2`` elements (the concat on the
last axis, the negate an ``eltwise negative``); either operand order of each ``mul`` and of the
``add``. Every intermediate has that one reader and is no region output. When ``x`` is a
``permute`` that keeps the last axis last and is read by the rotation only, the node reads the
permute's input in place (attr ``axes``, the permute's) and the permute goes too. A multiply of
the result by a one-element constant, directly or after reshapes / permutes (sdpa's split scale
of q and of kᵀ), becomes the node's attr ``scale`` (a scalar product commutes with views).

Kept as separate steps, with the reason :func:`rope_match` returns: dtypes other than float32, an
odd or symbolic ``D``, slices not at ``D/2``, ``cos`` / ``sin`` of different shapes or not
broadcasting to ``x`` without growing it, an intermediate read elsewhere. The pass records each
such reason on the region graph (:meth:`RegionGraph.decline`); ``bh.report`` lists them under the
region and among its rejections (rule ``onednn:fuse_rotary_embeddings``, op ``rope``), as it lists
the pattern rules' rejections.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..lowering import Node, RegionGraph
from ..table import graph_pass


NOT_A_ROTATION = ("not an add without activation", "the add's operands are not both products",
                  "no rotate_half: no concat")
""":func:`rope_match` reasons that mean an add of no rotation at all (no product reads a concat of two
tensors): not reported. Every other reason declines a rotation and ``bh.report`` lists it."""


@dataclass
class RopeMatch:
    """The nodes of one ``x * cos + rotate_half(x) * sin`` and its operands."""

    x: int
    cos: int
    sin: int
    nodes: list[Node]  # add, both muls, concat, negate, both slices


def _binary(node: Node | None, algorithm: str) -> bool:
    return (node is not None and node.op == "binary" and node.attrs.get("algorithm") == algorithm
            and node.attrs.get("activation", "none") == "none" and len(node.inputs) == 2)


def _broadcasts_to(shape: list, target: list) -> bool:
    """numpy broadcasting of ``shape`` to ``target`` that does not grow ``target``."""
    return len(shape) <= len(target) and all(a in (1, b) for a, b in zip(reversed(shape), reversed(target)))


def _rotate_half_source(graph: RegionGraph, rot: int) -> int | str:
    """The tensor ``x`` whose ``concat(-x[..., D/2:], x[..., :D/2])`` is ``rot``, or why not."""
    producers = graph.producers()
    concat = producers.get(rot)
    if concat is None or concat.op != "concat" or len(concat.inputs) != 2:
        return "no concat of two tensors before the sin product"
    neg, lo = producers.get(concat.inputs[0]), producers.get(concat.inputs[1])
    if neg is None or neg.op != "eltwise" or neg.attrs.get("algorithm") != "negative":
        return "the concat's first part is no negate"
    hi = producers.get(neg.inputs[0])
    if hi is None or lo is None or hi.op != "slice" or lo.op != "slice" or hi.inputs[0] != lo.inputs[0]:
        return "the rotated halves are no slices of one tensor"
    x = hi.inputs[0]
    shape = graph.tensors[x]["shape"]
    rank, d = len(shape), shape[-1]
    if not isinstance(d, int) or d % 2:
        return f"the last axis {d} is not an even static size"
    if concat.attrs.get("axis") not in (rank - 1, -1):
        return f"the concat is over axis {concat.attrs.get('axis')}, not the last"
    half = list(shape[:-1]) + [d // 2]
    for node, start in ((hi, d // 2), (lo, 0)):
        begin = node.attrs.get("begin")
        if (begin != [0] * (rank - 1) + [start] or graph.tensors[node.output]["shape"] != half
                or set(node.attrs) - {"begin"}):
            return f"a slice is not x[..., {start}:{start + d // 2}] (begin {begin})"
    return x


def _single_readers(graph: RegionGraph, tensors: list[int]) -> bool:
    count = graph.readers()
    return all(count.get(t, 0) == 1 and t not in graph.outputs for t in tensors)


def rope_match(graph: RegionGraph, add: Node) -> RopeMatch | str:
    """The rotary embedding ending in ``add``, or the reason it stays separate steps."""
    producers = graph.producers()
    if not _binary(add, "add"):
        return "not an add without activation"
    muls = [producers.get(t) for t in add.inputs]
    if not all(_binary(m, "mul") for m in muls):
        return "the add's operands are not both products"
    reasons = []
    for rot_mul, x_mul in (muls, muls[::-1]):
        for k in (0, 1):
            x = _rotate_half_source(graph, rot_mul.inputs[k])
            if isinstance(x, int):
                break
            reasons.append(x)
        if isinstance(x, int):
            break
    if not isinstance(x, int):  # the reason of an operand that is a concat, if one is
        return "no rotate_half: " + min(reasons, key=lambda r: r.startswith("no concat"))
    rot, sin = rot_mul.inputs[k], rot_mul.inputs[1 - k]
    if x not in x_mul.inputs:
        return "the other product does not read the rotated tensor"
    cos = x_mul.inputs[1 - x_mul.inputs.index(x)]
    if x in (cos, sin):
        return "x is also the cos or sin operand"
    tensors = graph.tensors
    shape = tensors[x]["shape"]
    if any(tensors[t]["dtype"] != "float32" for t in (x, cos, sin)):
        return "not float32: " + ", ".join(tensors[t]["dtype"] for t in (x, cos, sin))
    if tensors[cos]["shape"] != tensors[sin]["shape"] or not _broadcasts_to(tensors[cos]["shape"], shape):
        return f"cos {tensors[cos]['shape']} / sin {tensors[sin]['shape']} do not broadcast to x {shape}"
    if tensors[cos]["shape"][-1] != shape[-1] or any(not isinstance(v, int) for v in shape):
        return f"cos / sin do not span the last axis of a static x {shape}"
    if tensors[add.output]["shape"] != shape:
        return f"the sum {tensors[add.output]['shape']} is not x's shape {shape}"
    concat = producers[rot]
    neg, lo = producers[concat.inputs[0]], producers[concat.inputs[1]]
    hi = producers[neg.inputs[0]]
    if not _single_readers(graph, [m.output for m in muls] + [rot, neg.output, hi.output, lo.output]):
        return "an intermediate of the rotation is read elsewhere"
    return RopeMatch(x, cos, sin, [add, *muls, concat, neg, hi, lo])


def _absorb_permute(graph: RegionGraph, match: RopeMatch) -> tuple[int, list[int] | None, Node | None]:
    """(source tensor, axes, the permute to drop) when x is a permute read by the rotation only."""
    permute = graph.producers().get(match.x)
    if permute is None or permute.op != "permute" or match.x in graph.outputs:
        return match.x, None, None
    axes = list(permute.attrs.get("axes", []))
    readers = [n for n in graph.nodes for t in n.inputs if t == match.x]
    if len(axes) < 2 or axes[-1] != len(axes) - 1 or any(all(n is not m for m in match.nodes) for n in readers):
        return match.x, None, None
    return permute.inputs[0], axes, permute


def _absorb_scale(graph: RegionGraph, rope: Node) -> None:
    """A multiply by a one-element constant after ``rope``, through reshapes / permutes (torch's
    sdpa scales q and k by sqrt(1 / sqrt(D)) each, k after its transpose), as its attr ``scale``."""
    count = graph.readers()
    t, node = rope.output, None
    while count.get(t, 0) == 1 and t not in graph.outputs:
        node = next(n for n in graph.nodes if t in n.inputs)
        if node.op not in ("reshape", "permute"):
            break
        t = node.output
    if node is None or not _binary(node, "mul") or "scale" in rope.attrs:
        return
    other = node.inputs[1] if node.inputs[0] == t else node.inputs[0]
    if (other == t or other not in graph.scalar_values
            or graph.tensors[node.output]["shape"] != graph.tensors[t]["shape"]):
        return
    rope.attrs["scale"] = graph.scalar_values[other]
    graph.nodes[:] = [n for n in graph.nodes if n is not node]
    graph.replace_tensor(node.output, t)


@graph_pass
def fuse_rotary_embeddings(graph: RegionGraph) -> None:
    """``x * cos + rotate_half(x) * sin`` (and a head permute before it) as one ``rope`` node
    (see the module doc)."""
    for add in [n for n in graph.nodes if n.op == "binary"]:
        match = rope_match(graph, add)
        if isinstance(match, str):
            if not match.startswith(NOT_A_ROTATION):
                graph.decline("fuse_rotary_embeddings", "rope", add.output, match)
            continue
        src, axes, permute = _absorb_permute(graph, match)
        dropped = match.nodes + ([permute] if permute is not None else [])
        rope = Node("rope", [src, match.cos, match.sin], add.output, {"axes": axes} if axes else {})
        index = graph.nodes.index(add)
        graph.nodes[index] = rope
        graph.nodes[:] = [n for n in graph.nodes if not any(n is d for d in dropped)]
        _absorb_scale(graph, rope)
