"""Pass ``drop_identity_expands`` (ONNX protobuf, before import): an ``Expand`` to a constant shape
that broadcasting leaves unchanged becomes an ``Identity``."""

from __future__ import annotations

from typing import Any

from ._onnx import copy_of, inferred_shapes, integer_constants


def drop_identity_expands(model: Any, shape: Any = None) -> Any:  # noqa: ARG001 - every ONNX pass takes shape
    """``model`` with each ``Expand(x, c)`` whose constant target ``c`` is no longer than ``x``'s
    rank and, right-aligned, is 1 or ``x``'s own static dim at every axis written as ``Identity``
    (ONNX's broadcast of ``x`` to ``c`` is ``x`` itself), and each ``Tile(x, r)`` with constant
    repeats ``r`` all 1; ``model`` itself when there is none.

    Why: the default (dynamo) exporter of torch 2.13 writes transformers' ``position_ids.expand(1, -1)``
    as ``Expand(ids, [1, 1])``. With a symbolic sequence dim TVM's importer fails on it (its
    constant-shape path reads every input dim as an integer: "'Var' object has no attribute
    'value'"). An identity needs no shape at all.
    """
    from onnx import helper

    expands = [n for n in model.graph.node if n.op_type in ("Expand", "Tile") and n.domain in ("", "ai.onnx")]
    if not expands:
        return model
    constants = integer_constants(model)
    expands = [n for n in expands if len(n.input) > 1 and n.input[1] in constants]
    # Tile by repeats of 1 (torch's x.repeat(1, 1, 1), DeBERTa-v2's shared position keys): TVM's importer
    # wrote it as a TIR function on llvm, between two regions
    identities = {n.output[0] for n in expands if n.op_type == "Tile" and (constants[n.input[1]] == 1).all()}
    expands = [n for n in expands if n.op_type == "Expand"]
    shapes = inferred_shapes(model) if expands else {}
    for node in expands:
        target, dims = constants[node.input[1]].reshape(-1).tolist(), shapes.get(node.input[0])
        if dims is None or len(target) > len(dims):
            continue
        if all(t == 1 or (isinstance(d, int) and d == t) for t, d in zip(reversed(target), reversed(dims))):
            identities.add(node.output[0])
    if not identities:
        return model
    copy = copy_of(model)
    nodes = [helper.make_node("Identity", [n.input[0]], list(n.output), name=n.name or n.output[0])
             if n.op_type in ("Expand", "Tile") and n.output[0] in identities else n for n in copy.graph.node]
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy
