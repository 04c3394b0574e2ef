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

from ..table import graph_pass
from .common_nodes import merge_equal_nodes

SHARED_OPS = ("quantize", "dequantize", "quantize_dequantize", "reshape")
"""Ops whose equal nodes are shared here, before the int8 fusions read them: pure functions of their
inputs and attrs that a QDQ model repeats per reader (``merge_common_nodes``, last in the list,
shares every other op)."""


@graph_pass
def share_repeated_quantizations(graph) -> None:
    """A :data:`SHARED_OPS` node with the same op, inputs, attrs and output tensor as an earlier node
    is dropped and its readers read the earlier node's output (see the module docstring); region
    outputs keep their own node."""
    merge_equal_nodes(graph, SHARED_OPS)
