"""Rules: built-in patterns, op-attribute rules, checks that reject, bad rules."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import offload_and_compare
from reference import conv2d_nchw, relu
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

import byoc_hetero as bh
from byoc_hetero.rules import pattern_rules, rejections
from byoc_hetero.timing import build, run


def conv_module(dtype="float32", layout="NCHW", shape=(1, 4, 8, 8), cout=6, relu_after=True):
    """main(x, w) = relu(conv2d(x, w)) with a constant-free weight parameter."""
    if layout == "NCHW":
        wshape, kernel_layout = (cout, shape[1], 3, 3), "OIHW"
    else:  # NHWC data, HWIO weight
        wshape, kernel_layout = (3, 3, shape[3], cout), "HWIO"
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    w = relax.Var("w", relax.TensorType(wshape, dtype))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1, data_layout=layout, kernel_layout=kernel_layout))
            if relu_after:
                y = bb.emit(relax.op.nn.relu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def sin_module():
    """main(x) = sin(x): an op the byoc_hetero runtime has no kernel for."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.sin(x)))
        bb.emit_func_output(out)
    return bb.get()


def test_builtin_rules_are_ordered_largest_first():
    names = [r.name for r in pattern_rules("byoc_hetero")]
    assert names.index("conv2d_bias_relu") < names.index("conv2d_bias") < names.index("conv2d")
    assert names.index("conv2d_bias_relu") < names.index("conv2d_relu") < names.index("conv2d")
    assert names.index("dense_bias_relu") < names.index("dense")
    assert {"conv2d_bias_relu", "conv2d_relu", "conv2d_bias", "conv2d", "dense_bias_relu",
            "dense_relu", "dense_bias", "dense"} <= set(names)


def test_float32_conv_is_offloaded_and_correct():
    mod = conv_module()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 8, 8)).astype("float32")
    w = rng.standard_normal((6, 4, 3, 3)).astype("float32")
    part = bh.partition(mod)
    assert bh.op_profile(part).counts["byoc_hetero"]["nn.conv2d"] == 1
    got = run(build(part), [x, w])
    np.testing.assert_allclose(got, relu(conv2d_nchw(x, w, padding=(1, 1, 1, 1))), rtol=1e-4, atol=1e-4)


def test_float16_conv_is_rejected_and_stays_on_llvm():
    mod = conv_module(dtype="float16")
    part = bh.partition(mod)
    prof = bh.op_profile(part)
    assert "byoc_hetero" not in prof.counts
    assert prof.counts["llvm"]["nn.conv2d"] == 1
    assert any("float16" in r.reason and r.rule.startswith("onednn.conv2d") for r in rejections(part))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 8, 8)).astype("float16")
    w = rng.standard_normal((6, 4, 3, 3)).astype("float16")
    got = run(build(part), [x, w]).astype("float32")
    want = relu(conv2d_nchw(x.astype("float32"), w.astype("float32"), padding=(1, 1, 1, 1)))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_nhwc_conv_is_rejected_and_stays_on_llvm():
    mod = conv_module(layout="NHWC", shape=(1, 8, 8, 4))
    part = bh.partition(mod)
    prof = bh.op_profile(part)
    assert "byoc_hetero" not in prof.counts
    assert any("NHWC" in r.reason for r in rejections(part))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 8, 4)).astype("float32")
    w = rng.standard_normal((3, 3, 4, 6)).astype("float32")
    got = run(build(part), [x, w])
    want = conv2d_nchw(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), padding=(1, 1, 1, 1))
    np.testing.assert_allclose(got, relu(want).transpose(0, 2, 3, 1), rtol=1e-4, atol=1e-4)


def test_symbolic_reduction_dim_is_rejected_with_reason():
    """A symbolic batch runs offloaded (issue 16); a dense layer's K must stay static."""
    k = tvm.tirx.Var("k", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, k), "float32"))
    w = relax.Var("w", relax.TensorType((k, 8), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, w)))
        bb.emit_func_output(out)
    part = bh.partition(bb.get())
    assert "byoc_hetero" not in bh.op_profile(part).counts
    assert any("symbolic" in r.reason for r in rejections(part))


def test_per_channel_bias_check_rejects_a_row_broadcast():
    """conv2d → add(t of shape [1, 1, 8, 8]) is neither a bias nor a residual: not fused into the conv."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((4, 4, 3, 3), "float32"))
    t = relax.Var("t", relax.TensorType((1, 1, 8, 8), "float32"))
    with bb.function("main", [x, w, t]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            out = bb.emit_output(bb.emit(relax.op.add(y, t)))
        bb.emit_func_output(out)
    res = offload_and_compare(bb.get())
    assert res.profile.counts["byoc_hetero"]["nn.conv2d"] == 1
    assert any("not one value per output channel" in r.reason for r in rejections(res.partitioned))
    rules = [n for r in bh.report(res.partitioned).regions for n in r.rules]
    assert "onednn.conv2d" in rules and not any("bias" in n for n in rules)


def test_op_attribute_rule_offloads_single_calls(restore_rules):
    """tvm.ir.register_op_attr(op, "target.byoc_hetero", fn) as in Relay, with no patterns."""
    for rule in list(pattern_rules("byoc_hetero")):
        bh.unregister_pattern("byoc_hetero", rule.name)
    seen = []

    def conv_ok(call):
        seen.append(call)
        return True

    tvm.ir.register_op_attr("relax.nn.conv2d", "target.byoc_hetero", conv_ok)
    mod, params = bh.models.small_convnet()
    res = offload_and_compare(mod, params)
    assert len(seen) == 3
    assert res.profile.counts["byoc_hetero"] == {"nn.conv2d": 3}
    # bias adds and relus of the convs stay with TVM: single-op regions
    assert res.profile.counts["llvm"]["nn.relu"] == 3
    assert res.profile.composites["byoc_hetero"] == 3


def test_op_rule_decorator_reason_is_recorded(restore_rules):
    for rule in list(pattern_rules("byoc_hetero")):
        bh.unregister_pattern("byoc_hetero", rule.name)

    @bh.op_rule("relax.matmul", target="byoc_hetero")
    def small_only(match):
        k = match.shape("root")[-1]
        return k <= 16 or f"output width {k} > 16"

    mod, params = bh.models.mlp(features=32, hidden=(8,), num_classes=24)
    res = offload_and_compare(mod, params)
    assert res.profile.counts["byoc_hetero"] == {"matmul": 1}
    assert res.profile.counts["llvm"]["matmul"] == 1
    assert any(r.reason == "output width 24 > 16" for r in rejections(res.partitioned))


def test_op_rule_on_op_the_runtime_cannot_run_stays_on_llvm(restore_rules):
    tvm.ir.register_op_attr("relax.sin", "target.byoc_hetero", lambda call: True)
    res = offload_and_compare(sin_module())
    assert res.profile.counts["llvm"] == {"sin": 1}
    assert any("relax.sin" in r.reason and r.rule == "onednn.relax.sin" for r in rejections(res.partitioned))


def test_bad_rules_raise_rule_error_naming_the_rule(restore_rules):
    with pytest.raises(bh.RuleError, match="mynpu.bad.*DFPattern"):
        bh.register_pattern("mynpu", "bad", "relax.nn.conv2d")
    with pytest.raises(bh.RuleError, match="relax.no_such_op"):
        bh.op_rule("relax.no_such_op", target="mynpu")
    with pytest.raises(bh.RuleError, match="unknown offload target 'nonexistent'"):
        bh.stages(target="nonexistent")
    with pytest.raises(bh.RuleError, match="already registered"):
        bh.register_pattern("byoc_hetero", "conv2d", is_op("relax.nn.conv2d")(wildcard(), wildcard()))


def test_check_that_raises_is_reported_with_the_rule_name(restore_rules):
    for rule in list(pattern_rules("byoc_hetero")):
        bh.unregister_pattern("byoc_hetero", rule.name)

    def broken(match):
        raise ZeroDivisionError("oops")

    bh.register_pattern("byoc_hetero", "conv_broken", is_op("relax.nn.conv2d")(wildcard(), wildcard()),
                        check=broken)
    # a bh.RuleError, not TVM's wrapper of it (issue 18): ``except bh.RuleError`` catches it
    with pytest.raises(bh.RuleError, match="onednn.conv_broken.*ZeroDivisionError: oops"):
        bh.partition(conv_module())


def test_op_rule_that_raises_is_a_rule_error(restore_rules):
    bh.register_target("T")

    @bh.op_rule("relax.nn.relu", target="T")
    def boom_relu(match):
        return 1 / 0

    with pytest.raises(bh.RuleError, match="T.relax.nn.relu.*ZeroDivisionError"):
        bh.partition(conv_module(), target="T")


def test_op_attribute_that_raises_is_a_rule_error(restore_rules):
    bh.register_target("T")
    tvm.ir.register_op_attr("relax.nn.relu", "target.T", lambda call: 1 / 0)
    with pytest.raises(bh.RuleError, match="target.T of relax.nn.relu raised"):
        bh.partition(conv_module(), target="T")


def test_reshape_composite_of_its_own_is_lowered(restore_rules):
    """Issue 18: reshape((1,1,4,4) -> (1,16)) as its own composite, then matmul(., permute_dims(w)),
    in one region of a target running on the byoc_hetero runtime: the reshape is a node, not dropped."""
    bh.register_target("T", codegen="byoc_hetero")
    bh.op_rule("relax.reshape", target="T")(lambda m: True)
    bh.op_rule("relax.matmul", target="T")(lambda m: True)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 1, 4, 4), "float32"))
    w = relax.Var("w", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            flat = bb.emit(relax.op.reshape(x, (1, 16)))
            out = bb.emit_output(bb.emit(relax.op.matmul(flat, relax.op.permute_dims(w))))
        bb.emit_func_output(out)
    mod = bb.get()
    xs = np.random.default_rng(0).standard_normal((1, 1, 4, 4)).astype("float32")
    ws = np.random.default_rng(1).standard_normal((8, 16)).astype("float32")
    part = bh.partition(mod, target=["T"], require_heavy_op=False)
    (region,) = bh.report(part).regions
    assert region.target == "T" and region.ops == {"reshape": 1, "matmul": 1}
    got = run(build(part), [xs, ws])
    np.testing.assert_allclose(got, xs.reshape(1, 16) @ ws.T, rtol=1e-5, atol=1e-5)


def test_two_partitions_in_two_threads_report_only_their_own_reasons(restore_rules):
    """Decisions belong to one partition run: a thread rejecting with one reason never sees the
    other thread's (with a process-global decision list, each saw both or lost its own)."""
    import threading

    barrier = threading.Barrier(2)

    def check_for(tag):
        def check(match):
            barrier.wait(timeout=30)  # both threads are inside a check at the same time
            return f"rejected by {tag}"
        return check

    bh.register_target("TA")
    bh.register_target("TB")
    bh.op_rule("relax.nn.relu", target="TA")(check_for("A"))
    bh.op_rule("relax.nn.relu", target="TB")(check_for("B"))
    found = {}
    # the modules are built here: TVM's BlockBuilder keeps one process-wide "current builder"
    # stack, so two threads building a module at once trip over each other (not our state)
    modules = {t: conv_module() for t in ("TA", "TB")}

    def work(target):
        part = bh.partition(modules[target], target=target)
        found[target] = {r.reason for r in rejections(part)} | {f.reason for f in bh.report(part).fallbacks}

    threads = [threading.Thread(target=work, args=(t,)) for t in ("TA", "TB")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert found["TA"] == {"rejected by A", "no offload rule matches it"}
    assert found["TB"] == {"rejected by B", "no offload rule matches it"}


def test_op_the_runtime_cannot_lower_is_a_codegen_error_naming_region_and_op(restore_rules):
    """A target reusing the byoc_hetero codegen without its guard: the codegen's error reaches the
    caller of bh.partition as a bh.CodegenError (not TVM's RuntimeError) naming region and op."""
    bh.register_target("T", codegen="byoc_hetero")
    bh.op_rule("relax.sin", target="T")(lambda m: True)
    with pytest.raises(bh.CodegenError, match=r"region \S+_T: the runtime has no kernel for relax.sin"):
        bh.partition(sin_module(), target="T", require_heavy_op=False)
