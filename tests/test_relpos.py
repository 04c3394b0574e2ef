"""Relative-position attention (issue 39 items 2 and 4): DeBERTa-v2's disentangled attention and
MaxViT's relative position bias, through ``bh.from_torch`` and ``bh.from_onnx`` (torch's default
exporter), against torch; and the pieces that make them one region, each on a small graph against
numpy or the llvm-only build: torch's int -> float promotion at import
(:mod:`byoc_hetero.passes.float_ops_on_integers`), position bucketing folded to constants
(:mod:`byoc_hetero.passes.fold_int_constants`), ``gather_elements`` of constant indices as a ``take``
(:mod:`byoc_hetero.passes.gather_elements_as_take`)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero import passes
from byoc_hetero._relax import op_calls, op_name
from byoc_hetero.timing import build, run
from model_paths import first_output, import_model, one_region

torch = pytest.importorskip("torch")


def _module(params, body):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


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
        ids = bb.emit(relax.op.clip(relax.op.astype(bucket, "int64"), 0, 7))
        return relax.op.take(table, ids, axis=0)

    mod = _module([table], body)
    out = passes.fold_int_constants(mod)
    assert _ops(out) == ["relax.take"], _ops(out)
    want_ids = np.clip(np.ceil(np.log(np.arange(1, 11, dtype=np.float32) / np.float32(2))).astype(np.int64), 0, 7)
    tv = np.random.default_rng(0).standard_normal((8, 3)).astype("float32")
    np.testing.assert_array_equal(run(build(out), [tv]), tv[want_ids])


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


def test_identity_tile_is_dropped():
    x = relax.Var("x", relax.TensorType([2, 3], "float32"))
    mod = _module([x], lambda bb, x: relax.op.add(relax.op.tile(x, [1, 1]), x))
    assert _ops(passes.drop_needless_broadcasts(mod)) == ["relax.add"]
    grow = _module([x], lambda bb, x: relax.op.tile(x, [1, 1, 1]))  # a new leading dim: not an identity
    assert _ops(passes.drop_needless_broadcasts(grow)) == ["relax.tile"]
