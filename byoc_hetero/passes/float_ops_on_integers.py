"""Pass ``float_ops_on_integers`` (torch.export graph, before TVM's importer): an op torch computes in
float on integer operands gets them cast to its float result type first.

Why: torch promotes integer tensors to its default float type where an op's result is a float
(``aten.div.Tensor`` is true division, ``aten.log`` / ``aten.sqrt`` of an int64 tensor are float).
TVM's importer keeps the operand's dtype instead: ``div(int64, 8)`` became an integer ``relax.divide``
and the ``relax.log`` after it failed the import ("requires the input tensor to have float dtype";
DeBERTa-v2's log-bucketed relative positions, issue 39). torch.export records each node's result
type (``node.meta["val"]``), so the rule is general: a call whose result is a floating tensor and
whose tensor operands are all integer or bool reads them through ``aten._to_copy`` to that type.
Ops with a float operand (embedding, gather, where with a float branch) are untouched; on a cast
(``_to_copy`` of an int to a float) the inserted cast is an identity TVM's importer folds away.
"""

from __future__ import annotations

from typing import Any


def _tensor(node: Any) -> Any:
    import torch

    value = getattr(node, "meta", {}).get("val") if hasattr(node, "meta") else None
    return value if isinstance(value, torch.Tensor) else None


def _integer(dtype: Any) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex)


def float_ops_on_integers(exported: Any) -> Any:
    """``exported`` (a decomposed ``torch.export.ExportedProgram``) with integer operands of float-valued
    calls cast to the result's type (see the module doc); the program is edited in place and returned."""
    import torch

    graph = exported.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        out = _tensor(node)
        if node.op != "call_function" or out is None or not out.dtype.is_floating_point:
            continue
        operands = [a for a in node.all_input_nodes if _tensor(a) is not None]
        if not operands or any(not _integer(_tensor(a).dtype) for a in operands):
            continue
        for arg in operands:
            with graph.inserting_before(node):
                cast = graph.call_function(torch.ops.aten._to_copy.default, (arg,), {"dtype": out.dtype})
            cast.meta["val"] = _tensor(arg).to(out.dtype)
            node.replace_input_with(arg, cast)
            changed = True
    if changed:
        graph.lint()
        exported.graph_module.recompile()
    return exported
