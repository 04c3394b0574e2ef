"""What the LLM decoder's region runs (session 4): RMSNorm's per-feature weight folded into the
dense layers reading the norm (region pass ``fold_dense_input_scales``).

References: the llvm-only build of the same module, torch eager for the decoder.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from conftest import graph, offload_and_compare
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.timing import build

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

R = relax.op
RNG = np.random.default_rng(25)
HIDDEN, SEQ = 48, 6


def _const(*shape, around: float = 0.0):
    return relax.const((around + 0.3 * RNG.standard_normal(shape)).astype("float32"))


def _rms_norm(emit, x, gamma):
    """transformers' LlamaRMSNorm as torch.export writes it."""
    mean = emit(R.mean(emit(R.power(x, relax.const(np.float32(2.0)))), axis=[-1], keepdims=True))
    inv = emit(R.rsqrt(emit(R.add(mean, relax.const(np.float32(1e-5))))))
    return emit(R.multiply(gamma, emit(R.multiply(x, inv))))


def _linear(emit, x, w, layout: str):
    """x @ W^T (torch's Linear: weight [N, K], permuted) or x @ W (the ONNX exporter's [K, N])."""
    if layout == "NK":
        w = emit(R.permute_dims(w, [1, 0]))
    flat = emit(R.reshape(x, (SEQ, HIDDEN)))
    return emit(R.reshape(emit(R.matmul(flat, w)), (1, SEQ, int(w.ty.shape[1]))))


def _vector_multiplies(ex, n: int) -> int:
    """Multiply nodes of the regions with an operand of shape [n] (a norm's weight, unfolded)."""
    count = 0
    for m in bh.codegen.region_modules(ex):
        g = json.loads(m["get_graph_json"]())
        count += sum(1 for node in g["nodes"] if node["op"] == "binary" and node["attrs"].get("algorithm") == "mul"
                     and any(g["tensors"][i]["shape"] == [n] for i in node["inputs"]))
    return count


def _weighted_reduces(ex) -> int:
    """Reduce nodes of the regions that multiply by a norm's weight (has_weight: fold_norm_weights)."""
    return sum(node["attrs"].get("has_weight", 0) for m in bh.codegen.region_modules(ex)
               for node in json.loads(m["get_graph_json"]())["nodes"] if node["op"] == "reduce")


def _dense_count(ex) -> int:
    return sum(1 for m in bh.codegen.region_modules(ex) for node in json.loads(m["get_graph_json"]())["nodes"]
               if node["op"] == "dense")


def _norm_then_projections(extra_reader: str | None):
    """RMSNorm, then a [K, N] and an [N, K] projection of its output (and, with ``extra_reader``,
    the norm's output also added to the result or returned)."""
    gamma = _const(HIDDEN, around=1.0)
    wq, wk = _const(HIDDEN, HIDDEN), _const(16, HIDDEN)

    def body(emit, x):
        h = _rms_norm(emit, x, gamma)
        q = _linear(emit, h, wq, "KN")
        k = _linear(emit, h, wk, "NK")
        out = emit(R.concat([q, k], axis=-1))
        if extra_reader == "add":
            return emit(R.add(out, emit(R.concat([h, emit(R.strided_slice(h, [2], [0], [16]))], axis=-1))))
        if extra_reader == "output":
            return relax.Tuple([out, h])
        return out

    return graph({"x": (1, SEQ, HIDDEN)}, body)


def test_rms_norm_weight_goes_into_the_dense_weights():
    """The norm's ``gamma *`` is no node of the region: both projections (one KN, one NK weight,
    one dense since combine_parallel_denses) run on weights scaled once at init; the result is the
    llvm build's."""
    res = offload_and_compare(_norm_then_projections(None))
    assert res.error < 1e-5, res.error
    ex = build(res.partitioned)
    assert _dense_count(ex) == 1
    assert _vector_multiplies(ex, HIDDEN) == 0
    assert _weighted_reduces(ex) == 0  # in the dense weights, not the norm's reduce


@pytest.mark.parametrize("extra_reader", ["add", "output"])
def test_scale_read_by_anything_but_a_dense_stays(extra_reader):
    """The product is also read by an add (or is a region output): the dense weights are the original
    ones, the gamma multiplies in the norm's reduce (fold_norm_weights: no step of its own), and the
    result is the llvm build's."""
    res = offload_and_compare(_norm_then_projections(extra_reader))
    assert res.error < 1e-5, res.error
    ex = build(res.partitioned)
    assert _vector_multiplies(ex, HIDDEN) == 0 and _weighted_reduces(ex) == 1  # gamma * (...): the reduce's weight


def small_llama(path: str, tmp_path):
    """(zoo model, Relax module, params, torch's output) of the small Llama decoder imported by
    ``path`` ("from_torch" or "from_onnx", the dynamo exporter's file in ``tmp_path``)."""
    torch = pytest.importorskip("torch")
    import zoo_models

    zm = zoo_models.smollm_135m(small=True)
    want = zm.module(*zm.inputs).detach().numpy()
    if path == "from_torch":
        return zm, *bh.from_torch(zm.module, zm.inputs), want
    pytest.importorskip("onnxscript")
    file = str(tmp_path / "llama.onnx")
    torch.onnx.export(zm.module, zm.inputs, file, input_names=list(zm.input_names))
    return zm, *bh.from_onnx(file), want


@pytest.mark.parametrize("path", ["from_torch", "from_onnx"])
def test_llama_decoder_norm_weights_folded_and_matches_torch(path, tmp_path):
    """The small Llama decoder: every RMSNorm feeding dense layers (2 per layer) has its weight in
    them; the final norm (the model's output) multiplies by its weight in its reduce node (no step of
    its own: fold_norm_weights); output within 1e-4 of torch."""
    zm, mod, params, want = small_llama(path, tmp_path)
    part = bh.partition(mod, params)
    assert len(bh.report(part).regions) == 1
    ex = build(part)
    vm = relax.VirtualMachine(ex, __import__("tvm").cpu())
    got = vm["main"](*[__import__("tvm").runtime.tensor(x.numpy()) for x in zm.inputs]).numpy()
    assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) < 1e-4
    # the final norm's in its reduce; 2 layers x 2 norms folded into the denses
    assert (_vector_multiplies(ex, 96), _weighted_reduces(ex)) == (0, 1)


# ----------------------------------------------------------------------------------------------
# region pass merge_common_nodes: what torch.export repeats per layer is computed once
# ----------------------------------------------------------------------------------------------
def _ops(ex) -> list[str]:
    return [node["op"] for m in bh.codegen.region_modules(ex) for node in json.loads(m["get_graph_json"]())["nodes"]]


@pytest.mark.parametrize("second_axis, softmaxes", [(-1, 1), (1, 2)])
def test_repeated_node_is_computed_once(second_axis, softmaxes):
    """softmax(x) written twice (as torch.export writes a per-layer mask) is one node; a softmax
    over another axis of the same input is not the same node. Both match the llvm build."""
    w = _const(8, 8)

    def body(emit, x):
        a = emit(R.nn.softmax(x, axis=-1))
        b = emit(R.nn.softmax(x, axis=second_axis))
        return emit(R.matmul(emit(R.add(a, b)), w))

    res = offload_and_compare(graph({"x": (1, 8, 8)}, body))
    assert res.error < 1e-5, res.error
    assert _ops(build(res.partitioned)).count("softmax") == softmaxes


def test_llama_decoder_from_torch_builds_its_float_mask_once():
    """The small Llama decoder through from_torch: the per-layer where(mask, 0, -inf) (2 layers) is
    one node of the region, and the output is torch's within 1e-4."""
    import tvm

    pytest.importorskip("torch")
    import zoo_models

    zm = zoo_models.smollm_135m(small=True)
    want = zm.module(*zm.inputs).detach().numpy()
    ex = build(bh.partition(*bh.from_torch(zm.module, zm.inputs)))
    assert _ops(ex).count("where") == 1
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(x.numpy()) for x in zm.inputs]).numpy()
    assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) < 1e-4


def _nodes(ex) -> list[dict]:
    return [node for m in bh.codegen.region_modules(ex) for node in json.loads(m["get_graph_json"]())["nodes"]]


# ----------------------------------------------------------------------------------------------
# region pass fuse_rms_statistics: square, mean, + eps, rsqrt (or sqrt and 1/.) as one reduce
# ----------------------------------------------------------------------------------------------
def _rms_then_dense(spelling: str, eps: float = 1e-5):
    """x * (RMSNorm's statistic) -> dense, the statistic spelled as from_torch writes it
    (``rsqrt``), as the ONNX exporter does (``sqrt`` then ``1 / (.)``), or with the mean squared
    tensor also returned (``shared``: the square has a second reader)."""
    w = _const(HIDDEN, 16)

    def body(emit, x):
        sq = emit(R.power(x, relax.const(np.float32(2.0))))
        mean = emit(R.mean(sq, axis=[-1], keepdims=True))
        shifted = emit(R.add(mean, relax.const(np.float32(eps))))
        if spelling == "onnx":
            inv = emit(R.divide(relax.const(np.float32(1.0)), emit(R.sqrt(shifted))))
        else:
            inv = emit(R.rsqrt(shifted))
        out = emit(R.matmul(emit(R.reshape(emit(R.multiply(x, inv)), (SEQ, HIDDEN))), w))
        return relax.Tuple([out, sq]) if spelling == "shared" else out

    return graph({"x": (1, SEQ, HIDDEN)}, body)


@pytest.mark.parametrize("spelling", ["torch", "onnx"])
def test_rms_statistic_is_one_reduce_node(spelling):
    """Both spellings of x * 1/sqrt(mean(x²) + eps) become one reduce node (mean_square, shift eps,
    rsqrt, normalize: its output is x times the statistic): no eltwise, no binary; the result is
    the llvm build's."""
    res = offload_and_compare(_rms_then_dense(spelling))
    assert res.error < 1e-5, res.error
    nodes = _nodes(build(res.partitioned))
    reduces = [n for n in nodes if n["op"] == "reduce"]
    assert len(reduces) == 1, [n["op"] for n in nodes]
    assert reduces[0]["attrs"]["algorithm"] == "mean_square"
    assert reduces[0]["attrs"]["activation"] == "rsqrt"
    assert abs(reduces[0]["attrs"]["shift"] - 1e-5) < 1e-12
    assert reduces[0]["attrs"]["normalize"] == 1
    assert [n["op"] for n in nodes].count("eltwise") == 0
    assert [n["op"] for n in nodes].count("binary") == 0
    # oneDNN 3.2 runs the mean of squares (norm_lp_power_p_sum) only in its reference
    # implementation, 40x slower here: the runtime's host loop runs it instead
    assert _step_impls(res.partitioned, "reduce") == ["host"]


def _step_impls(partitioned, op: str) -> list[str]:
    """The implementations the run steps of ``op`` used in one call of the built module."""
    import tvm

    ex = build(partitioned)
    regions = bh.codegen.region_modules(ex)
    for m in regions:
        m["set_profiling"](True)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    vm["main"](tvm.runtime.tensor(RNG.standard_normal((1, SEQ, HIDDEN)).astype("float32")))
    return [s["impl"] for m in regions for s in json.loads(str(m["get_profile"]()))
            if s["phase"] == "run" and s["op"] == op]


def test_rms_statistic_with_a_shared_square_keeps_it():
    """The squared tensor is also a region output: the square stays a node, the mean reads it as
    before (plain mean, no mean_square), and the results are the llvm build's."""
    res = offload_and_compare(_rms_then_dense("shared"))
    assert res.error < 1e-5, res.error
    nodes = _nodes(build(res.partitioned))
    assert not any(n["attrs"].get("algorithm") == "mean_square" for n in nodes if n["op"] == "reduce")
    assert [n["op"] for n in nodes].count("eltwise") == 1


def test_rms_statistic_of_large_values_has_no_overflow_or_nan():
    """Rows of 1e19 (squares of 1e38, near float32's max: their sum of 48 overflows to inf; the llvm build
    gives 0 for x * rsqrt(inf) and so must we) and rows of zeros (rsqrt(eps) finite): the fused
    reduction matches the llvm build, no NaN."""
    mod = _rms_then_dense("torch")
    x = np.zeros((1, SEQ, HIDDEN), "float32")
    x[0, 0] = 1e19
    x[0, 1] = RNG.standard_normal(HIDDEN)
    res = offload_and_compare(mod, inputs=[x])
    assert not np.isnan(res.got).any()


def test_mean_square_over_a_leading_axis_matches_llvm():
    """mean(x², axis=1) of [1, SEQ, HIDDEN] (not the trailing axes: oneDNN's primitive, not the
    host loop) + eps, rsqrt: one reduce node, the llvm build's result."""
    w = _const(HIDDEN, 16)

    def body(emit, x):
        mean = emit(R.mean(emit(R.power(x, relax.const(np.float32(2.0)))), axis=[1], keepdims=True))
        inv = emit(R.rsqrt(emit(R.add(mean, relax.const(np.float32(1e-3))))))
        return emit(R.matmul(emit(R.reshape(emit(R.multiply(x, inv)), (SEQ, HIDDEN))), w))

    res = offload_and_compare(graph({"x": (1, SEQ, HIDDEN)}, body))
    assert res.error < 1e-5, res.error
    reduces = [n for n in _nodes(build(res.partitioned)) if n["op"] == "reduce"]
    assert [r["attrs"]["algorithm"] for r in reduces] == ["mean_square"]


def _reduce_doc(shape, out_shape, attrs) -> str:
    node = {"op": "reduce", "inputs": [0], "output": 1, "attrs": attrs}
    return json.dumps({"format": "byoc_hetero.region", "version": 1, "symbol": "t",
                       "tensors": [{"shape": list(shape)}, {"shape": list(out_shape)}],
                       "inputs": [0], "outputs": [1], "nodes": [node]})


@pytest.mark.parametrize("shape", [(1, 5, 48), (7, 19), (3, 1)])
def test_normalize_reduce_node_against_numpy(shape):
    """The runtime's reduce with normalize = 1 alone (odd row lengths included: the host loop's
    16-lane tail): x * 1/sqrt(mean(x²) + eps) per last-axis row, as numpy computes it in float32."""
    import tvm

    create = tvm.get_global_func("byoc_hetero.runtime.create")
    m = create(_reduce_doc(shape, shape, {"algorithm": "mean_square", "shift": 1e-5, "activation": "rsqrt",
                                          "normalize": 1}))
    x = RNG.standard_normal(shape).astype("float32")
    out = tvm.runtime.tensor(np.zeros(shape, "float32"))
    m["t"](tvm.runtime.tensor(x), out)
    stat = (np.float32(1) / np.sqrt(np.mean(x.astype("float64") ** 2, axis=-1, keepdims=True) + 1e-5)).astype("float32")
    np.testing.assert_allclose(out.numpy(), x * stat, rtol=2e-6, atol=1e-7)


def _weighted_doc(shape, weight_shape, attrs) -> str:
    """A reduce of data [shape] with a weight input of ``weight_shape`` (a second region input)."""
    node = {"op": "reduce", "inputs": [0, 1], "output": 2, "attrs": attrs}
    return json.dumps({"format": "byoc_hetero.region", "version": 1, "symbol": "t",
                       "tensors": [{"shape": list(shape)}, {"shape": list(weight_shape)}, {"shape": list(shape)}],
                       "inputs": [0, 1], "outputs": [2], "nodes": [node]})


NORMALIZE = {"algorithm": "mean_square", "shift": 1e-5, "activation": "rsqrt", "normalize": 1}


@pytest.mark.parametrize("shape", [(1, 5, 48), (7, 19), (3, 1)])
def test_normalize_reduce_node_with_weight_against_numpy(shape):
    """has_weight: the norm's weight per feature times x * r in the same host loop, the float32 product
    ``w * (x * r)`` the multiply step computed: the bits of the unweighted node's output times w."""
    import tvm

    create = tvm.get_global_func("byoc_hetero.runtime.create")
    x = RNG.standard_normal(shape).astype("float32")
    w = (1 + 0.3 * RNG.standard_normal(shape[-1])).astype("float32")
    plain = create(_reduce_doc(shape, shape, NORMALIZE))
    normalized = tvm.runtime.tensor(np.zeros(shape, "float32"))
    plain["t"](tvm.runtime.tensor(x), normalized)
    weighted = create(_weighted_doc(shape, (1,) * (len(shape) - 1) + shape[-1:], {**NORMALIZE, "has_weight": 1}))
    out = tvm.runtime.tensor(np.zeros(shape, "float32"))
    weighted["t"](tvm.runtime.tensor(x), tvm.runtime.tensor(w.reshape((1,) * (len(shape) - 1) + shape[-1:])), out)
    assert out.numpy().tobytes() == (w * normalized.numpy()).tobytes()
    stat = (np.float32(1) / np.sqrt(np.mean(x.astype("float64") ** 2, axis=-1, keepdims=True) + 1e-5)).astype("float32")
    np.testing.assert_allclose(out.numpy(), w * (x * stat), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("attrs, weight_shape, match", [
    ({**NORMALIZE, "has_weight": 1}, (8, 1), r"weight must be float32 with one value per feature of the last axis "
                                             r"\(8\), got float32 \[8, 1\]"),
    ({**NORMALIZE, "normalize": 0, "has_weight": 1}, (8,), "has_weight.*needs normalize = 1"),
])
def test_weighted_reduce_node_rejects_what_it_cannot_run(attrs, weight_shape, match):
    import tvm

    with pytest.raises(Exception, match=match):
        tvm.get_global_func("byoc_hetero.runtime.create")(_weighted_doc((4, 8), weight_shape, attrs))


@pytest.mark.parametrize("attrs, out_shape, match", [
    ({"algorithm": "mean", "activation": "rsqrt"}, (4, 8), "normalize = 1 needs algorithm mean_square"),
    ({"algorithm": "mean_square", "activation": "sqrt"}, (4, 8), "normalize = 1 needs .* activation rsqrt"),
    ({"algorithm": "mean_square", "activation": "rsqrt"}, (4, 1), r"writes the data.s shape \[4, 8\], but the output has \[4, 1\]"),
])
def test_normalize_reduce_node_rejects_what_it_cannot_run(attrs, out_shape, match):
    """normalize = 1 with another algorithm, activation or a statistic-shaped output: a clear
    error naming what was expected, when the module is created."""
    import tvm

    create = tvm.get_global_func("byoc_hetero.runtime.create")
    with pytest.raises(Exception, match=match):
        create(_reduce_doc((4, 8), out_shape, {**attrs, "normalize": 1}))


def test_rms_statistic_read_elsewhere_keeps_the_multiply():
    """The statistic is also a region output: the reduce keeps writing it (no normalize) and x * r
    stays a binary; the results are the llvm build's."""
    w = _const(HIDDEN, 16)

    def body(emit, x):
        mean = emit(R.mean(emit(R.power(x, relax.const(np.float32(2.0)))), axis=[-1], keepdims=True))
        inv = emit(R.rsqrt(emit(R.add(mean, relax.const(np.float32(1e-5))))))
        out = emit(R.matmul(emit(R.reshape(emit(R.multiply(x, inv)), (SEQ, HIDDEN))), w))
        return relax.Tuple([out, inv])

    res = offload_and_compare(graph({"x": (1, SEQ, HIDDEN)}, body))
    assert res.error < 1e-5, res.error
    nodes = _nodes(build(res.partitioned))
    assert [n["attrs"].get("normalize", 0) for n in nodes if n["op"] == "reduce"] == [0]
    assert [n["op"] for n in nodes].count("binary") == 1
