"""Pass combine_parallel_denses: matmuls of one input by constant weights (a Llama layer's Q, K, V
projections) run as one wider dense and a split; a dense on a constant weight runs as oneDNN's
inner product.

References: the llvm-only build of the same module (small graphs); torch eager for the small Llama
decoder through both import paths.
"""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
from conftest import graph, offload_and_compare
from test_llm_region import small_llama
from tvm import relax

import byoc_hetero as bh
from byoc_hetero import _C
from byoc_hetero import passes
from byoc_hetero.timing import build

R = relax.op
combine = importlib.import_module("byoc_hetero.passes.combine_parallel_denses")  # the module (the package's name is the pass)
RNG = np.random.default_rng(256)
SEQ, HIDDEN = 6, 40


def _const(*shape):
    return relax.const((0.3 * RNG.standard_normal(shape)).astype("float32"))


def _dense_nodes(ex) -> list[dict]:
    return [node for m in bh.codegen.region_modules(ex) for node in json.loads(m["get_graph_json"]())["nodes"]
            if node["op"] == "dense"]


def _projections(activation: str | None = None, reshape_each: bool = True):
    """Three projections of one input (as torch writes them: a reshape of x per projection and a
    permuted [N, K] weight; or, ``reshape_each`` False, the ONNX exporter's [K, N] weights on x
    itself), the first optionally read by an activation; the results concatenated."""
    weights = [(_const(HIDDEN, HIDDEN), "NK"), (_const(HIDDEN, 16), "KN"), (_const(8, HIDDEN), "NK")]

    def body(emit, x):
        outs = []
        for w, layout in weights:
            if layout == "NK":
                w = emit(R.permute_dims(w, [1, 0]))
            a = emit(R.reshape(x, (SEQ, HIDDEN))) if reshape_each else x
            y = emit(R.matmul(a, w))
            outs.append(emit(R.reshape(y, (1, SEQ, int(w.ty.shape[1])))))
        if activation:
            outs[0] = emit(getattr(R.nn, activation)(outs[0]))
        return emit(R.concat(outs, axis=-1))

    return graph({"x": (1, SEQ, HIDDEN)}, body)


@pytest.mark.parametrize("reshape_each", [True, False])
def test_projections_of_one_input_run_as_one_dense(reshape_each):
    """Three projections (two [N, K] weights, one [K, N]) of one input: one dense node of width
    40 + 16 + 8 = 64 in the region, whose parts equal the llvm build's three products."""
    res = offload_and_compare(_projections(reshape_each=reshape_each))
    assert res.error < 1e-5, res.error
    denses = _dense_nodes(build(res.partitioned))
    assert len(denses) == 1, denses


def test_pass_concatenates_constant_weights_once():
    """After the pass the module has one matmul whose weight is the [K, 64] concatenation of the
    three (the permuted ones transposed at bind time), and a split into 40, 16, 8 columns."""
    mod = passes.combine_parallel_denses(_projections())
    calls = [b.value for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    names = [c.op.name for c in calls]
    assert names.count("relax.matmul") == 1 and names.count("relax.split") == 1
    matmul = calls[names.index("relax.matmul")]
    assert [int(d) for d in matmul.args[1].ty.shape] == [HIDDEN, 64]
    assert [int(d) for d in calls[names.index("relax.split")].attrs.indices_or_sections] == [40, 56]


def test_activated_projection_stays_separate():
    """The first projection is read by silu (SwiGLU's gate): combined, silu could no longer be the
    dense's post-op, so that one stays its own dense; the other two are combined; results are the
    llvm build's."""
    res = offload_and_compare(_projections(activation="silu"))
    assert res.error < 1e-5, res.error
    widths = sorted(d for node in _dense_nodes(build(res.partitioned))
                    for d in [node["attrs"].get("weight_layout")] if d)
    assert len(widths) == 2, widths


def test_projections_with_biases_stay_separate(monkeypatch):
    """Q / K / V with a constant bias each (BERT, GPT-2), BYOC_HETERO_COMBINE_BIASES unset (the default):
    each dense takes its bias as an epilogue, so none is combined (three dense nodes, no split); results are
    the llvm build's."""
    monkeypatch.delenv(combine.BIASES_VARIABLE, raising=False)
    ws = [(_const(HIDDEN, 16), _const(16)) for _ in range(3)]

    def body(emit, x):
        return emit(R.concat([emit(R.add(emit(R.matmul(x, w)), b)) for w, b in ws], axis=-1))

    res = offload_and_compare(graph({"x": (1, SEQ, HIDDEN)}, body))
    assert res.error < 1e-5, res.error
    nodes = [n for m in bh.codegen.region_modules(build(res.partitioned))
             for n in json.loads(m["get_graph_json"]())["nodes"]]
    assert [n["op"] for n in nodes].count("dense") == 3 and "slice" not in [n["op"] for n in nodes]


def _biased_projections(bias_shapes):
    """Three projections of one input of widths 16, 24, 8, each with a constant bias of the shape given
    (None: none), their results concatenated."""
    ws = [(_const(HIDDEN, n), None if shape is None else _const(*shape)) for n, shape in zip((16, 24, 8), bias_shapes)]

    def body(emit, x):
        outs = []
        for w, b in ws:
            y = emit(R.matmul(x, w))
            outs.append(emit(R.add(y, b)) if b is not None else y)
        return emit(R.concat(outs, axis=-1))

    return graph({"x": (1, SEQ, HIDDEN)}, body)


def test_projections_with_biases_combine_when_asked(monkeypatch):
    """BYOC_HETERO_COMBINE_BIASES=1: Q / K / V with a bias each (one ``[N]``, one ``[1, 1, N]``) and one
    without are one dense of width 48 whose bias is the three concatenated (zeros for the one without),
    then three slices; results are the llvm build's."""
    monkeypatch.setenv(combine.BIASES_VARIABLE, "1")
    mod = _biased_projections([(16,), None, (1, 1, 8)])
    calls = [b.value for b in passes.combine_parallel_denses(mod)["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call)]
    names = [c.op.name for c in calls]
    assert names.count("relax.matmul") == 1 and names.count("relax.add") == 1, names
    bias = calls[names.index("relax.add")].args[1].value.numpy()
    assert bias.shape == (48,) and not bias[16:40].any() and bias[:16].any() and bias[40:].any()
    res = offload_and_compare(mod)
    assert res.error < 1e-5, res.error
    nodes = [n for m in bh.codegen.region_modules(build(res.partitioned))
             for n in json.loads(m["get_graph_json"]())["nodes"]]
    denses = [n for n in nodes if n["op"] == "dense"]
    assert len(denses) == 1 and denses[0]["attrs"]["has_bias"] == 1, denses
    assert [n["op"] for n in nodes].count("slice") == 3


def test_a_bias_of_more_than_one_value_per_column_stays_separate(monkeypatch):
    """BYOC_HETERO_COMBINE_BIASES=1, but the first projection's constant is ``[SEQ, 16]`` (a value per row
    too, no bias): it stays its own product; the other two are combined."""
    monkeypatch.setenv(combine.BIASES_VARIABLE, "1")
    out = passes.combine_parallel_denses(_biased_projections([(SEQ, 16), (24,), None]))
    matmuls = [b.value for b in out["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call) and b.value.op.name == "relax.matmul"]
    assert sorted(int(m.args[1].ty.shape[1]) for m in matmuls) == [16, 32]


@pytest.mark.parametrize("value", ["", "0"])
def test_biased_projections_are_left_by_default(monkeypatch, value):
    """BYOC_HETERO_COMBINE_BIASES unset or 0: the biased projections are left as they are."""
    monkeypatch.setenv(combine.BIASES_VARIABLE, value)
    mod = _biased_projections([(16,), (24,), (8,)])
    assert passes.combine_parallel_denses(mod).same_as(mod)


def test_a_bad_biases_variable_is_a_value_error_naming_it(monkeypatch):
    monkeypatch.setenv(combine.BIASES_VARIABLE, "yes")
    with pytest.raises(ValueError, match="BYOC_HETERO_COMBINE_BIASES must be 0 or 1, got 'yes'"):
        passes.combine_parallel_denses(_biased_projections([(16,), (24,), (8,)]))


def test_qwen2_generator_with_combined_biases_matches_transformers(monkeypatch):
    """BYOC_HETERO_COMBINE_BIASES=1 on a small Qwen2 (grouped-query: 4 heads, 2 kv heads; random q / k / v
    biases): each layer's q, k, v are one dense with a bias, of width q + 2 kv; a prefill of 67 rows (the inner
    product, odd) or of 7 (the matmul) and the decode steps after it give transformers' logits at every
    position, the same bits as the build with them separate (each column the same dot product and bias), and
    greedy generation of 24 tokens from the 7 is transformers' token for token."""
    from test_generate import COMMON, MAX_LENGTH, VOCAB, _hf_generate, _model, _rel

    torch = pytest.importorskip("torch")
    monkeypatch.setenv(combine.BIASES_VARIABLE, "1")
    monkeypatch.setenv("BYOC_HETERO_LAST_LAYER_ROWS", "all")  # every layer's q at every row: combined in each
    model = _model("qwen2")
    gen = bh.llm.from_hf(model, max_length=MAX_LENGTH)
    spec = gen.spec
    width = (spec.heads + 2 * spec.kv_heads) * spec.head_dim
    (region,) = bh.codegen.region_modules(gen._executable)
    graph_doc = json.loads(str(region["get_graph_json"]()))
    qkv = [n for n in graph_doc["nodes"] if n["op"] == "dense"
           and graph_doc["tensors"][n["output"]]["shape"][-1] == width]
    assert len(qkv) == COMMON["num_hidden_layers"] and all(n["attrs"]["has_bias"] == 1 for n in qkv), qkv
    tokens = np.random.default_rng(67).integers(0, VOCAB, (1, MAX_LENGTH)).astype("int64")
    with torch.no_grad():
        want = model(torch.tensor(tokens)).logits.numpy()[0]
    monkeypatch.setenv(combine.BIASES_VARIABLE, "0")
    separate = bh.llm.from_hf(model, max_length=MAX_LENGTH)
    for rows in (67, 7):
        got = {}
        for name, g in (("combined", gen), ("separate", separate)):
            cache = g.new_cache(1)
            got[name] = [g.step(tokens[:, :rows], np.array([0]), np.array([rows]), cache)[0].copy()]
            got[name] += [g.step(tokens[:, p:p + 1], np.array([p]), np.array([1]), cache)[0].copy()
                          for p in range(rows, rows + 5)]
        errors = [_rel(logits, want[p]) for logits, p in zip(got["combined"], range(rows - 1, rows + 5))]
        assert max(errors) < 1e-4, (rows, errors)
        np.testing.assert_array_equal(np.stack(got["combined"]), np.stack(got["separate"]))
    prompt = tokens[:, :7]
    np.testing.assert_array_equal(gen.generate(prompt, max_new_tokens=24),
                                  _hf_generate(model, prompt, 24, eos_token_id=None))


def test_runtime_weight_is_not_combined():
    """Weights that are parameters (not bound): nothing to concatenate at bind time, the module
    is returned unchanged."""
    def body(emit, x, w1, w2):
        return emit(R.concat([emit(R.matmul(x, w1)), emit(R.matmul(x, w2))], axis=-1))

    mod = graph({"x": (SEQ, HIDDEN), "w1": (HIDDEN, 8), "w2": (HIDDEN, 8)}, body)
    assert passes.combine_parallel_denses(mod).same_as(mod)


@pytest.mark.parametrize("path", ["from_torch", "from_onnx"])
def test_llama_decoder_projections_combined_and_match_torch(path, tmp_path):
    """The small Llama decoder (2 layers) through both import paths: per layer Q, K and V are one
    dense (5 dense nodes per layer instead of 7: QKV, O, gate, up, down), one region, output within
    1e-4 of torch."""
    zm, mod, params, want = small_llama(path, tmp_path)
    part = bh.partition(mod, params)
    assert len(bh.report(part).regions) == 1
    ex = build(part)
    got = relax.VirtualMachine(ex, __import__("tvm").cpu())["main"](
        *[__import__("tvm").runtime.tensor(x.numpy()) for x in zm.inputs]).numpy()
    assert float(np.max(np.abs(got - want)) / np.max(np.abs(want))) < 1e-4
    assert len(_dense_nodes(ex)) == 2 * 5


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [6, 64])
@pytest.mark.parametrize("layout", ["KN", "NK"])
def test_constant_weight_dense_runs_as_inner_product(layout, rows, threads):
    """A float32 dense on a constant weight (either layout) with a residual add runs as oneDNN's
    brgemm inner product where the CPU has one (AVX-512 here; else the matmul), and equals the
    llvm build.  Fewer than 64 rows keep the matmul (dense.cc's kInnerProductMinRows), and so
    does a module planned for one thread (where the matmul was measured faster)."""
    import tvm

    saved = _C.num_threads()
    _C.set_num_threads(threads)  # modules created from now on plan for this many threads
    try:
        impl = _dense_impl(layout, rows)
    finally:
        _C.set_num_threads(saved)
    if _C.isa().startswith("avx512_core"):
        # inner product: "brgemm:..."; the matmul's brgemm is "brg:..."
        assert impl.startswith("brgemm:" if rows >= 64 and threads >= 2 else "brg:"), impl


def test_dense_ip_off_keeps_the_matmul(monkeypatch):
    """BYOC_HETERO_DENSE_IP=off (read when the plan is made): a dense of 64 rows planned for 2 threads, which
    takes the inner product by default, runs oneDNN's matmul, with the llvm build's result."""
    saved = _C.num_threads()
    _C.set_num_threads(2)
    monkeypatch.setenv("BYOC_HETERO_DENSE_IP", "off")
    try:
        impl = _dense_impl("NK", 64)
    finally:
        _C.set_num_threads(saved)
    if _C.isa().startswith("avx512_core"):
        assert impl.startswith("brg:"), impl  # the matmul's brgemm (the inner product's is "brgemm:")


def test_a_bad_dense_ip_variable_is_a_value_error_naming_it(monkeypatch):
    saved = _C.num_threads()
    _C.set_num_threads(2)
    monkeypatch.setenv("BYOC_HETERO_DENSE_IP", "matmul")
    try:
        with pytest.raises(Exception, match="BYOC_HETERO_DENSE_IP must be auto or off, got 'matmul'"):
            _dense_impl("NK", 64)
    finally:
        _C.set_num_threads(saved)


def _dense_impl(layout: str, rows: int) -> str:
    """Offload one dense + residual add, check it against llvm, run it and return its oneDNN impl."""
    import tvm

    w, r = _const(HIDDEN, 24) if layout == "KN" else _const(24, HIDDEN), _const(rows, 24)

    def body(emit, x):
        wt = emit(R.permute_dims(w, [1, 0])) if layout == "NK" else w
        return emit(R.add(emit(R.matmul(emit(R.reshape(x, (rows, HIDDEN))), wt)), r))

    res = offload_and_compare(graph({"x": (1, rows, HIDDEN)}, body))
    assert res.error < 1e-5, res.error
    ex = build(res.partitioned)
    regions = bh.codegen.region_modules(ex)
    for m in regions:
        m["set_profiling"](True)
    relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(RNG.standard_normal((1, rows, HIDDEN)).astype("float32")))
    impls = [s["impl"] for m in regions for s in json.loads(str(m["get_profile"]())) if s["phase"] == "run" and s["op"] == "dense"]
    assert len(impls) == 1, impls
    return impls[0]
