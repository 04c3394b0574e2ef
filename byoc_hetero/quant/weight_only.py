"""Weight-only quantization: int8 / int4 weights of dense layers, float32 activations.

:func:`quantize_weights` (what ``bh.quantize(mod, params, weights="int8" | "int4")`` runs) turns
every ``matmul(x, W)`` / ``matmul(x, permute_dims(W))`` whose ``W`` is a 2-D weight (a parameter
with a value, or a constant) into the *weight-only form*: the weight's codes, scales and zero
points as parameters, dequantized in Relax and multiplied::

    c = astype(codes, "float32")                    # [N, K] (8-bit) or [N, K/2] (4-bit, 2 per byte)
    # 4-bit: hi = floor(c * 1/16); lo = c - hi * 16; c = stack([lo, hi], axis=2)  (low nibble first)
    u = reshape(c, [N, K / block, block])
    w = (u - zero) * reshape(scales, [N, K / block, 1])   # zero: a constant, or astype(zero_points)
    # with offsets (llama.cpp's Q4_1 / K-quants; zero 0): w = w + reshape(offsets, [N, K / block, 1])
    y = matmul(x, permute_dims(reshape(w, [N, K])))

That is its meaning and its llvm reference: an op the oneDNN backend does not take runs this
dequantize-then-matmul on llvm. The oneDNN backend matches the whole chain
(:mod:`byoc_hetero.backends.onednn.ops.dense_wq`) and runs one ``dense_wq`` node on the packed
codes (docs/region-format.md). The unpacking is float arithmetic on ``astype(codes)`` rather than
integer shifts so that the partition's folding of small integer computations
(:mod:`byoc_hetero.passes.fold_int_constants`) leaves it for the pattern.

The codes follow ONNX Runtime's ``MatMulNBits``: per output column ``n`` and block ``b`` of
``block`` consecutive ``k``, ``W[k, n] = (code - zero) * scale``; 4-bit codes two per byte, the
even ``k`` in the low nibble.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

import numpy as np
import tvm
from tvm import relax

from .._relax import constant_value
from ..errors import QuantizationError
from ..weight_codes import WeightCodes

__all__ = ["WeightCodes", "WeightOnlyLayer", "WeightOnlyModel", "quantize_weights", "quantize_matrix",
           "group_block", "dequantize_codes", "emit_weight_only_dense", "emit_weight_only_take", "apply_weight_codes"]

WEIGHT_FORMATS = {"int8": 8, "int4": 4}
GROUP_SIZES = (32, 64, 128)

ROUNDINGS = ("nearest", "gguf")
"""How :func:`quantize_matrix` rounds symmetric codes: ``"nearest"``, each code the nearest to the weight
on the scale as stored (the scale rounded to its dtype first); ``"gguf"``, llama.cpp's reference
quantizers' rule (codes from the float32 scale, which is then stored rounded): at blocks of 32 with
float16 scales, a Q8_0 / Q4_0 file's very codes and scales (:func:`_gguf_rows`)."""

DEFAULT_ROUNDING = "gguf"
"""The rounding of :func:`quantize_matrix` / ``bh.quantize`` / ``bh.llm.from_hf`` when none is given (codes
with zero points: always ``"nearest"``). llama.cpp's (session 17, issue 37): ``from_hf(weights="int8" |
"int4", group_size=32)`` then writes the Q8_0 / Q4_0 file's weights of the same model bit for bit, so its
weights' part of the error is llama.cpp's by construction; the logits error of the two rules is the same within
the prompt-to-prompt spread (bench/WEIGHT_ONLY.md), although "nearest"'s weights err 0.11% less (Q8_0)."""

PER_CHANNEL = -1
"""``group_size=PER_CHANNEL`` (-1, as NNCF's and GPTQ's): one scale per output channel, whatever the default."""

DEFAULT_GROUP_SIZE = {"int8": 32, "int4": 32}
"""What ``group_size=None`` means for each format, everywhere (``bh.quantize``, ``bh.llm.from_hf`` /
``from_gguf`` / ``from_onnx`` requantizing, the CLI's ``generate``): the one place int8's default lives.
int8: 32, llama.cpp's Q8_0 blocks (session 17, issue 37): with :data:`DEFAULT_ROUNDING` the Q8_0 file's weights
bit for bit, its logits error 0.993x llama.cpp's; per channel (``PER_CHANNEL``) errs 1.35x and decodes 1.03-1.07x
faster (the 6% fewer bytes; quiet, Zen 5, Qwen2.5-0.5B, bench/GENERATE.md session 17 end)."""


def group_block(weights: str, group_size: int | None) -> int | None:
    """The block along K that ``group_size`` means for ``weights`` (None: :data:`DEFAULT_GROUP_SIZE`'s;
    :data:`PER_CHANNEL`): 32 / 64 / 128, or None for one scale per output channel. QuantizationError
    for any other value or format."""
    if weights not in WEIGHT_FORMATS:
        raise QuantizationError(f"weights must be 'int8' or 'int4', got {weights!r}")
    g = DEFAULT_GROUP_SIZE[weights] if group_size is None else group_size
    if g == PER_CHANNEL and not isinstance(g, bool):
        return None
    if g not in GROUP_SIZES or isinstance(g, bool):
        raise QuantizationError(f"group_size must be one of {', '.join(map(str, GROUP_SIZES))}, {PER_CHANNEL} (per "
                                f"output channel) or None (the format's default), got {group_size!r}")
    return int(g)


def _unpack(codes: WeightCodes) -> np.ndarray:
    """The integer codes [N, K] as int32."""
    c = codes.codes
    if codes.bits == 4:
        return np.stack([c & 0x0F, c >> 4], axis=2).reshape(c.shape[0], -1).astype(np.int32)
    return c.astype(np.int32)


CHUNK_BYTES = 16 << 20
"""Bytes of work per chunk of rows of :func:`quantize_matrix` (float64) and of a layer's error
measurement (float32): a weight is processed a chunk of output rows at a time, so the temporaries of
the largest matrix (a 136 M-weight LM head: 1 GiB per float64 temporary) never exist whole. Rows are
independent: the same codes (issue 36). A chunk's temporaries are a few times its size (the float64
rows, their quotient by the scales, its rounding and clipping): 64 MiB chunks made ``from_hf(weights=
"int8")``'s peak 339 MiB over the model at SmolLM-135M, 2.6x the codes it makes (session 15)."""


def row_chunks(n: int, row_bytes: int) -> list[slice]:
    """Slices of ``n`` rows, each at most :data:`CHUNK_BYTES` of ``row_bytes`` rows (one row at least)."""
    step = max(1, CHUNK_BYTES // max(1, row_bytes))
    return [slice(r, min(n, r + step)) for r in range(0, n, step)]


def dequantize_codes(codes: WeightCodes) -> np.ndarray:
    """The float32 weight [N, K] the codes stand for: ``(code - zero) * scale (+ offset)`` per block
    (the difference is a small integer: one rounding for the product, one for the offset's sum)."""
    n, k = codes.shape
    nb = k // codes.block
    q = _unpack(codes).reshape(n, nb, codes.block)
    z = codes.zero_points.astype(np.int32)[:, :, None] if codes.zero_points is not None else codes.implicit_zero
    s = codes.scales.astype(np.float32)[:, :, None]
    w = (q - z).astype(np.float32) * s
    if codes.offsets is not None:  # one more rounding: llama.cpp's ``d * q - m`` to the bit
        w += codes.offsets[:, :, None]
    return w.reshape(n, k)


def _rows(codes: WeightCodes, rows: slice) -> WeightCodes:
    """The output rows ``rows`` of ``codes`` (every array of the codes sliced along N)."""
    return replace(codes, **{f.name: getattr(codes, f.name)[rows] for f in fields(codes)
                             if isinstance(getattr(codes, f.name), np.ndarray)})


def quantize_matrix(w_nk: np.ndarray, bits: int, block: int | None = None, zero_points: bool = False,
                    scale_dtype: str = "float32", rounding: str | None = None) -> WeightCodes:
    """Quantize a float weight [N, K] (output columns first) per block of ``block`` consecutive k
    (None: one block, per output channel): symmetric (``zero_points`` False; 8-bit: int8 codes in
    [-127, 127]; 4-bit: uint8 codes ``q + 8``, q in [-8, 7], as llama.cpp's Q4_0: the scale is the
    block's value of largest magnitude over -8, sign kept, so that value is code 0 and all 16 codes
    are used) or asymmetric (uint8 codes with a zero point per
    block, covering [min(w, 0), max(w, 0)]). Scales are rounded to ``scale_dtype`` before the codes
    are computed, so the codes fit the scales stored (``rounding="nearest"``), or llama.cpp's way
    (``"gguf"``, symmetric only: :func:`_gguf_rows`); None: :data:`DEFAULT_ROUNDING`. An all-zero
    block gets scale 1. Rows are quantized a chunk at a time (:data:`CHUNK_BYTES`)."""
    rounding = _rounding(rounding, zero_points)
    w = np.asarray(w_nk, dtype=np.float32)
    n, k = w.shape
    block = k if block is None else int(block)
    if k % block:
        raise QuantizationError(f"group size {block} does not divide K = {k}")
    if bits == 4 and k % 2:
        raise QuantizationError(f"int4 weights need an even K, got K = {k}")
    chunks = row_chunks(n, 8 * k)
    if not all(np.isfinite(w[rows]).all() for rows in chunks):
        raise QuantizationError("the weight has non-finite values (NaN or inf): it cannot be quantized")
    rule = _gguf_rows if rounding == "gguf" else _quantize_rows
    parts = [rule(w[rows], rows.start, bits, block, zero_points, scale_dtype) for rows in chunks]
    q, scale, zp = (None if parts[0][i] is None else np.concatenate([p[i] for p in parts]) for i in range(3))
    return WeightCodes(bits, block, np.ascontiguousarray(q), np.ascontiguousarray(scale), zp)


def _quantize_rows(w: np.ndarray, first: int, bits: int, block: int, zero_points: bool, scale_dtype: str
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(codes, scales, zero points or None) of the rows ``w`` of a weight, its row ``first`` the first
    (:func:`quantize_matrix`; ``first`` names a block in messages)."""
    n, k = w.shape
    blocks = w.reshape(n, k // block, block).astype(np.float64)
    top = (1 << bits) - 1
    if zero_points:
        lo, hi = np.minimum(blocks.min(axis=2), 0), np.maximum(blocks.max(axis=2), 0)
        scale = (hi - lo) / top
    elif bits == 4:  # Q4_0's 16 levels: the extreme (sign kept) / -8; the other side reaches 7
        extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[:, :, None], axis=2)[:, :, 0]
        scale = extreme / -8.0
    else:
        scale = np.abs(blocks).max(axis=2) / 127.0
    scale = np.where(scale != 0, scale, 1.0)
    with np.errstate(over="ignore", under="ignore"):
        rounded = scale.astype(scale_dtype)
    if not np.isfinite(rounded).all():
        i = tuple(int(v) for v in np.argwhere(~np.isfinite(rounded))[0])
        raise QuantizationError(f"block {[first + i[0], i[1]]}'s scale {scale[i]:.3g} overflows {scale_dtype}")
    tiny = np.finfo(scale_dtype).smallest_subnormal  # a block of values below float16's range: its codes round to 0
    scale = np.where(rounded != 0, rounded, np.copysign(tiny, scale)).astype(scale_dtype)
    s = scale.astype(np.float64)[:, :, None]
    if zero_points:
        zp = np.clip(np.rint(-lo / scale.astype(np.float64)), 0, top).astype(np.uint8)
        q = np.clip(np.rint(blocks / s) + zp[:, :, None], 0, top).astype(np.uint8)
    else:
        half = 1 << (bits - 1)
        q = np.clip(np.rint(blocks / s), -half if bits == 4 else -half + 1, half - 1)
        q = q.astype(np.int8) if bits == 8 else (q + half).astype(np.uint8)
        zp = None
    q = q.reshape(n, k)
    if bits == 4:
        q = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return q, scale, zp


def _rounding(rounding: str | None, zero_points: bool) -> str:
    """The rounding rule ``rounding`` names (None: :data:`DEFAULT_ROUNDING`, ``"nearest"`` with zero points,
    the only rule for them), checked."""
    if rounding is None:
        return "nearest" if zero_points else DEFAULT_ROUNDING
    if rounding not in ROUNDINGS:
        raise QuantizationError(f"rounding must be one of {', '.join(map(repr, ROUNDINGS))} or None, got {rounding!r}")
    if rounding == "gguf" and zero_points:
        raise QuantizationError("rounding='gguf' is llama.cpp's symmetric Q8_0 / Q4_0 rule: it takes no zero points")
    return rounding


def _gguf_rows(w: np.ndarray, first: int, bits: int, block: int, zero_points: bool, scale_dtype: str
               ) -> tuple[np.ndarray, np.ndarray, None]:
    """(codes, scales, None) of the rows ``w`` as ggml's reference quantizers write them
    (``quantize_row_q8_0_ref`` / ``quantize_row_q4_0_ref``), every step in float32: per block ``d =
    max |w| / 127`` (8-bit) or ``d = extreme / -8`` (4-bit, the first value of largest magnitude, sign
    kept), ``id = 1 / d``; 8-bit codes ``roundf(w * id)`` (ties away from zero), 4-bit codes
    ``min(15, trunc(w * id + 8.5))`` (the sum rounded to float32 first); ``d`` then rounded to
    ``scale_dtype``. The codes come from the float32 ``d``, not the stored one: a code next to a half
    may be one step off the nearest on the stored grid (0.7% of Q8_0's), as in the file. A block whose
    ``d`` rounds to 0 in ``scale_dtype`` (``max |w|`` under ~3.8e-6 in float16) reads 0 in llama.cpp
    whatever its codes: here the zero code on the smallest subnormal scale (dense_wq takes no zero
    scale), so the dequantized weights are the file's everywhere. An all-zero block: scale 1, zero code."""
    n, k = w.shape
    blocks = w.reshape(n, k // block, block)
    if bits == 8:
        d = np.abs(blocks).max(axis=2) / np.float32(127)
    else:
        d = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[:, :, None], axis=2)[:, :, 0] / np.float32(-8)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)[:, :, None]
    x = blocks * inv
    if bits == 8:
        a = np.abs(x)  # roundf, exactly (not floor(a + 0.5), which rounds 0.49999997 up in float32)
        q = np.clip(np.sign(x) * (np.floor(a) + np.floor(2 * (a - np.floor(a)))), -127, 127)
    else:
        q = np.minimum(np.trunc(x + np.float32(8.5)), 15)  # the float32 sum, truncated as (int8_t)
    with np.errstate(over="ignore", under="ignore"):
        stored = d.astype(scale_dtype)
    if not np.isfinite(stored).all():
        i = tuple(int(v) for v in np.argwhere(~np.isfinite(stored))[0])
        raise QuantizationError(f"block {[first + i[0], i[1]]}'s scale {d[i]:.3g} overflows {scale_dtype}")
    gone = (stored == 0) & (d != 0)
    zero = 0 if bits == 8 else 8
    q = np.where(gone[:, :, None], zero, q)
    tiny = np.finfo(scale_dtype).smallest_subnormal
    scale = np.where(d == 0, 1, np.where(gone, tiny, stored)).astype(scale_dtype)
    q = q.reshape(n, k).astype(np.int8 if bits == 8 else np.uint8)
    if bits == 4:
        q = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    return q, scale, None


def _emit_dequantized(bb: relax.BlockBuilder, codes: WeightCodes, parts: Sequence[relax.Expr]) -> relax.Var:
    """Emit the float32 weight [N, K] of ``codes`` (the chain of the module docstring), reading the
    codes, scales [, zero points] [, offsets] from ``parts`` (parameters or constants)."""
    n, k = codes.shape
    nb = k // codes.block
    f32 = relax.const
    c = bb.emit(relax.op.astype(parts[0], "float32"))
    if codes.bits == 4:
        hi = bb.emit(relax.op.floor(bb.emit(relax.op.multiply(c, f32(1 / 16, "float32")))))
        lo = bb.emit(relax.op.subtract(c, bb.emit(relax.op.multiply(hi, f32(16.0, "float32")))))
        c = bb.emit(relax.op.stack(relax.Tuple([lo, hi]), axis=2))
    u = bb.emit(relax.op.reshape(c, (n, nb, codes.block)))
    if codes.zero_points is not None:
        zero = bb.emit(relax.op.astype(bb.emit(relax.op.reshape(parts[2], (n, nb, 1))), "float32"))
    else:
        zero = f32(float(codes.implicit_zero), "float32")
    scale = bb.emit(relax.op.reshape(parts[1], (n, nb, 1)))
    if codes.scales.dtype == np.float16:
        scale = bb.emit(relax.op.astype(scale, "float32"))
    w = bb.emit(relax.op.multiply(bb.emit(relax.op.subtract(u, zero)), scale))
    if codes.offsets is not None:
        w = bb.emit(relax.op.add(w, bb.emit(relax.op.reshape(parts[-1], (n, nb, 1)))))
    return bb.emit(relax.op.reshape(w, (n, k)))


def emit_weight_only_dense(bb: relax.BlockBuilder, data: relax.Expr, codes: WeightCodes,
                           parts: Sequence[relax.Expr]) -> relax.Var:
    """Emit ``data @ dequant(W)^T`` (the chain of the module docstring) for ``codes``' layout,
    reading the codes, scales [, zero points] [, offsets] from ``parts`` (parameters or constants)."""
    w = _emit_dequantized(bb, codes, parts)
    return bb.emit(relax.op.matmul(data, bb.emit(relax.op.permute_dims(w, [1, 0]))))


def emit_weight_only_take(bb: relax.BlockBuilder, indices: relax.Expr, codes: WeightCodes,
                          parts: Sequence[relax.Expr]) -> relax.Var:
    """Emit ``take(dequant(W), indices, axis=0)``: rows of a weight-only table (an embedding lookup
    on codes). Its meaning (and llvm's reference) dequantizes the table; the oneDNN backend runs one
    ``take_wq`` node that dequantizes only the rows looked up (rules ``take_wq8`` / ``take_wq4``)."""
    return bb.emit(relax.op.take(_emit_dequantized(bb, codes, parts), indices, axis=0))


@dataclass
class WeightOnlyLayer:
    """One dense layer as quantized: its weight (parameter name, or ``const_<i>``), shape [K, N]
    as the matmul reads it, and the relative error of its output on random inputs."""

    name: str
    weight: str
    shape: tuple[int, int]
    error: float


@dataclass
class WeightOnlyModel:
    """What :func:`quantize_weights` returns; unpacks as ``mod, params = bh.quantize(...)``.

    ``error`` is the largest relative error (max |quantized − float| / max |float|) of a layer's
    output on random inputs (calibration-free: standard normal rows) against its float weight.
    """

    mod: tvm.IRModule
    params: dict[str, np.ndarray]
    error: float
    layers: list[WeightOnlyLayer]
    kept_float: list[str]
    weights: str
    group_size: int | None
    """The block along K of the scales: 32 / 64 / 128, or None for one scale per output channel."""
    zero_points: bool
    scale_dtype: str
    method: str = field(default="weight-only", repr=False)
    lookups: list[str] = field(default_factory=list)
    """Tables whose ``take`` rows read the codes (:func:`emit_weight_only_take`), by weight name."""
    rounding: str = "nearest"
    """The codes' rounding (:data:`ROUNDINGS`)."""

    def __iter__(self):
        return iter((self.mod, self.params))

    def summary(self) -> str:
        """One line: layers quantized and kept, format, and the measured error."""
        kept = f", {len(self.kept_float)} kept float ({', '.join(self.kept_float)})" if self.kept_float else ""
        if self.lookups:
            kept += f", lookups of {', '.join(self.lookups)} on the codes"
        group = "per output channel" if self.group_size is None else f"groups of {self.group_size} along K"
        scheme = "with zero points" if self.zero_points else "symmetric"
        scheme += ", llama.cpp's rounding" if self.rounding == "gguf" else ""
        return (f"quantized {len(self.layers)} dense weights to {self.weights}{kept} ({group}, {scheme}, "
                f"{self.scale_dtype} scales); largest layer error on random inputs: {self.error:.2e} (max relative)")


def _weight_of(call: relax.Expr, values: Mapping[relax.Expr, np.ndarray], bound: Mapping[relax.Var, relax.Expr]
               ) -> tuple[relax.Expr, bool, relax.Var | None] | None:
    """The 2-D float32 weight a matmul reads, whether through permute_dims, and the variable bound
    to that permute_dims (None when inline), when the weight has a value."""
    if not (isinstance(call, relax.Call) and getattr(call.op, "name", "") == "relax.matmul"):
        return None
    w, transposed, permute = call.args[1], False, None
    if isinstance(w, relax.Var) and w in bound:
        permute, w = w, bound[w]
    if isinstance(w, relax.Call) and getattr(w.op, "name", "") == "relax.permute_dims":
        axes = w.attrs.axes
        if axes is not None and [int(a) for a in axes] != [1, 0]:
            return None
        w, transposed = w.args[0], True
    elif permute is not None:
        return None  # a weight computed in the graph
    value = values.get(w)
    if value is None or value.ndim != 2 or value.dtype != np.float32:
        return None
    return w, transposed, permute


def _table_of(call: relax.Expr, values: Mapping[relax.Expr, np.ndarray]) -> relax.Var | None:
    """The 2-D float32 weight parameter (with a value) whose rows ``call`` takes (``take(W, ids,
    axis=0)``, mode fast: an embedding lookup), or None."""
    if not (isinstance(call, relax.Call) and getattr(call.op, "name", "") == "relax.take"):
        return None
    w, axis = call.args[0], call.attrs.axis
    if not isinstance(w, relax.Var) or axis is None or int(axis) != 0:
        return None
    if str(getattr(call.attrs, "mode", "fast")) != "fast":
        return None
    value = values.get(w)
    return w if value is not None and value.ndim == 2 and value.dtype == np.float32 else None


def _layer_error(w_kn: np.ndarray, codes: WeightCodes, rng: np.random.Generator) -> float:
    """max |x W_q - x W| / max |x W| on 8 random rows x, the codes dequantized a chunk of output
    columns at a time (:data:`CHUNK_BYTES`)."""
    x = rng.standard_normal((8, w_kn.shape[0])).astype(np.float32)
    want = x @ w_kn
    got = np.empty_like(want)
    for cols in row_chunks(w_kn.shape[1], 4 * w_kn.shape[0]):
        got[:, cols] = x @ dequantize_codes(_rows(codes, cols)).T
    return float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))


def _selected(keep_float, index: int, name: str) -> bool:
    if keep_float is None:
        return False
    if callable(keep_float):
        return bool(keep_float(name))
    return index in keep_float or name in keep_float


def quantize_weights(mod: tvm.IRModule, params: Mapping[str, np.ndarray], weights: str = "int8",
                     group_size: int | None = None, zero_points: bool = False, scale_dtype: str = "float32",
                     keep_float: Sequence[int | str] | Callable[[str], bool] | None = None,
                     seed: int = 0, verbose: bool = True,
                     lookups: Sequence[str] | Callable[[str], bool] | None = None,
                     rounding: str | None = None) -> WeightOnlyModel:
    """The weight-only form of ``mod`` (module docstring): every matmul on a 2-D float32 weight.

    ``weights``: ``"int8"`` or ``"int4"``. ``group_size``: 32 / 64 / 128 consecutive k per scale,
    :data:`PER_CHANNEL` (-1) for one scale per output channel, or None for the format's default
    (:data:`DEFAULT_GROUP_SIZE`: 32 for both). ``zero_points``:
    asymmetric codes with a zero point per group. ``scale_dtype``: ``"float32"`` or ``"float16"``.
    ``rounding``: ``"nearest"`` or ``"gguf"`` (llama.cpp's, symmetric only: :data:`ROUNDINGS`), None
    :data:`DEFAULT_ROUNDING`.
    ``keep_float``: matmuls left float, by index (in order of appearance) or weight name, or a
    predicate on the weight name (the LM head of a decoder, say). ``lookups``: 2-D weight parameters,
    by name or a predicate on it, whose ``take(W, ids, axis=0)`` rows (an embedding lookup) read codes
    in this format too (:func:`emit_weight_only_take`; the same codes as a matmul quantized here on
    the same weight: a table tied to the LM head is one set of codes). The new parameters are
    ``<weight>.codes``, ``<weight>.scales`` (and ``<weight>.zero_points``); a weight read elsewhere
    too (a lookup not in ``lookups``, a matmul kept float) keeps its float parameter for those readers.
    """
    group_size = group_block(weights, group_size)
    bits, rounding = WEIGHT_FORMATS[weights], _rounding(rounding, zero_points)
    if scale_dtype not in ("float32", "float16"):
        raise QuantizationError(f"scale_dtype must be 'float32' or 'float16', got {scale_dtype!r}")
    func = mod["main"]
    by_name = {p.name: p for p in func.params}
    values: dict[relax.Expr, np.ndarray] = {by_name[k]: np.asarray(v) for k, v in params.items() if k in by_name}
    rewriter = _WeightOnlyRewriter(values, bits, group_size, zero_points, scale_dtype, keep_float, seed, lookups,
                                   rounding)
    new_func = rewriter.rewrite(func)
    out_mod = mod.clone()
    out_mod["main"] = new_func
    kept_names = {p.name for p in new_func.params}
    out_params = {k: v for k, v in params.items() if k in kept_names} | rewriter.new_values
    error = max((lyr.error for lyr in rewriter.layers), default=0.0)
    result = WeightOnlyModel(out_mod, out_params, error, rewriter.layers, rewriter.kept, weights, group_size,
                             zero_points, scale_dtype, lookups=rewriter.looked_up, rounding=rounding)
    if not result.layers and not result.lookups:
        raise QuantizationError("no dense layer to quantize: no matmul whose weight is a 2-D float32 parameter or "
                                "constant" + (f" (kept float: {', '.join(result.kept_float)})" if result.kept_float else ""))
    if verbose:
        print(f"bh.quantize: {result.summary()}", file=sys.stdout)
    return result


class _WeightOnlyRewriter:
    """Re-emits ``main`` binding by binding, replacing the matmuls on weights (see quantize_weights)."""

    def __init__(self, values, bits, group_size, zero_points, scale_dtype, keep_float, seed, lookups=None,
                 rounding=DEFAULT_ROUNDING):
        self.values, self.bits, self.group_size, self.lookups = values, bits, group_size, lookups
        self.looked_up: list[str] = []
        self.zero_points, self.scale_dtype, self.keep_float = zero_points, scale_dtype, keep_float
        self.rng = np.random.default_rng(seed)
        self.rounding = rounding
        self.layers: list[WeightOnlyLayer] = []
        self.kept: list[str] = []
        self.new_values: dict[str, np.ndarray] = {}
        self.new_params: list[relax.Var] = []
        self.codes: dict[relax.Expr, tuple[WeightCodes, list[relax.Var]]] = {}
        self.param_names: set[str] = set()

    def _name(self, w: relax.Expr) -> str:
        return w.name if isinstance(w, relax.Var) else f"const_{len(self.codes)}"

    def _kept(self, index: int, weight_name: str, name: str) -> bool:
        """Whether the ``index``-th matmul (on ``weight_name``, labelled ``name``) stays float."""
        return _selected(self.keep_float, index, weight_name) or _selected(self.keep_float, index, name)

    def _looked_up(self, weight_name: str) -> bool:
        """Whether the lookups (``take`` rows) of the weight ``weight_name`` read its codes."""
        return _selected(self.lookups, -1, weight_name)

    def _quantize(self, name: str, w_kn: np.ndarray) -> WeightCodes:
        try:
            return quantize_matrix(w_kn.T, self.bits, self.group_size, self.zero_points, self.scale_dtype,
                                   self.rounding)
        except QuantizationError as err:
            raise QuantizationError(f"{name}: {err}") from None

    def _parts(self, w: relax.Expr, w_kn: np.ndarray) -> tuple[WeightCodes, list[relax.Var]]:
        if w not in self.codes:
            name = self._name(w)
            codes = self._quantize(name, w_kn)
            if any(p.startswith(f"{name}.") for p in self.param_names):  # codes of it from an earlier pass
                name = f"{name}.int{codes.bits}"
            arrays = {"codes": codes.codes, "scales": codes.scales, "zero_points": codes.zero_points,
                      "offsets": codes.offsets}
            parts = []
            for suffix, array in arrays.items():
                if array is None:
                    continue
                var = relax.Var(f"{name}.{suffix}", relax.TensorType(array.shape, str(array.dtype)))
                self.new_values[var.name] = array
                self.new_params.append(var)
                parts.append(var)
            self.codes[w] = (codes, parts)
        return self.codes[w]

    def rewrite(self, func: relax.Function) -> relax.Function:
        from .insert_qdq import all_bindings, free_vars, substitute

        self.param_names = {p.name for p in func.params}
        for b in all_bindings(func):
            if isinstance(b.value, tvm.ir.Constant):
                continue
            if isinstance(b.value, relax.Call):
                for a in b.value.args:
                    if isinstance(a, tvm.ir.Constant) and constant_value(a).ndim == 2:
                        self.values.setdefault(a, constant_value(a))
        bound = {b.var: b.value for b in all_bindings(func)}
        targets = {}
        for b in all_bindings(func):
            found = _weight_of(b.value, self.values, bound)
            if found is None:
                continue
            name = f"matmul_{len(targets) + len(self.kept)}"
            weight_name = self._name(found[0]) if isinstance(found[0], relax.Var) else name
            if self._kept(len(targets) + len(self.kept), weight_name, name):
                self.kept.append(weight_name)
                continue
            targets[b.var] = (name, *found)
        tables = {b.var: w for b in all_bindings(func)
                  if (w := _table_of(b.value, self.values)) is not None and self._looked_up(w.name)}
        replaced = {w for _, w, _, _ in targets.values() if isinstance(w, relax.Var)} | set(tables.values())
        # a weight's permute_dims read only by quantized matmuls goes with them
        readers: dict[relax.Var, set] = {}
        for b in all_bindings(func):
            for v in free_vars(b.value):
                readers.setdefault(v, set()).add(b.var)
        outputs = set(free_vars(func.body.body))
        dropped = {p for _, _, _, p in targets.values()
                   if p is not None and p not in outputs and readers.get(p, set()) <= set(targets)}
        skipped = set(targets) | dropped | set(tables)
        still_float = {v for b in all_bindings(func) if b.var not in skipped for v in free_vars(b.value)} | outputs
        attrs = {k: v for k, v in (func.attrs or {}).items() if k != "params"} if func.attrs is not None else None
        bb = relax.BlockBuilder()
        env: dict[relax.Var, relax.Expr] = {}
        # the new parameters are known only after the bindings are visited: quantize first
        for var, (name, w, transposed, _) in targets.items():
            value = self.values[w]
            w_kn = value.T if transposed else value
            codes, _ = self._parts(w, w_kn)
            self.layers.append(WeightOnlyLayer(name, self._name(w) if isinstance(w, relax.Var) else name,
                                               tuple(w_kn.shape), _layer_error(w_kn, codes, self.rng)))
        for w in tables.values():  # a table [V, K] is a weight [N, K]: the codes of its matmul, if quantized
            self._parts(w, self.values[w].T)
            if w.name not in self.looked_up:
                self.looked_up.append(w.name)
        params = [p for p in func.params if p not in replaced or p in still_float] + self.new_params
        with bb.function("main", params, attrs=attrs, pure=True):
            with bb.dataflow():
                for b in all_bindings(func):
                    if b.var in dropped:
                        continue
                    if b.var in targets:
                        _, w, _, _ = targets[b.var]
                        codes, parts = self.codes[w]
                        env[b.var] = emit_weight_only_dense(bb, substitute(b.value.args[0], env), codes, parts)
                    elif b.var in tables:
                        codes, parts = self.codes[tables[b.var]]
                        env[b.var] = emit_weight_only_take(bb, substitute(b.value.args[1], env), codes, parts)
                    elif isinstance(b, relax.MatchCast):
                        env[b.var] = bb.match_cast(substitute(b.value, env), b.ty)
                    else:
                        env[b.var] = bb.emit(substitute(b.value, env))
                out = bb.emit_output(substitute(func.body.body, env))
            bb.emit_func_output(out)
        return bb.get()["main"]


class _GivenCodes(_WeightOnlyRewriter):
    """The rewriter with each weight's codes given (read from a file) rather than computed."""

    def __init__(self, values, given: Mapping[str, WeightCodes]):
        super().__init__(values, 0, None, False, "float32", None, 0)
        self.given = given

    def _kept(self, index: int, weight_name: str, name: str) -> bool:
        return weight_name not in self.given

    def _looked_up(self, weight_name: str) -> bool:
        return weight_name in self.given

    def _quantize(self, name: str, w_kn: np.ndarray) -> WeightCodes:
        return self.given[name]


def apply_weight_codes(mod: tvm.IRModule, params: Mapping[str, np.ndarray], codes: Mapping[str, WeightCodes]
                       ) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """``mod`` with every matmul on a weight parameter named in ``codes`` in the weight-only form of
    those codes (weights quantized by a file's producer: ONNX ``MatMulNBits``, GGUF blocks), and every
    ``take(W, ids, axis=0)`` of such a weight (an embedding lookup) reading the same codes
    (:func:`emit_weight_only_take`), the other matmuls and lookups as they were. ``params`` holds
    every weight as float32 [K, N] or [N, K] as the matmul reads it (those in ``codes``: their
    dequantized value, used to find the matmuls and lookups; it is replaced by ``<name>.codes`` /
    ``.scales`` / ``.zero_points`` / ``.offsets``). Returns (module, params)."""
    for name, c in codes.items():
        c.check(name)
    func = mod["main"]
    by_name = {p.name: p for p in func.params}
    missing = sorted(set(codes) - set(by_name))
    if missing:
        raise QuantizationError(f"weight codes for {missing}: no such parameter of main")
    values = {by_name[k]: np.asarray(v) for k, v in params.items() if k in by_name}
    rewriter = _GivenCodes(values, codes)
    new_func = rewriter.rewrite(func)
    out = mod.clone()
    out["main"] = new_func
    kept = {p.name for p in new_func.params}
    return out, {k: v for k, v in params.items() if k in kept} | rewriter.new_values
