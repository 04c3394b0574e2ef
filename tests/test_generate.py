"""Generation with a KV cache kept in place (bh.llm, issue 36) against transformers.

Reference: the same transformers model (small random configs of each family): its full-sequence
forward for the logits, its ``generate(do_sample=False)`` for the tokens. Weights are drawn with a
wide init (``initializer_range`` 0.4) so that greedy decoding wanders over the vocabulary instead of
repeating one token, and so that a wrong cache row or position shows in the tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

import byoc_hetero as bh

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 96
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.4)


def _config(family: str):
    t = transformers
    if family == "llama":
        return t.LlamaConfig(**COMMON, tie_word_embeddings=True)
    if family == "qwen2":  # q / k / v biases
        return t.Qwen2Config(**COMMON, tie_word_embeddings=False)
    if family == "mistral":  # a sliding window shorter than the sequences
        return t.MistralConfig(**COMMON, head_dim=16, sliding_window=7)
    if family == "gemma":  # (1 + weight) norms, sqrt(hidden) embedding scale, gelu-tanh MLP
        return t.GemmaConfig(**COMMON, head_dim=16)
    if family == "phi3":  # fused qkv and gate_up projections
        return t.Phi3Config(**COMMON, pad_token_id=0)
    raise AssertionError(family)


FAMILIES = ["llama", "qwen2", "mistral", "gemma", "phi3"]
MAX_LENGTH = 72  # a prompt of 7 and 64 new tokens, as issue 36 asks
NEW = 64
PROMPT = np.array([[5, 71, 13, 88, 2, 40, 19]], dtype="int64")


def _model(family: str):
    torch.manual_seed(36)
    cls = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM",
           "gemma": "GemmaForCausalLM", "phi3": "Phi3ForCausalLM"}[family]
    model = getattr(transformers, cls)(_config(family)).eval()
    if family == "qwen2":  # transformers initializes biases to 0: make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 0.5)
    return model


_BUILT: dict[str, tuple] = {}


def _built(family: str):
    """(transformers model, generator) per family, built once per test session."""
    if family not in _BUILT:
        model = _model(family)
        _BUILT[family] = (model, bh.llm.from_hf(model, max_length=MAX_LENGTH))
    return _BUILT[family]


def _hf_generate(model, ids: np.ndarray, new: int, **kw) -> np.ndarray:
    with torch.no_grad():
        out = model.generate(torch.tensor(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                             max_new_tokens=new, do_sample=False, pad_token_id=0, **kw)
    return out.numpy()


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_then_decode_steps_match_the_full_forward(family):
    """Prefill of 7 tokens, then 12 single-token steps on the same cache: each step's logits are
    those of transformers' full-sequence forward at that position."""
    model, gen = _built(family)
    tokens = np.concatenate([PROMPT, np.array([[1, 60, 33, 7, 94, 21, 50, 8, 77, 3, 45, 66]])], axis=1)
    with torch.no_grad():
        want = model(torch.tensor(tokens)).logits.numpy()[0]
    cache = gen.new_cache(1)
    n = PROMPT.shape[1]
    errors = [_rel(gen.step(PROMPT, np.array([0]), np.array([n]), cache)[0], want[n - 1])]
    for pos in range(n, tokens.shape[1]):
        logits = gen.step(tokens[:, pos:pos + 1], np.array([pos]), np.array([1]), cache)
        errors.append(_rel(logits[0], want[pos]))
    assert max(errors) < 1e-4, errors


def test_step_logits_are_the_calls_own_and_stay_after_later_steps():
    """``step`` returns the logits without a copy (a numpy view of the tensor the call returned): the
    logits of a prefill, kept while three decode steps run on the same cache, still hold transformers'
    logits at the prompt's last position, and each step's logits are its own (not a buffer the next
    call writes)."""
    model, gen = _built("llama")
    n = PROMPT.shape[1]
    with torch.no_grad():
        want = model(torch.tensor(PROMPT)).logits.numpy()[0, -1]
    cache = gen.new_cache(1)
    first = gen.step(PROMPT, np.array([0]), np.array([n]), cache)
    later = [gen.step(np.array([[t]]), np.array([n + i]), np.array([1]), cache) for i, t in enumerate((4, 9, 60))]
    assert _rel(first[0], want) < 1e-4
    assert not any(np.shares_memory(first, x) for x in later)
    assert not np.array_equal(later[0], later[1])


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generate_is_transformers_token_for_token(family):
    model, gen = _built(family)
    want = _hf_generate(model, PROMPT, NEW, eos_token_id=None)  # all 64 tokens: no stop at the config's eos
    got = gen.generate(PROMPT, max_new_tokens=NEW)
    assert got.dtype == np.int64 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert len(set(want[0, PROMPT.shape[1]:].tolist())) > 3  # the reference does not just repeat a token


def test_tied_embedding_is_one_weight_read_by_the_take_and_the_lm_head():
    """A tied model (llama here: the LM head's weight is the embedding's storage) is built with one
    ``embed`` constant read by the embedding's take and the LM head's dense, not a second copy; an
    untied one (qwen2) keeps its own ``lm_head``. Both generate transformers' tokens (the tests above)."""
    from byoc_hetero._relax import region_table
    from byoc_hetero.llm import model as llm_model

    for family, tied in (("llama", True), ("qwen2", False)):
        model = _model(family)
        spec = llm_model.decoder_spec(model)
        assert spec.tied_embeddings is tied
        assert ("lm_head" in llm_model.decoder_weights(spec, model)) is not tied
        part, _, _ = bh.llm.partitioned_step(model, max_length=MAX_LENGTH)
        (graph,) = [r.graph for r in region_table(part).values()]
        table = next(n["inputs"][0] for n in graph["nodes"] if n["op"] == "take")  # the embedding's
        assert table in {c["tensor"] for c in graph["constants"]}
        head = [n for n in graph["nodes"] if n["op"] == "dense"][-1]["inputs"][1]  # the LM head's weight:
        made = {n["output"]: n["inputs"] for n in graph["nodes"]}  # the table itself, or final_norm folded in
        assert (table == head or table in made.get(head, [])) is tied, (table, head, made.get(head))


def test_stream_yields_the_tokens_generate_returns():
    _, gen = _built("llama")
    steps = list(gen.stream(PROMPT, max_new_tokens=10))
    assert len(steps) == 10 and all(s.shape == (1,) for s in steps)
    np.testing.assert_array_equal(np.concatenate([PROMPT[0], np.concatenate(steps)]),
                                  gen.generate(PROMPT, max_new_tokens=10)[0])


def test_batch_of_different_prompt_lengths_equals_each_run_alone():
    model, gen = _built("qwen2")
    prompts = [[5, 71, 13], [9, 8, 7, 6, 5, 4, 3, 2, 1, 60], [44, 2, 90, 17, 33]]
    batch = gen.generate(prompts, max_new_tokens=12)
    for prompt, got in zip(prompts, batch):
        alone = gen.generate(np.array([prompt]), max_new_tokens=12)[0]
        np.testing.assert_array_equal(got, alone)
        np.testing.assert_array_equal(got, _hf_generate(model, np.array([prompt]), 12)[0])


def test_stop_token_ends_a_sequence_and_pads_with_it():
    _, gen = _built("llama")
    free = gen.generate(PROMPT, max_new_tokens=16)[0, PROMPT.shape[1]:]
    stop = int(free[4])
    first = int(np.flatnonzero(free == stop)[0])
    got = gen.generate(PROMPT, max_new_tokens=16, stop=stop)
    assert got.shape == (1, PROMPT.shape[1] + first + 1)
    np.testing.assert_array_equal(got[0, PROMPT.shape[1]:], free[:first + 1])
    ragged = gen.generate([PROMPT[0].tolist(), [3, 4]], max_new_tokens=16, stop=stop)
    np.testing.assert_array_equal(ragged[0], got[0])  # a list input: each sequence up to its stop


def test_sampling_is_reproducible_with_a_seed_and_respects_top_k():
    _, gen = _built("llama")
    kwargs = dict(max_new_tokens=16, do_sample=True, temperature=1.5, top_p=0.9)
    a = gen.generate(PROMPT, seed=7, **kwargs)
    np.testing.assert_array_equal(a, gen.generate(PROMPT, seed=7, **kwargs))
    draws = {tuple(gen.generate(PROMPT, seed=s, **kwargs)[0].tolist()) for s in range(4)}
    assert len(draws) > 1  # the seed matters
    greedy = gen.generate(PROMPT, max_new_tokens=16)
    np.testing.assert_array_equal(gen.generate(PROMPT, max_new_tokens=16, do_sample=True, top_k=1, seed=3), greedy)


def test_sampler_draws_follow_the_distribution():
    """top-k / top-p / temperature against numpy: only allowed tokens, frequencies near p."""
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype="float32"))
    sampler = bh.llm.Sampler(do_sample=True, top_p=0.8, seed=0)
    rng = sampler.rng()
    draws = np.array([sampler.choose(logits, rng)[0] for _ in range(4000)])
    assert set(draws.tolist()) == {0, 1}  # 0.5 + 0.3 reaches top_p 0.8
    assert abs((draws == 0).mean() - 0.5 / 0.8) < 0.03
    topk = bh.llm.Sampler(do_sample=True, top_k=3, temperature=0.5, seed=1)
    rng = topk.rng()
    draws = np.array([topk.choose(logits, rng)[0] for _ in range(4000)])
    p = np.array([0.5, 0.3, 0.15]) ** 2
    assert set(draws.tolist()) <= {0, 1, 2} and abs((draws == 0).mean() - p[0] / p.sum()) < 0.03


def test_cache_growth_past_max_length_is_an_input_error_and_writes_nothing():
    _, gen = _built("llama")
    cache = gen.new_cache(1)
    before = [c.numpy().copy() for c in cache]
    with pytest.raises(bh.InputError, match=rf"sequence 0 would grow to {MAX_LENGTH + 1} tokens, past the cache's "
                                            rf"max_length {MAX_LENGTH}"):
        gen.step(np.array([[1, 2]]), np.array([MAX_LENGTH - 1]), np.array([2]), cache)
    for old, new in zip(before, cache):
        np.testing.assert_array_equal(old, new.numpy())
    room = MAX_LENGTH - PROMPT.shape[1]
    with pytest.raises(bh.InputError, match=rf"prompt \+ max_new_tokens {room + 1} \({MAX_LENGTH + 1} tokens with a "
                                            rf"prompt of 7\) is longer than the cache's max_length {MAX_LENGTH}"):
        gen.generate(PROMPT, max_new_tokens=room + 1)
    assert gen.generate(PROMPT, max_new_tokens=room).shape == (1, MAX_LENGTH)  # exactly full is fine


def test_a_cache_of_another_shape_is_an_input_error():
    _, gen = _built("llama")
    with pytest.raises(bh.InputError, match=rf"cache tensor 0 is float32 \[2, 2, {MAX_LENGTH}, 16\]; this model's are "
                                            rf"float32 \[1, 2, {MAX_LENGTH}, 16\]"):
        gen.step(PROMPT, np.array([0]), np.array([7]), gen.new_cache(2))
    with pytest.raises(bh.InputError, match="the cache holds 2 tensors"):
        gen.step(PROMPT, np.array([0]), np.array([7]), gen.new_cache(1)[:2])


def test_bad_prompts_are_input_errors_naming_them():
    _, gen = _built("llama")
    long = MAX_LENGTH + 2
    with pytest.raises(bh.InputError, match=rf"the prompt \({long} tokens with a prompt of {long}\) is longer than the "
                                            "cache"):
        gen.generate(np.ones((1, long), dtype="int64"), max_new_tokens=0)
    with pytest.raises(bh.InputError, match=rf"sequence 1 has token id {VOCAB}, outside the vocabulary \[0, {VOCAB}\)"):
        gen.generate([[1, 2], [3, VOCAB]], max_new_tokens=2)
    with pytest.raises(bh.InputError, match="token id -1"):
        gen.generate(np.array([[4, -1]]), max_new_tokens=2)
    with pytest.raises(bh.InputError, match="non-empty"):
        gen.generate([[]], max_new_tokens=2)
    with pytest.raises(bh.InputError, match="temperature"):
        gen.generate(PROMPT, max_new_tokens=2, do_sample=True, temperature=0)


@pytest.mark.parametrize("weights", ["int3", "fp8"])
def test_unknown_weight_precisions_are_input_errors_naming_them(weights):
    with pytest.raises(bh.InputError, match=rf"weights must be one of f32, bf16, int8, int4, got '{weights}'"):
        bh.llm.from_hf(_built("llama")[0], max_length=16, weights=weights)


def test_group_size_needs_quantized_weights_and_a_fitting_size():
    model = _built("llama")[0]
    with pytest.raises(bh.InputError, match="group_size=32 applies to weights='int8' / 'int4', not 'f32'"):
        bh.llm.from_hf(model, max_length=16, group_size=32)
    with pytest.raises(bh.InputError, match="group_size=48"):
        bh.llm.from_hf(model, max_length=16, weights="int4", group_size=48)
    # int8 in groups: a group must divide every dense's K (hidden 64 here)
    with pytest.raises(bh.InputError, match="weights='int8' group_size=128 .*group size 128 does not divide K = 64"):
        bh.llm.from_hf(model, max_length=16, weights="int8", group_size=128)
    with pytest.raises(bh.InputError, match="lm_head='int8' applies to weights='int8' / 'int4', not 'f32'"):
        bh.llm.from_hf(model, max_length=16, lm_head="int8")
    with pytest.raises(bh.InputError, match="lm_head must be None .*int8, int4, f32; got 'int2'"):
        bh.llm.from_hf(model, max_length=16, weights="int4", lm_head="int2")


_QUANT: dict = {}


def _quant_model():
    """A Llama whose greedy tokens have wide top-1 margins: small decoder-layer weights (init 0.05) so
    the unquantized embedding dominates the residual stream (std 4), LM head std 1."""
    torch.manual_seed(38)
    config = transformers.LlamaConfig(**{**COMMON, "initializer_range": 0.05}, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 4.0)
        model.lm_head.weight.normal_(0.0, 1.0)
    return model


def _built_quant(weights: str, lm_head: str | None = None, group: int | None = None):
    """(float generator, partitioned step, generator) for :func:`_quant_model` with ``weights``,
    ``lm_head`` and ``group_size`` ``group``."""
    if not _QUANT:
        model = _quant_model()
        _QUANT["model"] = model
        _QUANT["f32"] = (bh.llm.partitioned_step(model, max_length=MAX_LENGTH)[0],
                         bh.llm.from_hf(model, max_length=MAX_LENGTH))
    if (weights, lm_head, group) not in _QUANT:
        model = _QUANT["model"]
        options = dict(max_length=MAX_LENGTH, weights=weights, lm_head=lm_head, group_size=group)
        _QUANT[weights, lm_head, group] = (bh.llm.partitioned_step(model, **options)[0],
                                           bh.llm.from_hf(model, **options))
    return _QUANT["f32"][1], *_QUANT[weights, lm_head, group]


def _forced_logits(gen, tokens: np.ndarray) -> np.ndarray:
    """The logits of each position from the prompt's last on, feeding ``tokens`` (teacher forcing)."""
    cache, n = gen.new_cache(1), PROMPT.shape[1]
    rows = [gen.step(tokens[:, :n], np.array([0]), np.array([n]), cache)[0]]
    for pos in range(n, tokens.shape[1] - 1):
        rows.append(gen.step(tokens[:, pos:pos + 1], np.array([pos]), np.array([1]), cache)[0])
    return np.stack(rows)


@pytest.mark.parametrize("weights,group,logit_bound,layer_bound", [("int8", None, 2e-3, 2e-2), ("int8", 32, 2e-3, 2e-2),
                                                                   ("int4", None, 2e-2, 2e-1)])
def test_int8_int4_weights_keep_the_float_tokens_within_a_logit_bound(weights, group, logit_bound, layer_bound):
    """Weight-only int8 / int4 decoder denses (the LM head kept float: ``lm_head="f32"``; the quantized
    head is checked by the node test below and by tests/test_gguf.py), int8 per output channel and in groups
    of 32 along K (GGUF's Q8_0 form): every step's logits within ``logit_bound`` (relative to the largest) of
    the float generator's on the same tokens, and, since each step's top-1 margin is more than twice the
    largest logit difference (asserted: the equality cannot hold vacuously), the same greedy tokens."""
    floats, _, gen = _built_quant(weights, "f32", group)
    assert gen.weights == weights and 0.0 < gen.weight_error < layer_bound, gen.weight_error
    want = floats.generate(PROMPT, max_new_tokens=12)
    assert len(set(want[0, PROMPT.shape[1]:].tolist())) > 3
    float_logits, quant_logits = _forced_logits(floats, want), _forced_logits(gen, want)
    diff = np.abs(quant_logits - float_logits)
    assert 0.0 < diff.max() / np.abs(float_logits).max() < logit_bound
    top2 = np.sort(float_logits, axis=-1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 2.0 * diff.max()  # the margin condition
    np.testing.assert_array_equal(gen.generate(PROMPT, max_new_tokens=12), want)


@pytest.mark.parametrize("weights,lm_head", [("int8", None), ("int4", None), ("int4", "int8"), ("int4", "f32")])
def test_quantized_step_has_the_float_regions_with_dense_wq_nodes(weights, lm_head):
    """The same one region (so one region call per step), every dense of the decoder stack a
    dense_wq node, the LM head too (in ``lm_head``'s format) unless ``lm_head="f32"`` keeps it a float dense."""
    from collections import Counter

    from byoc_hetero._relax import region_table

    def nodes(part) -> list[Counter]:
        return [Counter(n["op"] for n in r.graph["nodes"]) for r in region_table(part).values()]

    _, part, _ = _built_quant(weights, lm_head)
    float_ops, ops = nodes(_QUANT["f32"][0]), nodes(part)
    assert len(ops) == len(float_ops) == 1, (ops, float_ops)  # the whole step: one region call
    layers, float_head = COMMON["num_hidden_layers"], lm_head == "f32"
    assert sum(o["dense_wq"] for o in ops) == 7 * layers + (not float_head), ops  # q k v o gate up down (head)
    assert sum(o["dense"] for o in ops) == float_head and sum(o["dense_wq"] for o in float_ops) == 0, ops
    denses = [n for r in region_table(part).values() for n in r.graph["nodes"] if n["op"] in ("dense", "dense_wq")]
    head = denses[-1]  # the step's last dense: the LM head
    assert head["op"] == ("dense" if float_head else "dense_wq"), head
    if not float_head:  # its bits: the weights' own, or lm_head's
        assert head["attrs"]["bits"] == int((lm_head or weights)[3:]), head
    assert sum(o["kv_attention"] for o in ops) == sum(o["kv_attention"] for o in float_ops) == layers, ops
    # no step of its own for the residual adds (o and down sum the residual stream: fold_residual_adds) nor for
    # the norms' gammas (each norm's reduce multiplies by it: fold_norm_weights; a float head takes it in its weights)
    (graph,) = [r.graph for r in region_table(part).values()]
    assert sum(n["attrs"].get("residual", 0) for n in graph["nodes"] if n["op"] == "dense_wq") == 2 * layers
    binaries = [n for n in graph["nodes"] if n["op"] == "binary"]
    # nor the MLP's silu(gate) * up (up's dense_wq multiplies: fold_gate_products); a float head keeps one multiply
    # (by a constant) before it, not looked into here
    assert len(binaries) == float_head, binaries
    assert sum(n["attrs"].get("has_gate", 0) for n in graph["nodes"] if n["op"] == "dense_wq") == layers
    weighted = sum(n["attrs"].get("has_weight", 0) for n in graph["nodes"] if n["op"] == "reduce")
    assert weighted in ({2 * layers, 2 * layers + 1} if float_head else {2 * layers + 1}), graph["nodes"]


def test_folded_gate_residual_and_norm_weight_steps_change_no_value(monkeypatch):
    """The int4 step whose gate products, residual adds and norm weights are folded into its dense_wq and
    reduce nodes (fold_gate_products, fold_residual_adds, fold_norm_weights) gives, to the bit, the logits of
    the step that runs them as binary steps of their own (the same float32 operations), prefill and decode."""
    import json

    from byoc_hetero.backends.onednn.ops import layout
    from byoc_hetero.targets import get_target

    _, _, folded = _built_quant("int4")
    passes = get_target("onednn").lowering.passes
    for name in ("fold_gate_products", "fold_norm_weights"):
        monkeypatch.setitem(passes, name, lambda graph: None)
    monkeypatch.delitem(layout.SUMS_RESIDUAL, "dense_wq")
    steps = bh.llm.from_hf(_QUANT["model"], max_length=MAX_LENGTH, weights="int4")
    (region,) = bh.codegen.region_modules(steps._executable)
    binaries = [n for n in json.loads(str(region["get_graph_json"]()))["nodes"] if n["op"] == "binary"]
    assert len(binaries) == 5 * COMMON["num_hidden_layers"] + 1  # 2 adds, 2 gammas, 1 product a layer; the final gamma
    tokens = folded.generate(PROMPT, max_new_tokens=6)
    np.testing.assert_array_equal(_forced_logits(steps, tokens), _forced_logits(folded, tokens))


@pytest.mark.parametrize("family", ["qwen2", "gemma"])
def test_float_mlp_product_is_the_up_dense_gate_and_changes_no_value(monkeypatch, family):
    """A float32 decoder's GLU product (silu / gelu-tanh of the gate dense times the up dense) is the up dense's
    gate (fold_gate_products: oneDNN's binary multiply post-op at a prefill's rows, the GEMV's loop at a decode
    step's one), not a binary step: one dense per layer with has_gate and no multiply of two full tensors left;
    the logits are, to the bit, those of the build that runs the multiply as a step of its own, for a prefill of
    66 rows (the inner product from 64 rows), of 7 (the matmul) and the decode steps after them."""
    import json

    from byoc_hetero.targets import get_target

    model, folded = _built(family)
    layers = COMMON["num_hidden_layers"]
    (region,) = bh.codegen.region_modules(folded._executable)
    graph = json.loads(str(region["get_graph_json"]()))
    assert sum(n["attrs"].get("has_gate", 0) for n in graph["nodes"] if n["op"] == "dense") == layers
    full = [n for n in graph["nodes"] if n["op"] == "binary" and n["attrs"].get("algorithm") == "mul"
            and all(graph["tensors"][i]["shape"][-1] == COMMON["intermediate_size"] for i in n["inputs"])]
    assert not full, full
    monkeypatch.setitem(get_target("onednn").lowering.passes, "fold_gate_products", lambda graph: None)
    steps = bh.llm.from_hf(model, max_length=MAX_LENGTH)
    (plain,) = bh.codegen.region_modules(steps._executable)
    nodes = json.loads(str(plain["get_graph_json"]()))["nodes"]
    assert not any(n["attrs"].get("has_gate") for n in nodes) and len(nodes) == len(graph["nodes"]) + layers
    long = np.random.default_rng(3).integers(0, VOCAB, (1, 70)).astype("int64")
    for tokens, n in ((long, 66), (long[:, :12], PROMPT.shape[1])):
        got, want = ([g.step(tokens[:, :n], np.array([0]), np.array([n]), cache)[0]]
                     + [g.step(tokens[:, p:p + 1], np.array([p]), np.array([1]), cache)[0]
                        for p in range(n, tokens.shape[1])]
                     for g, cache in ((folded, folded.new_cache(1)), (steps, steps.new_cache(1))))
        np.testing.assert_array_equal(np.stack(got), np.stack(want))


def test_quantized_generator_saves_loads_and_runs_from_the_cli(tmp_path, capsys):
    from byoc_hetero.cli import main

    _, _, gen = _built_quant("int8")
    want = gen.generate(PROMPT, max_new_tokens=6)
    gen.save(tmp_path / "q")
    loaded = bh.llm.load(tmp_path / "q")
    assert loaded.weights == "int8" and loaded.weight_error == gen.weight_error
    np.testing.assert_array_equal(loaded.generate(PROMPT, max_new_tokens=6), want)
    _QUANT["model"].save_pretrained(tmp_path / "hf")
    ids = ",".join(str(t) for t in PROMPT[0])
    unused = next(t for t in range(VOCAB) if t not in want[0, PROMPT.shape[1]:])
    assert main(["generate", str(tmp_path / "hf"), "--ids", ids, "--max-new-tokens", "6", "--max-length", "32",
                 "--weights", "int8", "--stop", str(unused)]) == 0
    assert [int(t) for t in capsys.readouterr().out.split()] == want[0, PROMPT.shape[1]:].tolist()


def test_bf16_weights_without_native_bf16_say_why():
    if bh._C.bf16_native():
        pytest.skip("this machine has native bf16")
    with pytest.raises(bh.InputError, match="native bf16"):
        bh.llm.from_hf(_built("llama")[0], max_length=16, weights="bf16")


def test_save_and_load_generate_the_same_tokens(tmp_path):
    _, gen = _built("gemma")
    want = gen.generate(PROMPT, max_new_tokens=8)
    gen.save(tmp_path / "gen")
    loaded = bh.llm.load(tmp_path / "gen")
    assert loaded.max_length == MAX_LENGTH and loaded.spec == gen.spec
    np.testing.assert_array_equal(loaded.generate(PROMPT, max_new_tokens=8), want)
    (tmp_path / "gen" / "generator.json").write_text("{}")
    with pytest.raises(bh.ModelFileError, match="expected 'byoc_hetero.llm'"):
        bh.llm.load(tmp_path / "gen")


def test_unsupported_family_is_a_frontend_error():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(bh.FrontendError, match="model_type 'gpt2' is not supported"):
        bh.llm.from_hf(model, max_length=16)


def test_cli_generate_from_a_saved_generator_and_a_hugging_face_folder(tmp_path, capsys):
    from byoc_hetero.cli import main

    model, gen = _built("llama")
    want = gen.generate(PROMPT, max_new_tokens=6)[0, PROMPT.shape[1]:]
    gen.save(tmp_path / "saved")
    ids = ",".join(str(t) for t in PROMPT[0])
    assert main(["generate", str(tmp_path / "saved"), "--ids", ids, "--max-new-tokens", "6"]) == 0
    assert [int(t) for t in capsys.readouterr().out.split()] == want.tolist()
    model.save_pretrained(tmp_path / "hf")
    unused = next(t for t in range(VOCAB) if t not in want)  # instead of the config's eos, which may come
    assert main(["generate", str(tmp_path / "hf"), "--ids", ids, "--max-new-tokens", "6", "--max-length", "32",
                 "--stop", str(unused)]) == 0
    assert [int(t) for t in capsys.readouterr().out.split()] == want.tolist()
    assert main(["generate", str(tmp_path / "saved"), "--ids", f"1,{VOCAB}"]) == 2
    assert f"token id {VOCAB}, outside the vocabulary" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["split", "grouped", "rows"])
def test_the_decode_forms_generate_transformers_tokens_over_a_long_context(monkeypatch, mode):
    """BYOC_HETERO_KV_DECODE=split / grouped (the default) / rows in a whole decoder: two
    prompts of 200 tokens (enough keys for split's runs of 64 on 2 threads), 40 greedy tokens each, token for
    token transformers' generate."""
    from byoc_hetero import _C

    torch.manual_seed(36)
    config = transformers.LlamaConfig(**{**COMMON, "hidden_size": 96, "num_attention_heads": 6,
                                         "max_position_embeddings": 512}, tie_word_embeddings=True)
    model = transformers.LlamaForCausalLM(config).eval()
    prompt = np.random.default_rng(1).integers(0, VOCAB, size=(2, 200)).astype("int64")
    want = _hf_generate(model, prompt, 40, eos_token_id=None)
    saved = _C.num_threads()
    _C.set_num_threads(2)
    try:
        gen = bh.llm.from_hf(model, max_length=250)
        monkeypatch.setenv("BYOC_HETERO_KV_DECODE", mode)
        got = gen.generate(prompt, max_new_tokens=40)
    finally:
        _C.set_num_threads(saved)
    np.testing.assert_array_equal(got, want)
    assert len(set(want[0, 200:].tolist())) > 3
