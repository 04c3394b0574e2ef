"""GGUF files of Llama-family decoders (llama.cpp's format) as generators: ``bh.llm.from_gguf``.

The file is read here (no ``gguf`` package needed at run time): the header, the metadata of the
``{arch}.*`` keys, the tensor table, then each tensor's bytes through a memory map. Tensor types:

* ``F32``, ``F16``, ``BF16``: float weights (widened to float32);
* ``Q8_0``: blocks of 32 weights along K, an f16 scale ``d`` and 32 int8 codes: ``w = q * d``;
* ``Q4_0``: blocks of 32, an f16 scale ``d`` and 16 bytes, byte j holding element j (low nibble)
  and element j + 16 (high): ``w = (q - 8) * d``;
* ``Q5_0``: as Q4_0 with a fifth bit per weight (4 bytes ``qh``, bit j for element j): ``w = (q - 16) * d``;
* ``Q4_1`` / ``Q5_1``: as Q4_0 / Q5_0 with an f16 ``m`` after ``d``, unsigned codes: ``w = q * d + m``;
* ``Q4_K`` / ``Q5_K``: super-blocks of 256 = 8 sub-blocks of 32, f16 ``d`` and ``dmin``, 12 bytes of
  6-bit sub-block scales ``sc`` and mins ``m``, then (Q5_K: 32 bytes of fifth bits, bit j of byte l for
  sub-block j) 128 bytes of nibbles, each 64 weights' 32 bytes holding sub-block 2c low and 2c + 1 high:
  ``w = d * sc * q - dmin * m`` (:func:`k_quant_blocks`);
* ``Q6_K``: super-blocks of 256 = 16 sub-blocks of 16, 6-bit codes, an int8 scale per sub-block and an
  f16 ``d``: ``w = d * scale * (q - 32)`` (:func:`q6_k_blocks`; llama.cpp's type for the LM head of Q4_0
  and Q4_K_M files, and some of a Q4_K_M file's ffn_down / attn_v);
* ``Q2_K``: super-blocks of 256 = 16 sub-blocks of 16, a byte per sub-block (4-bit scale ``sc`` low, 4-bit
  min ``m`` high), 64 bytes of 2-bit codes, f16 ``d`` and ``dmin``: ``w = d * sc * q - dmin * m``;
* ``Q3_K``: super-blocks of 256 = 16 sub-blocks of 16, 32 bytes of high bits, 64 of 2-bit low bits, 12 bytes
  of 6-bit sub-block scales, an f16 ``d``: ``w = d * (sc - 32) * (q - 4)``, q the 3-bit code (the high bit
  set adds 4) (:func:`low_k_blocks`);
* ``IQ4_NL``: blocks of 32 as Q4_0, each nibble an index into llama.cpp's 16 non-linear int8 levels:
  ``w = d * levels[q]``.

Weights of these block types in the decoder's denses and the LM head stay quantized:
their codes are rearranged (not requantized) into the weight-only form of
:mod:`byoc_hetero.quant.weight_only`, blocks of 32 (Q8_0 / Q5_0: int8 codes, f16 scales; Q4_0: 4-bit
codes two a byte, implicit zero point 8; Q4_1 / Q4_K: 4-bit codes with a float offset per block,
``w = s * q + o``; Q5_1 / Q5_K: 8-bit codes 0..31 with offsets; K-quants' scales ``d * sc`` and offsets
``-dmin * m`` exact in float32; Q6_K: int8 codes ``q - 32`` in blocks of 16, scales ``d * scale``, which
dense_wq runs with float32 activations: its int8-activation kernels take blocks of 32; Q2_K / Q3_K: 4-bit
codes 0..3 / 0..7 in blocks of 16, scales ``d * sc`` / ``d * (sc - 32)``, offsets ``-dmin * m`` / ``-4 *
scale``, all exact in float32; IQ4_NL: int8 codes, the levels themselves, f16 scales) and run as
``dense_wq`` nodes; ``weights="f32"`` dequantizes everything
instead. A file without
``output.weight`` ties the LM head to ``token_embd.weight`` (as llama.cpp reads it): the spec's
``tied_embeddings``, one ``embed`` weight whose codes the LM head's ``dense_wq`` reads. The embedding's
lookup reads ``token_embd.weight``'s codes too (a ``take_wq`` node dequantizing only the rows looked up,
as llama.cpp's ``get_rows`` does), tied or not: no float32 copy of the table. A block whose
scale is 0 holds zeros whatever its codes: it is stored with scale 1 and the zero code (same values;
dense_wq refuses zero scales).

llama.cpp's ``llama`` architecture rotates adjacent pairs (x0, x1) of each head where Hugging Face
(and our ``kv_attention``) rotate the two halves (x_i, x_{i + d/2}); its converter therefore reorders
the rows of the query / key projections per head (half i -> positions 2i, 2i + 1). :func:`pairs_to_halves`
undoes that, so the rotation our kernel applies is the one the file's weights expect. ``qwen2`` files
use the halves form and are read as they are.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FrontendError, InputError, ModelFileError, UnsupportedModelError
from ..quant.weight_only import WeightCodes, dequantize_codes
from .model import DecoderSpec

MAGIC = b"GGUF"
ARCHS = {"llama": False, "qwen2": True}
"""Architectures read -> whether they have q / k / v biases."""

GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
              11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS",
              18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16",
              26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}
"""ggml's tensor type codes, for reading and for naming the ones not supported."""

BLOCKS = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q8_0": (32, 34), "Q4_0": (32, 18), "Q5_0": (32, 22),
          "Q4_1": (32, 20), "Q5_1": (32, 24), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
          "Q2_K": (256, 84), "Q3_K": (256, 110), "IQ4_NL": (32, 18)}
"""Supported tensor types -> (weights per block, bytes per block)."""

CODE_TYPES = ("Q8_0", "Q4_0", "Q5_0", "Q4_1", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL")
"""Types read as weight-only codes (:func:`block_codes`)."""

# metadata value types: code -> struct format (8 string, 9 array are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@dataclass
class GgufTensor:
    """One entry of the tensor table: name, shape (numpy order: slowest first), type name, byte offset
    and size in the file."""

    name: str
    shape: tuple[int, ...]
    type: str
    offset: int
    nbytes: int


class _Cursor:
    """Little-endian reads from the file's bytes; running past the end is a ModelFileError."""

    def __init__(self, buf: Any, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.buf):
            raise ModelFileError(f"bh.llm.from_gguf: {self.path} ends inside its header ({what} at byte {self.pos}): "
                                 "the file is truncated")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        return bytes(self.take(self.scalar("<Q", what), what)).decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype], what)
        if vtype == 8:
            return self.string(what)
        if vtype == 9:
            etype, count = self.scalar("<I", what), self.scalar("<Q", what)
            if etype in _SCALARS:  # numeric arrays in one read
                size = struct.calcsize(_SCALARS[etype])
                return np.frombuffer(self.take(size * count, what), dtype=np.dtype(_SCALARS[etype])).copy()
            return [self.value(etype, what) for _ in range(count)]
        raise ModelFileError(f"bh.llm.from_gguf: {self.path}: {what} has metadata value type {vtype}, not a GGUF one")


class GgufFile:
    """A GGUF file's metadata (``meta``: key -> value) and tensor table (``tensors``: name ->
    :class:`GgufTensor`), its tensor bytes read on demand through a memory map."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        try:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.path.getsize(self.path) else b""
        except OSError as err:
            raise ModelFileError(f"bh.llm.from_gguf: cannot read {self.path}: {err}") from None
        cur = _Cursor(self._map, self.path)
        if bytes(cur.take(4, "the magic")) != MAGIC:
            raise ModelFileError(f"bh.llm.from_gguf: {self.path} is not a GGUF file (it does not start with 'GGUF')")
        version = cur.scalar("<I", "the version")
        if version not in (2, 3):
            raise ModelFileError(f"bh.llm.from_gguf: {self.path} is GGUF version {version}; versions 2 and 3 are read")
        n_tensors, n_kv = cur.scalar("<Q", "the tensor count"), cur.scalar("<Q", "the metadata count")
        self.meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string("a metadata key")
            self.meta[key] = cur.value(cur.scalar("<I", key), key)
        table = [self._tensor_info(cur) for _ in range(n_tensors)]
        align = self.meta.get("general.alignment", 32)
        if not isinstance(align, int) or align < 1:
            raise ModelFileError(f"bh.llm.from_gguf: {self.path}: general.alignment is {align!r}, not a positive "
                                 "integer")
        start = -(-cur.pos // align) * align
        self.tensors = {t.name: GgufTensor(t.name, t.shape, t.type, start + t.offset, t.nbytes) for t in table}

    @staticmethod
    def _tensor_info(cur: _Cursor) -> GgufTensor:
        name = cur.string("a tensor name")
        dims = [cur.scalar("<Q", name) for _ in range(cur.scalar("<I", name))]
        code = cur.scalar("<I", name)
        offset = cur.scalar("<Q", name)
        tname = GGML_TYPES.get(code, f"type {code}")
        shape = tuple(reversed(dims))  # GGUF lists the fastest dimension first
        count = int(np.prod(shape, dtype=np.int64))
        per, size = BLOCKS.get(tname, (1, 0))
        return GgufTensor(name, shape, tname, offset, count // per * size)

    def key(self, key: str, default: Any = None, kind: type | None = None) -> Any:
        """The metadata value of ``key`` (``default`` when missing; a FrontendError naming it when missing
        and no default); ``kind`` int: a positive integer, float: a finite number (else a FrontendError)."""
        if key not in self.meta:
            if default is None:
                raise FrontendError(f"bh.llm.from_gguf: {self.path} has no metadata key {key!r}")
            return default
        value = self.meta[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is int and not (number and value == int(value) and value > 0):
            raise FrontendError(f"bh.llm.from_gguf: metadata key {key!r} is {value!r}; expected a positive integer")
        if kind is float and not (number and np.isfinite(value)):
            raise FrontendError(f"bh.llm.from_gguf: metadata key {key!r} is {value!r}; expected a finite number")
        return kind(value) if kind else value

    def raw(self, name: str) -> tuple[GgufTensor, np.ndarray]:
        """The tensor's entry and bytes (uint8), checked: present, of a supported type, inside the file."""
        t = self.tensors.get(name)
        if t is None:
            raise FrontendError(f"bh.llm.from_gguf: {self.path} has no tensor {name!r}")
        if t.type not in BLOCKS:
            raise UnsupportedModelError(f"bh.llm.from_gguf: tensor {name!r} is {t.type}; supported tensor types: "
                                        f"{', '.join(BLOCKS)}")
        per = BLOCKS[t.type][0]
        if t.shape[-1] % per:
            raise ModelFileError(f"bh.llm.from_gguf: tensor {name!r} ({t.type}) has rows of {t.shape[-1]}, not a "
                                 f"multiple of its block of {per}")
        if t.offset + t.nbytes > len(self._map):
            raise ModelFileError(f"bh.llm.from_gguf: {self.path} ends inside tensor {name!r} (bytes {t.offset} to "
                                 f"{t.offset + t.nbytes}, the file has {len(self._map)}): the file is truncated")
        return t, np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def float32(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32, in numpy order."""
        t, data = self.raw(name)
        if t.type == "F32":
            return data.view("<f4").reshape(t.shape).copy()
        if t.type == "F16":
            return data.view("<f2").astype(np.float32).reshape(t.shape)
        if t.type == "BF16":
            return (data.view("<u2").astype(np.uint32) << 16).view(np.float32).reshape(t.shape)
        return dequantize_codes(block_codes(self, name))


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The f16 at byte ``at`` of each block, as float16."""
    return blocks[..., at:at + 2].copy().view("<f2")[..., 0].astype(np.float16)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 codes in order: byte j's low nibble is element j, its high one element j + 16."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """4 bytes (one little-endian uint32) -> 32 values 0 / 16: bit j is element j's fifth bit."""
    bits = qh.copy().view("<u4")
    return (((bits >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def _scale_min_k4(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """K-quants' 12 bytes -> 8 sub-block scales and 8 mins (6 bits each; llama.cpp's get_scale_min_k4):
    sub-blocks 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7 in the nibbles of bytes
    8-11 (scale low, min high) with their top 2 bits in the top bits of bytes 0-3 / 4-7."""
    a, b, c = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=-1)
    m = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=-1)
    return sc, m


def k_quant_blocks(blocks: np.ndarray, fifth: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K (``fifth`` False) / Q5_K super-blocks [..., bytes] -> (codes [..., 8, 32] uint8 in order,
    scales ``d * sc`` [..., 8] float32, offsets ``-dmin * m`` [..., 8] float32): both exact in float32
    (an f16 times a 6-bit integer)."""
    d, dmin = _half(blocks, 0).astype(np.float32), _half(blocks, 2).astype(np.float32)
    sc, m = _scale_min_k4(blocks[..., 4:16])
    qs = blocks[..., 48:176] if fifth else blocks[..., 16:144]
    qs = qs.reshape(*qs.shape[:-1], 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(2, 1)
    q = (qs & 0x0F).reshape(*blocks.shape[:-1], 8, 32)  # chunk c: sub-block 2c low nibbles, 2c + 1 high
    if fifth:
        qh = blocks[..., 16:48]
        q = q | (((qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1) << 4)
    return q, d[..., None] * sc.astype(np.float32), -(dmin[..., None] * m.astype(np.float32))


IQ4_NL_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
"""llama.cpp's ``kvalues_iq4nl``: the int8 level each IQ4_NL nibble stands for."""


def _two_bit_fields(qs: np.ndarray) -> np.ndarray:
    """K-quants' 64 bytes of 2-bit fields [..., 64] -> 256 values [..., 16, 16] in order: half h of 128
    weights takes bytes 32 h .. 32 h + 31, its weight 32 j + l (j < 4, l < 32) bits 2 j of byte 32 h + l."""
    lead = qs.shape[:-1]
    q = (qs.reshape(*lead, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3
    return q.reshape(*lead, 16, 16)


def low_k_blocks(blocks: np.ndarray, three: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q2_K (``three`` False) / Q3_K super-blocks [..., bytes] -> (codes [..., 16, 16] uint8 in order: Q2_K's
    0..3, Q3_K's 0..7 (the 2 low bits, + 4 where the high bit is set), scales [..., 16] float32, offsets [...,
    16] float32). Q2_K: scale ``d * sc``, offset ``-dmin * m``; Q3_K: scale ``d * (sc - 32)`` (its 6-bit scales:
    sub-block i's low 4 bits in the nibble i // 8 of byte i % 8, its high 2 bits at bit 2 (i // 4) of byte
    8 + i % 4), offset ``-4 * scale``; each exact in float32, as is ``q * scale + offset`` for Q3_K."""
    lead = blocks.shape[:-1]
    if not three:
        d, dmin = _half(blocks, 80).astype(np.float32), _half(blocks, 82).astype(np.float32)
        sc = blocks[..., :16]
        return (_two_bit_fields(blocks[..., 16:80]), d[..., None] * (sc & 15).astype(np.float32),
                -(dmin[..., None] * (sc >> 4).astype(np.float32)))
    packed, d = blocks[..., 96:108], _half(blocks, 108).astype(np.float32)
    low = np.concatenate([packed[..., :8] & 15, packed[..., :8] >> 4], axis=-1)
    high = (packed[..., 8:12].reshape(*lead, 1, 4) >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3
    sc = (low | (high.reshape(*lead, 16) << 4)).astype(np.int16) - 32
    hbit = (blocks[..., :32].reshape(*lead, 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # weight 32 b + l
    scales = d[..., None] * sc.astype(np.float32)
    return _two_bit_fields(blocks[..., 32:96]) | (hbit.reshape(*lead, 16, 16) << 2), scales, -4 * scales


def _codes_of(kind: str, blocks: np.ndarray) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray | None]:
    """One type's blocks [N, K / per, bytes] -> (bits, block, codes [N, K / block, block] in order, scales
    [N, K / block], offsets [N, K / block] float32 or None); block 32 (Q6_K, Q2_K, Q3_K: 16)."""
    n = blocks.shape[0]
    if kind == "Q6_K":
        q, scales = q6_k_blocks(blocks)
        return 8, 16, q.reshape(n, -1, 16), scales.reshape(n, -1), None
    if kind in ("Q2_K", "Q3_K"):
        q, scales, offsets = low_k_blocks(blocks, kind == "Q3_K")
        return 4, 16, q.reshape(n, -1, 16), scales.reshape(n, -1), offsets.reshape(n, -1)
    if kind in ("Q4_K", "Q5_K"):
        q, scales, offsets = k_quant_blocks(blocks, kind == "Q5_K")
        return (4 if kind == "Q4_K" else 8), 32, q.reshape(n, -1, 32), scales.reshape(n, -1), offsets.reshape(n, -1)
    d = _half(blocks, 0)
    if kind == "Q8_0":
        return 8, 32, blocks[:, :, 2:].view(np.int8), d, None
    if kind == "Q4_0":
        return 4, 32, _nibbles(blocks[:, :, 2:]), d, None
    if kind == "IQ4_NL":
        return 8, 32, IQ4_NL_LEVELS[_nibbles(blocks[:, :, 2:])], d, None
    if kind == "Q5_0":
        q = (_nibbles(blocks[:, :, 6:]) | _fifth_bits(blocks[:, :, 2:6])).astype(np.int16) - 16
        return 8, 32, q.astype(np.int8), d, None
    offsets = _half(blocks, 2).astype(np.float32)
    if kind == "Q4_1":
        return 4, 32, _nibbles(blocks[:, :, 4:]), d, offsets
    return 8, 32, _nibbles(blocks[:, :, 8:]) | _fifth_bits(blocks[:, :, 4:8]), d, offsets  # Q5_1


def block_codes(f: GgufFile, name: str) -> WeightCodes:
    """A 2-D tensor [N, K] of a type in :data:`CODE_TYPES` as weight-only codes (blocks of 32 along K),
    rearranged from the file's blocks without requantizing. A block whose scale is 0 is stored with
    scale 1 and the code of value 0 (or, with an offset, code 0: the block's value is its offset)."""
    t, data = f.raw(name)
    if t.type not in CODE_TYPES or len(t.shape) != 2:
        raise FrontendError(f"bh.llm.from_gguf: tensor {name!r} is {t.type} {list(t.shape)}; expected a 2-D weight "
                            f"of type {', '.join(CODE_TYPES)}")
    n, k = t.shape
    per, size = BLOCKS[t.type]
    return _finished(name, t.type, (n, k), *_codes_of(t.type, data.reshape(n, k // per, size)))


def _finished(name: str, kind: str, shape: tuple[int, int], bits: int, block: int, q: np.ndarray,
              scales: np.ndarray, offsets: np.ndarray | None) -> WeightCodes:
    """:func:`_codes_of`'s parts as WeightCodes [N, K]: scales and offsets checked finite (else a
    ModelFileError naming the tensor and block), zero-scale blocks stored with scale 1 and the code of 0."""
    n, k = shape
    for what, values in (("scale", scales), ("offset", offsets)):
        if values is not None and not np.isfinite(values).all():
            i = tuple(int(v) for v in np.argwhere(~np.isfinite(values))[0])
            raise ModelFileError(f"bh.llm.from_gguf: tensor {name!r} block {list(i)} has {what} {values[i]}")
    zero = scales == 0
    scales = np.where(zero, 1.0, scales).astype(scales.dtype)
    q = q.copy()
    q[zero] = 8 if kind == "Q4_0" else 0
    q = q.reshape(n, k)
    if bits == 4:
        q = q[:, 0::2] | (q[:, 1::2] << 4)
    return WeightCodes(bits, block, np.ascontiguousarray(q), np.ascontiguousarray(scales), offsets=offsets)


def q6_k_blocks(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q6_K super-blocks [..., 210] (bytes) -> (codes ``q - 32`` int8 [..., 16, 16] in order, scales ``d *
    scale`` float32 [..., 16]: one per 16 weights, exact in float32, as is each weight ``d * scale * (q -
    32)``). A block: ql[128] (low 4 bits), qh[64] (high 2 bits), 16 int8 sub-block scales, an f16 ``d``;
    each half h of 128 weights takes 64 bytes of ql and 32 of qh: its weight l + 32 j (l < 32, j < 4) has
    its low bits in ql[l] (j = 0, 2: low / high nibble) or ql[l + 32] (j = 1, 3), its high bits in
    qh[l] >> 2 j. Per-16 scales do not fold into blocks of 32 without requantizing (two sub-blocks' scales
    differ and an int8 code has no room for their ratio): the codes keep blocks of 16."""
    lead = blocks.shape[:-1]
    ql = blocks[..., :128].reshape(*lead, 2, 2, 32)
    qh = blocks[..., 128:192].reshape(*lead, 2, 1, 32)
    low = np.concatenate([ql & 15, ql >> 4], axis=-2)  # j = 0, 1: low nibbles of ql[l], ql[l + 32]; 2, 3: high
    high = (qh >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3
    q = ((low | (high << 4)).astype(np.int16) - 32).astype(np.int8).reshape(*lead, 16, 16)
    d = _half(blocks, 208).astype(np.float32)
    return q, blocks[..., 192:208].view(np.int8).astype(np.float32) * d[..., None]


def pairs_to_halves(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of a query / key projection's rows (``[heads * d, ...]``): from
    the pair layout (rotation pairs 2i, 2i + 1) back to the halves one (i, i + d/2)."""
    d = w.shape[0] // heads
    return np.ascontiguousarray(w.reshape(heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def _permuted(value: np.ndarray | WeightCodes, heads: int) -> np.ndarray | WeightCodes:
    """``pairs_to_halves`` on a float weight, or on the rows of codes and scales."""
    if isinstance(value, np.ndarray):
        return pairs_to_halves(value, heads)
    rows = [None if a is None else pairs_to_halves(a, heads) for a in (value.zero_points, value.offsets)]
    return WeightCodes(value.bits, value.block, pairs_to_halves(value.codes, heads),
                       pairs_to_halves(value.scales, heads), *rows)


def gguf_spec(f: GgufFile) -> DecoderSpec:
    """The :class:`DecoderSpec` of the file's ``{arch}.*`` metadata (and its rope_freqs tensor)."""
    arch = f.key("general.architecture")
    if arch not in ARCHS:
        raise UnsupportedModelError(f"bh.llm.from_gguf: architecture {arch!r} is not supported "
                                    f"(supported: {', '.join(ARCHS)})")
    hidden, heads = f.key(f"{arch}.embedding_length", kind=int), f.key(f"{arch}.attention.head_count", kind=int)
    kv_heads = f.key(f"{arch}.attention.head_count_kv", heads, kind=int)
    head_dim = f.key(f"{arch}.attention.key_length", hidden // heads, kind=int)
    rot = f.key(f"{arch}.rope.dimension_count", head_dim, kind=int)
    if rot != head_dim:
        raise UnsupportedModelError(f"bh.llm.from_gguf: RoPE over {rot} of the head's {head_dim} dims (partial "
                                    "rotary) is not supported")
    base = f.key(f"{arch}.rope.freq_base", 10000.0, kind=float)
    inv = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = f.key(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        inv /= f.key(f"{arch}.rope.scaling.factor", kind=float)
    elif scaling != "none":
        raise UnsupportedModelError(f"bh.llm.from_gguf: rope scaling {scaling!r} is not supported (none, linear, "
                                    "and Llama 3's rope_freqs tensor are)")
    if "rope_freqs.weight" in f.tensors:  # Llama 3: one divisor per frequency
        inv /= f.float32("rope_freqs.weight").astype(np.float64).reshape(-1)
    vocab = f.meta.get(f"{arch}.vocab_size") or f.raw("token_embd.weight")[0].shape[0]
    return DecoderSpec(
        family="llama" if arch == "llama" else arch, layers=f.key(f"{arch}.block_count", kind=int), hidden=hidden,
        heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate=f.key(f"{arch}.feed_forward_length", kind=int),
        vocab=int(vocab),
        eps=f.key(f"{arch}.attention.layer_norm_rms_epsilon", kind=float), activation="silu",
        qkv_bias=ARCHS[arch], sliding_window=0, embed_scale=1.0, rope_scale=1.0, inv_freq=[float(v) for v in inv],
        tied_embeddings="output.weight" not in f.tensors)  # llama.cpp's LM head is then the embedding


_LAYER = {"in_norm": "attn_norm.weight", "post_norm": "ffn_norm.weight", "q": "attn_q.weight", "k": "attn_k.weight",
          "v": "attn_v.weight", "o": "attn_output.weight", "gate": "ffn_gate.weight", "up": "ffn_up.weight",
          "down": "ffn_down.weight", "q_bias": "attn_q.bias", "k_bias": "attn_k.bias", "v_bias": "attn_v.bias"}
"""Our per-layer parameter names -> llama.cpp's (``blk.{i}.`` before them)."""


def gguf_names(spec: DecoderSpec) -> dict[str, str]:
    """Parameter name of :func:`~byoc_hetero.llm.model.step_module` -> tensor name in the file."""
    from .model import weight_shapes

    names = {"embed": "token_embd.weight", "final_norm": "output_norm.weight"}
    if not spec.tied_embeddings:
        names["lm_head"] = "output.weight"
    for p in weight_shapes(spec):
        layer, _, short = p.partition(".")
        if short in _LAYER:
            names[p] = f"blk.{layer[1:]}.{_LAYER[short]}"
    return names


def gguf_weights(f: GgufFile, spec: DecoderSpec, dequantize: bool = False
                 ) -> tuple[dict[str, np.ndarray], dict[str, WeightCodes]]:
    """(float32 params, codes): every weight :func:`step_module` declares, by its name, shape-checked;
    weights of :data:`CODE_TYPES` (denses, the LM head, the embedding) also in ``codes`` (unless
    ``dequantize``), their float value the exact dequantize (what finds their readers)."""
    from .model import weight_shapes

    shapes, names = weight_shapes(spec), gguf_names(spec)
    params: dict[str, np.ndarray] = {"inv_freq": np.asarray(spec.inv_freq, dtype=np.float32)}
    codes: dict[str, WeightCodes] = {}
    for p, tensor in names.items():
        t = f.raw(tensor)[0]
        if tuple(t.shape) != shapes[p] and not (len(shapes[p]) == 1 and t.shape == (1,) + shapes[p]):
            raise FrontendError(f"bh.llm.from_gguf: tensor {tensor!r} is {list(t.shape)}; the metadata says "
                                f"{list(shapes[p])}")
        keep = t.type in CODE_TYPES and not dequantize
        value: np.ndarray | WeightCodes = block_codes(f, tensor) if keep else f.float32(tensor).reshape(shapes[p])
        short = p.partition(".")[2]
        if spec.family == "llama" and short in ("q", "k"):
            value = _permuted(value, spec.heads if short == "q" else spec.kv_heads)
        if isinstance(value, WeightCodes):
            codes[p], value = value, dequantize_codes(value)
        params[p] = value
    return params, codes


def read_gguf(path: str | os.PathLike, dequantize: bool = False
              ) -> tuple[DecoderSpec, dict[str, np.ndarray], dict[str, WeightCodes], int, list[str]]:
    """(spec, float32 params, codes of the weights kept quantized, context length, the file types of
    those codes, lower case and sorted) of a GGUF file."""
    f = GgufFile(path)
    spec = gguf_spec(f)
    params, codes = gguf_weights(f, spec, dequantize)
    names = gguf_names(spec)
    kinds = sorted({f.tensors[names[p]].type.lower() for p in codes})
    return spec, params, codes, f.key(f"{f.key('general.architecture')}.context_length", kind=int), kinds


WEIGHTS = (None, "f32")
"""``from_gguf``'s ``weights``: None (as the file stores them) or ``"f32"`` (all dequantized)."""


def partitioned_gguf(path: str | os.PathLike, *, max_length: int, weights: str | None = None):
    """What :func:`from_gguf` builds, before the build: (partitioned step module, spec, weights label)."""
    from ..quant.weight_only import apply_weight_codes
    from ..stages import partition, shared_params
    from .model import step_module

    if weights not in WEIGHTS:
        raise InputError(f"bh.llm.from_gguf: weights must be None (as stored) or 'f32', got {weights!r}")
    if int(max_length) != max_length or max_length < 1:
        raise InputError(f"bh.llm.from_gguf: max_length must be a positive integer, got {max_length!r}")
    spec, params, codes, context, kinds = read_gguf(path, dequantize=weights == "f32")
    if max_length > context:
        raise InputError(f"bh.llm.from_gguf: max_length {max_length} is longer than the model's context length "
                         f"{context} ({os.fspath(path)})")
    mod = step_module(spec, int(max_length))
    if codes:
        mod, params = apply_weight_codes(mod, params, codes)
    # arrays of the reader's own (codes, dequantized tensors) bound without a copy; views of the file's mapping
    # (read-only) are copied
    return partition(mod, shared_params(params)), spec, "gguf:" + "+".join(kinds or ["f32"])


def from_gguf(path: str | os.PathLike, *, max_length: int, weights: str | None = None):
    """A :class:`~byoc_hetero.llm.Generator` for a GGUF file of a Llama-family decoder (architectures
    ``llama`` and ``qwen2``), its caches ``max_length`` tokens long (at most the file's context length).

    ``weights``: None keeps Q8_0 / Q4_0 / Q5_0 / Q4_1 / Q5_1 / Q4_K / Q5_K / Q6_K / Q2_K / Q3_K / IQ4_NL
    denses quantized (``dense_wq`` nodes on the file's codes rearranged into blocks of 32, Q6_K / Q2_K /
    Q3_K's of 16: int8 or 4-bit codes, the file's scales, and a float offset per block for Q4_1 / Q5_1 /
    Q4_K / Q5_K / Q2_K / Q3_K), the LM head included (``output.weight``, or ``token_embd.weight`` where
    the file ties them, as llama.cpp reads it), and reads F32 / F16 / BF16 ones as float32; ``"f32"``
    dequantizes every tensor. The embedding's lookup reads ``token_embd.weight``'s codes (a ``take_wq``
    node: only the rows looked up are dequantized; with a tied head, the one set of codes serves both).
    Another tensor type (IQ4_XS, IQ2_XXS, ...), a missing
    metadata key or tensor, or a truncated file raise a :class:`~byoc_hetero.errors.FrontendError`
    naming it. The generator's ``weights`` says what ran: ``"gguf:"`` and the types kept as codes
    (``"gguf:q8_0"``, ``"gguf:q4_k+q5_0"``), or ``"gguf:f32"``.
    """
    from .generator import build_generator, return_freed_heap

    part, spec, label = partitioned_gguf(path, max_length=max_length, weights=weights)
    gen = build_generator(part, spec, max_length, label)
    del part  # the file's arrays (the generator maps its own file of them): freed, the heap handed back
    return_freed_heap()
    return gen
