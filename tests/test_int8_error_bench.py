"""bench/int8_error.py's simulated scale rules are our quantizer's (issue 37's error decomposition).

The bench explains the logits error of ``weights="int8"`` by simulating each scale rule in numpy; its
figures mean something for our engine only if its ``pc`` / ``pc-asym`` / ``gN`` / ``g32-gguf`` rules dequantize
to what :func:`~byoc_hetero.quant.weight_only.quantize_matrix` writes for ``from_hf(weights="int8",
group_size=..., rounding=...)``
(reference: our quantizer's codes dequantized by :func:`dequantize_codes`), and its two-level ``sub`` rules
never clip a code and keep every block's error within its own scale's half step.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from byoc_hetero.quant.weight_only import dequantize_codes, quantize_matrix

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import int8_error  # noqa: E402


def _weight(n: int = 37, k: int = 160) -> np.ndarray:
    rng = np.random.default_rng(16)
    w = rng.normal(0.0, 0.02, (n, k))
    w[3] *= 5.0  # an outlier channel
    w[5, :32] = 0.0  # an all-zero block
    return w.astype(np.float32)


@pytest.mark.parametrize("rule,block,zero_points,scale_dtype,rounding", [
    ("pc", None, False, "float32", "nearest"), ("pc-asym", None, True, "float32", "nearest"),
    ("g32", 32, False, "float16", "nearest"), ("g32-gguf", 32, False, "float16", "gguf")])
def test_simulated_rule_is_the_quantizers_dequantized_codes(rule, block, zero_points, scale_dtype, rounding):
    w = _weight()
    want = dequantize_codes(quantize_matrix(w, 8, block, zero_points=zero_points, scale_dtype=scale_dtype,
                                            rounding=rounding))
    got = int8_error.quantized(w, int8_error.RULES[rule], chunk=16)
    step = np.abs(w).max() / 127
    assert np.abs(got - want).max() <= 1e-5 * step  # the same codes; scales equal up to float32 rounding
    assert np.abs(got - w).max() > 0.1 * step  # a rule that rounds


@pytest.mark.parametrize("levels", [15, 255])
def test_two_level_rule_clips_no_code_and_stays_within_half_a_step(levels):
    w = _weight().astype(np.float64)
    got = int8_error.q_sub(w, levels)
    blocks = w.reshape(w.shape[0], -1, 32)
    d = np.abs(w).max(1)[:, None] / 127
    factor = np.clip(np.ceil(np.abs(blocks).max(2) / 127 / d * levels), 1, levels)
    step = (d * factor / levels)[:, :, None]
    err = np.abs(got.reshape(blocks.shape) - blocks)
    assert (err <= step / 2 * (1 + 1e-9)).all()
    assert (step <= np.maximum(np.abs(blocks).max(2, keepdims=True) / 127, 0) + d[:, :, None] / levels + 1e-12).all()
    # finer than one scale per channel where a block is smaller than its channel's largest
    assert err.mean() < np.abs(int8_error.q_channel(w) - w).mean()
