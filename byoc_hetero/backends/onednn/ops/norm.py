"""Normalizations: layer_norm, group_norm and batch_norm on its own (inference form).

* ``layer_norm`` over the trailing axes → a ``layer_norm`` node (oneDNN layer normalization over
  the data read as [rows, prod(trailing dims)]); also the decomposed form older ONNX exporters
  write (rule ``layer_norm_decomposed``: mean, subtract, power 2, mean, add epsilon, sqrt, divide,
  [multiply gamma], [add beta]), which becomes the same node;
* ``group_norm`` with channels on axis 1 over every later axis → a ``group_norm`` node;
* ``batch_norm`` (inference form) that does not follow a conv2d it can be folded into → a
  ``batch_norm`` node, with a following relu fused (rule ``batch_norm_relu``). The conv2d rules
  (priority 100 and up, :mod:`.conv2d`) are tried first, so a batch norm after a conv stays folded.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op, is_tuple_get_item, wildcard

from ...._relax import static_shape
from ....rules import Match
from ..epilogue import other_operand, tensors_reason
from ..precision import tensor_reason
from ..table import PatternSpec, lowers, lowers_composite, pattern_rules
from .conv2d import fold_batch_norm, inference_batch_norm_reason


def _epsilon_reason(eps: float, op: str) -> str | None:
    if not (math.isfinite(eps) and eps >= 0):
        return f"{op} epsilon {eps} must be finite and >= 0"
    return None


def _normalized_axes(axes, rank: int) -> list[int]:
    return sorted(int(a) % rank for a in axes)


def _affine_reason(match: Match, call: relax.Call, size: int, what: str) -> str | None:
    """gamma and beta must be float32 with ``size`` elements, and both applied.

    center=False / scale=False are refused: TVM's own kernels (the llvm build, topi) ignore the
    two flags and always apply beta and gamma (measured: layer_norm and group_norm with
    center=False still add beta), so an offloaded call honouring them would disagree with the
    same module built for llvm. The runtime's kernels can skip either (``has_scale`` /
    ``has_shift``, used by the decomposed layer norm)."""
    op = call.op.name.removeprefix("relax.nn.")
    if not (bool(call.attrs.center) and bool(call.attrs.scale)):
        return (f"{op} with center=False or scale=False: TVM's llvm kernel ignores these flags, "
                "so the offloaded result would differ from it")
    for name, arg in (("gamma", call.args[1]), ("beta", call.args[2])):
        reason = tensor_reason(arg, f"{op} {name}")
        if reason:
            return reason
        if math.prod(static_shape(arg)) != size:
            return f"{name} of shape {list(static_shape(arg))} does not have {size} elements ({what})"
    return None


# -- layer_norm ---------------------------------------------------------------------------------
def check_layer_norm(match: Match) -> str | None:
    """layer_norm of float32 data over its trailing axes (any number of them); the leading dims
    may be symbolic (batch, sequence: the kernel is planned per binding), the normalized ones
    are static (gamma and beta have their size)."""
    reason = tensors_reason(match, ["data", "root"], symbolic=True)
    if reason:
        return reason
    call = match.expr("root")
    shape = match.shape("data")
    rank = len(shape)
    if rank == 0:
        return "layer_norm of a scalar"
    axes = _normalized_axes(call.attrs.axes, rank)
    if not axes or axes != list(range(rank - len(axes), rank)):
        return (f"layer_norm over axes {[int(a) for a in call.attrs.axes]} of rank-{rank} data; "
                "the runtime normalizes over the trailing axes only")
    if any(not isinstance(d, int) for d in shape[rank - len(axes):]):
        return f"layer_norm over the symbolic axes of {list(shape)}; the normalized dims must be static"
    size = math.prod(shape[rank - len(axes):])
    return (_epsilon_reason(float(call.attrs.epsilon), "layer_norm")
            or _affine_reason(match, call, size, "the normalized axes' size"))


def _data_gamma_beta(ctx, call: relax.Call) -> list[int]:
    """Tensor ids of a layer_norm / group_norm call's data, gamma, beta (the checks accept only
    center=scale=True, so both are applied: ``has_scale = has_shift = 1``)."""
    return [ctx.data_of(call.args[0]), ctx.lookup(call.args[1]), ctx.lookup(call.args[2])]


@lowers("relax.nn.layer_norm", check=check_layer_norm)
def lower_layer_norm(ctx, var: relax.Var, call: relax.Call) -> int:
    attrs = {"epsilon": float(call.attrs.epsilon), "axis_count": len(call.attrs.axes), "has_scale": 1, "has_shift": 1}
    return ctx.emit("layer_norm", _data_gamma_beta(ctx, call), var, attrs)


# -- layer_norm, decomposed (ONNX exporters before opset 17) -------------------------------------
def _decomposed_layer_norm() -> tuple[DFPattern, dict[str, DFPattern]]:
    """mean → subtract → power(·, 2) → mean → add(eps) → sqrt → divide, as TVM imports a
    LayerNormalization that an exporter spelled out; [multiply(gamma)] [add(beta)] follow."""
    x = wildcard()
    mean = is_op("relax.mean")(x)
    diff = is_op("relax.subtract")(x, mean)
    square = is_op("relax.power")(diff, is_const())
    var = is_op("relax.mean")(square)
    eps = is_const()
    shifted = is_op("relax.add")(var, eps)
    root = is_op("relax.sqrt")(shifted)
    norm = is_op("relax.divide")(diff, root)
    names = {"data": x, "mean": mean, "diff": diff, "square": square, "var": var, "eps": eps,
             "eps_add": shifted, "norm": norm}
    return norm, names


_CONSTANTS = (tvm.ir.Constant, tvm.ir.GenericConst)


def _decomposed_instance_norm() -> tuple[DFPattern, dict[str, DFPattern]]:
    """mean → subtract, variance → add(eps) → sqrt → divide: how TVM imports ONNX
    InstanceNormalization (which exporters before opset 18 also write for GroupNorm, on the data
    reshaped to [N, groups, -1]); [multiply(scale)] [add(bias)] per channel follow."""
    x = wildcard()
    mean = is_op("relax.mean")(x)
    diff = is_op("relax.subtract")(x, mean)
    var = is_op("relax.variance")(x)
    eps = is_const()
    shifted = is_op("relax.add")(var, eps)
    norm = is_op("relax.divide")(diff, is_op("relax.sqrt")(shifted))
    names = {"data": x, "mean": mean, "diff": diff, "var": var, "eps": eps, "eps_add": shifted, "norm": norm}
    return norm, names


def _with_affine(out: DFPattern, names: dict[str, DFPattern], gamma: bool, beta: bool):
    """[multiply(gamma)] [add(beta)] after ``out``; each operand maybe reshaped first."""
    for flag, op, name in ((gamma, "relax.multiply", "gamma"), (beta, "relax.add", "beta")):
        if flag:
            value = wildcard()
            out = is_op(op)(out, is_op("relax.reshape")(value, wildcard()) | value)
            names.update({name: value, f"{name}_op": out})
    names["root"] = out
    return out, names


def _scalar(expr: relax.Expr) -> float | None:
    """The value of a one-element float constant, or None."""
    if not isinstance(expr, _CONSTANTS):
        return None
    data = (expr.value if isinstance(expr, tvm.ir.GenericConst) else expr.data).numpy()
    return float(data.reshape(-1)[0]) if data.size == 1 else None


def _decomposed_tail_reason(match: Match, shape: tuple[int, ...], per: tuple[int, ...], what: str) -> str | None:
    """The epsilon of a decomposed normalization must be a constant number >= 0; its [multiply]
    [add] operands (after any reshape) broadcast as ``per`` (the data's rank) and keep the shape."""
    eps = _scalar(match.expr("eps"))
    if eps is None:
        return f"the decomposed {what}'s epsilon is not a one-element constant"
    reason = _epsilon_reason(eps, what)
    if reason:
        return reason
    chain = match.expr("norm")
    for name in ("gamma", "beta"):
        if not match.has(name):
            continue
        reason = tensor_reason(match.expr(name), name)
        if reason:
            return reason
        operand = other_operand(match, match.expr(f"{name}_op"), chain)
        operand_shape = tuple(static_shape(operand) or ()) if operand is not None else (-1,)
        aligned = (1,) * (len(shape) - len(operand_shape)) + operand_shape
        if len(operand_shape) > len(shape) or aligned != per:
            return f"the {what}'s {name} of shape {list(operand_shape)} does not broadcast as {list(per)}"
        chain = match.expr(f"{name}_op")
        if static_shape(chain) != tuple(shape):
            return f"the {what}'s {name} changes the shape"
    return None


def check_layer_norm_decomposed(match: Match) -> str | None:
    """The decomposition must be a layer norm over the trailing axes with a constant epsilon and a
    square; gamma / beta hold one value per normalized element."""
    names = ["data", "mean", "diff", "square", "var", "eps_add", "norm", "root"]
    reason = tensors_reason(match, [n for n in names if match.has(n)])
    if reason:
        return reason
    shape = match.shape("data")
    rank = len(shape)
    if rank == 0:
        return "layer norm of a scalar"
    mean, var = match.expr("mean"), match.expr("var")
    if mean.attrs.axis is None or var.attrs.axis is None:
        return "mean over all axes is not a layer norm"
    axes = _normalized_axes(mean.attrs.axis, rank)
    if axes != _normalized_axes(var.attrs.axis, rank) or axes != list(range(rank - len(axes), rank)):
        return "the two means of the decomposed layer norm are not over the same trailing axes"
    if not (bool(mean.attrs.keepdims) and bool(var.attrs.keepdims)):
        return "the decomposed layer norm's means must keep their dims"
    if _scalar(match.expr("square").args[1]) != 2.0:
        return "the decomposed layer norm does not square the difference (power exponent is not 2)"
    k = len(axes)
    return _decomposed_tail_reason(match, shape, (1,) * (rank - k) + tuple(shape[rank - k:]), "layer norm")


def check_instance_norm_decomposed(match: Match) -> str | None:
    """An instance norm: statistics over every axis after axis 1 of rank >= 3 data (mean and
    variance over the same axes, keepdims), constant epsilon, scale / bias one per channel."""
    names = ["data", "mean", "diff", "var", "eps_add", "norm", "root"]
    reason = tensors_reason(match, names)
    if reason:
        return reason
    shape = match.shape("data")
    rank = len(shape)
    if rank < 3:
        return f"instance norm of rank-{rank} data; the runtime needs channels on axis 1 and spatial axes"
    mean, var = match.expr("mean"), match.expr("var")
    spatial = list(range(2, rank))
    for call in (mean, var):
        if call.attrs.axis is None or _normalized_axes(call.attrs.axis, rank) != spatial \
                or not bool(call.attrs.keepdims):
            return f"the decomposed instance norm's statistics are not over the axes {spatial} (keepdims)"
    return _decomposed_tail_reason(match, shape, (1, shape[1]) + (1,) * (rank - 2), "instance norm")


@pattern_rules
def _rules():
    data, gamma, beta = wildcard(), wildcard(), wildcard()
    call = is_op("relax.nn.layer_norm")(data, gamma, beta)
    yield PatternSpec("layer_norm", call, {"data": data, "root": call}, check_layer_norm, priority=50)

    # largest first: [gamma] [beta]; the add/multiply match either operand order
    for with_gamma, with_beta in ((True, True), (True, False), (False, True), (False, False)):
        suffix = ("_scale" if with_gamma else "") + ("_shift" if with_beta else "")
        out, names = _with_affine(*_decomposed_layer_norm(), with_gamma, with_beta)
        yield PatternSpec("layer_norm_decomposed" + suffix, out, names, check_layer_norm_decomposed,
                          priority=130 + with_gamma + with_beta)
        out, names = _with_affine(*_decomposed_instance_norm(), with_gamma, with_beta)
        yield PatternSpec("instance_norm_decomposed" + suffix, out, names, check_instance_norm_decomposed,
                          priority=130 + with_gamma + with_beta)

    # group_norm, batch_norm on its own: below the conv2d rules (100+), which fold a batch norm
    data, gamma, beta = wildcard(), wildcard(), wildcard()
    call = is_op("relax.nn.group_norm")(data, gamma, beta)
    yield PatternSpec("group_norm", call, {"data": data, "root": call}, check_group_norm, priority=50)

    for relu in (True, False):
        data = wildcard()
        bn = is_op("relax.nn.batch_norm")(data, wildcard(), wildcard(), wildcard(), wildcard())
        names = {"data": data, "bn": bn}
        out = bn
        if relu:
            out = is_op("relax.nn.relu")(is_tuple_get_item(bn, 0))
            names["act"] = out
        names["root"] = out
        yield PatternSpec("batch_norm_relu" if relu else "batch_norm", out, names, check_batch_norm,
                          priority=51 + relu)


def _lower_decomposed(ctx, func: relax.Function, op: str, attrs_of) -> int:
    """A decomposed normalization composite as one ``op`` node: its data (the first mean's
    operand), then gamma / beta (the operands of the multiply / add after the divide, looking
    through a reshape); ``attrs_of(first_mean)`` gives the op's own attrs."""
    bindings = [b for block in func.body.blocks for b in block.bindings]
    ops = [b.value.op.name for b in bindings]
    mean, eps_add = bindings[ops.index("relax.mean")].value, bindings[ops.index("relax.add")].value
    eps = next(a for a in eps_add.args if isinstance(a, _CONSTANTS))
    reshaped = {b.var: b.value.args[0] for b in bindings if b.value.op.name == "relax.reshape"}
    divide = ops.index("relax.divide")
    chain, extra = bindings[divide].var, {}
    for binding in bindings[divide + 1:]:
        call = binding.value
        if call.op.name == "relax.reshape":
            continue
        operand = call.args[1] if call.args[0].same_as(chain) else call.args[0]
        extra["gamma" if call.op.name == "relax.multiply" else "beta"] = reshaped.get(operand, operand)
        chain = binding.var
    inputs = [ctx.data_of(mean.args[0])] + [ctx.lookup(extra[n]) for n in ("gamma", "beta") if n in extra]
    attrs = {**attrs_of(mean), "epsilon": _scalar(eps), "has_scale": int("gamma" in extra),
             "has_shift": int("beta" in extra)}
    return ctx.emit(op, inputs, chain, attrs)


@lowers_composite("layer_norm_decomposed", "layer_norm_decomposed_scale", "layer_norm_decomposed_shift",
                  "layer_norm_decomposed_scale_shift")
def lower_layer_norm_decomposed(ctx, func: relax.Function) -> int:
    """The whole decomposed chain (a composite of rule ``layer_norm_decomposed*``) as one ``layer_norm``."""
    return _lower_decomposed(ctx, func, "layer_norm", lambda mean: {"axis_count": len(mean.attrs.axis)})


@lowers_composite("instance_norm_decomposed", "instance_norm_decomposed_scale", "instance_norm_decomposed_shift",
                  "instance_norm_decomposed_scale_shift")
def lower_instance_norm_decomposed(ctx, func: relax.Function) -> int:
    """The decomposed instance norm as one ``group_norm`` node with a group per channel."""
    return _lower_decomposed(ctx, func, "group_norm", lambda mean: {"groups": static_shape(mean.args[0])[1]})


# -- group_norm ---------------------------------------------------------------------------------
def check_group_norm(match: Match) -> str | None:
    """group_norm of float32 data with channels on axis 1, statistics over every later axis."""
    reason = tensors_reason(match, ["data", "root"])
    if reason:
        return reason
    call = match.expr("root")
    a = call.attrs
    shape = match.shape("data")
    rank = len(shape)
    if rank < 2:
        return f"group_norm of rank-{rank} data; the runtime needs channels on axis 1 of rank >= 2 data"
    if int(a.channel_axis) % rank != 1:
        return f"group_norm with channels on axis {int(a.channel_axis)}; the runtime runs channel axis 1"
    if _normalized_axes(a.axes, rank) != list(range(2, rank)):
        return (f"group_norm over axes {[int(x) for x in a.axes]}; the runtime takes the statistics over "
                f"every axis after the channels ({list(range(2, rank))})")
    groups = int(a.num_groups)
    if groups < 1 or shape[1] % groups:
        return f"group_norm with {groups} groups of {shape[1]} channels"
    return (_epsilon_reason(float(a.epsilon), "group_norm")
            or _affine_reason(match, call, shape[1], "one per channel"))


@lowers("relax.nn.group_norm", check=check_group_norm)
def lower_group_norm(ctx, var: relax.Var, call: relax.Call) -> int:
    attrs = {"groups": int(call.attrs.num_groups), "epsilon": float(call.attrs.epsilon), "has_scale": 1, "has_shift": 1}
    return ctx.emit("group_norm", _data_gamma_beta(ctx, call), var, attrs)


# -- batch_norm on its own ----------------------------------------------------------------------
def check_batch_norm(match: Match) -> str | None:
    """Inference-form batch_norm of float32 data, channels on axis 1, per-channel statistics."""
    bn = match.expr("bn") if match.has("bn") else match.expr("root")
    reason = tensor_reason(bn.args[0], "data")
    if reason:
        return reason
    shape = static_shape(bn.args[0])
    if len(shape) < 2:
        return f"batch_norm of rank-{len(shape)} data; the runtime needs channels on axis 1"
    return inference_batch_norm_reason(bn, shape)


@lowers("relax.nn.batch_norm", check=check_batch_norm)
def lower_batch_norm(ctx, var: relax.Var, call: relax.Call) -> tuple[int, ...]:  # noqa: ARG001
    """Folded into the conv2d this composite opened on the data, else a ``batch_norm`` node.

    Returns batch_norm's tuple: the result, then the moving mean and variance (which the
    inference form passes through)."""
    folded = fold_batch_norm(ctx, call)
    if folded is not None:
        return folded
    stats = [ctx.lookup(a) for a in call.args[1:5]]
    out = ctx.emit("batch_norm", [ctx.data_of(call.args[0]), *stats], None,
                   {"epsilon": float(call.attrs.epsilon), "activation": "none"},
                   shape=static_shape(call.args[0]))
    return out, stats[2], stats[3]
