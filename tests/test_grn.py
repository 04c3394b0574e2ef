"""ConvNeXt-V2's Global Response Normalization (issue 39 item 7): its L2 norm over H, W of a
channels-last [N, H, W, C] tensor is a reduction over axes between kept ones, which oneDNN 3.2 runs
with its reference kernel only; the ``reduce`` kernel runs such sums and means as a host loop over
[outer, mid, inner] (cpp/kernels/reduce.cc, MiddleReduce). Checked against the llvm-only build on
reductions of several shapes, and on a small ConvNeXt-V2 through both import paths against torch.
The norm's abs before its square is dropped (region pass drop_abs_before_square), its square and
sum are one reduce of algorithm sum_square with activation sqrt (fuse_rms_statistics), and the tail
gamma * (x * Nx) + beta + x is one binary x * (gamma * Nx + 1) + beta with beta a post-op
(fuse_affine_tails): GRN reads x twice and writes once. Checked here against the llvm-only build,
numpy and torch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relax

import byoc_hetero as bh
from model_paths import PATHS, first_output, one_region

R = relax.op


def _vm(mod: tvm.IRModule):
    ex = relax.build(mod, target="llvm")
    return ex, relax.VirtualMachine(ex, tvm.cpu())


def _plan_lines(ex, word: str) -> list[str]:
    return [str(line) for m in bh.codegen.region_modules(ex) for line in m["get_plan"]() if word in str(line)]


@pytest.mark.parametrize(("shape", "axes", "op", "host"), [
    ((1, 7, 9, 40), [1, 2], "sum", True),      # GRN's norm: one chunk with a tail
    ((2, 5, 3, 150), [1, 2], "mean", True),    # several chunks per batch row, two batch rows
    ((3, 6, 4, 5), [1], "sum", True),          # one middle axis, a tiny inner run
    ((3, 6, 4, 21), [2, 3], "sum", True),      # trailing axes: the row loop, 16-lane tail
    ((3, 6, 4, 5), [0], "sum", True),          # a leading axis: outer 1
    ((2, 3, 4, 5), [1, 3], "sum", False),      # not one block of axes: oneDNN's reduction, scale 1
])
def test_reduction_over_middle_axes_matches_llvm(shape, axes, op, host):
    """sqrt(op(x * x)) as one reduce node (sum_square / mean_square with activation sqrt) wherever
    the reduced axes lie, equal to the llvm build and to float64 numpy."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            square = bb.emit(R.multiply(x, x))
            red = bb.emit(getattr(R, op)(square, axis=axes, keepdims=True))
            out = bb.emit_output(bb.emit(R.sqrt(red)))
        bb.emit_func_output(out)
    mod = bb.get()
    data = np.random.default_rng(len(shape) + shape[-1]).standard_normal(shape).astype("float32")
    _, ref = _vm(mod)
    want = ref["main"](tvm.runtime.tensor(data)).numpy()
    ex, vm = _vm(bh.partition(mod, require_heavy_op=False))
    assert bool(_plan_lines(ex, "(reduce) | host")) == host, _plan_lines(ex, "(reduce)")
    (graph,) = _graphs(ex)
    assert [(n["op"], n["attrs"].get("algorithm"), n["attrs"].get("activation")) for n in graph["nodes"]] == [
        ("reduce", op + "_square", "sqrt")], graph["nodes"]
    got = vm["main"](tvm.runtime.tensor(data)).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    exact = np.sqrt(getattr(np, op)(data.astype(np.float64) ** 2, axis=tuple(axes), keepdims=True))
    np.testing.assert_allclose(got, exact, rtol=2e-6)


def _graphs(ex) -> list[dict]:
    return [json.loads(m["get_graph_json"]()) for m in bh.codegen.region_modules(ex)]


def _full_size_nodes(graph: dict, shape) -> list[dict]:
    """The nodes that write a tensor of ``shape`` (a full pass over GRN's data)."""
    return [n for n in graph["nodes"] if graph["tensors"][n["output"]]["shape"] == list(shape)]


def _graph_ops(ex) -> list[str]:
    return [n["op"] + ":" + str(n.get("attrs", {}).get("algorithm", ""))
            for m in bh.codegen.region_modules(ex) for n in json.loads(m["get_graph_json"]())["nodes"]]


def grn_module(shape):
    """x -> abs -> square -> sum over H, W -> sqrt -> mean over C -> + eps -> Nx = Gx / (.) ->
    gamma * (x * Nx) + beta + x (GRN over channels-last data)."""
    c = shape[-1]
    rng = np.random.default_rng(7)
    gamma = relax.const(rng.standard_normal((1, 1, 1, c)).astype("float32"))
    beta = relax.const(rng.standard_normal((1, 1, 1, c)).astype("float32"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            g = bb.emit(R.sqrt(R.sum(bb.emit(R.square(bb.emit(R.abs(x)))), axis=[1, 2], keepdims=True)))
            mean = bb.emit(R.mean(g, axis=[3], keepdims=True))
            nx = bb.emit(R.divide(g, bb.emit(R.add(mean, relax.const(1e-6, "float32")))))
            y = bb.emit(R.multiply(x, nx))
            y = bb.emit(R.add(bb.emit(R.add(bb.emit(R.multiply(y, gamma)), beta)), x))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _grn_numpy(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    g = np.sqrt((x * x).sum(axis=(1, 2), keepdims=True))
    nx = g / (g.mean(axis=-1, keepdims=True) + 1e-6)
    return gamma * (x * nx) + beta + x


@pytest.mark.parametrize("shape", [(1, 7, 9, 40), (2, 3, 5, 24), (1, 6, 6, 17)])
def test_grn_reads_its_data_twice_and_writes_once(shape):
    """GRN over channels-last data (torch's vector_norm: abs, square, sum, sqrt; then the tail):
    the abs and the square are gone, x is read by two nodes only (the sum_square reduction and
    the tail's one binary, beta its addend), and only that binary writes a tensor of x's size.
    With a batch of 2 (Nx per image: [2, 1, 1, C], beta shared) beta is a second binary after it,
    where the post-op form runs oneDNN's reference kernel. The result equals the llvm-only
    build's and float64 numpy's."""
    mod = grn_module(shape)
    data = np.random.default_rng(shape[-1]).standard_normal(shape).astype("float32")
    _, ref = _vm(mod)
    want = ref["main"](tvm.runtime.tensor(data)).numpy()
    ex, vm = _vm(bh.partition(mod, require_heavy_op=False))
    (graph,) = _graphs(ex)
    x = graph["inputs"][0]
    readers = [(n["op"], n["attrs"].get("algorithm"), len(n["inputs"])) for n in graph["nodes"] if x in n["inputs"]]
    batch = shape[0]
    assert readers == [("reduce", "sum_square", 1), ("binary", "mul", 3 if batch == 1 else 2)], graph["nodes"]
    assert [n["op"] for n in _full_size_nodes(graph, shape)] == ["binary"] * (1 if batch == 1 else 2), graph["nodes"]
    assert "eltwise" not in [n["op"] for n in graph["nodes"]], graph["nodes"]
    got = vm["main"](tvm.runtime.tensor(data)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    rng = np.random.default_rng(7)  # grn_module's gamma and beta
    gamma, beta = (rng.standard_normal((1, 1, 1, shape[-1])).astype("float32") for _ in range(2))
    exact = _grn_numpy(data, gamma, beta)
    assert np.abs(got - exact).max() <= 1e-5 * np.abs(exact).max()


def _erf(v):
    import math
    return np.vectorize(math.erf)(v)


def _tail_module(shape, steps, r_shape, seed=3):
    """x * r (r a second input of ``r_shape``), then ``steps``: ("mul", c_shape), ("add", b_shape) of
    constants, ("add_x",) an add of x; also the numpy function computing it in float64."""
    rng = np.random.default_rng(seed)
    consts = [rng.standard_normal(step[1]).astype("float32") if len(step) > 1 else None for step in steps]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    r = relax.Var("r", relax.TensorType(r_shape, "float32"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            y = bb.emit(R.multiply(x, r))
            for step, c in zip(steps, consts):
                if step[0] == "add_x":
                    y = bb.emit(R.add(x, y))
                elif step[0] == "erf":
                    y = bb.emit(R.erf(y))
                else:
                    y = bb.emit({"mul": R.multiply, "add": R.add}[step[0]](y, relax.const(c)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)

    def numpy(xv, rv):
        xv = xv.astype(np.float64)
        yv = xv * rv
        for step, c in zip(steps, consts):
            yv = (yv + xv if step[0] == "add_x" else _erf(yv) if step[0] == "erf"
                  else yv * c if step[0] == "mul" else yv + c)
        return yv
    return bb.get(), numpy


TAILS = {  # name: (x shape, r shape, steps, full-size nodes left, declined)
    "grn": ((1, 5, 3, 24), (1, 1, 1, 24), [("mul", (1, 1, 1, 24)), ("add", (1, 1, 1, 24)), ("add_x",)], 1, None),
    "grn_batch2": ((2, 5, 3, 24), (2, 1, 1, 24), [("mul", (1, 1, 1, 24)), ("add", (1, 1, 1, 24)), ("add_x",)], 2,
                   None),
    "scale_shift": ((3, 20), (1, 20), [("add", (20,))], 1, None),
    "shift_then_scale": ((2, 4, 6), (1, 1, 6), [("add", (1,)), ("mul", (6,)), ("add", (1, 1, 6))], 1, None),
    "residual_twice": ((1, 3, 3, 8), (1, 1, 1, 8), [("mul", (8,)), ("add_x",), ("mul", (1,)), ("add_x",)], 1, None),
    "x_r_plus_x": ((1, 3, 3, 8), (1, 1, 1, 8), [("add_x",)], 2, "x * r + x before any multiply"),
    "channel_first_add": ((1, 8, 3, 3), (1, 8, 1, 1), [("add", (1, 8, 1, 1))], 2, "two steps (x * s, then + t)"),
    "channel_first_two": ((1, 8, 3, 3), (1, 8, 1, 1), [("mul", (8, 1, 1)), ("add", (1, 8, 1, 1)), ("add_x",)], 2, None),
    # a unary reader ends the chain (the fuzzer's attention draw once crashed the pass on it)
    "then_unary": ((1, 3, 3, 8), (1, 1, 1, 8), [("mul", (8,)), ("erf",)], 2, None),
}


@pytest.mark.parametrize("name", sorted(TAILS))
def test_affine_tail_is_one_binary_pass(name):
    """x * r with r broadcast, then multiplies / adds of broadcast constants and adds of x: one
    full-size binary (x * s + t, t its addend) where fuse_affine_tails takes the chain, the steps
    as they were, with the reason in bh.report, where it declines; equal to the llvm build and to
    float64 numpy either way."""
    shape, r_shape, steps, full_nodes, declined = TAILS[name]
    mod, numpy = _tail_module(shape, steps, r_shape)
    rng = np.random.default_rng(11)
    xv, rv = rng.standard_normal(shape).astype("float32"), rng.standard_normal(r_shape).astype("float32")
    _, ref = _vm(mod)
    want = ref["main"](tvm.runtime.tensor(xv), tvm.runtime.tensor(rv)).numpy()
    part = bh.partition(mod, require_heavy_op=False)
    ex, vm = _vm(part)
    (graph,) = _graphs(ex)
    assert len(_full_size_nodes(graph, shape)) == full_nodes, graph["nodes"]
    got = vm["main"](tvm.runtime.tensor(xv), tvm.runtime.tensor(rv)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    exact = numpy(xv, rv)
    assert np.abs(got - exact).max() <= 2e-6 * np.abs(exact).max()
    reasons = [r.reason for r in bh.report(part).rejections if r.rule == "onednn:fuse_affine_tails"]
    assert [declined in r for r in reasons] == ([True] if declined else []), reasons


def _binary_doc(shapes, attrs) -> str:
    n = len(shapes) - 1
    node = {"op": "binary", "inputs": list(range(n)), "output": n, "attrs": attrs}
    return json.dumps({"format": "byoc_hetero.region", "version": 1, "symbol": "t",
                       "tensors": [{"shape": list(s)} for s in shapes], "inputs": list(range(n)),
                       "outputs": [n], "nodes": [node]})


@pytest.mark.parametrize(("a", "b", "c", "algorithm", "activation"), [
    ((2, 3, 4, 5), (1, 1, 1, 5), (5,), "mul", "none"),          # GRN's form: per-last-axis addend
    ((2, 3, 4, 5), (1, 1, 1, 5), (2, 3, 4, 5), "mul", "relu"),  # a full-size addend, then relu
    ((1, 1, 1, 5), (2, 3, 4, 5), (1,), "sub", "none"),          # swapped sub: negation, shift, addend
    ((4, 7), (4, 1), (4, 7), "div", "none"),
    ((4, 7), (1, 7), None, "add", "tanh"),                       # shift only
])
def test_binary_node_shift_and_addend_against_numpy(a, b, c, algorithm, activation):
    """The runtime's binary with its shift and addend: act(a op b + shift + addend), as numpy."""
    create = tvm.get_global_func("byoc_hetero.runtime.create")
    out = np.broadcast_shapes(a, b)
    shapes = [a, b] + ([c] if c else []) + [out]
    m = create(_binary_doc(shapes, {"algorithm": algorithm, "shift": 0.75, "activation": activation}))
    rng = np.random.default_rng(5)
    args = [rng.standard_normal(s).astype("float32") + (3 if algorithm == "div" and k == 1 else 0)
            for k, s in enumerate(shapes[:-1])]
    y = tvm.runtime.tensor(np.zeros(out, "float32"))
    m["t"](*[tvm.runtime.tensor(v) for v in args], y)
    op = {"mul": np.multiply, "sub": np.subtract, "div": np.divide, "add": np.add}[algorithm]
    want = op(args[0], args[1]) + np.float32(0.75) + (args[2] if c else 0)
    want = {"none": want, "relu": np.maximum(want, 0), "tanh": np.tanh(want)}[activation]
    np.testing.assert_allclose(y.numpy(), want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize(("shapes", "attrs", "match"), [
    ([(2, 3, 4, 5), (1, 1, 1, 5), (3,), (2, 3, 4, 5)], {"algorithm": "mul"},
     r"addend \(input 2\) of shape \[3\] does not broadcast to the output shape \[2, 3, 4, 5\]"),
    ([(2, 5), (1, 5), (2, 5), (2, 5), (2, 5)], {"algorithm": "mul"}, "a, b.*addend"),
])
def test_binary_node_rejects_a_bad_addend(shapes, attrs, match):
    """An addend that does not broadcast to the output, a fourth input: a clear error naming them
    when the module is created."""
    create = tvm.get_global_func("byoc_hetero.runtime.create")
    with pytest.raises(Exception, match=match):
        create(_binary_doc(shapes, attrs))


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def convnextv2_model(**config):
    """transformers' ConvNextV2Model of ``config`` (its first output), seeded, with GRN's gamma and
    beta drawn N(0, 0.5): they start at 0, where GRN is the identity. bench/grn_ab.py uses it too."""
    import torch
    import transformers

    torch.manual_seed(0)
    model = first_output(transformers.ConvNextV2Model(transformers.ConvNextV2Config(**config)).eval(),
                         return_dict=False)
    for m in model.modules():
        if type(m).__name__ == "ConvNextV2GRN":
            torch.nn.init.normal_(m.weight, std=0.5)
            torch.nn.init.normal_(m.bias, std=0.5)
    return model


@pytest.fixture(scope="module")
def convnextv2():
    model = convnextv2_model(num_channels=3, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        want = model(x).numpy()
    return model, x, want


@pytest.mark.parametrize("path", PATHS[:2])
def test_convnextv2_grn_runs_no_reference_reduction(convnextv2, path, tmp_path):
    model, x, want = convnextv2
    ex, vm = _vm(one_region(model, (x,), path, tmp_path))
    reductions = _plan_lines(ex, "(reduce)")
    assert len(_plan_lines(ex, "(reduce) | host")) == 4  # one GRN norm per stage
    assert not [line for line in reductions if "| ref" in line], reductions
    ops = _graph_ops(ex)
    assert "eltwise:abs" not in ops and "eltwise:square" not in ops, ops  # the norm is one reduce
    assert ops.count("reduce:sum_square") == 4, ops
    (graph,) = _graphs(ex)
    tails = [n for n in graph["nodes"] if n["op"] == "binary" and len(n["inputs"]) == 3]
    assert len(tails) == 4, graph["nodes"]  # each GRN's tail: one pass, beta its addend
    got = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
