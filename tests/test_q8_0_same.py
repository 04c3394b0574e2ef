"""``weights="int8", group_size=32`` against llama.cpp's Q8_0 (issue 37), on a tiny Q8_0 GGUF file
written by the ``gguf`` package (its Q8_0 quantizer is bit-exact with ggml's reference) from the same
weights and read back with our reader (``block_codes``).

The reference fixes what is the same and what is not: the scales (float16 ``max |w| / 127`` per block
of 32) are the file's bit for bit, the LM head's too; the codes are the file's except where the
float16 rounding of the scale moves ``w / d`` across a half: llama.cpp rounds ``w * (1 / d)`` with
the float32 ``d``, ours rounds ``w / d16`` with the scale it stores, so each of our codes is the
nearest on the stored grid and the file's differs from it by one there. bench/q8_0_same.py's
llama.cpp rule (used for issue 37's engine experiment) writes the file's codes exactly.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from byoc_hetero.llm.gguf import GgufFile, block_codes
from byoc_hetero.quant.weight_only import dequantize_codes, quantize_matrix

gguf = pytest.importorskip("gguf")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import q8_0_same  # noqa: E402


UNDERFLOW = (7, 1)  # (row, block of 32)


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(37)
    w = rng.normal(0.0, 0.02, (48, 256)).astype(np.float32)
    w[3] *= 40.0  # an outlier channel
    w[5, :32] = 0.0  # an all-zero block
    w[UNDERFLOW[0], 32 * UNDERFLOW[1]:32 * UNDERFLOW[1] + 32] = 1e-6  # its max / 127 underflows float16
    table = rng.normal(0.0, 0.05, (64, 96)).astype(np.float32)  # a tied embedding / LM head
    return {"blk.0.ffn_up.weight": w, "token_embd.weight": table}


@pytest.fixture(scope="module")
def q8_0_file(tmp_path_factory) -> tuple[str, dict[str, np.ndarray]]:
    path = str(tmp_path_factory.mktemp("q8") / "tiny.q8_0.gguf")
    weights = _weights()
    writer = gguf.GGUFWriter(path, "qwen2")
    for name, w in weights.items():
        writer.add_tensor(name, gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, weights


@pytest.mark.parametrize("name", ["blk.0.ffn_up.weight", "token_embd.weight"])
def test_g32_scales_are_q8_0s_and_codes_the_nearest_on_them(q8_0_file, name):
    path, weights = q8_0_file
    w = weights[name]
    ref = block_codes(GgufFile(path), name)
    ours = quantize_matrix(w, 8, 32, scale_dtype="float16")
    assert ours.scales.dtype == np.float16 and ref.scales.shape == ours.scales.shape
    under = UNDERFLOW if name == "blk.0.ffn_up.weight" else None
    normal = np.ones(ours.scales.shape, bool)
    if under is not None:
        normal[under] = False
    np.testing.assert_array_equal(ours.scales.view(np.uint16)[normal], ref.scales.view(np.uint16)[normal])
    keep = np.repeat(normal, 32, axis=1)
    qo, qr = ours.codes.astype(np.int32), ref.codes.reshape(w.shape).astype(np.int32)
    assert np.abs(qo - qr)[keep].max() <= 1
    differ = (qo != qr) & keep
    assert 0 < differ.sum() and differ.mean() < 0.02  # only codes next to a half on the f16 grid
    s = np.repeat(ours.scales.astype(np.float64), 32, axis=1)
    err_ours, err_file = np.abs(qo * s - w), np.abs(qr * s - w)
    assert (err_ours[keep] <= err_file[keep] + 1e-12).all()  # ours: the nearest code to the stored scale
    assert (err_ours[differ] < err_file[differ]).all()
    np.testing.assert_array_equal(dequantize_codes(ref)[keep], np.where(differ, qr * s, dequantize_codes(ours))[keep])


def test_block_below_float16s_range_is_kept_where_q8_0_zeroes_it(q8_0_file):
    """max |w| / 127 under half float16's smallest subnormal: llama.cpp stores d = 0 (the block reads 0),
    ours the smallest subnormal with codes on it (the block within half a step of it)."""
    path, weights = q8_0_file
    w = weights["blk.0.ffn_up.weight"]
    ref, ours = block_codes(GgufFile(path), "blk.0.ffn_up.weight"), quantize_matrix(w, 8, 32, scale_dtype="float16")
    row, blk = UNDERFLOW
    cols = slice(32 * blk, 32 * blk + 32)
    assert (dequantize_codes(ref)[row, cols] == 0).all()
    tiny = float(np.finfo(np.float16).smallest_subnormal)
    assert float(ours.scales[row, blk]) == tiny
    assert np.abs(dequantize_codes(ours)[row, cols] - w[row, cols]).max() <= tiny / 2


def test_llama_cpp_rule_writes_the_files_weights(q8_0_file):
    path, weights = q8_0_file
    f = GgufFile(path)
    for name, w in weights.items():
        q, d = q8_0_same.llama_cpp_q8_0(w)
        deq = (q.reshape(w.shape[0], -1, 32) * d.astype(np.float32)[:, :, None]).reshape(w.shape)
        np.testing.assert_array_equal(deq, dequantize_codes(block_codes(f, name)))
