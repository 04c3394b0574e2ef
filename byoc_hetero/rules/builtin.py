"""The built-in rules of target ``byoc_hetero``: what the oneDNN runtime can run.

Patterns (tried in this order; larger first):

=====================  ===================================================================
rule                   matches
=====================  ===================================================================
``conv2d_bias_relu``   conv2d → add(bias) → relu
``conv2d_bias``        conv2d → add(bias)
``conv2d_relu``        conv2d → relu
``conv2d``             conv2d
``dense_bias_relu``    matmul(x, W or permute_dims(W)) → add(bias) → relu
``dense_bias``         matmul → add(bias)
``dense_relu``         matmul → relu
``dense``              matmul
=====================  ===================================================================

The bias may be reshaped first (``add(y, reshape(b, [1, C, 1, 1]))``, as TVM's ONNX and PyTorch
frontends emit). Every rule's check rejects what the runtime cannot run — non-float32 tensors,
symbolic shapes, layouts other than NCHW/OIHW, a bias that is not per output channel — and the
rejected call stays with TVM.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from .registry import Match, register_pattern, register_target, static_shape, tensor_dtype

TARGET = "byoc_hetero"
FLOAT = "float32"


# ----------------------------------------------------------------------------------------------
# Checks (None = accept, str = the reason for rejecting)
# ----------------------------------------------------------------------------------------------
def _float32_static(match: Match, names: list[str]) -> str | None:
    for name in names:
        if not match.has(name):
            continue
        expr = match.expr(name)
        dtype = tensor_dtype(expr)
        if dtype != FLOAT:
            return f"{name} has dtype {dtype or 'non-tensor'}; the runtime runs float32 only"
        if static_shape(expr) is None:
            return f"{name} has a symbolic or unknown shape {expr.ty}; the runtime needs static shapes"
    return None


def _check_bias(match: Match, out_shape: tuple[int, ...], channel_axis: int) -> str | None:
    """The added operand must hold one value per output channel (broadcast along the rest)."""
    if not match.has("bias_add"):
        return None
    add = match.expr("bias_add")
    anchor = match.expr("anchor")
    # add is matched either way round: add(y, b) (ONNX) or add(b, y) (PyTorch's linear)
    operand = add.args[0] if _produced_by(match, add.args[1], anchor) else add.args[1]
    reason = _float32_static(Match(add, {"bias": operand}), ["bias"])
    if reason:
        return reason
    shape = static_shape(operand)
    if len(shape) > len(out_shape):
        return f"bias of shape {list(shape)} has more dims than the output {list(out_shape)}"
    aligned = (1,) * (len(out_shape) - len(shape)) + shape
    channel = out_shape[channel_axis]
    for axis, (dim, full) in enumerate(zip(aligned, out_shape)):
        want = channel if axis == channel_axis % len(out_shape) else 1
        if dim != want:
            return (
                f"bias of shape {list(shape)} is not one value per output channel "
                f"of an output shaped {list(out_shape)}"
            )
    if static_shape(add) != out_shape:
        return f"bias add changes the shape {list(out_shape)} -> {static_shape(add)}"
    return None


def _produced_by(match: Match, expr: relax.Expr, anchor: relax.Expr) -> bool:
    return match.value(expr).same_as(anchor)


def check_conv2d(match: Match) -> str | None:
    """conv2d (with optional bias and relu) as the runtime runs it."""
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
    return _check_bias(match, match.shape("anchor"), channel_axis=1)


def check_dense(match: Match) -> str | None:
    """matmul of data by a 2-D weight (plain or transposed), optional bias and relu."""
    reason = _float32_static(match, ["data", "weight", "anchor"])
    if reason:
        return reason
    data_shape, weight_shape = match.shape("data"), match.shape("weight")
    if len(weight_shape) != 2:
        return f"dense needs a 2-D weight, got shape {list(weight_shape)}"
    if len(data_shape) < 2:
        return f"dense needs data of rank >= 2, got shape {list(data_shape)}"
    out_dtype = match.expr("anchor").attrs.out_dtype
    if out_dtype is not None and str(out_dtype) not in ("", FLOAT, "void"):
        return f"matmul out_dtype {out_dtype}; the runtime writes float32"
    if match.has("transpose"):
        axes = match.expr("transpose").attrs.axes
        if axes is not None and [int(a) for a in axes] != [1, 0]:
            return f"permute_dims axes {list(axes)} is not a 2-D transpose"
    return _check_bias(match, match.shape("anchor"), channel_axis=-1)


# ----------------------------------------------------------------------------------------------
# Patterns
# ----------------------------------------------------------------------------------------------
def _conv2d_anchor() -> tuple[DFPattern, dict[str, DFPattern]]:
    data, weight = wildcard(), wildcard()
    anchor = is_op("relax.nn.conv2d")(data, weight)
    return anchor, {"data": data, "weight": weight, "anchor": anchor}


def _dense_anchor() -> tuple[DFPattern, dict[str, DFPattern]]:
    data, weight = wildcard(), wildcard()
    transpose = is_op("relax.permute_dims")(weight)
    anchor = is_op("relax.matmul")(data, transpose | weight)
    return anchor, {"data": data, "weight": weight, "anchor": anchor, "transpose": transpose}


def with_epilogue(
    anchor: DFPattern, names: dict[str, DFPattern], bias: bool, relu: bool
) -> tuple[DFPattern, dict[str, DFPattern]]:
    """Extend an anchor pattern with an optional bias add (bias maybe reshaped) and relu."""
    out, names = anchor, dict(names)
    if bias:
        value = wildcard()
        operand = is_op("relax.reshape")(value, wildcard()) | value
        out = is_op("relax.add")(out, operand)
        names["bias"] = value
        names["bias_add"] = out
    if relu:
        out = is_op("relax.nn.relu")(out)
    return out, names


def _single_call_match(call: relax.Call) -> Match:
    names = {"root": call, "anchor": call}
    if len(call.args) >= 2:
        names.update(data=call.args[0], weight=call.args[1])
    return Match(call, names)


def can_lower(call: relax.Call) -> str | None:
    """Whether the runtime has a kernel for this single call (guards op-attribute rules)."""
    op = call.op.name
    if op == "relax.nn.conv2d":
        return check_conv2d(_single_call_match(call))
    if op == "relax.matmul":
        return check_dense(_single_call_match(call))
    return f"the byoc_hetero runtime has no kernel for {op} (it runs conv2d and dense/matmul)"


def register_builtin_rules() -> None:
    """Register the default pattern rules of target ``byoc_hetero`` (once per process)."""
    target = register_target(TARGET, can_lower)
    if target.patterns:
        return
    for anchor_name, make_anchor, check in (
        ("conv2d", _conv2d_anchor, check_conv2d),
        ("dense", _dense_anchor, check_dense),
    ):
        for bias, relu in ((True, True), (True, False), (False, True), (False, False)):
            anchor, names = make_anchor()
            pattern, names = with_epilogue(anchor, names, bias, relu)
            suffix = ("_bias" if bias else "") + ("_relu" if relu else "")
            register_pattern(
                TARGET, anchor_name + suffix, pattern, names, check, priority=1 + bias + relu
            )
