"""Transformers and LLM decoders (issue 25): import robustness, GQA's repeat_kv, the default ONNX
exporter's isnan-guarded softmax, and a Llama-family decoder with a dynamic sequence length.

References: torch eager (the models), ONNX Runtime (hand-written ONNX graphs), numpy, and TVM's
llvm-only build of the same module.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import byoc_hetero as bh

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

TOLERANCE = 1e-4


def _run(mod, *arrays: np.ndarray) -> np.ndarray:
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return (out if hasattr(out, "numpy") else out[0]).numpy()


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype("float64") - want)) / np.max(np.abs(want)))


def _ops_left(part) -> list[str]:
    return [entry.op for entry in bh.report(part).fallbacks]


# ----------------------------------------------------------------------------------------------
# item 3: a bool cumsum (and max / min of bool) builds
# ----------------------------------------------------------------------------------------------
class PackedSequenceIds(torch.nn.Module):
    """transformers' find_packed_sequence_indices: (diff(position_ids) != 1).cumsum(-1)."""

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        first = positions[:, :1] - 1
        diff = torch.diff(positions, prepend=first, dim=-1)
        return (diff != 1).cumsum(-1)


@pytest.mark.parametrize("partition", [False, True])
def test_bool_cumsum_builds_and_counts_as_torch(partition):
    """The importer typed a bool cumsum bool (wrong, and llvm could not build it); now int64, as torch."""
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 4]])
    want = PackedSequenceIds()(positions).numpy()
    assert want.dtype == np.int64 and want.max() == 2
    mod, params = bh.from_torch(PackedSequenceIds(), (positions,))
    if partition:
        mod = bh.partition(mod, params)
    got = _run(mod, positions.numpy())
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["max", "min"])
def test_bool_max_min_reduction_builds(op):
    """max / min over bool (TVM: "Cannot decide min_value for type bool") as int8 arithmetic."""
    from tvm import relax

    from byoc_hetero.passes.bool_arith import bool_arith

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 5), "bool"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(getattr(relax.op, op)(x, axis=[1], keepdims=True))
        bb.emit_func_output(y)
    data = np.array([[1, 0, 0, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], dtype=bool)
    got = _run(bool_arith(bb.get()), data)
    want = data.any(axis=1, keepdims=True) if op == "max" else data.all(axis=1, keepdims=True)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------------------------
# item 3: ONNX shape initializers stay constants
# ----------------------------------------------------------------------------------------------
def _repeat_kv_onnx(seed: int = 0):
    """x [1, 4, 8] @ wk -> k [1, 1, 4, 6] expanded (int64 initializer) to [1, 3, 4, 6], reshaped
    (int64 initializer) to [3, 4, 6], then q @ k^T: GQA's repeat_kv as the default exporter writes it."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 6)).astype("float32"), "wk"),
             numpy_helper.from_array(rng.standard_normal((3, 4, 6)).astype("float32"), "q"),
             numpy_helper.from_array(np.array([1, 1, 4, 6], dtype=np.int64), "kshape"),
             numpy_helper.from_array(np.array([1, 3, 4, 6], dtype=np.int64), "expand_to"),
             numpy_helper.from_array(np.array([3, 4, 6], dtype=np.int64), "heads")]
    nodes = [helper.make_node("MatMul", ["x", "wk"], ["k0"]),
             helper.make_node("Reshape", ["k0", "kshape"], ["k1"]),
             helper.make_node("Expand", ["k1", "expand_to"], ["k2"]),
             helper.make_node("Reshape", ["k2", "heads"], ["k"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["y"])]
    graph = helper.make_graph(nodes, "repeat_kv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4, 4])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_shape_initializers_are_constants_and_the_model_is_one_region():
    """Expand's and Reshape's int64 shapes were parameters: TVM wrote match_cast and
    MergeCompositeFunctions raised "Invalid type: relax.expr.MatchCast". Now constants: static shapes,
    one region, ONNX Runtime's values; the float weights stay parameters."""
    ort = pytest.importorskip("onnxruntime")
    model = _repeat_kv_onnx()
    mod, params = bh.from_onnx(model)
    assert "match_cast" not in str(mod["main"]), mod["main"]
    assert set(params) == {"wk", "q"}
    part = bh.partition(mod, params)
    assert len(bh.report(part).regions) == 1 and not _ops_left(part), bh.report(part)
    x = np.random.default_rng(1).standard_normal((1, 4, 8)).astype("float32")
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _rel(_run(part, x), want) <= TOLERANCE


def test_shape_initializer_that_is_a_graph_input_stays_a_parameter():
    """An initializer also listed as a graph input is an overridable default: not frozen."""
    from onnx import TensorProto, helper

    from byoc_hetero.passes.shape_initializers_as_constants import shape_initializers_as_constants

    model = _repeat_kv_onnx()
    model.graph.input.append(helper.make_tensor_value_info("heads", TensorProto.INT64, [3]))
    converted = shape_initializers_as_constants(model)
    assert "heads" in {i.name for i in converted.graph.initializer}
    assert {"kshape", "expand_to"} <= {n.output[0] for n in converted.graph.node if n.op_type == "Constant"}
    assert model.graph.initializer[2].name == "kshape"  # the caller's model is untouched


# ----------------------------------------------------------------------------------------------
# item 2 (GQA, safe softmax): the attention is one region
# ----------------------------------------------------------------------------------------------
class GroupedQueryAttention(torch.nn.Module):
    """q of 6 heads, k / v of 2, repeat_kv as transformers writes it, sdpa with a causal mask."""

    def __init__(self, dim: int = 48, heads: int = 6, kv_heads: int = 2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim)

    def repeat_kv(self, t: torch.Tensor) -> torch.Tensor:
        b, kv, s, d = t.shape
        groups = self.heads // kv
        return t[:, :, None, :, :].expand(b, kv, groups, s, d).reshape(b, kv * groups, s, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, self.repeat_kv(k), self.repeat_kv(v), is_causal=True)
        return y.transpose(1, 2).reshape(b, s, -1)


@pytest.mark.parametrize("path", ["from_torch", "from_onnx"])
def test_grouped_query_attention_is_one_region(path, tmp_path):
    """repeat_kv's broadcast is read by the attention matmuls (pass matmul_repeated_heads: no copy,
    the K / V heads broadcast as a batch dim of the matmul) and the default exporter's
    where(isnan(softmax), 0, softmax) one softmax node: nothing of the attention left on llvm."""
    torch.manual_seed(0)
    model = GroupedQueryAttention().eval()
    x = torch.randn(1, 10, 48)
    with torch.no_grad():
        want = model(x).numpy()
    if path == "from_torch":
        mod, params = bh.from_torch(model, (x,))
    else:
        file = str(tmp_path / "gqa.onnx")
        torch.onnx.export(model, (x,), file, input_names=["x"], output_names=["y"])  # the default: dynamo
        mod, params = bh.from_onnx(file)
    part = bh.partition(mod, params)
    report = bh.report(part)
    assert len(report.regions) == 1, report
    assert not {"broadcast_to", "isnan", "where", "nn.softmax"} & set(_ops_left(part)), report
    nodes = _region_nodes(part)
    assert "broadcast_to" not in [n["op"] for n, _ in nodes], "repeat_kv is still a copy step"
    # both attention matmuls: query heads as [B, kv, groups, S, *], K / V as [B, kv, 1, *, *] (as the tensor's
    # shape, or as the strided view a_shape / b_shape of a tensor read where it lies: q in its [B, S, H, D] layout)
    matmuls = [(n.get("attrs", {}), shapes) for n, shapes in nodes if n["op"] == "matmul"]
    assert len(matmuls) == 2 and all((a.get("a_shape") or s[0])[:3] == [1, 2, 3] for a, s in matmuls), matmuls
    assert all((n.get("attrs", {}).get("b_shape") or s[1])[:3] == [1, 2, 1]
               for (n, s) in nodes if n["op"] == "matmul"), matmuls
    assert _rel(_run(part, x.numpy()), want) <= TOLERANCE


def _region_nodes(part) -> list[tuple[dict, list[list[int]]]]:
    """Each node of the partition's regions with its inputs' shapes (the region document)."""
    import json

    out = []
    for m in part.attrs["external_mods"]:
        graph = json.loads(str(m["get_graph_json"]()))
        shapes = [t["shape"] for t in graph["tensors"]]
        out += [(n, [shapes[i] for i in n["inputs"]]) for n in graph["nodes"]]
    return out


def _isnan_softmax_onnx():
    """scores = x @ w + mask; where(isnan(softmax(scores)), 0, softmax(scores)) @ v."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 5)).astype("float32"), "w"),
             numpy_helper.from_array(rng.standard_normal((5, 3)).astype("float32"), "v"),
             numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s0"]),
             helper.make_node("Add", ["s0", "mask"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["nan"]),
             helper.make_node("Where", ["nan", "zero", "p"], ["p0"]),
             helper.make_node("MatMul", ["p0", "v"], ["y"])]
    graph = helper.make_graph(nodes, "isnan_softmax",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8]),
                               helper.make_tensor_value_info("mask", TensorProto.FLOAT, [2, 4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


@pytest.mark.parametrize("poison", ["none", "masked_row", "nan", "plus_inf"])
def test_isnan_guarded_softmax_is_one_node_with_onnxruntimes_values(poison):
    """Rows all -inf, a NaN or a +inf input: the ONNX graph writes 0 where softmax is NaN; so does
    the region (softmax ``safe`` 2), and the result has no NaN where ONNX Runtime has none."""
    ort = pytest.importorskip("onnxruntime")
    from byoc_hetero._relax import region_graph_json

    model = _isnan_softmax_onnx()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 8)).astype("float32")
    mask = np.zeros((2, 4, 5), dtype="float32")
    mask[0, 1, 3:] = -np.inf  # a partly masked row
    if poison == "masked_row":
        mask[1, 2, :] = -np.inf
    elif poison == "nan":
        mask[0, 3, 1] = np.nan
    elif poison == "plus_inf":
        mask[1, 0, 4] = np.inf
    mod, params = bh.from_onnx(model)
    part = bh.partition(mod, params)
    assert len(bh.report(part).regions) == 1 and not _ops_left(part), bh.report(part)
    softmaxes = [n for m in part.attrs["external_mods"] for n in region_graph_json(m)["nodes"] if n["op"] == "softmax"]
    assert [n["attrs"].get("safe") for n in softmaxes] == [2]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "mask": mask})[0]
    got = _run(part, x, mask)
    assert not np.isnan(want).any() and not np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# item 5: a Llama-family decoder with a dynamic sequence length
# ----------------------------------------------------------------------------------------------
def test_llama_decoder_with_dynamic_sequence_serves_several_lengths_from_one_build():
    """Dim("S", max=2048): one partition and one build run S = 7, 128 and 512 within 1e-4 of torch,
    as one region (the mask / position bookkeeping on llvm before it). In the region, with S symbolic,
    GQA's K / V are read by the matmuls without a copy and the causal mask is the scores matmul's
    post-op (its [1, 1, S, S] read as [1, 1, 1, S, S] against the 5-D scores)."""
    pytest.importorskip("transformers")
    from zoo_models import _token_ids, smollm_135m

    zm = smollm_135m(small=True, seq=16)
    seq = torch.export.Dim("S", max=2048)
    mod, params = bh.from_torch(zm.module, zm.inputs, dynamic_shapes=({1: seq},))
    part = bh.partition(mod, params)
    report = bh.report(part)
    assert len(report.regions) == 1, report
    nodes = [n for n, _ in _region_nodes(part)]
    assert "broadcast_to" not in [n["op"] for n in nodes]
    masks = [n.get("attrs", {}).get("has_mask", 0) for n in nodes if n["op"] == "matmul"]
    assert masks == [1, 0] * 2, masks  # 2 layers: scores with the mask, then @ V
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(relax.build(part, target="llvm"), tvm.cpu())
    for length in (7, 128, 512):
        ids = _token_ids(1000, length)
        with torch.no_grad():
            want = zm.module(ids).numpy()
        out = vm["main"](tvm.runtime.tensor(ids.numpy()))
        got = (out if hasattr(out, "numpy") else out[0]).numpy()
        assert got.shape == want.shape == (1, length, 96)
        assert _rel(got, want) <= TOLERANCE, f"S={length}"


# ----------------------------------------------------------------------------------------------
# a symbolic sequence dim through from_onnx (both exporters): one build, several lengths
# ----------------------------------------------------------------------------------------------
def _shape_arithmetic_onnx():
    """x [1, S, 8] -> MatMul(x + positions + table[:, 1:S+1] + (2..S+1), w), the sequence-length
    arithmetic written as the default exporter writes it: a scalar S reshaped to [-1] (a slice end),
    Range(0, S, 1) for the positions, an Expand to [1, 1, 1] (the identity) and Range(2, S + 2, 1),
    which ranges_from_dims leaves to TVM (its start is positive)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    f = helper.make_tensor

    def const(name, values, dims, t=TensorProto.INT64):
        return helper.make_node("Constant", [], [name], value=f(name, t, dims, values))

    nodes = [const("zero", [0], []), const("one", [1], []), const("two", [2], []), const("flat", [-1], [1]),
             const("axis1", [1], [1]), const("begin1", [1], [1]), const("axes02", [0, 2], [2]),
             const("ones3", [1, 1, 1], [3]),
             helper.make_node("Shape", ["x"], ["s1d"], start=1, end=2),
             helper.make_node("Squeeze", ["s1d"], ["s"]),
             helper.make_node("Add", ["s", "one"], ["s_plus_1"]),
             helper.make_node("Reshape", ["s_plus_1", "flat"], ["end"]),
             helper.make_node("Slice", ["table", "begin1", "end", "axis1"], ["window"]),
             helper.make_node("Range", ["zero", "s", "one"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["posf", "axes02"], ["pos3"]),
             helper.make_node("Expand", ["pos3", "ones3"], ["pos_e"]),
             helper.make_node("Add", ["s", "two"], ["s_plus_2"]),
             helper.make_node("Range", ["two", "s_plus_2", "one"], ["late"]),
             helper.make_node("Cast", ["late"], ["latef"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["latef", "axes02"], ["late3"]),
             helper.make_node("Add", ["x", "pos_e"], ["a"]),
             helper.make_node("Add", ["a", "window"], ["b"]),
             helper.make_node("Add", ["b", "late3"], ["c"]),
             helper.make_node("MatMul", ["c", "w"], ["y"])]
    inits = [numpy_helper.from_array(rng.standard_normal((1, 40, 8)).astype("float32"), "table"),
             numpy_helper.from_array(rng.standard_normal((8, 8)).astype("float32"), "w")]
    graph = helper.make_graph(nodes, "seq_arith", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", 8])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_onnx_sequence_arithmetic_passes_rewrite_what_the_importer_cannot_read():
    """scalar_reshapes: the scalar's Reshape is an Unsqueeze; drop_identity_expands: no Expand;
    ranges_from_dims: Range(0, S, 1) is a cumulative sum, Range(2, S + 2, 1) (positive start) stays."""
    from byoc_hetero.passes import ONNX_IMPORT, run_passes

    model = _shape_arithmetic_onnx()
    ops = [n.op_type for n in run_passes(ONNX_IMPORT, model, shape=None).graph.node]
    assert "Expand" not in ops and ops.count("Range") == 1 and "CumSum" in ops
    assert ops.count("Reshape") == 0 and ops.count("Unsqueeze") == 4
    assert [n.op_type for n in model.graph.node].count("Range") == 2  # the caller's model is untouched


def test_range_up_to_data_is_left_to_the_importer():
    """A limit that is data (a graph input), not a dim: its sign is unknown, so no rewrite."""
    from onnx import TensorProto, helper

    from byoc_hetero.passes.ranges_from_dims import ranges_from_dims

    nodes = [helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", TensorProto.INT64, [], [0])),
             helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TensorProto.INT64, [], [1])),
             helper.make_node("Range", ["zero", "n", "one"], ["y"])]
    graph = helper.make_graph(nodes, "r", [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, ["L"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert ranges_from_dims(model) is model


def test_onnx_sequence_arithmetic_is_one_region_for_every_length():
    """The hand-written graph imports with the sequence dim symbolic and no match_cast (the Range
    TVM imports through a length tensor is resolved to S by resolve_shape_tensors), is one region,
    and one build matches ONNX Runtime at two lengths."""
    ort = pytest.importorskip("onnxruntime")
    import tvm
    from tvm import relax

    model = _shape_arithmetic_onnx()
    mod, params = bh.from_onnx(model)
    assert "match_cast" not in str(mod["main"]) and "range_len" not in str(mod["main"]), mod["main"]
    part = bh.partition(mod, params)
    assert len(bh.report(part).regions) == 1, bh.report(part)
    vm = relax.VirtualMachine(relax.build(part, target="llvm"), tvm.cpu())
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for length in (5, 17):
        x = np.random.default_rng(length).standard_normal((1, length, 8)).astype("float32")
        want = sess.run(None, {"x": x})[0]
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        assert got.shape == want.shape == (1, length, 8)
        assert _rel(got, want) <= TOLERANCE, f"S={length}"
    # table[:, 1:S + 1] of 40 rows, which the importer assumes in bound: S <= 39 is declared and
    # checked (beyond it the slice read past the table and could crash; ONNX Runtime's slice clips)
    assert bh.inputs.dim_ranges(mod["main"]) == {"S": (1, 39)}
    with pytest.raises(bh.InputError, match=r"dim 1 \(S\) is 40, outside its declared range \[1, 39\]"):
        vm["main"](tvm.runtime.tensor(np.zeros((1, 40, 8), "float32")))


def test_resolve_shape_tensors_substitutes_the_length_tvm_reads_back():
    """Without the pass the positive-start Range leaves TVM's fresh symbol and its match_cast."""
    from byoc_hetero import frontends
    from byoc_hetero.passes import ONNX_IMPORTED

    without = tuple(p for p in ONNX_IMPORTED if p.name != "resolve_shape_tensors")
    original = frontends.ONNX_IMPORTED
    frontends.ONNX_IMPORTED = without
    try:
        mod, _ = bh.from_onnx(_shape_arithmetic_onnx())
    finally:
        frontends.ONNX_IMPORTED = original
    assert "match_cast" in str(mod["main"]) and "range_len" in str(mod["main"])


#: (model, exporter) pairs exported with a symbolic sequence dim; the TorchScript exporter cannot
#: export GPT-2 or the Llama decoder with transformers 5 (``aten::diff``)
DYNAMIC_ONNX = [("bert_base", "torchscript"), ("bert_base", "dynamo"), ("gpt2", "dynamo"), ("smollm_135m", "dynamo")]


def _export_dynamic_sequence(zm, exporter: str, path: str) -> None:
    names = list(zm.input_names)
    if exporter == "dynamo":
        pytest.importorskip("onnxscript")
        seq = torch.export.Dim("S", max=128)
        shapes = (tuple({1: seq} for _ in names),) if len(names) > 1 else ({1: seq},)  # *args of _FirstOutput
        torch.onnx.export(zm.module, zm.inputs, path, input_names=names, output_names=["y"], dynamic_shapes=shapes)
    else:
        torch.onnx.export(zm.module, zm.inputs, path, input_names=names, output_names=["y"], opset_version=17,
                          dynamo=False, dynamic_axes={**{n: {1: "S"} for n in names}, "y": {1: "S"}})


@pytest.mark.parametrize("name,exporter", DYNAMIC_ONNX)
def test_dynamic_sequence_onnx_file_is_one_region_and_one_build_serves_two_lengths(name, exporter, tmp_path):
    """A transformer exported with a symbolic sequence dim imports through from_onnx, is one region
    as its static export is, and one build computes ONNX Runtime's values at S = 5 and 23."""
    pytest.importorskip("transformers")
    ort = pytest.importorskip("onnxruntime")
    import tvm
    from tvm import relax
    from zoo_models import build

    zm = build(name, small=True)
    path = str(tmp_path / f"{name}.onnx")
    _export_dynamic_sequence(zm, exporter, path)
    mod, params = bh.from_onnx(path)
    part = bh.partition(mod, params)
    report = bh.report(part)
    assert len(report.regions) == 1, report
    assert "S" in str(report), "the sequence dim must stay symbolic"
    vm = relax.VirtualMachine(relax.build(part, target="llvm"), tvm.cpu())
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for length in (5, 23):
        ids = np.random.default_rng(length).integers(0, 1000, (1, length), dtype=np.int64)
        feed = [ids] + ([(np.arange(length) < length - length // 4).astype(np.int64)[None]]
                        if len(zm.input_names) > 1 else [])
        want = sess.run(None, dict(zip(zm.input_names, feed)))[0]
        out = vm["main"](*[tvm.runtime.tensor(a) for a in feed])
        got = (out if hasattr(out, "numpy") else out[0]).numpy()
        assert got.shape == want.shape and got.shape[1] == length
        assert _rel(got, want) <= TOLERANCE, f"{name} ({exporter}) S={length}"
    if name != "smollm_135m":
        # past the position table (128 rows): a clear error, where the slice of BERT's position ids
        # read past its buffer; ONNX Runtime raises on it too
        long = np.zeros((1, 140), dtype=np.int64)
        with pytest.raises(bh.InputError, match="128"):
            vm["main"](*[tvm.runtime.tensor(long)] * len(zm.input_names))
