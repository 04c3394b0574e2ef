"""The never-slower check of ``bh.tune`` runs both plans on inputs it makes itself: integer inputs
must be valid indices (a model's token ids go through a checked ``take``; random normals cast to
int64 are negative half the time). Reference: numpy's ``take`` of the same table."""

from __future__ import annotations

import numpy as np
import tvm
from conftest import graph
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.tune.tuner import _guard, _inputs, _timer


def _embedding_model():
    table = np.random.default_rng(3).standard_normal((50, 16)).astype("float32")
    w = np.random.default_rng(4).standard_normal((16, 8)).astype("float32")
    ids = relax.Var("ids", relax.TensorType((1, 32), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [ids]):
        with bb.dataflow():
            e = bb.emit
            y = e(relax.op.matmul(e(relax.op.take(relax.const(table), ids, axis=0)), relax.const(w)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get(), table, w


def test_guard_inputs_are_valid_indices_and_the_guard_runs():
    """The int64 ids _inputs makes index the table (0 <= id < 50); both plans run on them (the
    partitioned take checks its indices and raised bh.InputError on the old random ids) and give
    numpy's answer."""
    mod, table, w = _embedding_model()
    part = bh.partition(mod)
    assert bh.report(part).regions, "the take + matmul should be a region"
    inputs = _inputs(mod, None, seed=0)
    assert inputs[0].dtype == np.int64 and inputs[0].min() >= 0 and inputs[0].max() < 50
    d, t = _guard(part, part, inputs, rounds=1, repeat=1)
    assert d.median_s > 0 and t.median_s > 0
    got = _timer(part, inputs)().numpy()
    np.testing.assert_allclose(got, table[inputs[0]] @ w, rtol=1e-5, atol=1e-5)
