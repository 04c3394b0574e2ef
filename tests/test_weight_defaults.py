"""The weight-only defaults live in one place (issue 37): ``weight_only.DEFAULT_GROUP_SIZE`` (what
``group_size=None`` means for int8 / int4) and ``weight_only.DEFAULT_ROUNDING`` (what ``rounding=None``
means), read by ``bh.quantize``, ``bh.llm.from_hf`` (the decoder's denses, the LM head's and the
table's own passes) and the CLI. Pinned here: today's values, and that flipping int8's default to
blocks of 32 (Q8_0's form) changes every int8 weight ``from_hf`` writes, float16 scales with it, while
``group_size=-1`` still asks one scale per output channel. References: the codes' shapes and dtypes
in the partitioned step, and ``quantize_matrix`` called with the values spelled out.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

import byoc_hetero as bh
from byoc_hetero._relax import region_table
from byoc_hetero.errors import QuantizationError
from byoc_hetero.quant import weight_only
from byoc_hetero.quant.weight_only import PER_CHANNEL, _unpack, group_block, quantize_matrix

CONFIG = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32, initializer_range=0.1, tie_word_embeddings=True)


def _model():
    torch.manual_seed(3)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()


def _coded(**options) -> list[tuple[int, int, int, str]]:
    """(bits, K, block, scale dtype) of every dense_wq / take_wq node of ``from_hf``'s step."""
    part, _, _ = bh.llm.partitioned_step(_model(), max_length=8, **options)
    (region,) = region_table(part).values()
    g = region.graph
    found = []
    for n in g["nodes"]:
        if n["op"] in ("dense_wq", "take_wq"):
            codes, scales = (g["tensors"][i] for i in n["inputs"][1:3])
            k = codes["shape"][1] * 8 // n["attrs"]["bits"]
            assert scales["shape"][1] * n["attrs"]["block"] == k  # the scales are the block's
            found.append((n["attrs"]["bits"], k, n["attrs"]["block"], scales["dtype"]))
    assert len(found) == 9  # seven denses, the LM head, the lookup
    return found


def test_the_defaults_today():
    """int8 in blocks of 32 since session 17's quiet decode A/B (issue 37: Q8_0's form and error), here and in
    weight_only's constant together; the rounding is llama.cpp's (its files' codes, test_q8_0_same); -1 still
    means per channel."""
    assert weight_only.DEFAULT_GROUP_SIZE == {"int8": 32, "int4": 32}
    assert weight_only.DEFAULT_ROUNDING == "gguf"
    assert group_block("int8", None) == 32 and group_block("int4", None) == 32
    assert group_block("int8", PER_CHANNEL) is None


@pytest.mark.parametrize("default", [PER_CHANNEL, 32])
def test_from_hf_int8_follows_the_default_group_size(monkeypatch, default):
    monkeypatch.setitem(weight_only.DEFAULT_GROUP_SIZE, "int8", default)
    for bits, k, block, dtype in _coded(weights="int8"):
        assert bits == 8
        assert (block, dtype) == ((k, "float32") if default == PER_CHANNEL else (32, "float16"))
    # asked for explicitly, whatever the default
    assert {(b, d) for _, k, b, d in _coded(weights="int8", group_size=-1)} <= {(64, "float32"), (128, "float32")}
    assert {(b, d) for _, _, b, d in _coded(weights="int8", group_size=64)} == {(64, "float16")}


def test_an_int8_head_beside_int4_denses_takes_int8s_default(monkeypatch):
    monkeypatch.setitem(weight_only.DEFAULT_GROUP_SIZE, "int8", 32)
    coded = _coded(weights="int4", lm_head="int8")
    assert {c for c in coded if c[0] == 8} == {(8, 64, 32, "float16")}  # the head and its tied lookup
    assert {c[2:] for c in coded if c[0] == 4} == {(32, "float16")}


def test_bh_quantize_follows_the_defaults(monkeypatch):
    mod, params = bh.models.mlp(features=64, hidden=(96,), num_classes=32)
    for weights in ("int8", "int4"):
        q = bh.quantize(mod, params, weights=weights, verbose=False)
        assert q.group_size == group_block(weights, None) and q.rounding == weight_only.DEFAULT_ROUNDING
    monkeypatch.setitem(weight_only.DEFAULT_GROUP_SIZE, "int8", 32)
    monkeypatch.setattr(weight_only, "DEFAULT_ROUNDING", "gguf")
    q = bh.quantize(mod, params, weights="int8", verbose=False)
    assert q.group_size == 32 and q.rounding == "gguf" and "llama.cpp's rounding" in q.summary()
    for name in (n for n in q.params if n.endswith(".codes")):
        w_nk = np.asarray(params[name[:-6]]).T  # the mlp's matmul(x, W [K, N])
        np.testing.assert_array_equal(q.params[name], quantize_matrix(w_nk, 8, 32, rounding="gguf").codes)
    q = bh.quantize(mod, params, weights="int8", group_size=-1, verbose=False)
    assert q.group_size is None and all(v.shape[1] == 1 for n, v in q.params.items() if n.endswith(".scales"))
    # zero points take the nearest rule whatever the default (llama.cpp's is symmetric)
    q = bh.quantize(mod, params, weights="int4", zero_points=True, verbose=False)
    assert q.rounding == "nearest"


def test_default_rounding_reaches_quantize_matrix(monkeypatch):
    w = np.random.default_rng(5).normal(0, 1, (16, 64)).astype(np.float32)
    for rounding in weight_only.ROUNDINGS:
        monkeypatch.setattr(weight_only, "DEFAULT_ROUNDING", rounding)
        for bits in (8, 4):
            got = quantize_matrix(w, bits, 32, scale_dtype="float16")
            want = quantize_matrix(w, bits, 32, scale_dtype="float16", rounding=rounding)
            np.testing.assert_array_equal(_unpack(got), _unpack(want))
    near, llama = (quantize_matrix(w, 8, 32, scale_dtype="float16", rounding=r) for r in weight_only.ROUNDINGS)
    assert (_unpack(near) != _unpack(llama)).any()  # the two rules differ on these weights


@pytest.mark.parametrize("bad", [0, 16, 33, -2, True, "32", 32.5])
def test_bad_group_sizes(bad):
    mod, params = bh.models.mlp(features=64, hidden=(96,), num_classes=32)
    with pytest.raises(QuantizationError, match=rf"group_size must be one of 32, 64, 128, -1 \(per output channel\) "
                                                rf"or None \(the format's default\), got {bad!r}"):
        bh.quantize(mod, params, weights="int8", group_size=bad, verbose=False)


def test_bad_rounding_through_from_hf_and_quantize():
    with pytest.raises(bh.InputError, match="rounding must be one of 'nearest', 'gguf' or None, got 'up'"):
        bh.llm.partitioned_step(_model(), max_length=8, weights="int8", rounding="up")
    with pytest.raises(bh.InputError, match="rounding='gguf' applies to weights='int8' / 'int4', not 'f32'"):
        bh.llm.partitioned_step(_model(), max_length=8, rounding="gguf")
    mod, params = bh.models.mlp(features=64, hidden=(96,), num_classes=32)
    with pytest.raises(QuantizationError, match="rounding='gguf' applies to weight-only quantization"):
        bh.quantize(mod, params, calibration=[np.zeros((1, 64), np.float32)], rounding="gguf", verbose=False)
