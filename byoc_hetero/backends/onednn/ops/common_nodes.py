"""Nodes of a region graph that compute the same thing twice, computed once.

torch.export writes each layer's attention as it traced it, so what a decoder computes once per
call appears once per layer: the float causal mask ``where(mask, 0, -inf)`` of the SmolLM-135M
decoder is 30 identical ``where`` nodes (same input, same constants, same attrs), each a host pass
over ``[S, S]``; the ONNX exporter folds it into one. Region nodes are pure functions of their
inputs, so a node with the op, inputs and attrs of an earlier one is that node's output.

The pass runs last (after the passes that give each reader its own copy on purpose, such as
``fuse_dynamic_int8_sources``, and after the per-site decisions of ``apply_conv_algorithms`` /
``apply_node_precisions``, which are attrs here and so keep differing sites apart).
"""

from __future__ import annotations

import json
from collections.abc import Collection

from ..lowering import RegionGraph
from ..table import graph_pass


def merge_equal_nodes(graph: RegionGraph, ops: Collection[str] | None = None) -> bool:
    """Drop every node (of ``ops``; all ops when None) with the op, inputs (a constant counted by
    its content digest), attrs and output tensor of an earlier node; its readers read the earlier
    node's output. A node writing a region output stays. Returns whether anything was dropped."""
    digests = {c["tensor"]: (c["digest"], json.dumps(graph.tensors[c["tensor"]], sort_keys=True, default=str))
               for c in graph.constants if c.get("digest")}
    outputs = set(graph.outputs)
    same: dict[int, int] = {}
    seen: dict[tuple, int] = {}
    kept = []
    for node in graph.nodes:  # in graph order: a shared producer makes its readers equal too
        node.inputs = [same.get(t, t) for t in node.inputs]
        if ops is not None and node.op not in ops:
            kept.append(node)
            continue
        key = (node.op, tuple(digests.get(t, t) for t in node.inputs),
               json.dumps(node.attrs, sort_keys=True, default=str),
               json.dumps(graph.tensors[node.output], sort_keys=True, default=str))
        first = seen.get(key)
        if first is not None and node.output not in outputs:
            same[node.output] = first
            continue
        seen.setdefault(key, node.output)
        kept.append(node)
    if same:
        graph.nodes[:] = kept
    return bool(same)


@graph_pass
def merge_common_nodes(graph: RegionGraph) -> None:
    """Every node equal to an earlier one (see :func:`merge_equal_nodes`) is dropped."""
    merge_equal_nodes(graph)
