"""Relax rewrite: a float function into its QDQ form (what ``quantize_static`` files import as).

Given a :class:`~byoc_hetero.quant.plan.Plan` and the calibrated (scale, zero point) of its points,
:func:`insert_qdq` re-emits the function binding by binding:

- a point's value is followed by ``relax.quantize`` → ``relax.dequantize`` (per tensor, ``axis`` 1 as
  TVM's ONNX importer writes it, 0 for 1-D), and every later use reads the dequantized value;
- a layer's weight parameter becomes an int8 parameter (``<name>_quantized``, symmetric, per output
  channel when asked) read through ``relax.dequantize(..., axis=<output channel axis>)``, and its bias
  an int32 parameter (scale = input scale × weight scale, zero point 0) through ``relax.dequantize``,
  the form ``quantize_static`` writes and the int8 patterns read;
- a layer's relu goes: the quantization range of its output starts at 0, so ``quantize`` clips the
  negative values as the relu did (ONNX Runtime drops it the same way).

Why a rewrite of its own rather than Relax's pattern rewriter: every point needs its own calibrated
constants, and the weight parameters change type (float32 → int8), which changes ``main``'s signature.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from tvm import relax

from .plan import Layer, Plan, weight_qparams

QParams = tuple[np.float32, int, str]
"""(scale, zero point, quantized dtype) of an activation point."""


def substitute(expr: relax.Expr, env: Mapping[relax.Var, relax.Expr]) -> relax.Expr:
    """``expr`` with the variables of ``env`` replaced (calls, tuples and tuple items rebuilt)."""
    if isinstance(expr, relax.Var):
        return env.get(expr, expr)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([substitute(f, env) for f in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(substitute(expr.tuple_value, env), expr.index)
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [substitute(a, env) for a in expr.args], expr.attrs, expr.ty_args)
    return expr


def all_bindings(func: relax.Function) -> list[relax.Binding]:
    return [b for block in func.body.blocks for b in block.bindings]


def free_vars(expr: relax.Expr) -> list[relax.Var]:
    found: list[relax.Var] = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
    return found


class _Quantized:
    """The new parameters of the quantized function: int8 weights and int32 biases with their
    dequantize constants, built from the float values."""

    def __init__(self, layers: list[Layer], params: Mapping[str, np.ndarray], qparams: Mapping[relax.Var, QParams],
                 points: Mapping[relax.Var, relax.Var], per_channel: bool):
        self.vars: dict[str, relax.Var] = {}  # float parameter name → its quantized parameter
        self.values: dict[str, np.ndarray] = {}  # quantized parameter name → value
        self.dq: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}  # float name → (scale, zp, axis)
        self.weight_scales: dict[str, np.ndarray] = {}
        for layer in layers:
            if layer.weight is None or layer.weight in self.vars:
                continue
            axis = layer.weight_axis if per_channel else None
            q, scale = weight_qparams(params[layer.weight], axis)
            self._add(layer.weight, q, scale, np.zeros(scale.shape, np.int8), axis or 0)
            self.weight_scales[layer.weight] = scale
            if layer.bias is not None and layer.bias not in self.vars:
                in_scale = qparams[points[layer.inputs[0]]][0]
                b_scale = (np.float32(in_scale) * np.broadcast_to(scale, (layer.weight_shape[layer.weight_axis],))
                           ).astype(np.float32)
                b = np.asarray(params[layer.bias], np.float64)
                info = np.iinfo(np.int32)
                bq = np.clip(np.rint(b / b_scale), info.min, info.max).astype(np.int32)
                self._add(layer.bias, bq, b_scale, np.zeros(b_scale.shape, np.int32), 0)

    def _add(self, name: str, q: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int) -> None:
        new = f"{name}_quantized"
        self.vars[name] = relax.Var(new, relax.TensorType(q.shape, str(q.dtype)))
        self.values[new] = q
        self.dq[name] = (scale, zp, axis)


def _emit_qdq(bb: relax.BlockBuilder, value: relax.Expr, qp: QParams) -> relax.Var:
    scale, zp, dtype = qp
    ndim = value.ty.ndim
    axis = 1 if ndim > 1 else 0
    s, z = relax.const(np.float32(scale), "float32"), relax.const(zp, dtype)
    q = bb.emit(relax.op.quantize(value, s, z, axis=axis, out_dtype=dtype))
    return bb.emit(relax.op.dequantize(q, s, z, axis=axis, out_dtype="float32"))


def insert_qdq(func: relax.Function, plan: Plan, qparams: Mapping[relax.Var, QParams],
               params: Mapping[str, np.ndarray], per_channel: bool = True
               ) -> tuple[relax.Function, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``func`` in QDQ form (see the module docstring).

    Returns the new function, its new parameter values (int8 weights, int32 biases) and the weight
    scales by float weight name. ``qparams`` holds the (scale, zero point, dtype) of each point that
    takes its own range (``plan.points`` maps the others to the one whose parameters they share).
    """
    quantized = _Quantized(plan.layers, params, qparams, plan.points, per_channel)
    replaced = {p for p in func.params if p.name in quantized.vars}
    uses = set().union(*(layer.param_uses for layer in plan.layers)) if plan.layers else set()
    # a weight also read outside its layers (an embedding table tied to the output projection, as
    # GPT-2's) keeps its float parameter for those readers, as ONNX Runtime keeps the initializer
    still_float = {v for b in all_bindings(func) if b.var not in uses for v in free_vars(b.value)} \
        | set(free_vars(func.body.body))
    new_params = [p for p in func.params if p not in replaced or p in still_float] + \
        [quantized.vars[p.name] for p in replaced]
    attrs = {k: v for k, v in (func.attrs or {}).items() if k != "params"} if func.attrs is not None else None
    bb = relax.BlockBuilder()
    env: dict[relax.Var, relax.Expr] = {}
    dequantized: dict[relax.Var, relax.Expr] = {}  # a weight parameter -> its dequantized value

    def point(var: relax.Var, value: relax.Expr) -> relax.Expr:
        return _emit_qdq(bb, value, qparams[plan.points[var]]) if var in plan.points else value

    def dequantize_weights(expr: relax.Expr) -> None:
        for v in free_vars(expr):
            if v in replaced and v not in dequantized:
                scale, zp, axis = quantized.dq[v.name]
                dequantized[v] = bb.emit(relax.op.dequantize(
                    quantized.vars[v.name], relax.const(scale, "float32"), relax.const(zp, str(zp.dtype)),
                    axis=axis, out_dtype="float32"))

    with bb.function("main", new_params, attrs=attrs, pure=True):
        with bb.dataflow():
            for p in func.params:
                if p in plan.points:
                    env[p] = point(p, p)
            for block in func.body.blocks:
                for b in block.bindings:
                    reads = env
                    if b.var in uses:
                        dequantize_weights(b.value)
                        reads = {**env, **dequantized}
                    if b.var in plan.dropped:  # relu(x): the output's range starts at 0, quantize clips
                        env[b.var] = _emit_qdq(bb, substitute(b.value.args[0], reads), qparams[plan.points[b.var]])
                        continue
                    value = substitute(b.value, reads)
                    if isinstance(b, relax.MatchCast):
                        new = bb.match_cast(value, b.ty)
                    else:
                        new = bb.emit(value)
                    env[b.var] = point(b.var, new)
            out = bb.emit_output(substitute(func.body.body, env))
        bb.emit_func_output(out)
    return bb.get()["main"], quantized.values, quantized.weight_scales


def replaced_weights(func: relax.Function, new_func: relax.Function) -> set[str]:
    """Names of ``func``'s parameters that ``new_func`` no longer has (the float weights quantized)."""
    kept = {p.name for p in new_func.params}
    return {p.name for p in func.params if p.name not in kept}



