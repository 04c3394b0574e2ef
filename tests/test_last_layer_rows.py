"""``BYOC_HETERO_LAST_LAYER_ROWS=last`` (byoc_hetero/llm/model.py): the step's last layer runs q, the attention,
o and the MLP on each sequence's last row alone (the only rows the LM head reads), its k and v on every row
(the cache's); kv_attention takes a q of one row a sequence while k and v have S (cpp/kernels/kv_attention.cc).

References: numpy's attention (test_kv_attention's reference) for the kernel's one-row q; transformers' forward
and ``generate`` (small random configs of every family) and the llvm-only build for the generator.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from test_kv_attention import ISAS, KV_ATTENTION, _case, _reference, two_threads  # noqa: F401 (a fixture)

import byoc_hetero as bh
from byoc_hetero.llm import model as llm_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _last_rows_call(c, past, lengths, window):
    """The kernel with q holding each sequence's last new row alone: (outputs [B, 1, H, D], k_cache, v_cache)."""
    q_last = np.stack([c["q"][b, max(n, 1) - 1] for b, n in enumerate(lengths)])[:, None].copy()
    t = {n: tvm.runtime.tensor(a) for n, a in {**c, "q": q_last}.items()}
    KV_ATTENTION(t["q"], t["k"], t["v"], t["kc"], t["vc"], tvm.runtime.tensor(np.array(past, "int64")),
                 tvm.runtime.tensor(np.array(lengths, "int64")), t["inv"], 0.35, window, 1.0)
    return t["q"].numpy(), t["kc"].numpy(), t["vc"].numpy()


@pytest.mark.usefixtures("two_threads")
@pytest.mark.parametrize("form", ["grouped", "rows", "split"])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("window", [0, 40])
def test_a_one_row_q_attends_each_sequences_last_row_and_appends_every_row(monkeypatch, form, isa, window):
    """Three sequences of 70 rows (past 100, 0, 3; new 70, 33, 0: padding rows and a sequence with no new row),
    2 threads: the cache gets every new K / V row as numpy's reference writes them, and the one q row of each
    sequence gets the reference's output at that sequence's last new row (0 for the sequence without one), under
    every decode form (split: two runs of the first sequence's 170 keys) and ISA."""
    monkeypatch.setenv("BYOC_HETERO_KV_DECODE", form)
    monkeypatch.setenv("BYOC_HETERO_KV_ISA", isa)
    c = _case(batch=3, rows=70, heads=6, kv_heads=2, dim=40, length=180)
    past, lengths = [100, 0, 3], [70, 33, 0]
    out, kc, vc = _last_rows_call(c, past, lengths, window)
    want_out, want_kc, want_vc = _reference(c["q"], c["k"], c["v"], c["kc"], c["vc"], past, lengths, c["inv"], 0.35,
                                            window, 1.0)
    want_last = np.stack([want_out[b, n - 1] if n else np.zeros_like(want_out[b, 0]) for b, n in enumerate(lengths)])
    assert out.shape == (3, 1, 6, 40)
    np.testing.assert_allclose(out[:, 0], want_last, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(kc, want_kc, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(vc, want_vc)


def test_a_q_of_other_rows_than_k_or_one_is_a_value_error_saying_so():
    c = _case(batch=1, rows=3)
    c["q"] = c["q"][:, :2].copy()
    with pytest.raises(ValueError, match=r"q has 2 rows and k 3 \(expected as many, or 1: each sequence's last new "
                                         r"row alone\)"):
        KV_ATTENTION(*(tvm.runtime.tensor(c[n]) for n in ("q", "k", "v", "kc", "vc")),
                     tvm.runtime.tensor(np.array([0], "int64")), tvm.runtime.tensor(np.array([3], "int64")),
                     tvm.runtime.tensor(c["inv"]), 0.35, 0, 1.0)


def test_a_bad_variable_is_a_value_error_naming_it(monkeypatch):
    monkeypatch.setenv(llm_model.LAST_LAYER_VARIABLE, "first")
    with pytest.raises(ValueError, match="BYOC_HETERO_LAST_LAYER_ROWS must be all or last, got 'first'"):
        llm_model.last_layer_rows()
    monkeypatch.setenv(llm_model.LAST_LAYER_VARIABLE, "")
    assert llm_model.last_layer_rows() == "last"  # the default (quiet A/B, session 17)
    monkeypatch.setenv(llm_model.LAST_LAYER_VARIABLE, "all")
    assert llm_model.last_layer_rows() == "all"


def _ops(gen) -> tuple[int, int, int]:
    """(take nodes, binary add nodes, residual sums folded into a dense / dense_wq) over the generator's regions."""
    nodes = [n for m in bh.codegen.region_modules(gen._executable) for n in json.loads(str(m["get_graph_json"]()))["nodes"]]
    return (sum(n["op"] == "take" for n in nodes),
            sum(n["op"] == "binary" and n["attrs"].get("algorithm") == "add" for n in nodes),
            sum(n["attrs"].get("residual", 0) for n in nodes))


def _kv_nodes(gen) -> list[tuple[list, list]]:
    """(q's shape, k's shape) of every kv_attention node of the generator's regions, in order."""
    out = []
    for m in bh.codegen.region_modules(gen._executable):
        doc = json.loads(str(m["get_graph_json"]()))
        out += [(doc["tensors"][n["inputs"][0]]["shape"], doc["tensors"][n["inputs"][1]]["shape"])
                for n in doc["nodes"] if n["op"] == "kv_attention"]
    return out


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma", "phi3"])
def test_every_family_gives_transformers_logits_and_tokens(monkeypatch, family):
    """Each family's generator built with the variable ``last``: the last layer's kv_attention takes a one-row q (the
    other layers' S rows); a prefill of 67 rows (the blocked attention and the inner product in the other layers) or
    of 7, and 5 decode steps after each, give transformers' logits at every position; greedy generation of 24
    tokens from the 7 is transformers' token for token."""
    from test_generate import MAX_LENGTH, VOCAB, _hf_generate, _model, _rel

    model = _model(family)
    monkeypatch.setenv(llm_model.LAST_LAYER_VARIABLE, "last")
    gen = bh.llm.from_hf(model, max_length=MAX_LENGTH)
    monkeypatch.setenv(llm_model.LAST_LAYER_VARIABLE, "all")
    nodes = _kv_nodes(gen)
    assert [q[1] for q, _ in nodes] == ["S"] * (len(nodes) - 1) + [1], nodes
    assert all(k[1] == "S" for _, k in nodes), nodes
    # the picks of x and h in place of the final pick; no add step: every residual add is still a dense's sum
    ops, ops_all = _ops(gen), _ops(bh.llm.from_hf(model, max_length=MAX_LENGTH))
    assert ops == (ops_all[0] + 1, 0, 2 * gen.spec.layers) and ops_all[1:] == ops[1:], (ops, ops_all)
    tokens = np.random.default_rng(67).integers(0, VOCAB, (1, MAX_LENGTH)).astype("int64")
    with torch.no_grad():
        want = model(torch.tensor(tokens)).logits.numpy()[0]
    for rows in (67, 7):
        cache = gen.new_cache(1)
        got = [gen.step(tokens[:, :rows], np.array([0]), np.array([rows]), cache)[0].copy()]
        got += [gen.step(tokens[:, p:p + 1], np.array([p]), np.array([1]), cache)[0].copy()
                for p in range(rows, rows + 5)]
        errors = [_rel(logits, want[p]) for logits, p in zip(got, range(rows - 1, rows + 5))]
        assert max(errors) < 1e-4, (rows, errors)
    prompt = tokens[:, :7]
    np.testing.assert_array_equal(gen.generate(prompt, max_new_tokens=24),
                                  _hf_generate(model, prompt, 24, eos_token_id=None))


def test_a_batch_of_different_lengths_matches_each_alone_and_the_llvm_build(monkeypatch):
    """A batch of prompts of 3, 10 and 5 tokens (padding rows in the last layer's picked rows' neighbours) generates
    each prompt's tokens alone and transformers'; the llvm-only build of the same step (the TIR function calling the
    kernel with the one-row q) gives the same prefill logits."""
    from tvm import relax

    from test_generate import _hf_generate, _model

    model = _model("qwen2")
    monkeypatch.setenv(llm_model.LAST_LAYER_VARIABLE, "last")
    gen = bh.llm.from_hf(model, max_length=32)
    spec = gen.spec
    plain = bh.llm.Generator(relax.build(bh.bind_params(llm_model.step_module(spec, 32),
                                                        llm_model.decoder_weights(spec, model)), target="llvm"),
                             spec, 32)
    monkeypatch.setenv(llm_model.LAST_LAYER_VARIABLE, "all")
    prompts = [[5, 71, 13], [9, 8, 7, 6, 5, 4, 3, 2, 1, 60], [44, 2, 90, 17, 33]]
    batch = gen.generate(prompts, max_new_tokens=12)
    for prompt, got in zip(prompts, batch):
        np.testing.assert_array_equal(got, gen.generate(np.array([prompt]), max_new_tokens=12)[0])
        np.testing.assert_array_equal(got, _hf_generate(model, np.array([prompt]), 12)[0])
    tokens = np.zeros((3, 10), "int64")
    for b, p in enumerate(prompts):
        tokens[b, :len(p)] = p
    lengths = np.array([len(p) for p in prompts])
    got, want = (g.step(tokens, np.zeros(3, "int64"), lengths, g.new_cache(3)) for g in (gen, plain))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_quantized_weights_and_a_saved_generator_keep_the_tokens(monkeypatch, tmp_path, weights):
    """int8 / int4 weights (dense_wq, its one-row form in the last layer) with the variable ``last``: the same greedy
    tokens as the same weights built with every row, logits of the prompt and 4 steps within 1e-4 of them (the same
    codes; only the last layer's row count differs); the generator saved and loaded generates those tokens."""
    from test_generate import MAX_LENGTH, PROMPT, _forced_logits, _quant_model, _rel

    model = _quant_model()
    monkeypatch.setenv(llm_model.LAST_LAYER_VARIABLE, "all")
    rows_all = bh.llm.from_hf(model, max_length=MAX_LENGTH, weights=weights)
    monkeypatch.setenv(llm_model.LAST_LAYER_VARIABLE, "last")
    last = bh.llm.from_hf(model, max_length=MAX_LENGTH, weights=weights)
    monkeypatch.setenv(llm_model.LAST_LAYER_VARIABLE, "all")
    assert [q[1] for q, _ in _kv_nodes(last)][-1] == 1
    assert _ops(last)[1:] == _ops(rows_all)[1:] == (0, 2 * last.spec.layers)  # every residual add a dense_wq's sum
    want = rows_all.generate(PROMPT, max_new_tokens=12)
    np.testing.assert_array_equal(last.generate(PROMPT, max_new_tokens=12), want)
    got, ref = _forced_logits(last, want[:, :PROMPT.shape[1] + 5]), _forced_logits(rows_all, want[:, :PROMPT.shape[1] + 5])
    assert max(_rel(g, r) for g, r in zip(got, ref)) < 1e-4
    last.save(tmp_path / "gen")
    np.testing.assert_array_equal(bh.llm.load(tmp_path / "gen").generate(PROMPT, max_new_tokens=12), want)
