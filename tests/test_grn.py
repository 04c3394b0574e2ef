"""ConvNeXt-V2's Global Response Normalization (issue 39 item 7): its L2 norm over H, W of a
channels-last [N, H, W, C] tensor is a reduction over axes between kept ones, which oneDNN 3.2 runs
with its reference kernel only; the ``reduce`` kernel runs such sums and means as a host loop over
[outer, mid, inner] (cpp/kernels/reduce.cc, MiddleReduce). Checked against the llvm-only build on
reductions of several shapes, and on a small ConvNeXt-V2 through both import paths against torch.
The norm's abs before its square is dropped (region pass drop_abs_before_square), checked here
against the llvm-only build and torch."""

from __future__ import annotations

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


@pytest.mark.parametrize(("shape", "axes", "op"), [
    ((1, 7, 9, 40), [1, 2], "sum"),      # GRN's norm: one chunk with a tail
    ((2, 5, 3, 150), [1, 2], "mean"),    # several chunks per batch row, two batch rows
    ((3, 6, 4, 5), [1], "sum"),          # one middle axis, a tiny inner run
])
def test_reduction_over_middle_axes_matches_llvm(shape, axes, op):
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
    assert _plan_lines(ex, "(reduce) | host"), "the reduction did not run as the host loop"
    got = vm["main"](tvm.runtime.tensor(data)).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    exact = np.sqrt(getattr(np, op)(data.astype(np.float64) ** 2, axis=tuple(axes), keepdims=True))
    np.testing.assert_allclose(got, exact, rtol=2e-6)


def _graph_ops(ex) -> list[str]:
    import json

    return [n["op"] + ":" + str(n.get("attrs", {}).get("algorithm", ""))
            for m in bh.codegen.region_modules(ex) for n in json.loads(m["get_graph_json"]())["nodes"]]


def _grn_module(shape):
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


@pytest.mark.parametrize("shape", [(1, 7, 9, 40), (2, 3, 5, 24)])
def test_grn_norm_drops_abs(shape):
    """GRN over channels-last data (torch's vector_norm: abs, square, sum, sqrt): the abs step is
    gone (square(abs(x)) reads x), the result equals the llvm-only build's."""
    mod = _grn_module(shape)
    data = np.random.default_rng(shape[-1]).standard_normal(shape).astype("float32")
    _, ref = _vm(mod)
    want = ref["main"](tvm.runtime.tensor(data)).numpy()
    ex, vm = _vm(bh.partition(mod, require_heavy_op=False))
    ops = _graph_ops(ex)
    assert "eltwise:abs" not in ops and "eltwise:square" in ops, ops
    got = vm["main"](tvm.runtime.tensor(data)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def convnextv2():
    config = transformers.ConvNextV2Config(num_channels=3, hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1])
    torch.manual_seed(0)
    model = first_output(transformers.ConvNextV2Model(config).eval(), return_dict=False)
    for m in model.modules():  # GRN's gamma and beta start at 0 (GRN = identity): make them matter
        if type(m).__name__ == "ConvNextV2GRN":
            torch.nn.init.normal_(m.weight, std=0.5)
            torch.nn.init.normal_(m.bias, std=0.5)
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
    assert "eltwise:abs" not in ops, ops  # from_torch: the vector_norm abs is dropped
    got = vm["main"](tvm.runtime.tensor(x.numpy())).numpy()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
