"""int8 CNN fusions (docs/int8.md): activations between an int8 conv's quantizations as its oneDNN
post-op (pass fuse_int8_activations) and add / multiply on 8-bit tensors (pass fuse_int8_binaries,
kernel quantized_binary), against numpy and against the llvm build (TVM's float emulation of every
quantize / dequantize), and the cases the passes must leave alone.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.timing import build, run
from conftest import needs_int8_kernels

R = relax.op
F32 = "float32"
SIGMOID = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
ACTS = {"hardswish": lambda v: v * np.clip(v / 6 + 0.5, 0, 1), "sigmoid": SIGMOID, "tanh": np.tanh}


def _c(value, dtype):
    return relax.const(np.array(value, dtype))


class _Graph:
    """A Relax function built step by step with per-tensor quantize / dequantize helpers."""

    def __init__(self, shapes):
        self.bb = relax.BlockBuilder()
        self.params = [relax.Var(f"x{i}", relax.TensorType(s, F32)) for i, s in enumerate(shapes)]

    def q(self, t, scale, zero, dtype="uint8", axis=-1):
        return self.bb.emit(R.quantize(t, _c(scale, F32), _c(zero, dtype), axis=axis, out_dtype=dtype))

    def dq(self, t, scale, zero, dtype="uint8", axis=-1):
        return self.bb.emit(R.dequantize(t, _c(scale, F32), _c(zero, dtype), axis=axis, out_dtype=F32))

    def qdq(self, t, scale, zero, dtype="uint8"):
        return self.dq(self.q(t, scale, zero, dtype), scale, zero, dtype)

    def conv1x1(self, xd, w, w_scale, bias):
        wd = self.bb.emit(R.dequantize(relax.const(w), _c(np.full(w.shape[0], w_scale), F32),
                                       _c(np.zeros(w.shape[0]), "int8"), axis=0, out_dtype=F32))
        y = self.bb.emit(R.nn.conv2d(xd, wd))
        return self.bb.emit(R.add(y, relax.const(bias.reshape(1, -1, 1, 1))))


def _module(shapes, body):
    g = _Graph(shapes)
    with g.bb.function("main", g.params):
        with g.bb.dataflow():
            out = g.bb.emit_output(body(g, *g.params))
        g.bb.emit_func_output(out)
    return g.bb.get()


def _region_nodes(part) -> list[dict]:
    mods = part.attrs["external_mods"]
    assert len(mods) == 1, f"{len(mods)} regions"
    return json.loads(str(mods[0]["get_graph_json"]()))["nodes"]


def _left_alone(mod, op: str, shapes, step: float, seed: int) -> None:
    """No ``op`` node in ``mod``'s region, and within one step of the float emulation."""
    part = bh.partition(mod, require_heavy_op=False)
    assert not [n for n in _region_nodes(part) if n["op"] == op]
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(s).astype(F32) for s in shapes]
    assert np.max(np.abs(run(build(part), inputs) - run(build(mod), inputs))) <= step * 1.001


def _quantize(v, scale, zero, lo=0, hi=255):
    return np.clip(np.round(v / scale) + zero, lo, hi)


RNG = np.random.default_rng(3)
W = RNG.integers(-127, 128, (16, 8, 1, 1)).astype("int8")
BIAS = (RNG.standard_normal(16) * 0.1).astype(F32)
X = RNG.standard_normal((1, 8, 6, 6)).astype(F32)
SX, ZX, SW = 0.02, 128, 0.004


def _accumulator():
    """The exact float value of the int8 conv's accumulator + bias (numpy, float64)."""
    xq = _quantize(X, SX, ZX)
    return np.einsum("nchw,oc->nohw", (xq - ZX) * SX, W[:, :, 0, 0] * SW) + BIAS.reshape(1, -1, 1, 1)


def _conv_act(act: str, s1: float, z1: int, s2: float, z2: int):
    def body(g, x):
        y = g.conv1x1(g.qdq(x, SX, ZX), W, SW, BIAS)
        yd = g.qdq(y, s1, z1)
        return g.qdq(g.bb.emit(getattr(R, act)(yd) if act != "hardswish" else R.multiply(
            yd, g.bb.emit(R.clip(g.bb.emit(R.add(g.bb.emit(R.multiply(yd, _c(1 / 6, F32))), _c(0.5, F32))), 0, 1)))),
            s2, z2)
    return _module([X.shape], body)


@needs_int8_kernels
@pytest.mark.parametrize("act,s1,z1,s2,z2,slope", [
    ("hardswish", 0.02, 128, 0.015, 20, 1.5), ("sigmoid", 0.02, 128, 1 / 255, 0, 0.25),
    ("tanh", 0.01, 0, 1 / 128, 128, 1.0)])  # z1 = 0 (uint8): the quantize clamps negatives, a relu
def test_activation_becomes_the_int8_conv_post_op(act, s1, z1, s2, z2, slope):
    """int8 conv -> dequantize -> activation -> quantize: one conv node with the activation as its
    post-op and the skipped quantize's saturation kept (saturate_range), writing the second
    quantize's 8-bit values; within one output step of numpy computing exactly that (the exact
    accumulator clamped to the first quantize's range, the activation, one rounding), and within
    one step plus the skipped rounding (slope x s1 / 2) of the float emulation."""
    mod = _conv_act(act, s1, z1, s2, z2)
    part = bh.partition(mod)
    nodes = _region_nodes(part)
    convs = [n for n in nodes if n["op"] == "conv2d"]
    assert len(convs) == 1 and convs[0]["attrs"]["activation"] == act, nodes
    assert convs[0]["attrs"]["saturate_range"] == pytest.approx([(0 - z1) * s1, (255 - z1) * s1])
    assert not [n for n in nodes if n["op"] in ("eltwise", "binary")], nodes
    got = run(build(part), [X])
    fused = np.clip(_accumulator(), (0 - z1) * s1, (255 - z1) * s1)
    want = (_quantize(ACTS[act](fused), s2, z2) - z2) * s2
    assert np.max(np.abs(got - want)) <= s2 * 1.001
    assert np.mean(np.abs(got - want) < s2 / 2) > 0.95
    emulated = run(build(mod), [X])
    assert np.max(np.abs(got - emulated)) <= s2 * 1.001 + slope * s1 / 2
    if z1 == 0:  # the relu-like clamp was applied: negative accumulators give act(0)
        assert np.any(_accumulator() < 0)


def _silu(gate_scale: float):
    def body(g, x):
        yd = g.qdq(g.conv1x1(g.qdq(x, SX, ZX), W, SW, BIAS), 0.02, 128)
        gate = g.qdq(g.bb.emit(R.sigmoid(yd)), gate_scale, 0)
        return g.qdq(g.bb.emit(R.multiply(yd, gate)), 0.015, 20)
    return _module([X.shape], body)


@needs_int8_kernels
def test_silu_as_a_multiply_becomes_swish_when_the_gate_range_covers_it():
    """x * sigmoid(x) with the sigmoid's own quantize over [0, 1] (EfficientNet's SiLU): the conv's
    swish post-op; within one step of numpy's fused value plus the gate's skipped rounding."""
    part = bh.partition(_silu(1 / 255))
    convs = [n for n in _region_nodes(part) if n["op"] == "conv2d"]
    assert convs[0]["attrs"]["activation"] == "silu"
    got = run(build(part), [X])
    acc = np.clip(_accumulator(), -128 * 0.02, 127 * 0.02)
    want = (_quantize(acc * SIGMOID(acc), 0.015, 20) - 20) * 0.015
    assert np.max(np.abs(got - want)) <= 0.015 * 1.001 + np.max(np.abs(acc)) / 255


def test_silu_whose_gate_quantize_clips_stays_exact():
    """The same with a gate quantize saturating at 0.5 (a calibration that saw small sigmoids, as
    in the EfficientNet-B0 file of bench/INT8.md): a swish post-op would drop that clamp, so the
    conv takes no activation; the chain becomes a lookup table over its 8-bit output, which keeps
    every rounding and clamp, within one step of the float emulation."""
    mod = _silu(0.5 / 255)
    part = bh.partition(mod)
    nodes = _region_nodes(part)
    convs = [n for n in nodes if n["op"] == "conv2d"]
    assert convs[0]["attrs"].get("activation", "none") == "none"
    assert [n["op"] for n in nodes if n["op"] in ("lookup", "eltwise", "binary", "quantized_binary")] == ["lookup"]
    assert np.max(np.abs(run(build(part), [X]) - run(build(mod), [X]))) <= 0.015 * 1.001


def test_per_channel_quantize_between_is_not_fused():
    """A per-channel quantize between the conv and the activation is no anchor output scale: the
    conv keeps no activation and the result is within one step of the float emulation."""
    def body(g, x):
        y = g.conv1x1(g.qdq(x, SX, ZX), W, SW, BIAS)
        scales = np.linspace(0.01, 0.03, 16).astype(F32)
        yq = g.bb.emit(R.quantize(y, relax.const(scales), relax.const(np.full(16, 128, "uint8")), axis=1,
                                  out_dtype="uint8"))
        yd = g.bb.emit(R.dequantize(yq, relax.const(scales), relax.const(np.full(16, 128, "uint8")), axis=1,
                                    out_dtype=F32))
        return g.qdq(g.bb.emit(R.sigmoid(yd)), 1 / 255, 0)
    mod = _module([X.shape], body)
    part = bh.partition(mod)
    assert all(n["attrs"].get("activation", "none") == "none" for n in _region_nodes(part) if n["op"] == "conv2d")
    assert np.max(np.abs(run(build(part), [X]) - run(build(mod), [X]))) <= (1 / 255) * 1.001


def test_anchor_output_read_elsewhere_is_not_fused():
    """The conv's dequantized output is also a region output: the activation cannot replace it."""
    def body(g, x):
        yd = g.qdq(g.conv1x1(g.qdq(x, SX, ZX), W, SW, BIAS), 0.02, 128)
        return relax.Tuple([yd, g.qdq(g.bb.emit(R.sigmoid(yd)), 1 / 255, 0)])
    mod = _module([X.shape], body)
    part = bh.partition(mod)
    assert all(n["attrs"].get("activation", "none") == "none" for n in _region_nodes(part) if n["op"] == "conv2d")
    got, want = run(build(part), [X]), run(build(mod), [X])
    for a, b in zip(got, want):
        assert np.max(np.abs(a - b)) <= 0.02 * 1.001


def _binary_case(op: str, b_shape, types):
    a_t, b_t, y_t = types
    za = 128 if a_t == "uint8" else -3
    zb = 100 if b_t == "uint8" else 5
    zy = 60 if y_t == "uint8" else 0

    def body(g, a, b):
        ad, bd = g.qdq(a, 0.03, za, a_t), g.qdq(b, 0.02, zb, b_t)
        return g.qdq(g.bb.emit(getattr(R, op)(ad, bd)), 0.04, zy, y_t)
    return _module([(1, 24, 5, 7), b_shape], body), 0.04


@pytest.mark.parametrize("op,b_shape,types", [
    ("multiply", (1, 24, 1, 1), ("uint8", "uint8", "uint8")),
    ("multiply", (24, 1, 1), ("int8", "uint8", "int8")),
    ("add", (1, 24, 5, 7), ("uint8", "int8", "uint8")),
    ("multiply", (1,), ("uint8", "int8", "int8")),
    ("add", (7,), ("int8", "int8", "uint8"))])
def test_quantized_binary_equals_the_float_emulation(op, b_shape, types):
    """dequantize, dequantize -> add | multiply -> quantize (per-tensor, 8-bit): one
    quantized_binary node over the 8-bit operands (b: a's shape, per channel, one value, or the last
    axis), u8 / s8 in any mix; within one output step of the float emulation, almost all exact."""
    mod, step = _binary_case(op, b_shape, types)
    part = bh.partition(mod, require_heavy_op=False)
    nodes = _region_nodes(part)
    # same-shape operands quantized on the host and an output only dequantized: one elementwise_chain
    # node does it in one pass (int8_binary._inside_float_chain, also a one-element b); a broadcast is
    # quantized_binary's
    fused = "elementwise_chain" if b_shape in ((1, 24, 5, 7), (1,)) else "quantized_binary"
    assert [n["op"] for n in nodes if n["op"] in ("binary", "quantized_binary", "elementwise_chain")] == [fused], nodes
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((1, 24, 5, 7)).astype(F32) * 2, rng.standard_normal(b_shape).astype(F32) * 2
    got, want = run(build(part), [a, b]), run(build(mod), [a, b])
    assert np.max(np.abs(got - want)) <= step * 1.001
    assert np.mean(got == want) > 0.99


def test_quantized_binary_reads_an_int8_conv_output_in_its_layout():
    """A squeeze-excitation multiply of an int8 conv's output (oneDNN's channels-last layout) by a
    per-channel 8-bit gate: quantized_binary reads the conv's layout (no reorder step between
    them) and matches the float emulation within one step."""
    def body(g, x, gate):
        yd = g.qdq(g.conv1x1(g.qdq(x, SX, ZX), W, SW, BIAS), 0.02, 128)
        return g.qdq(g.bb.emit(R.multiply(yd, g.qdq(gate, 1 / 255, 0))), 0.02, 128)
    mod = _module([X.shape, (1, 16, 1, 1)], body)
    part = bh.partition(mod)
    gate = np.random.default_rng(6).uniform(0, 1, (1, 16, 1, 1)).astype(F32)
    assert np.max(np.abs(run(build(part), [X, gate]) - run(build(mod), [X, gate]))) <= 0.02 * 1.001
    import tvm
    ex = build(part)
    region = bh.codegen.region_modules(ex)[0]
    region["set_profiling"](True)
    relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(X), tvm.runtime.tensor(gate))
    steps = [s for s in json.loads(region["get_profile"]()) if s["phase"] == "run"]
    mul = next(s for s in steps if s["op"] == "quantized_binary")
    assert ":acdb" in mul["layouts"], mul
    conv = max(i for i, s in enumerate(steps) if s["op"] == "conv2d")
    assert all(s["op"] for s in steps[conv + 1: steps.index(mul)]), steps  # no reorder in between


def test_binary_with_a_per_channel_operand_stays_float():
    """A per-channel dequantized operand is not per-tensor: the add stays a float32 binary between
    its own Q/DQ nodes, within one step of the float emulation."""
    def body(g, a, b):
        scales = np.linspace(0.01, 0.05, 24).astype(F32)
        bq = g.bb.emit(R.quantize(b, relax.const(scales), relax.const(np.zeros(24, "int8")), axis=1, out_dtype="int8"))
        bd = g.bb.emit(R.dequantize(bq, relax.const(scales), relax.const(np.zeros(24, "int8")), axis=1, out_dtype=F32))
        return g.qdq(g.bb.emit(R.add(g.qdq(a, 0.03, 128), bd)), 0.04, 60)
    shapes = [(1, 24, 5, 7), (1, 24, 5, 7)]
    _left_alone(_module(shapes, body), "quantized_binary", shapes, 0.04, seed=5)


@pytest.mark.parametrize("dtype,zero", [("uint8", 128), ("int8", -10)])
@pytest.mark.parametrize("chain", ["hardswish", "silu_clipped_gate", "gelu"])
def test_lookup_table_equals_the_float_emulation(dtype, zero, chain):
    """An element-wise chain from one 8-bit tensor that no post-op takes (here a region input's
    quantize; u8 / s8): one lookup node of 256 entries, computed with every rounding and
    saturation of the chain; within one output step of the float emulation, almost all exact."""
    def body(g, x):
        xd = g.qdq(x, 0.05, zero, dtype)
        if chain == "hardswish":
            y = g.bb.emit(R.multiply(xd, g.bb.emit(R.clip(g.bb.emit(R.add(g.bb.emit(R.multiply(xd, _c(1 / 6, F32))),
                                                                               _c(0.5, F32))), 0, 1))))
        elif chain == "gelu":
            y = g.bb.emit(R.nn.gelu(xd))
        else:
            y = g.bb.emit(R.multiply(xd, g.qdq(g.bb.emit(R.sigmoid(xd)), 0.6 / 255, 0)))
        return g.qdq(y, 0.03, 5 if dtype == "int8" else 40, dtype)
    mod = _module([(1, 8, 9, 11)], body)
    part = bh.partition(mod, require_heavy_op=False)
    nodes = _region_nodes(part)
    assert [n["op"] for n in nodes if n["op"] not in ("quantize", "dequantize")] == ["lookup"], nodes
    x = np.random.default_rng(7).standard_normal((1, 8, 9, 11)).astype(F32) * 4
    got, want = run(build(part), [x]), run(build(mod), [x])
    assert np.max(np.abs(got - want)) <= 0.03 * 1.001
    assert np.mean(got == want) > 0.99


def test_lookup_leaves_a_chain_with_two_sources():
    """x * sigmoid(y) of two 8-bit tensors is no function of one byte: no lookup node."""
    def body(g, x, y):
        return g.qdq(g.bb.emit(R.multiply(g.qdq(x, 0.05, 128), g.bb.emit(R.sigmoid(g.qdq(y, 0.05, 128))))), 0.03, 100)
    shapes = [(1, 4, 5, 5), (1, 4, 5, 5)]
    _left_alone(_module(shapes, body), "lookup", shapes, 0.03, seed=8)
