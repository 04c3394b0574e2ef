"""dense_wq's kernels for weight blocks of 32 (llama.cpp's Q8_0 / Q4_0 block, ``from_hf(group_size=32)``) behind
``BYOC_HETERO_WQ_BLOCK32=on`` (cpp/kernels/dense_wq.h): the tile kernels with the scales' form fixed at compile time,
and for 8-bit codes with float16 scales on AVX-512 the inline layout (each pair of blocks' scales inside the codes'
stream, read by the tile and the integer panel kernels). Against numpy's dequantize-then-matmul on the same
quantized activations, and bit for bit against the general kernels (``=off``), on this CPU's ISA, with VNNI off
(the AVX-512BW kernels), capped to AVX2 (no inline layout there) and generic C++ (no block-32 kernel)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm

from byoc_hetero.quant.weight_only import quantize_matrix
from test_weight_only import _close, _has_avx512bw, _int_kernel, _quantize_rows, _reference, _region, _run

create = tvm.get_global_func("byoc_hetero.runtime.create")


def _both(monkeypatch, x, codes, bias=None):
    """The outputs and run steps with BYOC_HETERO_WQ_BLOCK32 off and on (the switch is read when a plan is made)."""
    outs, steps, inits = [], [], []
    for value in ("off", "on"):
        monkeypatch.setenv("BYOC_HETERO_WQ_BLOCK32", value)
        got, plan = _run(x, codes, bias)
        outs.append(got)
        steps.append(next(line for line in plan if line.startswith("run") and "dense_wq" in line))
        inits.append([line for line in plan if line.startswith("init")])
    return outs, steps, inits


@pytest.mark.parametrize("isa,vnni", [("auto", "auto"), ("auto", "off"), ("avx2", "auto"), ("avx2", "off"),
                                      ("generic", "auto")])
@pytest.mark.parametrize("bits,scale_dtype", [(8, "float16"), (8, "float32"), (4, "float16")])
def test_block32_kernels_match_numpy_and_the_general_ones(monkeypatch, isa, vnni, bits, scale_dtype):
    """K of 3 and 5 blocks (an odd last pair of the inline layout), 37 columns (a partial tile), 1-5 rows (every
    tile kernel row count) and 17 (the integer panels on AVX-512): the same outputs as the general kernels bit for
    bit, within float rounding of numpy's, and the plan names the kernel and the layout where they apply."""
    monkeypatch.delenv("BYOC_HETERO_WQ_ACT", raising=False)
    monkeypatch.setenv("BYOC_HETERO_WQ_ISA", isa)
    monkeypatch.setenv("BYOC_HETERO_WQ_VNNI", vnni)
    rng = np.random.default_rng(bits * 7 + len(scale_dtype) + len(isa))
    kernel = _int_kernel(isa, vnni)
    avx512 = kernel.startswith("avx512")
    for k in (96, 160):
        codes = quantize_matrix(rng.standard_normal((37, k)).astype(np.float32), bits, 32, False, scale_dtype)
        bias = rng.standard_normal(37).astype(np.float32)
        for m in (1, 2, 3, 4, 5, 17):
            x = (rng.standard_normal((m, k)) * 2).astype(np.float32)
            b = bias if m % 2 else None
            (off, on), (_, step), (_, init) = _both(monkeypatch, x, codes, b)
            assert np.array_equal(off, on), (k, m, np.abs(off - on).max())
            _close(on, _reference(_quantize_rows(x), codes, b))
            panels = avx512 and m >= 17
            assert (", blocks of 32 kernel" in step) == (kernel != "generic" and not panels), step
            inline = avx512 and scale_dtype == "float16"
            assert any("float16 scales inline" in line for line in init) == inline, init


def test_inline_layout_rejects_a_zero_scale(monkeypatch):
    """The inline layout checks the scales it packs, as the scales' own tiles do: a zero scale fails at __init_."""
    if not _has_avx512bw():
        pytest.skip("the inline layout is made for the AVX-512 integer kernels")
    monkeypatch.setenv("BYOC_HETERO_WQ_BLOCK32", "on")
    codes = quantize_matrix(np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32), 8, 32, False,
                            "float16")
    codes.scales[3, 1] = 0
    text, consts = _region((1, 64), codes, None)
    mod = create(text)
    with pytest.raises(ValueError, match=r"scales\[3, 1\] is 0: expected a finite, nonzero scale"):
        mod["__init_wq"]([tvm.runtime.tensor(np.ascontiguousarray(c)) for c in consts])


def test_block32_kernels_are_the_default(monkeypatch):
    """The switch unset: the blocks-of-32 kernel (the default since session 17's quiet A/B); ``off`` the general one."""
    if not _has_avx512bw():
        pytest.skip("the AVX-512 integer kernels")
    monkeypatch.delenv("BYOC_HETERO_WQ_ACT", raising=False)
    codes = quantize_matrix(np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32), 8, 32, False,
                            "float16")
    x = np.random.default_rng(4).standard_normal((1, 64)).astype(np.float32)
    steps = {}
    for value in (None, "off"):
        if value is None:
            monkeypatch.delenv("BYOC_HETERO_WQ_BLOCK32", raising=False)
        else:
            monkeypatch.setenv("BYOC_HETERO_WQ_BLOCK32", value)
        _, plan = _run(x, codes)
        steps[value] = next(line for line in plan if line.startswith("run") and "dense_wq" in line)
    assert ", blocks of 32 kernel" in steps[None] and ", blocks of 32 kernel" not in steps["off"], steps


def test_block32_switch_rejects_unknown(monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_WQ_BLOCK32", "yes")
    codes = quantize_matrix(np.ones((16, 64), np.float32), 8, 32, False, "float16")
    with pytest.raises(ValueError, match="BYOC_HETERO_WQ_BLOCK32 must be on or off, got 'yes'"):
        _run(np.ones((1, 64), np.float32), codes)


def test_inline_layouts_of_one_codes_tensor_with_two_scale_tensors(monkeypatch):
    """Two dense_wq nodes reading the same codes under different scales: each packs its own inline tiles (the
    planner's key for a transform names the tensors it also reads), each output numpy's for its own scales."""
    if not _has_avx512bw():
        pytest.skip("the inline layout is made for the AVX-512 integer kernels")
    monkeypatch.setenv("BYOC_HETERO_WQ_BLOCK32", "on")
    rng = np.random.default_rng(5)
    n, k = 37, 96
    first = quantize_matrix(rng.standard_normal((n, k)).astype(np.float32), 8, 32, False, "float16")
    second = type(first)(8, 32, first.codes, (first.scales * np.float16(3)).astype(np.float16), None)
    tensors = [{"shape": [1, k], "dtype": "float32"}, {"shape": [n, k], "dtype": "int8"},
               {"shape": [n, 3], "dtype": "float16"}, {"shape": [n, 3], "dtype": "float16"},
               {"shape": [1, n], "dtype": "float32"}, {"shape": [1, n], "dtype": "float32"}]
    attrs = {"bits": 8, "block": 32, "has_zero_point": 0, "has_offset": 0, "has_bias": 0}
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "two", "tensors": tensors, "inputs": [0],
           "outputs": [4, 5], "constants": [{"tensor": t, "name": f"two_c{t}"} for t in (1, 2, 3)],
           "nodes": [{"op": "dense_wq", "inputs": [0, 1, 2], "output": 4, "attrs": attrs},
                     {"op": "dense_wq", "inputs": [0, 1, 3], "output": 5, "attrs": attrs}]}
    mod = create(json.dumps(doc))
    consts = [first.codes, first.scales, second.scales]
    assert mod["__init_two"]([tvm.runtime.tensor(np.ascontiguousarray(c)) for c in consts]) == 0
    inits = [line for line in mod["get_plan"]() if "float16 scales inline" in line]
    assert len(inits) == 2, inits
    x = (rng.standard_normal((1, k)) * 2).astype(np.float32)
    outs = [tvm.runtime.tensor(np.full((1, n), np.nan, np.float32)) for _ in range(2)]
    mod["two"](tvm.runtime.tensor(x), *outs)
    for out, codes in zip(outs, (first, second)):
        _close(out.numpy(), _reference(_quantize_rows(x), codes))
