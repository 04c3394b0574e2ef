"""A gated unit's product as the epilogue of one of its dense layers.

Llama's MLP (SwiGLU; Mistral, Qwen and Gemma's GeGLU alike) computes ``act(x·Wg) * (x·Wu)``:
two dense layers over the same input and an element-wise product of their outputs. In the region
that product is one more node: a full pass over the ``[S, intermediate]`` activations (30 of them
per call of the SmolLM-135M decoder, [128, 1536] each; 0.07-0.09 ms per pass at 1 thread, the
largest element-wise step of a layer; bench/LLM.md "session 5") that reads two tensors and writes
a third. oneDNN applies a ``binary_mul`` post-op with a full-size second source while the matmul's
output tile is still in registers, so one of the denses takes the other's output as its
``multiply`` input (attrs ``multiply`` 1, ``cpp/kernels/dense.cc``) and writes the product.

What: a ``binary`` ``mul`` node (no activation of its own) whose two operands and output have one
shape, one operand written by a float32 dense (plain attrs: no int8 scales, no precision, no
residual, no multiplier yet), directly or through reshapes (``dense_flat``'s ``[S, N]`` ->
``[1, S, N]``), each read once and no region output, becomes that dense's multiplier (read through
a reshape to the dense's output shape, no copy); the dense and its reshapes move to the product's
place in the node order (after both operands exist) and the product's readers read the reshaped
dense output. Which of two dense operands takes it does not matter for the result: the post-op
runs after the dense's activation.
"""

from __future__ import annotations

from ..lowering import Node, RegionGraph
from ..table import graph_pass

_PLAIN_DENSE_ATTRS = frozenset({"weight_layout", "has_bias", "activation", "clip"})
"""The attrs of a float32 dense without residual or multiplier; any other (int8 scales, a
precision, a residual sum) leaves the dense alone."""


def _gating_dense(graph: RegionGraph, product: Node, readers: dict[int, int]) -> tuple[Node, list[Node], int] | None:
    """(the dense that can take ``product`` as its epilogue, the reshapes from its output to the
    product's operand in graph order, the other operand), or None."""
    shape = graph.tensors[product.output]["shape"]
    for k in (0, 1):
        value, other = product.inputs[k], product.inputs[1 - k]
        found = graph.producer_through(value)  # through reshapes, each read once (dense_flat's)
        if found is None or value == other or readers.get(value, 0) != 1 or value in graph.outputs:
            continue
        dense, chain = found
        if dense.op != "dense" or not set(dense.attrs) <= _PLAIN_DENSE_ATTRS:
            continue
        if any(graph.tensors[t]["shape"] != shape or graph.tensors[t]["dtype"] != "float32" for t in (value, other)):
            continue  # a broadcast product, or not float32
        return dense, chain[::-1], other
    return None


def _reshaped(graph: RegionGraph, t: int, shape: list, at: int) -> int:
    """Tensor ``t`` read as ``shape``: a reshape node (no copy in the runtime) inserted at ``at``."""
    if list(graph.tensors[t]["shape"]) == list(shape):
        return t
    graph.tensors.append({"shape": list(shape), "dtype": graph.tensors[t]["dtype"]})
    graph.nodes.insert(at, Node("reshape", [t], len(graph.tensors) - 1, {}))
    return len(graph.tensors) - 1


@graph_pass
def fuse_gated_products(graph: RegionGraph) -> None:
    """``mul(view(dense(x)), g)`` with ``g`` of the product's shape becomes the dense's
    ``multiply`` epilogue (see the module doc); the multiply node is dropped."""
    for product in [n for n in graph.nodes if n.op == "binary"]:
        if product.attrs.get("algorithm") != "mul" or product.attrs.get("activation", "none") != "none":
            continue
        found = _gating_dense(graph, product, graph.readers())
        if found is None:
            continue
        dense, chain, other = found
        # the dense and its reshapes move to the product's place, after both operands are written
        moved = [dense, *chain]
        graph.nodes[:] = [m for m in graph.nodes if all(m is not n for n in moved)]
        at = next(i for i, m in enumerate(graph.nodes) if m is product)
        graph.nodes[at:at + 1] = moved
        dense.inputs.append(_reshaped(graph, other, graph.tensors[dense.output]["shape"], at))
        dense.attrs["multiply"] = 1
        graph.replace_tensor(product.output, product.inputs[0] if product.inputs[1] == other else product.inputs[1])
