"""Region-graph pass :func:`reshape_8bit_values`: a reshape next to a per-tensor (de)quantization
moves to the 8-bit side of it.

Why: an int8 dense reads and writes 2-D ``[tokens, features]`` tensors while the element-wise work
of a QDQ transformer (GELU, the residual adds) runs on the model's 3-D ``[1, tokens, features]``
ones, so ``quantize_static``'s graph has ``dense -> dequantize -> reshape -> GELU ... -> reshape ->
quantize -> dense``. The reshape sits between the dequantize (quantize) and the element-wise chain,
so :func:`.qdq_chain.fuse_elementwise_chains` cannot take them in: each stays a separate host pass
over a [128, 3072] float32 tensor (1 thread, 2-layer BERT-base: 2 passes of 4 per layer that the
chain then does again, bench/INT8.md, session 4). A per-tensor (de)quantization is element-wise and
a reshape keeps the row-major order of the elements, so ``reshape(dequantize(q)) ==
dequantize(reshape(q))`` and ``quantize(reshape(x)) == reshape(quantize(x))`` bit for bit; a
reshape costs no step either way (the planner aliases its bytes). After the move the chain reads
the 8-bit tensor and writes the 8-bit one itself.
"""

from __future__ import annotations

from ..table import graph_pass
from .qdq import QUANTIZED_DTYPES, _per_tensor, _restore_order, _sole_reader


def _new_tensor(graph, like: int, dtype: str) -> int:
    """A new tensor of ``like``'s shape and ``dtype``; its id."""
    graph.tensors.append({"shape": list(graph.tensors[like]["shape"]), "dtype": dtype})
    return len(graph.tensors) - 1


def _dequantize_then_reshape(graph, dq, readers) -> bool:
    """``dequantize(q) -> reshape`` (the reshape its only reader) as ``reshape(q) -> dequantize``."""
    if _per_tensor(graph, dq, "dequantize") is None or len(dq.inputs) != 3:
        return False
    if graph.tensors[dq.inputs[0]]["dtype"] not in QUANTIZED_DTYPES:
        return False
    reshape = _sole_reader(graph, dq.output, readers)
    if reshape is None or reshape.op != "reshape" or len(reshape.inputs) != 1:
        return False
    moved = _new_tensor(graph, reshape.output, graph.tensors[dq.inputs[0]]["dtype"])
    reshape.inputs, reshape.output, dq.output = [dq.inputs[0]], moved, reshape.output
    dq.inputs = [moved, *dq.inputs[1:]]
    return True


def _reshape_then_quantize(graph, reshape, readers) -> bool:
    """``reshape(x) -> quantize`` (the quantize its only reader) as ``quantize(x) -> reshape``."""
    if reshape.op != "reshape" or len(reshape.inputs) != 1:
        return False
    q = _sole_reader(graph, reshape.output, readers)
    if _per_tensor(graph, q, "quantize") is None or len(q.inputs) != 3:
        return False
    moved = _new_tensor(graph, reshape.inputs[0], graph.tensors[q.output]["dtype"])
    quantized = q.output  # what the quantize's readers read: now the reshape's output
    q.inputs, q.output = [reshape.inputs[0], *q.inputs[1:]], moved
    reshape.inputs, reshape.output = [moved], quantized
    return True


@graph_pass
def reshape_8bit_values(graph) -> None:
    """``dequantize(q) -> reshape`` becomes ``reshape(q) -> dequantize`` and ``reshape -> quantize``
    becomes ``quantize -> reshape``, for per-tensor (de)quantizations whose intermediate value only
    the reshape (quantize) reads: the same bits, with the (de)quantization next to the element-wise
    ops it can fuse with (see the module docstring). Runs before
    :func:`.qdq_chain.fuse_elementwise_chains`."""
    changed = False
    for node in list(graph.nodes):
        readers = graph.readers()
        if node.op == "dequantize":
            changed |= _dequantize_then_reshape(graph, node, readers)
        elif node.op == "reshape":
            changed |= _reshape_then_quantize(graph, node, readers)
    if changed:
        _restore_order(graph)
