"""Weight-only int8 / int4 dense layers (issue 37): the runtime's dense_wq kernels against numpy's
exact dequantize-then-matmul, on this machine's ISA and capped to AVX2 / generic C++
(BYOC_HETERO_WQ_ISA, read when a module is created): the float-activation kernels
(BYOC_HETERO_WQ_ACT=f32) exactly, the int8-activation ones (the default where the block is a multiple
of 32) against numpy on the same activation quantization; the region format's checks; bh.quantize's
weight-only form on llvm and on the oneDNN backend."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tvm

import byoc_hetero as bh
from byoc_hetero.errors import QuantizationError
from byoc_hetero.quant.weight_only import WeightCodes, dequantize_codes, quantize_matrix

create = tvm.get_global_func("byoc_hetero.runtime.create")


def _region(x_shape, codes: WeightCodes, bias: np.ndarray | None, symbol: str = "wq", **attrs) -> tuple[str, list]:
    """A one-node dense_wq document and its constants (codes, scales[, zero points][, offsets][, bias])."""
    n, _ = codes.shape
    consts = [codes.codes, codes.scales] + [a for a in (codes.zero_points, codes.offsets, bias) if a is not None]
    tensors = [{"shape": list(x_shape), "dtype": "float32"}]
    tensors += [{"shape": list(c.shape), "dtype": str(c.dtype)} for c in consts]
    tensors.append({"shape": list(x_shape[:-1]) + [n], "dtype": "float32"})
    node_attrs = {"bits": codes.bits, "block": codes.block, "has_zero_point": int(codes.zero_points is not None),
                  "has_offset": int(codes.offsets is not None), "has_bias": int(bias is not None)} | attrs
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": symbol, "tensors": tensors, "inputs": [0],
           "outputs": [len(tensors) - 1],
           "constants": [{"tensor": i + 1, "name": f"{symbol}_c{i}"} for i in range(len(consts))],
           "nodes": [{"op": "dense_wq", "inputs": list(range(len(tensors) - 1)), "output": len(tensors) - 1,
                      "attrs": node_attrs}]}
    return json.dumps(doc), consts


def _run(x: np.ndarray, codes: WeightCodes, bias=None) -> tuple[np.ndarray, list[str]]:
    text, consts = _region(x.shape, codes, bias)
    mod = create(text)
    assert mod["__init_wq"]([tvm.runtime.tensor(np.ascontiguousarray(c)) for c in consts]) == 0
    out = tvm.runtime.tensor(np.full(x.shape[:-1] + (codes.shape[0],), np.nan, np.float32))
    mod["wq"](tvm.runtime.tensor(x), out)
    return out.numpy(), list(mod["get_plan"]())


def _reference(x: np.ndarray, codes: WeightCodes, bias=None) -> np.ndarray:
    w = dequantize_codes(codes).astype(np.float64)  # exact dequantize, then the product in float64
    y = x.astype(np.float64) @ w.T
    return (y + bias if bias is not None else y).astype(np.float32)


def _close(got, want):
    scale = max(float(np.abs(want).max()), 1e-6)
    assert np.abs(got - want).max() <= 2e-5 * scale * max(1, np.sqrt(want.shape[-1] / 64)), \
        f"max error {np.abs(got - want).max()} at scale {scale}"


CASES = [  # (bits, block or None: per channel, zero points, scale dtype)
    (8, None, False, "float32"), (8, None, False, "float16"), (8, 32, True, "float32"), (8, 64, False, "float16"),
    (8, 32, False, "float16"),  # GGUF's Q8_0: int8 codes, an f16 scale per block of 32
    (8, 128, False, "float16"),  # from_hf(weights="int8", group_size=128)
    (4, 32, False, "float32"), (4, 32, True, "float16"), (4, 64, True, "float32"), (4, 64, False, "float16"),
    (4, 128, False, "float32"), (4, 128, True, "float16"), (4, None, True, "float32"),
]


@pytest.fixture(autouse=True)
def float_activations(monkeypatch):
    """The exact float path unless a test asks for the int8 one (tests of the integer kernels)."""
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "f32")


@pytest.mark.parametrize("isa", ["auto", "avx2", "generic"])
@pytest.mark.parametrize("bits,block,zp,scale_dtype", CASES)
def test_kernel_matches_numpy(monkeypatch, isa, bits, block, zp, scale_dtype):
    monkeypatch.setenv("BYOC_HETERO_WQ_ISA", isa)
    rng = np.random.default_rng(bits * 1000 + (block or 0) + zp)
    k = 384 if block != 128 else 256
    n = 37  # odd: a partial last tile of 16 columns
    codes = quantize_matrix(rng.standard_normal((n, k)).astype(np.float32), bits, block, zp, scale_dtype)
    bias = rng.standard_normal(n).astype(np.float32)
    for m in (1, 3, 6):  # odd rows: a partial group of 4
        x = rng.standard_normal((m, k)).astype(np.float32)
        got, plan = _run(x, codes, bias if m != 3 else None)
        _close(got, _reference(x, codes, bias if m != 3 else None))
    step = next(line for line in plan if line.startswith("run") and "dense_wq" in line)
    if isa != "auto":
        assert f"({isa})" in step, step


def _quantize_rows(x: np.ndarray) -> np.ndarray:
    """numpy's form of the kernels' activation quantization (dense_wq.h): per row and block of 32,
    scale = max|x| / 127, code = round-half-even(x * (127 / max|x|)), all in float32; returns
    code * scale in float64 (what the integer dot products stand for)."""
    xb = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv)
    assert np.abs(q).max() <= 127
    return (q.astype(np.float64) * (amax / np.float32(127)).astype(np.float32)).reshape(x.shape)


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())


def _has_vnni() -> bool:
    return "avx512_vnni" in _cpu_flags()


def _int_kernel(isa: str, vnni: str) -> str:
    """The integer kernel's name in the plan label for BYOC_HETERO_WQ_ISA=isa, BYOC_HETERO_WQ_VNNI=vnni on this CPU."""
    flags, allowed = _cpu_flags(), vnni != "off"
    if isa == "auto" and "avx512bw" in flags:
        return "avx512 vnni" if allowed and "avx512_vnni" in flags else "avx512bw"
    if isa in ("auto", "avx2"):
        return "avx2 vnni" if allowed and "avx_vnni" in flags else "avx2"
    return "generic"


INT_CASES = [c for c in CASES if (c[1] or 384) % 32 == 0] + [(8, None, True, "float32")]


@pytest.mark.parametrize("isa,vnni", [("auto", "auto"), ("auto", "off"), ("avx2", "auto"), ("avx2", "off"),
                                      ("generic", "auto")])
@pytest.mark.parametrize("bits,block,zp,scale_dtype", INT_CASES)
def test_int8_activation_kernel_matches_numpy(monkeypatch, isa, vnni, bits, block, zp, scale_dtype):
    """The integer kernels (AVX-512: VNNI where the CPU has it, else BW; AVX2: AVX-VNNI where the CPU has it,
    else VPMADDUBSW; C++; BYOC_HETERO_WQ_VNNI=off: the VPMADDUBSW ones on a VNNI CPU too) against numpy's
    dequantize-then-matmul on the same quantized activations; and the activation quantization's own
    error against the exact product, within what llama.cpp's Q8_0 activations give (the same scheme)."""
    monkeypatch.setenv("BYOC_HETERO_WQ_ISA", isa)
    monkeypatch.setenv("BYOC_HETERO_WQ_VNNI", vnni)
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "int8")
    rng = np.random.default_rng(bits * 1000 + (block or 0) + zp + 7)
    k = 384 if block != 128 else 256
    n = 37
    codes = quantize_matrix(rng.standard_normal((n, k)).astype(np.float32), bits, block, zp, scale_dtype)
    bias = rng.standard_normal(n).astype(np.float32)
    for m in (1, 2, 3, 4, 5, 9):  # every row count of a micro-kernel call, and partial groups of 4
        x = rng.standard_normal((m, k)).astype(np.float32) * 3
        b = bias if m % 2 else None
        got, plan = _run(x, codes, b)
        _close(got, _reference(_quantize_rows(x), codes, b))
        exact = _reference(x, codes, b)
        assert np.abs(got - exact).max() <= 0.03 * np.abs(exact).max()
    step = next(line for line in plan if line.startswith("run") and "dense_wq" in line)
    assert f"int8 activations ({_int_kernel(isa, vnni)})" in step, step


@pytest.mark.parametrize("isa", ["auto", "avx2"])
@pytest.mark.parametrize("group", [32, 64, 128, None])
@pytest.mark.parametrize("scale_dtype", ["float16", "float32"])
def test_grouped_int8_odd_shapes_match_numpy(monkeypatch, isa, group, scale_dtype):
    """int8 codes with a scale per group of K (``from_hf(weights="int8", group_size=...)``; GGUF's Q8_0 at 32)
    and per output channel, the switches' defaults on this ISA and capped to AVX2: K an odd number of groups
    (3; per channel 5 activation blocks), 37 columns (a partial tile), 1, 3 and 17 rows (a decode step, a
    partial group of 4, a prefill's many rows: the integer panels on AVX-512), against numpy's
    dequantize-then-matmul on the same quantized activations."""
    monkeypatch.delenv("BYOC_HETERO_WQ_ACT")
    monkeypatch.setenv("BYOC_HETERO_WQ_ISA", isa)
    rng = np.random.default_rng(3 * (group or 5) + len(scale_dtype))
    n, k = 37, 3 * group if group else 160
    codes = quantize_matrix(rng.standard_normal((n, k)).astype(np.float32), 8, group, False, scale_dtype)
    assert codes.codes.dtype == np.int8 and codes.scales.shape == (n, 3 if group else 1)
    bias = rng.standard_normal(n).astype(np.float32)
    for m in (1, 3, 17):
        x = (rng.standard_normal((m, k)) * 2).astype(np.float32)
        b = bias if m % 2 else None
        got, plan = _run(x, codes, b)
        _close(got, _reference(_quantize_rows(x), codes, b))
        step = next(line for line in plan if line.startswith("run") and "dense_wq" in line)
        assert "8-bit weights" in step and "int8 activations" in step, step
        assert (", float16 scales" in step) == (scale_dtype == "float16"), step


def _offset_codes(bits: int, n: int, k: int, rng, scale_dtype: str = "float32") -> WeightCodes:
    """Unsigned codes from 0 (4-bit, or 8-bit holding 0..31) with a scale and an offset per block of 32:
    llama.cpp's Q4_1 / Q5_1 / K-quants' ``w = s * q + o``."""
    q = rng.integers(0, 16 if bits == 4 else 32, size=(n, k), dtype=np.uint8)
    if bits == 4:
        q = q[:, 0::2] | (q[:, 1::2] << 4)
    scales = (rng.random((n, k // 32)) * 0.1 + 0.01).astype(scale_dtype)
    offsets = (-rng.random((n, k // 32)) * (16 if bits == 4 else 32) * 0.06).astype(np.float32)
    return WeightCodes(bits, 32, np.ascontiguousarray(q), scales, offsets=offsets)


@pytest.mark.parametrize("act", ["f32", "int8"])
@pytest.mark.parametrize("isa", ["auto", "avx2", "generic"])
@pytest.mark.parametrize("bits,scale_dtype", [(4, "float32"), (4, "float16"), (8, "float32")])
def test_kernel_offsets_match_numpy(monkeypatch, act, isa, bits, scale_dtype):
    """A float offset per block (has_offset; the codes' zero 0): numpy's dequantize-then-matmul on the exact
    activations (float path) or on the same quantized ones (int8 path: o times the block's quantized sum)."""
    monkeypatch.setenv("BYOC_HETERO_WQ_ISA", isa)
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", act)
    rng = np.random.default_rng(bits * 10 + (scale_dtype == "float16"))
    n, k = 37, 512
    codes = _offset_codes(bits, n, k, rng, scale_dtype)
    codes.check()
    assert codes.implicit_zero == 0
    bias = rng.standard_normal(n).astype(np.float32)
    for m in (1, 2, 3, 5):
        x = rng.standard_normal((m, k)).astype(np.float32) + 0.5  # a nonzero mean: the offsets' term counts
        b = bias if m % 2 else None
        got, plan = _run(x, codes, b)
        _close(got, _reference(x if act == "f32" else _quantize_rows(x), codes, b))
        without = WeightCodes(codes.bits, 32, codes.codes, codes.scales, offsets=np.zeros_like(codes.offsets))
        assert np.abs(got - _reference(x, without, b)).max() > 0.1 * np.abs(got).max()  # the offsets were used
    step = next(line for line in plan if line.startswith("run") and "dense_wq" in line)
    assert ("int8 activations" in step) == (act == "int8"), step


def _has_avx512bw() -> bool:
    """Whether dense_wq's integer kernels can be AVX-512 ones here: the CPU has AVX-512BW and BYOC_HETERO_WQ_ISA
    (when the whole run is capped, as an ISA sweep does) leaves them."""
    return "avx512bw" in _cpu_flags() and os.environ.get("BYOC_HETERO_WQ_ISA", "auto") in ("", "auto", "avx512")


PANEL_CASES = INT_CASES + [(4, 32, "offsets", "float16"), (8, 32, "offsets", "float32")]


@pytest.mark.parametrize("bits,block,zp,scale_dtype", PANEL_CASES)
def test_panel_form_for_many_rows_matches_numpy(monkeypatch, bits, block, zp, scale_dtype):
    """16 rows or more with BYOC_HETERO_WQ_PANELS=1 (BYOC_HETERO_WQ_ACT=auto) on an AVX-512 integer kernel: the panel form (codes
    dequantized a panel of 32 columns at a time, float32 products 12 rows at a time) against numpy's exact
    dequantize-then-matmul on the float activations: 16, 29 and 40 rows (tiles of 12 and every tail), 37
    columns (a second panel of one partial tile), per channel and per block, zero points, float16 scales,
    offsets, a bias."""
    if not _has_avx512bw():
        pytest.skip("the panel form runs where the int8-activation kernel is an AVX-512 one")
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "auto")
    monkeypatch.setenv("BYOC_HETERO_WQ_PANELS", "1")  # opt-in (dense_wq.h: not faster on the loaded machine)
    rng = np.random.default_rng(bits * 100 + (block or 0) + 11)
    n, k = 37, 384 if block != 128 else 256
    if zp == "offsets":
        codes = _offset_codes(bits, n, 512, rng, scale_dtype)
        k = 512
    else:
        codes = quantize_matrix(rng.standard_normal((n, k)).astype(np.float32), bits, block, zp, scale_dtype)
    bias = rng.standard_normal(n).astype(np.float32)
    for m in (16, 29, 40):
        x = rng.standard_normal((m, k)).astype(np.float32) + (0.5 if zp == "offsets" else 0.0)
        b = bias if m % 2 else None
        got, plan = _run(x, codes, b)
        _close(got, _reference(x, codes, b))
        step = next(line for line in plan if line.startswith("run") and "dense_wq" in line)
        assert f"panels dequantized, float32 activations ({m} rows, avx512)" in step, step
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "int8")  # asked for: the integer kernels at any rows
    got, plan = _run(x, codes, b)
    _close(got, _reference(_quantize_rows(x), codes, b))
    assert any("int8 activations" in line for line in plan if line.startswith("run")), plan


def test_region_rejects_bad_offsets():
    rng = np.random.default_rng(3)
    codes = _offset_codes(4, 16, 64, rng)
    codes.offsets[2, 1] = np.nan
    text, consts = _region((1, 64), codes, None)
    with pytest.raises(Exception, match=r"offsets\[2, 1\] is nan: expected a finite offset"):
        create(text)["__init_wq"]([tvm.runtime.tensor(c) for c in consts])
    with pytest.raises(ValueError, match="attrs.has_offset': expected zero points or offsets, not both"):
        create(_region((1, 64), codes, None, has_zero_point=1)[0])
    codes.offsets = codes.offsets.astype(np.float16)
    with pytest.raises(ValueError, match="offsets must be float32, got float16"):
        create(_region((1, 64), codes, None)[0])
    with pytest.raises(QuantizationError, match="offsets must be float32 of shape \\[16, 2\\]"):
        codes.check()


def test_offset_codes_relax_form_llvm_and_onednn():
    """apply_weight_codes with offsets (the form GGUF's Q4_1 / K-quants become): llvm runs the Relax
    dequantize (+ offsets), the oneDNN backend one dense_wq node with has_offset; both equal numpy."""
    from byoc_hetero.quant.weight_only import apply_weight_codes

    rng = np.random.default_rng(5)
    mod, params = bh.models.mlp(batch=3, features=256, hidden=(96,), num_classes=21)
    given = {"fc1_weight": _offset_codes(4, 96, 256, rng), "fc2_weight": _offset_codes(8, 21, 96, rng)}
    floats = dict(params)
    for name, c in given.items():
        transposed = params[name].shape != c.shape
        floats[name] = dequantize_codes(c).T.copy() if transposed else dequantize_codes(c)
    qmod, qparams = apply_weight_codes(mod, floats, given)
    assert "fc1_weight.offsets" in qparams and "fc1_weight" not in qparams
    x = rng.standard_normal((3, 256)).astype(np.float32)
    want = np.maximum(x.astype(np.float64) @ dequantize_codes(given["fc1_weight"]).T + params["fc1_bias"], 0)
    want = (want @ dequantize_codes(given["fc2_weight"]).T + params["fc2_bias"]).astype(np.float32)
    _close(_vm(bh.bind_params(qmod, qparams))["main"](tvm.runtime.tensor(x)).numpy(), want)
    part = bh.partition(qmod, qparams)
    nodes = [n for n in _region_nodes(part) if n["op"] == "dense_wq"]
    assert len(nodes) == 2 and all(n["attrs"]["has_offset"] == 1 for n in nodes), nodes
    _close(_vm(part)["main"](tvm.runtime.tensor(x)).numpy(), want)


def test_vnni_kernels_with_emulated_vpdpbusd(tmp_path):
    """The integer kernels the CPU may not select, each against the portable one (itself checked against numpy
    above): tests/native/wq_vnni_emulated.cc compiles cpp/kernels/dense_wq_int8.cc with vpdpbusd emulated exactly
    and compares the AVX-512 VNNI and AVX-VNNI kernels (which a CPU without VNNI cannot run; a VNNI CPU runs the real
    instructions in the tests above), the AVX-512BW ones (which a VNNI CPU never selects by default: its users are the
    Skylake-SP class) and the AVX2 ones, 48 cases each. It also checks the activations' quantization in AVX-512 and
    AVX2 registers against the portable loops, bit for bit."""
    import os
    import shutil
    import subprocess

    import tvm_ffi

    if shutil.which("g++") is None or "avx512bw" not in open("/proc/cpuinfo").read():
        pytest.skip("needs g++ and an AVX-512BW CPU")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ffi = os.path.dirname(tvm_ffi.__file__)
    exe = str(tmp_path / "wq_vnni_emulated")
    subprocess.run(["g++", "-O1", "-std=c++17", "-I", os.path.join(root, "cpp"), "-isystem", os.path.join(ffi, "include"),
                    os.path.join(root, "tests", "native", "wq_vnni_emulated.cc"), "-o", exe, "-Wl,--no-as-needed",
                    os.path.join(ffi, "lib", "libtvm_ffi.so"), "-Wl,-rpath," + os.path.join(ffi, "lib")],
                   check=True, capture_output=True)
    run = subprocess.run([exe], capture_output=True, text=True)
    assert run.returncode == 0 and "0 of 192 cases differ" in run.stdout, run.stdout + run.stderr
    assert "quantized rows (AVX-512, AVX2) vs the portable loops: 0 of 8 differ" in run.stdout, run.stdout


def test_int8_activations_extremes_and_nan(monkeypatch):
    """Codes at both ends (8-bit: -127 / 127 weights and 0 / 255 unsigned codes; 4-bit 0 / 15), activations
    of one large value per block (codes of +-127), an all-zero row; a NaN input gives NaN, not a number."""
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "int8")
    k, n = 64, 20
    x = np.zeros((3, k), np.float32)
    x[0] = np.where(np.arange(k) % 2, 1.0, -1.0) * 1e3
    x[1, ::32] = -5.0
    x[1, 1::32] = 5.0
    for bits, zp in ((8, False), (8, True), (4, False), (4, True)):
        w = np.where((np.arange(n * k).reshape(n, k) // 3) % 2, 1.0, -1.0).astype(np.float32)
        codes = quantize_matrix(w, bits, 32, zp)
        got, _ = _run(x, codes)
        _close(got, _reference(_quantize_rows(x), codes))
        assert np.all(got[2] == 0)
    xn = x.copy()
    xn[1, 40] = np.nan
    got, _ = _run(xn, codes)
    assert np.isnan(got[1]).all() and np.isfinite(got[0]).all()


@pytest.mark.parametrize("isa", ["auto", "avx2", "generic"])
def test_int8_activations_of_tiny_blocks(monkeypatch, isa):
    """A block whose largest |x| is so small that 127 / max |x| overflows float32 (subnormal activations) quantizes
    to codes of 0: its outputs are the other blocks' products, not the garbage an infinite inverse made."""
    monkeypatch.setenv("BYOC_HETERO_WQ_ISA", isa)
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "int8")
    rng = np.random.default_rng(12)
    codes = quantize_matrix(rng.standard_normal((20, 64)).astype(np.float32), 8, 32)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    x[0, :32] = np.float32(1e-39) * (np.arange(32) % 5 - 2)
    got, _ = _run(x, codes)
    want = x.copy()
    want[0, :32] = 0
    _close(got, _reference(_quantize_rows(want), codes))


def test_int8_activations_fall_back_to_float_for_a_block_of_16(monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "int8")
    rng = np.random.default_rng(11)
    codes = quantize_matrix(rng.standard_normal((16, 64)).astype(np.float32), 4, 16)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    got, plan = _run(x, codes)
    _close(got, _reference(x, codes))
    assert not any("int8 activations" in line for line in plan), plan


def test_act_switch_rejects_unknown(monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "fp8")
    codes = quantize_matrix(np.ones((16, 32), np.float32), 8)
    with pytest.raises(ValueError, match="BYOC_HETERO_WQ_ACT must be auto, int8 or f32, got 'fp8'"):
        _run(np.ones((1, 32), np.float32), codes)


@pytest.mark.parametrize("name,value,message", [
    ("BYOC_HETERO_WQ_VNNI", "on", "BYOC_HETERO_WQ_VNNI must be auto, off or 0, got 'on'"),
    ("BYOC_HETERO_WQ_PREFETCH", "100", "BYOC_HETERO_WQ_PREFETCH must be a multiple of 64 from 0 to 65536"),
    ("BYOC_HETERO_WQ_PREFETCH", "-64", "BYOC_HETERO_WQ_PREFETCH must be a multiple of 64"),
    ("BYOC_HETERO_HUGE_PAGES", "yes", "BYOC_HETERO_HUGE_PAGES must be 0 or 1, got 'yes'"),
])
def test_kernel_switches_reject_unknown(monkeypatch, name, value, message):
    """A bad value of a switch read when the module is made is a ValueError naming it (the huge-page one is read
    for buffers of their own mapping, 1 MiB or more: a 1024 x 1024 int8 weight's tiles)."""
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "int8")
    monkeypatch.setenv(name, value)
    codes = quantize_matrix(np.ones((1024, 1024), np.float32), 8)
    with pytest.raises(ValueError, match=message):
        _run(np.ones((1, 1024), np.float32), codes)


@pytest.mark.parametrize("isa", ["auto", "avx2"])
@pytest.mark.parametrize("bits,block,zp,scale_dtype", [(8, None, False, "float32"), (8, 32, False, "float16"),
                                                       (4, 32, True, "float16"), (4, 64, False, "float32")])
def test_int8_activation_prefetch_changes_no_value(monkeypatch, isa, bits, block, zp, scale_dtype):
    """BYOC_HETERO_WQ_PREFETCH (software prefetch of the codes ahead, into the next tile at a tile's end; 13 tiles
    split by 2 threads): the same outputs, bit for bit, as without, at 1 row and 3, with a bias; the label says so."""
    monkeypatch.setenv("BYOC_HETERO_WQ_ISA", isa)
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "int8")
    rng = np.random.default_rng(bits + 50 + zp)
    k, n = 512, 200
    codes = quantize_matrix(rng.standard_normal((n, k)).astype(np.float32), bits, block, zp, scale_dtype)
    bias = rng.standard_normal(n).astype(np.float32)
    for m in (1, 3):
        x = rng.standard_normal((m, k)).astype(np.float32)
        monkeypatch.delenv("BYOC_HETERO_WQ_PREFETCH", raising=False)
        plain, _ = _run(x, codes, bias)
        monkeypatch.setenv("BYOC_HETERO_WQ_PREFETCH", "1024")
        got, plan = _run(x, codes, bias)
        assert np.array_equal(got, plain)
        _close(got, _reference(_quantize_rows(x), codes, bias))
        assert any("prefetch 1024 bytes" in line for line in plan), plan


def _thp_mode() -> str:
    """The kernel's transparent huge page mode line (skips the test where there are none or they are off)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
    except OSError:
        pytest.skip("no transparent huge pages here")
    if "[never]" in mode:
        pytest.skip("transparent huge pages are off on this machine")
    return mode


def _anon_huge_kib() -> int:
    """This process's transparent huge pages, KiB (/proc/self/smaps_rollup)."""
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))


def test_huge_pages_for_large_weights(monkeypatch):
    """BYOC_HETERO_HUGE_PAGES=1: a prepared weight of 2 MiB or more is one mapping advised MADV_HUGEPAGE (where the
    kernel's transparent huge pages are in `madvise` or `always` mode), so the process holds huge pages once the
    weights are written: 8 MiB of int8 tiles give at least 2 MiB of them; the outputs equal those without."""
    _thp_mode()
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "int8")
    rng = np.random.default_rng(5)
    codes = quantize_matrix(rng.standard_normal((2048, 4096)).astype(np.float32), 8)
    x = rng.standard_normal((1, 4096)).astype(np.float32)
    plain, _ = _run(x, codes)
    text, consts = _region(x.shape, codes, None)
    tensors = [tvm.runtime.tensor(np.ascontiguousarray(c)) for c in consts]
    out = tvm.runtime.tensor(np.zeros((1, 2048), np.float32))
    monkeypatch.setenv("BYOC_HETERO_HUGE_PAGES", "1")
    before = _anon_huge_kib()
    mod = create(text)
    assert mod["__init_wq"](tensors) == 0
    mod["wq"](tvm.runtime.tensor(x), out)
    assert _anon_huge_kib() - before >= 2048, (before, _anon_huge_kib())
    assert np.array_equal(out.numpy(), plain)



@pytest.mark.parametrize("value", ["", "0"])
def test_huge_pages_are_the_default_and_0_turns_them_off(monkeypatch, value):
    """BYOC_HETERO_HUGE_PAGES unset (the default since session 14's quiet A/B) gives a large prepared weight huge
    pages (the same 8 MiB of int8 tiles as above: at least 2 MiB of them); 0 gives none where the kernel's
    transparent huge pages are in `madvise` mode; the outputs are the same either way."""
    mode = _thp_mode()
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", "int8")
    rng = np.random.default_rng(5)
    codes = quantize_matrix(rng.standard_normal((2048, 4096)).astype(np.float32), 8)
    x = rng.standard_normal((1, 4096)).astype(np.float32)
    monkeypatch.setenv("BYOC_HETERO_HUGE_PAGES", "0")
    plain, _ = _run(x, codes)
    text, consts = _region(x.shape, codes, None)
    tensors = [tvm.runtime.tensor(np.ascontiguousarray(c)) for c in consts]
    out = tvm.runtime.tensor(np.zeros((1, 2048), np.float32))
    if value:
        monkeypatch.setenv("BYOC_HETERO_HUGE_PAGES", value)
    else:
        monkeypatch.delenv("BYOC_HETERO_HUGE_PAGES")
    before = _anon_huge_kib()
    mod = create(text)
    assert mod["__init_wq"](tensors) == 0
    mod["wq"](tvm.runtime.tensor(x), out)
    grew = _anon_huge_kib() - before
    if not value:
        assert grew >= 2048, grew
    elif "[madvise]" in mode:  # under "always" the kernel may give huge pages to any large mapping
        assert grew < 2048, grew
    assert np.array_equal(out.numpy(), plain)


@pytest.mark.parametrize("isa", ["auto", "avx2"])
def test_kernel_odd_k_per_channel_and_3d_data(monkeypatch, isa):
    monkeypatch.setenv("BYOC_HETERO_WQ_ISA", isa)
    rng = np.random.default_rng(3)
    codes = quantize_matrix(rng.standard_normal((21, 75)).astype(np.float32), 8)  # K odd, one block of 75
    x = rng.standard_normal((2, 5, 75)).astype(np.float32)
    got, _ = _run(x, codes)
    _close(got, _reference(x, codes))


def test_kernel_64_rows_many_tiles():
    rng = np.random.default_rng(4)
    codes = quantize_matrix(rng.standard_normal((200, 256)).astype(np.float32), 4, 64, True)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    got, _ = _run(x, codes)
    _close(got, _reference(x, codes))


def test_isa_switch_rejects_unknown(monkeypatch):
    monkeypatch.setenv("BYOC_HETERO_WQ_ISA", "sse9")
    codes = quantize_matrix(np.ones((16, 32), np.float32), 8)
    with pytest.raises(ValueError, match="BYOC_HETERO_WQ_ISA must be auto, avx512, avx2 or generic"):
        _run(np.ones((1, 32), np.float32), codes)


# -- bad input: errors naming the field, never a crash ---------------------------------------------


def _codes(bits=4, block=32, zp=True, n=16, k=64):
    return quantize_matrix(np.random.default_rng(0).standard_normal((n, k)).astype(np.float32), bits, block, zp)


@pytest.mark.parametrize("change,message", [
    (dict(block=48), "attrs.block': expected K = 64 or a power of two >= 16 dividing K, got 48"),
    (dict(block=128), "attrs.block': expected K = 64 or a power of two >= 16"),
    (dict(bits=3), "attrs.bits': expected 4 or 8, got 3"),
    (dict(bits=8), "weight \\(tensor 1\\) must have shape \\[16, 64\\], got \\[16, 32\\]"),
])
def test_region_rejects_bad_attrs(change, message):
    text, _ = _region((1, 64), _codes(), None, **change)
    with pytest.raises(ValueError, match=message):
        create(text)


def test_region_rejects_scales_of_the_wrong_shape():
    codes = _codes()
    codes.scales = codes.scales[:, :1].copy()
    text, _ = _region((1, 64), codes, None)
    with pytest.raises(ValueError, match="scales \\(tensor 2\\) must have shape \\[16, 2\\], got \\[16, 1\\]"):
        create(text)


@pytest.mark.parametrize("bad", [np.nan, np.inf, 0.0])
def test_region_rejects_bad_scale_values_at_init(bad):
    codes = _codes()
    codes.scales[3, 1] = bad
    text, consts = _region((1, 64), codes, None)
    mod = create(text)
    with pytest.raises(Exception, match=r"scales\[3, 1\] is .*expected a finite, nonzero scale"):
        mod["__init_wq"]([tvm.runtime.tensor(c) for c in consts])


def test_region_rejects_zero_point_beyond_the_bits():
    codes = _codes()
    codes.zero_points[0, 0] = 16
    text, consts = _region((1, 64), codes, None)
    with pytest.raises(Exception, match=r"zero_points\[0, 0\] is 16"):
        create(text)["__init_wq"]([tvm.runtime.tensor(c) for c in consts])


def test_float16_only_reaches_dense_wq():
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "h",
           "tensors": [{"shape": [4], "dtype": "float32"}, {"shape": [4], "dtype": "float16"},
                       {"shape": [4], "dtype": "float32"}],
           "inputs": [0], "outputs": [2], "constants": [{"tensor": 1, "name": "h_c"}],
           "nodes": [{"op": "binary", "inputs": [0, 1], "output": 2, "attrs": {"algorithm": "add"}}]}
    with pytest.raises(ValueError, match="float16, which op 'binary' does not read"):
        create(json.dumps(doc))


@pytest.mark.parametrize("codes_change,message", [
    (lambda c: setattr(c, "block", 48), "block 48 must be K = 64"),
    (lambda c: setattr(c, "scales", c.scales[:, :1]), "scales must be float32 or float16 of shape \\[16, 2\\]"),
    (lambda c: c.scales.__setitem__((0, 0), np.nan), "scales\\[0, 0\\] is nan"),
])
def test_python_codes_check(codes_change, message):
    codes = _codes()
    codes_change(codes)
    with pytest.raises(QuantizationError, match=message):
        codes.check()


def test_quantize_matrix_rejects_a_group_not_dividing_k():
    with pytest.raises(QuantizationError, match="group size 32 does not divide K = 48"):
        quantize_matrix(np.ones((4, 48), np.float32), 4, 32)


# -- bh.quantize(weights=...): the Relax form on llvm (the reference) and on the oneDNN backend ------


def _vm(mod):
    from tvm import relax

    from byoc_hetero.timing import build

    return relax.VirtualMachine(build(mod), tvm.cpu())


def _region_nodes(partitioned) -> list[dict]:
    return [n for m in partitioned.attrs["external_mods"] for n in json.loads(str(m["get_graph_json"]()))["nodes"]]


def _mlp_reference(x, q, params) -> np.ndarray:
    """numpy: each layer x @ dequant(codes)^T + bias, relu between (bh.models.mlp's layers)."""
    y = x.astype(np.float64)
    for i in (1, 2):
        name = f"fc{i}_weight"
        codes = WeightCodes(8 if q.weights == "int8" else 4, 0, q.params[f"{name}.codes"],
                            q.params[f"{name}.scales"], q.params.get(f"{name}.zero_points"))
        codes.block = codes.shape[1] if q.group_size is None else q.group_size
        y = y @ dequantize_codes(codes).T.astype(np.float64) + params[f"fc{i}_bias"]
        y = np.maximum(y, 0) if i == 1 else y
    return y.astype(np.float32)


@pytest.mark.parametrize("weights,group,zp,scale_dtype", [("int8", None, False, "float32"), ("int4", 32, True, "float16"),
                                                          ("int4", 64, False, "float32"), ("int8", 128, True, "float16")])
def test_quantize_weights_llvm_and_onednn(weights, group, zp, scale_dtype):
    mod, params = bh.models.mlp(batch=3, features=256, hidden=(128,), num_classes=21)
    q = bh.quantize(mod, params, weights=weights, group_size=group, zero_points=zp, scale_dtype=scale_dtype,
                    verbose=False)
    assert [lyr.shape for lyr in q.layers] == [(256, 128), (128, 21)]
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    want = _mlp_reference(x, q, params)
    llvm = _vm(bh.bind_params(q.mod, q.params))["main"](tvm.runtime.tensor(x)).numpy()
    _close(llvm, want)
    part = bh.partition(q.mod, q.params)
    ops = [n["op"] for n in _region_nodes(part)]
    assert ops.count("dense_wq") == len(q.layers) and "dense" not in ops and "matmul" not in ops, ops
    onednn = _vm(part)["main"](tvm.runtime.tensor(x)).numpy()
    _close(onednn, want)
    # the reported error: the layers' outputs on random inputs, against the float weights
    bound = 0.02 if weights == "int8" else 0.3
    assert 0 < q.error < bound, q.summary()


def test_quantize_weights_error_shrinks_with_bits_and_groups():
    mod, params = bh.models.mlp(batch=1, features=256, hidden=(128,), num_classes=16)
    errors = [bh.quantize(mod, params, weights=w, group_size=g, verbose=False).error
              for w, g in (("int4", 128), ("int4", 32), ("int8", None))]
    assert errors[0] > errors[1] > errors[2] > 0, errors


def test_quantize_weights_keep_float_and_bad_options():
    mod, params = bh.models.mlp(batch=1, features=64, hidden=(32,), num_classes=16)
    q = bh.quantize(mod, params, weights="int8", keep_float=["fc2_weight"], verbose=False)
    assert [lyr.weight for lyr in q.layers] == ["fc1_weight"] and q.kept_float == ["fc2_weight"]
    assert "fc2_weight" in q.params and "fc1_weight" not in q.params
    part = bh.partition(q.mod, q.params)
    ops = [n["op"] for n in _region_nodes(part)]
    assert ops.count("dense_wq") == 1 and ops.count("dense") == 1, ops
    with pytest.raises(QuantizationError, match="weights must be 'int8' or 'int4'"):
        bh.quantize(mod, params, weights="int2")
    with pytest.raises(QuantizationError, match="group_size must be one of 32, 64, 128"):
        bh.quantize(mod, params, weights="int4", group_size=48)
    with pytest.raises(QuantizationError, match="fc1_weight: group size 128 does not divide K = 64"):
        bh.quantize(mod, params, weights="int4", group_size=128)


# -- ONNX Runtime's MatMulNBits (bh.from_onnx, passes/matmul_nbits.py) --------------------------------


def _float_matmul_model(k: int, n: int, seed: int):
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, n])],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model, x):
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("bits,block,symmetric", [(4, 32, True), (4, 16, False), (4, 128, False), (8, 32, False),
                                                  (8, 64, True)])
def test_matmul_nbits_matches_onnxruntime(bits, block, symmetric):
    pytest.importorskip("onnxruntime")
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    k, n = 128, 40
    quantizer = MatMulNBitsQuantizer(_float_matmul_model(k, n, bits + block), algo_config=DefaultWeightOnlyQuantConfig(
        block_size=block, is_symmetric=symmetric, bits=bits))
    quantizer.process()
    model = quantizer.model.model
    assert [nd.op_type for nd in model.graph.node] == ["MatMulNBits"]
    x = np.random.default_rng(7).standard_normal((2, 3, k)).astype(np.float32)
    want = _ort(model, x)
    mod, params = bh.from_onnx(model)
    llvm = _vm(bh.bind_params(mod, params))["main"](tvm.runtime.tensor(x)).numpy()
    _close(llvm, want)
    part = bh.partition(mod, params)
    assert [nd["op"] for nd in _region_nodes(part)] == ["dense_wq"]
    _close(_vm(part)["main"](tvm.runtime.tensor(x)).numpy(), want)


def _nbits_model(scales: np.ndarray, g_idx: bool = False):
    from onnx import TensorProto, helper, numpy_helper

    k, n, block = 64, 16, 32
    codes = np.random.default_rng(0).integers(0, 256, (n, k // block, block // 2), dtype=np.uint8)
    inputs = ["x", "B", "scales"] + (["", "g_idx"] if g_idx else [])
    inits = [numpy_helper.from_array(codes, "B"), numpy_helper.from_array(scales, "scales")]
    if g_idx:
        inits.append(numpy_helper.from_array(np.arange(k, dtype=np.int32) // block, "g_idx"))
    node = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=k, N=n, bits=4, block_size=block)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("scales,message", [
    (np.ones(31, np.float32), "scales must have N \\* K / block_size = 32 elements, got 31"),
    (np.r_[np.ones(31), np.nan].astype(np.float32), "scales\\[15, 1\\] is nan: expected a finite, nonzero scale"),
    (np.r_[np.zeros(1), np.ones(31)].astype(np.float16), "scales\\[0, 0\\] is 0.0: expected a finite, nonzero"),
])
def test_matmul_nbits_bad_scales(scales, message):
    with pytest.raises(QuantizationError, match="MatMulNBits y: " + message):
        bh.from_onnx(_nbits_model(scales))


def test_matmul_nbits_with_g_idx_is_left_to_the_importer():
    with pytest.raises(bh.errors.FrontendError, match="MatMulNBits"):
        bh.from_onnx(_nbits_model(np.ones(32, np.float32), g_idx=True))


def test_quantize_weights_transposed_weight_and_symbolic_rows():
    """matmul(x, permute_dims(W)) as decoders write it, on [1, S, K] data with S symbolic: the float
    weight and its permute go, one dense_wq region serves every S."""
    from tvm import relax, tirx

    seq = tirx.Var("S", "int64")
    x = relax.Var("x", relax.TensorType((1, seq, 64), "float32"))
    w = relax.Var("w", relax.TensorType((32, 64), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(w, [1, 0]))
            out = bb.emit_output(bb.emit(relax.op.matmul(x, wt)))
        bb.emit_func_output(out)
    weight = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    q = bh.quantize(bb.get(), {"w": weight}, weights="int4", group_size=64, verbose=False)
    assert [p.name for p in q.mod["main"].params] == ["x", "w.codes", "w.scales"] and "w" not in q.params
    part = bh.partition(q.mod, q.params)
    assert [n["op"] for n in _region_nodes(part)] == ["dense_wq"]
    vm = _vm(part)
    codes = WeightCodes(4, 64, q.params["w.codes"], q.params["w.scales"])
    for s in (1, 7):
        xv = np.random.default_rng(s).standard_normal((1, s, 64)).astype(np.float32)
        _close(vm["main"](tvm.runtime.tensor(xv)).numpy(), _reference(xv, codes))


def test_without_the_dense_wq_rules_llvm_dequantizes(restore_rules):
    """An op the backend does not take runs the Relax form on llvm: the same values."""
    for rule in ("dense_wq8", "dense_wq8_bias", "dense_wq4", "dense_wq4_bias"):
        bh.unregister_pattern("onednn", rule)
    mod, params = bh.models.mlp(batch=2, features=64, hidden=(32,), num_classes=16)
    q = bh.quantize(mod, params, weights="int4", group_size=32, zero_points=True, verbose=False)
    part = bh.partition(q.mod, q.params)
    assert "dense_wq" not in [n["op"] for n in _region_nodes(part)]
    x = np.random.default_rng(5).standard_normal((2, 64)).astype(np.float32)
    _close(_vm(part)["main"](tvm.runtime.tensor(x)).numpy(), _mlp_reference(x, q, params))


@pytest.mark.parametrize("bits,block,zp", [(8, None, False), (4, 32, False), (8, 32, True), (4, 64, True)])
def test_rows_quantized_a_chunk_at_a_time_give_the_same_codes(monkeypatch, bits, block, zp):
    """quantize_matrix works a chunk of rows at a time (weight_only.CHUNK_BYTES: a large LM head's float64
    temporaries never exist whole, issue 36): chunks of 1 and 7 rows give the bytes one chunk gives, for a
    weight given transposed (a view, as the rewriter passes [K, N].T), and dequantize to numpy's
    (code - zero) * scale (nibbles unpacked here); a NaN in the last chunk is still refused."""
    from byoc_hetero.quant import weight_only

    rng = np.random.default_rng(36)
    w_kn = np.ascontiguousarray(rng.standard_normal((128, 50)).astype(np.float32))
    w_kn[:, 3] = 0  # an all-zero output column: scale 1
    whole = quantize_matrix(w_kn.T, bits, block, zp)
    c = whole.codes.astype(np.int32)
    q = np.stack([c & 15, c >> 4], axis=2).reshape(50, 128) if bits == 4 else c
    group = block or 128
    zero = whole.zero_points.astype(np.int32) if zp else np.full((50, 128 // group), whole.implicit_zero)
    want = ((q - np.repeat(zero, group, axis=1)) * np.repeat(whole.scales.astype(np.float32), group, axis=1))
    for rows in (1, 7):
        monkeypatch.setattr(weight_only, "CHUNK_BYTES", rows * 8 * 128)
        got = quantize_matrix(w_kn.T, bits, block, zp)
        assert got.codes.tobytes() == whole.codes.tobytes() and got.scales.tobytes() == whole.scales.tobytes()
        assert (got.zero_points is None) == (not zp)
        assert not zp or got.zero_points.tobytes() == whole.zero_points.tobytes()
        assert dequantize_codes(got).tobytes() == want.astype(np.float32).tobytes()
    with pytest.raises(QuantizationError, match="non-finite"):
        bad = w_kn.T.copy()
        bad[40, 5] = np.nan  # in the last chunk of 7 rows
        quantize_matrix(bad, bits, block, zp)


# -- the residual sum (a decoder's residual stream: y = h + x W, one step, not a dense and an add) -------


def _residual_region(m: int, codes: WeightCodes, bias: np.ndarray | None, in_place: bool) -> tuple[str, list]:
    """A dense_wq whose residual is a region input (copied into the output: ``in_place`` False) or the
    region's own ``r + r`` that dies at the dense (summed in its buffer), r added once more after it (out:
    x W + b + 3 r); inputs x [m, K], r [m, N]."""
    n, k = codes.shape
    consts = [codes.codes, codes.scales] + [a for a in (codes.zero_points, bias) if a is not None]
    tensors = [{"shape": [m, k]}, {"shape": [m, n]}] + [{"shape": list(c.shape), "dtype": str(c.dtype)}
                                                         for c in consts]
    nodes, residual = [], 1
    if in_place:
        tensors.append({"shape": [m, n]})
        residual = len(tensors) - 1
        nodes.append({"op": "binary", "inputs": [1, 1], "output": residual,
                      "attrs": {"algorithm": "add", "activation": "none"}})
    tensors.append({"shape": [m, n]})
    attrs = {"bits": codes.bits, "block": codes.block, "has_zero_point": int(codes.zero_points is not None),
             "has_bias": int(bias is not None), "residual": 1}
    nodes.append({"op": "dense_wq", "inputs": [0] + list(range(2, 2 + len(consts))) + [residual],
                  "output": len(tensors) - 1, "attrs": attrs})
    if in_place:  # + r once more: the dense's output is no region output (that one the caller's buffer holds)
        tensors.append({"shape": [m, n]})
        nodes.append({"op": "binary", "inputs": [len(tensors) - 2, 1], "output": len(tensors) - 1,
                      "attrs": {"algorithm": "add", "activation": "none"}})
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "wqr", "tensors": tensors, "inputs": [0, 1],
           "outputs": [len(tensors) - 1],
           "constants": [{"tensor": i + 2, "name": f"wqr_c{i}"} for i in range(len(consts))], "nodes": nodes}
    return json.dumps(doc), consts


@pytest.mark.parametrize("act", ["f32", "int8"])
@pytest.mark.parametrize("isa", ["auto", "avx2", "generic"])
@pytest.mark.parametrize("bits,block,zp,scale_dtype", [(8, None, False, "float32"), (8, 32, False, "float16"),
                                                       (4, 32, False, "float16"), (4, 64, True, "float32")])
def test_kernel_residual_matches_numpy(monkeypatch, act, isa, bits, block, zp, scale_dtype):
    """dense_wq with ``residual``: x W + b + r against numpy, the residual summed in its own dying buffer
    (in place: no copy step in the plan) and copied into the output (a region input), odd N and rows, every
    ISA and both activation paths."""
    monkeypatch.setenv("BYOC_HETERO_WQ_ISA", isa)
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", act)
    rng = np.random.default_rng(bits * 100 + (block or 0) + zp)
    k, n = 192, 37
    codes = quantize_matrix(rng.standard_normal((n, k)).astype(np.float32), bits, block, zp, scale_dtype)
    bias = rng.standard_normal(n).astype(np.float32)
    for m, in_place in ((1, True), (3, False), (5, True)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        r = rng.standard_normal((m, n)).astype(np.float32)
        b = bias if m != 3 else None
        text, consts = _residual_region(m, codes, b, in_place)
        mod = create(text)
        assert mod["__init_wqr"]([tvm.runtime.tensor(np.ascontiguousarray(c)) for c in consts]) == 0
        out = tvm.runtime.tensor(np.full((m, n), np.nan, np.float32))
        mod["wqr"](tvm.runtime.tensor(x), tvm.runtime.tensor(r), out)
        want = _reference(x if act == "f32" else _quantize_rows(x), codes, b) + (3 if in_place else 1) * r
        _close(out.numpy(), want)
        plan = "\n".join(mod["get_plan"]())
        assert ("residual tensor" in plan and "copied into the output" in plan) == (not in_place), plan


def _gate_region(m: int, codes: WeightCodes, bias: np.ndarray | None, residual: bool) -> tuple[str, list]:
    """dense_wq(x) * g (+ r): inputs x [m, K], g [m, N] (and r [m, N]), attrs has_gate (and residual)."""
    n, k = codes.shape
    consts = [codes.codes, codes.scales] + [a for a in (codes.zero_points, bias) if a is not None]
    extra = 2 if residual else 1
    tensors = [{"shape": [m, k]}] + [{"shape": [m, n]}] * extra
    tensors += [{"shape": list(c.shape), "dtype": str(c.dtype)} for c in consts] + [{"shape": [m, n]}]
    attrs = {"bits": codes.bits, "block": codes.block, "has_zero_point": int(codes.zero_points is not None),
             "has_bias": int(bias is not None), "has_gate": 1, "residual": int(residual)}
    first = 1 + extra
    node = {"op": "dense_wq", "inputs": [0] + list(range(first, first + len(consts))) + list(range(1, first)),
            "output": len(tensors) - 1, "attrs": attrs}
    doc = {"format": "byoc_hetero.region", "version": 1, "symbol": "wqg", "tensors": tensors,
           "inputs": list(range(first)), "outputs": [len(tensors) - 1],
           "constants": [{"tensor": first + i, "name": f"wqg_c{i}"} for i in range(len(consts))], "nodes": [node]}
    return json.dumps(doc), consts


@pytest.mark.parametrize("act", ["f32", "int8"])
@pytest.mark.parametrize("isa", ["auto", "avx2", "generic"])
@pytest.mark.parametrize("bits,block,zp,scale_dtype", [(8, None, False, "float32"), (4, 32, True, "float16")])
def test_kernel_gate_matches_numpy(monkeypatch, act, isa, bits, block, zp, scale_dtype):
    """dense_wq with ``has_gate``: (x W + b) * g (+ r) against numpy, odd N and rows, every ISA and both paths."""
    monkeypatch.setenv("BYOC_HETERO_WQ_ISA", isa)
    monkeypatch.setenv("BYOC_HETERO_WQ_ACT", act)
    rng = np.random.default_rng(bits * 10 + zp)
    k, n = 160, 37
    codes = quantize_matrix(rng.standard_normal((n, k)).astype(np.float32), bits, block, zp, scale_dtype)
    bias = rng.standard_normal(n).astype(np.float32)
    for m, residual in ((1, False), (3, True), (5, False)):
        x = rng.standard_normal((m, k)).astype(np.float32)
        g, r = rng.standard_normal((2, m, n)).astype(np.float32)
        b = bias if m != 3 else None
        text, consts = _gate_region(m, codes, b, residual)
        mod = create(text)
        assert mod["__init_wqg"]([tvm.runtime.tensor(np.ascontiguousarray(c)) for c in consts]) == 0
        out = tvm.runtime.tensor(np.full((m, n), np.nan, np.float32))
        mod["wqg"](tvm.runtime.tensor(x), tvm.runtime.tensor(g), *([tvm.runtime.tensor(r)] if residual else []), out)
        want = _reference(x if act == "f32" else _quantize_rows(x), codes, b) * g + (r if residual else 0)
        _close(out.numpy(), want)


@pytest.mark.parametrize("name", ["residual", "gate"])
def test_region_rejects_a_residual_or_gate_of_another_shape(name):
    codes = quantize_matrix(np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32), 8, None)
    text, _ = _residual_region(2, codes, None, False) if name == "residual" else _gate_region(2, codes, None, False)
    doc = json.loads(text)
    doc["tensors"][1]["shape"] = [2, 15]
    with pytest.raises(ValueError, match=f"{name} \\(tensor 1\\) must have shape \\[2, 16\\], got \\[2, 15\\]"):
        create(json.dumps(doc))


def _residual_block(m: int, k: int, seed: int):
    """Relax: h = x * 0.5; y = h + h W1^T (h dies at the add: its buffer takes the sum); out = y W2^T + x (x
    an input: copied into the output); both operand orders of the add."""
    from tvm import relax

    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    w1, w2 = (relax.Var(f"w{i}", relax.TensorType((k, k), "float32")) for i in (1, 2))
    with bb.function("main"):
        with bb.dataflow():
            h = bb.emit(relax.op.multiply(x, relax.const(np.float32(0.5))))
            y = bb.emit(relax.op.add(h, bb.emit(relax.op.matmul(h, bb.emit(relax.op.permute_dims(w1, [1, 0]))))))
            z = bb.emit(relax.op.matmul(y, bb.emit(relax.op.permute_dims(w2, [1, 0]))))
            out = bb.emit_output(relax.op.add(z, x))
        bb.emit_func_output(out, params=[x, w1, w2])
    params = {f"w{i}": (rng.standard_normal((k, k)) / np.sqrt(k)).astype(np.float32) for i in (1, 2)}
    return bb.get(), params


@pytest.mark.parametrize("weights,group,zp", [("int8", None, False), ("int4", 32, True), ("int4", 64, False)])
def test_residual_adds_fold_into_dense_wq(weights, group, zp):
    """fold_residual_adds makes a dense_wq's following add of a same-shape tensor its residual: no add
    node is left, both dense_wq nodes sum their residual, and the region's result is llvm's."""
    mod, params = _residual_block(3, 128, seed=4)
    q = bh.quantize(mod, params, weights=weights, group_size=group, zero_points=zp, verbose=False)
    part = bh.partition(q.mod, q.params)
    nodes = _region_nodes(part)
    assert [n["attrs"].get("residual") for n in nodes if n["op"] == "dense_wq"] == [1, 1], nodes
    assert not [n for n in nodes if n["op"] == "binary" and n["attrs"]["algorithm"] == "add"], nodes
    x = np.random.default_rng(6).standard_normal((3, 128)).astype(np.float32)
    want = _vm(bh.bind_params(q.mod, q.params))["main"](tvm.runtime.tensor(x)).numpy()
    _close(_vm(part)["main"](tvm.runtime.tensor(x)).numpy(), want)


def _glu_block(m: int, k: int, hidden: int, seed: int):
    """Relax: a SwiGLU MLP with its residual, as bh.llm writes it: x + down(silu(x Wg^T) * (x Wu^T))."""
    from tvm import relax

    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, m, k), "float32"))
    shapes = {"wg": (hidden, k), "wu": (hidden, k), "wd": (k, hidden)}
    w = {name: relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in shapes.items()}

    def linear(v, name):
        return bb.emit(relax.op.matmul(v, bb.emit(relax.op.permute_dims(w[name], [1, 0]))))

    with bb.function("main"):
        with bb.dataflow():
            h = bb.emit(relax.op.multiply(x, relax.const(np.float32(0.5))))
            gate = bb.emit(relax.op.nn.silu(linear(h, "wg")))
            product = bb.emit(relax.op.multiply(gate, linear(h, "wu")))
            out = bb.emit_output(relax.op.add(h, linear(product, "wd")))
        bb.emit_func_output(out, params=[x, *w.values()])
    params = {name: (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32) for name, shape in shapes.items()}
    return bb.get(), params


@pytest.mark.parametrize("weights,group", [("int8", None), ("int4", 32)])
def test_glu_product_folds_into_the_up_dense_wq(weights, group):
    """fold_gate_products: silu(x Wg) * (x Wu) is up's dense_wq multiplying by the activated gate (has_gate), the
    down projection sums the residual: no binary node left, only the silu's eltwise; llvm's result."""
    mod, params = _glu_block(3, 64, 96, seed=7)
    q = bh.quantize(mod, params, weights=weights, group_size=group, verbose=False)
    part = bh.partition(q.mod, q.params)
    nodes = _region_nodes(part)
    assert [(n["attrs"].get("has_gate", 0), n["attrs"].get("residual", 0)) for n in nodes if n["op"] == "dense_wq"] \
        == [(0, 0), (1, 0), (0, 1)], nodes
    assert sorted(n["op"] for n in nodes if n["op"] in ("binary", "eltwise")) == ["binary", "eltwise"], nodes  # * 0.5
    x = np.random.default_rng(8).standard_normal((1, 3, 64)).astype(np.float32)
    want = _vm(bh.bind_params(q.mod, q.params))["main"](tvm.runtime.tensor(x)).numpy()
    _close(_vm(part)["main"](tvm.runtime.tensor(x)).numpy(), want)
