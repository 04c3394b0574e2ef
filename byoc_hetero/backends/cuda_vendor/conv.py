"""The cuda_vendor backend's conv2d family: ``conv2d`` (NCHW data, OIHW weights) with up to two adds
and a ``relu``, one cuDNN call each (``cudnnConvolutionBiasActivationForward``: ``y = act(conv(x, w)
+ bias + z)``), float32 with FMA math (no TF32).

Rules (largest first): ``conv2d_add_add_relu``, ``conv2d_add_add``, ``conv2d_add_relu``,
``conv2d_add``, ``conv2d_relu``, ``conv2d``. Each add after the conv is, by its operand's shape, the
*bias* (one value per output channel, broadcast: ``[C, 1, 1]``, ``[1, C, 1, 1]``) or the *residual*
(the output's shape: a ResNet block's skip connection); at most one of each, in either order, and
the relu comes after both (cuDNN applies it last). Groups (depthwise included), strides and
dilation run; what does not — another dtype or layout, a symbolic shape, asymmetric padding, a
relu between the bias and the residual (then the residual add stays on llvm) — is refused with the
reason. A batch norm is not folded here: it stays with TVM unless the model's passes folded it into
the conv's weight and bias first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from ..._relax import is_per_channel, shape_of, static_shape, tensor_dtype
from ...rules import Match

MAX_ADDS = 2
"""A conv2d rule takes up to this many adds: a bias and a residual."""


def conv2d_pattern(adds: int, relu: bool) -> tuple[DFPattern, dict[str, DFPattern]]:
    """``conv2d(data, weight)`` → ``adds`` × ``add(·, operand_i)`` → [``relu``], its parts named."""
    data, weight = wildcard(), wildcard()
    out = anchor = is_op("relax.nn.conv2d")(data, weight)
    names = {"data": data, "weight": weight, "anchor": anchor}
    for i in range(adds):
        names[f"operand{i}"] = wildcard()
        out = names[f"add{i}"] = is_op("relax.add")(out, names[f"operand{i}"])
    if relu:
        out = names["activation"] = is_op("relax.nn.relu")(out)
    return out, names


def add_roles(out_shape: Sequence[int], operand_shapes: Sequence[Sequence[int]]) -> list[str] | str:
    """Each add operand's role, ``"bias"`` or ``"residual"``, in order; a string (why not) when one
    is neither or a role comes twice."""
    roles: list[str] = []
    for shape in operand_shapes:
        if "bias" not in roles and is_per_channel(tuple(shape), tuple(out_shape), channel_axis=1):
            roles.append("bias")
        elif "residual" not in roles and list(shape) == list(out_shape):
            roles.append("residual")
        else:
            return (f"add of shape {list(shape)} after conv2d {list(out_shape)}: the cuda_vendor backend adds one bias "
                    "(a value per output channel) and one residual (the output's shape) in its cuDNN call")
    return roles


def _operand(match: Match, i: int) -> relax.Expr | None:
    """The operand add ``i`` adds to the conv's running value (None: the add doubles that value)."""
    add = match.expr(f"add{i}")
    chain = match.expr("anchor" if i == 0 else f"add{i - 1}")
    first, second = (match.value(a).same_as(chain) for a in add.args)
    if first == second:
        return None
    return add.args[1] if first else add.args[0]


def _attrs_reason(attrs: Any) -> str | None:
    if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW":
        return (f"conv2d layout {attrs.data_layout}/{attrs.kernel_layout}: the cuda_vendor backend runs NCHW data "
                "with OIHW weights")
    if str(attrs.out_layout) not in ("NCHW", ""):
        return f"conv2d out_layout {attrs.out_layout}: the cuda_vendor backend writes NCHW"
    if str(attrs.out_dtype or "") not in ("", "void", "float32"):
        return f"conv2d with out_dtype {attrs.out_dtype}: the cuda_vendor backend runs float32"
    top, left, bottom, right = (int(p) for p in attrs.padding)
    if (top, left) != (bottom, right):
        return (f"conv2d padding {[top, left, bottom, right]} is asymmetric: cuDNN pads each side alike, so it "
                "stays on llvm")
    return None


def _tensors_reason(match: Match, operands: Sequence[relax.Expr]) -> str | None:
    parts = [(name, match.expr(name)) for name in ("data", "weight", "anchor")]
    parts += [(f"add operand {i}", e) for i, e in enumerate(operands)]
    for name, expr in parts:
        dtype = tensor_dtype(expr)
        if dtype != "float32":
            return f"conv2d {name} of dtype {dtype or 'unknown'}: the cuda_vendor backend runs float32 (cuDNN)"
        shape = static_shape(expr)
        if shape is None:
            return (f"conv2d {name} of symbolic shape {list(shape_of(expr) or [])}: the cuda_vendor backend plans "
                    "static shapes")
        if len(shape) != 4 and name in ("data", "weight", "anchor"):
            return f"conv2d {name} of rank {len(shape)}: the cuda_vendor backend runs 4-D NCHW"
    return None


def check_conv2d(match: Match) -> str | None:
    """None when the cuda_vendor backend runs the match as one cuDNN call, else why not."""
    reason = _attrs_reason(match.expr("anchor").attrs)
    if reason:
        return reason
    operands = [_operand(match, i) for i in range(MAX_ADDS) if match.has(f"add{i}")]
    if any(o is None for o in operands):
        return "an add of the conv2d's result to itself: not a bias or a residual"
    reason = _tensors_reason(match, operands)
    if reason:
        return reason
    roles = add_roles(static_shape(match.expr("anchor")), [static_shape(o) for o in operands])
    return roles if isinstance(roles, str) else None


def pattern_rules() -> Iterator[tuple[str, DFPattern, dict[str, DFPattern], int]]:
    """``(name, pattern, annotations, priority)`` of every rule, largest first."""
    for adds in range(MAX_ADDS, -1, -1):
        for relu in (True, False):
            pattern, names = conv2d_pattern(adds, relu)
            yield "conv2d" + "_add" * adds + ("_relu" if relu else ""), pattern, names, 101 + adds + relu


Calls = Mapping[str, Sequence[tuple[relax.Var, relax.Call]]]
"""A composite's calls: short op name → its ``(variable, call)`` bindings, in order."""


def conv2d_node(calls: Calls, lookup: Callable[[relax.Expr], int], out: relax.Expr,
                options: Mapping[str, Any]) -> tuple[list[int], dict[str, Any]]:
    """The document inputs (data, weight[, bias][, residual]) and attrs of a conv2d composite (as
    :func:`.gemm.gemm_node`; no option changes a conv2d)."""
    chain, anchor = calls["nn.conv2d"][0]
    out_shape = static_shape(chain)
    operands = []
    for var, add in calls.get("add", ()):
        operands.append(add.args[1] if add.args[0].same_as(chain) else add.args[0])
        chain = var
    roles = add_roles(out_shape, [static_shape(o) for o in operands])
    if isinstance(roles, str):
        raise ValueError(roles)  # check_conv2d refused this; the codegen names the region
    role_of = dict(zip(roles, operands))
    inputs = [lookup(anchor.args[0]), lookup(anchor.args[1])]
    inputs += [lookup(role_of[r]) for r in ("bias", "residual") if r in role_of]
    attrs = anchor.attrs
    top, left = int(attrs.padding[0]), int(attrs.padding[1])
    return inputs, {"strides": [int(s) for s in attrs.strides], "padding": [top, left],
                    "dilation": [int(d) for d in attrs.dilation], "groups": int(attrs.groups),
                    "activation": "relu" if "nn.relu" in calls else "none",
                    "bias": int("bias" in role_of), "residual": int("residual" in role_of)}


__all__ = ["MAX_ADDS", "add_roles", "check_conv2d", "conv2d_node", "conv2d_pattern", "pattern_rules"]
