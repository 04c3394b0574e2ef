"""The four stages: each does visible work; regions and composites are as expected."""

from __future__ import annotations

import tvm
from tvm import relax

import byoc_hetero as bh


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
        "byoc_hetero.conv2d_bias", "byoc_hetero.conv2d_bias_relu", "byoc_hetero.conv2d_relu",
        "byoc_hetero.dense_bias", "byoc_hetero.dense_flat_bias_relu", "byoc_hetero.max_pool2d"]
    prof = bh.op_profile(m)
    assert prof.composites["byoc_hetero"] == 6
    assert "llvm" not in prof.counts

    m = annotate(m)
    assert all(str(f.attrs["byoc_hetero.target"]) == "byoc_hetero"
               for f in _functions_with(m, "Composite").values())

    m = merge_regions(m)
    regions = _functions_with(m, "Codegen")
    assert len(regions) == 1  # the six composites are neighbours: one region
    assert all(str(f.attrs["Codegen"]) == "byoc_hetero" for f in regions.values())
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
