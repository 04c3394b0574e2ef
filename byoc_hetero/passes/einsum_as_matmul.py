"""Pass ``einsum_as_matmul`` (ONNX protobuf, before import): an ``Einsum`` that is a batched matrix
product becomes ``Transpose`` + ``MatMul`` (+ ``Transpose``).

Why: torchvision's MaxViT computes its block and grid attention with ``torch.einsum("B G H I D, B G
H J D -> B G H I J", q, k)`` and ``einsum("B G H I J, B G H J D -> B G H I D", p, v)``. torch's default
ONNX exporter keeps them as ``Einsum``, which TVM's importer writes as a TIR function; rules match
Relax ops, so both products ran on llvm, and the relative position bias add and the softmax between
them were left in regions with nothing compute-heavy, which the cost gate refuses: 23 regions on
MaxViT-T (issue 39). ``from_torch`` never saw it: torch's decomposition writes einsum as ``bmm``.

What: a two-operand equation without ``...`` and with each letter at most once per term, whose
letters are batch letters (in both operands and the result), one contracted letter ``k`` (both
operands, not the result), one row letter ``m`` (first operand and result) and one column letter
``n`` (second operand and result): the operands are transposed to ``[batch..., m, k]`` and
``[batch..., k, n]`` (batch letters in the result's order; an identity transpose is not written),
multiplied, and the product transposed to the result's order where that differs. Any other
equation stays an ``Einsum``.
"""

from __future__ import annotations

from typing import Any

from ._onnx import copy_of, detached


def matmul_plan(equation: str) -> tuple[list[int], list[int], list[int]] | None:
    """``(perm_a, perm_b, perm_out)`` that make the einsum ``equation`` ``transpose(a, perm_a) @
    transpose(b, perm_b)``, then ``transpose(.., perm_out)``; None when it is not such a product."""
    text = equation.replace(" ", "")
    if "->" not in text or "." in text:
        return None
    inputs, out = text.split("->")
    terms = inputs.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) for t in (*terms, out)):
        return None
    a, b = terms
    batch = [c for c in out if c in a and c in b]
    rows, cols = [c for c in a if c in out and c not in b], [c for c in b if c in out and c not in a]
    inner = [c for c in a if c in b and c not in out]
    if len(rows) != 1 or len(cols) != 1 or len(inner) != 1 or len(a) + len(b) != 2 * len(batch) + 4 \
            or len(out) != len(batch) + 2:
        return None
    order_a, order_b = batch + rows + inner, batch + inner + cols
    product = batch + rows + cols
    return [a.index(c) for c in order_a], [b.index(c) for c in order_b], [product.index(c) for c in out]


def _nodes(node: Any, plan: tuple[list[int], list[int], list[int]]) -> list[Any]:
    from onnx import helper

    perm_a, perm_b, perm_out = plan
    name = node.name or node.output[0]
    nodes, operands = [], []
    for i, perm in enumerate((perm_a, perm_b)):
        if perm == sorted(perm):
            operands.append(node.input[i])
            continue
        operands.append(f"{name}_operand{i}")
        nodes.append(helper.make_node("Transpose", [node.input[i]], [operands[-1]], perm=perm,
                                      name=f"{name}_transpose{i}"))
    if perm_out == sorted(perm_out):
        nodes.append(helper.make_node("MatMul", operands, list(node.output), name=f"{name}_matmul"))
    else:
        nodes.append(helper.make_node("MatMul", operands, [f"{name}_product"], name=f"{name}_matmul"))
        nodes.append(helper.make_node("Transpose", [f"{name}_product"], list(node.output), perm=perm_out,
                                      name=f"{name}_transpose_out"))
    return nodes


def _equation(node: Any) -> str:
    for attr in node.attribute:
        if attr.name == "equation":
            return attr.s.decode() if isinstance(attr.s, bytes) else str(attr.s)
    return ""


def einsum_as_matmul(model: Any, shape: Any = None) -> Any:  # noqa: ARG001 - every ONNX pass takes shape
    """``model`` with each ``Einsum`` that is a batched matrix product written as ``MatMul`` and
    ``Transpose`` nodes (see the module doc); ``model`` itself when there is none."""
    plans = [matmul_plan(_equation(n)) if n.op_type == "Einsum" and n.domain in ("", "ai.onnx")
             and len(n.input) == 2 else None for n in model.graph.node]
    if not any(plans):
        return model
    copy = copy_of(model)
    nodes = []
    for node, plan in zip(copy.graph.node, plans):
        nodes.extend(_nodes(node, plan) if plan else [detached(node)])
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy
