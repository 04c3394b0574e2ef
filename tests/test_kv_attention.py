"""The runtime's kv_attention (cpp/kernels/kv_attention.cc) called directly, against numpy.

Reference: numpy RoPE (transformers' rotate_half form) and softmax attention over the cache rows each
query row may see; the caches compared row by row to what must (and must not) have been written.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm

import byoc_hetero as bh  # noqa: F401  (registers byoc_hetero.runtime.kv_attention)

KV_ATTENTION = tvm.get_global_func("byoc_hetero.runtime.kv_attention")
RNG = np.random.default_rng(36)


def _rope(x: np.ndarray, pos: int, inv: np.ndarray, scale: float) -> np.ndarray:
    angle = (np.float32(pos) * inv).astype("float32")
    c, s = np.cos(np.concatenate([angle, angle])) * scale, np.sin(np.concatenate([angle, angle])) * scale
    half = x.shape[-1] // 2
    return x * c + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * s


def _reference(q, k, v, kc, vc, past, lengths, inv, scale, window, rope_scale):
    kc, vc, out = kc.copy(), vc.copy(), np.zeros_like(q)
    batch, rows, heads, _ = q.shape
    group = heads // k.shape[2]
    for b in range(batch):
        for s in range(lengths[b]):
            pos = past[b] + s
            kc[b, :, pos] = _rope(k[b, s], pos, inv, rope_scale)
            vc[b, :, pos] = v[b, s]
        for s in range(lengths[b]):
            pos = past[b] + s
            first = max(0, pos - window + 1) if window else 0
            for h in range(heads):
                qr = _rope(q[b, s, h], pos, inv, rope_scale)
                keys, values = kc[b, h // group, first:pos + 1], vc[b, h // group, first:pos + 1]
                w = keys.astype("float64") @ qr * scale
                p = np.exp(w - w.max())
                out[b, s, h] = (p / p.sum()) @ values
    return out, kc, vc


def _case(batch=2, rows=3, heads=4, kv_heads=2, dim=8, length=12):
    f = lambda *s: RNG.standard_normal(s).astype("float32")  # noqa: E731
    return dict(q=f(batch, rows, heads, dim), k=f(batch, rows, kv_heads, dim), v=f(batch, rows, kv_heads, dim),
                kc=f(batch, kv_heads, length, dim), vc=f(batch, kv_heads, length, dim),
                inv=(1.0 / 10000 ** (np.arange(0, dim, 2) / dim)).astype("float32"))


def _call(c, past, lengths, scale=0.35, window=0, rope_scale=1.0):
    t = {n: tvm.runtime.tensor(a) for n, a in c.items()}
    KV_ATTENTION(t["q"], t["k"], t["v"], t["kc"], t["vc"], tvm.runtime.tensor(np.array(past, "int64")),
                 tvm.runtime.tensor(np.array(lengths, "int64")), t["inv"], scale, window, rope_scale)
    return t["q"].numpy(), t["kc"].numpy(), t["vc"].numpy()


def _check(c, past, lengths, window=0, rope_scale=1.0, rtol=2e-5):
    """Run kv_attention on case ``c`` and compare with numpy's reference: the outputs (``rtol``), the
    appended cache rows; returns the outputs."""
    out, kc, vc = _call(c, past, lengths, window=window, rope_scale=rope_scale)
    want_out, want_kc, want_vc = _reference(c["q"], c["k"], c["v"], c["kc"], c["vc"], past, lengths, c["inv"], 0.35,
                                            window, rope_scale)
    np.testing.assert_allclose(out, want_out, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(kc, want_kc, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(vc, want_vc)
    return out


@pytest.mark.parametrize("window,rope_scale", [(0, 1.0), (4, 1.0), (0, 1.25)])
def test_matches_numpy_with_padding_rows_gqa_and_window(window, rope_scale):
    """Two sequences (past 5 and 2; 3 and 1 real rows of 3): outputs, appended cache rows, and
    every other cache row untouched (the caches start as noise: rows past the offsets are read by nobody)."""
    c = _case()
    past, lengths = [5, 2], [3, 1]
    out = _check(c, past, lengths, window=window, rope_scale=rope_scale, rtol=1e-5)
    assert not out[1, 1:].any()  # padding rows: 0


ISAS = ["avx512", "avx2", "generic"]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dim,window", [(6, 0), (18, 5), (40, 0), (64, 0), (72, 9), (130, 0)])
def test_each_isa_matches_numpy_on_head_dims_off_the_vector_width(monkeypatch, isa, dim, window):
    """The AVX-512 (masked tail), AVX2 (scalar tail) and generic row implementations
    (BYOC_HETERO_KV_ISA caps the choice; a CPU without the ISA falls back to the next) against numpy:
    head_dim not a multiple of 16 or 8, GQA with groups of 3, a context of 30-33 keys (the exp's vector
    loop and its tail), decode (1 row) and prefill (3 rows) in one batch, a sliding window."""
    monkeypatch.setenv("BYOC_HETERO_KV_ISA", isa)
    c = _case(batch=2, rows=3, heads=6, kv_heads=2, dim=dim, length=40)
    past, lengths = [30, 29], [1, 3]
    _check(c, past, lengths, window=window)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dim", [40, 64, 80])
def test_each_isa_matches_numpy_on_a_prefill_of_many_rows(monkeypatch, isa, dim):
    """A prefill: 37 new rows after 9 cached ones (each row sees 10 to 46 keys: the scores' blocks of 16
    keys and their tails, the value sums' pairs of keys and an odd last one; the threads take the rows
    round robin) beside a sequence of 20 rows from an empty cache, against numpy."""
    monkeypatch.setenv("BYOC_HETERO_KV_ISA", isa)
    c = _case(batch=2, rows=37, heads=6, kv_heads=2, dim=dim, length=48)
    past, lengths = [9, 0], [37, 20]
    out = _check(c, past, lengths)
    assert not out[1, 20:].any()


# heads, kv heads, head_dim, rows, window, past, lengths: the blocked form's tasks (about 64 query vectors:
# 21 rows of a group of 3, 9 of 7, 64 of 1) and their tails, score tiles of 8 vectors and value tiles of 4
# across rows, key blocks of 16 and a last partial one, windows, a cached past, padding rows
PREFILL_CASES = [
    (6, 2, 40, 37, 0, [9, 0], [37, 20]),
    (9, 3, 64, 70, 0, [0, 5], [70, 33]),
    (7, 1, 18, 30, 5, [3, 0], [30, 30]),
    (4, 4, 130, 66, 20, [0, 17], [66, 2]),
    (6, 2, 8, 2, 0, [4, 0], [2, 1]),
]


@pytest.mark.parametrize("mode", ["blocked", "wide", "rows"])
@pytest.mark.parametrize("heads,kv_heads,dim,rows,window,past,lengths", PREFILL_CASES)
def test_the_blocked_prefill_and_the_rows_match_numpy(monkeypatch, mode, heads, kv_heads, dim, rows, window, past,
                                                       lengths):
    """BYOC_HETERO_KV_PREFILL=blocked (from 2 rows: the AVX-512 blocked form, tiles of query vectors over the
    keys transposed; a CPU without AVX-512 runs the rows), the same with BYOC_HETERO_KV_TILES=wide (score tiles
    of up to 3 key blocks: spans of 3 to 8 blocks take tiles of 3, 2 and 1) and =rows (one task per row and
    head) against numpy: outputs, appended cache rows, padding rows 0."""
    monkeypatch.setenv("BYOC_HETERO_KV_PREFILL", "blocked" if mode == "wide" else mode)
    monkeypatch.setenv("BYOC_HETERO_KV_TILES", "wide" if mode == "wide" else "narrow")
    length = max(p + n for p, n in zip(past, lengths)) + 3
    c = _case(batch=2, rows=rows, heads=heads, kv_heads=kv_heads, dim=dim, length=length)
    out = _check(c, past, lengths, window=window)
    for b, n in enumerate(lengths):
        assert not out[b, n:].any()


def test_the_blocked_prefill_agrees_with_the_rows_at_smollm_shapes(monkeypatch):
    """A SmolLM-135M layer's prefill (9 / 3 heads of 64, 150 rows): the three forms within float rounding (the
    wide tiles: spans of up to 10 key blocks, tiles of 3, 3, 3 and 1)."""
    c = _case(batch=1, rows=150, heads=9, kv_heads=3, dim=64, length=160)
    got = {}
    for mode, tiles in (("blocked", "narrow"), ("blocked", "wide"), ("rows", "narrow")):
        monkeypatch.setenv("BYOC_HETERO_KV_PREFILL", mode)
        monkeypatch.setenv("BYOC_HETERO_KV_TILES", tiles)
        got[mode, tiles] = _call(dict(c), [0], [150], scale=0.125)[0]
    np.testing.assert_allclose(got["blocked", "narrow"], got["rows", "narrow"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["blocked", "wide"], got["rows", "narrow"], rtol=1e-5, atol=1e-6)


def test_an_unknown_tile_form_is_a_value_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_KV_PREFILL", "blocked")
    monkeypatch.setenv("BYOC_HETERO_KV_TILES", "huge")
    with pytest.raises(ValueError, match="BYOC_HETERO_KV_TILES must be narrow or wide, got 'huge'"):
        _call(_case(rows=3), [0, 0], [3, 3])


def test_an_unknown_prefill_form_is_a_value_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_KV_PREFILL", "fast")
    with pytest.raises(ValueError, match="BYOC_HETERO_KV_PREFILL must be auto, blocked or rows, got 'fast'"):
        _call(_case(), [0, 0], [1, 1])


def test_rope_rows_kept_across_calls_follow_the_frequencies_scale_and_positions(monkeypatch):
    """The RoPE rows kept by position across calls (the calling thread's table): calls alternating two decoders'
    frequencies (head dims 8 and 16), a rope scale changed between calls with the same frequencies, positions
    past the rows made so far (the table grows), each against numpy; BYOC_HETERO_KV_ROPE=call (this call's rows
    alone) gives the same bits."""
    monkeypatch.setenv("BYOC_HETERO_KV_PREFILL", "blocked")
    small, wide = _case(rows=20, dim=8, length=80), _case(rows=20, dim=16, length=80)
    wide["inv"] = (wide["inv"] * 1.7).astype("float32")
    calls = [(small, [0, 3], [20, 9], 1.0), (wide, [0, 0], [20, 20], 1.0), (small, [40, 55], [20, 20], 1.0),
             (small, [40, 55], [20, 20], 1.25), (wide, [58, 1], [20, 2], 1.0)]
    for c, past, lengths, rope_scale in calls:
        monkeypatch.setenv("BYOC_HETERO_KV_ROPE", "table")
        table = _check(c, past, lengths, rope_scale=rope_scale)
        monkeypatch.setenv("BYOC_HETERO_KV_ROPE", "call")
        np.testing.assert_array_equal(_call(c, past, lengths, rope_scale=rope_scale)[0], table)


def test_an_unknown_rope_source_is_a_value_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_KV_ROPE", "cache")
    with pytest.raises(ValueError, match="BYOC_HETERO_KV_ROPE must be table or call, got 'cache'"):
        _call(_case(), [0, 0], [1, 1])


def test_an_unknown_isa_cap_is_a_value_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_KV_ISA", "sse9")
    with pytest.raises(ValueError, match="BYOC_HETERO_KV_ISA must be auto, avx512, avx2 or generic, got 'sse9'"):
        _call(_case(), [0, 0], [1, 1])


def test_overflowing_sequence_is_an_input_error_before_any_write():
    c = _case()
    with pytest.raises(bh.InputError, match="sequence 1 would grow to 13 tokens, past the cache's max_length 12"):
        _call(c, [0, 10], [3, 3])
    t_kc = c["kc"].copy()
    with pytest.raises(bh.InputError, match="sequence 0 has past -1"):
        _call(c, [-1, 0], [1, 1])
    np.testing.assert_array_equal(c["kc"], t_kc)


def test_mismatched_shapes_and_dtypes_say_which_argument():
    c = _case()
    bad = dict(c, vc=c["vc"][:, :1].copy())
    with pytest.raises(ValueError, match=r"v_cache must have shape \[2, 2, 12, 8\], got \[2, 1, 12, 8\]"):
        _call(bad, [0, 0], [1, 1])
    bad = dict(c, q=c["q"].astype("float64"))
    with pytest.raises(ValueError, match="q must be a rank-4 float32 tensor"):
        _call(bad, [0, 0], [1, 1])
    bad = dict(c, q=c["q"][:, :, :3].copy())  # 3 query heads over 2 kv heads
    with pytest.raises(ValueError, match="3 query heads over 2 kv heads"):
        _call(bad, [0, 0], [1, 1])


def _region_documents(gen):
    return [json.loads(m["get_graph_json"]()) for m in bh.codegen.region_modules(gen._executable)]


def _llama(layers: int = 2):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.4)
    return transformers.LlamaForCausalLM(config).eval()


def test_the_step_is_one_region_with_a_kv_attention_node_per_layer_and_matches_the_llvm_build():
    """The whole step is one region call: every layer's attention a node of it (the caches are
    region inputs), the last-row gather a take node and the LM head after it, nothing on llvm; the
    llvm-only build (the packed function through call_tir_inplace) gives the same logits and
    caches."""
    from tvm import relax

    from byoc_hetero.llm import model as llm_model

    model = _llama()
    part, _, _ = bh.llm.partitioned_step(model, max_length=16)
    rep = bh.report(part)
    assert not rep.fallbacks and len(rep.regions) == 1, str(rep)
    gen = bh.llm.from_hf(model, max_length=16)
    docs = _region_documents(gen)
    assert len(docs) == 1
    ops = [n["op"] for n in docs[0]["nodes"]]
    # the embedding, and the last layer's picks of each sequence's last row (its input x and its residual h:
    # BYOC_HETERO_LAST_LAYER_ROWS=last, the default)
    assert ops.count("kv_attention") == 2 and ops.count("take") == 3, ops
    spec = gen.spec
    mod = llm_model.step_module(spec, 16)
    params = llm_model.decoder_weights(spec, model)
    plain = bh.llm.Generator(relax.build(bh.bind_params(mod, params), target="llvm"), spec, 16)
    tokens = np.array([[3, 9, 27, 5], [40, 2, 0, 0]])
    caches = [gen.new_cache(2), plain.new_cache(2)]
    for step in range(3):
        past, lengths = (np.array([0, 0]), np.array([4, 2])) if step == 0 else (np.array([3 + step, 1 + step]),
                                                                                 np.array([1, 1]))
        feed = tokens if step == 0 else np.array([[step], [step + 7]])
        got, want = (g.step(feed, past, lengths, c) for g, c in zip((gen, plain), caches))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for a, b in zip(*caches):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_a_written_input_that_is_no_region_input_is_refused_when_the_region_loads():
    traits = bh._C.kernel_traits()
    assert traits["kv_attention"]["writes_inputs"] == [3, 4]  # declared where the kernel registers
    assert not any(t["writes_inputs"] for op, t in traits.items() if op != "kv_attention")
    gen = bh.llm.from_hf(_llama(1), max_length=16)
    doc = next(d for d in _region_documents(gen) if any(n["op"] == "kv_attention" for n in d["nodes"]))
    node = next(n for n in doc["nodes"] if n["op"] == "kv_attention")
    shapes = [[1 if isinstance(d, str) else d for d in doc["tensors"][t]["shape"]] for t in doc["inputs"]]
    assert bh._C.plan_region(json.dumps(doc), shapes)["run_steps"]  # B = S = 1: the document as built plans
    node["inputs"][3] = node["inputs"][0]  # k_cache := q, a node output
    with pytest.raises(ValueError, match=r"input 3 \(tensor \d+\) is written in place by 'kv_attention' and so must "
                                         r"be a float32 region input read by this node only; it is no region input"):
        bh._C.plan_region(json.dumps(doc), shapes)


@pytest.fixture
def two_threads():
    """The packed function runs with the process's thread count: 2 here, so that split cuts two runs (and
    grouped gives each thread a share) whatever the machine's default."""
    from byoc_hetero import _C

    saved = _C.num_threads()
    _C.set_num_threads(2)
    yield
    _C.set_num_threads(saved)


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize("mode", ["split", "grouped", "rows"])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("heads,kv_heads,dim,window", [(9, 3, 64, 0), (14, 2, 40, 150), (5, 5, 18, 0)])
def test_the_decode_forms_match_numpy(monkeypatch, mode, isa, heads, kv_heads, dim, window):
    """BYOC_HETERO_KV_DECODE=split (each head's keys cut in one run per thread, the runs' outputs merged),
    =grouped (a decode step's heads in contiguous runs per thread) and =rows (round robin), on each ISA's row
    function, against numpy: one new row of four sequences at different offsets (200 and 150 keys: runs of
    unequal length; 5 keys: too few to split; one stopped: no row, output 0), GQA groups of 3 and 7 and none, a
    sliding window of 150 (the runs cut the window, not the cache)."""
    monkeypatch.setenv("BYOC_HETERO_KV_DECODE", mode)
    monkeypatch.setenv("BYOC_HETERO_KV_ISA", isa)
    c = _case(batch=4, rows=1, heads=heads, kv_heads=kv_heads, dim=dim, length=210)
    out = _check(c, [199, 149, 4, 30], [1, 1, 1, 0], window=window)
    assert not out[3].any()


@pytest.mark.usefixtures("two_threads")
def test_the_split_decode_agrees_with_the_rows_at_smollm_shapes(monkeypatch):
    """A SmolLM-135M layer's decode step (9 / 3 heads of 64) after 1000 cached tokens: split and rows within
    float rounding, and the same cache rows written."""
    c = _case(batch=1, rows=1, heads=9, kv_heads=3, dim=64, length=1024)
    got = {}
    for mode in ("split", "rows"):
        monkeypatch.setenv("BYOC_HETERO_KV_DECODE", mode)
        got[mode] = _call(dict(c), [1000], [1], scale=0.125)
    np.testing.assert_allclose(got["split"][0], got["rows"][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["split"][1], got["rows"][1])


@pytest.mark.parametrize("variable,query,value,resolved", [
    ("BYOC_HETERO_KV_DECODE", "kv_decode_form", None, "grouped"),
    ("BYOC_HETERO_KV_DECODE", "kv_decode_form", "", "grouped"),
    ("BYOC_HETERO_KV_DECODE", "kv_decode_form", "rows", "rows"),
    ("BYOC_HETERO_KV_DECODE", "kv_decode_form", "split", "split"),
    ("BYOC_HETERO_KV_TILES", "kv_tile_blocks", None, 3),
    ("BYOC_HETERO_KV_TILES", "kv_tile_blocks", "", 3),
    ("BYOC_HETERO_KV_TILES", "kv_tile_blocks", "narrow", 1),
    ("BYOC_HETERO_KV_TILES", "kv_tile_blocks", "wide", 3)])
def test_session_15_defaults(monkeypatch, variable, query, value, resolved):
    """Unset or empty, BYOC_HETERO_KV_DECODE runs the grouped decode form and BYOC_HETERO_KV_TILES the wide score
    tiles (3 key blocks) of the blocked prefill (the defaults since session 15's quiet A/Bs, bench/GENERATE.md);
    a set value its own. What the kernel resolves, read through its registered query."""
    if value is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, value)
    assert tvm.get_global_func(f"byoc_hetero.runtime.{query}")() == resolved


def test_an_unknown_decode_form_is_a_value_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_KV_DECODE", "fast")
    with pytest.raises(ValueError, match="BYOC_HETERO_KV_DECODE must be rows, grouped or split, got 'fast'"):
        _call(_case(rows=1), [0, 0], [1, 1])


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize("form", ["split", "grouped", "rows", "blocked"])
@pytest.mark.parametrize("isa", ISAS)
def test_far_keys_weigh_0_and_nan_scores_give_nan_on_every_isa_and_form(monkeypatch, form, isa):
    """The exp of the shifted scores is softmax_exp.h's on every ISA and form (session 16; each ISA had its own:
    the vector ones clamped at -87.3, so a key 105 below the row's best weighed 1.2e-38, times its value 3e38 +3.6
    in the output, and a NaN score got that weight too, a finite output; the scalar ones kept NaN). RoPE off
    (frequencies 0), scores 0 but for a far key (-105) per head: each output as numpy's (the far key's weight
    exp(-105), 2e-46); a NaN in a visible cache row of head 0 and in the query of head 1 (first row) make
    those outputs NaN and leave the others finite. Decode (split: two runs of 75 keys, merged), or a
    prefill of 3 rows (blocked on AVX-512)."""
    monkeypatch.setenv("BYOC_HETERO_KV_ISA", isa)
    monkeypatch.setenv("BYOC_HETERO_KV_DECODE", "grouped" if form == "blocked" else form)
    monkeypatch.setenv("BYOC_HETERO_KV_PREFILL", "blocked")
    rows = 3 if form == "blocked" else 1
    c = _case(batch=2, rows=rows, heads=2, kv_heads=2, dim=16, length=160)
    c["inv"][:] = 0
    c["q"][..., 0], c["q"][..., 1:] = 300.0, 0.0
    c["k"][..., 0] = c["kc"][..., 0] = 0.0
    c["kc"][:, :, 7, 0] = -1.0  # score 300 * -1 * 0.35 = -105
    c["vc"][:, :, 7] = 3e38
    c["kc"][0, 0, 20, 3] = np.nan
    c["q"][1, 0, 1, 5] = np.nan
    out, _, _ = _call(c, [150, 150], [rows, rows])
    want, _, _ = _reference(c["q"], c["k"], c["v"], c["kc"], c["vc"], [150, 150], [rows, rows], c["inv"], 0.35, 0, 1.0)
    nan = np.zeros(out.shape, bool)
    nan[0, :, 0], nan[1, 0, 1] = True, True
    np.testing.assert_array_equal(np.isnan(out), nan)
    np.testing.assert_array_equal(np.isnan(want), nan)
    np.testing.assert_allclose(out[~nan], want[~nan], rtol=1e-5, atol=1e-5)
