"""The epilogue of a conv2d / dense / matmul: [bias add] [batch norm] [activation] [residual add
[activation]], as patterns, checks and the lowering of its adds into post-ops.

The anchor op families (:mod:`.ops.conv2d`, :mod:`.ops.dense`) build their rules with
:func:`anchor_rules`; the bias may be reshaped first (``add(y, reshape(b, [1, C, 1, 1]))``, as TVM's
ONNX and PyTorch frontends emit).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, is_tuple_get_item, wildcard

from ..._relax import is_per_channel, shape_of
from ...rules import Check, Match
from .lowering import ANCHORS
from .ops.activation import FUSES_ACTIVATION, FUSES_ONLY, activation_pattern, activation_reason
from .precision import tensor_reason
from .table import PatternSpec, graph_pass

Anchor = Callable[[], tuple[DFPattern, dict[str, DFPattern]]]
"""``make_anchor() -> (pattern, names)``: a fresh pattern of the anchor op and its named parts."""


def tensors_reason(match: Match, names: list[str], symbolic: bool = False) -> str | None:
    """Why one of the (present) parts ``names`` cannot be a runtime tensor; None if all can.
    ``symbolic``: the op runs symbolic dims (see :func:`.precision.tensor_reason`)."""
    for name in names:
        if match.has(name):
            reason = tensor_reason(match.expr(name), name, symbolic=symbolic)
            if reason:
                return reason
    return None


def other_operand(match: Match, add: relax.Call, chain: relax.Expr) -> relax.Expr | None:
    """The operand of ``add`` that is not the value ``chain`` computed inside the match."""
    first, second = add.args[0], add.args[1]
    first_is, second_is = match.value(first).same_as(chain), match.value(second).same_as(chain)
    if first_is == second_is:
        return None
    return second if first_is else first


def _added(match: Match, add_name: str, chain_name: str, what: str) -> relax.Expr | str | None:
    """The operand the add ``add_name`` adds to the value ``chain_name`` of the match: None when the
    match has no such add, a string when the operand cannot be a runtime tensor (the reason)."""
    if not match.has(add_name):
        return None
    # the add is matched either way round: add(y, b) (ONNX) or add(b, y) (PyTorch's linear)
    operand = other_operand(match, match.expr(add_name), match.expr(chain_name))
    if operand is None:
        return f"the {what} add adds the result to itself"
    # the shape checks below compare the operand's dims with the output's, symbolic ones by name
    return tensor_reason(operand, what, symbolic=True) or operand


def bias_reason(match: Match, out_shape: tuple[int, ...], channel_axis: int) -> str | None:
    """The added operand must hold one value per output channel (broadcast along the rest)."""
    bias = _added(match, "bias_add", "anchor", "bias")
    if not isinstance(bias, relax.Expr):
        return bias
    shape = shape_of(bias)
    if not is_per_channel(shape, out_shape, channel_axis):
        return (
            f"bias of shape {list(shape)} is not one value per output channel "
            f"of an output shaped {list(out_shape)}"
        )
    if shape_of(match.expr("bias_add")) != out_shape:
        return f"bias add changes the shape {list(out_shape)} -> {shape_of(match.expr('bias_add'))}"
    return None


def residual_reason(match: Match, out_shape: tuple[int, ...]) -> str | None:
    """The residual add: the other operand has exactly the output's shape (a sum post-op)."""
    residual = _added(match, "residual_add", "pre_res", "residual")
    if not isinstance(residual, relax.Expr):
        return residual
    if isinstance(residual, relax.Var) and residual in match.bindings:
        # e.g. add(relu(conv(x)), conv(x)): the sum post-op would add the anchor's final output
        # (found by tests/test_fuzz.py: relative error 0.57)
        return "the residual is a value computed inside the pattern (the anchor's own output), not a sum post-op"
    shape = shape_of(residual)
    if shape != out_shape:
        return (
            f"residual of shape {list(shape)} is not the output's shape {list(out_shape)} "
            "(the runtime adds it as a sum post-op)"
        )
    if shape_of(match.expr("residual_add")) != out_shape:
        return f"residual add changes the shape {list(out_shape)}"
    return None


def epilogue_reason(match: Match, out_shape: tuple[int, ...], channel_axis: int,
                    batch_norm: Check | None = None) -> str | None:
    """Why the epilogue of an anchor with output ``out_shape`` cannot run; None if it can."""
    return (
        bias_reason(match, out_shape, channel_axis)
        or (batch_norm(match) if batch_norm is not None else None)
        or activation_reason(match, "act")
        or residual_reason(match, out_shape)
        or activation_reason(match, "post_act")
    )


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


def _variants(with_bn: bool) -> Iterator[tuple[str, dict[str, bool], int]]:
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


def anchor_rules(base: str, make_anchor: Anchor, check: Check, with_bn: bool,
                 extra_ops: int = 0) -> Iterator[PatternSpec]:
    """Every epilogue rule of one anchor: priority 100 + ops covered (``extra_ops`` in the anchor
    beyond its op, e.g. a flatten), so larger epilogues are tried first. An epilogue whose activation is a relu also has a relu-only rule with the classic name
    (``conv2d_bias_relu``, ``dense_relu``, ``dense_flat_bias_relu``, ...), declared first."""
    for suffix, flags, size in _variants(with_bn):
        priority = 100 + size + extra_ops
        if flags["act"] and not flags["bn"] and not flags["residual"]:
            anchor, names = make_anchor()
            pattern, names = with_epilogue(anchor, names, flags["bias"], relu=True)
            yield PatternSpec(base + suffix.replace("_act", "_relu"), pattern, names, check, priority)
        anchor, names = make_anchor()
        pattern, names = with_epilogue(
            anchor, names, flags["bias"], bn=flags["bn"], act=flags["act"], residual=flags["residual"],
            post_act=flags["post_act"], residual_first=flags["residual_first"],
        )
        yield PatternSpec(base + suffix, pattern, names, check, priority)


# ----------------------------------------------------------------------------------------------
# Lowering: an add after an anchor becomes its bias or its residual (sum post-op)
# ----------------------------------------------------------------------------------------------
def fuse_add(ctx, call: relax.Call) -> int | None:
    """Fuse ``call`` (an add) into the anchor node this composite opened on one operand, as its bias
    or residual; the anchor's output id, or None when the add is not part of an anchor's epilogue."""
    lhs, rhs = ctx.lookup(call.args[0]), ctx.lookup(call.args[1])
    chain = lhs if lhs in ctx.open_node else rhs if rhs in ctx.open_node else None
    node = ctx.open_node.get(chain)
    if node is None or node.op not in ANCHORS or lhs == rhs:
        return None
    operand_expr = call.args[1] if chain == lhs else call.args[0]
    operand = rhs if chain == lhs else lhs
    out_shape = ctx.graph.tensors[node.output]["shape"]
    operand_shape = list(shape_of(operand_expr))
    channel_axis = 1 if node.op == "conv2d" else -1
    fresh = not node.attrs["has_bias"] and node.attrs["activation"] == "none" and \
        not node.attrs.get("residual") and not node.folded
    if fresh and is_per_channel(tuple(operand_shape), tuple(out_shape), channel_axis):
        node.attrs["has_bias"] = 1
        node.inputs.insert(2, operand)
        return node.output
    if not node.attrs.get("residual") and operand_shape == out_shape:
        node.attrs["residual"] = 1
        node.attrs["post_activation"] = "none"
        node.inputs.append(operand)
        return node.output
    raise ctx.fail(f"add of shape {operand_shape} after {node.op} is neither a bias nor a residual")


# ----------------------------------------------------------------------------------------------
# Region-graph pass: an eltwise node becomes a post-op of the node that computes its operand
# ----------------------------------------------------------------------------------------------
@graph_pass
def fuse_eltwise_into_producer(graph) -> None:
    """An ``eltwise`` whose operand only it reads (and the region does not return) becomes the
    ``activation`` (``post_activation`` after a residual) of the conv2d / dense / matmul / binary
    node that computes the operand, directly or through reshapes read by nothing else, when that
    slot is free; the eltwise node is dropped and its readers read the (reshaped) producer output.

    Why here and not in the patterns: an activation in a composite of its own (a hardswish or gelu
    chain, :mod:`.ops.hardswish`, :mod:`.ops.gelu`, or any activation a larger epilogue rule could
    not take) was a separate oneDNN step reading and writing the whole tensor; composites are
    lowered one at a time and cannot see that their operand has no other reader, the whole region
    graph can. TVM's torch frontend writes ``linear`` on 3-D data as reshape, matmul, reshape, so
    the gelu of BERT's, ViT's and ConvNeXt's MLPs sits behind a reshape of its dense."""
    for node in list(graph.nodes):
        if node.op != "eltwise" or len(node.inputs) != 1 or node.attrs.get("algorithm") in (None, "none"):
            continue
        src = node.inputs[0]
        if graph.readers().get(src, 0) != 1:
            continue  # another reader (or the region's output) needs the value before the activation
        found = graph.producer_through(src)
        if found is None:
            continue
        producer = found[0]
        name = node.attrs["algorithm"]
        if not (producer.op in FUSES_ACTIVATION or name in FUSES_ONLY.get(producer.op, ())):
            continue
        residual = bool(producer.attrs.get("residual"))
        key, clip_key = ("post_activation", "post_clip") if residual else ("activation", "clip")
        if producer.attrs.get(key, "none") != "none":
            continue
        producer.attrs[key] = name
        if "clip" in node.attrs:
            producer.attrs[clip_key] = node.attrs["clip"]
        graph.nodes.remove(node)
        graph.replace_tensor(node.output, src)
