"""Pass ``fold_zero_pads`` (ONNX protobuf, before import): zero pads merged into the convs reading them."""

from __future__ import annotations

from typing import Any


def fold_zero_pads(model: Any, shape: Any = None) -> Any:  # noqa: ARG001 - every ONNX pass takes shape
    """``model`` with each ``Pad`` of a constant zero on the spatial dims of 4-D data, read only by
    ``Conv`` nodes (as their data), merged into those convs' ``pads`` and removed, and each ``Pad``
    of zero widths (any mode: it pads nothing; Swin's ``maybe_pad``) removed; ``model`` itself when
    there is none.

    Why: TVM's importer turns ``Pad`` into a TIR function (``call_tir``) that no rule sees; it runs
    on llvm and splits the regions around it (EfficientNet-B0: 5 regions, one per stride-2
    depthwise conv after an explicit ``nn.ZeroPad2d``). A conv pads with zeros itself, asymmetrically
    if need be. A pad with another value or mode, of the batch / channel dims, cropping (negative),
    with run-time pads, or read by anything else is left as it is (``bh.report`` lists it as a
    ``call_tir`` left on llvm).
    """
    import onnx
    from onnx import numpy_helper

    if not any(n.op_type == "Pad" for n in model.graph.node):
        return model
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for n in model.graph.node for a in n.attribute):
        return model  # a subgraph (If / Loop body) may read a pad's output unseen here
    copy = type(model)()
    copy.CopyFrom(model)  # the caller's ModelProto stays as it was
    model, graph = copy, copy.graph
    consts = {init.name: init for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for a in node.attribute:
                if a.name == "value":
                    consts[node.output[0]] = a.t

    def const(name: str):
        return numpy_helper.to_array(consts[name]) if name in consts else None

    readers: dict[str, list] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, i))
    outputs = {o.name for o in graph.output}
    folded = []
    for pad in graph.node:
        pads = _constant_zero_pad_widths(pad, const)
        if pads is None:
            continue
        if all(p == 0 for p in pads) and pad.output[0] not in outputs:
            for node, i in readers.get(pad.output[0], []):  # pads nothing (Swin's maybe_pad): the identity
                node.input[i] = pad.input[0]
            folded.append(pad)
        elif _merge_into_convs(pad, pads, readers.get(pad.output[0], []), outputs):
            folded.append(pad)
    for pad in folded:
        graph.node.remove(pad)
    return model


def _constant_zero_pad_widths(pad: Any, const: Any) -> list[int] | None:
    """The widths of a ``Pad`` in constant mode with value zero (any widths when they are all 0:
    then the value does not matter), or None when it is another node, mode, value or run-time."""
    if pad.op_type != "Pad" or pad.domain not in ("", "ai.onnx") or len(pad.input) > 3:
        return None  # opset 18's axes input: not written by the exporters seen; left alone
    attrs = {a.name: a for a in pad.attribute}
    if attrs.get("mode") is not None and attrs["mode"].s not in (b"constant", b""):
        return None
    pads = const(pad.input[1]) if len(pad.input) > 1 else None
    if pads is None and "pads" in attrs:  # opset < 11: pads and value are attributes
        pads = list(attrs["pads"].ints)
    if pads is None:
        return None
    pads = [int(p) for p in pads]
    if all(p == 0 for p in pads):
        return pads
    value = const(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else None
    if len(pad.input) > 2 and pad.input[2] and value is None:
        return None  # a run-time pad value
    if "value" in attrs:
        value = attrs["value"].f
    return None if value is not None and float(value) != 0.0 else pads


def _merge_into_convs(pad: Any, pads: list[int], users: list, outputs: set[str]) -> bool:
    """Merge a zero ``Pad`` of the spatial dims of 4-D data into the ``Conv`` nodes reading it (as
    their data); False (nothing changed) when the widths or the readers do not allow it."""
    from onnx import helper

    if len(pads) != 8 or any(pads[i] != 0 for i in (0, 1, 4, 5)) or any(p < 0 for p in pads):
        return False
    if not users or pad.output[0] in outputs or any(
            n.op_type != "Conv" or n.domain not in ("", "ai.onnx") or i != 0 for n, i in users):
        return False
    if any(a.name == "auto_pad" and a.s not in (b"NOTSET", b"VALID", b"") for n, _ in users for a in n.attribute):
        return False  # SAME_* left by explicit_same_pads (no static shapes): TVM's autopad decides
    for conv, _ in users:
        old = next((list(a.ints) for a in conv.attribute if a.name == "pads"), [0, 0, 0, 0])
        # ONNX pads: [x1_begin, x2_begin, x1_end, x2_end]; Pad's: [N, C, H, W begins, N, C, H, W ends]
        new = [old[0] + pads[2], old[1] + pads[3], old[2] + pads[6], old[3] + pads[7]]
        # auto_pad VALID (as ONNX Runtime's folding writes it) means pads 0: replaced by explicit pads
        kept = [a for a in conv.attribute if a.name not in ("pads", "auto_pad")]
        del conv.attribute[:]
        conv.attribute.extend(kept)
        conv.attribute.append(helper.make_attribute("pads", new))
        conv.input[0] = pad.input[0]
    return True
