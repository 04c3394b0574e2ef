"""Fold float computations on weights alone into constants, once, at bind time.

Why: PyTorch's weight norm (``nn.utils.weight_norm``, wav2vec 2.0's positional convolution) is a
parametrization: the conv's weight is ``g * v / ||v||``, computed from the two parameters in every
forward. torch.export writes that chain (``abs``, ``power``, ``sum``, ``power``, ``divide``,
``multiply`` on a 768x48x128 tensor) into the graph, so it ran on every call, on llvm or in a
region. Once the parameters are bound as constants, the chain depends on nothing the caller gives:
its value is a constant.

What: in each function, a binding whose op is one numpy can evaluate (below; also ``full`` of a
constant, wav2vec 2.0's scalar 0.0 for a ``where``) and whose tensor
arguments are all constants (or bindings folded so), is evaluated with numpy; every such binding
that *computes* (not only relabels or relayouts: reshape, permute_dims, expand_dims, squeeze,
broadcast_to) is replaced by its value. Pure relabels of a weight are left as they are: the rules
read ``matmul(x, permute_dims(W))`` and a folded transpose would change the layout they see (and
folding every weight transpose of BERT-base took 37 s with TVM's FoldConstant). Integer / bool
bookkeeping is :mod:`byoc_hetero.fold`'s job.

The index, select and compare ops of :data:`INDEX_OPS` are evaluated too (by
:class:`.fold_int_constants.Evaluator`): Swin's shifted-window attention masks are built from zeros
on every call (``full`` + ``slice_scatter`` + ``not_equal`` + ``where`` from torch.export,
``strided_slice`` + ``scatter_nd`` from the default ONNX exporter) — dozens of small ops on llvm per
block, all constants once computed; so is the relative position bias gathered from its table.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from .._relax import op_name, tensor_view
from .fold_int_constants import Evaluator, Substitute, dense

_UNARY = {"relax.abs": np.abs, "relax.sqrt": np.sqrt, "relax.exp": np.exp, "relax.negative": np.negative,
          "relax.rsqrt": lambda x: 1 / np.sqrt(x), "relax.square": np.square,
          "relax.nn.relu": lambda x: np.maximum(x, 0), "relax.sigmoid": lambda x: 1 / (1 + np.exp(-x))}
_BINARY = {"relax.add": np.add, "relax.subtract": np.subtract, "relax.multiply": np.multiply,
           "relax.divide": np.divide, "relax.power": np.power, "relax.maximum": np.maximum,
           "relax.minimum": np.minimum, "relax.matmul": np.matmul}
_REDUCE = {"relax.sum": np.sum, "relax.max": np.max, "relax.mean": np.mean}
RELABELS = frozenset({"relax.reshape", "relax.permute_dims", "relax.expand_dims", "relax.squeeze",
                      "relax.broadcast_to", "relax.tile"})
"""Ops that only relabel, relayout or repeat: evaluated to reach a computation, never folded on their own
(``tile``: DeBERTa's position keys go through ``tile(x, [1, 1, 1])`` on their way to a slice)."""


def _axes(attrs, rank: int) -> tuple[int, ...] | None:
    axis = getattr(attrs, "axis", None)
    return None if axis is None else tuple(int(a) % rank for a in axis)


def _float(value) -> float:
    """A PrimValue's number (``clip``'s bounds)."""
    value = getattr(value, "value", value)
    return float(getattr(value, "value", value))


def _layer_norm(attrs, x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """``nn.layer_norm`` in float64: normalized over ``attrs.axes``, then scaled and shifted."""
    axes = tuple(int(a) % x.ndim for a in attrs.axes)
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    out = (x64 - mean) / np.sqrt(x64.var(axis=axes, keepdims=True) + float(attrs.epsilon))
    if bool(getattr(attrs, "scale", True)):
        out = out * gamma
    return out + beta if bool(getattr(attrs, "center", True)) else out


def _evaluate(call: relax.Call, args: list[np.ndarray]) -> np.ndarray | None:
    """``call`` on numpy values, or None when it is not an op evaluated here."""
    name, out = op_name(call), None
    if name in _UNARY:
        out = _UNARY[name](args[0])
    elif name in _BINARY:
        out = _BINARY[name](args[0], args[1])
    elif name == "relax.clip":  # Swin-V2's logit scale: clamp(max=log(100)).exp() of a parameter
        out = np.clip(args[0], _float(call.args[1]), _float(call.args[2]))
    elif name == "relax.full_like":  # torchvision Swin-V2's qkv bias: its K third zeroed in every forward
        out = np.full_like(args[0], args[1])
    elif name == "relax.nn.layer_norm":  # DeBERTa-v2's norm_rel_ebd: its relative embeddings, a weight
        out = _layer_norm(call.attrs, *args[:3])
    elif name in _REDUCE:
        out = _REDUCE[name](args[0], axis=_axes(call.attrs, args[0].ndim), keepdims=bool(call.attrs.keepdims))
    elif name == "relax.tile":
        out = np.tile(args[0], [int(r) for r in call.attrs.repeats])
    elif name == "relax.permute_dims":
        axes = call.attrs.axes
        out = np.transpose(args[0], None if axes is None else [int(a) for a in axes])
    elif name in RELABELS or name == "relax.full":
        shape = getattr(call.ty, "shape", None)
        dims = [int(d) for d in shape.values] if shape is not None and all(
            isinstance(d, tvm.tirx.IntImm) for d in shape.values) else None
        if dims is not None:
            out = np.full(dims, args[-1]) if name == "relax.full" else \
                np.broadcast_to(args[0], dims) if name == "relax.broadcast_to" else args[0].reshape(dims)
    return out


INDEX_OPS = frozenset({"relax.strided_slice", "relax.scatter_nd", "relax.slice_scatter", "relax.where",
                       "relax.take", "relax.equal", "relax.not_equal", "relax.less", "relax.greater",
                       "relax.logical_not", "relax.gather_nd", "relax.isnan"})
"""Index, select and compare ops evaluated by :class:`.fold_int_constants.Evaluator` when their tensor
arguments are constants: the attention masks of Swin's shifted windows, built from zeros on every
call (``full`` + ``slice_scatter`` from torch.export; ``strided_slice`` + ``scatter_nd`` from the
default ONNX exporter; then ``not_equal`` / ``where``). Their bool results are folded too: a
compare of a constant is a constant."""


def _static_dims(ty) -> tuple[int, ...] | None:
    shape = getattr(ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(d, tvm.tirx.IntImm) for d in values):
        return None
    return tuple(int(d) for d in values)


def _value(call: relax.Call, args: list[np.ndarray], ev: Evaluator) -> np.ndarray | None:
    """``call``'s value on constant arguments, or None: a float result, or a compare's bool one."""
    dtype = str(getattr(call.ty, "dtype", ""))
    if not (dtype.startswith("float") or (dtype == "bool" and op_name(call) in INDEX_OPS)):
        return None
    with np.errstate(all="ignore"):
        value = _evaluate(call, args) if args else None
        if value is None and op_name(call) in INDEX_OPS:
            try:
                value = ev.call(call)
            except (ValueError, TypeError, IndexError):
                value = None  # numpy disagrees with the op's reading of its arguments: leave it
    if value is None or isinstance(value, tuple):
        return None
    if op_name(call) in RELABELS and isinstance(value, np.ndarray) and value.dtype == dtype:
        # a weight's transpose or reshape stays a view: never folded on its own, it is only read by a
        # computation it reaches (a C-ordered copy of every transposed weight was the build's peak)
        return value if value.shape == _static_dims(call.ty) else None
    value = dense(value, dtype)
    return value if value.shape == _static_dims(call.ty) else None


def _fold_function(func: relax.Function) -> dict[relax.Var, relax.Expr]:
    ev = Evaluator()
    known = ev.known  # numpy values of the bindings evaluated so far
    folded: dict[relax.Var, relax.Expr] = {}
    for block in getattr(func.body, "blocks", []):
        for binding in block.bindings:
            call = binding.value
            if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
                continue
            args = []
            for arg in call.args:
                if isinstance(arg, tvm.ir.GenericConst):
                    args.append(tensor_view(arg.value))  # no copy of every weight (issue 36)
                elif isinstance(arg, relax.Var) and arg in known:
                    args.append(known[arg])
                elif isinstance(arg, relax.Expr) and isinstance(arg.ty, relax.TensorType):
                    args = None
                    break
            if args is None:
                continue
            value = _value(call, args, ev)
            if value is None:
                continue
            known[binding.var] = value
            if op_name(call) not in RELABELS:
                folded[binding.var] = relax.const(value)
    return folded


def fold_weight_subgraphs(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every computation on constants alone replaced by its value (see the module doc)."""
    out, changed = mod.clone(), []  # a pass does not change its input
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            folded = _fold_function(func)
            if folded:
                out[gvar] = Substitute(folded, mod).visit_expr(func)
                changed.append(gvar.name_hint)
    return relax.transform.DeadCodeElimination(changed)(out) if changed else mod
