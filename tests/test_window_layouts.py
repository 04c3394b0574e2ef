"""Window attention's data movement (issue 39 item 1, torchvision Swin): the copies the region makes.

* ``q, k, v = qkv[0], qkv[1], qkv[2]`` of one dense's output viewed ``[3, windows, heads, N, d]`` by a
  permute: the permute relabels the dense's buffer and each ``slice`` reads its part where it lies
  (cpp/kernels/slice.cc), with no plain copy of the whole permuted value first.
* ``(P @ V).transpose(1, 2).reshape(windows, N, C)`` (the heads' merge): no copy. torch.export
  batch-flattens P @ V ([windows * heads, N, d], then a reshape to [windows, heads, N, d] before the
  transpose); the planner offers the matmul the layout under which the transpose is a plain view,
  through the reshape (plan/layouts.cc PermutedOutputLayout), and the matmul writes it with its batch
  dims split as the reshape's (kernels/matmul.cc).
* ``torch.roll`` over H and W (two constant-index ``take``s from torch.export; per axis a ``concat``
  of two ``strided_slice`` calls from both ONNX exporters) and the window partition / reverse
  (``reshape`` -> ``permute_dims`` -> ``reshape``): one ``take`` of rows each way
  (:mod:`byoc_hetero.passes.compose_row_moves`).

Checked against numpy / torch, and by the region's per-step profile (which copies run).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero import passes
from byoc_hetero._relax import constant_value, op_calls, op_name
from model_paths import PATHS, dataflow_module, one_region, run_profiled

R = relax.op


def _ops(mod) -> list[str]:
    return [op_name(c) for c in op_calls(mod["main"])]


def _copies(steps: list[dict]) -> list[str]:
    """The planner's own copies between layouts (steps of no op: reorders, plain copies), but for the
    copy of a reshape's bytes into the caller's output buffer (the region's boundary)."""
    return [s["label"] + " " + s["layouts"] for s in steps if not s["op"] and "copied out" not in s["label"]]


def _llvm(mod, *inputs) -> np.ndarray:
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs]).numpy()


# -- slices of a permuted value -------------------------------------------------------------------------
@pytest.mark.parametrize("stepped", [False, True])
def test_slices_of_a_permuted_value_copy_only_their_part(stepped):
    """A dense's output [T, 3 * heads * d] viewed [3, 1, heads, T, d] (Q, K, V split as attention
    does) and sliced along the first axis (``stepped``: every other token too): numpy's answer, and
    no reorder step (before, the planner copied the whole permuted value to plain first)."""
    tokens, heads, d = 12, 2, 4
    width = 3 * heads * d
    rng = np.random.default_rng(3 + stepped)
    x = rng.standard_normal((tokens, width)).astype("float32")
    w = rng.standard_normal((width, width)).astype("float32")

    def body(bb, v):
        qkv = bb.emit(R.permute_dims(R.reshape(bb.emit(R.matmul(v, relax.const(w))), [1, tokens, 3, heads, d]),
                                     [2, 0, 3, 1, 4]))
        step = 2 if stepped else 1
        parts = [bb.emit(R.strided_slice(qkv, axes=[0, 3], begin=[i, 1], end=[i + 1, tokens], strides=[1, step]))
                 for i in range(3)]
        return R.add(R.multiply(parts[0], parts[1]), parts[2])

    part = bh.partition(dataflow_module([relax.Var("x", relax.TensorType(x.shape, "float32"))], body))
    assert len(bh.report(part).regions) == 1
    got, steps = run_profiled(part, [x])
    view = (x @ w).reshape(1, tokens, 3, heads, d).transpose(2, 0, 3, 1, 4)[:, :, :, 1::(2 if stepped else 1)]
    np.testing.assert_allclose(got, view[0:1] * view[1:2] + view[2:3], rtol=1e-5, atol=1e-5)
    assert [s["op"] for s in steps].count("slice") == 3, [s["op"] for s in steps]
    assert not _copies(steps), _copies(steps)


def test_a_slice_read_by_matmuls_is_a_view_that_keeps_its_buffer_alive(monkeypatch):
    """A column slice of a dense's output [2, T, 2C] read only by a batched matmul (as a and, transposed,
    b) is a view of the dense's buffer: no slice step, the matmul reads the strided rows where they lie.
    A later dense whose residual is that output could accumulate into its buffer in place (the output's
    last reader); it copies the residual instead, because the view is still to be read (before the
    planner counted a view's buffer as its own: a wrong answer). numpy's answer."""
    monkeypatch.setenv("BYOC_HETERO_SLICE_VIEWS", "on")  # opt-in (cpp/plan/layouts.h SliceView)
    tokens, channels = 6, 4
    rng = np.random.default_rng(5)
    x, x2 = (rng.standard_normal((2, tokens, channels)).astype("float32") for _ in range(2))
    w1, w2 = (rng.standard_normal((channels, 2 * channels)).astype("float32") for _ in range(2))

    def body(bb, v, v2):
        y = bb.emit(R.matmul(v, relax.const(w1)))
        q = bb.emit(R.strided_slice(y, axes=[2], begin=[0], end=[channels]))
        z = bb.emit(R.add(bb.emit(R.matmul(v2, relax.const(w2))), y))
        qq = bb.emit(R.matmul(q, bb.emit(R.permute_dims(q, [0, 2, 1]))))
        return R.add(qq, bb.emit(R.matmul(z, bb.emit(R.permute_dims(z, [0, 2, 1])))))

    params = [relax.Var(name, relax.TensorType(x.shape, "float32")) for name in ("x", "x2")]
    part = bh.partition(dataflow_module(params, body))
    assert len(bh.report(part).regions) == 1
    got, steps = run_profiled(part, [x, x2])
    y = x @ w1
    z = x2 @ w2 + y
    q = y[..., :channels]
    np.testing.assert_allclose(got, q @ q.transpose(0, 2, 1) + z @ z.transpose(0, 2, 1), rtol=1e-5, atol=1e-4)
    ops = [s["op"] for s in steps]
    assert "slice" not in ops and ops.count("matmul") == 2, ops
    copied = [s["label"] for s in steps if "copied into the output" in s["label"]]
    assert any("residual tensor" in label and "(dense)" in label for label in copied), copied


# -- the heads' merge ------------------------------------------------------------------------------------
@pytest.mark.parametrize("windows, shared", [(3, False), (1, False), (3, True)])
def test_heads_merge_after_a_batch_flattened_matmul_is_a_view(windows, shared):
    """P @ V batch-flattened ([windows * heads, N, N] @ [windows * heads, N, d]), reshaped to
    [windows, heads, N, d], transposed to [windows, N, heads, d] and merged to [windows, N, C] before
    a dense: numpy's answer, and no copy between layouts (the matmul writes the layout that makes the
    reshape and the transpose views, with its batch dims split as the reshape's: acbd, for 1 window
    too). ``shared``: the product is also read by an add, so the hint is not offered and the merge is
    a copy, with the right answer."""
    heads, n, d = 2, 5, 4
    rng = np.random.default_rng(10 + windows + shared)
    p = rng.standard_normal((windows * heads, n, n)).astype("float32")
    v = rng.standard_normal((windows * heads, n, d)).astype("float32")
    w = rng.standard_normal((heads * d, 6)).astype("float32")

    def body(bb, pv, vv):
        product = bb.emit(R.matmul(pv, vv))
        four = bb.emit(R.reshape(product, [windows, heads, n, d]))
        merged = bb.emit(R.reshape(bb.emit(R.permute_dims(four, [0, 2, 1, 3])), [windows, n, heads * d]))
        out = bb.emit(R.matmul(merged, relax.const(w)))
        if not shared:
            return out
        other = bb.emit(R.reshape(bb.emit(R.add(product, vv)), [windows, n, heads * d]))
        return R.add(out, bb.emit(R.matmul(other, relax.const(w))))

    params = [relax.Var(name, relax.TensorType(x.shape, "float32")) for name, x in (("p", p), ("v", v))]
    part = bh.partition(dataflow_module(params, body))
    assert len(bh.report(part).regions) == 1, bh.report(part)
    got, steps = run_profiled(part, [p, v])
    want = (p @ v).reshape(windows, heads, n, d).transpose(0, 2, 1, 3).reshape(windows, n, heads * d) @ w
    if shared:
        want = want + ((p @ v) + v).reshape(windows, n, heads * d) @ w
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert bool(_copies(steps)) == shared, _copies(steps)


def test_permute_after_a_merging_reshape_of_a_matmul_is_a_view():
    """The hint through a reshape that merges batch dims ([3, 2, N, d] -> [6, N, d], then transposed to
    [N, 6, d] and flattened): offered under the matmul's own dims ([3, 2, N, d] under cabd), so no
    copy between layouts either; numpy's answer."""
    rng = np.random.default_rng(20)
    p = rng.standard_normal((3, 2, 5, 5)).astype("float32")
    v = rng.standard_normal((3, 2, 5, 4)).astype("float32")
    w = rng.standard_normal((24, 6)).astype("float32")

    def body(bb, pv, vv):
        flat = bb.emit(R.reshape(bb.emit(R.matmul(pv, vv)), [6, 5, 4]))
        return R.matmul(bb.emit(R.reshape(bb.emit(R.permute_dims(flat, [1, 0, 2])), [5, 24])), relax.const(w))

    params = [relax.Var(name, relax.TensorType(x.shape, "float32")) for name, x in (("p", p), ("v", v))]
    got, steps = run_profiled(bh.partition(dataflow_module(params, body)), [p, v])
    np.testing.assert_allclose(got, (p @ v).reshape(6, 5, 4).transpose(1, 0, 2).reshape(5, 24) @ w, rtol=1e-5, atol=1e-4)
    assert not _copies(steps), _copies(steps)


# -- rolled windows -------------------------------------------------------------------------------------
def _roll(bb, x, shift: int, size: int):
    """torch.export's ``torch.roll(x, shift, (1, 2))``: a take of constant indices along each axis."""
    index = relax.const((np.arange(size) - shift) % size, "int64")
    return bb.emit(R.take(bb.emit(R.take(x, index, axis=1)), index, axis=2))


def _windows(bb, x, size: int, window: int, channels: int):
    """Swin's window partition of [1, size, size, C]: [windows, window * window, C]."""
    n = size // window
    six = bb.emit(R.reshape(x, [1, n, window, n, window, channels]))
    return bb.emit(R.reshape(bb.emit(R.permute_dims(six, [0, 1, 3, 2, 4, 5])), [n * n, window * window, channels]))


def test_roll_and_window_partition_are_one_take_of_rows():
    """Roll over H and W then partition into windows (6 links, 3 copies) is one take of [H * W, C]
    rows; llvm's answer before and after equals numpy's."""
    size, window, channels, shift = 8, 4, 6, 2
    x = relax.Var("x", relax.TensorType([1, size, size, channels], "float32"))
    mod = dataflow_module([x], lambda bb, v: _windows(bb, _roll(bb, v, shift, size), size, window, channels))
    out = passes.compose_row_moves(mod)
    assert _ops(out) == ["relax.reshape", "relax.take", "relax.reshape"], _ops(out)
    (take,) = [c for c in op_calls(out["main"]) if op_name(c) == "relax.take"]
    assert constant_value(take.args[1]).shape == (size * size,)  # rows of C elements, not single elements
    data = np.random.default_rng(0).standard_normal((1, size, size, channels)).astype("float32")
    rolled = np.roll(data, (shift, shift), axis=(1, 2))
    n = size // window
    want = rolled.reshape(1, n, window, n, window, channels).transpose(0, 1, 3, 2, 4, 5)
    want = want.reshape(n * n, window * window, channels)
    np.testing.assert_array_equal(_llvm(mod, data), want)
    np.testing.assert_array_equal(_llvm(out, data), want)


def test_row_moves_that_undo_each_other_are_a_reshape():
    """A roll and the roll back (4 takes) move nothing: a reshape of the input, no take."""
    x = relax.Var("x", relax.TensorType([1, 6, 6, 3], "float32"))
    mod = dataflow_module([x], lambda bb, v: R.multiply(_roll(bb, _roll(bb, v, 2, 6), -2, 6), v))
    out = passes.compose_row_moves(mod)
    assert "relax.take" not in _ops(out), _ops(out)
    data = np.random.default_rng(1).standard_normal((1, 6, 6, 3)).astype("float32")
    np.testing.assert_array_equal(_llvm(out, data), data * data)


def _sliced_roll(bb, x, shift: int, size: int, axes=(1, 2)):
    """The ONNX exporters' ``torch.roll(x, shift, (1, 2))``: per axis, ``concat`` of the last ``shift``
    positions and the rest (two ``strided_slice`` calls of one value)."""
    for axis in axes:
        cut = (size - shift) % size
        tail = bb.emit(R.strided_slice(x, [axis], [cut], [size], [1]))
        head = bb.emit(R.strided_slice(x, [axis], [0], [cut], [1]))
        x = bb.emit(R.concat([tail, head], axis=axis))
    return x


def test_sliced_roll_and_window_partition_are_one_take_of_rows():
    """The ONNX form of the roll (per axis a concat of two slices of one value) then the window
    partition: one take of [H * W, C] rows, as torch.export's takes; llvm's answer equals numpy's."""
    size, window, channels, shift = 8, 4, 6, 3
    x = relax.Var("x", relax.TensorType([1, size, size, channels], "float32"))
    mod = dataflow_module([x], lambda bb, v: _windows(bb, _sliced_roll(bb, v, shift, size), size, window, channels))
    out = passes.compose_row_moves(mod)
    assert _ops(out) == ["relax.reshape", "relax.take", "relax.reshape"], _ops(out)
    data = np.random.default_rng(2).standard_normal((1, size, size, channels)).astype("float32")
    n = size // window
    want = np.roll(data, (shift, shift), axis=(1, 2)).reshape(1, n, window, n, window, channels)
    want = want.transpose(0, 1, 3, 2, 4, 5).reshape(n * n, window * window, channels)
    np.testing.assert_array_equal(_llvm(mod, data), want)
    np.testing.assert_array_equal(_llvm(out, data), want)


def _concat_of(bb, x, y, pieces):
    """``concat`` along axis 1 of ``strided_slice(src, [axis], [b], [e], [step])`` for each piece
    ``(src, axis, b, e, step)``, ``src`` 0 for ``x`` and 1 for ``y``; then a permute (a second copy)."""
    parts = [bb.emit(R.strided_slice((x, y)[src], [axis], [b], [e], [step])) for src, axis, b, e, step in pieces]
    return R.permute_dims(bb.emit(R.concat(parts, axis=1)), [1, 0, 2])


@pytest.mark.parametrize("pieces,composed", [
    ([(0, 1, 4, 6, 1), (0, 1, 0, 4, 1)], True),  # a roll by 2
    ([(0, 1, 1, 6, 2), (0, 1, 0, 6, 2), (0, 1, -1, 6, 1)], True),  # steps, a negative start, a repeat
    ([(0, 1, 4, 6, 1), (1, 1, 0, 4, 1)], False),  # slices of two values
    ([(0, 2, 0, 3, 1), (0, 2, 3, 6, 1)], False),  # sliced along another axis than the concat's
])
def test_concat_of_slices_is_a_take_only_of_one_value_along_its_axis(pieces, composed):
    """A concat of slices of one value along the concat's axis is a take along it (composed with the
    permute after it into one take of rows); slices of two values, or along another axis, are left alone.
    llvm's answer before and after equals numpy's."""
    x, y = (relax.Var(n, relax.TensorType([2, 6, 6], "float32")) for n in "xy")
    mod = dataflow_module([x, y], lambda bb, a, b: _concat_of(bb, a, b, pieces))
    out = passes.compose_row_moves(mod)
    assert ("relax.concat" not in _ops(out)) == composed, _ops(out)
    rng = np.random.default_rng(3)
    data = [rng.standard_normal((2, 6, 6)).astype("float32") for _ in range(2)]
    cut = [data[src][(slice(None),) * axis + (slice(b, e, step),)] for src, axis, b, e, step in pieces]
    want = np.concatenate(cut, axis=1).transpose(1, 0, 2)
    np.testing.assert_array_equal(_llvm(mod, *data), want)
    np.testing.assert_array_equal(_llvm(out, *data), want)


def test_row_moves_that_split_the_last_dim_are_left_alone():
    """A roll along the last axis and a permute moves single elements, not rows: left as it is."""
    x = relax.Var("x", relax.TensorType([4, 5], "float32"))
    index = relax.const((np.arange(5) - 1) % 5, "int64")
    mod = dataflow_module([x], lambda bb, v: R.permute_dims(bb.emit(R.take(v, index, axis=1)), [1, 0]))
    assert passes.compose_row_moves(mod) is mod


torch = pytest.importorskip("torch")


class WindowAttention(torch.nn.Module):
    """torchvision Swin's window attention at a few channels: one qkv linear split into Q, K, V by a
    permute, softmax(q k^T * scale) v, the heads merged back (transpose + reshape), the output linear."""

    def __init__(self, heads: int = 2, dim: int = 8):
        super().__init__()
        self.heads, self.scale = heads, dim ** -0.5
        self.qkv = torch.nn.Linear(heads * dim, 3 * heads * dim)
        self.proj = torch.nn.Linear(heads * dim, heads * dim)

    def forward(self, x):  # [windows, tokens, heads * dim]
        w, n, c = x.shape
        q, k, v = self.qkv(x).reshape(w, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attn = torch.softmax((q * self.scale) @ k.transpose(-2, -1), dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(w, n, c))


def test_window_attention_makes_no_layout_copy(tmp_path):
    """Through from_torch (the region graph is the same through the exporters): one region, nothing on
    llvm, torch's answer, and no copy of the permuted qkv: Q, K, V are sliced from it where it lies
    (before: a plain copy of the whole [3, windows, heads, N, d] value first), and no copy for the
    heads' merge (P @ V, batch-flattened, reshaped and transposed; before: one reorder)."""
    torch.manual_seed(0)
    model = WindowAttention().eval()
    x = torch.randn(4, 16, 16)
    with torch.no_grad():
        want = model(x).numpy()
    part = one_region(model, (x,), "from_torch", tmp_path)
    got, steps = run_profiled(part, [x.numpy()])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not _copies(steps), _copies(steps)


@pytest.mark.parametrize("path", ("from_torch", "from_onnx_torchscript"))
def test_window_attention_reads_q_k_v_where_they_lie(path, tmp_path, monkeypatch):
    """``q, k, v = qkv[0], qkv[1], qkv[2]`` of the permuted qkv dense output are views of the dense's
    buffer (cpp/plan/layouts.h SliceView): no slice step and no copy between layouts; ``q * scale`` is
    the first matmul's scale (ops/attention.py), and the batch-flattened products run on the unmerged
    [windows, heads, ...] operands (ops/layout.py unmerge_batch_dims), so both matmuls read Q, K and V
    where they lie (before: three host copies of a third of the qkv value and a scaling pass). One
    region, nothing on llvm, torch's answer. The views are opt-in (BYOC_HETERO_SLICE_VIEWS=on)."""
    monkeypatch.setenv("BYOC_HETERO_SLICE_VIEWS", "on")
    torch.manual_seed(0)
    model = WindowAttention().eval()
    x = torch.randn(4, 16, 16)
    with torch.no_grad():
        want = model(x).numpy()
    part = one_region(model, (x,), path, tmp_path)
    got, steps = run_profiled(part, [x.numpy()])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ops = [s["op"] for s in steps]
    assert "slice" not in ops and "binary" not in ops and not _copies(steps), [(s["op"], s["label"]) for s in steps]
    assert ops.count("matmul") == 2, ops


class ShiftedWindows(torch.nn.Module):
    """torchvision Swin's shifted-window data movement around a per-token linear: roll by -shift over
    H and W, partition into windows, the linear, reverse the partition, roll back, the residual add."""

    def __init__(self, size: int = 8, window: int = 4, shift: int = 2, dim: int = 16):
        super().__init__()
        self.size, self.window, self.shift = size, window, shift
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):  # [1, size, size, dim]
        n, w, c = self.size // self.window, self.window, x.shape[-1]
        y = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        y = y.view(1, n, w, n, w, c).permute(0, 1, 3, 2, 4, 5).reshape(n * n, w * w, c)
        y = self.proj(y)
        y = y.view(1, n, n, w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(1, n * w, n * w, c)
        return x + torch.roll(y, shifts=(self.shift, self.shift), dims=(1, 2))


@pytest.mark.parametrize("path", PATHS)
def test_shifted_windows_match_torch(path, tmp_path):
    """Through from_torch (torch.roll as takes) and both exporters' files (torch.roll as Slice + Concat
    per axis): one region, nothing on llvm, torch's answer, and the region moves the activations once
    each way: two take steps, no slice, concat or reorder (before: from_torch four takes and two
    reorders; the ONNX files eight slices, two concats and two reorders)."""
    torch.manual_seed(0)
    model = ShiftedWindows().eval()
    x = torch.randn(1, 8, 8, 16)
    with torch.no_grad():
        want = model(x).numpy()
    part = one_region(model, (x,), path, tmp_path)
    got, steps = run_profiled(part, [x.numpy()])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ops = [s["op"] for s in steps]
    assert ops.count("take") == 2 and not {"slice", "concat"} & set(ops) and not _copies(steps), \
        [(s["op"], s["label"]) for s in steps]
