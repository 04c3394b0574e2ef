"""The pipeline's passes, each on its own (small graphs, against an llvm-only build or exact IR
expectations), the order they run in, and the backend object."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero import passes
from byoc_hetero._relax import is_composite, op_calls, op_name
from byoc_hetero.rules import get_target

from byoc_hetero.timing import build, run
from model_paths import dataflow_module as _module


def _ops(mod, func="main"):
    return [op_name(c) for c in op_calls(mod[func])]


# -- the order ----------------------------------------------------------------------------------------
def test_pipeline_order_is_pinned():
    """The whole order, by name: a pass added, removed or moved changes this list on purpose."""
    assert passes.pipeline() == [
        "onnx:matmul_nbits", "onnx:dequantized_pad_values", "onnx:gather_before_dequantize", "onnx:shape_initializers_as_constants", "onnx:explicit_same_pads",
        "onnx:fold_zero_pads", "onnx:dynamic_quantize_linear", "onnx:conv_integer_qdq", "onnx:einsum_as_matmul", "onnx:integer_clips", "onnx:scalar_reshapes",
        "onnx:drop_identity_expands",
        "onnx:ranges_from_dims", "onnx:resolve_shape_tensors", "onnx:bound_assumed_slices", "onnx:bool_arith", "onnx:checked_take",
        "onnx:te_pads",
        "torch:float_ops_on_integers", "torch:nonempty_dims", "torch:inbound_slices", "torch:bool_arith", "torch:checked_take",
        "matmul_integer_qdq", "dynamic_quantize_per_reader", "fold_int_constants",
        "narrow_gathered_products", "fold_weight_subgraphs", "drop_constant_selects", "te_clips", "gather_elements_as_take", "drop_proven_index_checks", "fold_negative_indices",
        "drop_zero_pads", "compose_row_moves", "drop_empty_operands",
        "compose_permutes", "matmul_repeated_heads", "combine_parallel_denses",
        "[MergeComposite]", "drop_needless_broadcasts", "canonicalize_bindings", "dead_code_elimination",
        "fuse_pattern_rules", "[AnnotateTarget]", "fuse_op_rules", "mark_composite_targets",
        "[MergeCompilerRegions]", "close_shape_arguments", "merge_composite_functions", "cost_gate",
        "close_region_shape_arguments", "shorten_region_names", "[PartitionGraph]", "run_codegen",
        "onednn:fuse_matmul_epilogues", "onednn:fuse_eltwise_into_producer", "onednn:fuse_rotary_embeddings", "onednn:fold_operand_scales", "onednn:fold_views", "onednn:fuse_attention",
        "onednn:fold_channel_scales", "onednn:fold_dense_input_scales", "onednn:drop_abs_before_square",
        "onednn:fuse_rms_statistics", "onednn:fold_norm_weights", "onednn:fuse_affine_tails",
        "onednn:fold_gate_products", "onednn:fold_residual_adds", "onednn:fold_pads",
        "onednn:fuse_dynamic_int8_sources", "onednn:fuse_int8_anchors", "onednn:fuse_int8_activations",
        "onednn:fuse_int8_lookup_tables", "onednn:fuse_int8_binaries", "onednn:fuse_quantize_dequantize",
        "onednn:move_views_to_8bit", "onednn:share_repeated_quantizations",
        "onednn:fuse_int8_matmuls", "onednn:fuse_elementwise_chains",
        "onednn:apply_conv_algorithms",
        "onednn:merge_common_nodes", "onednn:apply_node_precisions",
        "insert_range_checks", "host_code_anchor",
    ]


def test_every_region_pass_has_its_place():
    """A region-graph pass an op module registers must be listed in the backend's REGION_PASSES
    (else it would run last, in import order: the order this replaced)."""
    backend = get_target("onednn")
    registered = [name for name, _ in backend.lowering.graph_passes_by_name()]
    assert sorted(registered) == sorted(backend.region_passes)
    assert [name for name, _ in backend.graph_passes()] == list(backend.region_passes)


def test_every_pass_says_what_it_rewrites():
    for group in (passes.ONNX_IMPORT, passes.TORCH_IMPORT, passes.BEFORE_STAGES, passes.BEFORE_FUSION,
                  passes.BEFORE_MERGE, passes.AFTER_MERGE):
        for p in group:
            assert len(p.doc) > 20, p.name


# -- Relax passes before fusion --------------------------------------------------------------------------
def test_drop_needless_broadcasts():
    """broadcast_to(x, x's own shape) goes; matmul(a, broadcast_to(w, [B, K, N])) reads w; the
    results equal the original module's on llvm."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype("float32")
    x = relax.Var("x", relax.TensorType([2, 3, 8], "float32"))

    def body(bb, x):
        same = bb.emit(relax.op.broadcast_to(x, relax.ShapeExpr([2, 3, 8])))
        wide = bb.emit(relax.op.broadcast_to(relax.const(w), relax.ShapeExpr([2, 8, 4])))
        return relax.op.matmul(same, wide)

    mod = _module([x], body)
    out = passes.drop_needless_broadcasts(mod)
    assert "relax.broadcast_to" not in _ops(relax.transform.DeadCodeElimination(["main"])(out))
    xv = rng.standard_normal((2, 3, 8)).astype("float32")
    np.testing.assert_allclose(run(build(out), [xv]), xv @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(build(mod), [xv]), xv @ w, rtol=1e-5, atol=1e-5)



def test_binary_reads_the_unbroadcast_operand():
    """x / broadcast_to(n, x's shape) (torch's F.normalize) divides by n itself, a broadcast first
    operand of a multiply swaps places; a broadcast that widens the result, or a subtract's broadcast
    first operand (oneDNN's src0, which does not broadcast), stays. The results equal numpy's on llvm."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType([2, 3, 8], "float32"))
    n = relax.Var("n", relax.TensorType([2, 3, 1], "float32"))
    r = relax.Var("r", relax.TensorType([3, 1], "float32"))

    def valid(bb, x, n, r):
        wide = bb.emit(relax.op.broadcast_to(n, relax.ShapeExpr([2, 3, 8])))
        quotient = bb.emit(relax.op.divide(x, wide))
        product = bb.emit(relax.op.multiply(wide, quotient))
        flipped = bb.emit(relax.op.subtract(wide, product))
        grown = bb.emit(relax.op.broadcast_to(r, relax.ShapeExpr([2, 3, 8])))
        return relax.op.add(relax.op.strided_slice(flipped, [0], [0], [1]), grown)

    mod = _module([x, n, r], valid)
    out = relax.transform.DeadCodeElimination(["main"])(passes.drop_needless_broadcasts(mod))
    calls = {op_name(c): c for c in op_calls(out["main"])}
    assert [a.name for a in calls["relax.divide"].args] == ["x", "n"]
    assert calls["relax.multiply"].args[1].name == "n"
    assert _ops(out).count("relax.broadcast_to") == 2  # the subtract's src0 and the widening one stay
    assert calls["relax.add"].args[1].name != "r"  # [1, 3, 8] + r would give [1, 3, 8]: it widens
    xv = rng.standard_normal((2, 3, 8)).astype("float32")
    nv = rng.uniform(1, 2, (2, 3, 1)).astype("float32")
    rv = rng.standard_normal((3, 1)).astype("float32")
    q = xv / nv
    f = nv - nv * q
    want = f[0:1] + np.broadcast_to(rv, (2, 3, 8))
    np.testing.assert_allclose(run(build(out), [xv, nv, rv]), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run(build(mod), [xv, nv, rv]), want, rtol=1e-5, atol=1e-5)

def test_fold_int_constants():
    """An int64 chain on constants (arange, add) becomes one constant; the float math stays."""
    x = relax.Var("x", relax.TensorType([4], "float32"))

    def body(bb, x):
        idx = bb.emit(relax.op.add(relax.op.arange(0, 4, 1, dtype="int64"), relax.const(1, "int64")))
        return relax.op.add(x, relax.op.astype(idx, "float32"))

    mod = _module([x], body)
    out = passes.fold_int_constants(mod)
    assert "relax.arange" not in _ops(out) and "relax.add" in _ops(out)
    xv = np.arange(4, dtype="float32")
    np.testing.assert_allclose(run(build(out), [xv]), xv + np.arange(1, 5), rtol=0, atol=0)


def test_inbound_slices():
    """A slice of a (1, 512) table to S with S declared <= 512 is in bound: its shape is (1, S)."""

    s = tvm.tirx.Var("S", "int64")
    x = relax.Var("x", relax.TensorType([1, s], "float32"))
    table = relax.const(np.arange(512, dtype="float32").reshape(1, 512))

    def body(bb, x):
        sl = bb.emit(relax.op.strided_slice(table, [1], [0], [s], [1]))
        return relax.op.add(x, sl)

    mod = _module([x], body)
    mod["main"] = mod["main"].with_attr("tir_var_upper_bound", {"S": 512})
    out = passes.inbound_slices(mod)
    (sl,) = [c for c in op_calls(out["main"]) if op_name(c) == "relax.strided_slice"]
    assert bool(sl.attrs.assume_inbound)
    assert "(1, S)" in str(out["main"].ret_ty) and "ndim=2" in str(mod["main"].ret_ty)  # unknown before
    xv = np.ones((1, 7), "float32")
    np.testing.assert_allclose(run(build(out), [xv]), 1 + np.arange(7, dtype="float32")[None])


# -- ONNX protobuf passes -----------------------------------------------------------------------------
def _onnx_conv(auto_pad=None, pad=False):
    import onnx
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype("float32"), "w")
    nodes, conv_in = [], "x"
    if pad:
        pads = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], "int64"), "pads")
        nodes.append(helper.make_node("Pad", ["x", "pads"], ["xp"]))
        conv_in = "xp"
    attrs = {"auto_pad": auto_pad} if auto_pad else {}
    nodes.append(helper.make_node("Conv", [conv_in, "w"], ["y"], **attrs))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                              [w] + ([pads] if pad else []))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _ort(model, x):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_explicit_same_pads():
    model = _onnx_conv(auto_pad="SAME_UPPER")
    out = passes.explicit_same_pads(model)
    (conv,) = out.graph.node
    attrs = {a.name: a for a in conv.attribute}
    assert "auto_pad" not in attrs and list(attrs["pads"].ints) == [1, 1, 1, 1]
    assert passes.explicit_same_pads(model, shape={"x": [1, 3, 8, 8]}) is model  # shapes overridden: left
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype("float32")
    np.testing.assert_allclose(_ort(out, x), _ort(model, x), rtol=1e-5, atol=1e-5)


def test_fold_zero_pads():
    model = _onnx_conv(pad=True)
    out = passes.fold_zero_pads(model)
    assert [n.op_type for n in out.graph.node] == ["Conv"]
    assert [n.op_type for n in model.graph.node] == ["Pad", "Conv"]  # the caller's model is unchanged
    x = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype("float32")
    np.testing.assert_allclose(_ort(out, x), _ort(model, x), rtol=1e-5, atol=1e-5)


# -- Relax passes during merging ----------------------------------------------------------------------
def _fused(mod):
    for stage in bh.stages()[:2]:
        mod = stage(mod)
    return mod


def _symbolic_dense_reshape():
    n, s = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("s", "int64")
    w = np.random.default_rng(4).standard_normal((64, 64)).astype("float32")
    x = relax.Var("x", relax.TensorType([n, s, 64], "float32"))

    def body(bb, x):
        h = bb.emit(relax.op.matmul(x, relax.const(w)))
        return relax.op.reshape(h, relax.ShapeExpr([n, s, 4, 16]))

    return _module([x], body), w


def test_close_shape_arguments():
    """After fusing, the reshape's composite takes its target shape as a parameter; the pass binds
    it inside (the tensor parameter defines n and s), so no composite has a shape parameter."""
    mod, _ = _symbolic_dense_reshape()
    fused = _fused(mod)

    def shape_params(m):
        return [p for f in m.functions.values() if is_composite(f) for p in f.params
                if isinstance(p.ty, relax.ShapeType)]

    assert shape_params(fused)
    closed = passes.close_shape_arguments(fused)
    assert not shape_params(closed)
    assert passes.close_shape_arguments(closed) is closed  # nothing left to do: the module itself


def test_inline_composites_gives_back_the_plain_ops():
    """Every composite inlined: the module computes what the original did (llvm), with its ops."""
    mod, w = _symbolic_dense_reshape()
    fused = passes.close_shape_arguments(_fused(mod))
    gated = {gv for gv, f in fused.functions_items() if is_composite(f)}
    plain = passes.inline_composites(fused, gated)
    assert not any(is_composite(f) for f in plain.functions.values())
    assert sorted(_ops(plain)) == sorted(_ops(mod))
    xv = np.random.default_rng(5).standard_normal((2, 3, 64)).astype("float32")
    np.testing.assert_allclose(run(build(plain), [xv]), (xv @ w).reshape(2, 3, 4, 16), rtol=1e-5, atol=1e-5)


def test_merge_then_after_merge_passes():
    """merge_composite_functions makes one region of the dense and reshape; the region's shape
    argument is closed and its name kept short."""
    mod, _ = _symbolic_dense_reshape()
    fused = passes.close_shape_arguments(_fused(mod))
    merged = passes.merge_composite_functions(fused)
    regions = {gv.name_hint: f for gv, f in merged.functions_items() if "Codegen" in (f.attrs or {})}
    assert len(regions) == 1 and str(next(iter(regions.values())).attrs["Codegen"]) == "onednn"
    after = passes.run_passes(passes.AFTER_MERGE, merged)
    (region,) = [f for f in after.functions.values() if "Codegen" in (f.attrs or {})]
    assert not [p for p in region.params if isinstance(p.ty, relax.ShapeType)]
    assert all(len(gv.name_hint) <= passes.MAX_REGION_NAME for gv in after.get_global_vars())


def test_cost_gate_names_the_composites_of_a_region_without_heavy_op():
    from byoc_hetero.passes.cost_gate import gated_composites
    from byoc_hetero.rules import DecisionLog

    x = relax.Var("x", relax.TensorType([1, 4, 8, 8], "float32"))
    mod = _module([x], lambda bb, x: relax.op.nn.max_pool2d(x, [2, 2], [2, 2]))
    fused = _fused(mod)
    merged = passes.merge_composite_functions(fused)
    log = DecisionLog()
    gated = gated_composites(fused, merged, 1, True, log)
    assert gated == {gv for gv, f in fused.functions_items() if is_composite(f)} and gated
    assert gated_composites(fused, merged, 1, False, DecisionLog()) == set()


# -- the backend object ---------------------------------------------------------------------------------
def test_backend_alias_and_options():
    backend = get_target("byoc_hetero")
    assert backend is get_target("onednn") and backend.name == "onednn"
    assert {"precision", "dim_ranges"} <= set(backend.options)
    with pytest.raises(bh.RuleError, match=r"backend 'onednn' has no option 'tile'"):
        bh.stages(options={"onednn": {"tile": 4}})
    with pytest.raises(bh.RuleError, match="precision must be one of"):
        bh.stages(precision="fp16")
    assert tvm.get_global_func("relax.ext.byoc_hetero") is not None
    assert tvm.get_global_func("relax.ext.onednn") is not None


def test_backend_variants_enumerate():
    backend = get_target("onednn")
    assert [v.name for v in backend.variants_for("conv2d")] == ["direct", "winograd", "f32", "bf16", "int8"]
    assert [v.name for v in backend.variants_for("matmul")] == ["f32", "bf16", "int8"]
    assert backend.variants_for("softmax") == ()


def test_user_backend_options_and_precision(restore_rules):
    """A user's backend declares its options like the oneDNN one; one without a precision option
    is not given one, and a precision nobody takes is an error."""
    from byoc_hetero.rules import Option

    mine = bh.register_target("mynpu", codegen="onednn", options={"cores": Option("cores", "NPU cores", 1, int)})
    assert mine.check_options({"cores": "2"}) == {"cores": 2}
    with pytest.raises(bh.RuleError, match="backend 'mynpu' has no option 'precision'"):
        mine.check_options({"precision": "bf16"})
    with pytest.raises(bh.RuleError, match="none of the backends"):
        bh.stages(target="mynpu", precision="bf16")
    from byoc_hetero.stages import codegen_options

    assert codegen_options(["mynpu", "onednn"], "bf16", {"mynpu": {"cores": 4}}) == {
        "mynpu": {"cores": 4}, "onednn": {"precision": "bf16"}}


def test_no_function_over_80_lines():
    """House rule (issue 23): no Python function of byoc_hetero/ over 80 lines (tools/long_functions.py)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("long_functions", root / "tools" / "long_functions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.long_functions([root / "byoc_hetero"], 80) == []
    assert module.long_functions([root / "byoc_hetero"], 40)  # it does find long ones


def test_region_documents_of_the_old_name_read_as_onednn():
    """A region made before the rename (source.target "byoc_hetero", as in libraries exported
    earlier) is listed under the onednn backend."""
    import json

    from byoc_hetero._relax import external_modules, region_graph_json, region_table

    part = bh.partition(*bh.models.small_convnet())
    (module,) = external_modules(part)
    graph = region_graph_json(module)
    assert graph["source"]["target"] == "onednn"
    graph["source"]["target"] = "byoc_hetero"
    old = tvm.get_global_func("byoc_hetero.runtime.create")(json.dumps(graph))
    assert old.kind == "byoc_hetero"  # the runtime kind never changed
    (entry,) = region_table(part.with_attr("external_mods", [old])).values()
    assert entry.target == "onednn"


# -- index checks once the weights are bound --------------------------------------------------------
def _take_of_computed_indices(shift: int) -> tvm.IRModule:
    """``take(x, add([0, 1, 2], shift), axis=1)`` on x of shape (2, 4): the indices are computed."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            ids = bb.emit(relax.op.add(relax.const(np.array([0, 1, 2], "int64"), "int64"), relax.const(shift, "int64")))
            gv = bb.emit_output(bb.emit(relax.op.take(x, ids, axis=1)))
        bb.emit_func_output(gv)
    return bb.get()


def _checks(mod) -> int:
    return str(mod["main"]).count("byoc_hetero_check_indices")


@pytest.mark.parametrize("shift,dropped", [(1, True), (2, False)])
def test_drop_proven_index_checks(shift, dropped):
    """The check checked_take puts on computed indices goes once folding proves them in range
    (shift 1: [1, 2, 3] of 4 columns), and stays, and fires, when they are not (shift 2: 4 is out)."""
    mod = passes.checked_take(_take_of_computed_indices(shift))
    assert _checks(mod) == 1
    out = passes.drop_proven_index_checks(passes.fold_int_constants(mod))
    assert _checks(out) == (0 if dropped else 1)
    x = np.arange(8, dtype="float32").reshape(2, 4)
    vm = relax.VirtualMachine(relax.build(out, target="llvm"), tvm.cpu())
    if dropped:
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), x[:, [1, 2, 3]])
    else:
        with pytest.raises(Exception, match="index 4"):
            vm["main"](tvm.runtime.tensor(x))


def test_fully_offloaded_build_runs_without_the_c_compiler():
    """A model that is one region still gets TVM's llvm host module (host_code_anchor): the VM runs
    the executable as built — no ``Executable.jit`` export, C compile and reload (which leaked the
    loaded library on every VM) — and the output is the llvm-only build's."""
    import numpy as np
    from tvm import relax

    import byoc_hetero as bh
    from byoc_hetero import models
    from byoc_hetero.passes.host_code_anchor import ANCHOR
    from byoc_hetero.timing import build

    mod, params = models.small_convnet(image_size=16)
    part = bh.partition(mod, params)
    assert len(bh.report(part).regions) == 1 and ANCHOR in [gv.name_hint for gv in part.get_global_vars()]
    ex = build(part)
    kinds = []

    def walk(m):
        kinds.append(m.kind)
        for imported in m.imports:
            walk(imported)

    walk(ex.mod)
    assert "c" not in kinds and "llvm" in kinds, kinds
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype("float32")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    want = relax.VirtualMachine(build(relax.transform.BindParams("main", params)(mod)), tvm.cpu())["main"](
        tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert ex.jit() is ex.mod  # runnable as built: nothing exported and reloaded


def test_host_code_anchor_only_where_nothing_else_makes_host_code():
    """No anchor when an op stays on TVM (its PrimFunc is the host module) or nothing is offloaded."""
    import byoc_hetero as bh
    from byoc_hetero import models
    from byoc_hetero.passes.host_code_anchor import ANCHOR, host_code_anchor

    mod, params = models.small_convnet(image_size=16)
    assert host_code_anchor(mod) is mod  # no region offloaded
    part = bh.partition(mod, params)
    assert host_code_anchor(part) is part  # already anchored: added once
    assert [gv.name_hint for gv in part.get_global_vars()].count(ANCHOR) == 1


def _take_of_negative_form(shift: int) -> tvm.IRModule:
    """TVM's ONNX Gather form on computed indices: ``take(x, where(i < 0, i + 4, i), axis=1)`` with
    ``i = [-1, 0, 2] + shift`` on x of shape (2, 4)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            raw = bb.emit(relax.op.add(relax.const(np.array([-1, 0, 2], "int64"), "int64"),
                                       relax.const(shift, "int64")))
            ids = bb.emit(relax.op.where(bb.emit(relax.op.less(raw, relax.const(0, "int64"))),
                                         bb.emit(relax.op.add(raw, relax.const(4, "int64"))), raw))
            gv = bb.emit_output(bb.emit(relax.op.take(x, ids, axis=1)))
        bb.emit_func_output(gv)
    return bb.get()


@pytest.mark.parametrize("shift,dropped", [(0, True), (1, True), (-4, False)])
def test_fold_negative_indices(shift, dropped):
    """The check and the negative-index arithmetic between it and the take go once folding makes the
    indices constants in [-n, n) (shift 0: [-1, 0, 2] reads columns [3, 0, 2]); out of range (shift -4:
    -5 of 4 columns) the check stays and fires, naming the index the model wrote."""
    mod = passes.checked_take(_take_of_negative_form(shift))
    assert _checks(mod) == 1
    folded = passes.drop_proven_index_checks(passes.fold_int_constants(mod))
    assert _checks(folded) == 1  # the normalisation hides the constant from drop_proven_index_checks
    out = passes.fold_negative_indices(folded)
    assert _checks(out) == (0 if dropped else 1)
    if dropped:
        assert _ops(out) == ["relax.take"]  # less, add and where went with the check
    x = np.arange(8, dtype="float32").reshape(2, 4)
    vm = relax.VirtualMachine(relax.build(out, target="llvm"), tvm.cpu())
    if dropped:
        want = x[:, (np.array([-1, 0, 2]) + shift) % 4]
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), want)
    else:
        with pytest.raises(Exception, match="index -5"):
            vm["main"](tvm.runtime.tensor(x))


def test_compose_permutes():
    """torch's sdpa output chain (three permutes, the first two undoing each other) is one permute;
    a chain that composes to the identity is its input; the results equal the original's on llvm."""
    x = relax.Var("x", relax.TensorType([1, 3, 4, 5], "float32"))

    def body(bb, x):
        a = bb.emit(relax.op.permute_dims(x, [2, 0, 1, 3]))
        b = bb.emit(relax.op.permute_dims(a, [1, 2, 0, 3]))
        c = bb.emit(relax.op.permute_dims(b, [0, 2, 1, 3]))
        back = bb.emit(relax.op.permute_dims(bb.emit(relax.op.permute_dims(x, [3, 2, 1, 0])), None))
        return bb.emit(relax.op.add(relax.op.reshape(c, [1, 3, 4, 5]), back))

    mod = _module([x], body)
    out = passes.compose_permutes(mod)
    permutes = [c for c in op_calls(out["main"]) if op_name(c) == "relax.permute_dims"]
    assert [list(map(int, c.attrs.axes)) for c in permutes] == [[0, 2, 1, 3]]
    data = np.random.default_rng(0).standard_normal((1, 3, 4, 5)).astype("float32")
    want = data.transpose(0, 2, 1, 3).reshape(1, 3, 4, 5) + data
    for m in (mod, out):
        vm = relax.VirtualMachine(relax.build(m, target="llvm"), tvm.cpu())
        np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(data)).numpy(), want, rtol=0, atol=0)


def _repeat_kv_attention(seq) -> tvm.IRModule:
    """q [1, 6, S, 8] against k, v [1, 2, S, 8] repeated 3 times as transformers' repeat_kv writes
    it (expand_dims, broadcast_to, reshape), k transposed and scaled after the repetition."""
    q = relax.Var("q", relax.TensorType([1, 6, seq, 8], "float32"))
    k = relax.Var("k", relax.TensorType([1, 2, seq, 8], "float32"))
    v = relax.Var("v", relax.TensorType([1, 2, seq, 8], "float32"))

    def repeat(bb, t):
        t5 = bb.emit(relax.op.expand_dims(t, 2))
        full = bb.emit(relax.op.broadcast_to(t5, relax.ShapeExpr([1, 2, 3, seq, 8])))
        return bb.emit(relax.op.reshape(full, relax.ShapeExpr([1, 6, seq, 8])))

    def body(bb, q, k, v):
        kt = bb.emit(relax.op.permute_dims(repeat(bb, k), [0, 1, 3, 2]))
        kt = bb.emit(relax.op.multiply(kt, relax.const(0.5, "float32")))
        scores = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.matmul(q, kt))))
        return bb.emit(relax.op.matmul(scores, repeat(bb, v)))

    return _module([q, k, v], body)


@pytest.mark.parametrize("symbolic", [False, True])
def test_matmul_repeated_heads(symbolic):
    """Both attention matmuls read the 2 K / V heads once (broadcast along the group axis of a 5-D
    matmul), the transpose and scale move before the repetition, no broadcast_to is left; the
    results equal the original module's on llvm (at two lengths of a symbolic S)."""
    seq = tvm.tirx.Var("S", "int64") if symbolic else 5
    mod = _repeat_kv_attention(seq)
    out = passes.matmul_repeated_heads(mod)
    ops = _ops(out)
    assert "relax.broadcast_to" not in ops, out["main"]
    matmuls = [c for c in op_calls(out["main"]) if op_name(c) == "relax.matmul"]
    assert [int(c.args[1].ty.shape.values[2]) for c in matmuls] == [1, 1]  # K / V heads not repeated
    rng = np.random.default_rng(0)
    before = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    after = relax.VirtualMachine(relax.build(out, target="llvm"), tvm.cpu())
    for length in ((4, 9) if symbolic else (5,)):
        args = [rng.standard_normal(s).astype("float32") for s in ((1, 6, length, 8), (1, 2, length, 8), (1, 2, length, 8))]
        want = before["main"](*map(tvm.runtime.tensor, args)).numpy()
        np.testing.assert_allclose(after["main"](*map(tvm.runtime.tensor, args)).numpy(), want, rtol=1e-6, atol=1e-6)


# -- te_clips and the folding of constant masks (torchvision Swin, issue 39) ----------------------------
@pytest.mark.parametrize("bound", [1e-3, float("nan")])
def test_te_clips(bound):
    """A TE maximum of a tensor and a constant scalar (TVM's ONNX Clip) becomes relax.clip; a NaN bound
    (ONNX: unbounded) is left to the TIR function."""
    from tvm import topi

    x = relax.Var("x", relax.TensorType([2, 3], "float32"))
    mod = _module([x], lambda bb, x: bb.emit_te(topi.maximum, x, relax.const(bound, "float32")))
    out = passes.te_clips(mod)
    if bound != bound:
        assert out is mod
        return
    assert _ops(out) == ["relax.clip"]
    data = np.array([[-1, 0, 5e-4], [2e-3, 1, -3]], "float32")
    np.testing.assert_array_equal(run(build(out), [data]), np.maximum(data, np.float32(bound)))


def test_fold_weight_subgraphs_builds_masks_from_constants():
    """Swin's shifted-window mask, as torch.export and the default ONNX exporter write it (zeros,
    slice_scatter / strided_slice + scatter_nd, not_equal, where), is one constant after the folding."""
    x = relax.Var("x", relax.TensorType([4, 4], "float32"))

    def body(bb, x):
        zeros = bb.emit(relax.op.full((4, 4), relax.const(0.0, "float32"), "float32"))
        rows = bb.emit(relax.op.strided_slice(zeros, [0], [2], [4]))  # rows 2..3
        ones = bb.emit(relax.op.full((2, 4), relax.const(1.0, "float32"), "float32"))
        marked = bb.emit(relax.op.slice_scatter(zeros, ones, 2, 4, 1, axis=0))
        cols = bb.emit(relax.op.scatter_nd(relax.op.permute_dims(marked), relax.const(np.array([[3]], "int64")),
                                           relax.const(np.full((1, 4), 2.0, "float32"))))
        mask = bb.emit(relax.op.where(relax.op.not_equal(cols, relax.const(0.0, "float32")),
                                      relax.const(-100.0, "float32"), cols))
        return relax.op.add(relax.op.add(x, mask), relax.op.sum(rows))
    out = passes.fold_weight_subgraphs(_module([x], body))
    assert _ops(out) == ["relax.add", "relax.add"]
    want = np.zeros((4, 4), "float32")
    want[:, 2:] = -100.0
    want[3, :] = -100.0
    data = np.arange(16, dtype="float32").reshape(4, 4)
    np.testing.assert_array_equal(run(build(out), [data]), data + want)
