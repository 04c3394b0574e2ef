"""Model import: ONNX and PyTorch models as ``(mod, params)`` ready for :func:`byoc_hetero.partition`.

Both wrap TVM's Relax frontends with the weights kept as parameters of ``main`` (inputs first),
then detach them into ``params``, a dict from parameter name to numpy array — the same shape of
result as :mod:`byoc_hetero.models`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tvm

from .errors import FrontendError, ModelFileError, UnsupportedModelError, first_line

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


def from_onnx(model: str | Path | Any, shape: Mapping[str, Sequence[int]] | None = None) -> tuple[tvm.IRModule, Params]:
    """Import an ONNX model (a path or an ``onnx.ModelProto``).

    Symbolic dims of the file (``dim_param``, as ``torch.onnx.export(..., dynamic_axes=...)``
    writes them) stay symbolic, named as in the file; ``shape`` overrides input shapes (e.g. to fix
    a symbolic batch dimension). Raises
    :class:`FrontendError` for a missing or unreadable file, or an op TVM's importer lacks.

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
    try:
        mod = relax_from_onnx(model, shape_dict=dict(shape) if shape else None, keep_params_in_input=True)
    except Exception as err:  # noqa: BLE001 - the importer raises assorted errors
        raise UnsupportedModelError(f"TVM cannot import this ONNX model: {first_line(err)}") from err
    return _split_params(mod)


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
    return _split_params(mod, num_inputs)
