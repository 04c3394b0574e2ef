"""Relative-position attention (issue 39 items 2 and 4): DeBERTa-v2's disentangled attention and
MaxViT's relative position bias, through ``bh.from_torch`` and ``bh.from_onnx`` (torch's default
exporter), against torch; and the pieces that make them one region, each on a small graph against
numpy or the llvm-only build: torch's int -> float promotion at import
(:mod:`byoc_hetero.passes.float_ops_on_integers`), position bucketing folded to constants
(:mod:`byoc_hetero.passes.fold_int_constants`), ``gather_elements`` of constant indices as a ``take``
(:mod:`byoc_hetero.passes.gather_elements_as_take`), an int64 ``Clip`` read as ``Max`` / ``Min``
(:mod:`byoc_hetero.passes.integer_clips`)."""

from __future__ import annotations

import importlib
import re
import sys
import types

import numpy as np
import pytest
from tvm import relax

import byoc_hetero as bh
from byoc_hetero import passes
from byoc_hetero._relax import constant_value, op_calls, op_name
from byoc_hetero.fold import MAX_ELEMENTS, MAX_INDEX_ELEMENTS
from byoc_hetero.passes.einsum_as_matmul import matmul_plan
from byoc_hetero.timing import build, run
from model_paths import dataflow_module as _module, first_output, import_model, one_region, run_profiled

torch = pytest.importorskip("torch")
for _name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    # torchvision (imported by transformers too) without its C++ operators: bench/zoo_models.py says why
    sys.modules.setdefault(_name, types.ModuleType(_name))


def _ops(mod) -> list[str]:
    return [op_name(c) for c in op_calls(mod["main"])]


# -- the pieces ------------------------------------------------------------------------------------------
class LogPositions(torch.nn.Module):
    """Scales x by log((position + 1) / 2): true division and log of int64 positions (torch gives
    float32; TVM's importer kept int64 and refused the log)."""

    def forward(self, x):
        pos = torch.arange(x.shape[-1]) + 1
        return x * torch.log(pos / 2) + torch.sqrt(pos)


def test_float_ops_on_integers_match_torch():
    model, x = LogPositions().eval(), torch.randn(2, 6)
    mod, params = bh.from_torch(model, (x,))
    got = run(build(bh.partition(mod, params, require_heavy_op=False)), [x.numpy()])
    np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-5)  # float32 log, sqrt


def test_fold_int_constants_through_float_steps():
    """int64 positions bucketed through float log / ceil and cast back to int64 (DeBERTa-v2's
    log buckets) fold to one constant index; the take reading it is all that is left."""
    table = relax.Var("table", relax.TensorType([8, 3], "float32"))

    def body(bb, table):
        pos = bb.emit(relax.op.arange(1, 11, 1, dtype="int64"))
        half = bb.emit(relax.op.divide(relax.op.astype(pos, "float32"), relax.const(2.0, "float32")))
        bucket = bb.emit(relax.op.ceil(relax.op.log(half)))
        bad = bb.emit(relax.op.logical_not(relax.op.isfinite(bucket)))  # the default exporter's guard
        bucket = bb.emit(relax.op.where(bad, relax.const(0.0, "float32"), bucket))
        ids = bb.emit(relax.op.clip(relax.op.astype(bucket, "int64"), 0, 7))
        return relax.op.take(table, ids, axis=0)

    mod = _module([table], body)
    out = passes.fold_int_constants(mod)
    assert _ops(out) == ["relax.take"], _ops(out)
    want_ids = np.clip(np.ceil(np.log(np.arange(1, 11, dtype=np.float32) / np.float32(2))).astype(np.int64), 0, 7)
    tv = np.random.default_rng(0).standard_normal((8, 3)).astype("float32")
    np.testing.assert_array_equal(run(build(out), [tv]), tv[want_ids])


def _relative_index(bb, seq: int, heads: int, span: int):
    """DeBERTa's c2p index: clamp(i - j + span, 0, 2 span - 1) of int64 positions, expanded to ``heads``
    (the clamp after the expand here, so that an element-wise step sees the repeated value)."""
    pos = bb.emit(relax.op.arange(0, seq, 1, dtype="int64"))
    rel = bb.emit(relax.op.subtract(relax.op.reshape(pos, [1, seq, 1]), relax.op.reshape(pos, [1, 1, seq])))
    index = bb.emit(relax.op.broadcast_to(rel, relax.ShapeExpr([heads, seq, seq])))
    index = bb.emit(relax.op.add(index, relax.const(span, "int64")))
    return bb.emit(relax.op.clip(index, 0, 2 * span - 1))


def test_fold_int_constants_stores_a_repeated_index_once():
    """An index over the fold's bound in full (12 heads x 128 x 128 = 196608 > 65536 elements) but not
    stored (one [1, 128, 128] table): folded to broadcast_to(constant), which gather_elements_as_take
    reads; one region, equal to numpy (DeBERTa-v3-base's shape, issue 39)."""
    heads, seq, span = 12, 128, 64
    x = relax.Var("x", relax.TensorType([heads, seq, 2 * span], "float32"))
    mod = _module([x], lambda bb, x: relax.op.gather_elements(relax.op.multiply(x, x),
                                                              _relative_index(bb, seq, heads, span), 2))
    assert heads * seq * seq > MAX_ELEMENTS
    folded = passes.fold_int_constants(mod)
    assert sorted(_ops(folded)) == ["relax.broadcast_to", "relax.gather_elements", "relax.multiply"], _ops(folded)
    (expand,) = [c for c in op_calls(folded["main"]) if op_name(c) == "relax.broadcast_to"]
    assert constant_value(expand.args[0]).shape == (1, seq, seq)  # stored once, not per head
    out = passes.gather_elements_as_take(folded)
    assert "relax.gather_elements" not in _ops(out) and "relax.broadcast_to" not in _ops(out)
    (take,) = [c for c in op_calls(out["main"]) if op_name(c) == "relax.take"]
    assert constant_value(take.args[1]).shape == (seq, seq)
    xv = np.random.default_rng(0).standard_normal((heads, seq, 2 * span)).astype("float32")
    i = np.arange(seq)
    index = np.broadcast_to(np.clip(i[:, None] - i[None, :] + span, 0, 2 * span - 1), (heads, seq, seq))
    want = np.take_along_axis(xv * xv, index, axis=2)
    np.testing.assert_array_equal(run(build(out), [xv]), want)
    part = bh.partition(mod, require_heavy_op=False)
    report = bh.report(part)
    assert len(report.regions) == 1 and not report.fallbacks, report
    np.testing.assert_array_equal(run(build(part), [xv]), want)


def test_fold_int_constants_folds_an_index_of_sequence_512():
    """DeBERTa-v3 at sequence 512: the bucket table stores 512 x 512 = 262144 positions, over
    MAX_ELEMENTS; as an index it has the larger MAX_INDEX_ELEMENTS, so it folds, gather_elements is a
    take of constant offsets, and the model is one region equal to numpy (before: the index stayed
    computed and gather_elements on llvm)."""
    heads, seq, span = 2, 512, 256
    assert MAX_ELEMENTS < seq * seq <= MAX_INDEX_ELEMENTS
    x = relax.Var("x", relax.TensorType([heads, seq, 2 * span], "float32"))
    mod = _module([x], lambda bb, x: relax.op.gather_elements(relax.op.multiply(x, x),
                                                              _relative_index(bb, seq, heads, span), 2))
    part = bh.partition(mod, require_heavy_op=False)
    report = bh.report(part)
    assert len(report.regions) == 1 and not report.fallbacks, report
    xv = np.random.default_rng(2).standard_normal((heads, seq, 2 * span)).astype("float32")
    i = np.arange(seq)
    index = np.broadcast_to(np.clip(i[:, None] - i[None, :] + span, 0, 2 * span - 1), (heads, seq, seq))
    np.testing.assert_array_equal(run(build(part), [xv]), np.take_along_axis(xv * xv, index, axis=2))


def test_an_index_over_the_index_bound_stays_computed_and_the_report_says_why(monkeypatch):
    """Past MAX_INDEX_ELEMENTS (lowered here to keep the test small) the index stays computed and the
    gather on llvm, with the right answer; the report's reason for the gather names the bound, the
    index and its size (the pass's rejection reaches the report through the stages)."""
    fold = importlib.import_module("byoc_hetero.passes.fold_int_constants")  # the module, not the pass

    monkeypatch.setattr(fold, "MAX_INDEX_ELEMENTS", 4096)
    heads, seq, span = 1, 128, 64
    x = relax.Var("x", relax.TensorType([heads, seq, 2 * span], "float32"))
    mod = _module([x], lambda bb, x: relax.op.gather_elements(relax.op.multiply(x, x),
                                                              _relative_index(bb, seq, heads, span), 2))
    part = bh.partition(mod, require_heavy_op=False)
    report = bh.report(part)
    (gather,) = [f for f in report.fallbacks if f.op == "gather_elements"]
    assert gather.rule == "fold_int_constants", report
    assert "MAX_INDEX_ELEMENTS = 4096" in gather.reason and f"({heads * seq * seq} elements)" in gather.reason, report
    xv = np.random.default_rng(3).standard_normal((heads, seq, 2 * span)).astype("float32")
    i = np.arange(seq)
    index = np.broadcast_to(np.clip(i[:, None] - i[None, :] + span, 0, 2 * span - 1), (heads, seq, seq))
    np.testing.assert_array_equal(run(build(part), [xv]), np.take_along_axis(xv * xv, index, axis=2))


def test_fold_int_constants_bounds_the_work():
    """A table over the bound even as stored (300 x 300 positions = 90000 elements) is never computed:
    the arange differences stay in the module, as they were."""
    x = relax.Var("x", relax.TensorType([1, 300, 300], "float32"))

    def body(bb, x):
        index = _relative_index(bb, 300, 1, 150)
        return relax.op.add(x, relax.op.astype(index, "float32"))

    out = passes.fold_int_constants(_module([x], body))
    assert "relax.subtract" in _ops(out) and "relax.clip" in _ops(out), _ops(out)
    sizes = [constant_value(a).size for c in op_calls(out["main"]) for a in c.args if constant_value(a) is not None]
    assert max(sizes, default=0) <= MAX_ELEMENTS


def test_fold_int_constants_keeps_a_scalar_index_a_scalar():
    """ViT's class token ``x[:, 0]`` through TVM's ONNX importer: a 0-d int64 index normalised as
    ``where(i < 0, i + n, i)``, ``n`` read from ``shape_of``. The folded index is a 0-d constant, and the
    take's result what its type says (issue 39: folded as shape (1,), the take read [1, 1, C] typed
    [1, C], and partitioning vit_b_16 failed with "main reads lv85, which nothing in it defines")."""
    x = relax.Var("x", relax.TensorType([1, 5, 8], "float32"))

    def body(bb, x):
        dims = bb.emit(relax.op.shape_to_tensor(relax.op.shape_of(x)))
        i = relax.const(0, "int64")
        n = bb.emit(relax.op.take(dims, relax.const(1, "int64"), axis=0))
        index = bb.emit(relax.op.where(bb.emit(relax.op.less(i, relax.const(0, "int64"))),
                                       bb.emit(relax.op.add(i, n)), i))
        return relax.op.take(x, index, axis=1)

    out = passes.fold_int_constants(_module([x], body))
    assert _ops(out) == ["relax.take"], _ops(out)
    (take,) = op_calls(out["main"])
    assert constant_value(take.args[1]).shape == ()
    relax.analysis.well_formed(out)  # raises on the first violation
    xv = np.random.default_rng(0).standard_normal((1, 5, 8)).astype("float32")
    np.testing.assert_array_equal(run(build(out), [xv]), xv[:, 0])


def test_folding_to_a_value_of_another_shape_is_refused():
    """A folded use must have its variable's shape: one that does not is a CodegenError naming both."""
    from byoc_hetero.errors import CodegenError
    from byoc_hetero.passes.fold_int_constants import Substitute

    var = relax.Var("index", relax.TensorType([], "int64"))
    with pytest.raises(CodegenError, match=r"folding index: a value of shape \[1\] for its declared shape \[\]"):
        Substitute({var: relax.const(np.zeros(1, "int64"))})


@pytest.mark.parametrize(("shape", "index_shape", "axis", "shared"), [
    ((2, 3, 5), (2, 3, 4), -1, False),   # a different index per batch row
    ((2, 3, 5), (2, 3, 4), -1, True),    # one index broadcast over the batch (DeBERTa's heads)
    ((4, 6, 3), (4, 2, 3), 1, False),    # along a middle axis, fewer rows than the data
])
def test_gather_elements_as_take_matches_llvm(shape, index_shape, axis, shared):
    rng = np.random.default_rng(len(shape) + axis)
    n = shape[axis]
    index = rng.integers(0, n, index_shape if not shared else (1, *index_shape[1:]))
    index = np.ascontiguousarray(np.broadcast_to(index, index_shape)).astype("int64")
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    mod = _module([x], lambda bb, x: relax.op.gather_elements(relax.op.multiply(x, x), relax.const(index), axis))
    out = passes.gather_elements_as_take(mod)
    assert "relax.gather_elements" not in _ops(out) and "relax.take" in _ops(out)
    if shared:  # the constant offsets hold one copy, not one per batch row
        (take,) = [c for c in op_calls(out["main"]) if op_name(c) == "relax.take"]
        assert take.args[1].value.numpy().shape == index_shape[1:]
    data = rng.standard_normal(shape).astype("float32")
    want = np.take_along_axis(data * data, index, axis=axis)
    np.testing.assert_array_equal(run(build(mod), [data]), want)
    part = bh.partition(mod, require_heavy_op=False)
    report = bh.report(part)
    assert len(report.regions) == 1 and not report.fallbacks, report
    np.testing.assert_allclose(run(build(part), [data]), want, rtol=1e-6)


def test_gather_elements_out_of_range_is_left_alone():
    x = relax.Var("x", relax.TensorType([2, 4], "float32"))
    index = relax.const(np.array([[0, 4], [1, 2]], dtype="int64"))  # 4 is outside [0, 4)
    mod = _module([x], lambda bb, x: relax.op.gather_elements(x, index, 1))
    assert _ops(passes.gather_elements_as_take(mod)) == ["relax.gather_elements"]


def _position_scores(bb, x, heads: int, seq: int, span: int, width: int):
    """DeBERTa's c2p scores on a small scale: ``x @ keys^T`` against ``2 span`` constant position keys
    (``permute_dims`` of a [heads, 2 span, width] weight), gathered at the relative index."""
    keys = np.random.default_rng(1).standard_normal((heads, 2 * span, width)).astype("float32")
    product = bb.emit(relax.op.matmul(x, relax.op.permute_dims(relax.const(keys), [0, 2, 1])))
    return relax.op.gather_elements(product, _relative_index(bb, seq, heads, span), 2), keys


def test_narrow_gathered_products_computes_only_the_columns_read():
    """Sequence 128 against 2 x 256 position keys (DeBERTa-v3's): the relative index reads columns
    129..383 only, so the product is computed against those 255 keys, folded to a [heads, width, 255]
    constant, the index moved by 129 and stored once; the same values as numpy, one region."""
    heads, seq, span, width = 12, 128, 256, 8
    x = relax.Var("x", relax.TensorType([heads, seq, width], "float32"))
    keys = []
    mod = _module([x], lambda bb, x: keys.append(_position_scores(bb, x, heads, seq, span, width)) or keys[0][0])
    keys = keys[0][1]
    out = passes.fold_weight_subgraphs(passes.narrow_gathered_products(passes.fold_int_constants(mod)))
    (matmul,) = [c for c in op_calls(out["main"]) if op_name(c) == "relax.matmul"]
    lo, hi = span - (seq - 1), span + (seq - 1)
    np.testing.assert_array_equal(constant_value(matmul.args[1]), keys.transpose(0, 2, 1)[:, :, lo:hi + 1])
    (expand,) = [c for c in op_calls(out["main"]) if op_name(c) == "relax.broadcast_to"]
    stored_index = constant_value(expand.args[0])
    assert stored_index.shape == (1, seq, seq) and stored_index.min() == 0 and stored_index.max() == hi - lo
    xv = np.random.default_rng(0).standard_normal((heads, seq, width)).astype("float32")
    i = np.arange(seq)
    index = np.broadcast_to(i[:, None] - i[None, :] + span, (heads, seq, seq))
    want = np.take_along_axis(xv @ keys.transpose(0, 2, 1), index, axis=2)
    np.testing.assert_allclose(run(build(out), [xv]), want, rtol=1e-5, atol=1e-5)
    part = bh.partition(mod, require_heavy_op=False)
    report = bh.report(part)
    assert len(report.regions) == 1 and not report.fallbacks, report
    np.testing.assert_allclose(run(build(part), [xv]), want, rtol=1e-5, atol=1e-5)


def test_narrow_gathered_products_leaves_the_rest_alone():
    """A gather of every column, one along another axis, and a product something else reads too keep
    their matmul whole."""
    x = relax.Var("x", relax.TensorType([2, 4, 3], "float32"))
    w = relax.const(np.ones((2, 3, 6), "float32"))
    some = relax.const(np.full((2, 4, 2), 1, "int64"))
    every = relax.const(np.tile(np.arange(6, dtype="int64"), (2, 4, 1)))
    rows = relax.const(np.zeros((2, 2, 6), "int64"))

    def shared(bb, x):
        product = bb.emit(relax.op.matmul(x, w))
        return relax.op.add(relax.op.gather_elements(product, some, 2), relax.op.strided_slice(product, [2], [0], [2]))

    for body in (lambda bb, x: relax.op.gather_elements(relax.op.matmul(x, w), every, 2),
                 lambda bb, x: relax.op.gather_elements(relax.op.matmul(x, w), rows, 1), shared):
        mod = _module([x], body)
        assert passes.narrow_gathered_products(mod) is mod
    narrowed = passes.narrow_gathered_products(
        _module([x], lambda bb, x: relax.op.gather_elements(relax.op.matmul(x, w), some, 2)))
    assert "relax.strided_slice" in _ops(narrowed)


def _strided_query_module():
    """A permuted dense output (Q, read strided) against constant position keys: the partitioned module,
    its input and numpy's result."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 64)).astype("float32")
    keys = rng.standard_normal((4, 16, 31)).astype("float32")
    x = relax.Var("x", relax.TensorType([24, 64], "float32"))

    def body(bb, x):
        q = bb.emit(relax.op.permute_dims(relax.op.reshape(relax.op.matmul(x, relax.const(w)), [24, 4, 16]), [1, 0, 2]))
        return relax.op.matmul(q, relax.const(keys))

    xv = rng.standard_normal((24, 64)).astype("float32")
    return bh.partition(_module([x], body)), xv, (xv @ w).reshape(24, 4, 16).transpose(1, 0, 2) @ keys


def test_a_bad_plain_a_value_is_an_error_naming_it(monkeypatch):
    """Read when the region is planned (the partition's own check plans it too)."""
    monkeypatch.setenv("BYOC_HETERO_MATMUL_PLAIN_A", "yes")
    with pytest.raises(Exception, match="BYOC_HETERO_MATMUL_PLAIN_A must be on or off, got 'yes'"):
        mod, xv, _ = _strided_query_module()
        run_profiled(mod, [xv])


@pytest.mark.parametrize("knob", ["off", "on", None])
def test_strided_query_against_constant_keys_plain_a_knob(monkeypatch, knob):
    """Q read strided (a permuted dense output) against constant position keys: with
    BYOC_HETERO_MATMUL_PLAIN_A=on (the default since session 16: unset is on) the matmul reads a plain
    copy of Q on oneDNN's brgemm (where this CPU has it), off it reads Q where it lies; the same values
    as numpy either way."""
    if knob is None:
        monkeypatch.delenv("BYOC_HETERO_MATMUL_PLAIN_A", raising=False)
    else:
        monkeypatch.setenv("BYOC_HETERO_MATMUL_PLAIN_A", knob)
    mod, xv, want = _strided_query_module()
    got, steps = run_profiled(mod, [xv])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    (matmul,) = [st for st in steps if st["op"] == "matmul"]
    dense_isa = [st["impl"] for st in steps if st["op"] == "dense"][0]
    if knob != "off" and "avx512" in dense_isa:
        assert matmul["impl"].startswith("brg") and "src=[4,24,16]:abc" in matmul["layouts"], matmul
    elif knob == "off":
        assert "src=[4,24,16]:bac" in matmul["layouts"], matmul  # read where it lies


@pytest.mark.parametrize(("picks", "full_a", "kept"), [
    (False, False, False),  # an absent attention mask: where(all false, finfo.min, scores) is the scores
    (True, True, False),    # all true, the picked operand of the result's shape
    (True, False, True),    # all true, but the picked scalar is broadcast by the where: kept
    (None, True, True),     # a mixed condition: kept
])
def test_drop_constant_selects(picks, full_a, kept):
    shape = (1, 2, 4, 4)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    cond = np.full((1, 1, 4, 4), picks if picks is not None else False)
    if picks is None:
        cond[0, 0, 0, 1] = True
    a = np.full(shape if full_a else (), -3.0, "float32")
    mod = _module([x], lambda bb, x: relax.op.where(relax.const(cond), relax.const(a), relax.op.multiply(x, x)))
    out = passes.drop_constant_selects(mod)
    assert ("relax.where" in _ops(out)) == kept, _ops(out)
    xv = np.random.default_rng(0).standard_normal(shape).astype("float32")
    np.testing.assert_array_equal(run(build(out), [xv]), np.where(cond, a, xv * xv))


def test_identity_tile_is_dropped():
    x = relax.Var("x", relax.TensorType([2, 3], "float32"))
    mod = _module([x], lambda bb, x: relax.op.add(relax.op.tile(x, [1, 1]), x))
    assert _ops(passes.drop_needless_broadcasts(mod)) == ["relax.add"]
    grow = _module([x], lambda bb, x: relax.op.tile(x, [1, 1, 1]))  # a new leading dim: not an identity
    assert _ops(passes.drop_needless_broadcasts(grow)) == ["relax.tile"]


@pytest.mark.parametrize(("equation", "a_shape", "b_shape"), [
    ("B G H I D, B G H J D -> B G H I J", (1, 2, 2, 4, 3), (1, 2, 2, 5, 3)),  # MaxViT's q @ k^T
    ("bhij,bhjd->bhid", (2, 2, 4, 5), (2, 2, 5, 3)),                          # a plain batched matmul
    ("bkm,bkn->bnm", (2, 3, 4), (2, 3, 5)),                                   # both operands and the result transposed
])
def test_einsum_as_matmul_matches_onnxruntime(equation, a_shape, b_shape):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    node = helper.make_node("Einsum", ["a", "b"], ["y"], equation=equation)
    out_shape = np.einsum(equation.replace(" ", ""), np.zeros(a_shape), np.zeros(b_shape)).shape
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape),
                                            helper.make_tensor_value_info("b", TensorProto.FLOAT, b_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewritten = passes.einsum_as_matmul(model)
    assert "Einsum" not in [n.op_type for n in rewritten.graph.node]
    onnx.checker.check_model(rewritten)
    rng = np.random.default_rng(len(equation))
    feeds = {"a": rng.standard_normal(a_shape).astype("float32"), "b": rng.standard_normal(b_shape).astype("float32")}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bounds", [("lo", "hi"), ("lo", ""), ("", "hi")])
def test_integer_clips_match_onnxruntime(bounds):
    """An int64 Clip becomes Less / Greater + Where (which fold_int_constants reads); a float Clip stays."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array(-2, "int64"), "lo"), numpy_helper.from_array(np.array(3, "int64"), "hi"),
             numpy_helper.from_array(np.array(0.5, "float32"), "flo")]
    graph = helper.make_graph(
        [helper.make_node("Clip", ["i", *bounds], ["j"]), helper.make_node("Clip", ["f", "flo"], ["g"])], "g",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [2, 5]),
         helper.make_tensor_value_info("f", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor_value_info("j", TensorProto.INT64, [2, 5]),
         helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewritten = passes.integer_clips(model)
    want_ops = [op for cmp, b in zip(("Less", "Greater"), bounds) if b for op in (cmp, "Where")] + ["Clip"]
    assert [n.op_type for n in rewritten.graph.node] == want_ops
    assert [n.op_type for n in model.graph.node] == ["Clip", "Clip"]  # the caller's model is not modified
    onnx.checker.check_model(rewritten)
    feeds = {"i": np.arange(-5, 5, dtype="int64").reshape(2, 5), "f": np.linspace(-1, 1, 10, dtype="float32").reshape(2, 5)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_einsum_other_than_a_product_is_kept():
    for equation in ("ij->ji", "bij,bjk,bkl->bil", "bij,bij->bij", "...ij,...jk->...ik", "bii,bij->bj"):
        assert matmul_plan(equation) is None, equation


# -- the models --------------------------------------------------------------------------------------------
PATHS = ("from_torch", "from_onnx")
#: what stays on llvm of DeBERTa: the token ids' bounds check before the embedding lookup (and through
#: ONNX, Gather's wrap of negative ids, where(i < 0, i + n, i)) -- on the caller's ids, a few integer
#: ops on [1, S], as for every text model
IDS_OPS = {"call_tir byoc_hetero_check_indices", "astype", "reshape", "less", "add", "where"}


@pytest.fixture(scope="module", params=[(12, 8, 2), (128, 256, 2), (128, 256, 12)],
                ids=["seq12", "seq128", "seq128-12heads"])
def deberta(request):
    """(model, ids, torch's output). Sequence 12 > 8 buckets: the log buckets are used (the default
    exporter folds the [12, 12] bucketing itself). Sequence 128 with 256 buckets (DeBERTa-v3's): the
    exporter keeps the bucketing, and its int64 clamp as ``Clip`` (passes.integer_clips). With
    DeBERTa-v3-base's 12 heads the index expanded to the heads is 196608 elements, over the fold's
    bound in full but not stored (passes.fold_int_constants)."""
    transformers = pytest.importorskip("transformers")
    seq, buckets, heads = request.param
    config = transformers.DebertaV2Config(
        vocab_size=100, hidden_size=64 if heads == 2 else 16 * heads, num_hidden_layers=2,
        num_attention_heads=heads, intermediate_size=128,
        max_position_embeddings=max(64, seq), relative_attention=True, position_buckets=buckets,
        pos_att_type=["p2c", "c2p"], max_relative_positions=-1, type_vocab_size=0, norm_rel_ebd="layer_norm",
        share_att_key=True)
    torch.manual_seed(0)
    model = first_output(transformers.DebertaV2Model(config).eval(), return_dict=False)
    ids = torch.randint(0, 100, (1, seq))
    with torch.no_grad():
        return model, ids, model(ids).numpy()


@pytest.mark.parametrize("path", PATHS)
def test_deberta_v2_is_one_region(deberta, path, tmp_path):
    model, ids, want = deberta
    mod, params = import_model(model, (ids,), path, tmp_path)
    part = bh.partition(mod, params)
    report = bh.report(part)
    assert len(report.regions) == 1, report
    assert "gather_elements" not in str(part) and "relax.log" not in str(part)
    left = {str(f.op) for f in report.fallbacks}
    assert left <= IDS_OPS, report
    got, steps = run_profiled(part, [ids.numpy()])
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    widths = {int(re.search(r"dst=\[[\d,]*?(\d+)\]", st["layouts"]).group(1)) for st in steps if st["op"] == "matmul"}
    # the position scores are computed only against the relative positions the sequence has (-127..127
    # of 2 x 256 buckets at sequence 128), not against every position key
    buckets = {12: 8, 128: 256}[ids.shape[1]]
    assert 2 * buckets not in widths and (ids.shape[1] < 128 or 2 * 128 - 1 in widths), widths
    # no attention mask given: its where (all false) is gone
    assert "where" not in [st["op"] for st in steps]


@pytest.fixture(scope="module")
def maxvit():
    pytest.importorskip("torchvision")
    from torchvision.models.maxvit import MaxVit

    torch.manual_seed(0)
    model = MaxVit(input_size=(32, 32), stem_channels=8, partition_size=4, block_channels=[16], block_layers=[1],
                   head_dim=8, stochastic_depth_prob=0.0, num_classes=5).eval()
    with torch.no_grad():  # a relative position bias table that matters (it starts near 0)
        for m in model.modules():
            if hasattr(m, "relative_position_bias_table"):
                m.relative_position_bias_table.normal_(std=1.0)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        return model, x, model(x).numpy()


@pytest.mark.parametrize("path", PATHS)
def test_maxvit_block_and_grid_attention_are_one_region(maxvit, path, tmp_path):
    model, x, want = maxvit
    part = one_region(model, (x,), path, tmp_path)
    got = run(build(part), [x.numpy()])
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_onnx_tile_by_ones_is_an_identity():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    reps = helper.make_tensor("reps", TensorProto.INT64, [2], [1, 1])
    grow = helper.make_tensor("grow", TensorProto.INT64, [2], [1, 2])
    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "reps"], ["y"]), helper.make_node("Tile", ["y", "grow"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 6])], initializer=[reps, grow])
    out = passes.drop_identity_expands(helper.make_model(graph))
    assert [n.op_type for n in out.graph.node] == ["Identity", "Tile"]
