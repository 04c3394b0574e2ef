"""nn.pad by a constant zero of the two spatial dims, folded into the padding of the conv2d it feeds.

TVM's PyTorch frontend keeps an explicit ``nn.ZeroPad2d`` (EfficientNet pads before each stride-2
depthwise conv, asymmetrically: ``[0, 1]`` on H and W) as ``nn.pad`` before a conv2d with padding 0.
The runtime has no pad kernel: oneDNN's convolution takes a [top, left] and a [bottom, right]
padding of zeros, which is what this pad computes. Rules ``conv2d_pad[_bias][_bn][_act]`` match
``conv2d(pad(x))`` with the conv2d's epilogue (residual tails excluded: a zero pad before a
shape-keeping residual conv has not been seen in a model; they would double the rule count); the
pad is lowered to a ``pad`` node that :func:`fold_pads` merges into the conv2d before the graph is
written, so the runtime never sees one.

A pad the runtime cannot fold (a non-zero value, another mode, padding of the batch or channel
dims, negative (cropping) widths, or one feeding something other than a conv2d) stays on llvm; rule
``pad`` exists only to say why in the report (its check never accepts: a lone pad has no kernel).
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from ....errors import CodegenError
from ....rules import Match
from ..epilogue import anchor_rules, tensors_reason
from ..table import PatternSpec, graph_pass, lowers, pattern_rules
from .conv2d import check_conv2d


def pad_reason(call: relax.Call) -> str | None:
    """Why this nn.pad cannot become part of a conv2d's padding; None if it can."""
    a = call.attrs
    widths = [int(w) for w in a.pad_width]
    if str(a.pad_mode) != "constant":
        return f"pad mode {a.pad_mode!s}: only a constant zero pad folds into a conv2d's padding"
    value = float(a.pad_value)
    if value != 0.0:
        return f"pad value {value}: only a zero pad folds into a conv2d's padding (the runtime has no pad kernel)"
    if len(widths) != 8:
        return f"pad of a rank-{len(widths) // 2} tensor: only the H and W of NCHW data fold into a conv2d"
    if any(w != 0 for w in widths[:4]):
        return f"pad widths {widths} pad the batch or channel dims: only H and W fold into a conv2d"
    if any(w < 0 for w in widths):
        return f"pad widths {widths} crop (negative): only padding folds into a conv2d"
    return None


def check_conv2d_pad(match: Match) -> str | None:
    """A zero pad of H and W, then a conv2d (with its epilogue) as :func:`.conv2d.check_conv2d` accepts."""
    return pad_reason(match.expr("pad")) or tensors_reason(match, ["pad"], symbolic=True) or check_conv2d(match)


def check_pad(match: Match) -> str:
    """A pad on its own never runs (no kernel): the reason for the report."""
    reason = pad_reason(match.expr("root"))
    if reason:
        return reason
    return "a zero pad of H and W runs only folded into the padding of the conv2d it feeds; this one feeds none the runtime runs"


def conv2d_pad_anchor() -> tuple[DFPattern, dict[str, DFPattern]]:
    """conv2d(pad(data), weight) and its parts."""
    data, weight = wildcard(), wildcard()
    pad = is_op("relax.nn.pad")(data)
    anchor = is_op("relax.nn.conv2d")(pad, weight)
    return anchor, {"data": data, "pad": pad, "weight": weight, "anchor": anchor}


@pattern_rules
def _rules():
    for spec in anchor_rules("conv2d_pad", conv2d_pad_anchor, check_conv2d_pad, with_bn=True, extra_ops=1):
        if "_res" not in spec.name:
            yield spec
    x = wildcard()
    pad = is_op("relax.nn.pad")(x)
    # below everything: it only records why a pad stays on llvm
    yield PatternSpec("pad", pad, {"data": x, "root": pad}, check_pad, priority=1)


@lowers("relax.nn.pad")
def lower_pad(ctx, var: relax.Var, call: relax.Call) -> int:
    """A ``pad`` node for :func:`fold_pads` to merge into the conv2d reading it (never serialized)."""
    reason = pad_reason(call)
    if reason:
        raise ctx.fail(reason)
    widths = [int(w) for w in call.attrs.pad_width]
    # [top, left, bottom, right], as conv2d's padding
    padding = [widths[4], widths[6], widths[5], widths[7]]
    out = ctx.emit("pad", [ctx.data_of(call.args[0])], var, {"padding": padding})
    ctx.open_node.pop(out)
    return out


@graph_pass
def fold_pads(graph) -> None:
    """Each ``pad`` node becomes part of the padding of the conv2d nodes reading it, and is dropped.
    A pad read by anything else is a rule's bug (``conv2d_pad*`` takes a pad with its conv2d only)."""
    pads = {n.output: n for n in graph.nodes if n.op == "pad"}
    if not pads:
        return
    for node in graph.nodes:
        for k, tid in enumerate(node.inputs):
            if tid not in pads:
                continue
            if node.op != "conv2d" or k != 0:
                raise CodegenError(f"region {graph.symbol}: a pad is read by {node.op} (input {k}), "
                                   "only a conv2d's data can absorb it")
            pad = pads[tid]
            node.attrs["padding"] = [p + q for p, q in zip(node.attrs["padding"], pad.attrs["padding"])]
            node.inputs[0] = pad.inputs[0]
    if any(tid in graph.outputs for tid in pads):
        raise CodegenError(f"region {graph.symbol}: a pad is a region output; it has no kernel")
    graph.nodes[:] = [n for n in graph.nodes if n.op != "pad"]
