"""Symbolic shapes: one build serves every batch size and sequence length (issue 16).

References: ONNX Runtime on the same dynamic file, torch on the module; sizes several per model.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

import byoc_hetero as bh
from byoc_hetero import _C
from byoc_hetero._relax import region_modules, region_table
from byoc_hetero.timing import build, run

torch = pytest.importorskip("torch")
nn = torch.nn


class SmallCNN(nn.Module):
    """conv+bn+relu, strided conv, max pool, global average pool, dense."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.nn.functional.max_pool2d(torch.relu(self.c2(x)), 2)
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Layer(nn.Module):
    """One BERT-like encoder layer (hidden 64, 4 heads, feed-forward 128)."""

    def __init__(self, d=64, h=4, f=128):
        super().__init__()
        self.h, self.d = h, d
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x):
        b, s, _ = x.shape

        def heads(t):
            return t.reshape(b, s, self.h, self.d // self.h).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.d // self.h), -1) @ v
        x = self.ln1(x + self.o(a.transpose(1, 2).reshape(b, s, self.d)))
        return self.ln2(x + self.ff2(torch.nn.functional.gelu(self.ff1(x))))


class SmallBert(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _model(cls):
    torch.manual_seed(0)
    return cls().eval()


def _export_onnx(module, example, axes, path):
    torch.onnx.export(module, (example,), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": axes, "y": {0: axes[0]} | ({1: axes[1]} if 1 in axes else {})},
                      dynamo=False, opset_version=17)
    return path


def _symbols(mod) -> set[str]:
    return {s for entry in region_table(mod).values() for t in entry.graph["tensors"]
            for d in t["shape"] if isinstance(d, str) for s in [d]}


CNN_BATCHES = [(1, 3, 32, 32), (3, 3, 32, 32), (8, 3, 32, 32)]
BERT_SIZES = [(1, 7, 64), (3, 33, 64), (2, 128, 64)]


@pytest.fixture(scope="module")
def cnn_onnx(tmp_path_factory):
    path = tmp_path_factory.mktemp("sym") / "cnn.onnx"
    return _export_onnx(_model(SmallCNN), torch.randn(2, 3, 32, 32), {0: "N"}, path)


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory):
    path = tmp_path_factory.mktemp("sym") / "bert.onnx"
    return _export_onnx(_model(SmallBert), torch.randn(2, 16, 64), {0: "B", 1: "S"}, path)


def _check_onnx(path, sizes, symbols):
    ort = pytest.importorskip("onnxruntime")
    mod, params = bh.from_onnx(path)
    part = bh.partition(mod, params)
    assert len(region_table(part)) >= 1
    assert symbols <= _symbols(part), "the regions must keep the file's symbolic dims by name"
    report = str(bh.report(part))
    for s in symbols:
        assert re.search(rf"float32\[[^\]]*\b{s}\b", report), f"symbol {s} not shown by name"
    ex = build(part)
    sess = ort.InferenceSession(str(path))
    rng = np.random.default_rng(0)
    for shape in sizes:
        x = rng.standard_normal(shape).astype("float32")
        want = sess.run(None, {"x": x})[0]
        got = run(ex, [x])
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return part


def test_cnn_dynamic_batch_from_onnx(cnn_onnx):
    part = _check_onnx(cnn_onnx, CNN_BATCHES, {"N"})
    # the whole CNN is one region now (before: 0 regions, every op on llvm)
    assert sum(e.ops.total() for e in region_table(part).values()) >= 10


def test_bert_dynamic_batch_and_sequence_from_onnx(bert_onnx):
    part = _check_onnx(bert_onnx, BERT_SIZES, {"B", "S"})
    ops = sum((e.ops for e in region_table(part).values()), start=__import__("collections").Counter())
    assert ops["matmul"] >= 10  # the dense layers and the attention's batched matmuls
    # layer_norm (symbolic leading dims) and gelu's erf run symbolic dims too
    assert ops["nn.layer_norm"] == 4 and ops["erf"] == 2, ops
    # the whole model is one region, as a static build is (before: 5; the attention's head split
    # and merge, reshapes to [B, S, 4, 16] / [B, S, 64], stayed on llvm)
    report = bh.report(part)
    assert len(report.regions) == 1 and "llvm" not in report.profile.counts, str(report)


def test_from_torch_dynamic_shapes():
    cnn, bert = _model(SmallCNN), _model(SmallBert)
    n = torch.export.Dim("N", min=1, max=64)
    mod, params = bh.from_torch(cnn, (torch.randn(2, 3, 32, 32),), dynamic_shapes=({0: n},))
    part = bh.partition(mod, params)
    assert _symbols(part), "torch.export's dynamic dim must stay symbolic"
    ex = build(part)
    for shape in CNN_BATCHES:
        x = torch.randn(*shape)
        np.testing.assert_allclose(run(ex, [x.numpy()]), cnn(x).detach().numpy(), rtol=1e-4, atol=1e-4)

    b, s = torch.export.Dim("B", min=1, max=64), torch.export.Dim("S", min=2, max=512)
    mod, params = bh.from_torch(bert, (torch.randn(2, 16, 64),), dynamic_shapes=({0: b, 1: s},))
    part = bh.partition(mod, params)
    # one region (before: 5): the reshapes to [B, S, 4, 16] join it, torch.export's broadcast_to
    # before each batched matmul (its own shape) is dropped
    report = bh.report(part)
    assert len(report.regions) == 1 and "llvm" not in report.profile.counts, str(report)
    # the attention's matmuls over [B * 4, S, 16] run on [B, 4, S, 16]: the permutes behind the
    # merges are read through strides, only the head merge (one per layer) stays a copy
    (entry,) = region_table(part).values()
    assert [n["op"] for n in entry.graph["nodes"]].count("permute") == 2, entry.graph["nodes"]
    ex = build(part)
    for shape in BERT_SIZES:
        x = torch.randn(*shape)
        np.testing.assert_allclose(run(ex, [x.numpy()]), bert(x).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_symbolic_build_matches_static_build(cnn_onnx):
    """The symbolic module gives the numbers of a static build of each size."""
    mod, params = bh.from_onnx(cnn_onnx)
    ex = build(bh.partition(mod, params))
    x = np.random.default_rng(1).standard_normal((3, 3, 32, 32)).astype("float32")
    smod, sparams = bh.from_onnx(cnn_onnx, shape={"x": [3, 3, 32, 32]})
    static = run(build(bh.partition(smod, sparams)), [x])
    np.testing.assert_allclose(run(ex, [x]), static, rtol=1e-5, atol=1e-6)


@pytest.fixture
def one_thread_count():
    """Calls run with the module's own thread count: the contention adaptation (threading.h) would
    otherwise send some calls to plans for fewer threads, each with a plan cache of its own."""
    saved = _C.thread_adaptation()
    _C.set_thread_adaptation("off")
    yield
    _C.set_thread_adaptation(saved)


def test_plan_cache_is_bounded_and_lru(cnn_onnx, one_thread_count):
    mod, params = bh.from_onnx(cnn_onnx)
    ex = build(bh.partition(mod, params))
    vm_mods = region_modules(ex)
    assert len(vm_mods) == 1
    info = lambda: json.loads(vm_mods[0]["get_runtime_info"]())  # noqa: E731
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(cnn_onnx))
    saved = _C.plan_cache_limit()
    assert saved >= 1
    try:
        _C.set_plan_cache_limit(2)
        rng = np.random.default_rng(2)
        batches = [1, 2, 3, 4, 5, 1]
        for i, n in enumerate(batches):
            x = rng.standard_normal((n, 3, 32, 32)).astype("float32")
            np.testing.assert_allclose(run(ex, [x]), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
            assert info()["plans"] <= 2
        # batch 1 was evicted by 3, 4, 5 and planned again
        assert info()["plans_made"] == len(batches)
        assert info()["symbols"] == ["N"]
        assert info()["bindings"] == [[1], [5]]
        # a cached binding is not planned again
        run(ex, [np.zeros((5, 3, 32, 32), "float32")])
        assert info()["plans_made"] == len(batches)
        with pytest.raises(ValueError):
            _C.set_plan_cache_limit(0)
    finally:
        _C.set_plan_cache_limit(saved)


def _region_module(cnn_onnx):
    mod, params = bh.from_onnx(cnn_onnx)
    part = bh.partition(mod, params)
    (entry,) = region_table(part).values()
    ex = build(part)
    (module,) = region_modules(ex)
    return module, entry


def test_bad_shapes_are_input_errors(cnn_onnx):
    import tvm

    import tvm_ffi

    module, entry = _region_module(cnn_onnx)
    region = module[entry.symbol]

    def f(*tensors):
        # the VM passes the reshape's symbolic target shape too (the region's "shape_args")
        args = list(tensors)
        for pos in entry.graph.get("shape_args", []):
            args.insert(pos, tvm_ffi.Shape((1, 1)))
        return region(*args)

    t = lambda *s: tvm.runtime.tensor(np.zeros(s, "float32"))  # noqa: E731
    with pytest.raises(bh.InputError, match=r"expected rank 4"):
        f(t(2, 3, 32), t(2, 10))
    with pytest.raises(bh.InputError, match=r"symbol N.*bound to 2"):
        f(t(2, 3, 32, 32), t(3, 10))
    with pytest.raises(bh.InputError, match=r"dim 1 should be 3"):
        f(t(2, 4, 32, 32), t(2, 10))
    with pytest.raises(ValueError, match=r"dtype float32"):
        f(tvm.runtime.tensor(np.zeros((2, 3, 32, 32), "float64")), t(2, 10))
    # a shape whose tensors cannot fit in memory is refused before anything is allocated
    graph = json.dumps(entry.graph)
    with pytest.raises(bh.InputError, match=r"cannot hold them"):
        _C.plan_region(graph, [[1 << 40, 3, 32, 32]])
    with pytest.raises(bh.InputError, match=r"expected rank 4"):
        _C.plan_region(graph, [[1, 3, 32]])


def _doc(shape_in, shape_out, version=2):
    return json.dumps({
        "format": "byoc_hetero.region", "version": version, "symbol": "sym_test",
        "tensors": [{"shape": shape_in, "dtype": "float32"}, {"shape": shape_out, "dtype": "float32"}],
        "inputs": [0], "outputs": [1],
        "nodes": [{"op": "eltwise", "inputs": [0], "output": 1, "attrs": {"algorithm": "relu"}}],
    })


def test_dim_expressions_are_parsed_strictly():
    assert _C.validate(_doc(["N", 8], ["N", "(4 * 2)"])) == "sym_test"
    plan = _C.plan_region(_doc(["N", 8], ["N", "(2 * N + 16) // 2 - N"]), [[5, 8]])
    assert plan["output_shapes"] == [[5, 8]]
    for bad, what in [(["N", "N +"], "ill-formed"), (["N", "N % 2"], "ill-formed"),
                      (["N", "-1"], "ill-formed"), (["N", "N**2"], "ill-formed"),
                      (["N", "M + 1"], "unknown symbol 'M'")]:
        with pytest.raises(ValueError, match=rf"sym_test.*tensors.*{what}"):
            _C.validate(_doc(["N", 8], bad))
    with pytest.raises(ValueError, match=r"needs version 2"):
        _C.validate(_doc(["N", 8], ["N", 8], version=1))
    # the kernel's own check catches an expression that does not match what the op computes
    with pytest.raises(ValueError, match=r"declared with shape \[6, 8\] but the op produces \[5, 8\]"):
        _C.plan_region(_doc(["N", 8], ["N + 1", 8]), [[5, 8]])


def test_a_bound_plan_keeps_the_requested_thread_count():
    """Regression: the plan made at a binding of a symbolic region got the thread count in another
    field (a positional initializer after a field was added) and a narrowed byte limit as its
    thread count."""
    for threads in (1, 2):
        plan = _C.plan_region(_doc(["N", 8], ["N", 8]), [[3, 8]], threads=threads)
        assert plan["threads"] == threads and plan["output_shapes"] == [[3, 8]]


def test_ops_that_need_static_dims_stay_on_llvm_with_their_reason():
    import tvm
    from tvm import relax

    n, h = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("h", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, 16, h, h], "float32"))
    wv = np.random.default_rng(0).standard_normal((16, 16, 3, 3)).astype("float32")
    w = relax.const(wv)
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1]))
            z = bb.emit(relax.op.nn.adaptive_avg_pool2d(y, [2, 2]))
            gv = bb.emit_output(z)
        bb.emit_func_output(gv)
    part = bh.partition(bb.get())
    report = str(bh.report(part))
    assert "adaptive_avg_pool2d" in report and "symbolic spatial dims" in report
    # the conv with a symbolic batch and spatial size is offloaded
    (entry,) = region_table(part).values()
    assert entry.ops["nn.conv2d"] == 1
    ex = build(part)
    for size in (8, 12):
        xv = np.random.default_rng(size).standard_normal((2, 16, size, size)).astype("float32")
        want = torch.nn.functional.adaptive_avg_pool2d(
            torch.nn.functional.conv2d(torch.from_numpy(xv), torch.from_numpy(wv), padding=1), 2)
        np.testing.assert_allclose(run(ex, [xv]), want.numpy(), rtol=1e-4, atol=1e-4)


def _hf_bert():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, vocab_size=100, max_position_embeddings=512)
    torch.manual_seed(0)
    bert = transformers.BertModel(cfg).eval()

    class Embeds(nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, x):
            return self.bert(inputs_embeds=x).last_hidden_state

    return Embeds().eval()


def test_transformers_bert_with_dynamic_batch_and_sequence_offloads():
    """Regression: a transformers BertModel exported with dynamic batch and sequence made TVM's
    MergeCompositeFunctions fail ("Could not find memo-ized group for expression of type ir.Var":
    the bare symbolic ``s27`` of ``R.arange(0, s27, 1)``), so everything stayed on llvm; and its
    position-embedding slice clipped to ``min(S, 512)`` left shapes unknown, which TVM cannot even
    build. Now its dense layers and attention matmuls are offloaded and it matches torch at
    several sizes, one build."""
    model = _hf_bert()
    b, s = torch.export.Dim("B", min=1, max=64), torch.export.Dim("S", min=2, max=512)
    mod, params = bh.from_torch(model, (torch.randn(2, 16, 64),), dynamic_shapes=({0: b, 1: s},))
    part = bh.partition(mod, params)
    report = bh.report(part)
    assert "cannot group the composites" not in str(report)  # the whole function on llvm, as before
    ops = sum((e.ops for e in region_table(part).values()), start=__import__("collections").Counter())
    assert ops["matmul"] >= 12, ops  # 6 dense layers and 2 attention matmuls per layer
    # every float32 relabel and permute (the attention's head split and merge) is offloaded (13
    # regions before); torch.export's broadcast of the attention output dense's weight to
    # [B, 64, 64] is dropped (stages.py); each attention's _safe_softmax chain (int8 / logical_not
    # ops between two regions: 3 regions before) is one softmax node (ops/softmax.py)
    stayed = [f for f in report.fallbacks
              if f.op in ("reshape", "permute_dims", "broadcast_to") and "float32" in f.value]
    assert not stayed, stayed
    assert len(report.regions) == 1, str(report)
    assert ops["nn.softmax"] == 2 and not [f for f in report.fallbacks if f.op in ("logical_not", "max", "full_like")]
    ex = build(part)
    for shape in [(1, 7, 64), (3, 33, 64), (2, 128, 64)]:
        x = torch.randn(*shape)
        np.testing.assert_allclose(run(ex, [x.numpy()]), model(x).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_merge_composite_functions_with_a_bare_symbolic_argument():
    """TVM's pass alone fails on a call that takes a symbolic var bare (``arange(0, n)``) next to a
    composite; partition groups the composite and leaves the call as it was."""
    import tvm
    from tvm import relax

    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, 16], "float32"))
    wv = np.random.default_rng(0).standard_normal((16, 16)).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(wv)))
            r = bb.emit(relax.op.arange(relax.prim_value(0) if False else 0, n, 1, dtype="float32"))
            z = bb.emit(relax.op.add(y, relax.op.expand_dims(r, [1])))
            gv = bb.emit_output(z)
        bb.emit_func_output(gv)
    mod = bb.get()
    part = bh.partition(mod)
    assert region_table(part), str(bh.report(part))
    ex = build(part)
    for rows in (3, 9):
        xv = np.random.default_rng(rows).standard_normal((rows, 16)).astype("float32")
        want = xv @ wv + np.arange(rows, dtype="float32")[:, None]
        np.testing.assert_allclose(run(ex, [xv]), want, rtol=1e-4, atol=1e-4)


def test_head_split_to_a_symbolic_shape_joins_its_region():
    """A reshape to [n, s, 4, 16] and torch.export's broadcast_to to a tensor's own symbolic shape
    join the dense's region. Lifting the rule that kept such reshapes on llvm alone broke
    partition: a broadcast_to composite's result type named its shape parameter, which inlining
    the composite back into main (the cost gate: the sin splits it off) left undefined, and TVM's
    MergeCompositeFunctions failed ("memo_.count")."""
    import tvm
    from tvm import relax

    n, s = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("s", "int64")
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((64, 64)).astype("float32"), rng.standard_normal((16, 8)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, s, 64], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, relax.const(w1)))
            h = bb.emit(relax.op.reshape(h, relax.ShapeExpr([n, s, 4, 16])))
            h = bb.emit(relax.op.permute_dims(h, [0, 2, 1, 3]))
            h = bb.emit(relax.op.broadcast_to(h, relax.ShapeExpr([n, 4, s, 16])))
            h = bb.emit(relax.op.sin(h))  # stays on llvm
            gv = bb.emit_output(relax.op.matmul(h, relax.const(w2)))
        bb.emit_func_output(gv)
    part = bh.partition(bb.get())
    report = bh.report(part)
    assert [f.op for f in report.fallbacks] == ["sin"], str(report)
    assert report.regions[0].ops["reshape"] == 1 and report.regions[0].ops["permute_dims"] == 1
    # the target shape is bound inside its composite: the region takes no shape argument
    assert all("shape_args" not in e.graph for e in region_table(part).values())
    ex = build(part)
    for shape in [(1, 3, 64), (2, 5, 64)]:
        xv = rng.standard_normal(shape).astype("float32")
        heads = (xv @ w1).reshape(shape[0], shape[1], 4, 16).transpose(0, 2, 1, 3)
        np.testing.assert_allclose(run(ex, [xv]), np.sin(heads) @ w2, rtol=1e-4, atol=1e-4)


def test_reshape_whose_symbols_only_a_product_gives():
    """[n * m, 8] -> [n, m, 8]: the composite's tensor cannot define n and m, so the target shape
    stays an argument of the composite, and the region (whose input [n, m, 16] defines them) binds
    it inside: the VM passes no shape (``shape_args``). The size check proves n * m * 8 equal."""
    import tvm
    from tvm import relax

    n, m = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("m", "int64")
    rng = np.random.default_rng(1)
    w1, w2 = rng.standard_normal((16, 8)).astype("float32"), rng.standard_normal((8, 4)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, m, 16], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(bb.emit(relax.op.reshape(x, relax.ShapeExpr([n * m, 16]))),
                                        relax.const(w1)))
            h = bb.emit(relax.op.reshape(h, relax.ShapeExpr([n, m, 8])))
            h = bb.emit(relax.op.permute_dims(h, [1, 0, 2]))
            gv = bb.emit_output(relax.op.matmul(h, relax.const(w2)))
        bb.emit_func_output(gv)
    part = bh.partition(bb.get())
    report = bh.report(part)
    assert len(report.regions) == 1 and not report.fallbacks, str(report)
    (entry,) = region_table(part).values()
    assert "shape_args" not in entry.graph and entry.ops["reshape"] == 2
    ex = build(part)
    for shape in [(1, 3, 16), (4, 5, 16)]:
        xv = rng.standard_normal(shape).astype("float32")
        want = (xv.reshape(-1, 16) @ w1).reshape(shape[0], shape[1], 8).transpose(1, 0, 2) @ w2
        np.testing.assert_allclose(run(ex, [xv]), want, rtol=1e-4, atol=1e-4)


def test_merge_failure_names_the_variable():
    """A function that reads a variable nothing in it defines (on which TVM's MergeCompositeFunctions
    says only "memo_.count") is refused with an error naming the function and the variable."""
    import importlib

    import tvm
    from tvm import relax

    from byoc_hetero._relax import updated

    stages = importlib.import_module("byoc_hetero.stages")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 16], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(np.ones((16, 16), "float32"))))
            gv = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(gv)
    mod = bb.get()
    for stage in stages.stages()[:2]:
        mod = stage(mod)
    main = mod["main"]
    (binding,) = main.body.blocks[0].bindings  # gv = the dense+relu composite(x)
    stray = relax.Var("stray", relax.TensorType([4, 16], "float32"))
    call = relax.Call(binding.value.op, [stray], ret_ty=binding.value.ty)
    broken = relax.Function(main.params, relax.SeqExpr([relax.DataflowBlock([relax.VarBinding(binding.var, call)])],
                                                       main.body.body), main.ret_ty, main.is_pure, main.attrs)
    mod = updated(mod, {mod.get_global_var("main"): broken})
    # the stages never make such a function; given one, the stage says which variable, before TVM's
    # MergeCompositeFunctions fails with only "memo_.count" (it used to retry on that message)
    with pytest.raises(bh.CodegenError, match="main reads stray, which nothing in it defines"):
        stages.merge_compiler_regions()(mod)


@pytest.mark.parametrize("end", ["llvm", "region"])
def test_region_that_sees_symbols_only_as_a_product(end):
    """A dense after a flattening reshape and an op left on llvm sees [n * m, 16] only.
    end="llvm": the region is [n * m, 16] -> [n * m, 8]; the product is bound as a symbol of its own
    (before: "unknown symbol 'n'", a failed codegen). end="region": the reshape back to [n, m, 8]
    joins the region, whose output binds n and m (the plan is made from the outputs' shapes too)."""
    import tvm
    from tvm import relax

    n, m = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("m", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, m, 16], "float32"))
    wv = np.random.default_rng(0).standard_normal((16, 8)).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            flat = bb.emit(relax.op.sin(relax.op.reshape(x, relax.ShapeExpr([n * m, 16]))))  # sin: llvm
            y = bb.emit(relax.op.nn.relu(relax.op.matmul(flat, relax.const(wv))))
            if end == "llvm":
                y = bb.emit(relax.op.sin(y))
            gv = bb.emit_output(relax.op.reshape(y, relax.ShapeExpr([n, m, 8])))
        bb.emit_func_output(gv)
    part = bh.partition(bb.get())
    (entry,) = region_table(part).values()
    if end == "llvm":
        assert "n_x_m" in _symbols(part), (_symbols(part), str(bh.report(part)))
    else:
        assert {"n", "m"} <= _symbols(part) and entry.ops["reshape"] == 1, str(bh.report(part))
        assert entry.graph["tensors"][entry.graph["outputs"][0]]["shape"] == ["n", "m", 8]
        # the region's input [n * m, 16] cannot define n and m: the VM passes them as shapes
        assert entry.graph["shape_args"], entry.graph
    ex = build(part)
    for shape in [(1, 3, 16), (4, 5, 16)]:
        xv = np.random.default_rng(shape[1]).standard_normal(shape).astype("float32")
        want = np.maximum(np.sin(xv) @ wv, 0)
        if end == "llvm":
            want = np.sin(want)
        np.testing.assert_allclose(run(ex, [xv]), want.reshape(shape[0], shape[1], 8), rtol=1e-4, atol=1e-4)


def test_opaque_dims():
    from byoc_hetero._relax import opaque_dims

    # the boundary sees B and S only as B * S: the product becomes a symbol of its own
    assert opaque_dims([("B * S", 64), ("B * S", 128)], [("B * S", 64)]) == ({"B * S": "B_x_S"}, None)
    assert opaque_dims([("N", 3)], [("N * 2", 3)]) == ({}, None)  # N is bound: nothing to do
    # an intermediate needs B itself: no exact rewrite, the region cannot run (the cost gate keeps it)
    names, reason = opaque_dims([("B * S", 64)], [("B", "S", 64)])
    assert names == {} and "symbol B is no dim of its own" in reason and "B * S" in reason


def test_cli_on_a_dynamic_file(cnn_onnx, tmp_path):
    """report shows N by name; run and bench take the batch from the input file (each command run in this
    process: conftest.run_cli)."""
    from conftest import run_cli as cli

    ort = pytest.importorskip("onnxruntime")

    out = cli("report", cnn_onnx)
    assert out.returncode == 0, out.stderr
    assert "float32[N, 3, 32, 32]" in out.stdout
    x = np.random.default_rng(3).standard_normal((5, 3, 32, 32)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    out = cli("run", cnn_onnx, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy")
    assert out.returncode == 0, out.stderr
    want = ort.InferenceSession(str(cnn_onnx)).run(None, {"x": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-4)
    out = cli("bench", cnn_onnx, "--repeat", "2", "--input", tmp_path / "x.npy")
    assert out.returncode == 0, out.stderr
    assert "speed-up" in out.stdout
    out = cli("bench", cnn_onnx, "--repeat", "2")  # no input: the symbolic dim is picked, and said so
    assert out.returncode == 0 and "note: symbolic dims timed at N=" in out.stderr, out.stderr
    np.save(tmp_path / "bad.npy", x[:, :, :, :8])
    out = cli("run", cnn_onnx, "--input", tmp_path / "bad.npy")
    assert out.returncode == 2 and "expected shape [N, 3, 32, 32]" in out.stderr


def test_threads_at_different_shapes_share_one_module(cnn_onnx, one_thread_count):
    """Calls at several shapes from several threads at once, with fewer cached plans than shapes:
    plans are made, evicted and remade under contention, and every answer stays right."""
    import threading

    import tvm
    from tvm import relax

    ort = pytest.importorskip("onnxruntime")
    mod, params = bh.from_onnx(cnn_onnx)
    ex = build(bh.partition(mod, params))
    sess = ort.InferenceSession(str(cnn_onnx))
    rng = np.random.default_rng(4)
    xs = {n: rng.standard_normal((n, 3, 32, 32)).astype("float32") for n in (1, 2, 3, 4)}
    want = {n: sess.run(None, {"x": x})[0] for n, x in xs.items()}
    # one VM per thread (a VM is not thread-safe), all on one executable: one region module
    vms = [relax.VirtualMachine(ex, tvm.cpu()) for _ in range(3)]
    errors = []
    saved = _C.plan_cache_limit()

    def work(vm, order):
        try:
            for n in order * 3:
                got = vm["main"](tvm.runtime.tensor(xs[n])).numpy()
                np.testing.assert_allclose(got, want[n], rtol=1e-4, atol=1e-4)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    try:
        _C.set_plan_cache_limit(2)
        orders = ([1, 2, 3, 4], [4, 3, 2, 1], [2, 4, 1, 3])
        threads = [threading.Thread(target=work, args=(vm, o)) for vm, o in zip(vms, orders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        _C.set_plan_cache_limit(saved)
    assert not errors, errors[0]
    (module,) = region_modules(ex)
    assert json.loads(module["get_runtime_info"]())["plans"] <= 2


def test_contention_plans_of_a_symbolic_region(cnn_onnx):
    """Under contention a call runs a plan made for fewer threads (threading.h); for a symbolic
    region that plan is made per binding too, from the constants kept since __init_."""
    ort = pytest.importorskip("onnxruntime")
    saved = _C.thread_adaptation()
    try:
        _C.set_thread_adaptation("reduced")
        _C.reset_adaptation()
        mod, params = bh.from_onnx(cnn_onnx)
        ex = build(bh.partition(mod, params))
        sess = ort.InferenceSession(str(cnn_onnx))
        for n in (2, 5):
            x = np.random.default_rng(n).standard_normal((n, 3, 32, 32)).astype("float32")
            np.testing.assert_allclose(run(ex, [x]), sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
    finally:
        _C.set_thread_adaptation(saved)
        _C.reset_adaptation()


def test_declared_dim_ranges_are_checked(cnn_onnx, tmp_path):
    """A dim outside its declared range is an InputError naming the input, the dim, the range and
    the value: from_onnx(dim_ranges=...), torch.export's Dim(min, max), and a placement's VM
    (the ranges travel in the plan of an exported library)."""
    from byoc_hetero.inputs import check_inputs, dim_ranges

    mod, params = bh.from_onnx(cnn_onnx, dim_ranges={"N": (2, 4)})
    part = bh.partition(mod, params)
    assert dim_ranges(part["main"]) == {"N": (2, 4)}  # kept through partition
    check_inputs(part, [np.zeros((3, 3, 32, 32), "float32")], params)
    for n, side in ((5, "4"), (1, "2")):
        with pytest.raises(bh.InputError, match=rf"input 0 \('x'\): dim 0 \(N\) is {n}, outside its declared "
                                                rf"range \[2, 4\]"):
            check_inputs(part, [np.zeros((n, 3, 32, 32), "float32")], params)
    # open ends
    mod, _ = bh.from_onnx(cnn_onnx, dim_ranges={"N": (None, 8)})
    assert dim_ranges(mod["main"]) == {"N": (None, 8)}
    with pytest.raises(bh.InputError, match=r"is 9, outside its declared range \[\.\.\., 8\]"):
        check_inputs(mod, [np.zeros((9, 3, 32, 32), "float32")], params)
    for bad, what in (({"M": (1, 2)}, "no symbolic dim"), ({"N": (0, 2)}, "1 <= min <= max"),
                      ({"N": (3, 2)}, "1 <= min <= max"), ({"N": 3}, "pair"), ({"N": (1.5, 2)}, "ints")):
        with pytest.raises(bh.FrontendError, match=what):
            bh.from_onnx(cnn_onnx, dim_ranges=bad)

    # torch.export's declared Dim range
    n = torch.export.Dim("N", min=1, max=6)
    mod, params = bh.from_torch(_model(SmallCNN), (torch.randn(2, 3, 32, 32),), dynamic_shapes=({0: n},))
    check_inputs(mod, [np.zeros((6, 3, 32, 32), "float32")], params)
    with pytest.raises(bh.InputError, match=r"dim 0 \(\w+\) is 7, outside its declared range \[1, 6\]"):
        check_inputs(mod, [np.zeros((7, 3, 32, 32), "float32")], params)


def test_placement_vm_checks_declared_ranges(tmp_path):
    import tvm
    from tvm import relax

    from byoc_hetero.placement import compile, place, vm

    n = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType([n, 7], "float32"))
    with bb.function("main", [a]):
        with bb.dataflow():
            gv = bb.emit_output(relax.op.multiply(a, a))
        bb.emit_func_output(gv)
    mod = bb.get()
    mod["main"] = mod["main"].with_attr("tir_var_lower_bound", {"n": 1}).with_attr("tir_var_upper_bound", {"n": 4})
    path = str(tmp_path / "lib.so")
    compile(place(mod, {}, fallback="cpu:0")).export_library(path)
    machine = vm(tvm.runtime.load_module(path))
    x = np.full((4, 7), 2.0, "float32")
    np.testing.assert_allclose(machine["main"](x).numpy(), x * x)
    with pytest.raises(bh.InputError, match=r"main: input 0 \('a'\): dim 0 \(n\) is 5, outside its declared range"):
        machine["main"](np.zeros((5, 7), "float32"))


def test_plan_region_shape_errors_are_input_errors(cnn_onnx):
    """_C.plan_region raises InputError for every bad shape, as a region call does: a shape an op
    rejects at the binding (before: ValueError from plan_region, InputError from a call), a wrong
    number of shapes."""
    _, entry = _region_module(cnn_onnx)
    graph = json.dumps(entry.graph)
    assert _C.plan_region(graph, [[2, 3, 32, 32]])["output_shapes"][0][0] == 2
    with pytest.raises(bh.InputError, match=r"at N=5: .*declared with shape \[6, 8\] but the op produces"):
        _C.plan_region(_doc(["N", 8], ["N + 1", 8]), [[5, 8]])
    with pytest.raises(bh.InputError, match=r"needs the shapes of its 1 inputs, got 2"):
        _C.plan_region(graph, [[1, 3, 32, 32], [1, 3, 32, 32]])
    with pytest.raises(bh.InputError, match=r"needs the shapes of its 1 inputs, got 0"):
        _C.plan_region(graph)


def test_embedding_and_mask_ops_run_symbolic_dims():
    """take (an embedding lookup), comparisons, where and astype with a symbolic batch and
    sequence are offloaded (before: "symbolic or unknown shape", on llvm) and match numpy at
    several sizes."""
    import tvm
    from tvm import relax

    n, s = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("s", "int64")
    rng = np.random.default_rng(0)
    table = rng.standard_normal((10, 16)).astype("float32")
    wv = rng.standard_normal((16, 8)).astype("float32")
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType([n, s], "int64"))
    with bb.function("main", [ids]):
        with bb.dataflow():
            e = bb.emit(relax.op.take(relax.const(table), ids, axis=0))
            w = bb.emit(relax.op.where(relax.op.greater(e, relax.const(np.zeros(16, "float32"))), e,
                                       relax.const(np.full((1,), -1.0, "float32"))))
            f = bb.emit(relax.op.astype(ids, "float32"))
            m = bb.emit(relax.op.astype(relax.op.greater(f, relax.const(3.0, "float32")), "float32"))
            y = bb.emit(relax.op.multiply(relax.op.matmul(w, relax.const(wv)), relax.op.expand_dims(m, [2])))
            gv = bb.emit_output(y)
        bb.emit_func_output(gv)
    part = bh.partition(bb.get())
    ops = sum((e.ops for e in region_table(part).values()), start=__import__("collections").Counter())
    for op in ("take", "where", "greater", "astype"):
        assert ops[op] >= 1, (op, str(bh.report(part)))
    ex = build(part)
    for shape in [(1, 5), (3, 17)]:
        iv = rng.integers(0, 10, shape).astype("int64")
        ev = table[iv]
        want = (np.where(ev > 0, ev, -1.0) @ wv) * (iv > 3).astype("float32")[..., None]
        np.testing.assert_allclose(run(ex, [iv]), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("axis", [0, 1])
def test_take_of_an_activation_with_runtime_indices_runs_in_the_region(axis):
    """take of an activation (a decoder step's last-row gather: rows of ``reshape(h, [B * S, 16])``
    at runtime indices) with symbolic dims is a node of the region (before: "table has a symbolic
    shape", on llvm between two regions); it matches numpy at several bindings, and an index out of
    range raises InputError naming it."""
    import tvm
    from tvm import relax

    b, s = tvm.tirx.Var("B", "int64"), tvm.tirx.Var("S", "int64")
    rng = np.random.default_rng(1)
    w1, w2 = (rng.standard_normal((16, 16)).astype("float32") for _ in range(2))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([b, s, 16], "float32"))
    idx = relax.Var("idx", relax.TensorType([b], "int64"))
    with bb.function("main", [x, idx]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(relax.op.matmul(x, relax.const(w1))))
            table = bb.emit(relax.op.reshape(h, (b * s, 16)) if axis == 0 else relax.op.permute_dims(h, [0, 2, 1]))
            rows = bb.emit(relax.op.take(table, idx, axis=axis))
            gv = bb.emit_output(relax.op.matmul(rows, relax.const(w2)) if axis == 0 else rows)
        bb.emit_func_output(gv)
    part = bh.partition(bb.get())
    rep = bh.report(part)
    assert not rep.fallbacks and len(rep.regions) == 1, str(rep)
    assert rep.regions[0].ops["take"] == 1, str(rep)
    ex = build(part)
    for shape in [(1, 1), (3, 5)]:
        xv = rng.standard_normal((*shape, 16)).astype("float32")
        hv = np.maximum(xv @ w1, 0)
        extent = shape[0] * shape[1] if axis == 0 else 16
        iv = rng.integers(0, extent, shape[0]).astype("int64")
        want = hv.reshape(-1, 16)[iv] @ w2 if axis == 0 else hv.transpose(0, 2, 1)[:, iv]
        np.testing.assert_allclose(run(ex, [xv, iv]), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(bh.InputError, match=rf"\(take\): index {extent} at position 0 .*expected 0 <= index < {extent}"):
        run(ex, [xv, np.full(shape[0], extent, "int64")])


class FusedQkv(nn.Module):
    """GPT-2's attention input: one projection to 3 * 16, split along the (static) last axis."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).split(16, dim=-1)
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def test_split_along_a_static_axis_of_a_symbolic_tensor_joins_the_region():
    """[1, S, 48] split along its last axis: one slice node per part, planned per S (it stayed on llvm
    and cut GPT-2's dynamic-sequence ONNX file into 3 regions)."""
    model = _model(FusedQkv)
    s = torch.export.Dim("S", min=1, max=64)
    mod, params = bh.from_torch(model, (torch.randn(1, 8, 16),), dynamic_shapes=({1: s},))
    part = bh.partition(mod, params)
    report = bh.report(part)
    assert len(report.regions) == 1 and not report.fallbacks, report
    ex = build(part)
    for length in (3, 21):
        x = torch.randn(1, length, 16)
        with torch.no_grad():
            np.testing.assert_allclose(run(ex, [x.numpy()]), model(x).numpy(), rtol=1e-5, atol=1e-5)
