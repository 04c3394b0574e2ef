"""Partitioning semantics, case by case: the regions formed, and the built output vs llvm-only."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import TOLERANCE, graph
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

import byoc_hetero as bh
from byoc_hetero.rules import pattern_rules, rejections
from byoc_hetero.timing import build, relative_error

F32 = "float32"
R = relax.op


def rand(*shape, seed=0):
    return (np.random.default_rng(seed + sum(shape)).standard_normal(shape) * 0.5).astype(F32)


def run_all(ex, arrays):
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in arrays])
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [o.numpy() for o in out]


def check(mod, params=None, target="byoc_hetero", **kwargs):
    """Partition, build, run; compare every output with the llvm-only build. Returns the report."""
    params = params or {}
    inputs = [rand(*[int(d) for d in v.ty.shape.values], seed=i)
              for i, v in enumerate(mod["main"].params) if v.name not in params]
    part = bh.partition(mod, params, target=target, **kwargs)
    got = run_all(build(part), inputs)
    want = run_all(build(bh.bind_params(mod, params)), inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert relative_error(g, w) <= TOLERANCE
    return bh.report(part)


def regions(rep, target="byoc_hetero"):
    # reports name the backend by its name (onednn); ``target`` may be an alias
    return [r for r in rep.regions if r.target == bh.rules.get_target(target).name]


def conv(emit, x, w, relu=True):
    y = emit(R.nn.conv2d(x, w, padding=[int(w.ty.shape.values[2]) // 2] * 4))
    return emit(R.nn.relu(y)) if relu else y


def test_single_supported_op():
    mod = graph({"x": (1, 4, 8, 8), "w": (4, 4, 3, 3)}, lambda e, x, w: e(R.nn.conv2d(x, w, padding=1)))
    rep = check(mod, {"w": rand(4, 4, 3, 3)})
    (region,) = regions(rep)
    assert region.rules == ["onednn.conv2d"]
    assert region.inputs == ["float32[1, 4, 8, 8]"] and region.outputs == ["float32[1, 4, 8, 8]"]
    assert rep.fallbacks == []


def test_supported_ops_between_unsupported_ones():
    def body(e, x, w, v):
        y = conv(e, e(R.sin(x)), w)
        y = e(R.sin(e(R.reshape(y, (1, 64)))))
        return e(R.sin(e(R.matmul(y, v))))

    mod = graph({"x": (1, 4, 4, 4), "w": (4, 4, 3, 3), "v": (64, 8)}, body)
    rep = check(mod, {"w": rand(4, 4, 3, 3), "v": rand(64, 8)})
    assert len(regions(rep)) == 2
    # the reshape only relabels the conv's output: it joins the conv's region (issue 15)
    assert rep.profile.counts["llvm"] == {"sin": 3}
    assert sorted(sorted(r.ops) for r in regions(rep)) == [["matmul"], ["nn.conv2d", "nn.relu", "reshape"]]


def test_constants_bound_in_region_vs_passed_as_parameters():
    mod = graph({"x": (2, 16), "w": (16, 8)}, lambda e, x, w: e(R.nn.relu(e(R.matmul(x, w)))))
    bound = bh.partition(mod, {"w": rand(16, 8)})
    (ext,) = bound.attrs["external_mods"]
    assert len(ext["get_const_vars"]()) == 1
    assert regions(bh.report(bound))[0].inputs == ["float32[2, 16]"]
    unbound = bh.partition(mod)
    (ext,) = unbound.attrs["external_mods"]
    assert len(ext["get_const_vars"]()) == 0
    assert regions(bh.report(unbound))[0].inputs == ["float32[2, 16]", "float32[16, 8]"]
    check(mod, {"w": rand(16, 8)})
    check(mod)


def test_region_with_two_outputs_one_also_used_outside():
    def body(e, x, w1, w2):
        c1 = conv(e, x, w1)
        c2 = conv(e, c1, w2)
        return e(R.subtract(e(R.sin(c1)), c2))  # sin and subtract stay on llvm

    mod = graph({"x": (1, 4, 8, 8), "w1": (4, 4, 3, 3), "w2": (4, 4, 3, 3)}, body)
    rep = check(mod, {"w1": rand(4, 4, 3, 3), "w2": rand(4, 4, 3, 3, seed=1)})
    (region,) = regions(rep)
    assert len(region.outputs) == 2


@pytest.fixture
def other_target(restore_rules):
    """A second target, run by the same oneDNN runtime, that takes only 1x1 convolutions."""
    x, w = wildcard(), wildcard()
    bh.register_target("other", codegen="byoc_hetero")
    bh.register_pattern("other", "conv1x1", is_op("relax.nn.conv2d")(x, w), {"data": x, "weight": w},
                        check=lambda m: m.shape("weight")[2:] == (1, 1) or "only 1x1 kernels")
    return "other"


def test_diamond_with_a_branch_on_another_target_splits_regions(other_target):
    def body(e, x, w3a, w1, w3b, w3c):
        a = conv(e, x, w3a)            # byoc_hetero
        b = conv(e, a, w1)             # other
        c = conv(e, b, w3b)            # byoc_hetero, after other
        d = conv(e, a, w3c)            # byoc_hetero, beside other
        return e(R.add(c, d))

    shapes = {"x": (1, 4, 8, 8), "w3a": (4, 4, 3, 3), "w1": (4, 4, 1, 1), "w3b": (4, 4, 3, 3),
              "w3c": (4, 4, 3, 3)}
    mod = graph(shapes, body)
    params = {k: rand(*s, seed=i) for i, (k, s) in enumerate(shapes.items()) if k != "x"}
    rep = check(mod, params, target=["other", "byoc_hetero"])
    assert len(regions(rep, "other")) == 1
    # a, c, d cannot be one region: c depends on `other`, which depends on a (a cycle)
    assert len(regions(rep, "byoc_hetero")) >= 2
    assert sum(r.ops["nn.conv2d"] for r in regions(rep, "byoc_hetero")) == 3


def test_diamond_on_one_target_is_one_region():
    def body(e, x, w1, w2, w3):
        a = e(R.nn.relu(e(R.matmul(x, w1))))
        b = e(R.matmul(a, w2))
        c = e(R.matmul(a, w3))
        return e(R.matmul(b, e(R.permute_dims(c, [1, 0]))))

    shapes = {"x": (4, 8), "w1": (8, 8), "w2": (8, 6), "w3": (8, 6)}
    mod = graph(shapes, body)
    rep = check(mod, {k: rand(*s, seed=i) for i, (k, s) in enumerate(shapes.items()) if k != "x"})
    (region,) = regions(rep)
    # b and c, two products of `a` by constant weights, are one matmul and a split
    # (combine_parallel_denses): the diamond a -> (b, c) -> out is still one region
    assert region.ops["matmul"] == 3 and region.ops["split"] == 1, region.ops


def test_two_independent_producers_feed_one_consumer():
    def body(e, x1, x2, w1, w2):
        p1 = e(R.matmul(x1, w1))
        p2 = e(R.matmul(x2, w2))
        return e(R.matmul(p1, e(R.permute_dims(p2, [1, 0]))))

    shapes = {"x1": (3, 8), "x2": (5, 8), "w1": (8, 4), "w2": (8, 4)}
    mod = graph(shapes, body)
    rep = check(mod, {"w1": rand(8, 4), "w2": rand(8, 4, seed=1)})
    (region,) = regions(rep)
    assert region.inputs == ["float32[3, 8]", "float32[5, 8]"]
    assert region.outputs == ["float32[3, 5]"]


def test_region_output_used_twice():
    def body(e, x, w):
        r = conv(e, x, w)
        return e(R.subtract(e(R.sin(r)), e(R.cos(r))))

    rep = check(graph({"x": (1, 4, 8, 8), "w": (4, 4, 3, 3)}, body), {"w": rand(4, 4, 3, 3)})
    (region,) = regions(rep)
    assert len(region.outputs) == 1
    assert rep.profile.counts["llvm"] == {"sin": 1, "cos": 1, "subtract": 1}


def test_tuple_outputs_and_tuple_access_across_the_boundary():
    def body(e, x, w1, w2):
        parts = e(R.split(x, 2, axis=1))
        a = conv(e, e(relax.TupleGetItem(parts, 0)), w1)
        b = conv(e, e(relax.TupleGetItem(parts, 1)), w2)
        return e(relax.Tuple([a, e(R.exp(b)), b]))

    mod = graph({"x": (1, 8, 6, 6), "w1": (4, 4, 3, 3), "w2": (4, 4, 3, 3)}, body)
    rep = check(mod, {"w1": rand(4, 4, 3, 3), "w2": rand(4, 4, 3, 3, seed=2)})
    assert sum(r.ops["nn.conv2d"] for r in regions(rep)) == 2


def test_pattern_priority_smaller_pattern_first_leaves_relu_outside(restore_rules):
    x, w = wildcard(), wildcard()
    bh.register_target("prio", codegen="byoc_hetero")
    anchor = is_op("relax.nn.conv2d")(x, w)
    bh.register_pattern("prio", "conv2d", anchor, {"data": x, "weight": w}, priority=5)
    bh.register_pattern("prio", "conv2d_relu", is_op("relax.nn.relu")(anchor), {"data": x}, priority=1)
    mod = graph({"x": (1, 4, 8, 8), "w": (4, 4, 3, 3)}, lambda e, x, w: conv(e, x, w))
    rep = check(mod, {"w": rand(4, 4, 3, 3)}, target="prio")
    (region,) = regions(rep, "prio")
    assert region.rules == ["prio.conv2d"]
    assert rep.profile.counts["llvm"] == {"nn.relu": 1}


def test_intermediate_value_escaping_a_match_is_not_fused():
    def body(e, x, w):
        c = e(R.nn.conv2d(x, w, padding=1))
        r = e(R.nn.relu(c))
        return e(R.subtract(r, e(R.sin(c))))  # c escapes conv2d_relu

    rep = check(graph({"x": (1, 4, 8, 8), "w": (4, 4, 3, 3)}, body), {"w": rand(4, 4, 3, 3)})
    (region,) = regions(rep)
    # conv and relu are separate composites (the relu on its own), c leaves the region
    assert sorted(region.rules) == ["onednn.activation", "onednn.conv2d"]
    assert len(region.outputs) == 2
    assert any(r.rule == "onednn.conv2d_relu" and "used outside" in r.reason for r in rep.rejections)


def test_symbolic_reduction_dim_is_rejected_with_the_reason_in_the_report():
    """A symbolic batch is offloaded (issue 16, tests/test_symbolic.py); a symbolic K of a dense layer is not."""
    k = tvm.tirx.Var("k", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, k), F32))
    w = relax.Var("w", relax.TensorType((k, 8), F32))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            gv = bb.emit_output(bb.emit(R.matmul(x, w)))
        bb.emit_func_output(gv)
    rep = bh.report(bh.partition(bb.get()))
    assert rep.regions == []
    (fallback,) = rep.fallbacks
    assert fallback.op == "matmul" and "symbolic" in fallback.reason and fallback.rule.startswith("onednn.dense")
    ex = build(bh.partition(bb.get()))
    xs, ws = rand(2, 16), rand(16, 8)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(ws)).numpy()
    np.testing.assert_allclose(got, xs @ ws, rtol=1e-5, atol=1e-5)


def test_target_order_decides_for_op_rules_too(restore_rules):
    for name in ("first", "second"):
        bh.register_target(name, codegen="byoc_hetero")
        bh.op_rule("relax.matmul", target=name)(lambda m: True)
    mod = graph({"x": (2, 8), "w": (8, 4)}, lambda e, x, w: e(R.matmul(x, w)))
    params = {"w": rand(8, 4)}
    for order in (["first", "second"], ["second", "first"]):
        rep = check(mod, params, target=order)
        assert [r.target for r in rep.regions] == [order[0]]


def test_unregistering_rules_leaves_ops_on_llvm(restore_rules):
    for rule in pattern_rules("byoc_hetero"):
        if rule.name.startswith("conv2d"):
            bh.unregister_pattern("byoc_hetero", rule.name)
    mod, params = bh.models.small_convnet()
    rep = check(mod, params)
    assert rep.profile.counts["llvm"]["nn.conv2d"] == 3
    assert all(r.ops["nn.conv2d"] == 0 for r in rep.regions)
    with pytest.raises(bh.RuleError, match="no pattern rule byoc_hetero.conv2d"):
        bh.unregister_pattern("byoc_hetero", "conv2d")
    tvm.ir.register_op_attr("relax.nn.conv2d", "target.byoc_hetero", lambda call: True)
    bh.unregister_op_rule("relax.nn.conv2d")
    assert "relax.nn.conv2d" not in bh.rules.op_rule_ops("byoc_hetero")


def test_cost_gate_sends_small_regions_back_with_the_reason():
    def body(e, x, w1, w2, v):
        y = conv(e, conv(e, x, w1), w2)                    # a region of 4 ops
        y = e(R.sin(e(R.reshape(y, (1, 64)))))             # llvm
        return e(R.matmul(y, v))                           # a region of 1 op

    shapes = {"x": (1, 4, 4, 4), "w1": (4, 4, 3, 3), "w2": (4, 4, 3, 3), "v": (64, 8)}
    mod = graph(shapes, body)
    params = {k: rand(*s, seed=i) for i, (k, s) in enumerate(shapes.items()) if k != "x"}
    assert len(check(mod, params).regions) == 2
    rep = check(mod, params, min_region_ops=3)
    (region,) = rep.regions
    assert region.ops["nn.conv2d"] == 2
    (gated,) = [f for f in rep.fallbacks if "cost gate" in f.reason]
    assert gated.op == "matmul" and gated.rule == "onednn.dense"
    assert "region of 1 ops is below the cost gate (min_region_ops=3)" in gated.reason


def test_cost_gate_requires_a_heavy_op(restore_rules):
    bh.op_rule("relax.matmul")(lambda m: True)
    # a region with only a relu is not worth a boundary: a target offering relu alone
    x = wildcard()
    bh.register_target("eltwise", codegen="byoc_hetero")
    bh.register_pattern("eltwise", "relu", is_op("relax.nn.relu")(x), {"data": x})
    mod = graph({"x": (2, 8)}, lambda e, x: e(R.nn.relu(x)))
    part = bh.partition(mod, target="eltwise")
    rep = bh.report(part)
    assert rep.regions == []
    assert "no compute-heavy op" in rep.fallbacks[0].reason
    assert any("no compute-heavy op" in r.reason for r in rejections(part))


def test_region_returns_only_the_values_its_callers_use():
    """Issue 15: a value read only through a tuple nobody else reads (PyTorch's max-pool indices)
    is no output of the region: the region graph has exactly the outputs main uses."""
    def body(e, x, w):
        c = e(R.nn.conv2d(x, w, padding=1))
        r = e(R.nn.relu(c))
        both = e(relax.Tuple([c, r]))  # c is read only through the tuple; only r is used
        return e(relax.TupleGetItem(both, 1))

    mod = graph({"x": (1, 4, 8, 8), "w": (4, 4, 3, 3)}, body)
    part = bh.partition(mod, {"w": rand(4, 4, 3, 3)})
    (ext,) = part.attrs["external_mods"]
    from byoc_hetero._relax import region_graph_json

    assert len(region_graph_json(ext)["outputs"]) == 1
    check(mod, {"w": rand(4, 4, 3, 3)})
