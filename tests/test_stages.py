"""The four stages: each does visible work; regions and composites are as expected."""

from __future__ import annotations

import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero._relax import region_graph_json


def _functions_with(mod, attr):
    return {gv.name_hint: f for gv, f in mod.functions.items()
            if isinstance(f, relax.Function) and f.attrs is not None and attr in f.attrs}


def _composite_names(mod):
    names = []

    def visit(expr):
        if isinstance(expr, relax.Function) and expr.attrs is not None and "Composite" in expr.attrs:
            names.append(str(expr.attrs["Composite"]))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            if func.attrs is not None and "Composite" in func.attrs:
                names.append(str(func.attrs["Composite"]))
            relax.analysis.post_order_visit(func.body, visit)
    return sorted(names)


def test_stage_names_and_types():
    st = bh.stages()
    assert [s.info.name for s in st] == ["MergeComposite", "AnnotateTarget", "MergeCompilerRegions",
                                         "PartitionGraph"]
    assert all(isinstance(s, tvm.transform.Pass) for s in st)


def test_each_stage_on_the_small_convnet():
    mod, params = bh.models.small_convnet()
    m = bh.bind_params(mod, params)
    merge_composite, annotate, merge_regions, partition_graph = bh.stages()

    m = merge_composite(m)
    composites = _functions_with(m, "Composite")
    assert sorted(str(f.attrs["Composite"]) for f in composites.values()) == [
        "onednn.conv2d_bias", "onednn.conv2d_bias_relu", "onednn.conv2d_relu",
        "onednn.dense_bias", "onednn.dense_flat_bias_relu", "onednn.max_pool2d"]
    prof = bh.op_profile(m)
    assert prof.composites["byoc_hetero"] == 6
    assert "llvm" not in prof.counts

    m = annotate(m)
    assert all(str(f.attrs["byoc_hetero.target"]) == "onednn"
               for f in _functions_with(m, "Composite").values())

    m = merge_regions(m)
    regions = _functions_with(m, "Codegen")
    assert len(regions) == 1  # the six composites are neighbours: one region
    assert all(str(f.attrs["Codegen"]) == "onednn" for f in regions.values())
    assert bh.op_profile(m).regions["byoc_hetero"] == 1
    assert len(_composite_names(m)) == 6

    m = partition_graph(m)
    assert not _functions_with(m, "Codegen")
    assert len(m.attrs["external_mods"]) == 1
    text = m["main"].script()
    assert text.count("call_dps_packed") == 1
    prof = bh.op_profile(m)
    assert prof.regions["byoc_hetero"] == 1 and prof.composites["byoc_hetero"] == 6
    assert prof.counts["byoc_hetero"]["nn.conv2d"] == 3 and prof.counts["byoc_hetero"]["matmul"] == 2


def test_partition_shortcut_equals_the_stages():
    mod, params = bh.models.small_convnet()
    m = bh.bind_params(mod, params)
    for stage in bh.stages():
        m = stage(m)
    short = bh.partition(mod, params)
    assert str(bh.op_profile(short)) == str(bh.op_profile(m))


def test_identical_regions_share_one_symbol():
    """Two calls of the same conv with the same weight: one external module, two call sites."""
    import numpy as np

    from conftest import graph, offload_and_compare

    def body(e, x, w):
        y = e(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
        y = e(relax.op.sin(y))  # stays on llvm: two regions
        return e(relax.op.nn.relu(relax.op.nn.conv2d(y, w, padding=1)))

    params = {"w": np.random.default_rng(0).standard_normal((4, 4, 3, 3)).astype("float32")}
    res = offload_and_compare(graph({"x": (1, 4, 8, 8), "w": (4, 4, 3, 3)}, body), params)
    assert len(res.partitioned.attrs["external_mods"]) == 1
    assert res.partitioned["main"].script().count("call_dps_packed") == 2


def test_bind_params_rejects_unknown_names_and_shapes():
    import numpy as np
    import pytest

    mod, params = bh.models.mlp(features=8, hidden=(4,), num_classes=2)
    with pytest.raises(ValueError, match="'nope' is not a parameter of main"):
        bh.bind_params(mod, {"nope": np.zeros(1, "float32")})
    with pytest.raises(ValueError, match="'fc1_weight': expected shape \\[8, 4\\], got \\[4, 8\\]"):
        bh.bind_params(mod, {"fc1_weight": np.zeros((4, 8), "float32")})
    with pytest.raises(ValueError, match="expected dtype float32, got float64"):
        bh.bind_params(mod, {"fc1_weight": np.zeros((8, 4))})


def _two_conv_blocks(same_weights: bool):
    """Two conv2d+relu blocks on two inputs, with equal or different weights."""
    import numpy as np

    rng = np.random.default_rng(1)
    w1 = rng.standard_normal((4, 4, 3, 3)).astype("float32")
    w2 = w1.copy() if same_weights else rng.standard_normal((4, 4, 3, 3)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    y = relax.Var("y", relax.TensorType((1, 4, 8, 8), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, relax.const(w1), padding=1)))
            b = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(y, relax.const(w2), padding=1)))
            gv = bb.emit_output(relax.op.add(relax.op.sin(a), relax.op.sin(b)))
        bb.emit_func_output(gv)
    return bb.get()


def test_composites_with_equal_constants_are_still_shared():
    """The constants digest on composites keeps TVM's de-duplication as it was: composites with
    equal weights share one function, composites with different weights get one each."""
    from byoc_hetero.rules import CONST_DIGEST_ATTR

    def conv_composites(mod):
        return [f for f in _functions_with(bh.stages()[0](mod), "Composite").values()
                if "conv2d" in str(f.attrs["Composite"])]

    shared = conv_composites(_two_conv_blocks(True))
    assert len(shared) == 1
    distinct = conv_composites(_two_conv_blocks(False))
    assert len(distinct) == 2
    assert len({str(f.attrs[CONST_DIGEST_ATTR]) for f in distinct}) == 2


def test_long_region_gets_a_short_name_and_matches_llvm():
    """A region of many composites: its symbol (and so its constants' names) stays short, the
    whole chain is still one region, and it computes what the llvm-only build computes."""
    import numpy as np

    from conftest import offload_and_compare

    from byoc_hetero.stages import MAX_REGION_NAME

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for _ in range(40):
                w = relax.const((rng.standard_normal((4, 4, 3, 3)) * 0.2).astype("float32"))
                y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(y, w, padding=1)))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    mod = bb.get()

    st = bh.stages()
    merged = st[2](st[1](st[0](mod)))
    (name,) = _functions_with(merged, "Codegen")
    assert len(name) <= MAX_REGION_NAME and name.endswith("_onednn")
    assert str(merged[name].attrs["global_symbol"]) == name

    res = offload_and_compare(mod)
    assert res.profile.regions["byoc_hetero"] == 1 and "llvm" not in res.profile.counts
    assert res.partitioned["main"].script().count("call_dps_packed") == 1
    (ext,) = res.partitioned.attrs["external_mods"]
    graph = region_graph_json(ext)
    assert graph["symbol"] == name and len(graph["constants"]) == 40
    assert all(len(c["name"]) < MAX_REGION_NAME + 40 for c in graph["constants"])


def _two_function_module():
    """Issue 18's repro: ``main`` and ``second``, each relu(conv2d(x, w))."""
    bb = relax.BlockBuilder()
    for name in ("main", "second"):
        x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
        w = relax.Var("w", relax.TensorType((4, 3, 3, 3), "float32"))
        with bb.function(name, [x, w]):
            with bb.dataflow():
                o = bb.emit_output(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
            bb.emit_func_output(o)
    return bb.get()


def test_module_with_two_functions_partitions_each_on_its_own():
    import numpy as np

    from byoc_hetero.timing import build, relative_error, run

    mod = _two_function_module()
    part = bh.partition(mod)
    for name in ("main", "second"):
        prof = bh.op_profile(part, name)
        assert prof.counts.get("llvm", {}) == {}, name
        assert prof.counts["byoc_hetero"] == {"nn.conv2d": 1, "nn.relu": 1}, name
        assert bh.report(part, name).regions[0].target == "onednn"
    # each function calls a region of its own name
    symbols = sorted(str(region_graph_json(m)["symbol"]) for m in part.attrs["external_mods"])
    assert len(symbols) == 2 and symbols[1].startswith("second_"), symbols
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 3, 8, 8), dtype="float32"), rng.standard_normal((4, 3, 3, 3), dtype="float32")
    got, want = build(part), build(mod)
    for name in ("main", "second"):
        assert relative_error(run(got, [x, w], entry=name), run(want, [x, w], entry=name)) < 1e-5


def test_bind_params_keeps_a_0d_weight_0d():
    """Issue 15: np.ascontiguousarray made a 0-d int64 index (ViT's class token) shape (1,)."""
    import numpy as np

    from byoc_hetero.timing import build, run

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 4), "float32"))
    i = relax.Var("i", relax.TensorType((), "int64"))
    with bb.function("main", [x, i]):
        with bb.dataflow():
            o = bb.emit_output(relax.op.take(x, i, axis=0))
        bb.emit_func_output(o)
    bound = bh.bind_params(bb.get(), {"i": np.array(2, dtype="int64")})
    assert [p.name for p in bound["main"].params] == ["x"]
    xs = np.arange(12, dtype="float32").reshape(3, 4)
    out = run(build(bound), [xs])
    assert out.shape == (4,)
    np.testing.assert_array_equal(out, xs[2])
