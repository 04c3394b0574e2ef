"""The fused attention node (ops/fused_attention.py, cpp/kernels/attention.cc): matmul (+scale, +mask)
-> softmax -> matmul as one node, against the llvm-only build of the same module and a float64 numpy
reference (masked, causal and fully masked rows; NaN rows; GQA's broadcast K / V heads), where it
fires and where it must not (short rows under ``auto``, bf16, switched off)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from conftest import graph, offload_and_compare
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.errors import RuleError
from byoc_hetero.timing import build, run

R = relax.op
RNG = np.random.default_rng(25)
ENV = "BYOC_HETERO_ATTENTION"


@pytest.fixture
def fused(monkeypatch):
    """Fuse wherever the pattern allows (the default fuses rows of more than MIN_KEYS keys only)."""
    monkeypatch.setenv(ENV, "fused")


def ops_of(partitioned) -> list[str]:
    return [n["op"] for m in bh.codegen.region_modules(build(partitioned))
            for n in json.loads(m["get_graph_json"]())["nodes"]]


def _weight(*shape):
    return relax.const((RNG.standard_normal(shape) * 0.3).astype("float32"))


def _heads(emit, x, seq, heads, dim, w=None):
    """x [1, S, H*D] projected by w, as [1, H, S, D] (reshape + permute_dims: the views the kernel reads)."""
    y = emit(R.matmul(x, _weight(heads * dim, heads * dim) if w is None else relax.const(w)))
    return emit(R.permute_dims(emit(R.reshape(y, (1, seq, heads, dim))), [0, 2, 1, 3]))


def attention_module(seq=12, heads=2, dim=4, scale="mul", mask_shape=None, softmax="plain", torch_style=False,
                     q_scaled=False, weights=(None, None, None)):
    """One self-attention block over x [1, S, H*D] (and a mask input when mask_shape is given)."""
    inputs = {"x": (1, seq, heads * dim), **({"mask": mask_shape} if mask_shape else {})}

    def body(emit, x, mask=None):
        q, k, v = (_heads(emit, x, seq, heads, dim, w) for w in weights)
        if q_scaled:  # Whisper: the query scaled before the product
            q = emit(R.multiply(q, relax.const(np.float32(dim ** -0.5))))
        kt = emit(R.permute_dims(k, [0, 1, 3, 2]))
        if torch_style:  # TVM's torch frontend: batched [H, S, D] matmuls between reshapes
            s = emit(R.reshape(emit(R.matmul(emit(R.reshape(q, (heads, seq, dim))),
                                             emit(R.reshape(kt, (heads, dim, seq))))), (1, heads, seq, seq)))
        else:
            s = emit(R.matmul(q, kt))
        if scale == "mul":
            s = emit(R.multiply(s, relax.const(np.float32(dim ** -0.5))))
        elif scale == "div":
            s = emit(R.divide(s, relax.const(np.float32(dim ** 0.5))))
        if mask is not None:
            s = emit(R.add(s, mask))
        p = emit(R.nn.softmax(s, axis=-1))
        if softmax == "isnan":  # the dynamo ONNX exporter's guard
            p = emit(R.where(emit(R.isnan(p)), relax.const(np.float32(0)), p))
        elif softmax == "torch_safe":
            from fuzz_graphs import safe_softmax_chain

            p = safe_softmax_chain(emit, s, -1)
        o = emit(R.matmul(p, v))
        return R.reshape(emit(R.permute_dims(o, [0, 2, 1, 3])), (1, seq, heads * dim))

    return graph(inputs, body)


@pytest.mark.parametrize("torch_style", [False, True])
@pytest.mark.parametrize("scale", ["mul", "div", "none"])
@pytest.mark.parametrize("mask_shape", [None, (1, 1, 12, 12), (12, 12), (1, 2, 1, 12), (1, 2, 12, 12)])
def test_attention_is_one_node_and_matches_llvm(fused, torch_style, scale, mask_shape):
    mod = attention_module(scale=scale, mask_shape=mask_shape, torch_style=torch_style)
    res = offload_and_compare(mod)
    ops = ops_of(res.partitioned)
    assert ops.count("attention") == 1
    assert "softmax" not in ops and "matmul" not in ops and "binary" not in ops


def test_query_scale_joins_the_node(fused):
    """Whisper's q * d^-0.5 before the product becomes the node's scale (no binary node left)."""
    res = offload_and_compare(attention_module(scale="none", q_scaled=True))
    ops = ops_of(res.partitioned)
    assert ops.count("attention") == 1 and "binary" not in ops


def _reference(x, wq, wk, wv, mask, heads, dim, safe):
    """float64 attention of x with softmax.cc's special rows (NaN/+inf row: NaN, all -inf: NaN;
    safe 1: all -inf rows 0; safe 2: every NaN row 0)."""
    seq = x.shape[1]

    def split(w):
        return (x[0].astype("float64") @ w).reshape(seq, heads, dim).transpose(1, 0, 2)

    q, k, v = split(wq), split(wk), split(wv)
    with np.errstate(invalid="ignore", over="ignore"):
        s = q @ k.transpose(0, 2, 1) * dim ** -0.5 + mask
        m = s.max(-1, keepdims=True)
        e = np.exp(s - m)
        p = e / e.sum(-1, keepdims=True)
    all_minus_inf = np.all(s == -np.inf, -1)
    if safe == 1:
        p[all_minus_inf] = 0
    if safe == 2:
        p[np.isnan(p).any(-1)] = 0
    with np.errstate(invalid="ignore"):
        return (p @ v).transpose(1, 0, 2).reshape(1, seq, heads * dim)


@pytest.mark.parametrize("softmax,safe", [("plain", 0), ("torch_safe", 1), ("isnan", 2)])
def test_masked_causal_and_fully_masked_rows(fused, softmax, safe):
    """A causal -inf mask with two rows masked entirely: partly masked rows as the unfused path,
    fully masked ones NaN (plain softmax) or 0 (torch's safe softmax, the isnan guard)."""
    seq, heads, dim = 10, 2, 4
    mask = np.triu(np.full((seq, seq), -np.inf, "float32"), 1)
    mask[3] = -np.inf
    mask[7] = -np.inf
    ws = [(RNG.standard_normal((heads * dim, heads * dim)) * 0.3).astype("float32") for _ in range(3)]
    mod = attention_module(seq, heads, dim, mask_shape=(1, 1, seq, seq), softmax=softmax, weights=ws)
    part = bh.partition(mod)
    assert ops_of(part).count("attention") == 1
    x = RNG.standard_normal((1, seq, heads * dim)).astype("float32")
    got = run(build(part), [x, mask[None, None]])
    want_llvm = run(build(mod), [x, mask[None, None]])
    want = _reference(x, *ws, mask, heads, dim, safe)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, want_llvm, rtol=1e-5, atol=1e-5)
    if safe == 0:
        assert np.isnan(got[0, 3]).all() and not np.isnan(got[0, 2]).any()
    else:
        assert (got[0, 3] == 0).all() and (got[0, 7] == 0).all()


@pytest.mark.parametrize("safe_softmax", ["plain", "isnan"])
def test_nan_in_a_score_row(fused, safe_softmax):
    """A NaN in the mask poisons its row: NaN (plain softmax), 0 (the isnan guard); the others stand."""
    seq = 9
    mask = np.zeros((1, 1, seq, seq), "float32")
    mask[0, 0, 4, 2] = np.nan
    mod = attention_module(seq, 2, 4, mask_shape=mask.shape, softmax=safe_softmax)
    part = bh.partition(mod)
    assert ops_of(part).count("attention") == 1
    x = RNG.standard_normal((1, seq, 8)).astype("float32")
    got, want = run(build(part), [x, mask]), run(build(mod), [x, mask])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (np.isnan(got[0, 4]).all()) == (safe_softmax == "plain")


def test_grouped_query_heads_broadcast(fused):
    """GQA: 4 query heads share 2 K / V heads through a broadcast batch dim ([1, 2, 1, S, D])."""
    seq, dim = 11, 4

    def body(emit, q, k, v):
        s = emit(R.multiply(emit(R.matmul(q, emit(R.permute_dims(k, [0, 1, 2, 4, 3])))), relax.const(np.float32(0.5))))
        return R.matmul(emit(R.nn.softmax(s, axis=-1)), v)

    mod = graph({"q": (1, 2, 2, seq, dim), "k": (1, 2, 1, seq, dim), "v": (1, 2, 1, seq, dim)}, body)
    res = offload_and_compare(mod)
    assert ops_of(res.partitioned).count("attention") == 1


@pytest.mark.parametrize("mask_shape", [(1, 1, 9, 9), (1, 6, 9, 9), (9, 9)])
def test_gqa_scores_read_as_merged_heads(fused, mask_shape):
    """Llama's GQA as torch.export / the dynamo exporter write it: 5-D matmuls over [1, kv, group, S, D]
    whose scores are reshaped to [1, heads, S, S] for the mask add and the softmax (and back), K^T
    scaled after its transpose, Q before its reshape; a mask shared by the heads or one per head."""
    seq, dim = 9, 4

    def body(emit, q, k, v, mask):
        q = emit(R.reshape(emit(R.multiply(q, relax.const(np.float32(0.5)))), (1, 2, 3, seq, dim)))
        kt = emit(R.multiply(emit(R.permute_dims(k, [0, 1, 2, 4, 3])), relax.const(np.float32(0.5))))
        s = emit(R.add(emit(R.reshape(emit(R.matmul(q, kt)), (1, 6, seq, seq))), mask))
        p = emit(R.reshape(emit(R.nn.softmax(s, axis=-1)), (1, 2, 3, seq, seq)))
        return R.reshape(emit(R.matmul(p, v)), (1, 6, seq, dim))

    mod = graph({"q": (1, 6, seq, dim), "k": (1, 2, 1, seq, dim), "v": (1, 2, 1, seq, dim), "mask": mask_shape}, body)
    res = offload_and_compare(mod)
    ops = ops_of(res.partitioned)
    assert ops.count("attention") == 1 and not {"softmax", "permute", "matmul", "binary"} & set(ops), ops


def _llama(impl: str, seq: int):
    """A scaled-down Llama decoder (GQA 6 query / 2 key-value heads of 16, 2 layers) with the given
    attention implementation: ``sdpa`` (the zoo's; torch's decomposition scales Q and K^T by
    d^-0.25 each, the causal mask -inf from a where) or ``eager`` (repeat_kv, one scale on the
    scores, the mask's finite float32 lowest)."""
    from transformers import LlamaConfig, LlamaModel

    sys.path.insert(0, ZOO)
    import zoo_models

    cfg = LlamaConfig(vocab_size=200, hidden_size=96, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    cfg._attn_implementation = impl
    return zoo_models._decoder("llama", LlamaModel(cfg), cfg.vocab_size, seq, "")


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("path", ["from_torch", "from_onnx"])
def test_llama_gqa_attention_fused_by_default(monkeypatch, tmp_path, path, impl):
    """The Llama decoder's GQA attention (5-D matmuls, heads merged around the softmax, scalar scales,
    causal mask) is one attention node per layer under the default gate at 80 keys, through
    torch.export and through the default (dynamo) ONNX exporter: within 1e-4 of torch eager."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    monkeypatch.delenv(ENV, raising=False)
    zm = _llama(impl, 80)
    if path == "from_torch":
        mod, params = bh.from_torch(zm.module, zm.inputs)
    else:
        file = str(tmp_path / "llama.onnx")
        torch.onnx.export(zm.module, zm.inputs, file, input_names=list(zm.input_names))
        mod, params = bh.from_onnx(file)
    part = bh.partition(mod, params)
    ops = ops_of(part)
    assert ops.count("attention") == 2 and "softmax" not in ops
    got = run(build(part), [x.numpy() for x in zm.inputs])
    with torch.no_grad():
        want = zm.module(*zm.inputs).numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def test_auto_fuses_long_rows_only(monkeypatch):
    """The default (``auto``): rows of at most MIN_KEYS keys keep the matmul -> softmax -> matmul path."""
    from byoc_hetero.backends.onednn.ops.fused_attention import MIN_KEYS

    monkeypatch.delenv(ENV, raising=False)
    short = ops_of(bh.partition(attention_module(seq=MIN_KEYS, heads=1, dim=2)))
    assert "attention" not in short and short.count("matmul") >= 2
    res = offload_and_compare(attention_module(seq=MIN_KEYS + 1, heads=1, dim=2))
    assert ops_of(res.partitioned).count("attention") == 1


def test_switched_off_and_bad_knob(monkeypatch):
    monkeypatch.setenv(ENV, "off")
    assert "attention" not in ops_of(bh.partition(attention_module()))
    monkeypatch.setenv(ENV, "always")
    with pytest.raises(RuleError, match=ENV):
        bh.partition(attention_module())


def test_bf16_region_keeps_the_unfused_path(fused):
    """bf16 rounds Q, K, V and the probabilities in the unfused matmuls; the fused kernel is f32."""
    assert "attention" not in ops_of(bh.partition(attention_module(), precision="bf16"))


def _kernel_region(name, views, q, k, v, mask=None, **attrs):
    """A region of one attention node over inputs q, k, v[, mask] (numpy), views as attrs."""
    from test_runtime import Region

    r = Region(name)
    ins = [r.input(a.shape) for a in (q, k, v, *([mask] if mask is not None else []))]
    out_shape = views["q_shape"][:-1] + views["v_shape"][-1:]
    r.outputs = [r.node("attention", ins, out_shape, **views, **attrs)]
    return r


def test_kernel_reads_strided_and_transposed_views():
    """The kernel alone: Q as [S, H, D] bytes read [H, S, D], K stored D-major ([H, D, S]), V plain,
    a [1, S] mask broadcasting over heads and rows, in blocks of 8 query rows; against float64 numpy."""
    heads, seq, dim = 3, 37, 5
    q = RNG.standard_normal((seq, heads, dim)).astype("float32")
    k = RNG.standard_normal((heads, dim, seq)).astype("float32")
    v = RNG.standard_normal((heads, seq, dim)).astype("float32")
    mask = np.where(RNG.random((1, seq)) < 0.3, -np.inf, 0).astype("float32")
    mask[0, 0] = 0
    views = {"q_shape": [heads, seq, dim], "q_strides": [dim, heads * dim, 1],
             "k_shape": [heads, seq, dim], "k_strides": [dim * seq, 1, seq],
             "v_shape": [heads, seq, dim], "v_strides": [seq * dim, dim, 1]}
    # blocks of 8 query rows: 5 blocks per head, the last one short
    r = _kernel_region("att_views", views, q, k, v, mask, scale=0.7, has_mask=1, block_rows=8)
    (got,) = r.run(r.module(), q, k, v, mask)
    s = np.einsum("shd,hdt->hst", q.astype("float64"), k) * 0.7 + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def np_attention(q, k, v, mask, scale, safe):
    """float64 softmax(q @ k^T * scale + mask) @ v over broadcast batch dims, with kernels/softmax.cc's
    special rows: a row holding NaN or +inf is NaN (safe 2: 0), a row of only -inf NaN (safe 1, 2: 0)."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.matmul(q.astype("float64"), np.swapaxes(k.astype("float64"), -1, -2)) * scale + mask
        bad = np.isnan(s).any(-1) | (s == np.inf).any(-1)
        empty = (s == -np.inf).all(-1) & ~bad
        e = np.exp(s - s.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
    p[bad | empty] = np.nan
    if safe >= 1:
        p[empty] = 0
    if safe == 2:
        p[bad] = 0
    with np.errstate(invalid="ignore"):
        return np.matmul(p, v.astype("float64"))


def gqa_views(groups, per_group, seq, keys, dim, dv, k_major, rng=RNG):
    """Inputs and attrs of a GQA attention node: q plain [G, P, M, D]; k and v one head per group,
    stored D-major ([G, D, N], [G, Dv, N]) when k_major, else row-major ([G, N, D], [G, N, Dv]),
    read as [G, 1, N, *] views broadcast over the P query heads of their group."""
    q = rng.standard_normal((groups, per_group, seq, dim)).astype("float32")
    k = rng.standard_normal((groups, keys, dim)).astype("float32")
    v = rng.standard_normal((groups, keys, dv)).astype("float32")
    stored_k = np.ascontiguousarray(k.transpose(0, 2, 1)) if k_major else k
    stored_v = np.ascontiguousarray(v.transpose(0, 2, 1)) if k_major else v

    def view(cols):
        return [keys * cols, 0, 1, keys] if k_major else [keys * cols, 0, cols, 1]

    views = {"q_shape": list(q.shape), "q_strides": [per_group * seq * dim, seq * dim, dim, 1],
             "k_shape": [groups, 1, keys, dim], "k_strides": view(dim),
             "v_shape": [groups, 1, keys, dv], "v_strides": view(dv)}
    return q, k, v, stored_k, stored_v, views


def special_rows_mask(seq, keys, rng=RNG):
    """A [seq, keys] mask: random -inf entries, row 1 all -inf, a NaN in row 2, +inf in row 4."""
    mask = np.where(rng.random((seq, keys)) < 0.3, -np.inf, 0).astype("float32")
    mask[:, 0] = 0
    mask[1] = -np.inf
    mask[2, keys // 2] = np.nan
    mask[4, 0] = np.inf
    return mask


@pytest.mark.parametrize("safe", [0, 1, 2])
@pytest.mark.parametrize("k_major", [False, True])
@pytest.mark.parametrize("block_rows", [3, 0])
def test_kernel_packed_gqa_heads_and_special_rows(safe, k_major, block_rows):
    """The kernel alone, GQA (2 groups of 3 query heads, one K / V head each, broadcast) with a mask
    holding fully masked, NaN and +inf rows: in blocks of 3 query rows (several blocks per head: K^T
    and V are packed once per distinct head and shared by the blocks) and in one block (block_rows 0
    at 11 rows: read in place), K / V stored row-major or D-major; against float64 numpy."""
    seq, keys, dim, dv = 11, 13, 5, 6
    q, k, v, sk, sv, views = gqa_views(2, 3, seq, keys, dim, dv, k_major)
    mask = special_rows_mask(seq, keys)
    r = _kernel_region("att_gqa", views, q, sk, sv, mask, scale=0.4, has_mask=1, safe=safe, block_rows=block_rows)
    (got,) = r.run(r.module(), q, sk, sv, mask)
    want = np_attention(q, k[:, None], v[:, None], mask, 0.4, safe)
    assert got.shape == want.shape == (2, 3, seq, dv)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.isnan(got[:, :, 1]).all() == (safe == 0) and (got[:, :, 2] == 0).all() == (safe == 2)


@pytest.mark.parametrize("keys", [1, 15, 16, 17, 31, 32, 33, 47, 70])
@pytest.mark.parametrize("block_rows", [2, 0])
def test_kernel_probabilities_across_the_exp_range(keys, block_rows):
    """The kernel's softmax alone, scores exact in float32 (D = 1, q a power of two, k on a grid)
    reaching below ln(FLT_MIN) - 1 = -88.3 from the row max, V the identity so that the output is
    the probabilities: every one within 1e-6 of float64's exp-and-normalise, exactly 0 where x - max
    < -87.34 (as oneDNN's exp), in rows of 1-70 keys (the unrolled pairs of vectors and every tail),
    in one block and in packed blocks of 2 rows."""
    k = -np.arange(keys, dtype="float32") * np.float32(3.125)  # 0 .. -215.6
    if keys > 30:
        k[[28, 29, 30]] = [-87.25, -87.375, -88.5]  # either side of the cut at -87.3365
    q = np.array([[1.0], [0.5], [0.25], [2.0], [1.0]], "float32")[None]  # [1, 5, 1]
    v = np.eye(keys, dtype="float32")[None]  # [1, keys, keys]
    kk = k[None, :, None]
    views = {"q_shape": [1, 5, 1], "q_strides": [5, 1, 1], "k_shape": [1, keys, 1], "k_strides": [keys, 1, 1],
             "v_shape": [1, keys, keys], "v_strides": [keys * keys, keys, 1]}
    r = _kernel_region("att_exp", views, q, kk, v, block_rows=block_rows)
    (got,) = r.run(r.module(), q, kk, v)
    x = q[0].astype("float64") * k.astype("float64")[None]  # [5, keys], exact
    x -= x.max(-1, keepdims=True)
    e = np.exp(x)
    want = e / e.sum(-1, keepdims=True)
    cut = x < -87.3365
    assert (got[0][cut] == 0).all()
    np.testing.assert_allclose(got[0][~cut], want[~cut], rtol=1e-6, atol=0)


LN_FLT_MIN = np.uint32(0xC2AEAC50).view(np.float32)  # ln(FLT_MIN) = -87.33655 in float32, oneDNN's exp cut


@pytest.mark.parametrize("keys", [1, 17, 33, 70, 203])
def test_kernel_probabilities_the_same_bits_on_every_isa(monkeypatch, keys):
    """The softmax rows under BYOC_HETERO_ATTENTION_ISA = avx512, avx2 and generic (each falling back to
    the next where the CPU or oneDNN's ISA cap lacks it): the same output bit for bit (session 16: the
    non-AVX-512 path's std::exp gave the denormal 9.96e-39 where AVX-512 gives 0), exactly 0 at and
    below ln(FLT_MIN) (its float32 itself included), nonzero above it and within 1e-6 (or one denormal
    step) of float64's softmax; scores from 48 scales of keys spanning [-1, 0] cover [-110, 0]."""
    k = -np.linspace(0, 1, keys, dtype="float32")
    if keys > 30:
        k[[20, 21, 22]] = np.array([0xC2AEAC4F, 0xC2AEAC50, 0xC2AEAC51], np.uint32).view(np.float32)
    q = np.concatenate([[1.0], np.linspace(0.3, 110, 47)]).astype("float32")[None, :, None]  # [1, 48, 1]
    v = np.eye(keys, dtype="float32")[None]
    views = {"q_shape": [1, 48, 1], "q_strides": [48, 1, 1], "k_shape": [1, keys, 1], "k_strides": [keys, 1, 1],
             "v_shape": [1, keys, keys], "v_strides": [keys * keys, keys, 1]}
    outs = {}
    for isa in ("avx512", "avx2", "generic"):
        monkeypatch.setenv("BYOC_HETERO_ATTENTION_ISA", isa)
        r = _kernel_region("att_isa", views, q, k[None, :, None], v, block_rows=7)
        (outs[isa],) = r.run(r.module(), q, k[None, :, None], v)
    for isa in ("avx2", "generic"):
        np.testing.assert_array_equal(outs[isa].view(np.uint32), outs["avx512"].view(np.uint32), err_msg=isa)
    got = outs["generic"][0]
    x = (q[0] * k[None]).astype("float64")  # the float32 products sgemm forms (D = 1, scale 1); row max 0
    cut = x <= LN_FLT_MIN
    assert cut.any() == (keys > 1) and (got[cut] == 0).all() and (got[~cut] > 0).all()
    e = np.where(cut, 0.0, np.exp(x))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-6, atol=2.0 ** -149)


def test_an_unknown_attention_isa_cap_is_a_value_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_ATTENTION_ISA", "sse9")
    q = np.ones((1, 2, 1), "float32")
    views = {f"{n}_shape": [1, 2, 1] for n in "qkv"} | {f"{n}_strides": [2, 1, 1] for n in "qkv"}
    r = _kernel_region("att_isa", views, q, q, q)
    with pytest.raises(ValueError, match="BYOC_HETERO_ATTENTION_ISA must be auto, avx512, avx2 or generic, got 'sse9'"):
        r.run(r.module(), q, q, q)


def test_kernel_nan_and_inf_found_in_the_unrolled_vectors():
    """Rows of 70 keys whose NaN / +inf score sits in the second vector of an unrolled pair (index
    40) or in the tail (index 66): the row is NaN (safe 0) or 0 (safe 2), the others unchanged."""
    seq, keys, dim = 4, 70, 3
    q = RNG.standard_normal((1, seq, dim)).astype("float32")
    k = RNG.standard_normal((1, keys, dim)).astype("float32")
    v = RNG.standard_normal((1, keys, dim)).astype("float32")
    mask = np.zeros((seq, keys), "float32")
    mask[1, 40], mask[2, 66] = np.nan, np.inf
    views = {"q_shape": [1, seq, dim], "q_strides": [seq * dim, dim, 1],
             "k_shape": [1, keys, dim], "k_strides": [keys * dim, dim, 1],
             "v_shape": [1, keys, dim], "v_strides": [keys * dim, dim, 1]}
    for safe in (0, 2):
        r = _kernel_region("att_bad", views, q, k, v, mask, scale=0.5, has_mask=1, safe=safe)
        (got,) = r.run(r.module(), q, k, v, mask)
        want = np_attention(q, k, v, mask, 0.5, safe)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert np.isnan(got[0, 1:3]).all() == (safe == 0) and (got[0, 1:3] == 0).all() == (safe == 2)


def test_kernel_rejects_a_view_past_its_input():
    """A view reading past its input's elements is an error naming the node, not a wild read."""
    from test_runtime import create

    q = np.zeros((2, 4, 3), "float32")
    views = {f"{n}_shape": [2, 4, 3] for n in "qkv"} | {f"{n}_strides": [16, 3, 1] for n in "qkv"}  # 16 > 4 * 3
    r = _kernel_region("att_bad", views, q, q, q)
    with pytest.raises(ValueError, match=r"att_bad.*attention.*reads past the 24 elements"):
        create(r.json())


ZOO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


@pytest.mark.parametrize("model", ["whisper_tiny_encoder", "gpt2", "smollm_135m"])
def test_zoo_transformers_with_fused_attention_match_torch(fused, model):
    """Whisper's encoder (scaled query), GPT-2 (causal mask), the Llama decoder (GQA, RoPE) scaled down,
    through torch.export with every attention fused: within 1e-4 of torch eager."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, ZOO)
    import zoo_models

    zm = getattr(zoo_models, model)(small=True)
    mod, params = bh.from_torch(zm.module.eval(), zm.inputs)
    part = bh.partition(mod, params)
    assert ops_of(part).count("attention") >= 2
    got = run(build(part), [x.numpy() for x in zm.inputs])
    with torch.no_grad():
        want = zm.module(*zm.inputs).numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


OUT_VIEW = "BYOC_HETERO_ATTENTION_OUT_VIEW"


def _permute_copies(steps: list) -> list:
    """The planner's copies (op "") out of a permuted layout: the permute after P @ V made plain."""
    return [s for s in steps if s["op"] == "" and "acbd" in s["layouts"]]


@pytest.mark.parametrize("knob", ["off", "on"])
@pytest.mark.parametrize("torch_style", [False, True])
@pytest.mark.parametrize("mask_shape", [None, (1, 2, 12, 12)])
def test_out_view_writes_heads_inside_tokens(fused, monkeypatch, knob, torch_style, mask_shape):
    """BYOC_HETERO_ATTENTION_OUT_VIEW=on: the node writes P @ V [1, H, S, D] under the strides that make
    the permute to [1, S, H, D] a view (its layouts say acbd) and the planner's copy after it is gone;
    off (the default) writes it plain and the copy stays.  Either way the llvm-only build's output."""
    from model_paths import run_profiled

    monkeypatch.setenv(OUT_VIEW, knob)
    mod = attention_module(mask_shape=mask_shape, torch_style=torch_style)
    offload_and_compare(mod)
    x = RNG.standard_normal((1, 12, 8)).astype("float32")
    inputs = [x] + ([RNG.standard_normal(mask_shape).astype("float32")] if mask_shape else [])
    _out, steps = run_profiled(bh.partition(mod), inputs)
    (node,) = [s for s in steps if s["op"] == "attention"]
    assert node["layouts"].endswith("out=[1,2,12,4]:" + ("acbd" if knob == "on" else "abcd")), node
    assert len(_permute_copies(steps)) == (0 if knob == "on" else 1), steps


def test_out_view_bad_value_is_an_error_naming_it(fused, monkeypatch):
    monkeypatch.setenv(OUT_VIEW, "yes")
    with pytest.raises(Exception, match="BYOC_HETERO_ATTENTION_OUT_VIEW must be on or off, got 'yes'"):
        offload_and_compare(attention_module())


@pytest.mark.parametrize("path", ["from_torch", "from_onnx_dynamo"])
def test_phi3_attention_writes_in_place(monkeypatch, tmp_path, path):
    """The small Phi-3-style decoder through torch.onnx.export's default (dynamo) exporter (P @ V
    [1, H, S, D]) and through torch.export (TVM's frontend: [H, S, D], reshaped to [1, H, S, D] before
    the permute: the hint splits the batch dims), with the output view on: one attention node per layer,
    no copy after it, within 1e-4 of torch eager."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from model_paths import run_profiled

    sys.path.insert(0, ZOO)
    import zoo_models

    monkeypatch.setenv(ENV, "fused")
    monkeypatch.setenv(OUT_VIEW, "on")
    zm = zoo_models.phi3_decoder(small=True)
    if path == "from_torch":
        mod, params = bh.from_torch(zm.module.eval(), zm.inputs)
    else:
        pytest.importorskip("onnxscript")
        file = str(tmp_path / "phi3.onnx")
        torch.onnx.export(zm.module, zm.inputs, file, input_names=list(zm.input_names))
        mod, params = bh.from_onnx(file)
    got, steps = run_profiled(bh.partition(mod, params), [x.numpy() for x in zm.inputs])
    assert [s["op"] for s in steps].count("attention") == 2
    assert not _permute_copies(steps), steps
    with torch.no_grad():
        want = zm.module(*zm.inputs)
    want = (want[0] if isinstance(want, (tuple, list)) else want).numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
