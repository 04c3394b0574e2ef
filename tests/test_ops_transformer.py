"""Transformer fusions (ops/gelu.py, ops/attention.py, ops/softmax.py, take along any axis), each
against the llvm-only build of the same module (torch's safe softmax against numpy and torch): gelu
chains as one eltwise post-op, attention scale and mask as matmul post-ops, torch's _safe_softmax
chain as one softmax node, residual adds through reshapes, ViT's class-token select."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import TOLERANCE, graph, isa_under, offload_and_compare
from fuzz_graphs import minus_inf_mask, safe_softmax_chain
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.rules import rejections
from byoc_hetero.timing import build, relative_error, run

R = relax.op
RNG = np.random.default_rng(15)


def const(value, shape=()):
    return relax.const(np.full(shape, value, dtype="float32"))


def weight(*shape, scale=0.3):
    return relax.const((RNG.standard_normal(shape) * scale).astype("float32"))


def nodes(partitioned) -> list[dict]:
    """Every node of every region of the built module."""
    out = []
    for m in bh.codegen.region_modules(build(partitioned)):
        out.extend(json.loads(m["get_graph_json"]())["nodes"])
    return out


# -- gelu chains ----------------------------------------------------------------------------------
def _erf_chain(emit, x, arg="div", grouping="xh_a", swap=False, half=0.5, one=1.0):
    inner = emit(R.divide(x, const(math.sqrt(2))) if arg == "div" else R.multiply(x, const(1 / math.sqrt(2))))
    erf = emit(R.erf(inner))
    h = emit(R.add(const(one), erf) if swap else R.add(erf, const(one)))
    if grouping == "xh_a":
        return R.multiply(emit(R.multiply(h, x) if swap else R.multiply(x, h)), const(half))
    if grouping == "xa_h":
        return R.multiply(h, emit(R.multiply(const(half), x))) if swap else R.multiply(emit(R.multiply(x, const(half))), h)
    if grouping == "x_ha":
        return R.multiply(emit(R.multiply(const(half), h)), x) if swap else R.multiply(x, emit(R.multiply(h, const(half))))
    return R.divide(emit(R.multiply(x, h)), const(2.0 if half == 0.5 else half))


def _tanh_chain(emit, x, grouping="xa_h", cubic=0.044715):
    cube = emit(R.multiply(const(cubic), emit(R.power(x, const(3.0)))))
    inner = emit(R.tanh(emit(R.multiply(emit(R.add(x, cube)), const(math.sqrt(2 / math.pi))))))
    h = emit(R.add(inner, const(1.0)))
    if grouping == "xa_h":
        return R.multiply(emit(R.multiply(x, const(0.5))), h)
    return R.multiply(x, emit(R.multiply(const(0.5), h)))


def _mlp(chain):
    """dense -> gelu chain -> dense, on [1, 8, 16] tokens."""
    def body(emit, x):
        y = emit(R.add(emit(R.matmul(x, weight(16, 32))), weight(32)))
        return R.matmul(emit(chain(emit, y)), weight(32, 16))
    return graph({"x": (1, 8, 16)}, body)


@pytest.mark.parametrize("arg", ["div", "mul"])
@pytest.mark.parametrize("grouping", ["xh_a", "xa_h", "x_ha", "div2"])
@pytest.mark.parametrize("swap", [False, True])
def test_gelu_erf_chain_is_one_post_op(arg, grouping, swap):
    mod = _mlp(lambda emit, x: _erf_chain(emit, x, arg, grouping, swap))
    res = offload_and_compare(mod)
    ns = nodes(res.partitioned)
    assert [n["attrs"].get("activation") for n in ns if n["op"] == "dense"] == ["gelu_erf", "none"]
    assert not [n for n in ns if n["op"] in ("binary", "unary", "eltwise")]


@pytest.mark.parametrize("grouping", ["xa_h", "x_ha"])
def test_gelu_tanh_chain_is_one_post_op(grouping):
    res = offload_and_compare(_mlp(lambda emit, x: _tanh_chain(emit, x, grouping)))
    ns = nodes(res.partitioned)
    assert [n["attrs"].get("activation") for n in ns if n["op"] == "dense"] == ["gelu_tanh", "none"]
    assert not [n for n in ns if n["op"] in ("binary", "unary", "eltwise")]


@pytest.mark.parametrize("chain", [
    lambda emit, x: _erf_chain(emit, x, half=0.6),          # not a half
    lambda emit, x: _erf_chain(emit, x, one=0.9),           # not 1 + erf
    lambda emit, x: _tanh_chain(emit, x, cubic=0.05),       # not 0.044715
], ids=["half", "one", "cubic"])
def test_chain_with_other_constants_is_no_gelu(chain):
    """The check refuses the rule; the ops run one by one and the result still matches."""
    res = offload_and_compare(_mlp(chain))
    ns = nodes(res.partitioned)
    assert all(n["attrs"].get("activation") in ("none", None) for n in ns if n["op"] == "dense")
    assert not [n for n in ns if n["op"] == "eltwise" and n["attrs"]["algorithm"].startswith("gelu")]


def outputs(mod, arrays) -> list[np.ndarray]:
    """Every output of ``main`` of the built ``mod``."""
    import tvm

    vm = relax.VirtualMachine(build(mod), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def test_gelu_chain_whose_intermediate_is_also_read_elsewhere():
    """erf(x / sqrt 2) is also an output: no chain composite (it would compute it twice)."""
    def body(emit, x):
        y = emit(R.matmul(x, weight(16, 32)))
        erf = emit(R.erf(emit(R.divide(y, const(math.sqrt(2))))))
        g = emit(R.multiply(emit(R.multiply(y, emit(R.add(erf, const(1.0))))), const(0.5)))
        return relax.Tuple([g, erf])
    mod = graph({"x": (1, 8, 16)}, body)
    arrays = [RNG.standard_normal((1, 8, 16)).astype("float32")]
    for g, w in zip(outputs(bh.partition(mod), arrays), outputs(mod, arrays)):
        assert relative_error(g, w) <= TOLERANCE


# -- torch's safe softmax (ops/softmax.py) ------------------------------------------------------------
def safe_softmax_reference(x: np.ndarray, axis: int) -> np.ndarray:
    """torch's _safe_softmax in float64: softmax along ``axis``; a row whose inputs are all -inf is 0."""
    x64 = x.astype(np.float64)
    full = np.all(np.isneginf(x64), axis=axis, keepdims=True)
    e = np.exp(x64 - np.where(full, 0.0, x64.max(axis=axis, keepdims=True)))
    return np.where(full, 0.0, e / np.where(full, 1.0, e.sum(axis=axis, keepdims=True)))


def masked_rows(shape: tuple[int, ...], axis: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random data with -inf rows and elements along ``axis`` (see :func:`minus_inf_mask`), one row
    all -inf and one whose first element only is -inf for sure; and where the all -inf rows are."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype("float32") * 3 + minus_inf_mask(rng, shape, axis)
    first = [0] * len(shape)
    first[axis] = slice(None)
    x[tuple(first)] = -np.inf
    last: list = [d - 1 for d in shape]
    last[axis] = slice(None)
    x[tuple(last)] = rng.standard_normal(shape[axis]).astype("float32")
    last[axis] = 0
    x[tuple(last)] = -np.inf
    full = np.all(np.isneginf(x), axis=axis, keepdims=True)
    assert full.any() and not full.all()
    return x, np.broadcast_to(full, shape)


@pytest.mark.parametrize("axis", [-1, 1, 0])
@pytest.mark.parametrize("scalar_zero", [False, True])
def test_safe_softmax_chain_is_one_softmax_node(axis, scalar_zero):
    """The chain torch.export writes for _safe_softmax (equal -inf, logical_not, astype int8, max,
    astype bool, logical_not, full_like or a scalar 0, where) is one ``softmax`` node with ``safe``
    1: rows all -inf give 0 (oneDNN alone gives NaN), partly masked rows are the softmax of the
    rest, within 1e-6 of the float64 reference and of torch."""
    torch = pytest.importorskip("torch")
    shape = (3, 5, 7)
    mod = graph({"x": shape}, lambda emit, x: safe_softmax_chain(emit, x, axis, scalar_zero))
    part = bh.partition(mod, require_heavy_op=False)
    assert not bh.report(part).fallbacks, str(bh.report(part))
    assert [(n["op"], n["attrs"]) for n in nodes(part)] == [("softmax", {"axis": axis, "safe": 1})]
    for seed in range(3):
        x, full = masked_rows(shape, axis, seed)
        got = run(build(part), [x])
        assert not np.isnan(got).any()
        assert np.array_equal(got[full], np.zeros(int(full.sum()), "float32"))
        assert not np.signbit(got[full]).any()
        np.testing.assert_allclose(got, safe_softmax_reference(x, axis), rtol=0, atol=1e-6)
        want = torch.ops.aten._safe_softmax(torch.from_numpy(x), axis).numpy()
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
        # the plain softmax (the rule alone) keeps oneDNN's NaN rows, as torch.softmax does
        plain = run(build(bh.partition(graph({"x": shape}, lambda emit, v: R.nn.softmax(v, axis=axis)),
                                       require_heavy_op=False)), [x])
        assert np.isnan(plain[full]).all() and not np.isnan(plain[~full]).any()


def _chain_with(emit, x, minus_inf=-np.inf, reduce_axis=-1):
    out = emit(R.nn.softmax(x, axis=-1))
    kept = emit(R.logical_not(emit(R.equal(x, relax.const(np.float32(minus_inf))))))
    any_kept = emit(R.max(emit(R.astype(kept, "int8")), axis=[reduce_axis], keepdims=True))
    rows = emit(R.logical_not(emit(R.astype(any_kept, "bool"))))
    return R.where(rows, emit(R.full_like(out, relax.const(np.float32(0.0)))), out)


@pytest.mark.parametrize("variant,reason", [
    ({"minus_inf": -1e4}, "compares with -10000.0, not -inf"),
    ({"reduce_axis": 1}, "reduces over axes [1], the softmax runs over [2]"),
])
def test_chain_that_is_no_safe_softmax_runs_op_by_op(variant, reason):
    """A chain comparing with another constant or reducing over another axis is not torch's safe
    softmax: the rule says why, the ops run one by one, and the result is the llvm build's."""
    mod = graph({"x": (2, 4, 6)}, lambda emit, x: _chain_with(emit, x, **variant))
    part = bh.partition(mod, require_heavy_op=False)
    assert any(reason in r.reason for r in rejections(part)), [r.reason for r in rejections(part)]
    assert "softmax" in [n["op"] for n in nodes(part)]
    x, _ = masked_rows((2, 4, 6), -1, 7)
    x[0, 0, :] = -1e4
    got, want = outputs(part, [x])[0], outputs(mod, [x])[0]
    for special in (np.isnan, np.isneginf):
        assert np.array_equal(special(got), special(want))
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), rtol=1e-5, atol=1e-6)


def sdpa_model():
    """One attention layer through torch's scaled_dot_product_attention with an additive mask
    (torch.export writes _safe_softmax for it)."""
    torch = pytest.importorskip("torch")

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)

        def forward(self, x, mask):
            q, k, v = (t.reshape(x.shape[0], x.shape[1], 2, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    torch.manual_seed(0)
    return Attention().eval()


def test_torch_sdpa_with_fully_masked_rows_is_one_region_and_matches_torch():
    torch = pytest.importorskip("torch")
    model = sdpa_model()
    x, mask = torch.randn(2, 6, 16), torch.randn(2, 2, 6, 6)
    mask[0, 0, 1, :] = -math.inf  # a query row attending to nothing: zeros
    mask[1, 1, 3, :4] = -math.inf  # partly masked
    mod, params = bh.from_torch(model, (x, mask))
    part = bh.partition(mod, params)
    report = bh.report(part)
    assert len(report.regions) == 1 and not report.fallbacks, str(report)
    assert [n["attrs"] for n in nodes(part) if n["op"] == "softmax"] == [{"axis": -1, "safe": 1}]
    got = run(build(part), [x.numpy(), mask.numpy()])
    want = model(x, mask).detach().numpy()
    assert np.array_equal(got[0, 0, 1], np.zeros(8, "float32"))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- attention --------------------------------------------------------------------------------------
def _attention(heads=4, seq=16, dim=8, scale_op="mul", mask_shape=(1, 1, 16, 16), torch_style=False):
    """softmax(q @ k^T * scale + mask) @ v over all heads, q/k/v from one [1, S, H*D] input."""
    hidden = heads * dim

    def body(emit, x, mask):
        def proj():
            y = emit(R.add(emit(R.matmul(x, weight(hidden, hidden))), weight(hidden)))
            return emit(R.permute_dims(emit(R.reshape(y, (1, seq, heads, dim))), [0, 2, 1, 3]))
        q, k, v = proj(), proj(), proj()
        kt = emit(R.permute_dims(k, [0, 1, 3, 2]))
        if torch_style:  # batched as [H, S, D] and reshaped back, as TVM's torch frontend writes it
            s = emit(R.reshape(emit(R.matmul(emit(R.reshape(q, (heads, seq, dim))),
                                             emit(R.reshape(kt, (heads, dim, seq))))), (1, heads, seq, seq)))
        else:
            s = emit(R.matmul(q, kt))
        s = emit(R.multiply(s, const(1 / math.sqrt(dim))) if scale_op == "mul" else R.divide(s, const(math.sqrt(dim))))
        if mask_shape is not None:
            s = emit(R.add(s, mask))
        p = emit(R.nn.softmax(s, axis=-1))
        o = emit(R.permute_dims(emit(R.matmul(p, v)), [0, 2, 1, 3]))
        return R.reshape(o, (1, seq, hidden))
    return graph({"x": (1, seq, hidden), "mask": mask_shape or (1,)}, body)


def matmul_impls(partitioned, arrays) -> list[str]:
    """The oneDNN implementation of every matmul step of one call (from the runtime's profile)."""
    import tvm

    ex = build(partitioned)
    regions = bh.codegen.region_modules(ex)
    for m in regions:
        m["set_profiling"](True)
    relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return [s["impl"] for m in regions for s in json.loads(m["get_profile"]()) if s["op"] == "matmul"]


@pytest.mark.parametrize("scale_op", ["mul", "div"])
@pytest.mark.parametrize("mask_shape", [(1, 1, 16, 16), (16, 16), (1, 4, 16, 16), (1, 1, 1, 16), (1, 4, 1, 16), None])
@pytest.mark.parametrize("torch_style", [False, True])
def test_attention_scale_and_mask_are_matmul_post_ops(scale_op, mask_shape, torch_style):
    mod = _attention(scale_op=scale_op, mask_shape=mask_shape, torch_style=torch_style)
    x = RNG.standard_normal((1, 16, 32)).astype("float32")
    mask = (np.where(RNG.random(mask_shape or (1,)) < 0.3, -1e4, 0.0)).astype("float32")
    res = offload_and_compare(mod, inputs=[x, mask])
    ns = nodes(res.partitioned)
    scores = [n for n in ns if n["op"] == "matmul" and "scale" in n["attrs"]]
    assert len(scores) == 1
    assert scores[0]["attrs"]["scale"] == pytest.approx(1 / math.sqrt(8), rel=1e-6)
    # a mask of the scores' own shape is added as a sum post-op (the residual input), a broadcast
    # one as a binary post-op (the mask input)
    full = mask_shape == (1, 4, 16, 16)
    # a per-head mask broadcast over rows runs only in oneDNN's reference matmul: a binary node
    per_head = mask_shape == (1, 4, 1, 16)
    assert scores[0]["attrs"].get("has_mask", 0) == int(mask_shape is not None and not full and not per_head)
    assert scores[0]["attrs"].get("residual", 0) == int(full)
    assert len([n for n in ns if n["op"] == "binary"]) == int(per_head), "the scale or mask ran as a separate step"
    # torch-style [H, S, S] scores are written as [1, H, S, S]: oneDNN's 3-D broadcast post-op is ref only
    assert not [i for i in matmul_impls(res.partitioned, [x, mask]) if i.startswith("ref")]


def print_masked_scores_run(post_relu: bool) -> None:
    """Run softmax(q @ k^T * 0.25 + mask) (or relu of the masked scores, a post-activation after the mask), the
    mask of the scores' full shape (the matmul's residual), and print one JSON line: oneDNN's ISA, every matmul
    step's implementation and the relative error against numpy.  Run in a subprocess by the test below."""
    rng = np.random.default_rng(3)
    q, k = (rng.standard_normal((1, 4, 16, 8)).astype("float32") for _ in range(2))
    mask = np.where(rng.random((1, 4, 16, 16)) < 0.3, -1e4, 0.0).astype("float32")

    def body(emit, q_, k_, mask_):
        s = emit(R.matmul(q_, emit(R.permute_dims(k_, [0, 1, 3, 2]))))
        s = emit(R.add(emit(R.multiply(s, const(0.25))), mask_))
        return R.nn.relu(s) if post_relu else R.nn.softmax(s, axis=-1)
    mod = graph({"q": q.shape, "k": k.shape, "mask": mask.shape}, body)
    part = bh.partition(mod)
    got = run(build(part), [q, k, mask])
    scores = q @ k.transpose(0, 1, 3, 2) * 0.25 + mask
    if post_relu:
        want = np.maximum(scores, 0)
    else:
        e = np.exp(scores - scores.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    print(json.dumps({"isa": bh._C.isa(), "impls": matmul_impls(part, [q, k, mask]),
                      "error": float(relative_error(got, want))}))


@pytest.mark.parametrize("post_relu", [False, True])
def test_scaled_full_mask_avoids_the_reference_matmul_under_avx2(post_relu):
    """Under ONEDNN_MAX_CPU_ISA=AVX2 (Zen 3, older Intel) oneDNN 3.2's f32 matmul is its jit sgemm, which takes a
    sum post-op only first: the scale then the full mask (the residual) ran "ref:any".  The matmul now runs with
    the scale alone and the mask added by a jit binary step (matmul.cc MatmulWithSplitEpilogue); values against
    numpy.  oneDNN reads the cap when it starts: a subprocess."""
    if isa_under("AVX2") != "avx2":
        pytest.skip(f"this CPU cannot run oneDNN's avx2 kernels (got {isa_under('AVX2')})")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, *sys.path]), ONEDNN_MAX_CPU_ISA="AVX2")
    code = f"import test_ops_transformer as t; t.print_masked_scores_run({post_relu})"
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=here, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["isa"] == "avx2"
    assert len(out["impls"]) == 2, out["impls"]  # the product, then the mask's add
    assert not [i for i in out["impls"] if i.startswith("ref")], out["impls"]
    assert out["error"] <= TOLERANCE


def test_a_bad_split_epilogue_value_is_an_error_naming_it(monkeypatch):
    """BYOC_HETERO_MATMUL_SPLIT_EPILOGUE is read when a region with a float matmul is planned, on any ISA."""
    monkeypatch.setenv("BYOC_HETERO_MATMUL_SPLIT_EPILOGUE", "yes")
    x = RNG.standard_normal((1, 16, 32)).astype("float32")
    mask = np.zeros((1, 4, 16, 16), "float32")
    with pytest.raises(Exception, match="BYOC_HETERO_MATMUL_SPLIT_EPILOGUE must be on or off, got 'yes'"):
        run(build(bh.partition(_attention(mask_shape=(1, 4, 16, 16)))), [x, mask])


def test_mask_read_by_two_layers_and_scores_read_twice_stay_correct():
    """The scores are also an output: no post-op may change what that output holds."""
    def body(emit, q, k, mask):
        s = emit(R.matmul(q, emit(R.permute_dims(k, [0, 1, 3, 2]))))
        scaled = emit(R.multiply(s, const(0.25)))
        return relax.Tuple([emit(R.nn.softmax(emit(R.add(scaled, mask)), axis=-1)), s])
    mod = graph({"q": (1, 2, 8, 4), "k": (1, 2, 8, 4), "mask": (1, 1, 8, 8)}, body)
    arrays = [RNG.standard_normal(s).astype("float32") for s in ((1, 2, 8, 4), (1, 2, 8, 4), (1, 1, 8, 8))]
    for g, w in zip(outputs(bh.partition(mod), arrays), outputs(mod, arrays)):
        assert relative_error(g, w) <= TOLERANCE


def test_residual_add_through_reshapes_is_a_sum_post_op():
    """linear on 3-D data as TVM's torch frontend writes it (reshape, matmul, reshape) + residual."""
    def body(emit, x):
        flat = emit(R.reshape(x, (8, 16)))
        y = emit(R.reshape(emit(R.add(emit(R.matmul(flat, weight(16, 16))), weight(16))), (1, 8, 16)))
        return R.nn.relu(emit(R.add(y, x)))
    res = offload_and_compare(graph({"x": (1, 8, 16)}, body))
    dense = [n for n in nodes(res.partitioned) if n["op"] == "dense"]
    assert dense[0]["attrs"].get("residual") == 1 and dense[0]["attrs"].get("post_activation") == "relu"
    assert not [n for n in nodes(res.partitioned) if n["op"] in ("binary", "eltwise")]


# -- take along any axis -------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_take_along_any_axis(axis):
    shape = (3, 5, 4)
    ids = np.array([[1, 0], [2, 2]], dtype="int64") % shape[axis]

    def body(emit, x):
        y = emit(R.add(emit(R.matmul(x, weight(4, 4))), weight(4)))
        return R.take(y, relax.const(ids), axis=axis)
    res = offload_and_compare(graph({"x": shape}, body))
    assert [n for n in nodes(res.partitioned) if n["op"] == "take"]


def test_class_token_select_is_a_slice_in_the_region():
    """ViT's x[:, 0] (take of a constant 0-d index along axis 1) runs in the region, one region."""
    def body(emit, x):
        y = emit(R.add(emit(R.matmul(x, weight(8, 8))), weight(8)))
        cls = emit(R.take(y, relax.const(np.array(0, dtype="int64")), axis=1))
        return R.matmul(cls, weight(8, 3))
    res = offload_and_compare(graph({"x": (1, 5, 8)}, body))
    assert len(bh.report(res.partitioned).regions) == 1
    assert [n for n in nodes(res.partitioned) if n["op"] == "slice"]


def test_take_index_out_of_range_on_axis_1_raises():
    def body(emit, x, i):
        y = emit(R.add(emit(R.matmul(x, weight(8, 8))), weight(8)))
        return R.take(y, i, axis=1)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 5, 8), "float32"))
    i = relax.Var("i", relax.TensorType((2,), "int64"))
    with bb.function("main", [x, i]):
        with bb.dataflow():
            out = bb.emit_output(body(bb.emit, x, i))
        bb.emit_func_output(out)
    part = bh.partition(bb.get())
    assert [n for n in nodes(part) if n["op"] == "take"]
    good = run(build(part), [np.ones((1, 5, 8), "float32"), np.array([4, 0], "int64")])
    assert good.shape == (1, 2, 8)
    with pytest.raises(Exception, match="out of range"):
        run(build(part), [np.ones((1, 5, 8), "float32"), np.array([5, 0], "int64")])


# -- int64 / bool bookkeeping folded before partitioning (byoc_hetero/fold.py) -----------------------
def test_exported_class_token_index_chain_is_folded_and_the_model_is_one_region():
    """torch.onnx.export's x[:, 0]: the index normalised through shape_of of a region's output."""
    def body(emit, x):
        y = emit(R.add(emit(R.matmul(x, weight(8, 8))), weight(8)))
        dims = emit(R.shape_to_tensor(emit(R.shape_of(y))))
        zero = relax.const(0, "int64")
        negative = emit(R.less(zero, zero))
        index = emit(R.where(negative, emit(R.add(zero, emit(R.take(dims, relax.const(1, "int64"), axis=0)))), zero))
        return R.matmul(emit(R.take(y, index, axis=1)), weight(8, 3))
    mod = graph({"x": (1, 5, 8)}, body)
    res = offload_and_compare(mod)
    rep = bh.report(res.partitioned)
    assert len(rep.regions) == 1 and not rep.fallbacks, str(rep)


def test_mask_chain_of_an_input_is_not_folded():
    """A chain reading a model input stays (on llvm, with its reason), and the result is right."""
    from byoc_hetero.fold import fold_int_constants

    def body(emit, ids, x):
        y = emit(R.add(emit(R.matmul(x, weight(8, 8))), weight(8)))
        positions = emit(R.expand_dims(emit(R.arange(0, 5, 1, dtype="int64")), axis=[0]))
        picked = emit(R.add(ids, positions))  # depends on the input: not folded
        return R.take(y, emit(R.reshape(picked, (5,))), axis=1)
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType((1, 5), "int64"))
    x = relax.Var("x", relax.TensorType((1, 5, 8), "float32"))
    with bb.function("main", [ids, x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb.emit, ids, x))
        bb.emit_func_output(out)
    mod = bb.get()
    folded = str(fold_int_constants(mod)["main"])
    assert "arange" not in folded and "R.add(ids" in folded
    arrays = [np.zeros((1, 5), "int64"), RNG.standard_normal((1, 5, 8)).astype("float32")]
    got, want = outputs(bh.partition(mod), arrays), outputs(mod, arrays)
    assert relative_error(got[0], want[0]) <= TOLERANCE
