"""``weights="int8" | "int4", group_size=32`` against llama.cpp's Q8_0 / Q4_0 (issue 37), on tiny GGUF files
written by the ``gguf`` package (its Q8_0 / Q4_0 quantizers are bit-exact with ggml's reference
``quantize_row_q8_0_ref`` / ``quantize_row_q4_0_ref``) from the same weights and read back with our reader
(``block_codes``).

``rounding="gguf"`` is llama.cpp's rule: the codes come from the float32 scale ``d`` (Q8_0:
``roundf(w * (1 / d))``, ties away from zero; Q4_0: ``trunc(w * (1 / d) + 8.5)`` capped at 15, ties up),
then ``d`` is stored as float16: the file's codes and scales bit for bit, and its dequantized weights
everywhere (a block whose ``d`` underflows float16 reads 0 in both). ``rounding="nearest"`` rounds on
the float16 scale it stores: the same scales, and codes one step off the file's where the float16
rounding of the scale (or a tie) moves ``w / d`` across a half, each then the nearer on the stored grid.
"""

from __future__ import annotations

import numpy as np
import pytest

from byoc_hetero.errors import QuantizationError
from byoc_hetero.llm.gguf import GgufFile, block_codes
from byoc_hetero.quant.weight_only import _unpack, dequantize_codes, quantize_matrix

gguf = pytest.importorskip("gguf")

UNDERFLOW = (7, 1)  # (row, block of 32)
TIES = 9  # the row whose first block holds exact halves under both formats' float32 scales
FORMATS = {"q8_0": (8, "Q8_0"), "q4_0": (4, "Q4_0")}


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(37)
    w = rng.normal(0.0, 0.02, (48, 256)).astype(np.float32)
    w[3] *= 40.0  # an outlier channel
    w[5, :32] = 0.0  # an all-zero block
    w[UNDERFLOW[0], 32 * UNDERFLOW[1]:32 * UNDERFLOW[1] + 32] = 1e-7  # its max / 127 (or / 8) underflows float16
    # Q8_0: max |w| = 127 * 2^-7, so d = 2^-7 exactly and w * (1 / d) = +-2.5, +-0.5 exactly (ties)
    w[TIES, :32] = 0.0
    w[TIES, :6] = np.array([-127, 127, 2.5, -2.5, 0.5, -0.5], np.float32) * np.float32(2.0 ** -7)
    # Q4_0: the extreme -8 * 2^-5 -> d = 2^-5, and w * (1 / d) = -2.5, 2.5 at 6 / 7 are ties
    w[TIES + 1, :32] = 0.0
    w[TIES + 1, 0] = np.float32(-8 * 2.0 ** -5)
    w[TIES + 1, 6:8] = np.array([-2.5, 2.5], np.float32) * np.float32(2.0 ** -5)
    table = rng.normal(0.0, 0.05, (64, 96)).astype(np.float32)  # a tied embedding / LM head
    return {"blk.0.ffn_up.weight": w, "token_embd.weight": table}


@pytest.fixture(scope="module", params=list(FORMATS))
def gguf_file(request, tmp_path_factory) -> tuple[str, int, dict[str, np.ndarray]]:
    fmt = request.param
    bits, kind = FORMATS[fmt]
    path = str(tmp_path_factory.mktemp(fmt) / f"tiny.{fmt}.gguf")
    weights = _weights()
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    writer = gguf.GGUFWriter(path, "qwen2")
    for name, w in weights.items():
        writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, bits, weights


def _normal(name: str, shape: tuple[int, int]) -> np.ndarray:
    """Blocks [N, K / 32] whose scale is within float16's range (all but the underflowing one)."""
    normal = np.ones(shape, bool)
    if name == "blk.0.ffn_up.weight":
        normal[UNDERFLOW] = False
    return normal


def _against_the_file(gguf_file, name: str, rounding: str):
    """Ours in blocks of 32 under ``rounding`` and the file's tensor ``name``: (ours, ref, our codes, the file's,
    the codes of normal blocks), the scales of normal blocks asserted equal bit for bit."""
    path, bits, weights = gguf_file
    ref = block_codes(GgufFile(path), name)
    ours = quantize_matrix(weights[name], bits, 32, scale_dtype="float16", rounding=rounding)
    normal = _normal(name, ours.scales.shape)
    np.testing.assert_array_equal(ours.scales.view(np.uint16)[normal], ref.scales.view(np.uint16)[normal])
    return ours, ref, _unpack(ours), _unpack(ref), np.repeat(normal, 32, axis=1)


@pytest.mark.parametrize("name", ["blk.0.ffn_up.weight", "token_embd.weight"])
def test_gguf_rounding_writes_the_files_codes_and_scales(gguf_file, name):
    ours, ref, qo, qr, keep = _against_the_file(gguf_file, name, "gguf")
    assert ours.scales.dtype == np.float16 and ours.codes.dtype == ref.codes.dtype and ours.block == 32
    assert (qo != qr)[keep].sum() == 0  # 0 differing codes
    np.testing.assert_array_equal(dequantize_codes(ours), dequantize_codes(ref))  # everywhere, the underflow too


def test_gguf_rounding_breaks_ties_as_llama_cpp(gguf_file):
    """Exact halves: Q8_0 rounds them away from zero (roundf), Q4_0 up (trunc of + 8.5); "nearest" to even."""
    path, bits, weights = gguf_file
    w = weights["blk.0.ffn_up.weight"]
    row = TIES if bits == 8 else TIES + 1
    ref = _unpack(block_codes(GgufFile(path), "blk.0.ffn_up.weight"))[row, :32]
    got = _unpack(quantize_matrix(w, bits, 32, scale_dtype="float16", rounding="gguf"))[row, :32]
    near = _unpack(quantize_matrix(w, bits, 32, scale_dtype="float16", rounding="nearest"))[row, :32]
    np.testing.assert_array_equal(got, ref)
    if bits == 8:  # w / d = -127, 127, 2.5, -2.5, 0.5, -0.5, ...
        np.testing.assert_array_equal(got[:6], [-127, 127, 3, -3, 1, -1])
        np.testing.assert_array_equal(near[:6], [-127, 127, 2, -2, 0, 0])
    else:  # d = 2^-5: w / d = -2.5, 2.5 at 6 / 7 (codes + 8)
        np.testing.assert_array_equal(got[6:8] - 8, [-2, 3])
        np.testing.assert_array_equal(near[6:8] - 8, [-2, 2])


@pytest.mark.parametrize("name", ["blk.0.ffn_up.weight", "token_embd.weight"])
def test_nearest_rounding_same_scales_codes_the_nearest_on_them(gguf_file, name):
    ours, _, qo, qr, keep = _against_the_file(gguf_file, name, "nearest")
    _, bits, weights = gguf_file
    w = weights[name]
    assert np.abs(qo - qr)[keep].max() <= 1
    differ = (qo != qr) & keep
    assert 0 < differ.sum() and differ.mean() < 0.02  # only codes next to a half on the f16 grid
    zero = 0 if bits == 8 else 8
    s = np.repeat(ours.scales.astype(np.float64), 32, axis=1)
    err_ours, err_file = np.abs((qo - zero) * s - w), np.abs((qr - zero) * s - w)
    assert (err_ours[keep] <= err_file[keep] + 1e-12).all()  # ours: the nearest code to the stored scale
    assert (err_ours[differ] <= err_file[differ]).all()


def test_nearest_keeps_a_block_below_float16s_range_where_the_file_zeroes_it(gguf_file):
    """max |w| / 127 (Q4_0: / 8) under half float16's smallest subnormal: llama.cpp stores d = 0 (the block reads 0),
    "nearest" the smallest subnormal with codes on it (the block within half a step of it), "gguf" reads 0."""
    path, bits, weights = gguf_file
    w = weights["blk.0.ffn_up.weight"]
    ref = block_codes(GgufFile(path), "blk.0.ffn_up.weight")
    row, blk = UNDERFLOW
    cols = slice(32 * blk, 32 * blk + 32)
    assert (dequantize_codes(ref)[row, cols] == 0).all()
    tiny = float(np.finfo(np.float16).smallest_subnormal)
    for rounding, within in (("nearest", tiny / 2), ("gguf", 1e-6)):
        ours = quantize_matrix(w, bits, 32, scale_dtype="float16", rounding=rounding)
        assert abs(float(ours.scales[row, blk])) == tiny
        assert np.abs(dequantize_codes(ours)[row, cols] - w[row, cols]).max() <= within
    assert (dequantize_codes(quantize_matrix(w, bits, 32, scale_dtype="float16", rounding="gguf"))[row, cols] == 0).all()


@pytest.mark.parametrize("bits", [8, 4])
def test_gguf_rounding_per_channel_and_float32_scales(bits):
    """The rule at any block and scale dtype: float32 scales are its float32 d; the codes its own (numpy)."""
    rng = np.random.default_rng(3)
    w = rng.normal(0, 1, (13, 128)).astype(np.float32)
    for block in (None, 64):
        got = quantize_matrix(w, bits, block, scale_dtype="float32", rounding="gguf")
        b = w.reshape(13, -1, block or 128)
        if bits == 8:
            d = np.abs(b).max(2) / np.float32(127)
            x = b * (np.float32(1) / d)[:, :, None]
            want = np.sign(x) * np.floor(np.abs(x).astype(np.float64) + 0.5)  # exact in float64
        else:
            d = np.take_along_axis(b, np.abs(b).argmax(2)[:, :, None], 2)[:, :, 0] / np.float32(-8)
            want = np.minimum(np.trunc((b * (np.float32(1) / d)[:, :, None]) + np.float32(8.5)), 15) - 8
        np.testing.assert_array_equal(got.scales, d)
        np.testing.assert_array_equal(_unpack(got) - (0 if bits == 8 else 8), want.reshape(13, 128))


def test_rounding_is_checked():
    w = np.ones((2, 32), np.float32)
    with pytest.raises(QuantizationError, match="rounding must be one of 'nearest', 'gguf'"):
        quantize_matrix(w, 8, 32, rounding="even")
    with pytest.raises(QuantizationError, match="rounding='gguf' .* no zero points"):
        quantize_matrix(w, 4, 32, zero_points=True, rounding="gguf")


@pytest.mark.parametrize("rounding", ["gguf", "nearest"])
def test_a_scale_past_float16s_range_is_named(rounding):
    """A block whose scale overflows float16 (max |w| = 1e7: d = 78740 > 65504) is a QuantizationError naming the
    block, under either rounding: never an infinite scale."""
    w = np.ones((3, 64), np.float32)
    w[2, 40] = 1e7
    with pytest.raises(QuantizationError, match=r"block \[2, 1\]'s scale 7.87e\+04 overflows float16"):
        quantize_matrix(w, 8, 32, scale_dtype="float16", rounding=rounding)
