"""Model import: ONNX and PyTorch models as ``(mod, params)`` ready for :func:`byoc_hetero.partition`.

Both wrap TVM's Relax frontends with the weights kept as parameters of ``main`` (inputs first),
then detach them into ``params``, a dict from parameter name to numpy array — the same shape of
result as :mod:`byoc_hetero.models`.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from .errors import FrontendError, ModelFileError, UnsupportedModelError, first_line
from .inputs import LOWER_BOUND_ATTR, UPPER_BOUND_ATTR, DimRanges, dim_ranges

__all__ = ["FrontendError", "ModelFileError", "Params", "UnsupportedModelError", "from_onnx", "from_torch"]

Params = dict[str, np.ndarray]


def _split_params(mod: tvm.IRModule, num_inputs: int | None = None) -> tuple[tvm.IRModule, Params]:
    from tvm.relax.frontend import detach_params

    mod, detached = detach_params(mod)
    values = detached.get("main", [])
    names = [v.name for v in mod["main"].params]
    if num_inputs is None:
        num_inputs = len(names) - len(values)
    weight_names = names[num_inputs:]
    if len(weight_names) != len(values):
        raise FrontendError(
            f"frontend returned {len(values)} weights for {len(weight_names)} weight parameters of main"
        )
    return mod, {n: v.numpy() for n, v in zip(weight_names, values)}


def from_onnx(model: str | Path | Any, shape: Mapping[str, Sequence[int]] | None = None,
              dim_ranges: DimRanges | None = None) -> tuple[tvm.IRModule, Params]:
    """Import an ONNX model (a path or an ``onnx.ModelProto``).

    Symbolic dims of the file (``dim_param``, as ``torch.onnx.export(..., dynamic_axes=...)``
    writes them) stay symbolic, named as in the file; ``shape`` overrides input shapes (e.g. to fix
    a symbolic batch dimension). ONNX has no way to say how large a symbolic dim may be:
    ``dim_ranges={"N": (1, 64)}`` declares it (inclusive; None for an open end), as
    ``torch.export.Dim(min=, max=)`` does for :func:`from_torch`. A declared range is checked when
    the compiled model runs through ``bh.vm`` / the CLI (:class:`InputError` naming the input, the
    dim, the range and the value), and TVM's memory planning may use the upper bound. A name that
    is no symbolic dim of an input, or a range that is not ``1 <= min <= max``, is a
    :class:`FrontendError`. Raises
    :class:`FrontendError` for a missing or unreadable file, or an op TVM's importer lacks.

    When TVM's importer rejects the model as exported and ``onnxruntime`` is installed, the model is
    constant-folded by :func:`_fold_with_onnxruntime` (ONNX Runtime's *basic* graph optimizations only)
    and imported again; the result computes the same function. This is what lets the TorchScript
    exporter's output of EfficientNet (``Pad`` whose pads come from a ``ConstantOfShape``/``Cast``/
    ``Reshape`` chain: "Dynamic pads are not supported yet") and of BERT (an attention mask built by
    ``Shape``/``ConstantOfShape``/``Expand`` on a static input shape: "broadcast_to expects ... ndim 0")
    import. A model that imports as it is is not folded. If the folded model fails too, the
    :class:`UnsupportedModelError` names the importer's error on both.

    Convs with ``auto_pad`` SAME_UPPER/SAME_LOWER get the explicit ``pads`` it means for their static input
    shape (:func:`_explicit_same_pads`; not when ``shape`` overrides input shapes), so that the padding is
    the conv's own and not a separate pad TVM runs on llvm.

    >>> mod, params = bh.from_onnx("model.onnx")
    >>> m = bh.partition(mod, params)
    """
    try:
        import onnx
    except ImportError as err:  # pragma: no cover - onnx is a dependency of the test extra
        raise FrontendError("from_onnx needs the 'onnx' package: pip install onnx") from err
    from tvm.relax.frontend.onnx import from_onnx as relax_from_onnx

    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            raise ModelFileError(f"ONNX model file {str(path)!r} does not exist")
        try:
            model = onnx.load(str(path))
        except Exception as err:  # noqa: BLE001 - protobuf raises several kinds
            raise ModelFileError(f"{str(path)!r} is not a readable ONNX model: {err}") from err
    try:
        onnx.checker.check_model(model)
    except Exception as err:  # noqa: BLE001
        raise ModelFileError(f"invalid ONNX model: {str(err).splitlines()[0]}") from err
    shape_dict = dict(shape) if shape else None

    def same_pads(m: Any) -> Any:
        # pads follow from the model's own input shapes: with shapes overridden, TVM's autopad decides
        return _fold_zero_pads(m if shape_dict else _explicit_same_pads(m))

    model = same_pads(model)
    # TVM's importer prints "Error converting operator ..." before it raises; held back here and shown
    # only if the import fails for good (a model the folding rescues would print a failure that was not).
    diagnostics = io.StringIO()
    try:
        with contextlib.redirect_stdout(diagnostics):
            mod = relax_from_onnx(model, shape_dict=shape_dict, keep_params_in_input=True)
        sys.stdout.write(diagnostics.getvalue())
    except Exception as err:  # noqa: BLE001 - the importer raises assorted errors
        folded = _fold_with_onnxruntime(model)
        if folded is None:
            sys.stdout.write(diagnostics.getvalue())
            raise UnsupportedModelError(f"TVM cannot import this ONNX model: {first_line(err)}") from err
        try:
            # shapes only known after folding (EfficientNet's: downstream of the pads it computes)
            mod = relax_from_onnx(same_pads(folded), shape_dict=shape_dict, keep_params_in_input=True)
        except Exception as err2:  # noqa: BLE001
            raise UnsupportedModelError(
                f"TVM cannot import this ONNX model: {first_line(err)} "
                f"(and after constant folding with ONNX Runtime: {first_line(err2)})"
            ) from err
    if dim_ranges:
        mod = _declare_ranges(mod, dim_ranges)
    return _split_params(mod)


def _declare_ranges(mod: tvm.IRModule, ranges: DimRanges) -> tvm.IRModule:
    """``mod`` with ``ranges`` on ``main`` as the bound attributes :func:`.inputs.dim_ranges` reads."""
    from tvm import relax

    func = mod["main"]
    symbols = {str(d.name) for p in func.params if isinstance(p.ty, relax.TensorType)
               and isinstance(p.ty.shape, relax.ShapeExpr) for d in p.ty.shape.values if isinstance(d, tvm.tirx.Var)}
    lower, upper = {}, {}
    for name, bounds in ranges.items():
        if name not in symbols:
            raise FrontendError(f"dim_ranges names {name!r}, which is no symbolic dim of the model's inputs "
                                f"(they have: {', '.join(sorted(symbols)) or 'none'})")
        try:
            lo, hi = bounds
        except (TypeError, ValueError):
            raise FrontendError(f"dim_ranges[{name!r}] must be a (min, max) pair, got {bounds!r}") from None
        for v in (lo, hi):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise FrontendError(f"dim_ranges[{name!r}] must hold ints or None, got {bounds!r}")
        if (lo is not None and lo < 1) or (hi is not None and hi < max(lo or 1, 1)):
            raise FrontendError(f"dim_ranges[{name!r}] = {bounds!r}: expected 1 <= min <= max")
        if lo is not None:
            lower[name] = lo
        if hi is not None:
            upper[name] = hi
    if lower:
        func = func.with_attr(LOWER_BOUND_ATTR, lower)
    if upper:
        func = func.with_attr(UPPER_BOUND_ATTR, upper)
    out = mod.clone()
    out["main"] = func
    return out


def _explicit_same_pads(model: Any) -> Any:
    """``model`` with each ``Conv`` whose ``auto_pad`` is ``SAME_UPPER``/``SAME_LOWER`` given the explicit
    ``pads`` that rule means for its (static) input shape; ``model`` itself when there is none.

    Why: TVM's importer turns a SAME conv into a separate pad (a TIR function, run on llvm outside any
    region and not listed among the Relax ops left there) before a conv without padding; with explicit
    pads the padding is the conv's own attribute. The TorchScript exporter writes ``padding="same"``
    convs this way (EfficientNet: 31 of 36 convs). The pads are the ONNX spec's: output = ceil(input /
    stride), total = max(0, (output - 1) * stride + (kernel - 1) * dilation + 1 - input), the odd unit at
    the end for SAME_UPPER, at the beginning for SAME_LOWER. A conv whose input or kernel shape is not
    static is left as it is.
    """
    import onnx

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


def _fold_zero_pads(model: Any) -> Any:
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
    from onnx import helper, numpy_helper

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
        if pad.op_type != "Pad" or pad.domain not in ("", "ai.onnx") or len(pad.input) > 3:
            continue  # opset 18's axes input: not written by the exporters seen; left alone
        attrs = {a.name: a for a in pad.attribute}
        if attrs.get("mode") is not None and attrs["mode"].s not in (b"constant", b""):
            continue
        pads = const(pad.input[1]) if len(pad.input) > 1 else None
        if pads is None and "pads" in attrs:  # opset < 11: pads and value are attributes
            pads = list(attrs["pads"].ints)
        value = const(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else None
        if len(pad.input) > 2 and pad.input[2] and value is None:
            continue  # a run-time pad value
        if "value" in attrs:
            value = attrs["value"].f
        if pads is not None and all(int(p) == 0 for p in pads) and pad.output[0] not in outputs:
            for node, i in readers.get(pad.output[0], []):  # pads nothing (Swin's maybe_pad): the identity
                node.input[i] = pad.input[0]
            folded.append(pad)
            continue
        if pads is None or len(pads) != 8 or (value is not None and float(value) != 0.0):
            continue
        pads = [int(p) for p in pads]
        if any(pads[i] != 0 for i in (0, 1, 4, 5)) or any(p < 0 for p in pads):
            continue
        users = readers.get(pad.output[0], [])
        if not users or pad.output[0] in outputs or any(
                n.op_type != "Conv" or n.domain not in ("", "ai.onnx") or i != 0 for n, i in users):
            continue
        if any(a.name == "auto_pad" and a.s not in (b"NOTSET", b"VALID", b"") for n, _ in users for a in n.attribute):
            continue  # SAME_* left by _explicit_same_pads (no static shapes): TVM's autopad decides
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
        folded.append(pad)
    for pad in folded:
        graph.node.remove(pad)
    return model


def _graph_domains(graph: Any) -> set[str]:
    """The op domains of every node in ``graph`` and its subgraphs (``If``/``Loop`` bodies)."""
    import onnx

    domains: set[str] = set()
    for node in graph.node:
        domains.add(node.domain)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                domains |= _graph_domains(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    domains |= _graph_domains(sub)
    return domains


def _fold_with_onnxruntime(model: Any) -> Any | None:
    """``model`` (an ``onnx.ModelProto``) after ONNX Runtime's basic-level graph optimizations, or ``None``
    when ``onnxruntime`` is absent, cannot load the model, or the result uses an op outside the standard
    ONNX domain.

    Why: the TorchScript exporter leaves computations on constants and on static input shapes as graph
    nodes (e.g. EfficientNet's ``Pad`` pads, BERT's mask broadcast) that TVM's importer does not evaluate
    and then cannot type. ``ORT_ENABLE_BASIC`` is ONNX Runtime's level of semantics-preserving rewrites in
    standard ONNX ops: constant folding (``Shape`` of a static shape included), removal of redundant nodes
    (Identity, Dropout, no-op Cast/Slice...) and fusions such as Conv+BatchNorm or MatMul+Add into Gemm
    that fold constants into weights (float rounding changes at the 1e-7 level). The extended and layout
    levels are not used: they introduce ``com.microsoft`` fused ops TVM does not know; a result with any
    non-standard op is discarded all the same.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    import onnx

    with tempfile.TemporaryDirectory(prefix="byoc_hetero_fold_") as tmp:
        out = os.path.join(tmp, "folded.onnx")
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = out
        opts.log_severity_level = 3  # errors only: the fallback's warnings are not the user's concern
        try:
            ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            folded = onnx.load(out)
        except Exception:  # noqa: BLE001 - any failure means: no folded model, report the importer's error
            return None
    if not _graph_domains(folded.graph) <= {"", "ai.onnx"}:
        return None
    return folded


def from_torch(module: Any, example_inputs: Sequence[Any],
               dynamic_shapes: Any = None) -> tuple[tvm.IRModule, Params]:
    """Import a ``torch.nn.Module`` through ``torch.export`` (inputs shaped like ``example_inputs``).

    ``dynamic_shapes`` is passed to ``torch.export.export`` as it is: which dims of which inputs
    are dynamic (``{"x": {0: torch.export.Dim("N", min=1, max=64)}}``, or a tuple in input
    order). Those dims stay symbolic in the imported module (named after the Dim), and one build
    then serves every size (docs/region-format.md, "Symbolic shapes").

    >>> mod, params = bh.from_torch(net.eval(), (torch.randn(1, 3, 224, 224),))
    >>> batch = torch.export.Dim("N", min=1, max=256)
    >>> mod, params = bh.from_torch(net.eval(), (torch.randn(2, 3, 224, 224),), dynamic_shapes=({0: batch},))
    """
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    inputs = tuple(example_inputs)
    try:
        exported = torch.export.export(module.eval(), inputs, dynamic_shapes=dynamic_shapes)
    except Exception as err:  # noqa: BLE001 - torch.export raises assorted errors
        what = "with these dynamic_shapes" if dynamic_shapes is not None else ""
        raise UnsupportedModelError(f"torch.export cannot export this PyTorch module {what}: "
                                    f"{first_line(err)}") from err
    try:
        mod = from_exported_program(exported, keep_params_as_input=True, unwrap_unit_return_tuple=True)
    except Exception as err:  # noqa: BLE001
        raise UnsupportedModelError(f"TVM cannot import this PyTorch module: {first_line(err)}") from err
    num_inputs = int(mod["main"].attrs["num_input"]) if "num_input" in mod["main"].attrs else len(inputs)
    return _split_params(_inbound_slices(mod), num_inputs)


def _inbound_slices(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each ``strided_slice`` whose symbolic end is within the sliced dim for every
    declared value of its symbol marked ``assume_inbound``, and the shapes after it re-inferred.

    Why: Hugging Face models slice a fixed table by the sequence length (BERT's
    ``position_ids[:, :seq_len]``, a (1, 512) buffer). TVM clips the end, so the slice's shape is
    ``(1, min(S, 512))``; adding that to a ``(B, S, 64)`` value gives a tensor of unknown shape,
    which TVM can neither legalize nor build ("CodeGenVM cannot emit this Relax operator"), and
    every op after it has an unknown shape. ``torch.export.Dim("S", max=512)`` says ``S <= 512``
    (TVM's importer keeps it as ``tir_var_upper_bound``), so the clip is the identity: marked in
    bound, the slice is ``(1, S)`` and every shape after it is known again.
    """
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    func = mod["main"]
    upper = {name: hi for name, (_, hi) in dim_ranges(func).items() if hi is not None}
    if not upper:
        return mod

    def within(end: Any, extent: Any, begin: Any, stride: Any) -> bool:
        return (isinstance(end, tvm.tirx.Var) and str(end.name) in upper and isinstance(extent, tvm.tirx.IntImm)
                and upper[str(end.name)] <= int(extent.value) and isinstance(begin, tvm.tirx.IntImm)
                and 0 <= int(begin.value) and isinstance(stride, tvm.tirx.IntImm) and int(stride.value) == 1)

    def unclip(e: Any) -> Any:
        # min(S, c) with S <= c declared: S (the importer writes it into reshape targets too)
        if isinstance(e, tvm.tirx.Min):
            for v, c in ((e.a, e.b), (e.b, e.a)):
                if isinstance(v, tvm.tirx.Var) and isinstance(c, tvm.tirx.IntImm) and \
                        upper.get(str(v.name), int(c.value) + 1) <= int(c.value):
                    return v
        return e

    changed = []  # (the @mutator class keeps no class attributes)

    @mutator
    class Inbound(PyExprMutator):

        def visit_call_(self, call):  # noqa: N802 - TVM's visitor naming
            call = super().visit_call_(call)
            if not isinstance(call.op, tvm.ir.Op):
                return call
            if any(isinstance(a, relax.ShapeExpr) and any(not unclip(d).same_as(d) for d in a.values)
                   for a in call.args):
                changed.append(True)
                args = [relax.ShapeExpr([unclip(d) for d in a.values]) if isinstance(a, relax.ShapeExpr) else a
                        for a in call.args]
                return relax.Call(call.op, args, call.attrs, call.ty_args)
            if call.op.name != "relax.strided_slice":
                return call
            if bool(call.attrs.assume_inbound) or len(call.args) != 5:
                return call
            x, axes, begin, end, strides = call.args
            shape = getattr(x.ty, "shape", None)
            if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(t, relax.Tuple) for t in call.args[1:]):
                return call
            for a, b, e, st in zip(axes.fields, begin.fields, end.fields, strides.fields):
                if not isinstance(a, tvm.tirx.IntImm) or not within(e, shape.values[int(a.value)], b, st):
                    return call
            changed.append(True)
            return relax.op.strided_slice(x, axes, begin, end, strides, assume_inbound=True)

    new = Inbound().visit_expr(func)
    if not changed:
        return mod
    out = mod.clone()
    out["main"] = new
    return out
