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
from .inputs import DimRanges, with_dim_ranges
from .passes import ONNX_IMPORT, ONNX_IMPORTED, TORCH_EXPORTED, TORCH_IMPORT, run_passes
from .qdq_checks import check_onnx as check_onnx_qdq

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


def _load_onnx(model: str | Path | Any) -> Any:
    """The checked ``onnx.ModelProto`` of a path or a ModelProto: :class:`ModelFileError` for a
    missing, unreadable or invalid file, :class:`~byoc_hetero.errors.QuantizationError` for a
    malformed scale or zero point (a bad scale would import silently)."""
    try:
        import onnx
    except ImportError as err:  # pragma: no cover - onnx is a dependency of the test extra
        raise FrontendError("from_onnx needs the 'onnx' package: pip install onnx") from err
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
    check_onnx_qdq(model)
    return model


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
    :class:`FrontendError` for a missing or unreadable file, or an op TVM's importer lacks, and its
    subclass :class:`~byoc_hetero.errors.QuantizationError` for a QDQ model with a malformed scale or
    zero point (:func:`byoc_hetero.qdq_checks.check_onnx`).

    When TVM's importer rejects the model as exported and ``onnxruntime`` is installed, the model is
    constant-folded by :func:`_fold_with_onnxruntime` (ONNX Runtime's *basic* graph optimizations only)
    and imported again; the result computes the same function. This is what lets the TorchScript
    exporter's output of EfficientNet (``Pad`` whose pads come from a ``ConstantOfShape``/``Cast``/
    ``Reshape`` chain: "Dynamic pads are not supported yet") and of BERT (an attention mask built by
    ``Shape``/``ConstantOfShape``/``Expand`` on a static input shape: "broadcast_to expects ... ndim 0")
    import. A model that imports as it is is not folded. If the folded model fails too, the
    :class:`UnsupportedModelError` names the importer's error on both.

    Convs with ``auto_pad`` SAME_UPPER/SAME_LOWER get the explicit ``pads`` it means for their static input
    shape (:mod:`byoc_hetero.passes.explicit_same_pads`; not when ``shape`` overrides input shapes), so that the padding is
    the conv's own and not a separate pad TVM runs on llvm.

    >>> mod, params = bh.from_onnx("model.onnx")
    >>> m = bh.partition(mod, params)
    """
    from tvm.relax.frontend.onnx import from_onnx as relax_from_onnx

    model = _load_onnx(model)
    shape_dict = dict(shape) if shape else None

    def same_pads(m: Any) -> Any:  # byoc_hetero.passes.ONNX_IMPORT, in order
        return run_passes(ONNX_IMPORT, m, shape=shape_dict)

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
    return _split_params(run_passes(ONNX_IMPORTED, mod))


def _declare_ranges(mod: tvm.IRModule, ranges: DimRanges) -> tvm.IRModule:
    """``mod`` with ``ranges`` on ``main`` as the bound attributes :func:`.inputs.dim_ranges` reads."""
    from tvm import relax

    func = mod["main"]
    symbols = {str(d.name) for p in func.params if isinstance(p.ty, relax.TensorType)
               and isinstance(p.ty.shape, relax.ShapeExpr) for d in p.ty.shape.values if isinstance(d, tvm.tirx.Var)}
    checked = {}
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
        checked[name] = (lo, hi)
    out = mod.clone()
    out["main"] = with_dim_ranges(func, checked)
    return out






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


def _has_sparse_tensors(exported: Any) -> bool:
    """Whether a weight, buffer or constant of ``exported`` is a sparse tensor (not decomposed)."""
    import itertools

    import torch

    values = itertools.chain((t for _, t in exported.named_parameters()), (t for _, t in exported.named_buffers()),
                             exported.constants.values())
    return any(isinstance(t, torch.Tensor) and t.layout != torch.strided for t in values)


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
        if not _has_sparse_tensors(exported):  # TVM's importer leaves those undecomposed too
            exported = run_passes(TORCH_EXPORTED, exported.run_decompositions())
        mod = from_exported_program(exported, keep_params_as_input=True, unwrap_unit_return_tuple=True,
                                    run_ep_decomposition=False)
    except Exception as err:  # noqa: BLE001
        raise UnsupportedModelError(f"TVM cannot import this PyTorch module: {first_line(err)}") from err
    num_inputs = int(mod["main"].attrs["num_input"]) if "num_input" in mod["main"].attrs else len(inputs)
    return _split_params(run_passes(TORCH_IMPORT, mod), num_inputs)


