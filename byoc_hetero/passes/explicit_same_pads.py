"""Pass ``explicit_same_pads`` (ONNX protobuf, before import): SAME convs get explicit pads."""

from __future__ import annotations

from typing import Any


def explicit_same_pads(model: Any, shape: Any = None) -> Any:
    """``model`` with each ``Conv`` whose ``auto_pad`` is ``SAME_UPPER``/``SAME_LOWER`` given the explicit
    ``pads`` that rule means for its (static) input shape; ``model`` itself when there is none.

    Why: TVM's importer turns a SAME conv into a separate pad (a TIR function, run on llvm outside any
    region and not listed among the Relax ops left there) before a conv without padding; with explicit
    pads the padding is the conv's own attribute. The TorchScript exporter writes ``padding="same"``
    convs this way (EfficientNet: 31 of 36 convs). The pads are the ONNX spec's: output = ceil(input /
    stride), total = max(0, (output - 1) * stride + (kernel - 1) * dilation + 1 - input), the odd unit at
    the end for SAME_UPPER, at the beginning for SAME_LOWER. A conv whose input or kernel shape is not
    static is left as it is, and so is every conv when ``shape`` overrides the input shapes (the pads
    follow from the model's own shapes; with others, TVM's autopad decides).
    """
    import onnx

    if shape:
        return model

    same = [n for n in model.graph.node if n.op_type == "Conv" and n.domain in ("", "ai.onnx")
            and any(a.name == "auto_pad" and a.s in (b"SAME_UPPER", b"SAME_LOWER") for a in n.attribute)]
    if not same:
        return model
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - no shapes, no rewrite: TVM's own autopad still applies
        return model
    shapes: dict[str, list[int]] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info]:
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = [d.dim_value for d in dims]
    for init in inferred.graph.initializer:
        shapes[init.name] = list(init.dims)
    for node in inferred.graph.node:
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: a for a in node.attribute}
        mode = attrs["auto_pad"].s if "auto_pad" in attrs else b""
        if mode not in (b"SAME_UPPER", b"SAME_LOWER"):
            continue
        x, w = shapes.get(node.input[0]), shapes.get(node.input[1])
        if x is None or w is None or len(x) < 3 or len(w) != len(x):
            continue
        spatial = len(x) - 2
        kernel = list(attrs["kernel_shape"].ints) if "kernel_shape" in attrs else w[2:]
        strides = list(attrs["strides"].ints) if "strides" in attrs else [1] * spatial
        dilations = list(attrs["dilations"].ints) if "dilations" in attrs else [1] * spatial
        begins, ends = [], []
        for size, k, st, d in zip(x[2:], kernel, strides, dilations):
            out = -(-size // st)
            total = max(0, (out - 1) * st + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            begins.append(small if mode == b"SAME_UPPER" else large)
            ends.append(large if mode == b"SAME_UPPER" else small)
        kept = [a for a in node.attribute if a.name not in ("auto_pad", "pads")]
        del node.attribute[:]
        node.attribute.extend(kept)
        node.attribute.append(onnx.helper.make_attribute("pads", begins + ends))
    return inferred
