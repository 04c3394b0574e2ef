"""8-bit values stored in different layouts meeting in one element-wise chain (issue 35, item 1).

int8 ConvNeXt-T (``quantize_static``, QDQ) was 1.2 relative off ONNX Runtime on CPUs whose int8
convolutions run (VNNI, or ``BYOC_HETERO_INT8=saturating``): stage 2's first residual sum adds the
downsampling conv's 8-bit output, which the int8 conv writes NHWC, and the block's branch, permuted
back to NCHW (plain storage: 8-bit in that file, float32 in the graph here, where the layer scale's
chain ends in float32). The ``elementwise_chain`` of that sum reads every operand in its first
input's layout (NHWC: no relayout between two int8 convs) but declared that layout as the operands'
*view* as well, so the planner handed it the plain bytes of the permuted operand under an NHWC view:
the sum read a scrambled branch, and the permute after it (whose Q/DQ reuse the sum's scale, so the
chain ends in float32) passed the scrambled values on. The chain now views each operand plainly and
asks for the NHWC layout it reads: the planner reorders the plain operand first.

The graph here is that junction alone, checked against the same module built by llvm only (the Q/DQ
arithmetic in float32, exact): the int8 conv's weights stay within +-60 so that its u8 x s8 pair sums
cannot saturate 16 bits on a CPU without VNNI either.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import graph
from tvm import relax

import byoc_hetero as bh
from byoc_hetero.timing import build, run

R = relax.op
C, H, W = 16, 6, 6
SX, ZX, SW = 0.02, 128, 0.01  # input scale / zero point, weight scale
SA, ZA, SB, ZB, SS, ZS = 0.05, 120, 0.03, 127, 0.06, 118  # conv output, branch, sum


def _c(value, dtype="float32"):
    return relax.const(np.array(value, dtype))


def _junction():
    """ConvNeXt's stage-2 junction in QDQ form: x [1, C, H, W] -> int8 conv 3x3 = a (NHWC storage);
    a -> int8 depthwise conv -> permute to NHWC -> layer scale (x gamma per channel) -> permute back
    to NCHW = b (plain storage); a + b -> Q/DQ -> permute to NHWC -> Q/DQ (the
    sum's scale). Every value between two ops is quantize_static's Q/DQ pair."""
    rng = np.random.default_rng(35)
    weight = rng.integers(-60, 61, (C, C, 3, 3)).astype(np.int8)
    depthwise = rng.integers(-60, 61, (C, 1, 3, 3)).astype(np.int8)
    bias = (rng.standard_normal(C) * 0.1).astype(np.float32)
    gamma = (0.5 + rng.random(C)).astype(np.float32)

    def body(emit, x):
        def qdq(v, s, z):
            q = emit(R.quantize(v, _c(s), _c(z, "uint8"), out_dtype="uint8"))
            return emit(R.dequantize(q, _c(s), _c(z, "uint8")))

        def conv(v, w, groups):
            wd = emit(R.dequantize(relax.const(w), _c(np.full(C, SW, np.float32)),
                                   _c(np.zeros(C, np.int8), "int8"), axis=0))
            return emit(R.nn.conv2d(v, wd, padding=[1, 1, 1, 1], groups=groups))

        a = qdq(emit(R.add(conv(qdq(x, SX, ZX), weight, 1), relax.const(bias.reshape(1, C, 1, 1)))), SA, ZA)
        d = qdq(emit(R.permute_dims(qdq(conv(a, depthwise, C), SB, ZB), [0, 2, 3, 1])), SB, ZB)
        b = qdq(emit(R.permute_dims(qdq(emit(R.multiply(d, relax.const(gamma))), SB, ZB), [0, 3, 1, 2])), SB, ZB)
        s = qdq(emit(R.add(a, b)), SS, ZS)
        return qdq(emit(R.permute_dims(s, [0, 2, 3, 1])), SS, ZS)

    return graph({"x": (1, C, H, W)}, body)


def _nodes(part) -> list[dict]:
    return [n for m in part.attrs["external_mods"] for n in json.loads(str(m["get_graph_json"]()))["nodes"]]


@pytest.mark.parametrize("seed", [0, 1])
def test_chain_reads_a_plain_operand_next_to_an_int8_conv_output(monkeypatch, seed):
    monkeypatch.setenv("BYOC_HETERO_INT8", "saturating")  # the int8 conv runs here too (no-op with VNNI)
    mod = _junction()
    part = bh.partition(mod, require_heavy_op=False)
    nodes = _nodes(part)
    assert any(n["op"] == "conv2d" and "src_scale" in n["attrs"] for n in nodes), [n["op"] for n in nodes]
    assert any(n["op"] == "elementwise_chain" and len(n["inputs"]) == 2 for n in nodes), [n["op"] for n in nodes]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, C, H, W)).astype(np.float32)
    got = run(build(part), [x])
    want = run(build(mod), [x])
    # the same Q/DQ grid: equal but for a conv output a rounding tie away (one step of the sum)
    assert np.abs(got - want).max() <= SS * 1.001, np.abs(got - want).max()
    assert np.mean(got != want) < 0.02
