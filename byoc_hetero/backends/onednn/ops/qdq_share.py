"""Region-graph pass :func:`share_repeated_quantizations`: equal quantize / dequantize / reshape
nodes of one tensor computed once.

Why: ``quantize_static`` gives each reader of an activation its own QuantizeLinear. Where the
readers are the query, key and value dense layers of an attention block (ViT-B/16 after
``quant_pre_process``: ``layernorm -> Q/DQ -> reshape -> quantize`` three times, one per dense),
the region quantized the same [197, 768] tensor three times with one scale and zero point (once
:func:`.qdq_views.move_views_to_8bit` moved the reshapes, the three quantizes read the same
tensor; bench/INT8.md, session 4). Two nodes of one op with the same inputs and attrs compute the
same bytes: the later one's readers read the first one's output.
"""

from __future__ import annotations

import json

from ..table import graph_pass
from .qdq import drop_dead_nodes

SHARED_OPS = ("quantize", "dequantize", "quantize_dequantize", "reshape")
"""Ops whose equal nodes are shared: pure functions of their inputs and attrs that a QDQ model
repeats per reader."""


def _key(graph, node) -> tuple:
    out = graph.tensors[node.output]
    return (node.op, tuple(node.inputs), json.dumps(node.attrs, sort_keys=True), tuple(out["shape"]), out["dtype"])


@graph_pass
def share_repeated_quantizations(graph) -> None:
    """A :data:`SHARED_OPS` node with the same op, inputs, attrs and output shape and dtype as an
    earlier node is dropped and its readers read the earlier node's output (see the module
    docstring); region outputs keep their own node."""
    first: dict[tuple, int] = {}
    changed = False
    for node in list(graph.nodes):  # in graph order: a shared producer makes its readers equal too
        if node.op not in SHARED_OPS:
            continue
        key = _key(graph, node)
        if key in first and node.output not in graph.outputs:
            graph.replace_tensor(node.output, first[key])
            changed = True
        else:
            first.setdefault(key, node.output)
    if changed:
        drop_dead_nodes(graph)
