"""Broadcasts oneDNN 3.2's jit binary does not take as given (cpp/kernels/binary.cc,
AvoidReferenceBroadcast).

Its jit kernel broadcasts the second operand per tensor, per channel and in a few other patterns;
any other ran its reference kernel ("ref:any"). torchvision's Swin-T adds the shifted-window mask
``[1, windows, 1, N, N]`` to the scores viewed as ``[1, windows, heads, N, N]``: five such reference
steps were 18% of the whole model's call (bench/ZOO.md, session 12). The kernel now reads both
operands plain in the fewest dims (``[windows, heads, N * N] + [windows, 1, N * N]``, jitted) and,
where that is still a reference kernel, expands the broadcast operand to the output shape by a host
step first. Checked here against numpy and torch, and by the region's per-step profile: no binary
step runs a reference kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

import byoc_hetero as bh
from model_paths import PATHS, dataflow_module, one_region
from model_paths import run_profiled as _run_profiled

R = relax.op


def _reference_binaries(steps: list[dict]) -> list[str]:
    return [s["label"] + " " + s["layouts"] for s in steps if s["op"] == "binary" and s["impl"].startswith("ref")]


@pytest.mark.parametrize(("shape", "other", "expanded", "alg"), [
    ((1, 4, 3, 7, 7), (1, 4, 1, 7, 7), False, "add"),  # Swin's window mask over [1, windows, heads, N, N]
    ((5, 3, 6), (5, 1, 6), False, "mul"),              # the same broadcast, already in its fewest dims
    ((2, 3, 4, 5), (2, 1, 4, 1), True, "add"),         # kept dims between broadcast ones: expanded first
    ((2, 3, 4, 5), (2, 1, 4, 1), True, "sub"),         # ... with the operands swapped back (b - a) * -1
    ((3, 4, 5), (1, 4, 5), False, "mul"),              # a leading broadcast (jitted as it is)
])
def test_broadcast_binary_never_runs_a_reference_kernel(shape, other, expanded, alg):
    """x @ I then op a constant broadcast along the middle dims: numpy's answer, and no ``ref``
    binary step; where the collapsed form is not jitted either, the host expansion step runs."""
    rng = np.random.default_rng(len(shape) * 7 + len(other))
    x = rng.standard_normal(shape).astype("float32")
    c = rng.standard_normal(other).astype("float32")
    ident = np.eye(shape[-1], dtype="float32")
    op = {"add": R.add, "mul": R.multiply, "sub": R.subtract}[alg]
    mod = dataflow_module([relax.Var("x", relax.TensorType(shape, "float32"))],
                          lambda bb, v: op(bb.emit(R.matmul(v, relax.const(ident))), relax.const(c)))
    part = bh.partition(mod)
    assert len(bh.report(part).regions) == 1
    got, steps = _run_profiled(part, [x])
    want = {"add": np.add, "mul": np.multiply, "sub": np.subtract}[alg](x, c)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not _reference_binaries(steps), _reference_binaries(steps)
    expansions = [s for s in steps if s["op"] == "binary" and "broadcast to the output shape" in s["label"]]
    assert bool(expansions) == expanded, [s["label"] for s in steps]


torch = pytest.importorskip("torch")


class ShiftedWindowAttention(torch.nn.Module):
    """torchvision Swin's window attention at a few channels: q @ k^T scaled, the relative position
    bias [heads, N, N] added, the shifted-window mask [windows, N, N] added through a view of the
    scores as [B, windows, heads, N, N], softmax, @ v."""

    def __init__(self, windows: int = 4, heads: int = 2, tokens: int = 16, dim: int = 8):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.windows, self.heads, self.tokens = windows, heads, tokens
        self.qkv = torch.nn.Linear(dim * heads, 3 * dim * heads)
        self.bias = torch.nn.Parameter(torch.randn(heads, tokens, tokens, generator=g))
        mask = torch.where(torch.rand(windows, tokens, tokens, generator=g) < 0.3, -100.0, 0.0)
        self.register_buffer("mask", mask)
        self.scale = dim ** -0.5

    def forward(self, x):  # x: [windows, tokens, heads * dim]
        w, n = x.shape[0], x.shape[1]
        q, k, v = self.qkv(x).reshape(w, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attn = (q * self.scale) @ k.transpose(-2, -1) + self.bias.unsqueeze(0)
        attn = attn.view(w // self.windows, self.windows, self.heads, n, n) + self.mask.unsqueeze(1).unsqueeze(0)
        attn = torch.softmax(attn.view(-1, self.heads, n, n), dim=-1)
        return (attn @ v).transpose(1, 2).reshape(w, n, -1)


@pytest.mark.parametrize("path", PATHS)
def test_shifted_window_mask_add_is_jitted(path, tmp_path):
    """The window-attention block through every import path: one region, nothing on llvm, torch's
    answer, and no binary step on a reference kernel (the mask add ran "ref:any" before)."""
    torch.manual_seed(0)
    model = ShiftedWindowAttention().eval()
    x = torch.randn(4, 16, 16)
    with torch.no_grad():
        want = model(x).numpy()
    part = one_region(model, (x,), path, tmp_path)
    got, steps = _run_profiled(part, [x.numpy()])
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert not _reference_binaries(steps), _reference_binaries(steps)
