"""Region-graph pass :func:`move_views_to_8bit`: a reshape or permute next to a per-tensor
(de)quantization moves to the 8-bit side of it.

Why: an int8 dense reads and writes 2-D ``[tokens, features]`` tensors while the element-wise work
of a QDQ transformer (GELU, the residual adds) runs on the model's 3-D ``[1, tokens, features]``
ones, so ``quantize_static``'s graph has ``dense -> dequantize -> reshape -> GELU ... -> reshape ->
quantize -> dense``. The reshape sits between the dequantize (quantize) and the element-wise chain,
so :func:`.qdq_chain.fuse_elementwise_chains` cannot take them in: each stayed a separate host pass
over a [128, 3072] float32 tensor (2-layer BERT-base, 1 thread; bench/INT8.md, session 4). Likewise
the attention's ``dequantize -> reshape -> permute -> matmul`` keeps the permute between the
dequantize and the matmul that :func:`.int8_matmul.fuse_int8_matmuls` makes int8, and permutes 4
bytes an element instead of 1. A per-tensor (de)quantization is element-wise and a reshape or
permute only moves elements, so ``view(dequantize(q)) == dequantize(view(q))`` and
``quantize(view(x)) == view(quantize(x))`` bit for bit. After the move the chain reads and writes
the 8-bit tensors itself and the matmul reads the 8-bit views.
"""

from __future__ import annotations

from ..table import graph_pass
from .qdq import QUANTIZED_DTYPES, per_tensor_qparams, restore_order, sole_reader

VIEWS = ("reshape", "permute")
"""Nodes that only move elements (their kernels run on 8-bit tensors too)."""


def _new_tensor(graph, like: int, dtype: str) -> int:
    """A new tensor of ``like``'s shape and ``dtype``; its id."""
    graph.tensors.append({"shape": list(graph.tensors[like]["shape"]), "dtype": dtype})
    return len(graph.tensors) - 1


def _dequantize_then_view(graph, dq, readers) -> bool:
    """``dequantize(q) -> view`` (the view its only reader) as ``view(q) -> dequantize``."""
    if per_tensor_qparams(graph, dq, "dequantize") is None or len(dq.inputs) != 3:
        return False
    if graph.tensors[dq.inputs[0]]["dtype"] not in QUANTIZED_DTYPES:
        return False
    view = sole_reader(graph, dq.output, readers)
    if view is None or view.op not in VIEWS or len(view.inputs) != 1:
        return False
    moved = _new_tensor(graph, view.output, graph.tensors[dq.inputs[0]]["dtype"])
    view.inputs, view.output, dq.output = [dq.inputs[0]], moved, view.output
    dq.inputs = [moved, *dq.inputs[1:]]
    return True


def _view_then_quantize(graph, view, readers) -> bool:
    """``view(x) -> quantize`` (the quantize its only reader) as ``quantize(x) -> view``."""
    if view.op not in VIEWS or len(view.inputs) != 1:
        return False
    q = sole_reader(graph, view.output, readers)
    if per_tensor_qparams(graph, q, "quantize") is None or len(q.inputs) != 3:
        return False
    moved = _new_tensor(graph, view.inputs[0], graph.tensors[q.output]["dtype"])
    quantized = q.output  # what the quantize's readers read: now the view's output
    q.inputs, q.output = [view.inputs[0], *q.inputs[1:]], moved
    view.inputs, view.output = [moved], quantized
    return True


@graph_pass
def move_views_to_8bit(graph) -> None:
    """``dequantize(q) -> reshape | permute`` becomes ``reshape | permute (q) -> dequantize`` and
    ``reshape | permute -> quantize`` becomes ``quantize -> reshape | permute``, for per-tensor
    (de)quantizations whose intermediate value only the view (quantize) reads: the same bits, with
    the (de)quantization next to the element-wise ops or matmul it fuses with (see the module
    docstring). Repeats until nothing moves (``dequantize -> reshape -> permute``). Runs before
    :func:`.int8_matmul.fuse_int8_matmuls` and :func:`.qdq_chain.fuse_elementwise_chains`."""
    changed, moved = False, True
    while moved:
        moved = False
        for node in list(graph.nodes):
            readers = graph.readers()
            if node.op == "dequantize":
                moved |= _dequantize_then_view(graph, node, readers)
            elif node.op in VIEWS:
                moved |= _view_then_quantize(graph, node, readers)
        changed |= moved
    if changed:
        restore_order(graph)
