"""``bench/gguf_write.py`` (the GGUF files of ``bench/generate.py``) against independent references.

* The query/key row reordering for llama.cpp's RoPE: rotating adjacent pairs of the reordered projection must
  give the Hugging Face rotation (the two halves of each head) of the original projection, reordered the same
  way, so attention scores are unchanged (numpy RoPE written here both ways).
* Llama 3's ``rope_freqs`` divisors against transformers' own llama3 frequencies.
* A tiny Llama decoder written to GGUF and read back with the ``gguf`` package's reader and dequantizer: every
  tensor under llama.cpp's name, F32 exact, Q8_0 / Q4_0 within their block quantization error, the metadata.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from gguf_write import (gguf_name, halves_to_pairs, llama3_rope_divisors, quantize_k, quantize_q6_k,  # noqa: E402
                        rope_settings, write_gguf)


def _angles(d: int, pos: int, base: float = 10000.0) -> np.ndarray:
    return pos / base ** (np.arange(0, d, 2) / d)


def rope_halves(q: np.ndarray, heads: int, pos: int) -> np.ndarray:
    """Hugging Face's rotation: element i with element i + d/2 of each head."""
    d = q.size // heads
    x = q.reshape(heads, d)
    a = _angles(d, pos)
    c, s = np.cos(a), np.sin(a)
    lo, hi = x[:, : d // 2], x[:, d // 2:]
    return np.concatenate([lo * c - hi * s, hi * c + lo * s], axis=1).reshape(-1)


def rope_pairs(q: np.ndarray, heads: int, pos: int) -> np.ndarray:
    """llama.cpp's ``llama`` rotation: element 2i with element 2i + 1 of each head."""
    d = q.size // heads
    x = q.reshape(heads, d // 2, 2)
    a = _angles(d, pos)
    c, s = np.cos(a), np.sin(a)
    even, odd = x[..., 0], x[..., 1]
    return np.stack([even * c - odd * s, odd * c + even * s], axis=-1).reshape(-1)


@pytest.mark.parametrize("heads,d", [(3, 8), (4, 16), (1, 64)])
def test_reordered_rows_rotate_in_pairs_as_hf_in_halves(heads, d):
    rng = np.random.default_rng(heads * d)
    w, wk, x, y = (rng.standard_normal((heads * d, 24)), rng.standard_normal((heads * d, 24)),
                   rng.standard_normal(24), rng.standard_normal(24))
    for pos in (0, 1, 7, 300):
        hf = rope_halves(w @ x, heads, pos)
        ours = rope_pairs(halves_to_pairs(w, heads) @ x, heads, pos)
        np.testing.assert_allclose(ours, halves_to_pairs(hf[:, None], heads)[:, 0], rtol=1e-12, atol=1e-12)
        # the score of a query at pos and a key at 3 is what Hugging Face computes
        hf_score = rope_halves(w @ x, heads, pos) @ rope_halves(wk @ y, heads, 3)
        cpp_score = (rope_pairs(halves_to_pairs(w, heads) @ x, heads, pos)
                     @ rope_pairs(halves_to_pairs(wk, heads) @ y, heads, 3))
        np.testing.assert_allclose(cpp_score, hf_score, rtol=1e-10)


def test_llama3_divisors_match_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192)
    cfg = transformers.LlamaConfig(hidden_size=2048, num_attention_heads=32, rope_theta=500000.0,
                                   rope_scaling=scaling, max_position_embeddings=131072)
    # both spellings: transformers 5's rope_parameters (from to_dict) and rope_theta / rope_scaling
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    d = 2048 // 32
    plain = 1.0 / 500000.0 ** (np.arange(0, d, 2) / d)
    divisors = llama3_rope_divisors(cfg.to_dict())
    assert divisors.shape == (d // 2,) and divisors.min() == 1.0 and divisors.max() == 32.0
    np.testing.assert_allclose(plain / divisors, scaled.numpy(), rtol=1e-5)
    older = {"hidden_size": 2048, "num_attention_heads": 32, "rope_theta": 500000.0, "rope_scaling": scaling}
    np.testing.assert_array_equal(llama3_rope_divisors(older), divisors)
    assert rope_settings(cfg.to_dict())[0] == rope_settings(older)[0] == 500000.0
    assert llama3_rope_divisors({"hidden_size": 64, "num_attention_heads": 4}) is None


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    folder = str(tmp_path_factory.mktemp("tiny_llama"))
    model.save_pretrained(folder)
    return folder, {k: v.detach().numpy() for k, v in model.state_dict().items()}, cfg


@pytest.mark.parametrize("fmt,tol", [("f32", 0.0), ("f16", 1e-3), ("q8_0", 1 / 127), ("q4_0", 1 / 7)])
def test_gguf_round_trip(tiny_llama, tmp_path, fmt, tol):
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize

    folder, weights, cfg = tiny_llama
    reader = gguf.GGUFReader(write_gguf(folder, str(tmp_path / f"m.{fmt}.gguf"), fmt))
    tensors = {t.name: t for t in reader.tensors}
    assert "output.weight" not in tensors  # tied: llama.cpp takes token_embd
    expected = {gguf_name(k) for k in weights if k != "lm_head.weight"}
    assert set(tensors) == expected
    for hf_name, w in weights.items():
        if hf_name == "lm_head.weight":
            continue
        t = tensors[gguf_name(hf_name)]
        if hf_name.endswith("q_proj.weight"):
            w = halves_to_pairs(w, cfg.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            w = halves_to_pairs(w, cfg.num_key_value_heads)
        got = dequantize(t.data, t.tensor_type).reshape(w.shape)
        if w.ndim == 1:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32
            np.testing.assert_array_equal(got, w)
            continue
        # block quantization: each value within its block's step (max |block| / 127 or / 7, f16 scale)
        blocks = np.abs(w.reshape(-1, 32)).max(axis=1, keepdims=True)
        err = np.abs(got.reshape(-1, 32) - w.reshape(-1, 32))
        assert np.all(err <= tol * blocks + 1e-3 * blocks + 1e-7), (hf_name, fmt, float(err.max()))
    fields = reader.fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "llama"
    assert int(fields["llama.attention.head_count_kv"].parts[-1][0]) == 2
    assert len(fields["tokenizer.ggml.tokens"].data) == 300


def test_bad_format_and_architecture(tiny_llama, tmp_path):
    pytest.importorskip("gguf")
    folder, _, _ = tiny_llama
    with pytest.raises(ValueError, match="q3_k"):
        write_gguf(folder, str(tmp_path / "x.gguf"), "q3_k")
    with pytest.raises(KeyError, match="model.layers.0.self_attn.rotary"):
        gguf_name("model.layers.0.self_attn.rotary.inv_freq")


@pytest.mark.parametrize("kind,bound", [("Q4_K", 0.12), ("Q5_K", 0.06), ("Q6_K", 0.03)])
def test_k_quantizers_round_trip(kind, bound):
    """The writer's own K-quant quantizers (the gguf package has none) read back by the gguf package's
    dequantize: the layout is llama.cpp's (a wrong bit place would give errors of the order of the weights),
    the error that of 4 / 5 / 6-bit codes (relative RMS, measured ~0.08 / 0.04 / 0.02)."""
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize

    w = np.random.default_rng(0).standard_normal((5, 512)).astype(np.float32)
    w[1, 256:] *= 1e-3  # a super-block of small values: its own d
    w[2, :32] = 0.5  # a constant sub-block
    data = quantize_q6_k(w) if kind == "Q6_K" else quantize_k(w, kind == "Q5_K")
    assert data.shape == (5, 2 * {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[kind])
    got = dequantize(data, getattr(gguf.GGMLQuantizationType, kind)).reshape(w.shape)
    for rows in (slice(0, 1), slice(3, 5), (1, slice(256, 512))):
        part, want = got[rows], w[rows]
        assert np.sqrt(np.mean((part - want) ** 2)) <= bound * np.sqrt(np.mean(want ** 2)), kind
