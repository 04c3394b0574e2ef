"""Rotary position embedding as one region step (region pass ``fuse_rotary_embeddings``,
ops/rotary.py; kernel ``rope``, cpp/kernels/rope.cc).

References: numpy for the kernel alone, the llvm-only build for Relax graphs, torch eager for the
small Llama decoder through both import paths.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from conftest import graph, offload_and_compare
from test_llm_region import small_llama
from test_runtime import Region
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.timing import build

R = relax.op
RNG = np.random.default_rng(27)
S, H, D = 6, 3, 8


def rope_ref(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """transformers' ``x * cos + rotate_half(x) * sin`` in numpy."""
    h = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., h:], x[..., :h]], axis=-1) * sin


# ----------------------------------------------------------------------------------------------
# the kernel alone (a hand-written region document) against numpy
# ----------------------------------------------------------------------------------------------
def _run_kernel(x, cos, sin, axes=None, scale=None):
    r = Region("rope")
    out_shape = [x.shape[a] for a in axes] if axes else list(x.shape)
    ins = [r.input(x.shape), r.input(cos.shape), r.input(sin.shape)]
    attrs = dict(({"axes": axes} if axes else {}), **({"scale": scale} if scale is not None else {}))
    r.outputs.append(r.node("rope", ins, out_shape, **attrs))
    return r.run(r.module(), x, cos, sin)[0]


@pytest.mark.parametrize("x_shape, cs_shape, axes, scale", [
    ((1, 5, 3, 6), (1, 1, 5, 6), [0, 2, 1, 3], None),   # [B, S, H, D] read as [B, H, S, D], cos per position
    ((2, 3, 7, 10), (7, 10), None, 0.35),                # no permute, cos [S, D] broadcast over B and heads
    ((3, 1, 2), (3, 1, 2), None, None),                  # D = 2, nothing broadcast
    ((1, 4, 2, 34), (1, 2, 1, 34), [0, 2, 1, 3], -2.0),  # cos per head, one for every position
])
def test_kernel_matches_numpy(x_shape, cs_shape, axes, scale):
    x = RNG.standard_normal(x_shape).astype("float32")
    cos, sin = (RNG.standard_normal(cs_shape).astype("float32") for _ in range(2))
    want = rope_ref(np.transpose(x, axes) if axes else x, cos, sin) * (1.0 if scale is None else scale)
    np.testing.assert_allclose(_run_kernel(x, cos, sin, axes, scale), want, rtol=1e-6, atol=1e-6)


def test_kernel_propagates_nan_and_inf_as_the_separate_steps():
    """NaN / ±inf in x and in cos / sin: the same NaN and infinity positions (with sign) as numpy's
    products and sum (inf * 0 and inf - inf give NaN as in the unfused steps)."""
    x = RNG.standard_normal((1, 4, 2, 6)).astype("float32")
    cos, sin = (RNG.standard_normal((1, 1, 4, 6)).astype("float32") for _ in range(2))
    x[0, 0, 0, 0], x[0, 1, 1, 4], x[0, 2, 0, 1] = np.nan, np.inf, -np.inf
    cos[0, 0, 3, 2], sin[0, 0, 1, 0], sin[0, 0, 2, 4] = np.inf, 0.0, np.nan
    x[0, 3, 0, 2], x[0, 3, 0, 5] = np.inf, np.inf  # inf * c + inf * s at j = 2 (and j = 5)
    sin[0, 0, 3, 2] = -1.0
    with np.errstate(invalid="ignore"):
        want = rope_ref(np.transpose(x, [0, 2, 1, 3]), cos, sin)
    got = _run_kernel(x, cos, sin, [0, 2, 1, 3])
    assert np.isnan(want).any() and np.isinf(want).any()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("x_shape, cs_shapes, axes, message", [
    ((1, 4, 2, 5), [(1, 1, 4, 5)] * 2, [0, 2, 1, 3], "needs it even"),
    ((1, 4, 2, 6), [(1, 1, 4, 6), (1, 1, 4, 1)], [0, 2, 1, 3], "differ in shape"),
    ((1, 4, 2, 6), [(1, 3, 4, 6)] * 2, [0, 2, 1, 3], "do not broadcast"),
    ((1, 4, 2, 6), [(1, 1, 4, 6)] * 2, [0, 3, 1, 2], "moves the last axis"),
])
def test_kernel_rejects_malformed_nodes(x_shape, cs_shapes, axes, message):
    r = Region("t")
    ins = [r.input(x_shape)] + [r.input(s) for s in cs_shapes]
    r.outputs.append(r.node("rope", ins, [x_shape[a] for a in axes], axes=axes))
    with pytest.raises(ValueError, match="byoc_hetero region 't'") as err:
        bh._C.plan_region(r.json())
    assert message in str(err.value)


# ----------------------------------------------------------------------------------------------
# the region pass on hand-written Relax graphs, against the llvm build
# ----------------------------------------------------------------------------------------------
def _rope_graph(spelling: str = "torch", d: int = D, cut: int | None = None, cs_shape=None, scaled: bool = False):
    """q = x @ W as [1, S, H, d] -> permute to [1, H, S, d] -> RoPE -> @ W2. ``spelling``: the
    operand order from_torch writes (x * cos, slices lo then hi) or the ONNX exporter's (cos * x,
    slice hi first, sum's operands swapped); ``cut``: where rotate_half slices (default d / 2);
    ``scaled``: the result times 0.7 after a transpose of its last two axes (sdpa's scale of kᵀ)."""
    cut = d // 2 if cut is None else cut
    w = relax.const((0.3 * RNG.standard_normal((H * d, H * d))).astype("float32"))
    w2 = relax.const((0.3 * RNG.standard_normal((d, 4))).astype("float32"))
    w3 = relax.const((0.3 * RNG.standard_normal((S, 4))).astype("float32"))
    cs_shape = cs_shape or (1, 1, S, d)
    cos = relax.const(np.cos(RNG.standard_normal(cs_shape)).astype("float32"))
    sin = relax.const(np.sin(RNG.standard_normal(cs_shape)).astype("float32"))

    def body(emit, x):
        q = emit(R.permute_dims(emit(R.reshape(emit(R.matmul(x, w)), (1, S, H, d))), [0, 2, 1, 3]))
        if spelling == "onnx":
            hi = emit(R.strided_slice(q, [3], [cut], [d]))
            lo = emit(R.strided_slice(q, [3], [0], [cut]))
            rot = emit(R.concat([emit(R.negative(hi)), lo], axis=-1))
            y = emit(R.add(emit(R.multiply(rot, sin)), emit(R.multiply(cos, q))))
        else:
            lo = emit(R.strided_slice(q, [3], [0], [cut]))
            hi = emit(R.strided_slice(q, [3], [cut], [d]))
            rot = emit(R.concat([emit(R.negative(hi)), lo], axis=3))
            y = emit(R.add(emit(R.multiply(q, cos)), emit(R.multiply(rot, sin))))
        if scaled:
            yt = emit(R.permute_dims(emit(R.reshape(y, (1, H, S, d))), [0, 1, 3, 2]))
            return emit(R.matmul(emit(R.multiply(yt, relax.const(np.float32(0.7)))), w3))
        return emit(R.matmul(y, w2))

    return graph({"x": (1, S, H * d)}, body)


def _ops(partitioned) -> list[str]:
    return [n["op"] for m in bh.codegen.region_modules(build(partitioned))
            for n in json.loads(m["get_graph_json"]())["nodes"]]


@pytest.mark.parametrize("spelling", ["torch", "onnx"])
def test_rope_is_one_node_with_its_permute(spelling):
    """Both spellings: one rope node reading the head permute's input; no permute, slice, negate,
    concat or binary left; the llvm build's result. Fails with the pass disabled."""
    res = offload_and_compare(_rope_graph(spelling))
    assert res.error < 1e-5, res.error
    ops = _ops(res.partitioned)
    assert ops.count("rope") == 1, ops
    assert not {"permute", "slice", "eltwise", "concat", "binary"} & set(ops), ops


def test_scale_after_views_is_the_nodes_attr():
    """rope -> reshape -> transpose -> * 0.7: the multiply is the rope's attr scale (no binary
    node left), the result is the llvm build's."""
    res = offload_and_compare(_rope_graph(scaled=True))
    assert res.error < 1e-5, res.error
    nodes = [n for m in bh.codegen.region_modules(build(res.partitioned))
             for n in json.loads(m["get_graph_json"]())["nodes"]]
    assert [abs(n["attrs"].get("scale", 0) - 0.7) < 1e-7 for n in nodes if n["op"] == "rope"] == [True]
    assert "binary" not in [n["op"] for n in nodes]


@pytest.mark.parametrize("case", ["odd", "cut", "broadcast"])
def test_other_rotations_keep_their_steps(case):
    """Odd D (slices at 3 and 4 of 7), a slice not at D/2 (a roll by 2 of 8), cos / sin that do not
    span the last axis ([1, 1, S, 1]): no rope node, the separate steps give the llvm build's result."""
    kwargs = {"odd": {"d": 7}, "cut": {"cut": 2}, "broadcast": {"cs_shape": (1, 1, S, 1)}}[case]
    res = offload_and_compare(_rope_graph(**kwargs))
    ops = _ops(res.partitioned)
    assert "rope" not in ops and "concat" in ops, ops


@pytest.mark.parametrize("case, reason", [
    ("odd", "no rotate_half: the last axis 7 is not an even static size"),
    ("cut", "no rotate_half: a slice is not x[..., 4:8] (begin [0, 0, 0, 2])"),
    ("broadcast", "cos / sin do not span the last axis of a static x [1, 3, 6, 8]"),
])
def test_report_says_why_a_rotation_stays(case, reason):
    """bh.report lists each rotation the pass declined as a rejection of rule
    onednn:fuse_rotary_embeddings (op rope, the sum's value, rope_match's reason), under its region
    and in the printed table; the same graph with a rotation the pass takes, and a region with only
    other adds, report none. Fails with the pass's recording removed."""
    kwargs = {"odd": {"d": 7}, "cut": {"cut": 2}, "broadcast": {"cs_shape": (1, 1, S, 1)}}[case]
    rep = bh.report(bh.partition(_rope_graph(**kwargs)))
    got = [r for r in rep.rejections if r.rule == "onednn:fuse_rotary_embeddings"]
    d = kwargs.get("d", D)
    assert [(r.op, r.reason, r.value) for r in got] == [("rope", reason, f"float32[1, {H}, {S}, {d}]")], got
    assert [r.declined for r in rep.regions] == [got]
    assert f"not one rope step: {reason} [onednn:fuse_rotary_embeddings]" in str(rep)
    taken = bh.report(bh.partition(_rope_graph()))
    assert not [r for r in taken.rejections if "rotary" in r.rule] and not taken.regions[0].declined
    plain = graph({"x": (2, 8)}, lambda emit, x: emit(R.add(emit(R.multiply(x, x)), emit(R.multiply(
        emit(R.matmul(x, relax.const(np.eye(8, dtype="float32")))), x)))))
    plain_rep = bh.report(bh.partition(plain))
    assert plain_rep.regions and not any(r.declined for r in plain_rep.regions)


# ----------------------------------------------------------------------------------------------
# the small Llama decoder through both import paths, against torch
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["from_torch", "from_onnx"])
def test_llama_decoder_rope_is_one_step_and_matches_torch(path, tmp_path):
    """2 layers: 4 rope nodes (q and k per layer), no rotate_half slice or concat left in the region
    (the slices left are the 3 parts per layer of the combined Q / K / V dense, pass
    combine_parallel_denses), and the output within 1e-4 of torch's."""
    import tvm

    zm, mod, params, want = small_llama(path, tmp_path)
    ex = build(bh.partition(mod, params))
    ops = [n["op"] for m in bh.codegen.region_modules(ex) for n in json.loads(m["get_graph_json"]())["nodes"]]
    assert ops.count("rope") == 4, ops
    assert ops.count("slice") == 2 * 3 and ops.count("dense") == 2 * 5 and "concat" not in ops, ops
    # sdpa's scale of q and of kᵀ, sqrt(1 / sqrt(32)) each, is the rope nodes' attr
    scales = [n["attrs"].get("scale") for m in bh.codegen.region_modules(ex)
              for n in json.loads(m["get_graph_json"]())["nodes"] if n["op"] == "rope"]
    assert all(s is not None and abs(s - 32 ** -0.25) < 1e-6 for s in scales), scales
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(x.numpy()) for x in zm.inputs]).numpy()
    assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) < 1e-4


def test_kernel_without_avx512_matches_numpy():
    """The portable row loop (machines without AVX-512; oneDNN capped at AVX2 here picks it): the
    kernel tests above pass with it."""
    import subprocess

    env = dict(os.environ, DNNL_MAX_CPU_ISA="AVX2")
    here = os.path.abspath(__file__)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", here, "-k",
                           "test_kernel_ and not without_avx512"], env=env, capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(os.path.dirname(here)))
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def _hand_graph(d: int = 8, cut: int | None = None, dtype: str = "float32", cs_last: int | None = None):
    """A region graph of x * cos + rotate_half(x) * sin written directly (tensors 0-2: x, cos, sin)."""
    from byoc_hetero.backends.onednn.lowering import Node, RegionGraph

    cut = d // 2 if cut is None else cut
    x, cs = [1, 2, 3, d], [1, 1, 3, d if cs_last is None else cs_last]
    shapes = [x, cs, cs, x[:3] + [cut], x[:3] + [d - cut], x[:3] + [d - cut], x, x, x, x]
    g = RegionGraph("t", tensors=[{"shape": s, "dtype": dtype} for s in shapes], inputs=[0, 1, 2], outputs=[9])
    g.nodes = [Node("slice", [0], 3, {"begin": [0, 0, 0, 0]}), Node("slice", [0], 4, {"begin": [0, 0, 0, cut]}),
               Node("eltwise", [4], 5, {"algorithm": "negative"}), Node("concat", [5, 3], 6, {"axis": 3}),
               Node("binary", [0, 1], 7, {"algorithm": "mul"}), Node("binary", [6, 2], 8, {"algorithm": "mul"}),
               Node("binary", [7, 8], 9, {"algorithm": "add"})]
    return g


@pytest.mark.parametrize("kwargs, reason", [
    ({}, None),
    ({"d": 7, "cut": 3}, "not an even static size"),
    ({"cut": 2}, "a slice is not x[..., 4:8]"),
    ({"dtype": "float16"}, "not float32: float16"),
    ({"cs_last": 1}, "do not span the last axis"),
])
def test_pass_says_why_a_rotation_stays(kwargs, reason):
    """rope_match on hand-written graphs: the match, or the reason the steps stay."""
    from byoc_hetero.backends.onednn.ops.rotary import RopeMatch, rope_match

    g = _hand_graph(**kwargs)
    got = rope_match(g, g.nodes[-1])
    if reason is None:
        assert isinstance(got, RopeMatch) and (got.x, got.cos, got.sin) == (0, 1, 2)
    else:
        assert isinstance(got, str) and reason in got, got
