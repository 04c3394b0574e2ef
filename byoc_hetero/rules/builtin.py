"""The built-in rules of target ``byoc_hetero``: what the oneDNN runtime can run.

Pattern rules, tried largest first (priority = 100 + ops covered for conv2d / dense):

==============================  ===============================================================
rules                           match
==============================  ===============================================================
``conv2d[_bias][_bn][_act]``    conv2d → [add(bias)] → [batch_norm (inference form)] →
``[_res|_res2[_act]]``          [activation] → [add(residual) → [activation]]: 40 rules, e.g.
                                ``conv2d_bias_relu``, ``conv2d_bn_act``, ``conv2d_bias_res_act``;
                                ``_res`` matches add(y, residual), ``_res2`` add(residual, y)
``dense[_flat][_bias][_act]``   [reshape →] matmul(x, W or permute_dims(W)) → [add(bias)] →
``[_res|_res2[_act]]``          [activation] → [add(residual) → [activation]]; a 2-D W is a dense
                                layer, a W of rank >= 3 a batched matmul (both operands may be
                                run-time values)
``..._relu``                    the relu-only twins of the ``_act`` rules without batch norm or
                                residual keep the classic names: ``conv2d_bias_relu``,
                                ``conv2d_relu``, ``dense_bias_relu``, ``dense_flat_bias_relu``, ...
``max_pool2d``, ``avg_pool2d``  pooling of NCHW data
``adaptive_avg_pool2d``         adaptive average pooling whose windows divide the input (global)
``global_avg_pool``             mean over the spatial axes of NCHW data
``softmax``                     softmax along any axis
``add_act``, ``add``            add with broadcasting, [activation]
``multiply_act``, ``multiply``  multiply with broadcasting, [activation]
``activation``                  relu, clip, sigmoid, tanh, gelu, gelu_tanh, silu on their own
==============================  ===============================================================

Activations (relu, clip — relu6 is clip(x, 0, 6) — sigmoid, tanh, gelu, gelu_tanh, silu) and the
residual add run as oneDNN post-ops of the convolution / matmul; batch norm is folded into the
convolution's weights and bias when the module is loaded. The bias may be reshaped first
(``add(y, reshape(b, [1, C, 1, 1]))``, as TVM's ONNX and PyTorch frontends emit).

Every rule's check rejects, with the reason, what the runtime cannot run — non-float32 tensors,
symbolic shapes, layouts other than NCHW/OIHW, a bias that is not per output channel, a residual
of another shape, batch norm in training form, broadcasting on both sides of an add — and the
rejected call stays with TVM.
"""

from __future__ import annotations

import itertools
import math

import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, is_tuple_get_item, wildcard

from .registry import Match, register_pattern, register_target, static_shape, tensor_dtype

TARGET = "byoc_hetero"
FLOAT = "float32"

#: Relax activation ops and the runtime's names for them.
ACTIVATIONS = {
    "relax.nn.relu": "relu",
    "relax.clip": "clip",
    "relax.sigmoid": "sigmoid",
    "relax.tanh": "tanh",
    "relax.nn.gelu": "gelu_erf",
    "relax.nn.gelu_tanh": "gelu_tanh",
    "relax.nn.silu": "silu",
}
POOL_OPS = ("relax.nn.max_pool2d", "relax.nn.avg_pool2d")


# ----------------------------------------------------------------------------------------------
# Checks (None = accept, str = the reason for rejecting)
# ----------------------------------------------------------------------------------------------
def _float32_static(match: Match, names: list[str]) -> str | None:
    for name in names:
        if not match.has(name):
            continue
        reason = _tensor_reason(match.expr(name), name)
        if reason:
            return reason
    return None


def _tensor_reason(expr: relax.Expr, name: str) -> str | None:
    dtype = tensor_dtype(expr)
    if dtype != FLOAT:
        return f"{name} has dtype {dtype or 'non-tensor'}; the runtime runs float32 only"
    if static_shape(expr) is None:
        return f"{name} has a symbolic or unknown shape {expr.ty}; the runtime needs static shapes"
    return None


def _numel(shape) -> int:
    return int(math.prod(shape))


def is_per_channel(shape: tuple[int, ...], out_shape: tuple[int, ...], channel_axis: int) -> bool:
    """Whether an operand of ``shape`` holds one value per channel of ``out_shape`` (broadcast)."""
    if len(shape) > len(out_shape):
        return False
    aligned = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    axis = channel_axis % len(out_shape)
    return all(dim == (out_shape[axis] if i == axis else 1) for i, dim in enumerate(aligned))


def _check_bias(match: Match, out_shape: tuple[int, ...], channel_axis: int) -> str | None:
    """The added operand must hold one value per output channel (broadcast along the rest)."""
    if not match.has("bias_add"):
        return None
    add = match.expr("bias_add")
    # add is matched either way round: add(y, b) (ONNX) or add(b, y) (PyTorch's linear)
    operand = other_operand(match, add, match.expr("anchor"))
    if operand is None:
        return "the bias add adds the convolution / matmul result to itself"
    reason = _tensor_reason(operand, "bias")
    if reason:
        return reason
    shape = static_shape(operand)
    if not is_per_channel(shape, out_shape, channel_axis):
        return (
            f"bias of shape {list(shape)} is not one value per output channel "
            f"of an output shaped {list(out_shape)}"
        )
    if static_shape(add) != out_shape:
        return f"bias add changes the shape {list(out_shape)} -> {static_shape(add)}"
    return None


def other_operand(match: Match, add: relax.Call, chain: relax.Expr) -> relax.Expr | None:
    """The operand of ``add`` that is not the value ``chain`` computed inside the match."""
    first, second = add.args[0], add.args[1]
    first_is, second_is = match.value(first).same_as(chain), match.value(second).same_as(chain)
    if first_is == second_is:
        return None
    return second if first_is else first


def _number(expr) -> float | None:
    """The value of a constant scalar argument (clip bounds), or None."""
    value = expr
    for _ in range(3):  # IntImm / FloatImm, or a wrapper of one (a PrimValue)
        if isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
            return float(value.value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        value = getattr(value, "value", None)
    return None


def activation_of(call: relax.Call) -> tuple[str, list[float] | None] | str:
    """(runtime name, clip bounds or None) of an activation call, or the reason it cannot run."""
    op = call.op.name if isinstance(call.op, tvm.ir.Op) else str(call.op)
    if op not in ACTIVATIONS:
        return f"{op} is not an activation the runtime fuses"
    if op == "relax.clip":
        lo, hi = _number(call.args[1]), _number(call.args[2])
        if lo is None or hi is None:
            return "clip bounds must be constant numbers"
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            return f"clip bounds [{lo}, {hi}] must be finite with min <= max"
        return "clip", [lo, hi]
    return ACTIVATIONS[op], None


def _check_activation(match: Match, name: str) -> str | None:
    if not match.has(name):
        return None
    act = activation_of(match.expr(name))
    if isinstance(act, str):
        return act
    return _tensor_reason(match.expr(name), name)


def _check_residual(match: Match, out_shape: tuple[int, ...]) -> str | None:
    """The residual add: the other operand has exactly the output's shape (a sum post-op)."""
    if not match.has("residual_add"):
        return None
    residual = other_operand(match, match.expr("residual_add"), match.expr("pre_res"))
    if residual is None:
        return "the residual add adds the result to itself"
    reason = _tensor_reason(residual, "residual")
    if reason:
        return reason
    shape = static_shape(residual)
    if shape != out_shape:
        return (
            f"residual of shape {list(shape)} is not the output's shape {list(out_shape)} "
            "(the runtime adds it as a sum post-op)"
        )
    if static_shape(match.expr("residual_add")) != out_shape:
        return f"residual add changes the shape {list(out_shape)}"
    return None


def _check_batch_norm(match: Match, out_shape: tuple[int, ...]) -> str | None:
    if not match.has("bn"):
        return None
    bn = match.expr("bn")
    attrs = bn.attrs
    if bool(attrs.training):
        return "batch_norm in training form (batch statistics); only inference form is folded"
    if not (bool(attrs.center) and bool(attrs.scale)):
        return "batch_norm with center=False or scale=False is not folded"
    if int(attrs.axis) % len(out_shape) != 1:
        return f"batch_norm over axis {int(attrs.axis)}; only the channel axis 1 is folded"
    eps = float(attrs.epsilon)
    if not (math.isfinite(eps) and eps >= 0):
        return f"batch_norm epsilon {eps} must be finite and >= 0"
    for name, arg in zip(("gamma", "beta", "mean", "var"), bn.args[1:5]):
        reason = _tensor_reason(arg, f"batch_norm {name}")
        if reason:
            return reason
        if _numel(static_shape(arg)) != out_shape[1]:
            return f"batch_norm {name} of shape {list(static_shape(arg))} is not one value per channel"
    return None


def check_conv2d(match: Match) -> str | None:
    """conv2d with its optional epilogue, as the runtime runs it."""
    reason = _float32_static(match, ["data", "weight", "anchor"])
    if reason:
        return reason
    conv = match.expr("anchor")
    attrs = conv.attrs
    if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW":
        return (
            f"conv2d layout {attrs.data_layout}/{attrs.kernel_layout}; "
            "the runtime runs NCHW data with OIHW weights"
        )
    if str(attrs.out_layout) not in ("NCHW", ""):
        return f"conv2d out_layout {attrs.out_layout}; the runtime writes NCHW"
    if attrs.out_dtype is not None and str(attrs.out_dtype) not in ("", FLOAT, "void"):
        return f"conv2d out_dtype {attrs.out_dtype}; the runtime writes float32"
    if len(match.shape("data")) != 4 or len(match.shape("weight")) != 4:
        return f"conv2d needs 4-D data and weight, got {match.shape('data')} and {match.shape('weight')}"
    out_shape = match.shape("anchor")
    return (
        _check_bias(match, out_shape, channel_axis=1)
        or _check_batch_norm(match, out_shape)
        or _check_activation(match, "act")
        or _check_residual(match, out_shape)
        or _check_activation(match, "post_act")
    )


def check_dense(match: Match) -> str | None:
    """matmul of data by a weight (2-D: dense; rank >= 3: batched), optional epilogue."""
    reason = _float32_static(match, ["data", "weight", "anchor", "flat_in"])
    if reason:
        return reason
    data_shape, weight_shape = match.shape("data"), match.shape("weight")
    if len(data_shape) < 2 or len(weight_shape) < 2:
        return (
            f"matmul needs operands of rank >= 2, got shapes {list(data_shape)} and "
            f"{list(weight_shape)}"
        )
    if len(data_shape) > 12 or len(weight_shape) > 12:
        return "matmul operands of rank > 12"
    out_dtype = match.expr("anchor").attrs.out_dtype
    if out_dtype is not None and str(out_dtype) not in ("", FLOAT, "void"):
        return f"matmul out_dtype {out_dtype}; the runtime writes float32"
    if match.has("transpose"):
        axes = match.expr("transpose").attrs.axes
        rank = len(weight_shape)
        swap_last = list(range(rank - 2)) + [rank - 1, rank - 2]
        if axes is not None and [int(a) for a in axes] != swap_last:
            return f"permute_dims axes {[int(a) for a in axes]} does not swap the last two axes"
    if len(weight_shape) > 2:
        rank = max(len(data_shape), len(weight_shape))
        a = (1,) * (rank - len(data_shape)) + tuple(data_shape[:-2])
        b = (1,) * (rank - len(weight_shape)) + tuple(weight_shape[:-2])
        if match.has("transpose"):
            b = (1,) * (rank - len(weight_shape)) + tuple(static_shape(match.expr("transpose"))[:-2])
        for x, y in zip(a, b):
            if x != y and 1 not in (x, y):
                return f"batch dims of {list(data_shape)} and {list(weight_shape)} do not broadcast"
    out_shape = match.shape("anchor")
    return (
        _check_bias(match, out_shape, channel_axis=-1)
        or _check_activation(match, "act")
        or _check_residual(match, out_shape)
        or _check_activation(match, "post_act")
    )


def _pool_window_reason(in_size, kernel, stride, pad_begin, pad_end, dilation, ceil_mode, avg_incl, avg_excl):
    """Mirror of the runtime's pool2d checks for one spatial axis (None = fine)."""
    extent = (kernel - 1) * dilation + 1
    span = in_size + pad_begin + pad_end - extent
    if span < 0:
        return "the pooling window is larger than the padded input"
    floor_out = span // stride + 1
    out = (span + stride - 1) // stride + 1 if ceil_mode else floor_out
    if ceil_mode and out != floor_out and avg_incl:
        return "ceil_mode with count_include_pad changes the output size; not supported"
    eff_end = max(pad_end, (out - 1) * stride + extent - in_size - pad_begin)
    if pad_begin >= extent or eff_end >= extent:
        return "padding would put a whole pooling window in the padding"
    return None


def check_pool2d(match: Match) -> str | None:
    """max_pool2d / avg_pool2d on NCHW float32 data."""
    reason = _float32_static(match, ["data", "root"])
    if reason:
        return reason
    call = match.expr("root")
    a = call.attrs
    if str(a.layout) != "NCHW" or str(a.out_layout) not in ("NCHW", ""):
        return f"pooling layout {a.layout}/{a.out_layout}; the runtime runs NCHW"
    shape = match.shape("data")
    if len(shape) != 4:
        return f"pooling needs 4-D data, got {list(shape)}"
    is_avg = call.op.name == "relax.nn.avg_pool2d"
    incl = is_avg and bool(a.count_include_pad)
    pad = [int(p) for p in a.padding]
    for i in range(2):
        reason = _pool_window_reason(
            shape[2 + i], int(a.pool_size[i]), int(a.strides[i]), pad[i], pad[i + 2],
            int(a.dilation[i]), bool(a.ceil_mode), incl, is_avg and not incl,
        )
        if reason:
            return reason
    return None


def check_adaptive_avg_pool2d(match: Match) -> str | None:
    reason = _float32_static(match, ["data", "root"])
    if reason:
        return reason
    a = match.expr("root").attrs
    if str(a.layout) != "NCHW" or str(a.out_layout) not in ("NCHW", ""):
        return f"pooling layout {a.layout}/{a.out_layout}; the runtime runs NCHW"
    shape, out = match.shape("data"), match.shape("root")
    if len(shape) != 4:
        return f"pooling needs 4-D data, got {list(shape)}"
    if shape[2] % out[2] or shape[3] % out[3]:
        return f"adaptive pooling {list(shape[2:])} -> {list(out[2:])} has uneven windows"
    return None


def spatial_mean_axes(call: relax.Call) -> str | None:
    """Why a mean is not a global average pooling over the spatial axes of 4-D data (None = it is)."""
    shape = static_shape(call.args[0])
    if shape is None or len(shape) != 4:
        return "mean is offloaded only as global average pooling of 4-D NCHW data"
    axes = call.attrs.axis
    if axes is None:
        return "mean over all axes is not a spatial pooling"
    if sorted(int(x) % 4 for x in axes) != [2, 3]:
        return f"mean over axes {[int(x) for x in axes]} is not over the spatial axes [2, 3]"
    return None


def check_mean(match: Match) -> str | None:
    return _float32_static(match, ["data", "root"]) or spatial_mean_axes(match.expr("root"))


def check_softmax(match: Match) -> str | None:
    reason = _float32_static(match, ["data", "root"])
    if reason:
        return reason
    if len(match.shape("data")) == 0:
        return "softmax of a scalar"
    return None


def check_binary(match: Match) -> str | None:
    """add / multiply with broadcasting where one operand already has the output's shape."""
    call = match.expr("binary")
    for i, arg in enumerate(call.args[:2]):
        reason = _tensor_reason(arg, f"operand {i}")
        if reason:
            return reason
    reason = _tensor_reason(call, "result")
    if reason:
        return reason
    out = static_shape(call)
    shapes = [static_shape(arg) for arg in call.args[:2]]
    if not any(s == out for s in shapes):
        return (
            f"neither operand of shapes {[list(s) for s in shapes]} has the output shape "
            f"{list(out)}: the runtime broadcasts only one side"
        )
    return _check_activation(match, "act")


def check_activation(match: Match) -> str | None:
    return _float32_static(match, ["root"]) or _check_activation(match, "root")


# ----------------------------------------------------------------------------------------------
# Patterns
# ----------------------------------------------------------------------------------------------
def activation_pattern(x: DFPattern) -> DFPattern:
    """Any activation the runtime knows, applied to ``x``."""
    alts = [
        is_op(op)(x, wildcard(), wildcard()) if op == "relax.clip" else is_op(op)(x)
        for op in ACTIVATIONS
    ]
    pattern = alts[0]
    for alt in alts[1:]:
        pattern = pattern | alt
    return pattern


def _conv2d_anchor(flatten: bool = False) -> tuple[DFPattern, dict[str, DFPattern]]:
    data, weight = wildcard(), wildcard()
    anchor = is_op("relax.nn.conv2d")(data, weight)
    return anchor, {"data": data, "weight": weight, "anchor": anchor}


def _dense_anchor(flatten: bool = False) -> tuple[DFPattern, dict[str, DFPattern]]:
    data, weight = wildcard(), wildcard()
    names = {"weight": weight}
    if flatten:
        flat_in = wildcard()
        data = is_op("relax.reshape")(flat_in, wildcard())
        names["flat_in"] = flat_in
        names["flatten"] = data
    transpose = is_op("relax.permute_dims")(weight)
    anchor = is_op("relax.matmul")(data, transpose | weight)
    names.update(data=data, anchor=anchor, transpose=transpose)
    return anchor, names


def with_epilogue(
    anchor: DFPattern,
    names: dict[str, DFPattern],
    bias: bool,
    relu: bool = False,
    *,
    bn: bool = False,
    act: bool = False,
    residual: bool = False,
    post_act: bool = False,
    residual_first: bool = False,
) -> tuple[DFPattern, dict[str, DFPattern]]:
    """Extend an anchor with [bias add (bias maybe reshaped)] [batch_norm] [relu | activation]
    [residual add [activation]]."""
    out, names = anchor, dict(names)
    if bias:
        value = wildcard()
        operand = is_op("relax.reshape")(value, wildcard()) | value
        out = is_op("relax.add")(out, operand)
        names["bias"] = value
        names["bias_add"] = out
    if bn:
        call = is_op("relax.nn.batch_norm")(out, wildcard(), wildcard(), wildcard(), wildcard())
        names["bn"] = call
        # FuseOpsByPattern matches only at calls: a batch norm that ends the pattern is its root
        # (the composite returns batch_norm's tuple, element 0 is read outside)
        out = is_tuple_get_item(call, 0) if (relu or act or residual) else call
    if relu:
        out = is_op("relax.nn.relu")(out)
        names["act"] = out
    elif act:
        out = activation_pattern(out)
        names["act"] = out
    if residual:
        names["pre_res"] = out
        other = wildcard()
        # relax.add patterns match either way round, but the operand order written here is tried
        # first, and a match whose check fails is not retried the other way round: both orders
        # get a rule (add(y, x) as ResNet has it, add(x, y) as MobileNetV2 has it)
        out = is_op("relax.add")(other, out) if residual_first else is_op("relax.add")(out, other)
        names["residual"] = other
        names["residual_add"] = out
        if post_act:
            out = activation_pattern(out)
            names["post_act"] = out
    return out, names


def _single_call_match(call: relax.Call) -> Match:
    names = {"root": call, "anchor": call}
    if call.args:
        names["data"] = call.args[0]
    if len(call.args) >= 2:
        names["weight"] = call.args[1]
    op = call.op.name
    if op in ("relax.add", "relax.multiply"):
        names["binary"] = call
    return Match(call, names)


_SINGLE_CHECKS = {
    "relax.nn.conv2d": check_conv2d,
    "relax.matmul": check_dense,
    "relax.nn.max_pool2d": check_pool2d,
    "relax.nn.avg_pool2d": check_pool2d,
    "relax.nn.adaptive_avg_pool2d": check_adaptive_avg_pool2d,
    "relax.mean": check_mean,
    "relax.nn.softmax": check_softmax,
    "relax.add": check_binary,
    "relax.multiply": check_binary,
    **{op: check_activation for op in ACTIVATIONS},
}


def can_lower(call: relax.Call) -> str | None:
    """Whether the runtime has a kernel for this single call (guards op-attribute rules)."""
    op = call.op.name
    check = _SINGLE_CHECKS.get(op)
    if check is None:
        known = ", ".join(sorted(o.removeprefix("relax.") for o in _SINGLE_CHECKS))
        return f"the byoc_hetero runtime has no kernel for {op} (it runs {known})"
    return check(_single_call_match(call))


def _epilogue_variants(with_bn: bool):
    """(suffix, flags, ops covered) for every epilogue: [bias] [bn] [act] [res|res2 [act]]
    (res: add(y, residual), res2: add(residual, y))."""
    tails = ("res_act", "res2_act", "res", "res2", "")
    for bias, bn, act, tail in itertools.product((True, False), (True, False) if with_bn else (False,),
                                                 (True, False), tails):
        suffix = ("_bias" if bias else "") + ("_bn" if bn else "") + ("_act" if act else "")
        suffix += f"_{tail}" if tail else ""
        flags = dict(bias=bias, bn=bn, act=act, residual=bool(tail), post_act=tail.endswith("_act"),
                     residual_first=tail.startswith("res2"))
        size = 1 + bias + 2 * bn + act + bool(tail) + tail.endswith("_act")
        yield suffix, flags, size


def _single(op: str, *, nargs: int = 1) -> tuple[DFPattern, dict[str, DFPattern]]:
    data = wildcard()
    call = is_op(op)(data, *[wildcard() for _ in range(nargs - 1)])
    return call, {"data": data, "root": call}


def register_builtin_rules() -> None:
    """Register the default pattern rules of target ``byoc_hetero`` (once per process)."""
    target = register_target(TARGET, can_lower)
    if target.patterns:
        return
    # conv2d / dense: 100 + ops covered, so larger epilogues are tried first.  An epilogue
    # whose activation is a relu also has a relu-only rule with the classic name
    # (conv2d_bias_relu, conv2d_relu, dense_bias_relu, dense_relu, dense_flat_bias_relu, ...),
    # registered first.
    for anchor_name, make_anchor, check, with_bn in (
        ("conv2d", _conv2d_anchor, check_conv2d, True),
        ("dense", _dense_anchor, check_dense, False),
    ):
        for flatten in (True, False) if anchor_name == "dense" else (False,):
            for suffix, flags, size in _epilogue_variants(with_bn):
                base = anchor_name + ("_flat" if flatten else "")
                priority = 100 + size + flatten
                classic = flags["act"] and not flags["bn"] and not flags["residual"]
                if classic:
                    anchor, names = make_anchor(flatten)
                    pattern, names = with_epilogue(anchor, names, flags["bias"], relu=True)
                    register_pattern(TARGET, base + suffix.replace("_act", "_relu"), pattern, names,
                                     check, priority=priority)
                anchor, names = make_anchor(flatten)
                pattern, names = with_epilogue(
                    anchor, names, flags["bias"], bn=flags["bn"], act=flags["act"],
                    residual=flags["residual"], post_act=flags["post_act"],
                    residual_first=flags["residual_first"],
                )
                register_pattern(TARGET, base + suffix, pattern, names, check, priority=priority)
    # pooling, softmax: one op each
    for op, name, check in (
        ("relax.nn.max_pool2d", "max_pool2d", check_pool2d),
        ("relax.nn.avg_pool2d", "avg_pool2d", check_pool2d),
        ("relax.nn.adaptive_avg_pool2d", "adaptive_avg_pool2d", check_adaptive_avg_pool2d),
        ("relax.mean", "global_avg_pool", check_mean),
        ("relax.nn.softmax", "softmax", check_softmax),
    ):
        pattern, names = _single(op)
        register_pattern(TARGET, name, pattern, names, check, priority=50)
    # elementwise add / multiply (after every conv / dense epilogue had its pick of the adds)
    for op, name in (("relax.add", "add"), ("relax.multiply", "multiply")):
        for act in (True, False):
            a, b = wildcard(), wildcard()
            call = is_op(op)(a, b)
            names = {"binary": call, "root": call}
            pattern = call
            if act:
                pattern = activation_pattern(call)
                names["act"] = pattern
            names["root"] = pattern
            register_pattern(TARGET, name + ("_act" if act else ""), pattern, names, check_binary,
                             priority=21 if act else 20)
    # activations on their own
    x = wildcard()
    act = activation_pattern(x)
    register_pattern(TARGET, "activation", act, {"data": x, "root": act}, check_activation, priority=10)

