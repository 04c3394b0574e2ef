"""int8 transformers: element-wise float32 ops between Q/DQ steps as one ``elementwise_chain`` node.

References: numpy computing ONNX's QuantizeLinear / DequantizeLinear formulas (round half to even,
saturation) and the float32 ops in the same order, the llvm-only build of the same module (TVM's
float emulation), and ONNX Runtime on a ``quantize_static`` file. The chain computes the same ops in
the same order, so it matches the numpy reference bit for bit (erf: within its 2e-7 absolute error,
which may move a value across a rounding boundary: at most one quantization step).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.timing import build, run
from conftest import graph

R = relax.op


def _c(v, dtype="float32"):
    return relax.const(np.array(v, dtype))


def _ops(part) -> list[str]:
    return [n["op"] for m in part.attrs["external_mods"] for n in json.loads(str(m["get_graph_json"]()))["nodes"]]


def _chains(part) -> list[dict]:
    return [n for m in part.attrs["external_mods"] for n in json.loads(str(m["get_graph_json"]()))["nodes"]
            if n["op"] == "elementwise_chain"]


def _q(x, s, z, dtype):
    info = np.iinfo(dtype)
    return np.clip(np.rint(x / np.float32(s)) + z, info.min, info.max).astype(dtype)


def _dq(q, s, z):
    return (q.astype(np.float32) - np.float32(z)) * np.float32(s)


def _qdq(x, s, z, dtype):
    return _dq(_q(x, s, z, dtype), s, z)


def _erf(x):
    from math import erf
    return np.vectorize(erf, otypes=[np.float64])(x).astype(np.float32)


# (scale, zero point) of each rounding step of the GELU chain below, as quantize_static writes it
_X, _DIV, _ERF, _ADD, _MUL, _OUT = (0.031, 131), (0.022, 128), (0.0078, 127), (0.0079, 1), (0.04, 9), (0.02, 5)


def _gelu_body(out_dtype: str, half_from: str):
    """x (float32) -> quantize -> dequantize -> div sqrt2 -> QDQ -> erf -> QDQ -> add 1 -> QDQ ->
    mul x -> QDQ -> mul 0.5 -> quantize [-> dequantize]: GELU as quantize_static writes it."""
    def body(emit, x):
        def qdq(v, sz, dtype="uint8"):
            s, z = _c(sz[0]), _c(sz[1], dtype)
            return emit(R.dequantize(emit(R.quantize(v, s, z, out_dtype=dtype)), s, z))

        xd = qdq(x, _X)
        a = qdq(emit(R.divide(xd, _c(1.4142135))), _DIV)
        e = qdq(emit(R.erf(a)), _ERF, "int8")
        p = qdq(emit(R.add(e, _c(1.0))), _ADD)
        m = qdq(emit(R.multiply(xd, p)), _MUL)
        # quantize_static quantizes the 0.5 too: an initializer as dequantize(127) with scale 0.5 / 127,
        # a Constant node's value as a quantize -> dequantize round trip of it
        if half_from == "dequantize":
            half = emit(R.dequantize(_c(127, "uint8"), _c(0.5 / 127), _c(0, "uint8")))
        elif half_from == "round_trip":
            half = qdq(_c(0.5), (0.5 / 127, 0))
        else:
            half = _c(0.5)
        y = emit(R.multiply(m, half))
        s, z = _c(_OUT[0]), _c(_OUT[1], "uint8")
        yq = emit(R.quantize(y, s, z, out_dtype="uint8"))
        return emit(R.dequantize(yq, s, z)) if out_dtype == "float32" else yq
    return body


def _gelu_reference(x, half):
    xd = _qdq(x, *_X, np.uint8)
    a = _qdq(xd / np.float32(1.4142135), *_DIV, np.uint8)
    e = _qdq(_erf(a), *_ERF, np.int8)
    p = _qdq(e + np.float32(1.0), *_ADD, np.uint8)
    m = _qdq(xd * p, *_MUL, np.uint8)
    return _q(m * np.float32(half), *_OUT, np.uint8)


@pytest.mark.parametrize("half_from", ["const", "dequantize", "round_trip"])
def test_quantized_gelu_is_one_chain_equal_to_numpy(half_from):
    """The whole GELU (12 nodes, its input x round-tripped first) is one elementwise_chain node, with its
    constants as immediates (also the dequantized 0.5); its 8-bit output is within one step of
    numpy's ONNX formulas (erf's rounding) and almost all equal, and equals the llvm build the same way."""
    shape = (2, 7, 300)  # not a multiple of the kernel's block: the tail runs too
    mod = graph({"x": shape}, _gelu_body("uint8", half_from))
    part = bh.partition(mod, require_heavy_op=False)
    ops = _ops(part)
    assert ops.count("elementwise_chain") == 1 and "unary" not in ops and "binary" not in ops, ops
    chain = _chains(part)[0]
    assert chain["attrs"]["ops"].count("requantize") == 5 and "out_scale" in chain["attrs"], chain
    x = (np.random.default_rng(3).standard_normal(shape) * 2.5).astype(np.float32)
    got = run(build(part), [x])
    half = np.float32(127 - 0) * np.float32(0.5 / 127) if half_from != "const" else 0.5
    want = _gelu_reference(x, half)
    assert got.dtype == np.uint8
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1 and np.mean(diff == 0) > 0.99
    emulated = run(build(mod), [x])
    assert np.abs(got.astype(np.int32) - emulated.astype(np.int32)).max() <= 1


def test_residual_add_chain_float_output_is_exact():
    """dequantize(a) + dequantize(b) -> QDQ (a residual add before a layer norm) -> a float32 reader:
    one chain of both inputs' round trips, the add and its round trip; the layer norm reads its
    float32 output, equal to numpy's."""
    sa, za, sb, zb, so, zo = 0.013, 120, 0.021, 3, 0.027, 130

    def body(emit, x, r):
        def q(v, s, z):
            return emit(R.quantize(v, _c(s), _c(z, "uint8"), out_dtype="uint8"))

        a = emit(R.dequantize(q(x, sa, za), _c(sa), _c(za, "uint8")))
        b = emit(R.dequantize(q(r, sb, zb), _c(sb), _c(zb, "uint8")))
        s = emit(R.dequantize(q(emit(R.add(a, b)), so, zo), _c(so), _c(zo, "uint8")))
        return emit(R.nn.layer_norm(s, _c(np.ones(64)), _c(np.zeros(64)), axes=[-1]))

    mod = graph({"x": (3, 10, 64), "r": (3, 10, 64)}, body)
    part = bh.partition(mod, require_heavy_op=False)
    chains = _chains(part)
    assert len(chains) == 1 and len(chains[0]["inputs"]) == 2, _ops(part)
    assert chains[0]["attrs"]["ops"].count("requantize") == 3, chains
    rng = np.random.default_rng(5)
    x, r = (rng.standard_normal((3, 10, 64)) * 1.5).astype(np.float32), rng.standard_normal((3, 10, 64)).astype(np.float32)
    got = run(build(part), [x, r])
    s = _qdq(_dq(_q(x, sa, za, np.uint8), sa, za) + _dq(_q(r, sb, zb, np.uint8), sb, zb), so, zo, np.uint8)
    mean, var = s.mean(-1, keepdims=True), s.var(-1, keepdims=True)
    np.testing.assert_allclose(got, (s - mean) / np.sqrt(var + 1e-5), atol=2e-5)


def test_broadcast_operand_and_shared_value_stay_separate_and_correct():
    """A must-not-fuse case: an add of an operand broadcast along a middle axis ([2, 1, 8] over
    [2, 8, 8]: not a whole repeat) is no chain member, and a value read outside the chain (a region
    output too) keeps its own node; the result equals the llvm build."""
    def body(emit, x, m):
        s, z = _c(0.05), _c(128, "uint8")
        xd = emit(R.dequantize(emit(R.quantize(x, s, z, out_dtype="uint8")), s, z))
        y = emit(R.add(xd, m))  # broadcast operand: not a chain member
        t = emit(R.multiply(xd, _c(3.0)))
        return relax.Tuple([y, t, emit(R.multiply(t, xd))])

    from tvm import relax as rx

    bb = rx.BlockBuilder()
    x, m = rx.Var("x", rx.TensorType((2, 8, 8), "float32")), rx.Var("m", rx.TensorType((2, 1, 8), "float32"))
    with bb.function("main", [x, m]):
        with bb.dataflow():
            out = bb.emit_output(body(bb.emit, x, m))
        bb.emit_func_output(out)
    mod = bb.get()
    part = bh.partition(mod, require_heavy_op=False)
    for chain in _chains(part):
        assert chain["attrs"]["ops"].count("add") == 0, chain
    rng = np.random.default_rng(2)
    xs, ms = rng.standard_normal((2, 8, 8)).astype(np.float32), rng.standard_normal((2, 1, 8)).astype(np.float32)
    got, want = run(build(part), [xs, ms]), run(build(mod), [xs, ms])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seq", [5, 32])  # 5: blocks wrap around the mask; 32: they do not
def test_attention_mask_add_joins_the_scores_chain_exactly(seq):
    """The scores' QDQ -> multiply by the scale -> QDQ -> add of a [1, 1, S, S] mask -> QDQ (BERT's
    attention as quantize_static writes it): one chain reading the mask modulo its size, equal to
    numpy bit for bit."""
    heads, (s1, z1), (s2, z2), (s3, z3) = 3, (0.05, 120), (0.01, 130), (0.2, 250)

    def body(emit, x, m):
        def qdq(v, s, z):
            return emit(R.dequantize(emit(R.quantize(v, _c(s), _c(z, "uint8"), out_dtype="uint8")), _c(s),
                                     _c(z, "uint8")))

        a = qdq(emit(R.multiply(qdq(x, s1, z1), _c(0.125))), s2, z2)
        return emit(R.nn.softmax(qdq(emit(R.add(a, m)), s3, z3), axis=-1))

    mod = graph({"x": (1, heads, seq, seq), "m": (1, 1, seq, seq)}, body)
    part = bh.partition(mod, require_heavy_op=False)
    chains = _chains(part)
    assert len(chains) == 1 and "add" in chains[0]["attrs"]["ops"].split(","), _ops(part)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((1, heads, seq, seq)) * 3).astype(np.float32)
    m = np.where(rng.random((1, 1, seq, seq)) < 0.3, np.float32(-3.4e38), np.float32(0)).astype(np.float32)
    got = run(build(part), [x, m])
    scores = _qdq(_qdq(_qdq(x, s1, z1, np.uint8) * np.float32(0.125), s2, z2, np.uint8) + m, s3, z3, np.uint8)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def quantize_static_file(g, tmp_path, shape: tuple) -> str:
    """Save ONNX graph ``g`` (one float32 input ``x`` of ``shape``) and quantize it as
    ``bench/int8.py`` does (quantize_static, QDQ, per-channel s8 weights, u8 activations, 4 seeded
    calibration inputs); the QDQ file's path."""
    import onnx
    import onnxruntime.quantization as quant
    from onnx import helper

    src, dst = str(tmp_path / "f32.onnx"), str(tmp_path / "qdq.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)

    class Reader(quant.CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": np.random.default_rng(i).standard_normal(shape).astype(np.float32)}
                            for i in range(4)])

        def get_next(self):
            return next(self.it, None)

    quant.quantize_static(src, dst, Reader(), quant_format=quant.QuantFormat.QDQ, per_channel=True,
                          activation_type=quant.QuantType.QUInt8, weight_type=quant.QuantType.QInt8)
    return dst


def gelu_mlp_graph(seed: int, reshapes: bool = False):
    """ONNX graph x [1, 6, 16] -> MatMul [16, 32] -> GELU (Div, Erf, Add, Mul, Mul) -> MatMul [32, 8];
    with ``reshapes`` the MatMuls run 2-D between Reshapes, as a 3-D model's dense layers export."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    consts = {"w1": (rng.standard_normal((16, 32)) * 0.3).astype(np.float32),
              "w2": (rng.standard_normal((32, 8)) * 0.3).astype(np.float32),
              "sq": np.array(1.4142135, np.float32), "one": np.array(1.0, np.float32),
              "half": np.array(0.5, np.float32)}
    node = helper.make_node
    if reshapes:
        consts.update({"s2d": np.array([6, 16], np.int64), "h2d": np.array([6, 32], np.int64),
                       "h3d": np.array([1, 6, 32], np.int64), "y3d": np.array([1, 6, 8], np.int64)})
        first = [node("Reshape", ["x", "s2d"], ["x2"]), node("MatMul", ["x2", "w1"], ["h2"]),
                 node("Reshape", ["h2", "h3d"], ["h"])]
        last = [node("Reshape", ["g", "h2d"], ["g2"]), node("MatMul", ["g2", "w2"], ["y2"]),
                node("Reshape", ["y2", "y3d"], ["y"])]
    else:
        first, last = [node("MatMul", ["x", "w1"], ["h"])], [node("MatMul", ["g", "w2"], ["y"])]
    gelu = [node("Div", ["h", "sq"], ["d"]), node("Erf", ["d"], ["e"]), node("Add", ["e", "one"], ["p"]),
            node("Mul", ["h", "p"], ["m"]), node("Mul", ["m", "half"], ["g"])]
    return helper.make_graph(first + gelu + last, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 16])],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 8])],
                             [numpy_helper.from_array(v, k) for k, v in consts.items()])


def test_chain_of_a_quantize_static_gelu_matches_onnxruntime(tmp_path):
    """A Linear -> GELU (erf) -> Linear model quantized with quantize_static: the GELU's Div, Erf,
    Add, Mul, Mul are one chain, and the result is within one output step of ONNX Runtime."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxruntime.quantization")
    import onnx
    from onnx import numpy_helper

    g = gelu_mlp_graph(11)
    dst = quantize_static_file(g, tmp_path, (1, 6, 16))
    mod, params = bh.from_onnx(dst)
    part = bh.partition(mod, params)
    ops = _ops(part)
    assert "unary" not in ops and "binary" not in ops and ops.count("elementwise_chain") >= 1, ops
    x = np.random.default_rng(9).standard_normal((1, 6, 16)).astype(np.float32)
    got = run(build(part), [x])
    want = ort.InferenceSession(dst, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    m = onnx.load(dst)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    last = next(n for n in m.graph.node if "y" in n.output)
    step = float(inits[last.input[1]].max())
    # the same QDQ semantics computed by TVM's llvm-only build: exact on every CPU
    ref = run(build(bh.bind_params(mod, params)), [x])
    assert np.max(np.abs(got - ref)) <= 2 * step * 1.001  # the dense's fused rounding: as test_int8's bias add
    from byoc_hetero.backends.onednn.precision import int8_kernels_reason

    if int8_kernels_reason() is None:
        # below VNNI ONNX Runtime's own u8 x s8 kernels saturate (7 steps off the llvm build on a Skylake-SP
        # while ours equals it): it is the reference only where int8 arithmetic is exact
        assert np.max(np.abs(got - want)) <= 2 * step * 1.001
