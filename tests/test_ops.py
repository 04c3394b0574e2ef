"""Every op family the runtime runs, from Relax through the rules and the codegen, against the
llvm-only build of the same module (small shapes); plus what the checks keep on llvm, and how a
region runs as one unit (blocked intermediates, weights reordered once, batch norm folded at load)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import offload_and_compare
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero._relax import region_graph_json
from byoc_hetero.rules import rejections

F32 = "float32"
rng = np.random.default_rng(7)


def build_module(inputs: dict[str, tuple], body, params: dict[str, np.ndarray] | None = None):
    """main(inputs..., params...) = body(bb, vars) in one dataflow block; returns (mod, params)."""
    params = params or {}
    bb = relax.BlockBuilder()
    in_vars = [relax.Var(n, relax.TensorType(s, F32)) for n, s in inputs.items()]
    p_vars = [relax.Var(n, relax.TensorType(v.shape, F32)) for n, v in params.items()]
    names = dict(zip(list(inputs) + list(params), in_vars + p_vars))
    with bb.function("main", in_vars + p_vars):
        with bb.dataflow():
            out = bb.emit_output(body(bb, names))
        bb.emit_func_output(out)
    return bb.get(), params


def w(*shape, scale=None):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return (rng.standard_normal(shape) * (scale or np.sqrt(2.0 / fan_in))).astype(F32)


def graphs(res):
    return [region_graph_json(m) for m in res.partitioned.attrs["external_mods"]]


def nodes(res):
    return [n for g in graphs(res) for n in g["nodes"]]


def fully_offloaded(res):
    assert "llvm" not in res.profile.counts, res.profile


def conv_bias(bb, x, weight, bias, **kw):
    y = bb.emit(relax.op.nn.conv2d(x, weight, **kw))
    return bb.emit(relax.op.add(y, relax.op.reshape(bias, (1, int(bias.ty.shape[0]), 1, 1))))


# ------------------------------------------------------------------------------------------------
# conv2d shapes


@pytest.mark.parametrize(
    "cin, cout, k, kw",
    [
        (4, 8, 3, dict(strides=2, padding=1)),
        (4, 6, 3, dict(padding=(0, 1, 2, 1))),  # asymmetric
        (4, 4, 3, dict(padding=2, dilation=2)),
        (8, 8, 3, dict(padding=1, groups=4)),
        (8, 8, 3, dict(strides=2, padding=1, groups=8)),  # depthwise
        (3, 5, 5, dict(strides=(2, 1), padding=(2, 1, 0, 3), dilation=(1, 2))),
    ],
    ids=["stride2", "asym_pad", "dilated", "groups4", "depthwise", "mixed"],
)
def test_conv2d_variants(cin, cout, k, kw):
    groups = kw.get("groups", 1)
    params = {"w": w(cout, cin // groups, k, k), "b": w(cout, scale=0.1)}
    mod, params = build_module({"x": (2, cin, 11, 9)},
                               lambda bb, v: bb.emit(relax.op.nn.relu(conv_bias(bb, v["x"], v["w"], v["b"], **kw))),
                               params)
    res = offload_and_compare(mod, params)
    fully_offloaded(res)
    assert res.profile.composites["byoc_hetero"] == 1  # conv, bias and relu: one composite
    (node,) = nodes(res)
    assert node["op"] == "conv2d" and node["attrs"]["activation"] == "relu" and node["attrs"]["has_bias"] == 1


# ------------------------------------------------------------------------------------------------
# activations fused as post-ops

ACTIVATIONS = {
    "relu": relax.op.nn.relu,
    "relu6": lambda x: relax.op.clip(x, 0, 6),
    "clip": lambda x: relax.op.clip(x, -1, 1),
    "sigmoid": relax.op.sigmoid,
    "tanh": relax.op.tanh,
    "gelu": relax.op.nn.gelu,
    "gelu_tanh": relax.op.nn.gelu_tanh,
    "silu": relax.op.nn.silu,
}


@pytest.mark.parametrize("act", list(ACTIVATIONS))
def test_conv_activation_post_op(act):
    params = {"w": w(8, 4, 3, 3), "b": w(8, scale=0.1)}
    mod, params = build_module(
        {"x": (1, 4, 8, 8)},
        lambda bb, v: bb.emit(ACTIVATIONS[act](conv_bias(bb, v["x"], v["w"], v["b"], padding=1))), params)
    res = offload_and_compare(mod, params)
    fully_offloaded(res)
    (node,) = nodes(res)
    assert node["attrs"]["activation"] == {"relu6": "clip", "gelu": "gelu_erf"}.get(act, act)


@pytest.mark.parametrize("act", ["relu", "gelu", "silu", "sigmoid"])
@pytest.mark.parametrize("torch_style", [True, False], ids=["linear_bT", "matmul_b"])
def test_dense_activation_post_op(act, torch_style):
    params = {"w": w(16, 32) if torch_style else w(32, 16), "b": w(16, scale=0.1)}

    def body(bb, v):
        if torch_style:  # add(b, y) as PyTorch's linear emits it
            y = bb.emit(relax.op.matmul(v["x"], relax.op.permute_dims(v["w"], [1, 0])))
            y = bb.emit(relax.op.add(v["b"], y))
        else:
            y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(v["x"], v["w"])), v["b"]))
        return bb.emit(ACTIVATIONS[act](y))

    mod, params = build_module({"x": (3, 32)}, body, params)
    res = offload_and_compare(mod, params)
    fully_offloaded(res)
    (node,) = nodes(res)
    assert node["op"] == "dense" and node["attrs"]["has_bias"] == 1


# ------------------------------------------------------------------------------------------------
# residual add as a sum post-op


@pytest.mark.parametrize("order", ["add_y_x", "add_x_y"])
@pytest.mark.parametrize("downsample", [False, True])
def test_residual_block(order, downsample):
    c = 8
    cout = 16 if downsample else c
    stride = 2 if downsample else 1
    params = {"w1": w(cout, c, 3, 3), "b1": w(cout, scale=0.1), "w2": w(cout, cout, 3, 3), "b2": w(cout, scale=0.1)}
    if downsample:
        params.update(wd=w(cout, c, 1, 1), bd=w(cout, scale=0.1))

    def body(bb, v):
        x = v["x"]
        y = bb.emit(relax.op.nn.relu(conv_bias(bb, x, v["w1"], v["b1"], strides=stride, padding=1)))
        y = conv_bias(bb, y, v["w2"], v["b2"], padding=1)
        if downsample:
            x = conv_bias(bb, x, v["wd"], v["bd"], strides=stride)
        s = relax.op.add(y, x) if order == "add_y_x" else relax.op.add(x, y)
        return bb.emit(relax.op.nn.relu(bb.emit(s)))

    mod, params = build_module({"x": (1, c, 8, 8)}, body, params)
    res = offload_and_compare(mod, params)
    fully_offloaded(res)
    convs = [n for n in nodes(res) if n["op"] == "conv2d"]
    assert len(convs) == res.profile.composites["byoc_hetero"] == (3 if downsample else 2)  # no add of its own
    fused = [n for n in convs if n["attrs"].get("residual")]
    assert len(fused) == 1 and fused[0]["attrs"]["post_activation"] == "relu"


# ------------------------------------------------------------------------------------------------
# batch norm folded into the convolution at load


def bn_params(prefix, c):
    return {f"{prefix}_gamma": (1 + 0.1 * rng.standard_normal(c)).astype(F32),
            f"{prefix}_beta": w(c, scale=0.1), f"{prefix}_mean": w(c, scale=0.1),
            f"{prefix}_var": rng.uniform(0.5, 1.5, c).astype(F32)}


def batch_norm(bb, v, x, prefix, training=False, epsilon=1e-5):
    stats = [v[f"{prefix}_{p}"] for p in ("gamma", "beta", "mean", "var")]
    y = bb.emit(relax.op.nn.batch_norm(x, *stats, axis=1, epsilon=epsilon, training=training))
    return bb.emit(relax.TupleGetItem(y, 0))


@pytest.mark.parametrize("bias, act", [(False, "relu6"), (True, None), (False, None), (True, "relu")])
@pytest.mark.parametrize("bind", [True, False], ids=["constants", "runtime_weights"])
def test_batch_norm_folded_into_conv(bias, act, bind):
    params = {"w": w(8, 4, 3, 3), **bn_params("bn", 8)}
    if bias:
        params["b"] = w(8, scale=0.1)

    def body(bb, v):
        y = conv_bias(bb, v["x"], v["w"], v["b"], padding=1) if bias else bb.emit(
            relax.op.nn.conv2d(v["x"], v["w"], padding=1))
        y = batch_norm(bb, v, y, "bn", epsilon=1e-3)
        if act:
            y = bb.emit(ACTIVATIONS[act](y))
        # a second conv reads it, so the batch norm is not the region's output
        return bb.emit(relax.op.nn.conv2d(y, v["w2"], padding=1))

    params["w2"] = w(4, 8, 3, 3)
    mod, params = build_module({"x": (1, 4, 6, 6)}, body, params)
    res = offload_and_compare(mod, params, bind=bind)
    fully_offloaded(res)
    ops = [n["op"] for n in nodes(res)]
    assert ops.count("bn_fold_weight") == 1 and ops.count("bn_fold_bias") == 1
    assert res.profile.composites["byoc_hetero"] == 2  # conv+bn(+act) is one composite
    (mod_ext,) = res.partitioned.attrs["external_mods"]
    plan = mod_ext["get_plan"]()
    folded_at = {line.split(" | ")[0] for line in plan if "bn_fold" in line.split(" | ")[1]}
    assert folded_at == ({"init"} if bind else {"run"})


def test_batch_norm_in_training_form_stays_on_llvm():
    params = {"w": w(8, 4, 3, 3), **bn_params("bn", 8)}
    mod, params = build_module(
        {"x": (2, 4, 6, 6)},
        lambda bb, v: bb.emit(relax.op.nn.relu(batch_norm(bb, v, bb.emit(relax.op.nn.conv2d(v["x"], v["w"])), "bn",
                                                          training=True))),
        params)
    res = offload_and_compare(mod, params)
    assert res.profile.counts["llvm"]["nn.batch_norm"] == 1
    assert res.profile.counts["byoc_hetero"]["nn.conv2d"] == 1
    assert any("training form" in r.reason for r in rejections(res.partitioned))


# ------------------------------------------------------------------------------------------------
# pooling (after a conv: a region needs a compute-heavy op to be worth offloading)

POOLS = {
    "max2x2": lambda x: relax.op.nn.max_pool2d(x, pool_size=2, strides=2),
    "max3x3_pad": lambda x: relax.op.nn.max_pool2d(x, pool_size=3, strides=2, padding=1),
    "max_ceil": lambda x: relax.op.nn.max_pool2d(x, pool_size=3, strides=2, ceil_mode=True),
    "max_dilated": lambda x: relax.op.nn.max_pool2d(x, pool_size=2, strides=1, dilation=2),
    "avg_incl_pad": lambda x: relax.op.nn.avg_pool2d(x, pool_size=3, strides=2, padding=1, count_include_pad=True),
    "avg_excl_pad": lambda x: relax.op.nn.avg_pool2d(x, pool_size=3, strides=2, padding=1),
    "adaptive_global": lambda x: relax.op.nn.adaptive_avg_pool2d(x, output_size=1),
    "adaptive_2x2": lambda x: relax.op.nn.adaptive_avg_pool2d(x, output_size=2),
    "mean_keepdims": lambda x: relax.op.mean(x, axis=[2, 3], keepdims=True),
    "mean": lambda x: relax.op.mean(x, axis=[-2, -1]),
}


@pytest.mark.parametrize("pool", list(POOLS))
def test_pooling_after_conv(pool):
    params = {"w": w(16, 4, 3, 3), "b": w(16, scale=0.1)}
    mod, params = build_module(
        {"x": (2, 4, 10, 10)},
        lambda bb, v: bb.emit(POOLS[pool](bb.emit(relax.op.nn.relu(conv_bias(bb, v["x"], v["w"], v["b"], padding=1))))),
        params)
    res = offload_and_compare(mod, params)
    fully_offloaded(res)
    assert res.profile.regions["byoc_hetero"] == 1
    assert "pool2d" in [n["op"] for n in nodes(res)]


def test_avg_pool_ceil_with_include_pad_stays_on_llvm():
    params = {"w": w(8, 4, 3, 3)}
    mod, params = build_module(
        {"x": (1, 4, 10, 10)},
        lambda bb, v: bb.emit(relax.op.nn.avg_pool2d(bb.emit(relax.op.nn.conv2d(v["x"], v["w"])), pool_size=3,
                                                     strides=2, padding=1, ceil_mode=True, count_include_pad=True)),
        params)
    res = offload_and_compare(mod, params)
    assert res.profile.counts["llvm"]["nn.avg_pool2d"] == 1
    assert any("count_include_pad" in r.reason for r in rejections(res.partitioned))


# ------------------------------------------------------------------------------------------------
# softmax, elementwise, batched matmul, flatten


def test_mlp_with_softmax():
    params = {"w1": w(32, 64), "b1": w(64, scale=0.1), "w2": w(64, 10), "b2": w(10, scale=0.1)}

    def body(bb, v):
        h = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(bb.emit(relax.op.matmul(v["x"], v["w1"])), v["b1"]))))
        y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(h, v["w2"])), v["b2"]))
        return bb.emit(relax.op.nn.softmax(y, axis=-1))

    mod, params = build_module({"x": (4, 32)}, body, params)
    res = offload_and_compare(mod, params)
    fully_offloaded(res)
    assert [n["op"] for n in nodes(res)] == ["dense", "dense", "softmax"]


def test_elementwise_broadcasting_in_a_region():
    """conv outputs scaled per channel, added, multiplied by a scalar and a row: binary nodes (the
    scalar multiply and the row add as one, x * s with the row as its addend: fuse_affine_tails)."""
    params = {"w1": w(8, 4, 3, 3), "w2": w(8, 4, 1, 1), "scale": w(8, 1, 1, scale=1.0),
              "row": w(6, scale=1.0), "s": np.array(0.5, F32)}

    def body(bb, v):
        a = bb.emit(relax.op.nn.conv2d(v["x"], v["w1"], padding=1))
        b = bb.emit(relax.op.nn.conv2d(v["x"], v["w2"]))
        a = bb.emit(relax.op.multiply(a, v["scale"]))
        y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(a, b))))
        y = bb.emit(relax.op.multiply(v["s"], y))
        return bb.emit(relax.op.add(y, v["row"]))

    mod, params = build_module({"x": (2, 4, 6, 6)}, body, params)
    res = offload_and_compare(mod, params)
    fully_offloaded(res)
    binaries = [n for n in nodes(res) if n["op"] == "binary"]
    assert len(binaries) == 2 and [len(n["inputs"]) for n in binaries] == [2, 3], binaries


def test_two_sided_broadcast_add_is_offloaded():
    params = {"w": w(8, 1)}
    mod, params = build_module(
        {"x": (3, 8), "y": (1, 4)},
        lambda bb, v: bb.emit(relax.op.add(bb.emit(relax.op.matmul(v["x"], v["w"])), v["y"])), params)
    res = offload_and_compare(mod, params)  # [3, 1] + [1, 4]: the runtime broadcasts both sides
    assert "llvm" not in res.profile.counts
    assert res.profile.counts["byoc_hetero"]["add"] == 1


@pytest.mark.parametrize("heads_broadcast", [False, True])
def test_attention_batched_matmul(heads_broadcast):
    """softmax(q @ k^T) @ v with every operand a run-time value (batched matmuls)."""
    k_shape = (1, 6, 8) if heads_broadcast else (3, 6, 8)

    def body(bb, v):
        scores = bb.emit(relax.op.matmul(v["q"], relax.op.permute_dims(v["k"], [0, 2, 1])))
        probs = bb.emit(relax.op.nn.softmax(scores, axis=-1))
        return bb.emit(relax.op.matmul(probs, v["v"]))

    mod, params = build_module({"q": (3, 4, 8), "k": k_shape, "v": (3, 6, 5)}, body)
    res = offload_and_compare(mod, params)
    fully_offloaded(res)
    assert [n["op"] for n in nodes(res)] == ["matmul", "softmax", "matmul"]
    assert nodes(res)[0]["attrs"]["transpose_b"] == 1


def test_flatten_then_dense_in_one_region():
    params = {"w": w(8, 4, 3, 3), "fc": w(10, 8 * 4 * 4)}

    def body(bb, v):
        y = bb.emit(relax.op.nn.max_pool2d(bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(v["x"], v["w"], padding=1)))),
                                           pool_size=2, strides=2))
        y = bb.emit(relax.op.reshape(y, (2, 128)))
        return bb.emit(relax.op.matmul(y, relax.op.permute_dims(v["fc"], [1, 0])))

    mod, params = build_module({"x": (2, 4, 8, 8)}, body, params)
    res = offload_and_compare(mod, params)
    fully_offloaded(res)
    assert res.profile.regions["byoc_hetero"] == 1
    assert [n["op"] for n in nodes(res)] == ["conv2d", "pool2d", "reshape", "dense"]


# ------------------------------------------------------------------------------------------------
# a region runs as one unit


def test_region_keeps_blocked_intermediates_and_reorders_weights_once():
    params = {"w1": w(16, 8, 3, 3), "w2": w(16, 16, 3, 3), "w3": w(16, 16, 3, 3)}

    def body(bb, v):
        y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(v["x"], v["w1"], padding=1))))
        y = bb.emit(relax.op.nn.max_pool2d(y, pool_size=2, strides=2))
        y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(y, v["w2"], padding=1))))
        return bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(y, v["w3"], padding=1))))

    mod, params = build_module({"x": (1, 8, 12, 12)}, body, params)
    res = offload_and_compare(mod, params)
    (ext,) = res.partitioned.attrs["external_mods"]
    plan = [line.split(" | ") for line in ext["get_plan"]()]
    init = [p for p in plan if p[0] == "init"]
    run = [p for p in plan if p[0] == "run"]
    assert len(init) == 3 and all("reorder of tensor" in p[1] for p in init)  # the three weights
    reorders = [p for p in run if "reorder" in p[1] or "output tensor" in p[1] or "copy" in p[1]]
    # at most the boundary conversions: the input into the first conv's layout, the output to plain
    assert len(reorders) <= 2, reorders
    compute = [p for p in run if p not in reorders]
    assert len(compute) == 4  # conv, pool, conv, conv: intermediates never leave oneDNN's layout
    info = json.loads(ext["get_runtime_info"]())
    assert info["contexts"] == 1 and info["shared_bytes"] >= 4 * sum(v.size for v in params.values())


def test_mobilenet_v2_reduced():
    mod, params = bh.models.mobilenet_v2(image_size=32, width_mult=0.25, num_classes=10)
    res = offload_and_compare(mod, params)
    fully_offloaded(res)
    assert res.profile.regions["byoc_hetero"] == 1
    assert res.profile.counts["byoc_hetero"]["nn.conv2d"] == 52
    assert res.profile.counts["byoc_hetero"]["nn.batch_norm"] == 52
    # every conv absorbed its batch norm, ReLU6 and residual add: 52 convs + pooling + classifier
    assert res.profile.composites["byoc_hetero"] == 54


def test_runtime_names_the_codegen_writes_are_the_runtimes_own():
    """Activation, pooling and binary names are defined once, in C++ (``_C.enum_names``): the
    Relax op → runtime name tables of the oneDNN backend must use exactly those names."""
    from byoc_hetero import _C
    from byoc_hetero.backends.onednn.ops.activation import ACTIVATIONS
    from byoc_hetero.backends.onednn.ops.binary import ALGORITHMS

    from byoc_hetero.backends.onednn.ops.activation import UNMAPPED_ACTIVATIONS

    assert set(ACTIVATIONS.values()) | {"none", *UNMAPPED_ACTIVATIONS} == set(_C.activation_names())
    enums = _C.enum_names()
    assert set(ALGORITHMS.values()) <= set(enums["binary_algorithm"])
    assert {"max", "avg_include_padding", "avg_exclude_padding"} <= set(enums["pool_algorithm"])


def test_every_op_of_a_builtin_rule_has_a_lowering():
    """A rule the codegen cannot lower would fail at PartitionGraph: every op a built-in pattern
    can match, and every op with a single-call check, has an entry in the lowering table."""
    from tvm.relax import dpl

    from byoc_hetero.backends.onednn import table

    def ops_of(pattern, found):
        if isinstance(pattern, dpl.ExprPattern) and isinstance(pattern.expr, tvm.ir.Op):
            found.add(pattern.expr.name)
        for name in ("op", "left", "right", "tuple", "pattern"):
            sub = getattr(pattern, name, None)
            if isinstance(sub, dpl.DFPattern):
                ops_of(sub, found)
        for sub in list(getattr(pattern, "args", None) or []) + list(getattr(pattern, "fields", None) or []):
            ops_of(sub, found)
        return found

    ops = set()
    for spec in table.pattern_specs():
        # a rule lowered as a whole composite (``@lowers_composite``) needs no per-op lowering
        if table.composite_lowering_for(f"{table.TARGET}.{spec.name}") is None:
            pattern = spec.pattern
            ops_of(pattern.make(2)[0] if isinstance(pattern, bh.rules.Variadic) else pattern, ops)
    assert {"relax.nn.conv2d", "relax.matmul", "relax.nn.batch_norm", "relax.clip"} <= ops
    missing = sorted(op for op in ops | set(table.TABLE.single_checks) if table.lowering_for(op) is None)
    assert missing == []
