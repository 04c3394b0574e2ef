"""Batch norms folded into the convolutions before them, before a model is quantized.

ONNX Runtime's ``quant_pre_process`` and the TorchScript exporter fold an inference batch norm into
the convolution it follows; a module from ``bh.from_torch`` (torch.export) and the default ONNX
exporter's files keep ``nn.batch_norm`` after each ``nn.conv2d``. Quantized as they are, every batch
norm sits between two int8 layers as a float32 op with its own quantize / dequantize steps: the
tuner's all-int8 ResNet-50 from ``bh.from_torch`` ran 1.98x slower than all-bf16 for it
(bench/TUNE-precision.md). Folded, the convolution gets ``W * g`` (``g = gamma / sqrt(var + eps)``
per output channel) and the bias ``beta - mean * g``, which :mod:`.plan` reads as the layer's bias:
one int8 convolution with the bias in its post-ops, as in a ``quantize_static`` file.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tvm
from tvm import relax

from .._relax import constant_value, op_name


def _value(expr: relax.Expr, params: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """A batch norm operand as an array: a parameter's or a constant's; None otherwise."""
    value = constant_value(expr)
    if value is not None:
        return value
    if isinstance(expr, relax.Var) and expr.name in params:
        return np.asarray(params[expr.name])
    return None


def _conv_and_bias(x: relax.Expr, values: Mapping[relax.Var, relax.Expr], uses: Mapping[relax.Var, int],
                   params: Mapping[str, np.ndarray]) -> tuple[relax.Expr, np.ndarray | None]:
    """A batch norm's input as ``(conv var, its bias)``: ``x`` itself and None, or, where ``x`` is
    ``add(conv, b)`` read only by the batch norm with ``b`` one value per channel (a parameter or
    constant, possibly reshaped to ``[1, C, 1, 1]``: a torch ``Conv2d`` with ``bias=True``), the add's
    first operand and ``b`` as a 1-D array."""
    add = values.get(x)
    if not (isinstance(add, relax.Call) and op_name(add) == "relax.add" and uses.get(x, 0) == 1):
        return x, None
    b = add.args[1]
    while isinstance(b, relax.Var) and isinstance(values.get(b), relax.Call) and \
            op_name(values[b]) in ("relax.reshape", "relax.expand_dims"):
        b = values[b].args[0]
    arr = _value(b, params)
    channels = arr.size if arr is not None else 0
    if arr is None or arr.dtype != np.float32 or arr.shape not in ((channels,), (1, channels, 1, 1), (channels, 1, 1)):
        return x, None
    return add.args[0], arr.reshape(-1)


def _foldable(func: relax.Function, params: Mapping[str, np.ndarray]) -> dict[relax.Var, tuple]:
    """``{batch_norm var: (conv var, conv call, new weight, new bias)}`` for each inference batch norm
    over channel axis 1 whose input is an NCHW/OIHW ``conv2d`` of a parameter weight read by nothing
    else, and whose operands are parameters or constants."""
    bindings = [b for block in func.body.blocks for b in block.bindings if isinstance(b, relax.VarBinding)]
    uses: dict[relax.Var, int] = {}
    for b in bindings:
        relax.analysis.post_order_visit(
            b.value, lambda e: uses.__setitem__(e, uses.get(e, 0) + 1) if isinstance(e, relax.Var) else None)
    relax.analysis.post_order_visit(
        func.body.body, lambda e: uses.__setitem__(e, uses.get(e, 0) + 1) if isinstance(e, relax.Var) else None)
    values = {b.var: b.value for b in bindings}
    found = {}
    for b in bindings:
        call = b.value
        if not (isinstance(call, relax.Call) and op_name(call) == "relax.nn.batch_norm"):
            continue
        conv, bias = _conv_and_bias(call.args[0], values, uses, params)
        conv_call = values.get(conv)
        if (int(call.attrs.axis) != 1 or bool(call.attrs.training) or uses.get(conv, 0) != 1
                or not isinstance(conv_call, relax.Call) or op_name(conv_call) != "relax.nn.conv2d"
                or conv_call.attrs.data_layout != "NCHW" or conv_call.attrs.kernel_layout != "OIHW"
                or conv_call.attrs.out_layout != "NCHW"):
            continue
        w = _value(conv_call.args[1], params) if isinstance(conv_call.args[1], relax.Var) else None
        gamma, beta, mean, var = (_value(a, params) for a in call.args[1:5])
        if w is None or any(v is None for v in (gamma, beta, mean, var)) or w.dtype != np.float32 \
                or (bias is not None and bias.size != w.shape[0]):
            continue
        g = (gamma if call.attrs.scale else np.ones_like(var)) / np.sqrt(var + float(call.attrs.epsilon))
        shift = (beta if call.attrs.center else np.zeros_like(mean)) + ((0 if bias is None else bias) - mean) * g
        found[b.var] = (conv, conv_call, (w * g.reshape(-1, 1, 1, 1)).astype(np.float32), shift.astype(np.float32))
    return found


def fold_batch_norms(func: relax.Function, params: Mapping[str, np.ndarray]
                     ) -> tuple[relax.Function, dict[str, np.ndarray]]:
    """``func`` and ``params`` with each foldable batch norm (:func:`_foldable`) folded into its
    convolution: new weight and bias parameters (``<weight>_bn``, ``<weight>_bn_bias``), the batch
    norm's tuple read as ``conv + reshape(bias, [1, C, 1, 1])``; parameters nothing reads any more are
    dropped. ``(func, params)`` unchanged when there is none."""
    folds = _foldable(func, params)
    if not folds:
        return func, dict(params)
    new_params, new_values = [], {}
    conv_weight: dict[relax.Var, relax.Var] = {}
    bias_of: dict[relax.Var, tuple[relax.Var, relax.Var]] = {}
    for bn, (conv, conv_call, w, shift) in folds.items():
        name = conv_call.args[1].name + "_bn"
        wv = relax.Var(name, relax.TensorType(w.shape, "float32"))
        bv = relax.Var(name + "_bias", relax.TensorType(shift.shape, "float32"))
        new_params += [wv, bv]
        new_values[wv.name], new_values[bv.name] = w, shift
        conv_weight[conv] = wv
        bias_of[bn] = (conv, bv)
    blocks = []
    for block in func.body.blocks:
        out = []
        for b in block.bindings:
            value = b.value if isinstance(b, relax.VarBinding) else None
            if b.var in conv_weight:
                out.append(relax.VarBinding(b.var, relax.Call(value.op, [value.args[0], conv_weight[b.var]], value.attrs,
                                                              value.ty_args)))
            elif b.var in bias_of:
                continue  # read below, where its tuple is taken apart
            elif isinstance(value, relax.TupleGetItem) and value.tuple_value in bias_of and value.index == 0:
                conv, bv = bias_of[value.tuple_value]
                channels = int(bv.ty.shape[0])
                r = relax.Var(bv.name + "_r", relax.TensorType([1, channels, 1, 1], "float32"))
                out.append(relax.VarBinding(r, relax.op.reshape(bv, [1, channels, 1, 1])))
                out.append(relax.VarBinding(b.var, relax.op.add(conv, r)))
            else:
                out.append(b)
        blocks.append((relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock)(out))
    body = relax.SeqExpr(blocks, func.body.body)
    folded = relax.Function(list(func.params) + new_params, body, func.ret_ty, func.is_pure, func.attrs)
    mod = relax.transform.Normalize()(tvm.IRModule({"main": folded}))
    mod = relax.transform.DeadCodeElimination(["main"])(mod)
    folded = mod["main"]
    used = set()
    relax.analysis.post_order_visit(folded.body, lambda e: used.add(e) if isinstance(e, relax.Var) else None)
    keep = [p for p in folded.params if p in used or p.name not in {**params, **new_values}]
    folded = relax.Function(keep, folded.body, folded.ret_ty, folded.is_pure, folded.attrs)
    names = {p.name for p in keep}
    return folded, {k: v for k, v in {**params, **new_values}.items() if k in names}
