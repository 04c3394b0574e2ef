"""The weight-only form of one weight: integer codes, per-block scales and zero points.

:class:`WeightCodes` is what :mod:`byoc_hetero.quant.weight_only` writes and what the ONNX pass
``matmul_nbits`` (:mod:`byoc_hetero.passes.matmul_nbits`) reads from ONNX Runtime's ``MatMulNBits``;
it lives below both (formerly in ``quant/weight_only.py``): the passes run inside the stages, which
:mod:`byoc_hetero.quant` partitions through.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import QuantizationError


@dataclass
class WeightCodes:
    """One weight [N, K] (output columns first) in weight-only form.

    ``codes``: uint8 [N, K / 2] (4-bit, two per byte, even k low) or int8 / uint8 [N, K] (8-bit);
    ``scales`` float32 / float16 [N, K / block]; ``zero_points`` uint8 [N, K / block] or None (zero
    0 for int8 codes, 2^(bits-1) for uint8 codes); ``offsets`` float32 [N, K / block] or None: a value
    added to every weight of the block, ``w = (code - zero) * scale + offset`` (llama.cpp's Q4_1 / Q5_1
    ``q * d + m`` and K-quants' ``d * sc * q - dmin * m``), the codes then unsigned from 0 (zero 0).
    """

    bits: int
    block: int
    codes: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None = None
    offsets: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K) of the weight."""
        return int(self.codes.shape[0]), int(self.codes.shape[1]) * 8 // self.bits

    @property
    def implicit_zero(self) -> int:
        """The zero point without ``zero_points``: 0 for int8 codes and for codes with offsets, else 2^(bits-1)."""
        return 0 if self.codes.dtype == np.int8 or self.offsets is not None else 1 << (self.bits - 1)

    def check(self, where: str = "weight") -> None:
        """Raise :class:`QuantizationError` naming the field when the parts do not fit together
        (block not dividing K, scales or zero points of the wrong shape, non-finite or zero scales)."""
        n, k = self.shape
        if self.bits not in (4, 8):
            raise QuantizationError(f"{where}: bits must be 4 or 8, got {self.bits}")
        if self.block < 1 or k % self.block or (self.block != k and (self.block < 16 or self.block & (self.block - 1))):
            raise QuantizationError(f"{where}: block {self.block} must be K = {k} or a power of two >= 16 dividing K")
        want = (n, k // self.block)
        if tuple(self.scales.shape) != want or self.scales.dtype not in (np.float32, np.float16):
            raise QuantizationError(f"{where}: scales must be float32 or float16 of shape {list(want)}, got "
                                    f"{self.scales.dtype}{list(self.scales.shape)}")
        bad = ~np.isfinite(self.scales) | (self.scales == 0)
        if bad.any():
            i = tuple(int(v) for v in np.argwhere(bad)[0])
            raise QuantizationError(f"{where}: scales{list(i)} is {self.scales[i]}: expected a finite, nonzero scale")
        if self.zero_points is not None:
            if tuple(self.zero_points.shape) != want or self.zero_points.dtype != np.uint8:
                raise QuantizationError(f"{where}: zero_points must be uint8 of shape {list(want)}, got "
                                        f"{self.zero_points.dtype}{list(self.zero_points.shape)}")
            if int(self.zero_points.max(initial=0)) >= 1 << self.bits:
                raise QuantizationError(f"{where}: zero point {int(self.zero_points.max())} outside {self.bits} bits")
        if self.offsets is not None:
            if tuple(self.offsets.shape) != want or self.offsets.dtype != np.float32:
                raise QuantizationError(f"{where}: offsets must be float32 of shape {list(want)}, got "
                                        f"{self.offsets.dtype}{list(self.offsets.shape)}")
            if self.zero_points is not None:
                raise QuantizationError(f"{where}: offsets and zero_points together: a block has one or the other")
            if not np.isfinite(self.offsets).all():
                i = tuple(int(v) for v in np.argwhere(~np.isfinite(self.offsets))[0])
                raise QuantizationError(f"{where}: offsets{list(i)} is {self.offsets[i]}: expected a finite offset")
