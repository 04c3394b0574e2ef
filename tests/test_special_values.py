"""NaN and ±inf through offloaded ops, against torch and the llvm-only build (issue 27).

Arithmetic ops (softmax, the normalizations, sum / mean) give the IEEE results torch and llvm give:
a NaN or an inf reaches exactly the outputs it reaches there. The ordering ops (relu, clip, maximum,
max / min reductions, max pooling) differ between torch (NaN propagates) and TVM's llvm (a select on
``a > b``, so the NaN's position decides); what the runtime does there is pinned below and written
down in docs/reliability.md.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import graph
from fuzz_graphs import run_all, safe_softmax_chain
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.timing import build

R = relax.op
NAN, INF = np.nan, np.inf

#: Rows with every special case: a NaN first / last, -inf with a NaN, +inf, all -inf, partly -inf,
#: finite, +inf and -inf together, all NaN.
ROWS = np.array([[NAN, 1, 2, 3], [1, 2, 3, NAN], [-INF, NAN, 1, 0], [INF, 1, 2, 3], [-INF, -INF, -INF, -INF],
                 [-INF, 0, 1, 2], [1, 2, 3, 4], [INF, -INF, 0, 1], [NAN, NAN, NAN, NAN]], "float32")
ONES, ZEROS = np.ones(4, "float32"), np.zeros(4, "float32")


def same_specials(got: np.ndarray, want: np.ndarray) -> None:
    """NaN, +inf and -inf at the same places; the finite values close."""
    for special in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(special(got), special(want), err_msg=special.__name__)
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)


def offloaded_and_llvm(body, x: np.ndarray, precision: str = "f32"):
    mod = graph({"x": x.shape}, body)
    part = bh.partition(mod, require_heavy_op=False, precision=precision)
    assert part.attrs.get("external_mods"), "the op runs in a region"
    return run_all(build(part), [x])[0], run_all(build(mod), [x])[0]


CASES = {
    "softmax_last": (lambda e, v: R.nn.softmax(v, axis=-1), lambda t: torch.softmax(t, -1)),
    "softmax_first": (lambda e, v: R.nn.softmax(v, axis=0), lambda t: torch.softmax(t, 0)),
    "layer_norm": (lambda e, v: R.nn.layer_norm(v, relax.const(ONES), relax.const(ZEROS), [-1]),
                   lambda t: torch.layer_norm(t, [4])),
    "sum": (lambda e, v: R.sum(v, axis=[1]), lambda t: t.sum(1)),
    "mean": (lambda e, v: R.mean(v, axis=[1]), lambda t: t.mean(1)),
    "group_norm": (lambda e, v: R.reshape(R.nn.group_norm(R.reshape(v, (1, 9, 2, 2)), relax.const(np.ones(9, "float32")),
                                                          relax.const(np.zeros(9, "float32")), 3, 1, [2, 3]), (9, 4)),
                   lambda t: torch.group_norm(t.reshape(1, 9, 2, 2), 3).reshape(9, 4)),
}


@pytest.mark.parametrize("precision", ["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_arithmetic_ops_place_nan_and_inf_as_torch_and_llvm(name, precision):
    body, reference = CASES[name]
    got, llvm = offloaded_and_llvm(body, ROWS, precision)
    same_specials(got, llvm)
    same_specials(got, reference(torch.from_numpy(ROWS)).numpy())


def test_softmax_nan_row_is_all_nan():
    """The issue's rows: [nan, 1, 2] gave [nan, 0, 0] and [-inf, nan, 1] gave [0, nan, 0]."""
    x = np.array([[NAN, 1, 2], [-INF, NAN, 1]], "float32")
    got, _ = offloaded_and_llvm(lambda e, v: R.nn.softmax(v, axis=-1), x)
    assert np.isnan(got).all()


def test_safe_softmax_keeps_all_minus_inf_rows_zero_and_nan_rows_nan():
    """torch's _safe_softmax (safe=1): a row of only -inf is 0 (not NaN), every other special row as
    in plain softmax."""
    got, llvm = offloaded_and_llvm(lambda e, v: safe_softmax_chain(e, v, -1), ROWS)
    same_specials(got, llvm)
    np.testing.assert_array_equal(got[4], np.zeros(4, "float32"))
    assert np.isnan(got[[0, 1, 2, 3, 7, 8]]).all()
    np.testing.assert_allclose(got[5], torch.softmax(torch.from_numpy(ROWS[5]), 0).numpy(), rtol=1e-6)


def _long_rows(length: int) -> np.ndarray:
    """Rows long enough for the vectorized row scan's body and tail: finite, a causal mask's -inf
    tail, all -inf, one NaN (last / in the middle, sign bit set), one +inf, -inf next to a NaN."""
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((8, length)).astype("float32")
    rows[1, length // 3:] = -INF
    rows[2, :] = -INF
    rows[3, -1] = NAN
    rows[4, length // 2] = -np.float32(NAN)  # a NaN with its sign bit set: 0xffc00000
    rows[5, length // 4] = INF
    rows[6, :length - 1] = -INF
    rows[7, :5], rows[7, -1] = -INF, NAN
    assert np.signbit(rows[4, length // 2])
    return rows


@pytest.mark.parametrize("length", [4, 133])
@pytest.mark.parametrize("safe", [False, True])
def test_softmax_row_scan_on_long_rows(length, safe):
    """Each kind of special row, long enough that the contiguous row scan (integer counts of the
    non-finite and the -inf elements) runs its vector body and its tail: the rows as TVM's llvm
    softmax has them, all -inf rows 0 with ``safe``, the partly masked rows torch's values."""
    rows = _long_rows(length)
    body = (lambda e, v: safe_softmax_chain(e, v, -1)) if safe else (lambda e, v: R.nn.softmax(v, axis=-1))
    got, llvm = offloaded_and_llvm(body, rows)
    if safe:
        np.testing.assert_array_equal(got[2], np.zeros(length, "float32"))
        llvm[2] = 0.0
    same_specials(got, llvm)
    assert np.isnan(got[[3, 4, 5, 7]]).all()
    for i in (0, 1, 6):
        np.testing.assert_allclose(got[i], torch.softmax(torch.from_numpy(rows[i]), 0).numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name, body", [
    ("relu", lambda e, v: R.nn.relu(v)),
    ("maximum", lambda e, v: R.maximum(v, relax.const(np.float32(0.5)))),
    ("max", lambda e, v: R.max(v, axis=[1])),
    ("min", lambda e, v: R.min(v, axis=[1])),
])
def test_ordering_ops_follow_llvm(name, body):
    """relu / maximum / max / min: llvm's select semantics (a NaN operand loses unless it is the last
    one compared), which oneDNN's jit max and relu happen to share on these rows; torch propagates
    the NaN instead (docs/reliability.md)."""
    got, llvm = offloaded_and_llvm(body, ROWS)
    same_specials(got, llvm)
