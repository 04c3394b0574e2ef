"""A per-feature constant scale on the *input* of dense layers, folded into their weights.

RMSNorm as transformers writes it ends with ``weight * (x * rsqrt(mean(x²) + eps))``: a multiply by
a constant holding one value per feature, whose only readers are the dense layers after the norm
(Llama's Q / K / V projections, its gate / up projections). In the region that multiply is one
full pass over the activations (``[S, hidden]``) per norm, 60 of them in a call of the SmolLM-135M
decoder. A dense reading the scaled value computes ``(x·c)·W = x·(diag(c)·W)``, so the scale goes
into each reader's weight instead (row k of W, the input feature k, times ``c[k]``), as nodes on
constants that run once at ``__init_``, and the multiply node is gone.

:func:`..layout.fold_channel_scales` is the mirror image (a scale on a dense's output).
"""

from __future__ import annotations

from collections.abc import Iterator

from ..lowering import Node, RegionGraph
from ..table import graph_pass

_PLAIN_DENSE_ATTRS = frozenset({"weight_layout", "has_bias", "activation", "residual", "post_activation"})
"""The attrs of a float32 dense; one with any other (int8 scales, a precision) is left alone."""


def constant_multiplies(graph: RegionGraph) -> Iterator[tuple[Node, int, int]]:
    """(node, its constant operand, its other operand) for each multiply node (no post-op) of a
    constant and a non-constant tensor, over a snapshot of the nodes (a caller may edit them)."""
    constants = {c["tensor"] for c in graph.constants}
    for node in list(graph.nodes):
        if node.op != "binary" or node.attrs.get("algorithm") != "mul" or node.attrs.get("activation", "none") != "none":
            continue
        for k in (0, 1):
            if node.inputs[k] in constants and node.inputs[1 - k] not in constants:
                yield node, node.inputs[k], node.inputs[1 - k]


def _per_last_axis(shape: list, n: int) -> bool:
    return len(shape) >= 1 and shape[-1] == n and all(d == 1 for d in shape[:-1])


def _dense_readers(graph: RegionGraph, t: int, n: int) -> list[tuple[Node, list[Node]]] | None:
    """Every reader of tensor ``t``, as (dense, the reshapes between): each a float32 dense over
    ``n`` input features with a constant weight that reads ``t`` (through reshapes keeping the last
    axis, read by nothing else) as its data only; None when any reader is something else."""
    constants = {c["tensor"] for c in graph.constants}
    outputs = set(graph.outputs)
    found: list[tuple[Node, list[Node]]] = []
    stack: list[tuple[int, list[Node]]] = [(t, [])]
    while stack:
        tensor, chain = stack.pop()
        if tensor in outputs:
            return None
        for node in (m for m in graph.nodes if tensor in m.inputs):
            if node.op == "reshape" and graph.tensors[node.output]["shape"][-1:] == [n]:
                stack.append((node.output, chain + [node]))
                continue
            weight = node.inputs[1] if node.op == "dense" and len(node.inputs) > 1 else None
            if (weight is None or node.inputs[0] != tensor or node.inputs.count(tensor) != 1
                    or weight not in constants or graph.tensors[weight]["dtype"] != "float32"
                    or not set(node.attrs) <= _PLAIN_DENSE_ATTRS):
                return None
            found.append((node, chain))
    return found


@graph_pass
def fold_dense_input_scales(graph: RegionGraph) -> None:
    """``dense(c * x)`` for a constant ``c`` of one value per input feature, where every reader of
    the product is such a dense (through reshapes): ``c`` goes into each dense's weight and the
    denses read ``x`` (see the module doc)."""
    dead: set[int] = set()
    for node, scale, value in constant_multiplies(graph):
        shape = graph.tensors[value]["shape"]
        n = shape[-1] if shape else None
        if (not isinstance(n, int) or not _per_last_axis(graph.tensors[scale]["shape"], n)
                or graph.tensors[node.output]["shape"] != shape or graph.tensors[value]["dtype"] != "float32"):
            continue
        readers = _dense_readers(graph, node.output, n)
        if not readers:
            continue
        for dense, chain in readers:
            _scale_weight(graph, dense, scale, n)
            (chain[0] if chain else dense).inputs[0] = value
        dead.add(id(node))
    if dead:
        graph.nodes[:] = [m for m in graph.nodes if id(m) not in dead]


def _scale_weight(graph: RegionGraph, dense: Node, scale: int, n: int) -> None:
    """Give ``dense`` the weight ``W * c`` along its input-feature axis, computed by two new nodes
    on constants placed before it."""
    weight = dense.inputs[1]
    nk = dense.attrs.get("weight_layout") == "NK"  # NK: W is [N, K]; KN: [K, N]
    graph.tensors.append({"shape": [1, n] if nk else [n, 1], "dtype": "float32"})
    view = len(graph.tensors) - 1
    graph.tensors.append({"shape": list(graph.tensors[weight]["shape"]), "dtype": "float32"})
    scaled = len(graph.tensors) - 1
    index = next(i for i, m in enumerate(graph.nodes) if m is dense)
    graph.nodes[index:index] = [Node("reshape", [scale], view, {}),
                                Node("binary", [weight, view], scaled, {"algorithm": "mul", "activation": "none"})]
    dense.inputs[1] = scaled
