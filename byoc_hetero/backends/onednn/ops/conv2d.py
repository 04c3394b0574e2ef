"""conv2d (NCHW data, OIHW weights; strides, padding, dilation, groups) with its epilogue,
conv1d (NCW data, OIW weights) as a conv2d with a unit height, and conv3d (NCDHW data, OIDHW
weights: video models' R3D / R(2+1)D blocks) as a conv2d node over rank-5 tensors.

Rules ``conv2d[_bias][_bn][_act][_res|_res2[_act]]`` and the classic relu-only names
(``conv2d_bias_relu``, ``conv2d_relu``, ...); lowered to a ``conv2d`` node whose bias, activations
and residual are oneDNN post-ops. A batch norm after it (inference form) is folded into its weight
and bias by two nodes the runtime runs once, at load, when the statistics are constants.

``conv1d[...]`` has the same epilogues. It lowers to the same ``conv2d`` node over its rank-3
tensors with attributes for a unit height (strides ``[1, s]``, padding ``[0, l, 0, r]``, dilation
``[1, d]``): the kernel reads ``[N, C, W]`` as ``[N, C, 1, W]`` (the same bytes), so conv1d gets
every conv2d implementation and layout choice, post-op and batch-norm fold without a kernel of its
own (the speech encoders' feature extractors: wav2vec 2.0, Whisper).

``conv3d[...]`` too, with the same epilogues and batch-norm fold: the ``conv2d`` kernel runs
oneDNN's 3-D convolution for rank-5 tensors (its spatial attributes have three entries).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tvm import relax
from tvm.relax.dpl import DFPattern, is_op, wildcard

from ...._relax import static_shape
from ....rules import Match
from ..epilogue import anchor_rules, epilogue_reason, tensors_reason
from ..precision import out_dtype_reason, tensor_reason
from ..table import graph_pass, lowers, pattern_rules


def conv2d_anchor() -> tuple[DFPattern, dict[str, DFPattern]]:
    """conv2d(data, weight) and its parts."""
    data, weight = wildcard(), wildcard()
    anchor = is_op("relax.nn.conv2d")(data, weight)
    return anchor, {"data": data, "weight": weight, "anchor": anchor}


def inference_batch_norm_reason(bn: relax.Call, shape: tuple[int, ...]) -> str | None:
    """Why a batch norm of data shaped ``shape`` cannot run in inference form over channels (axis
    1) with per-channel statistics; None if it can (folded into a conv, or on its own)."""
    attrs = bn.attrs
    if bool(attrs.training):
        return "batch_norm in training form (batch statistics); only the inference form runs"
    if not (bool(attrs.center) and bool(attrs.scale)):
        return "batch_norm with center=False or scale=False is not offloaded"
    if int(attrs.axis) % len(shape) != 1:
        return f"batch_norm over axis {int(attrs.axis)}; the runtime runs channel axis 1"
    eps = float(attrs.epsilon)
    if not (math.isfinite(eps) and eps >= 0):
        return f"batch_norm epsilon {eps} must be finite and >= 0"
    for name, arg in zip(("gamma", "beta", "mean", "var"), bn.args[1:5]):
        reason = tensor_reason(arg, f"batch_norm {name}")
        if reason:
            return reason
        if math.prod(static_shape(arg)) != shape[1]:
            return f"batch_norm {name} of shape {list(static_shape(arg))} is not one value per channel"
    return None


def batch_norm_reason(match: Match) -> str | None:
    """A batch norm after the conv must be in inference form over channels, with per-channel stats."""
    if not match.has("bn"):
        return None
    return inference_batch_norm_reason(match.expr("bn"), match.shape("anchor"))


def conv1d_anchor() -> tuple[DFPattern, dict[str, DFPattern]]:
    """conv1d(data, weight) and its parts."""
    data, weight = wildcard(), wildcard()
    anchor = is_op("relax.nn.conv1d")(data, weight)
    return anchor, {"data": data, "weight": weight, "anchor": anchor}


def conv3d_anchor() -> tuple[DFPattern, dict[str, DFPattern]]:
    """conv3d(data, weight) and its parts."""
    data, weight = wildcard(), wildcard()
    anchor = is_op("relax.nn.conv3d")(data, weight)
    return anchor, {"data": data, "weight": weight, "anchor": anchor}


#: per convolution op: its name, the data / kernel layouts the runtime runs, the tensors' rank
_CONV_KINDS = {"relax.nn.conv2d": ("conv2d", "NCHW", "OIHW", 4), "relax.nn.conv1d": ("conv1d", "NCW", "OIW", 3),
               "relax.nn.conv3d": ("conv3d", "NCDHW", "OIDHW", 5)}


def check_conv2d(match: Match) -> str | None:
    """conv2d (or conv1d) with its optional epilogue, as the runtime runs it."""
    # batch and spatial dims may be symbolic (the output's are expressions of the input's); the
    # channels and the weight are static
    reason = tensors_reason(match, ["data", "weight", "anchor"], symbolic=True)
    if reason:
        return reason
    anchor = match.expr("anchor")
    name, data_layout, kernel_layout, rank = _CONV_KINDS[anchor.op.name]
    attrs = anchor.attrs
    if str(attrs.data_layout) != data_layout or str(attrs.kernel_layout) != kernel_layout:
        return (
            f"{name} layout {attrs.data_layout}/{attrs.kernel_layout}; "
            f"the runtime runs {data_layout} data with {kernel_layout} weights"
        )
    if str(attrs.out_layout) not in (data_layout, ""):
        return f"{name} out_layout {attrs.out_layout}; the runtime writes {data_layout}"
    reason = out_dtype_reason(attrs.out_dtype, name)
    if reason:
        return reason
    if len(match.shape("data")) != rank or len(match.shape("weight")) != rank:
        return f"{name} needs {rank}-D data and weight, got {match.shape('data')} and {match.shape('weight')}"
    if static_shape(match.expr("weight")) is None or not isinstance(match.shape("data")[1], int):
        return (f"{name} with a symbolic weight {list(match.shape('weight'))} or data channels "
                f"{list(match.shape('data'))}; the runtime needs them static")
    return epilogue_reason(match, match.shape("anchor"), channel_axis=1, batch_norm=batch_norm_reason)


@pattern_rules
def _rules():
    yield from anchor_rules("conv2d", conv2d_anchor, check_conv2d, with_bn=True)
    yield from anchor_rules("conv1d", conv1d_anchor, check_conv2d, with_bn=True)
    yield from anchor_rules("conv3d", conv3d_anchor, check_conv2d, with_bn=True)


@lowers("relax.nn.conv2d", "relax.nn.conv1d", "relax.nn.conv3d", check=check_conv2d)
def lower_conv2d(ctx, var: relax.Var, call: relax.Call) -> int:
    """A ``conv2d`` node; a conv1d's attributes are a conv2d's with a unit height (its tensors
    stay rank 3: the kernel reads them with a unit height); a conv3d's have three entries per
    spatial attribute (padding ``[front, top, left, back, bottom, right]``, Relax's order) over
    its rank-5 tensors."""
    a = call.attrs
    strides, padding, dilation = ([int(v) for v in vs] for vs in (a.strides, a.padding, a.dilation))
    if call.op.name == "relax.nn.conv1d":
        strides, padding, dilation = [1, strides[0]], [0, padding[0], 0, padding[1]], [1, dilation[0]]
    attrs = {
        "strides": strides,
        "padding": padding,
        "dilation": dilation,
        "groups": int(a.groups),
        "has_bias": 0,
        "activation": "none",
    }
    return ctx.emit("conv2d", [ctx.data_of(call.args[0]), ctx.lookup(call.args[1])], var, attrs)


def fold_batch_norm(ctx, call: relax.Call) -> tuple[int, ...] | None:
    """Fold an inference batch norm into the open conv2d: two nodes computing its weight and
    bias from the statistics (run once, at load, when they are constants). None when it does not
    directly follow a conv2d (and its bias) of this composite: then it runs on its own
    (``relax.nn.batch_norm``'s lowering, :mod:`.norm`)."""
    node = ctx.open_node.get(ctx.lookup(call.args[0]))
    if node is None or node.op != "conv2d" or node.attrs["activation"] != "none" or \
            node.attrs.get("residual") or node.folded:
        return None
    eps = float(call.attrs.epsilon)
    gamma, beta, mean, var_ = (ctx.lookup(a) for a in call.args[1:5])
    weight = node.inputs[1]
    weight_shape = ctx.graph.tensors[weight]["shape"]
    folded_w = ctx.emit("bn_fold_weight", [weight, gamma, var_], None, {"epsilon": eps},
                        shape=weight_shape, before=node)
    bias_inputs = [gamma, beta, mean, var_]
    if node.attrs["has_bias"]:
        bias_inputs.append(node.inputs[2])
    folded_b = ctx.emit("bn_fold_bias", bias_inputs, None,
                        {"epsilon": eps, "has_bias": int(bool(node.attrs["has_bias"]))},
                        shape=[weight_shape[0]], before=node)
    for tid in (folded_w, folded_b):
        ctx.open_node.pop(tid)
    node.inputs = [node.inputs[0], folded_w, folded_b]
    node.attrs["has_bias"] = 1
    node.folded = True
    return (node.output,)


# -- per-convolution algorithm decisions (a tuner's; backend option ``algorithms``) ---------------

CONV_ALGORITHMS = ("auto", "direct", "winograd")
"""What a conv2d node's ``algo`` may say (docs/region-format.md)."""


def conv_site_key(data_shape: Sequence[int], weight_shape: Sequence[int], attrs: Mapping[str, Any]) -> str:
    """The key a per-convolution decision is stored under: what the convolution's speed depends on
    (its data and weight shapes, strides, padding, dilation, groups), as canonical JSON. Equal
    convolutions anywhere in any model get equal keys."""
    body = {"data": [int(d) for d in data_shape], "weight": [int(d) for d in weight_shape],
            "strides": [int(v) for v in attrs.get("strides", [1, 1])],
            "padding": [int(v) for v in attrs.get("padding", [0, 0, 0, 0])],
            "dilation": [int(v) for v in attrs.get("dilation", [1, 1])],
            "groups": int(attrs.get("groups", 1))}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def float_conv_sites(tensors: Sequence[Mapping[str, Any]], nodes: Sequence[Any]) -> Iterator[tuple[Any, str]]:
    """``(node, site key)`` of each float32 conv2d with static shapes among ``nodes`` (region-graph
    :class:`~..lowering.Node` s or the documents' node dicts) over ``tensors``."""
    for node in nodes:
        op, inputs, attrs = ((node["op"], node["inputs"], node.get("attrs", {})) if isinstance(node, Mapping)
                             else (node.op, node.inputs, node.attrs))
        if op != "conv2d" or "src_scale" in attrs:  # int8 convolutions have one algorithm
            continue
        data, weight = tensors[inputs[0]], tensors[inputs[1]]
        if len(weight["shape"]) == 5:  # so do 3-D ones (Winograd is 2-D)
            continue
        if any(t.get("dtype", "float32") != "float32" for t in (data, weight)):
            continue
        if not all(isinstance(d, int) for d in [*data["shape"], *weight["shape"]]):
            continue
        yield node, conv_site_key(data["shape"], weight["shape"], attrs)


def _node_index(plan_line: str) -> int | None:
    """The node index in a plan line's step label (``... node 12 (conv2d): winograd ...``)."""
    head, sep, rest = plan_line.partition(" node ")
    digits = rest.split(" ", 1)[0] if sep else ""
    return int(digits) if digits.isdigit() else None


def algorithm_summary(graph: Mapping[str, Any], plan: Sequence[str], max_taps: int, env_algo: str = "") -> str:
    """Which algorithm each float32 2-D conv2d of a region runs and why, from the region's plan
    (``get_plan``: Winograd's steps name their node): ``"winograd 4, direct 12 (...)"``, or "" for a
    region without such convs. ``max_taps``: the runtime's ``winograd_auto_max_taps()``;
    ``env_algo``: ``BYOC_HETERO_CONV_ALGO`` as the runtime read it. The direct convs that Winograd
    would fit but ``auto`` kept direct for float32 accuracy (C x 3 x 3 > ``max_taps``) are named."""
    tensors, nodes = graph.get("tensors", []), graph.get("nodes", [])
    wino = {i for i in map(_node_index, (ln for ln in plan if "winograd" in ln)) if i is not None}
    position = {id(node): i for i, node in enumerate(nodes)}
    convs = [node for node, _ in float_conv_sites(tensors, nodes)]
    if not convs:
        return ""
    ran = Counter("winograd" if position[id(node)] in wino else "direct" for node in convs)
    for_accuracy = 0
    for node in convs:
        attrs = node.get("attrs", {})
        weight = tensors[node["inputs"][1]]["shape"]
        if len(weight) != 4:  # a conv1d / conv3d on the conv2d node: Winograd is 2-D only
            continue
        k, c_per_group, kh, kw = weight
        fits = ((kh, kw) == (3, 3) and list(attrs.get("strides", [1, 1])) == [1, 1]
                and list(attrs.get("dilation", [1, 1])) == [1, 1] and int(attrs.get("groups", 1)) == 1
                and c_per_group % 16 == 0 and k % 16 == 0)
        chose = attrs.get("algo", "auto") if attrs.get("algo", "auto") != "auto" else (env_algo or "auto")
        bf16 = attrs.get("precision", graph.get("precision", "f32")) == "bf16"  # bf16 runs direct anyway
        if fits and not bf16 and chose == "auto" and c_per_group * 9 > max_taps and position[id(node)] not in wino:
            for_accuracy += 1
    text = ", ".join(f"{algo} {n}" for algo, n in sorted(ran.items(), reverse=True))
    if for_accuracy:
        text += (f" ({for_accuracy} direct by 'auto' for float32 accuracy: 3x3 convs over more than {max_taps}"
                 " input taps (C x 9), where Winograd F(4x4, 3x3) would pass 1e-5 of float64;"
                 " BYOC_HETERO_CONV_ALGO=winograd or option 'algorithms' runs Winograd there)")
    return text


def check_algorithms(value: Any) -> str:
    """Validate the ``algorithms`` option: JSON ``{site key: "auto" | "direct" | "winograd"}``."""
    from ....errors import RuleError

    try:
        table = json.loads(str(value))
    except json.JSONDecodeError as err:
        raise RuleError(f"option algorithms of backend 'onednn' must be JSON, got {str(value)[:60]!r}: {err}") from err
    if not isinstance(table, dict):
        raise RuleError(f"option algorithms of backend 'onednn' must be a JSON object, got {type(table).__name__}")
    for key, algo in table.items():
        if algo not in CONV_ALGORITHMS:
            raise RuleError(f"option algorithms: site {key} asks for {algo!r}; expected one of {list(CONV_ALGORITHMS)}")
    return json.dumps(table, sort_keys=True)


@graph_pass
def apply_conv_algorithms(graph) -> None:
    """Each float32 conv2d whose site the backend option ``algorithms`` names gets that ``algo``
    (direct or Winograd); the others keep the runtime's built-in thresholds. Why: the thresholds
    (Winograd from 25 output tiles) were measured once, on one machine; a tuner measures each
    convolution on this one (``byoc_hetero.tune``) and the decision must reach the node the
    convolution became, after the other passes changed its padding or inputs (so it runs last)."""
    chosen = graph.options.get("algorithms")
    if not chosen:
        return
    table = json.loads(str(chosen))
    for node, key in float_conv_sites(graph.tensors, graph.nodes):
        if table.get(key, "auto") != "auto":
            node.attrs["algo"] = table[key]
