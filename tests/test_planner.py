"""The planner on its own: ``_C.plan_region`` plans a region document without running anything,
``_C.prepare_weights`` plans it several times into one store of prepared weights.

The properties checked are the ones the runtime relies on: one step per computing node, no step for a
reshape, intermediates sharing arena space only when their lifetimes do not overlap, errors naming the
node and the field, plans independent of the constants' values, weights prepared once for all plans.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from byoc_hetero import _C
from test_runtime import Region, rand


def conv_relu_conv():
    r = Region("plan_crc")
    x = r.input((1, 16, 12, 12))
    a = r.node("conv2d", [x, r.const(rand(16, 16, 3, 3)), r.const(rand(16))], (1, 16, 12, 12),
               padding=[1, 1, 1, 1], has_bias=1)
    b = r.node("eltwise", [a], (1, 16, 12, 12), algorithm="relu")
    r.outputs = [r.node("conv2d", [b, r.const(rand(8, 16, 1, 1))], (1, 8, 12, 12), has_bias=0)]
    return r


def computing(steps):
    """The ops of the steps that compute a node (the planner's reorders have no op)."""
    return [s["op"] for s in steps if s["op"]]


def test_conv_relu_conv_plans_one_step_per_node_and_prepares_its_weights():
    r = conv_relu_conv()
    plan = _C.plan_region(r.json(), threads=1)
    assert plan["symbol"] == "plan_crc" and plan["threads"] == 1
    assert plan["input_shapes"] == [[1, 16, 12, 12]] and plan["output_shapes"] == [[1, 8, 12, 12]]
    assert computing(plan["run_steps"]) == ["conv2d", "eltwise", "conv2d"]
    # the relu reads the conv's layout as it is: no reorder between them
    between = plan["run_steps"][[s["op"] for s in plan["run_steps"]].index("conv2d") + 1]
    assert between["op"] == "eltwise", plan["run_steps"]
    # constants only go through the init program, each step completing one prepared weight
    assert all(s["op"] == "" and s["writes"] >= 0 for s in plan["init_steps"])
    # the bias (16 floats), wanted in its own plain layout, is read in place: no buffer, no step
    (bias,) = [b for b in plan["shared"] if b["constant"] >= 0]
    assert bias["key"] == "constant 1" and bias["bytes"] == 64 and bias["run"]
    prepared = [b for b in plan["shared"] if b["constant"] < 0]
    assert plan["shared_bytes"] == sum(b["bytes"] for b in prepared) > 0
    assert len(plan["init_steps"]) == len(prepared) == 2
    assert all(b["key"].startswith("tensor ") and b["run"] for b in prepared)
    assert all(s["impl"] for s in plan["init_steps"] + plan["run_steps"])


def test_intermediates_share_arena_space_only_when_their_lifetimes_do_not_overlap():
    r = Region("plan_arena")
    t = r.input((1, 64, 32, 32))
    for alg in ["relu", "sigmoid", "tanh", "relu", "sigmoid"]:
        t = r.node("eltwise", [t], (1, 64, 32, 32), algorithm=alg)
    r.outputs = [t]
    plan = _C.plan_region(r.json())
    priv = plan["private"]
    assert len(priv) == 4  # the 4 intermediates (the last eltwise writes the caller's buffer)
    rounded = [(b["bytes"] + 63) // 64 * 64 for b in priv]
    for i, a in enumerate(priv):
        for j, b in enumerate(priv[:i]):
            alive_together = a["first"] <= b["last"] and b["first"] <= a["last"]
            apart = a["offset"] + rounded[i] <= b["offset"] or b["offset"] + rounded[j] <= a["offset"]
            assert apart or not alive_together, (a, b)
    # a chain needs two buffers at a time, not four
    assert plan["arena_bytes"] == 2 * max(rounded) < sum(rounded)


def test_reshape_plans_no_step():
    r = Region("plan_reshape")
    y = r.node("reshape", [r.input((2, 3, 4))], (6, 4))
    r.outputs = [r.node("eltwise", [y], (6, 4), algorithm="relu")]
    plan = _C.plan_region(r.json())
    assert computing(plan["run_steps"]) == ["eltwise"]
    assert not plan["init_steps"]


def test_bad_attr_raises_naming_node_and_field():
    r = Region("plan_bad")
    r.outputs = [r.node("conv2d", [r.input((1, 4, 8, 8)), r.const(rand(8, 4, 3, 3))], (1, 8, 8, 8),
                        padding=[1, 1], has_bias=0)]
    with pytest.raises(ValueError, match=r"region 'plan_bad' node 0 \(conv2d\).*attrs\.padding"):
        _C.plan_region(r.json())


def test_only_the_declared_shapes_can_be_planned_until_shapes_are_symbolic():
    r = conv_relu_conv()
    assert _C.plan_region(r.json(), input_shapes=[[1, 16, 12, 12]])["run_steps"]
    with pytest.raises(ValueError, match=r"plan_crc.*input shapes \(\[1, 16, 24, 24\]\).*static shapes"):
        _C.plan_region(r.json(), input_shapes=[[1, 16, 24, 24]])


def test_plan_does_not_depend_on_the_constants():
    r = conv_relu_conv()
    threads = _C.num_threads()
    plan = _C.plan_region(r.json(), threads=threads)
    lines = [f"{phase} | {s['label']} | {s['impl']}{s['layouts']}"
             for phase in ("init", "run") for s in plan[f"{phase}_steps"]]
    before = r.module(init=False)
    assert list(before["get_plan"]()) == lines
    after = r.module(init=True)
    assert list(after["get_plan"]()) == lines
    r.const_values = [np.zeros_like(v) for v in r.const_values]
    assert _C.plan_region(r.json(), threads=threads) == plan


def test_plans_share_one_copy_of_the_prepared_weights():
    r = conv_relu_conv()
    plan = _C.plan_region(r.json())
    out = _C.prepare_weights(r.json(), r.const_values, plans=3)
    assert out["buffers"] == len([b for b in plan["shared"] if b["constant"] < 0])
    assert out["bytes"] == plan["shared_bytes"]
    # the first plan fills every weight; the others find them filled and run nothing
    assert out["init_steps_run"] == [len(plan["init_steps"]), 0, 0]
    with pytest.raises(ValueError, match="expected 3 constants, got 1"):
        _C.prepare_weights(r.json(), r.const_values[:1])



@pytest.mark.skipif(not _C.bf16_native(), reason=f"needs native bf16 (this CPU: {_C.isa()})")
@pytest.mark.parametrize("reader", ["pool2d", "softmax"])
def test_bf16_storage_follows_the_traits_the_readers_declared(reader):
    """In a bf16 region a conv stores its output bf16 exactly when every reader's kernel declared,
    when it registered (KernelTraits::bf16_input), that it reads that input rounded or like its own
    bf16 output: a max pool before a conv does (the max of rounded values is the rounded max), a
    softmax declares nothing, so the conv before it keeps writing f32."""
    traits = _C.kernel_traits()
    assert set(traits) == set(_C.kernels())
    r = Region("plan_traits")
    x = r.input((1, 16, 8, 8))
    a = r.node("conv2d", [x, r.const(rand(16, 16, 3, 3))], (1, 16, 8, 8), padding=[1, 1, 1, 1], has_bias=0)
    if reader == "pool2d":
        b, size = r.node("pool2d", [a], (1, 16, 4, 4), algorithm="max", kernel=[2, 2], strides=[2, 2]), 4
    else:
        b, size = r.node("softmax", [a], (1, 16, 8, 8), axis=1), 8
    r.outputs = [r.node("conv2d", [b, r.const(rand(8, 16, 1, 1))], (1, 8, size, size), has_bias=0)]
    doc = r.doc()
    doc["precision"] = "bf16"
    plan = _C.plan_region(json.dumps(doc), threads=1)
    first_conv = next(s for s in plan["run_steps"] if s["op"] == "conv2d")
    bf16_dst = first_conv["layouts"].split(" dst=")[1].endswith(":bf16")
    assert bf16_dst == traits[reader]["bf16_input"] == (reader == "pool2d"), plan["run_steps"]


def test_prefill_and_decode_plans_of_a_dense_share_one_prepared_weight():
    """A symbolic dense planned for many rows (2 threads: oneDNN's inner product, its weight [N, K] in
    AB16b64a) and for one row (the GEMV on the matmul's layout, [K, N] in BA16a64b) asks for the same
    bytes under two axis orders: one prepared-weight key, so a generator holds one copy (issue 36)."""
    r = Region("dense_rows")
    x = r.input(["S", 128])
    r.outputs = [r.node("dense", [x, r.const(rand(192, 128))], ["S", 192], weight_layout="NK", has_bias=0)]
    doc = dict(r.doc(), version=2)
    graph = json.dumps(doc)

    def prepared(rows, threads):
        plan = _C.plan_region(graph, [[rows, 128]], threads=threads)
        dense = [s for s in plan["run_steps"] if s["op"] == "dense"]
        assert len(dense) == 1, plan["run_steps"]
        return {b["key"] for b in plan["shared"] if b["run"] and b["constant"] < 0}, dense[0]["impl"]

    decode, decode_impl = prepared(1, 2)
    prefill, prefill_impl = prepared(128, 2)
    assert len(decode) == 1 and prefill == decode, (prefill_impl, prefill, decode_impl, decode)
    assert prepared(128, 1)[0] == decode and prepared(1, 1)[0] == decode
