"""Independent numpy references for the ops the runtime runs."""

from __future__ import annotations

import numpy as np


def conv2d_nchw(x, w, stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """Direct convolution: a loop over kernel positions, each a batched matrix product."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    top, left, bottom, right = padding
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    oh = (h + top + bottom - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + left + right - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow), dtype=np.float64)
    og = o // groups
    for g in range(groups):
        xg = xp[:, g * cg:(g + 1) * cg].astype(np.float64)
        wg = w[g * og:(g + 1) * og].astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                hs, ws = i * dilation[0], j * dilation[1]
                patch = xg[:, :, hs:hs + stride[0] * oh:stride[0], ws:ws + stride[1] * ow:stride[1]]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, i, j])
    return out.astype(np.float32)


def relu(x):
    return np.maximum(x, 0)


def step_logits(gen, tokens: np.ndarray, n: int) -> np.ndarray:
    """A generator's logits for the prefill of ``tokens[:, :n]``, then for each later token fed one decode
    step at a time (``gen.step`` on a fresh cache): what a test compares with a full-sequence reference."""
    cache = gen.new_cache(1)
    rows = [gen.step(tokens[:, :n], np.array([0]), np.array([n]), cache)[0]]
    for pos in range(n, tokens.shape[1]):
        rows.append(gen.step(tokens[:, pos:pos + 1], np.array([pos]), np.array([1]), cache)[0])
    return np.stack(rows)
