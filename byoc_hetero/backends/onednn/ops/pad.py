"""nn.pad by a constant: a zero pad of H and W folded into the conv2d it feeds, any other one a ``pad`` node.

TVM's PyTorch frontend keeps an explicit ``nn.ZeroPad2d`` (EfficientNet pads before each stride-2
depthwise conv, asymmetrically: ``[0, 1]`` on H and W) as ``nn.pad`` before a conv2d with padding 0.
oneDNN's convolution takes a [top, left] and a [bottom, right] padding of zeros, which is what this
pad computes. Rules ``conv2d_pad[_bias][_bn][_act]`` match ``conv2d(pad(x))`` with the conv2d's
epilogue (residual tails excluded: a zero pad before a shape-keeping residual conv has not been seen
in a model; they would double the rule count).

Any other constant pad (any axes, any value: torchvision's Swin-V2 pads its channels-last activations
``[N, H, W, C]`` on H and W up to a multiple of the window, issue 39) is rule ``pad``: the runtime's
``pad`` node (cpp/kernels/pad.cc, a host step writing each output element once).

Every ``nn.pad`` is lowered to a ``pad`` node; the region pass :func:`fold_pads` then merges each one
whose every reader is the data of a conv2d, and that is a zero pad of H and W of NCHW data, into those
convs' padding and drops it. What stays on llvm, with the reason in the report: another mode (reflect,
edge), negative (cropping) widths, a value the runtime does not hold (not float32) or a symbolic shape.
"""

from __future__ import annotations

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from ....rules import Match
from ..epilogue import anchor_rules, tensors_reason
from ..table import PatternSpec, graph_pass, lowers, pattern_rules
from .conv2d import check_conv2d


def pad_reason(call: relax.Call) -> str | None:
    """Why this nn.pad cannot be the runtime's ``pad`` node; None if it can."""
    a = call.attrs
    widths = [int(w) for w in a.pad_width]
    if str(a.pad_mode) != "constant":
        return f"pad mode {a.pad_mode!s}: the runtime pads with a constant only"
    if not widths:
        return "pad of a scalar (rank 0): nothing to pad"
    if any(w < 0 for w in widths):
        return f"pad widths {widths} crop (negative): the runtime's pad only widens"
    return None


def conv_padding_reason(call: relax.Call) -> str | None:
    """Why this nn.pad cannot become part of a conv2d's padding; None if it can."""
    widths = [int(w) for w in call.attrs.pad_width]
    value = float(call.attrs.pad_value)
    if value != 0.0:
        return f"pad value {value}: only a zero pad folds into a conv2d's padding"
    if len(widths) != 8:
        return f"pad of a rank-{len(widths) // 2} tensor: only the H and W of NCHW data fold into a conv2d"
    if any(w != 0 for w in widths[:4]):
        return f"pad widths {widths} pad the batch or channel dims: only H and W fold into a conv2d"
    return None


def check_conv2d_pad(match: Match) -> str | None:
    """A zero pad of H and W, then a conv2d (with its epilogue) as :func:`.conv2d.check_conv2d` accepts."""
    pad = match.expr("pad")
    return (pad_reason(pad) or conv_padding_reason(pad) or tensors_reason(match, ["pad"], symbolic=True)
            or check_conv2d(match))


def check_pad(match: Match) -> str | None:
    """A constant pad of a static float32 tensor, any axes, any value: the runtime's ``pad``."""
    return pad_reason(match.expr("root")) or tensors_reason(match, ["data", "root"])


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
    # below everything: a pad a conv2d can absorb is taken with it first
    yield PatternSpec("pad", pad, {"data": x, "root": pad}, check_pad, priority=1)


@lowers("relax.nn.pad")
def lower_pad(ctx, var: relax.Var, call: relax.Call) -> int:
    """A ``pad`` node (``pad_before`` / ``pad_after`` per axis, ``value``), which :func:`fold_pads`
    may merge into the conv2d reading it."""
    reason = pad_reason(call)
    if reason:
        raise ctx.fail(reason)
    widths = [int(w) for w in call.attrs.pad_width]
    attrs = {"pad_before": widths[0::2], "pad_after": widths[1::2], "value": float(call.attrs.pad_value)}
    out = ctx.emit("pad", [ctx.data_of(call.args[0])], var, attrs)
    ctx.open_node.pop(out)
    return out


def _conv_padding(pad) -> list[int] | None:
    """The [top, left, bottom, right] a conv2d's padding gains from this ``pad`` node, or None when
    it is not a zero pad of H and W of rank-4 data."""
    before, after = pad.attrs["pad_before"], pad.attrs["pad_after"]
    if pad.attrs["value"] != 0.0 or len(before) != 4 or any(before[:2]) or any(after[:2]):
        return None
    return [before[2], before[3], after[2], after[3]]


@graph_pass
def fold_pads(graph) -> None:
    """Each ``pad`` node that only conv2d nodes read, as their data, and that adds zeros to H and W
    (:func:`_conv_padding`), becomes part of their padding and is dropped; every other one stays a
    ``pad`` node."""
    readers: dict[int, list] = {}
    for node in graph.nodes:
        for k, tid in enumerate(node.inputs):
            readers.setdefault(tid, []).append((node, k))
    folded = set()
    for pad in [n for n in graph.nodes if n.op == "pad"]:
        padding = _conv_padding(pad)
        users = readers.get(pad.output, [])
        if padding is None or not users or pad.output in graph.outputs \
                or any(node.op != "conv2d" or k != 0 or len(node.attrs.get("padding", [0] * 4)) != 4
                       for node, k in users):
            continue
        for node, _ in users:
            node.attrs["padding"] = [p + q for p, q in zip(node.attrs.get("padding", [0] * 4), padding)]
            node.inputs[0] = pad.inputs[0]
        folded.add(id(pad))
    graph.nodes[:] = [n for n in graph.nodes if id(n) not in folded]
