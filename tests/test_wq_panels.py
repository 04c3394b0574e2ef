"""dense_wq's forms for many rows (a prefill's; dense_wq.h ``PanelForm``, ``BYOC_HETERO_WQ_PANELS``): the integer
panel GEMM (``int``: int8 activations, 32 columns x 6 rows a register tile) against numpy's dequantize-then-matmul
on the same quantized activations and bit for bit against the integer tile kernels it replaces, with VNNI and with
the AVX-512BW form (``BYOC_HETERO_WQ_VNNI=0``); both panel forms with a gate and a residual (the epilogue a
decoder's up and down projections carry); the switches' bad values. The tile kernels' own tests are
tests/test_weight_only.py's."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from test_weight_only import (PANEL_CASES, _close, _gate_region, _has_avx512bw, _has_vnni, _offset_codes,
                              _quantize_rows, _reference, _run, create)

from byoc_hetero.quant.weight_only import quantize_matrix

pytestmark = pytest.mark.skipif(not _has_avx512bw(), reason="the panel forms run on the AVX-512 integer kernels")

ROWS = (16, 19, 20, 21, 23, 24)  # every tail of the 6-row register tile (16 = 2 x 6 + 4, 19: + 1, ..., 24: none)


@pytest.fixture(autouse=True)
def int8_auto(monkeypatch):
    """The defaults of the activation and ISA switches (the panel forms run only under ``auto``)."""
    for name in ("BYOC_HETERO_WQ_ACT", "BYOC_HETERO_WQ_ISA", "BYOC_HETERO_WQ_PANELS", "BYOC_HETERO_WQ_VNNI"):
        monkeypatch.delenv(name, raising=False)


def _codes(rng, bits, block, zp, scale_dtype, n: int = 37):
    """A random weight's codes (``zp == "offsets"``: llama.cpp's offset form, K 512) and its K."""
    if zp == "offsets":
        return _offset_codes(bits, n, 512, rng, scale_dtype), 512
    k = 384 if block != 128 else 256
    return quantize_matrix(rng.standard_normal((n, k)).astype(np.float32), bits, block, zp, scale_dtype), k


@pytest.mark.parametrize("vnni", ["auto", "0"])
@pytest.mark.parametrize("bits,block,zp,scale_dtype", PANEL_CASES)
def test_integer_panels_match_numpy_and_the_tile_kernels(monkeypatch, vnni, bits, block, zp, scale_dtype):
    """Per channel and per block (32 / 64 / 128), zero points, float16 scales, offsets, a bias on odd rows; 37
    columns (a panel of two tiles and a last panel of one partial tile); every row tail: numpy on the same
    quantized activations, and the very bytes of the tile kernels (the same float operations in the same order)
    where the weights have blocks; per channel the scales apply once after the sum over K (another rounding
    order: within numpy's tolerance of the tile kernels)."""
    if vnni == "auto" and not _has_vnni():
        pytest.skip("no VNNI on this CPU (the BW form is the 0 case)")
    monkeypatch.setenv("BYOC_HETERO_WQ_VNNI", vnni)
    rng = np.random.default_rng(bits * 100 + (block or 0) + 13)
    codes, k = _codes(rng, bits, block, zp, scale_dtype)
    bias = rng.standard_normal(codes.shape[0]).astype(np.float32)
    want_dot = "avx512 vnni" if vnni == "auto" else "avx512bw"
    for m in ROWS:
        x = (rng.standard_normal((m, k)) * 2 + (0.5 if zp == "offsets" else 0.0)).astype(np.float32)
        b = bias if m % 2 else None
        monkeypatch.setenv("BYOC_HETERO_WQ_PANELS", "int")
        got, plan = _run(x, codes, b)
        step = next(line for line in plan if line.startswith("run") and "dense_wq" in line)
        folded = block is None and zp != "offsets"
        label = f"int8 activations ({want_dot}), integer panels of 32 columns x 6 rows ({m} rows"
        assert label + (", scales after the sum)" if folded else ")") in step, step
        _close(got, _reference(_quantize_rows(x), codes, b))
        monkeypatch.setenv("BYOC_HETERO_WQ_PANELS", "0")
        tiles, plan = _run(x, codes, b)
        assert not any("panels" in line for line in plan), plan
        if folded:
            _close(got, tiles)
        else:
            assert got.tobytes() == tiles.tobytes(), f"{m} rows: max difference {np.abs(got - tiles).max()}"


def test_integer_panels_many_panels_and_3d_data(monkeypatch):
    """200 columns (13 tiles: 7 panels, the threads splitting them) and data of rank 3 (2 x 20 rows)."""
    monkeypatch.setenv("BYOC_HETERO_WQ_PANELS", "int")
    rng = np.random.default_rng(5)
    codes = quantize_matrix(rng.standard_normal((200, 256)).astype(np.float32), 4, 64, True)
    x = rng.standard_normal((2, 20, 256)).astype(np.float32)
    got, plan = _run(x, codes)
    assert any("integer panels" in line for line in plan), plan
    _close(got, _reference(_quantize_rows(x.reshape(40, 256)), codes).reshape(2, 20, 200))


def test_fewer_rows_keep_the_tile_kernels(monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_WQ_PANELS", "int")
    codes = quantize_matrix(np.random.default_rng(6).standard_normal((16, 64)).astype(np.float32), 8)
    _, plan = _run(np.ones((15, 64), np.float32), codes)
    assert not any("panels" in line for line in plan) and any("int8 activations" in line for line in plan), plan


def test_many_rows_run_the_integer_panels_by_default():
    """With no variable set (the autouse fixture), 16 rows or more run the integer panel GEMM with the epilogue in
    the kernel (int-fused: the default since session 15's quiet A/B; the panels since session 14's), 15 rows the
    tile kernels; both against numpy on the same quantized activations."""
    rng = np.random.default_rng(8)
    codes = quantize_matrix(rng.standard_normal((37, 128)).astype(np.float32), 4, 32)
    for m, panels in ((15, False), (16, True)):
        x = rng.standard_normal((m, 128)).astype(np.float32)
        got, plan = _run(x, codes)
        step = next(line for line in plan if line.startswith("run") and "dense_wq" in line)
        assert ("integer panels" in step) == panels, step
        assert ("epilogue in the kernel" in step) == panels, step
        _close(got, _reference(_quantize_rows(x), codes))


def _run_gate(codes, bias, x, g, r):
    """(x W + bias) * g (+ r) through a fresh gate region (_gate_region): its output and its plan's text."""
    m, n = g.shape
    text, consts = _gate_region(m, codes, bias, r is not None)
    mod = create(text)
    assert mod["__init_wqg"]([tvm.runtime.tensor(np.ascontiguousarray(c)) for c in consts]) == 0
    out = tvm.runtime.tensor(np.full((m, n), np.nan, np.float32))
    mod["wqg"](tvm.runtime.tensor(x), tvm.runtime.tensor(g), *([tvm.runtime.tensor(r)] if r is not None else []), out)
    return out.numpy(), "\n".join(mod["get_plan"]())


@pytest.mark.parametrize("form", ["1", "int"])
@pytest.mark.parametrize("bits,block,zp,scale_dtype", [(8, None, False, "float32"), (4, 32, True, "float16")])
def test_panels_with_gate_and_residual(monkeypatch, form, bits, block, zp, scale_dtype):
    """(x W + b) * g (+ r) at a prefill's rows in both panel forms: the float panels against numpy's exact
    product, the integer ones against numpy on the quantized activations (a decoder's gated up projection and
    its residual stream run these epilogues at every layer)."""
    monkeypatch.setenv("BYOC_HETERO_WQ_PANELS", form)
    rng = np.random.default_rng(bits * 10 + zp + 3)
    k, n = 160, 50
    codes = quantize_matrix(rng.standard_normal((n, k)).astype(np.float32), bits, block, zp, scale_dtype)
    bias = rng.standard_normal(n).astype(np.float32)
    for m, residual in ((17, False), (29, True)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        g, r = rng.standard_normal((2, m, n)).astype(np.float32)
        b = bias if residual else None
        out, plan = _run_gate(codes, b, x, g, r if residual else None)
        assert ("integer panels" if form == "int" else "panels dequantized") in plan, plan
        want = _reference(x if form == "1" else _quantize_rows(x), codes, b) * g + (r if residual else 0)
        _close(out, want)


# K of 20 to 100 activation blocks (per channel and per block, zero points, offsets, float16 scales)
LOOP_CASES = [
    (8, None, False, "float32", 1600), (8, 64, True, "float16", 1600), (4, 32, False, "float16", 3200),
    (4, 128, True, "float32", 3200), (4, 32, "offsets", "float32", 3200), (8, 32, False, "float16", 640),
]


def _form(monkeypatch, form: str, x, codes, b):
    """The dense's output and its step's label with BYOC_HETERO_WQ_PANELS = form."""
    monkeypatch.setenv("BYOC_HETERO_WQ_PANELS", form)
    got, plan = _run(x, codes, b)
    return got, next(line for line in plan if line.startswith("run") and "dense_wq" in line)


@pytest.mark.parametrize("vnni", ["auto", "0"])
@pytest.mark.parametrize("bits,block,zp,scale_dtype,k", LOOP_CASES)
def test_fused_integer_panels_match_the_default_loop_and_numpy(monkeypatch, vnni, bits, block, zp, scale_dtype, k):
    """The opt-in integer panels' loop (``int-fused``: the epilogue written by the kernel) against the default one
    (``int``: the epilogue in scalar C++ after each call) to the byte, and
    against numpy on the same quantized activations: per channel and per block, zero points, offsets, float16
    scales, a bias, 37 columns (a last panel of one partial tile), row tails of the 6-row tile; VNNI and the
    AVX-512BW form."""
    if vnni == "auto" and not _has_vnni():
        pytest.skip("no VNNI on this CPU (the BW form is the 0 case)")
    monkeypatch.setenv("BYOC_HETERO_WQ_VNNI", vnni)
    rng = np.random.default_rng(bits * 1000 + k + (block or 0))
    if zp == "offsets":
        codes = _offset_codes(bits, 37, k, rng, scale_dtype)
    else:
        codes = quantize_matrix(rng.standard_normal((37, k)).astype(np.float32), bits, block, zp, scale_dtype)
    bias = rng.standard_normal(37).astype(np.float32)
    for m in (16, 23):
        x = (rng.standard_normal((m, k)) + (0.5 if zp == "offsets" else 0.0)).astype(np.float32)
        b = bias if m % 2 else None
        got, step = _form(monkeypatch, "int-fused", x, codes, b)
        assert "integer panels" in step and "epilogue in the kernel" in step, step
        old, old_step = _form(monkeypatch, "int", x, codes, b)
        assert "integer panels" in old_step and "epilogue" not in old_step, old_step
        assert got.tobytes() == old.tobytes(), f"{m} rows: max difference {np.abs(got - old).max()}"
        _close(got, _reference(_quantize_rows(x), codes, b))


@pytest.mark.parametrize("bits,block,zp,scale_dtype,k", [
    (8, None, False, "float32", 1600), (4, 32, True, "float16", 3200), (4, 64, False, "float32", 192)])
def test_the_kernels_epilogue_matches_the_scalar_one(monkeypatch, bits, block, zp, scale_dtype, k):
    """The gate, the residual and the bias written by the panel kernel itself (AVX-512, the last tile masked)
    (``int-fused``) against the default loop's scalar epilogue to the byte ((x W + b) * g + r rounded twice, never
    fused into one FMA), and against numpy; 50 columns (a last panel of 18: a second tile of 2 columns)."""
    rng = np.random.default_rng(bits * 7 + k)
    n = 50
    codes = quantize_matrix(rng.standard_normal((n, k)).astype(np.float32), bits, block, zp, scale_dtype)
    bias = rng.standard_normal(n).astype(np.float32)
    for m, residual in ((17, False), (29, True)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        g, r = rng.standard_normal((2, m, n)).astype(np.float32)
        b = bias if residual else None
        outs = {}
        for form in ("int", "int-fused"):
            monkeypatch.setenv("BYOC_HETERO_WQ_PANELS", form)
            outs[form], plan = _run_gate(codes, b, x, g, r if residual else None)
            assert "integer panels" in plan
        assert outs["int-fused"].tobytes() == outs["int"].tobytes(), np.abs(outs["int"] - outs["int-fused"]).max()
        _close(outs["int-fused"], _reference(_quantize_rows(x), codes, b) * g + (r if residual else 0))


@pytest.mark.parametrize("name,value,message", [
    ("BYOC_HETERO_WQ_PANELS", "yes", "BYOC_HETERO_WQ_PANELS must be 0, 1 \\(or float\\), int or int-fused, got 'yes'"),
    ("BYOC_HETERO_WQ_VNNI", "on", "BYOC_HETERO_WQ_VNNI must be auto, off or 0, got 'on'")])
def test_switches_reject_unknown_values(monkeypatch, name, value, message):
    """A bad value fails at any rows (here 2), naming the variable and the values it takes."""
    monkeypatch.setenv(name, value)
    codes = quantize_matrix(np.ones((16, 32), np.float32), 8)
    with pytest.raises(ValueError, match=message):
        _run(np.ones((2, 32), np.float32), codes)


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_generators_prefill_with_integer_panels(monkeypatch, weights):
    """A whole prefill of 24 tokens (bh.llm.from_hf, int8 per channel / int4 in blocks of 32: every dense a dense_wq
    with its folded gate, residual and norm weight) with the integer panels and with the tile kernels: the same
    logits, to the byte for int4's blocks, within float rounding for int8's per-channel fold."""
    import byoc_hetero as bh
    from test_generate import VOCAB, _quant_model

    model = _quant_model()
    prompt = np.random.default_rng(37).integers(3, VOCAB, (1, 24)).astype("int64")
    logits, plans = {}, {}
    for form in ("0", "int"):
        monkeypatch.setenv("BYOC_HETERO_WQ_PANELS", form)  # read when the prefill's plan is made (its first call)
        gen = bh.llm.from_hf(model, max_length=32, weights=weights)
        logits[form] = gen.step(prompt, np.array([0]), np.array([24]), gen.new_cache(1))[0]
        plans[form] = "\n".join(line for m in bh.codegen.region_modules(gen._executable) for line in m["get_plan"]())
    assert "integer panels" in plans["int"] and "integer panels" not in plans["0"], plans["int"]
    if weights == "int4":
        assert logits["int"].tobytes() == logits["0"].tobytes()
    else:
        _close(logits["int"], logits["0"])
    assert np.abs(logits["0"]).max() > 0
