"""Where a float Relax function gets quantized: its layers and its quantization points.

:func:`plan` reads a float function (as :func:`byoc_hetero.from_onnx`, :func:`byoc_hetero.from_torch`
or :mod:`byoc_hetero.models` write it, weights as parameters) and decides, as ONNX Runtime's
``quantize_static`` does in QDQ format:

- **layers**: each ``nn.conv2d`` / ``matmul`` whose weight is a parameter (a matmul's also through
  ``permute_dims``, as the PyTorch and Gemm importers write a linear layer), or a ``matmul`` of two
  activations (attention's); with the ``add`` of a 1-D parameter after it as its bias (also through
  ``reshape`` / ``expand_dims``, a conv's bias), and a ``relu`` after that as its activation;
- **points**: the float tensors that get a ``quantize`` → ``dequantize`` pair: every activation input
  of a layer, every layer's output (after its bias and relu: the relu goes, since a quantization
  range that starts at 0 clips like it), each ``add`` / ``multiply`` of two quantized activations (a
  residual sum) and its output; ``max_pool2d`` and layout ops (reshape, permute_dims, squeeze,
  expand_dims, strided_slice) on a quantized tensor quantize their output with their input's
  parameters, as ONNX Runtime shares them.

Everything else (softmax, normalizations, GELU, ...) stays float32 and reads the dequantized values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .._relax import op_name

LAYER_OPS = ("relax.nn.conv2d", "relax.matmul")
_SUM_OPS = ("relax.add", "relax.multiply")
_SHARED_OPS = ("relax.nn.max_pool2d", "relax.reshape", "relax.permute_dims", "relax.squeeze",
               "relax.expand_dims", "relax.strided_slice", "relax.flatten")
_BIAS_PATH_OPS = ("relax.reshape", "relax.expand_dims")


@dataclass
class Layer:
    """One quantizable layer: what :func:`byoc_hetero.quantize`'s ``keep_float`` selects by.

    ``index`` counts layers in program order; ``name`` is ``<op>_<k>`` (``conv2d_0``, ``matmul_3``:
    the k-th of its op); ``weight`` the weight parameter's name (None for a matmul of two
    activations); ``weight_axis`` the weight's output-channel axis (per-channel scales);
    ``weight_shape`` its shape.
    """

    index: int
    name: str
    op: str
    weight: str | None
    weight_axis: int | None
    weight_shape: tuple[int, ...] | None
    var: relax.Var = field(repr=False)
    inputs: list[relax.Expr] = field(repr=False, default_factory=list)
    bias: str | None = None
    output: relax.Var | None = field(repr=False, default=None)
    dropped_relu: relax.Var | None = field(repr=False, default=None)
    # the bindings that read the weight / bias parameters for this layer (the layer, a weight's
    # permute_dims, a bias's reshape and add): only these read the quantized parameters
    param_uses: set[relax.Var] = field(repr=False, default_factory=set)


@dataclass
class Plan:
    """The layers to quantize and the points: each point var → the var whose range it takes (itself,
    or the input of a shared op)."""

    layers: list[Layer]
    points: dict[relax.Var, relax.Var]
    dropped: set[relax.Var]  # the relus that go (their output range starts at 0: quantize clips)


def _bindings(func: relax.Function) -> list[relax.VarBinding]:
    return [b for block in func.body.blocks for b in block.bindings if isinstance(b, relax.VarBinding)]


def _is_float_tensor(expr: relax.Expr) -> bool:
    ty = getattr(expr, "ty", None)
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32" and ty.ndim != 0


def _weight_of(arg: relax.Expr, values: Mapping[relax.Var, Any], weights: set[str], op: str
               ) -> tuple[str, int, list[relax.Var]] | None:
    """(parameter name, output-channel axis of that parameter, the bindings between it and the layer)
    when ``arg`` is a weight of ``op``."""
    if isinstance(arg, relax.Var) and arg.name in weights:
        return arg.name, (0 if op == "relax.nn.conv2d" else arg.ty.ndim - 1), []
    value = values.get(arg)
    if op == "relax.matmul" and isinstance(value, relax.Call) and op_name(value) == "relax.permute_dims":
        src = value.args[0]
        axes = value.attrs.axes
        if isinstance(src, relax.Var) and src.name in weights and src.ty.ndim == 2 and \
                (axes is None or [int(a) for a in axes] == [1, 0]):
            return src.name, 0, [arg]
    return None


def _bias_of(call: relax.Call, out: relax.Var, values: Mapping[relax.Var, Any], weights: set[str],
             channels: int) -> tuple[str, list[relax.Var]] | None:
    """(name, bindings on the way) of the 1-D weight parameter of ``channels`` values that ``call``
    (an add) adds to ``out``."""
    if op_name(call) != "relax.add" or len(call.args) != 2:
        return None
    other = call.args[1] if call.args[0].same_as(out) else call.args[0] if call.args[1].same_as(out) else None
    path = []
    while isinstance(other, relax.Var) and other.name not in weights:
        path.append(other)
        value = values.get(other)
        if not (isinstance(value, relax.Call) and op_name(value) in _BIAS_PATH_OPS):
            return None
        other = value.args[0]
    if isinstance(other, relax.Var) and other.ty.ndim == 1:
        shape = other.ty.shape
        if isinstance(shape, relax.ShapeExpr) and isinstance(shape.values[0], tvm.tirx.IntImm) \
                and int(shape.values[0]) == channels:
            return other.name, path
    return None


def find_layers(func: relax.Function, weights: set[str]) -> list[Layer]:
    """Every quantizable layer of ``func`` (see the module docstring), in program order."""
    bindings = _bindings(func)
    values = {b.var: b.value for b in bindings}
    users: dict[relax.Var, list[relax.VarBinding]] = {}
    for b in bindings:
        def visit(e, b=b):
            if isinstance(e, relax.Var):
                users.setdefault(e, []).append(b)
        relax.analysis.post_order_visit(b.value, visit)
    layers: list[Layer] = []
    counts: dict[str, int] = {}
    for b in bindings:
        op = op_name(b.value) if isinstance(b.value, relax.Call) else None
        if op not in LAYER_OPS or not _is_float_tensor(b.var):
            continue
        call = b.value
        if op == "relax.nn.conv2d" and (str(call.attrs.kernel_layout) != "OIHW" or str(call.attrs.data_layout) != "NCHW"):
            continue
        data, rhs = call.args
        weight = _weight_of(rhs, values, weights, op)
        acts = [data] if weight is not None else [data, rhs]
        if not all(_is_float_tensor(a) and not (isinstance(a, relax.Var) and a.name in weights) for a in acts):
            continue
        short = op.removeprefix("relax.").removeprefix("nn.")
        k = counts.get(short, 0)
        counts[short] = k + 1
        shape = None
        if weight is not None:
            wvar = next(p for p in func.params if p.name == weight[0])
            shape = tuple(int(d) for d in wvar.ty.shape.values)
        layer = Layer(len(layers), f"{short}_{k}", short, weight[0] if weight else None,
                      weight[1] if weight else None, shape, b.var, acts)
        layer.param_uses = {b.var, *(weight[2] if weight else [])}
        out = b.var
        nxt = users.get(out, [])
        if weight is not None and len(nxt) == 1:
            channels = shape[weight[1]]
            bias = _bias_of(nxt[0].value, out, values, weights, channels)
            if bias is not None:
                layer.bias, out = bias[0], nxt[0].var
                layer.param_uses.update([out, *bias[1]])
        nxt = users.get(out, [])
        if len(nxt) == 1 and isinstance(nxt[0].value, relax.Call) and op_name(nxt[0].value) == "relax.nn.relu":
            layer.dropped_relu = nxt[0].var
            out = nxt[0].var
        layer.output = out
        layers.append(layer)
    return layers


def select(layers: list[Layer], keep_float: Any) -> tuple[list[Layer], list[Layer]]:
    """Split ``layers`` into (quantized, kept float) by ``keep_float``: None, a predicate on a
    :class:`Layer`, or a collection of layer indices, layer names (``conv2d_0``) and weight
    parameter names. An entry that selects no layer is an error (a typo would quantize silently)."""
    from ..errors import QuantizationError

    if keep_float is None:
        return list(layers), []
    if callable(keep_float):
        keep: Callable[[Layer], bool] = keep_float
    else:
        entries = list(keep_float) if not isinstance(keep_float, (str, int)) else [keep_float]
        for e in entries:
            if isinstance(e, bool) or not isinstance(e, (str, int)):
                raise QuantizationError(f"keep_float entries are layer indices or names, got {e!r}")
            if not any(e in (layer.index, layer.name, layer.weight) for layer in layers):
                names = ", ".join(f"{lyr.index}:{lyr.name}" + (f"({lyr.weight})" if lyr.weight else "")
                                  for lyr in layers)
                raise QuantizationError(f"keep_float names {e!r}, which is no layer of the model; "
                                        f"its layers are {names}")

        def keep(layer: Layer) -> bool:
            return any(e in (layer.index, layer.name, layer.weight) for e in entries)
    kept = [layer for layer in layers if keep(layer)]
    return [layer for layer in layers if not keep(layer)], kept


def plan(func: relax.Function, weights: set[str], keep_float: Any = None) -> tuple[Plan, list[Layer]]:
    """The quantization plan of ``func`` (see the module docstring) and the layers kept float."""
    layers, kept = select(find_layers(func, weights), keep_float)
    needed = {a for layer in layers for a in layer.inputs} | {layer.output for layer in layers}
    # program order, so that a shared op's input is decided before its output: a flatten between a
    # pool and a dense takes the pool's parameters even though the dense also asks for its input
    points: dict[relax.Var, relax.Var] = {p: p for p in func.params if p in needed}
    for b in _bindings(func):
        if not _is_float_tensor(b.var):
            continue
        op = op_name(b.value) if isinstance(b.value, relax.Call) else None
        args = [a for a in b.value.args if isinstance(a, relax.Var)] if op else []
        if op in _SHARED_OPS and args and args[0] in points:
            points[b.var] = points[args[0]]
        elif b.var in needed or (op in _SUM_OPS and len(args) == 2 and all(a in points for a in args)):
            points[b.var] = b.var
    dropped = {layer.dropped_relu for layer in layers if layer.dropped_relu is not None}
    return Plan(layers, points, dropped), kept


def weight_qparams(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights: (int8 values, float32 scales), per channel along ``axis`` (None: one
    scale). A channel's scale is max |w| / 127 (1 for an all-zero channel), values
    ``clip(round_half_even(w / scale), -127, 127)``, the zero point 0 — ONNX Runtime's symmetric int8."""
    w = np.asarray(w, np.float32)
    if axis is None:
        amax = np.array(np.max(np.abs(w)), np.float32)
        shaped = amax
    else:
        others = tuple(i for i in range(w.ndim) if i != axis)
        amax = np.max(np.abs(w), axis=others).astype(np.float32)
        shaped = amax.reshape([-1 if i == axis else 1 for i in range(w.ndim)])
    scale = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    shaped_scale = np.where(shaped > 0, shaped / np.float32(127), np.float32(1)).astype(np.float32)
    q = np.clip(np.rint(w / shaped_scale), -127, 127).astype(np.int8)
    return q, scale


def activation_qparams(lo: float, hi: float, dtype: str) -> tuple[np.float32, int]:
    """Asymmetric (scale, zero point) of a range for ``dtype`` ("uint8"/"int8"), as ONNX Runtime computes
    them: the range is widened to hold 0, scale = (hi - lo) / (qmax - qmin) (1 when the range is
    empty), zero point = round(qmin - lo / scale) clipped to the type."""
    qmin, qmax = (0, 255) if dtype == "uint8" else (-128, 127)
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        from ..errors import QuantizationError

        raise QuantizationError(f"a calibrated range is not finite: [{lo}, {hi}]")
    scale = np.float32((hi - lo) / (qmax - qmin)) if hi > lo else np.float32(1.0)
    if scale == 0:  # a range narrower than float32 resolves
        scale = np.float32(np.finfo(np.float32).tiny)
    zp = int(np.clip(np.rint(qmin - lo / float(scale)), qmin, qmax))
    return scale, zp


def tensor_index(func: relax.Function) -> dict[relax.Var, int]:
    """Position of each bound var in ``func`` (program order), to order points deterministically."""
    return {b.var: i for i, b in enumerate(_bindings(func))}


__all__ = ["Layer", "Plan", "activation_qparams", "find_layers", "plan", "select", "tensor_index",
           "weight_qparams"]

