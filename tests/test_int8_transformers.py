"""int8 transformers: reshapes moved to the 8-bit side of per-tensor Q/DQ (region pass
``move_views_to_8bit``) and element-wise chains that are a function of one byte run as a 256-entry
table (cpp/kernels/elementwise_chain.cc).

References: numpy computing ONNX's QuantizeLinear / DequantizeLinear formulas (round half to even,
saturation) and the float32 ops in the same order, for every one of the 256 input bytes; the
llvm-only build of the same module; ONNX Runtime on a ``quantize_static`` file with the reshapes a
2-D dense puts around GELU.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.backends.onednn.lowering import Node, RegionGraph
from byoc_hetero.backends.onednn.ops.qdq_views import move_views_to_8bit
from byoc_hetero.backends.onednn.ops.qdq_share import share_repeated_quantizations
from byoc_hetero.timing import build, run
from conftest import graph, needs_int8_kernels
from test_int8_chains import gelu_mlp_graph, quantize_static_file

R = relax.op


def _c(v, dtype="float32"):
    return relax.const(np.array(v, dtype))


def _nodes(part) -> list[tuple[dict, dict]]:
    """(node, tensors) of every region node."""
    out = []
    for m in part.attrs["external_mods"]:
        g = json.loads(str(m["get_graph_json"]()))
        out += [(n, g["tensors"]) for n in g["nodes"]]
    return out


def _q(x, s, z, dtype):
    info = np.iinfo(dtype)
    return np.clip(np.rint(x / np.float32(s)) + z, info.min, info.max).astype(dtype)


def _dq(q, s, z):
    return (q.astype(np.float32) - np.float32(z)) * np.float32(s)


# (scale, zero point) of: the input, the div's round trip, the output
_X, _MID, _OUT = (0.031, 3), (0.017, -5), (0.023, 7)


def _one_byte_body(in_dtype: str, out_dtype: str, with_erf: bool):
    """q (8-bit) -> dequantize -> reshape -> div 1.5 -> QDQ -> [erf | add 0.25] -> mul by the
    dequantized input -> reshape back -> quantize: one byte in, one byte out, reshapes around."""
    def body(emit, q):
        x = emit(R.dequantize(q, _c(_X[0]), _c(_X[1], in_dtype), out_dtype="float32"))
        shape = [2, 256]  # the tests' input
        flat = emit(R.reshape(x, (512,)))
        d = emit(R.divide(flat, _c(1.5)))
        dq = emit(R.dequantize(emit(R.quantize(d, _c(_MID[0]), _c(_MID[1], "int8"), out_dtype="int8")),
                               _c(_MID[0]), _c(_MID[1], "int8")))
        e = emit(R.erf(dq)) if with_erf else emit(R.add(dq, _c(0.25)))
        m = emit(R.multiply(e, flat))
        back = emit(R.reshape(m, shape))
        return emit(R.quantize(back, _c(_OUT[0]), _c(_OUT[1], out_dtype), out_dtype=out_dtype))
    return body


def _one_byte_reference(q, out_dtype: str, with_erf: bool):
    from math import erf

    x = _dq(q, *_X)
    mid = _dq(_q(x / np.float32(1.5), *_MID, np.int8), *_MID)
    e = np.vectorize(erf, otypes=[np.float64])(mid).astype(np.float32) if with_erf else mid + np.float32(0.25)
    return _q(e * x, *_OUT, out_dtype)


@pytest.mark.parametrize("in_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("out_dtype", ["uint8", "int8"])
@pytest.mark.parametrize("with_erf", [False, True])
def test_one_byte_chain_is_a_table_equal_to_numpy_for_every_byte(in_dtype, out_dtype, with_erf):
    """Every one of the 256 input bytes: the chain between the reshapes reads and writes the 8-bit
    tensors (the reshapes moved), runs as a table, and equals numpy's ONNX formulas exactly (with
    erf: within one step, its polynomial's rounding, and almost everywhere equal) and the llvm build."""
    info = np.iinfo(in_dtype)
    values = np.arange(info.min, info.max + 1).astype(in_dtype)
    q = np.stack([values, values[::-1]])  # [2, 256]: the whole byte range, both orders
    mod = graph({"q": q.shape}, _one_byte_body(in_dtype, out_dtype, with_erf), dtype=in_dtype)
    part = bh.partition(mod, require_heavy_op=False)
    chains = [(n, t) for n, t in _nodes(part) if n["op"] == "elementwise_chain"]
    assert len(chains) == 1, [n["op"] for n, _ in _nodes(part)]
    node, tensors = chains[0]
    assert [tensors[i]["dtype"] for i in node["inputs"]] == [in_dtype], node
    assert tensors[node["output"]]["dtype"] == out_dtype
    assert not any(n["op"] in ("dequantize", "quantize") for n, _ in _nodes(part)), "a Q/DQ step outside the chain"
    ex = build(part)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    regions = bh.codegen.region_modules(ex)
    for m in regions:
        m["set_profiling"](True)
    got = vm["main"](tvm.runtime.tensor(q)).numpy()
    labels = [s["label"] for m in regions for s in json.loads(str(m["get_profile"]())) if s["op"] == "elementwise_chain"]
    assert labels and all("256-entry table" in label for label in labels), labels
    want = _one_byte_reference(q, out_dtype, with_erf)
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    if with_erf:
        assert diff.max() <= 1 and np.mean(diff == 0) > 0.98, diff.max()
    else:
        assert diff.max() == 0, np.argwhere(diff)
    emulated = run(build(mod), [q])
    assert np.abs(got.astype(np.int32) - emulated.astype(np.int32)).max() <= 1


def _region_graph(per_axis: bool = False) -> RegionGraph:
    """u8 [2, 3] -> dequantize -> reshape [6] -> add -> reshape [2, 3] -> quantize: the region graph
    the pass sees (tensor 1: the scale, 2: the zero point)."""
    g = RegionGraph("t")
    for shape, dtype in (([2, 3], "uint8"), ([2] if per_axis else [], "float32"), ([], "uint8"),
                         ([2, 3], "float32"), ([6], "float32"), ([6], "float32"), ([2, 3], "float32"),
                         ([2, 3], "uint8")):
        g.tensors.append({"shape": shape, "dtype": dtype})
    g.inputs, g.outputs = [0], [7]
    g.small_constants = {1: np.array([0.1, 0.2] if per_axis else 0.1, np.float32), 2: np.array(3, np.uint8)}
    g.nodes = [Node("dequantize", [0, 1, 2], 3, {"axis": 0}), Node("reshape", [3], 4, {}),
               Node("binary", [4, 4], 5, {"algorithm": "add"}), Node("reshape", [5], 6, {}),
               Node("quantize", [6, 1, 2], 7, {"axis": 0})]
    return g


def test_reshapes_move_to_the_8bit_side():
    g = _region_graph()
    move_views_to_8bit(g)
    ops = [(n.op, [g.tensors[t]["dtype"] for t in n.inputs[:1]], g.tensors[n.output]["dtype"]) for n in g.nodes]
    assert ops == [("reshape", ["uint8"], "uint8"), ("dequantize", ["uint8"], "float32"),
                   ("binary", ["float32"], "float32"), ("quantize", ["float32"], "uint8"),
                   ("reshape", ["uint8"], "uint8")], ops
    assert g.nodes[-1].output == 7 and g.tensors[g.nodes[1].output]["shape"] == [6]
    assert g.tensors[g.nodes[0].output]["shape"] == [6] and g.tensors[g.nodes[3].output]["shape"] == [6]


def test_reshapes_stay_where_moving_them_would_change_a_value():
    """A per-axis scale (a reshape moves the axis) and a dequantized value another node also reads
    keep the graph as it was."""
    g = _region_graph(per_axis=True)
    before = [(n.op, list(n.inputs), n.output) for n in g.nodes]
    move_views_to_8bit(g)
    assert [(n.op, list(n.inputs), n.output) for n in g.nodes] == before
    g = _region_graph()
    g.nodes.insert(2, Node("binary", [3, 3], 8, {"algorithm": "mul"}))  # the dequantized value read twice
    g.tensors.append({"shape": [2, 3], "dtype": "float32"})
    g.outputs.append(8)
    move_views_to_8bit(g)
    assert [n.op for n in g.nodes][:2] == ["dequantize", "reshape"]


def test_equal_quantizations_of_one_tensor_are_computed_once():
    """Three quantize -> reshape pairs of one tensor with one scale (quantize_static's Q, K and V
    inputs) become one pair read by the three readers; one with another zero point stays."""
    g = RegionGraph("t")
    g.tensors = [{"shape": [1, 4, 8], "dtype": "float32"}, {"shape": [], "dtype": "float32"},
                 {"shape": [], "dtype": "uint8"}, {"shape": [], "dtype": "uint8"}]
    g.inputs = [0]
    for zero in (2, 2, 2, 3):
        q = len(g.tensors)
        g.tensors += [{"shape": [1, 4, 8], "dtype": "uint8"}, {"shape": [4, 8], "dtype": "uint8"},
                      {"shape": [4, 8], "dtype": "float32"}]
        g.nodes += [Node("quantize", [0, 1, zero], q, {"axis": 1}), Node("reshape", [q], q + 1, {}),
                    Node("dequantize", [q + 1, 1, zero], q + 2, {"axis": 1})]
        g.outputs.append(q + 2)
    share_repeated_quantizations(g)
    assert [n.op for n in g.nodes].count("quantize") == 2 and [n.op for n in g.nodes].count("reshape") == 2
    assert len(g.nodes) == 8  # the region outputs' dequantizes keep their own nodes
    readers = {n.output: n.inputs[0] for n in g.nodes if n.op == "dequantize"}
    assert len({readers[t] for t in g.outputs[:3]}) == 1 and readers[g.outputs[3]] != readers[g.outputs[0]]


def test_reshape_that_changes_the_dtype_is_refused_by_the_runtime():
    g = _region_graph()
    g.nodes = [Node("reshape", [0], 4, {})]  # uint8 [2, 3] -> float32 [6]
    g.outputs = [4]
    with pytest.raises(ValueError, match="a reshape keeps the dtype"):
        tvm.get_global_func("byoc_hetero.runtime.create")(g.to_json())


@needs_int8_kernels
def test_gelu_between_2d_dense_layers_matches_onnxruntime(tmp_path):
    """A 2-D Linear -> GELU (erf) -> 2-D Linear with the reshapes a 3-D model puts around its dense
    layers, quantized with quantize_static: GELU is one 8-bit chain (a table), no separate
    dequantize / quantize step is left between the dense layers, and the result is within the last
    dense's fused rounding of ONNX Runtime."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxruntime.quantization")
    import onnx
    from onnx import numpy_helper

    g = gelu_mlp_graph(5, reshapes=True)
    dst = quantize_static_file(g, tmp_path, (1, 6, 16))
    mod, params = bh.from_onnx(dst)
    part = bh.partition(mod, params)
    nodes = _nodes(part)
    ops = [n["op"] for n, _ in nodes]
    dense = [i for i, op in enumerate(ops) if op == "dense"]
    assert len(dense) == 2 and "unary" not in ops and "binary" not in ops, ops
    between = ops[dense[0] + 1:dense[1]]
    assert "elementwise_chain" in between and not {"dequantize", "quantize", "quantize_dequantize"} & set(between), ops
    chain, tensors = next((n, t) for n, t in nodes if n["op"] == "elementwise_chain")
    assert tensors[chain["inputs"][0]]["dtype"] == "uint8" and tensors[chain["output"]]["dtype"] == "uint8"
    x = np.random.default_rng(9).standard_normal((1, 6, 16)).astype(np.float32)
    got = run(build(part), [x])
    want = ort.InferenceSession(dst, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    m = onnx.load(dst)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    last = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and "y" in n.output[0])
    step = float(inits[last.input[1]].max())
    assert np.max(np.abs(got - want)) <= 2 * step * 1.001  # the dense's fused rounding, as test_int8_chains


def _qdq_emit(emit, x, scale, zero, dtype):
    s, z = _c(scale), _c(zero, dtype)
    return emit(R.dequantize(emit(R.quantize(x, s, z, out_dtype=dtype)), s, z))


@needs_int8_kernels
@pytest.mark.parametrize("a_dtype,b_dtype", [("uint8", "uint8"), ("int8", "uint8"), ("uint8", "int8")])
@pytest.mark.parametrize("permuted", [False, True])
def test_matmul_of_dequantized_8bit_values_is_int8_and_exact(a_dtype, b_dtype, permuted):
    """Q.K^T as quantize_static writes it (both operands dequantized 8-bit activations, K through a
    permute): one int8 matmul reading the 8-bit tensors (a uint8 b shifted to int8), not oneDNN's
    reference implementation, equal to numpy's integer product scaled once within float32 rounding."""
    (sa, za), (sb, zb) = (0.021, 130 if a_dtype == "uint8" else -7), (0.017, 121 if b_dtype == "uint8" else 5)

    def body(emit, a, b):
        qa = _qdq_emit(emit, a, sa, za, a_dtype)
        qb = _qdq_emit(emit, b, sb, zb, b_dtype)
        if permuted:  # b arrives as [1, 2, 8, 16] (keys) and is read transposed
            qb = emit(R.permute_dims(qb, [0, 1, 3, 2]))
        return emit(R.matmul(qa, qb))

    rng = np.random.default_rng(2)
    a = (rng.standard_normal((1, 2, 8, 16)) * 1.5).astype(np.float32)
    b = (rng.standard_normal((1, 2, 8, 16) if permuted else (1, 2, 16, 8)) * 1.5).astype(np.float32)
    mod = graph({"a": a.shape, "b": b.shape}, body)
    part = bh.partition(mod, require_heavy_op=False)
    matmuls = [(n, t) for n, t in _nodes(part) if n["op"] == "matmul"]
    assert len(matmuls) == 1 and "a_scale" in matmuls[0][0]["attrs"], [n for n, _ in _nodes(part)]
    node, tensors = matmuls[0]
    assert [tensors[i]["dtype"] for i in node["inputs"]] == [a_dtype, b_dtype]
    ex = build(part)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    regions = bh.codegen.region_modules(ex)
    for m in regions:
        m["set_profiling"](True)
    got = vm["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b)).numpy()
    impls = [s["impl"] for m in regions for s in json.loads(str(m["get_profile"]())) if s["op"] == "matmul"]
    assert impls and not any(i.startswith("ref") for i in impls), impls
    qa = _q(a, sa, za, a_dtype).astype(np.int64) - za
    qb = _q(b, sb, zb, b_dtype).astype(np.int64) - zb
    if permuted:
        qb = qb.transpose(0, 1, 3, 2)
    want = (qa @ qb).astype(np.float64) * (np.float32(sa) * np.float64(np.float32(sb)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    np.testing.assert_allclose(got, run(build(mod), [a, b]), rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_int8_matmul_attrs_on_float_operands_are_refused():
    """A matmul node with int8 attrs over float32 operands, or 8-bit operands with a bias: the runtime
    names what it expected."""
    g = RegionGraph("t")
    g.tensors = [{"shape": [2, 3], "dtype": "float32"}, {"shape": [3, 4], "dtype": "float32"},
                 {"shape": [2, 4], "dtype": "float32"}]
    g.inputs, g.outputs = [0, 1], [2]
    g.nodes = [Node("matmul", [0, 1], 2, {"a_scale": 0.1, "a_zero_point": 0, "b_scale": 0.1, "b_zero_point": 0})]
    with pytest.raises(ValueError, match="needs 8-bit a and b"):
        tvm.get_global_func("byoc_hetero.runtime.create")(g.to_json())
    g.tensors[0]["dtype"] = g.tensors[1]["dtype"] = "uint8"
    g.nodes[0].attrs["a_zero_point"] = 300
    with pytest.raises(ValueError, match="zero point 300 is outside uint8"):
        tvm.get_global_func("byoc_hetero.runtime.create")(g.to_json())
