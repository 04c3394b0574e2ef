"""A small GGUF writer for Llama-family decoders saved as Hugging Face folders (``bench/generate.py``).

    from gguf_write import write_gguf
    write_gguf("/tmp/g/smollm_135m", "/tmp/g/smollm_135m.q8_0.gguf", "q8_0")

Reads ``config.json`` and ``model.safetensors`` of a ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` folder
(``save_pretrained``) and writes one GGUF file with the ``gguf`` package's writer: architecture ``llama`` or
``qwen2``, llama.cpp's tensor names, 2-D weights in F32, F16, Q8_0 or Q4_0 (quantized by the ``gguf``
package's numpy code, ``gguf.quants``), 1-D tensors (norms, biases) in F32. Facts about llama.cpp's layout:

* llama.cpp's ``llama`` architecture applies RoPE to adjacent pairs (x0, x1), Hugging Face to the two halves
  of each head (x_i, x_{i + d/2}); the rows of the query and key projections are therefore reordered per head
  (half i -> pair position 2i / 2i + 1). ``qwen2`` uses the halves form: no reordering.
* Llama 3's ``rope_scaling`` (``rope_type: llama3``) is written as the ``rope_freqs.weight`` tensor: one
  divisor per frequency (1 for short wavelengths, ``factor`` for long ones, interpolated between).
* Tied embeddings: no ``output.weight``; llama.cpp then uses ``token_embd.weight`` as the LM head.
* A vocabulary is required: the file gets a SentencePiece-style one (``<unk>``, ``<s>``, ``</s>``, the 256 byte
  tokens, then placeholders) of the config's ``vocab_size``; the benchmark feeds token ids, not text.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

FORMATS = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0",
           "q5_1": "Q5_1", "q4_k": "Q4_K", "q5_k": "Q5_K", "q6_k": "Q6_K"}
#: llama.cpp's file-type codes (``LLAMA_FTYPE_*``) of the formats (K-quants: the ``_S`` mixes' codes)
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q4_k": 14, "q5_k": 16,
              "q6_k": 18}
#: what llama.cpp writes for a K-quant tensor whose rows do not split into super-blocks of 256
K_FALLBACK = {"q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
#: Hugging Face's per-layer names -> llama.cpp's
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_TENSORS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                  "lm_head.weight": "output.weight"}
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")


def gguf_name(hf_name: str) -> str:
    """llama.cpp's name of the Hugging Face tensor ``hf_name`` (``KeyError`` for one it has no place for)."""
    if hf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[hf_name]
    parts = hf_name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in LAYER_TENSORS:
        return f"blk.{int(parts[2])}.{LAYER_TENSORS[parts[3]]}"
    raise KeyError(f"no GGUF name for the Hugging Face tensor {hf_name!r}")


def halves_to_pairs(w: np.ndarray, heads: int) -> np.ndarray:
    """Reorder the output rows of a query/key projection (``[heads * d, ...]``) from Hugging Face's RoPE
    layout (rotation pairs i and i + d/2) to llama.cpp's ``llama`` layout (pairs 2i and 2i + 1)."""
    rows = w.shape[0]
    d = rows // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope_settings(cfg: dict) -> tuple[float, dict]:
    """RoPE's base and scaling of a config dict: transformers 5 writes both into ``rope_parameters``, earlier
    versions ``rope_theta`` and ``rope_scaling``."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or params
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0))), scaling


def llama3_rope_divisors(cfg: dict) -> np.ndarray | None:
    """The ``rope_freqs`` tensor for Llama 3's ``rope_scaling`` (None when the config has none)."""
    base, scaling = rope_settings(cfg)
    if scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_ctx = scaling["original_max_position_embeddings"]
    divisors = []
    for freq in 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim):
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / high:
            divisors.append(1.0)
        elif wavelen > old_ctx / low:
            divisors.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            divisors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(divisors, dtype=np.float32)


def _metadata(writer, cfg: dict, arch: str, fmt: str) -> None:
    import gguf

    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    writer.add_name(os.path.basename(cfg.get("_name_or_path", "")) or arch)
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(rope_settings(cfg)[0])
    writer.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_file_type(FILE_TYPES[fmt])
    # the vocabulary: specials, the 256 byte tokens, placeholders up to vocab_size
    n = cfg["vocab_size"]
    if n < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size {n} is too small for a GGUF vocabulary (at least {len(SPECIAL_TOKENS) + 256})")
    tokens = list(SPECIAL_TOKENS) + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    tokens += [f"\u2581t{i}" for i in range(len(tokens), n)]
    types += [gguf.TokenType.NORMAL] * (n - len(types))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(n - 259)])
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)


def encode_tensor(name: str, w: np.ndarray, fmt: str) -> tuple[np.ndarray, object | None]:
    """The data of one tensor in ``fmt`` and its GGUF type (None: the array's own dtype). 1-D tensors stay
    F32; a 2-D weight whose rows do not split into blocks of 32 is kept in F16 (``fmt`` q8_0/q4_0)."""
    import gguf
    from gguf.quants import quantize

    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim == 1 or fmt == "f32":
        return w, None
    if fmt == "f16" or w.shape[-1] % 32:
        return w.astype(np.float16), None
    if fmt in K_FALLBACK and name == "lm_head.weight":
        fmt = "q6_k"  # llama.cpp's K-quant mixes write the LM head in Q6_K
    if fmt in K_FALLBACK and w.shape[-1] % 256:
        fmt = K_FALLBACK[fmt]
    qtype = getattr(gguf.GGMLQuantizationType, FORMATS[fmt])
    if fmt in K_FALLBACK:  # the gguf package dequantizes K-quants but does not quantize them
        return (quantize_q6_k(w) if fmt == "q6_k" else quantize_k(w, fmt == "q5_k")), qtype
    return quantize(w, qtype), qtype


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """A float weight [N, K] (K a multiple of 256) as Q6_K super-blocks (bytes [N, K / 256 * 210]): per
    sub-block of 16 a scale max|w| / 31 as an int8 multiple of the super-block's f16 ``d``, codes q + 32
    (q in [-32, 31]); ql (low nibbles), qh (high 2 bits), the 16 scales, ``d``, in llama.cpp's order."""
    n, k = w.shape
    x = w.reshape(n, k // 256, 16, 16).astype(np.float64)
    scale = np.abs(x).max(axis=-1) / 31
    d = (scale.max(axis=-1) / 127).astype(np.float16)
    unit = d.astype(np.float64)[..., None]
    sc = (np.clip(np.rint(scale / np.where(unit > 0, unit, 1.0)), 0, 127) * (unit > 0)).astype(np.int8)
    step = (unit * sc)[..., None]
    q = np.where(step > 0, np.clip(np.rint(x / np.where(step > 0, step, 1.0)), -32, 31), 0).astype(np.int16) + 32
    q = q.astype(np.uint8).reshape(n, k // 256, 2, 4, 32)  # half h, j, l: weight 128 h + 32 j + l
    low, high = q & 15, q >> 4
    ql = (low[:, :, :, 0:2] | (low[:, :, :, 2:4] << 4)).reshape(n, k // 256, 128)
    qh = np.bitwise_or.reduce(high << (2 * np.arange(4, dtype=np.uint8))[:, None], axis=3).reshape(n, k // 256, 64)
    parts = [ql, qh, sc.view(np.uint8), d[..., None].view(np.uint8)]
    return np.concatenate(parts, axis=-1).reshape(n, -1)


def _pack_scale_min(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 scales and 8 mins (6 bits each) -> K-quants' 12 bytes: sub-blocks 0-3 in the low 6 bits of bytes
    0-3 / 4-7, sub-blocks 4-7's low nibbles in bytes 8-11 (scale low, min high), their top 2 bits in the top
    bits of bytes 0-3 (scale) / 4-7 (min)."""
    a = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    b = (m[..., :4] & 63) | ((m[..., 4:] >> 4) << 6)
    c = (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)
    return np.concatenate([a, b, c], axis=-1).astype(np.uint8)


def quantize_k(w: np.ndarray, fifth: bool) -> np.ndarray:
    """A float weight [N, K] (K a multiple of 256) as Q4_K (``fifth`` False) or Q5_K super-blocks (bytes
    [N, K / 256 * 144 or 176]): per sub-block of 32 the range [min(w, 0), max(w)] over 16 (32) levels,
    ``w ~ d * sc * q - dmin * m`` with the 6-bit ``sc`` / ``m`` relative to the super-block's f16 ``d`` /
    ``dmin``. A plain round-to-nearest quantizer (llama.cpp searches its scales; the layout is the same)."""
    top = 31 if fifth else 15
    n, k = w.shape
    x = w.reshape(n, k // 256, 8, 32).astype(np.float64)
    lo = np.minimum(x.min(axis=-1), 0.0)
    scale, mins = (np.maximum(x.max(axis=-1), lo) - lo) / top, -lo
    d, dmin = (scale.max(axis=-1) / 63).astype(np.float16), (mins.max(axis=-1) / 63).astype(np.float16)

    def six_bits(v, unit):
        unit = unit.astype(np.float64)[..., None]
        return np.clip(np.rint(v / np.where(unit > 0, unit, 1.0)), 0, 63).astype(np.uint8) * (unit > 0)

    sc, m = six_bits(scale, d), six_bits(mins, dmin)
    step = d.astype(np.float64)[..., None] * sc
    offset = dmin.astype(np.float64)[..., None] * m
    q = np.rint((x + offset[..., None]) / np.where(step > 0, step, 1.0)[..., None])
    q = np.clip(np.where(step[..., None] > 0, q, 0), 0, top).astype(np.uint8)  # [n, super-blocks, 8, 32]
    pairs = q.reshape(n, k // 256, 4, 2, 32)
    qs = ((pairs[:, :, :, 0] & 15) | ((pairs[:, :, :, 1] & 15) << 4)).reshape(n, k // 256, 128)
    parts = [d[..., None].view(np.uint8), dmin[..., None].view(np.uint8), _pack_scale_min(sc, m)]
    if fifth:  # bit j of byte l: sub-block j's element l's fifth bit
        parts.append(np.bitwise_or.reduce(((q >> 4) & 1) << np.arange(8, dtype=np.uint8)[:, None], axis=2))
    return np.concatenate(parts + [qs], axis=-1).reshape(n, -1)


def write_gguf(hf_folder: str, path: str, fmt: str = "f32") -> str:
    """Write the decoder saved in ``hf_folder`` as the GGUF file ``path`` with 2-D weights in ``fmt``
    (one of :data:`FORMATS`; K-quants fall back as llama.cpp's do: :data:`K_FALLBACK`); returns ``path``."""
    import gguf
    from safetensors.numpy import load_file

    if fmt not in FORMATS:
        raise ValueError(f"GGUF format {fmt!r}: expected one of {sorted(FORMATS)}")
    with open(os.path.join(hf_folder, "config.json")) as f:
        cfg = json.load(f)
    arch_name = (cfg.get("architectures") or ["?"])[0]
    if arch_name not in ARCHS:
        raise ValueError(f"architecture {arch_name}: the GGUF writer knows {sorted(ARCHS)}")
    arch = ARCHS[arch_name]
    weights = load_file(os.path.join(hf_folder, "model.safetensors"))
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    writer = gguf.GGUFWriter(path, arch)
    _metadata(writer, cfg, arch, fmt)
    divisors = llama3_rope_divisors(cfg)
    if divisors is not None:
        writer.add_tensor("rope_freqs.weight", divisors)
    for hf_name in sorted(weights):
        if hf_name == "lm_head.weight" and cfg.get("tie_word_embeddings", False):
            continue
        w = weights[hf_name].astype(np.float32)
        if arch == "llama" and hf_name.endswith("q_proj.weight"):
            w = halves_to_pairs(w, heads)
        elif arch == "llama" and hf_name.endswith("k_proj.weight"):
            w = halves_to_pairs(w, kv_heads)
        data, qtype = encode_tensor(hf_name, w, fmt)
        writer.add_tensor(gguf_name(hf_name), data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
