/*!
 * \file kernels/dense_wq.h
 * \brief Weight-only quantized dense (node `dense_wq`): the packed layout the kernel streams and
 *        its micro-kernels, one per ISA (AVX-512F, AVX2 + FMA, portable C++), chosen at run time.
 *
 * y[M, N] = x[M, K] @ dequant(W)[K, N] (+ bias), float32 activations, weights of 8 or 4 bits:
 *   dequant(W)[k, n] = (q[n, k] - z[n, b]) * s[n, b],  b = k / block
 * (8-bit per-output-channel is block = K).  oneDNN 3.2 has no weight decompression, so the
 * weights are unpacked to float32 in registers and multiplied there: the decode GEMV (M = 1) is
 * bound by the bytes of weights it streams, 1 (8-bit) or 0.5 (4-bit) per weight against f32's 4.
 *
 * Packed layout (made once, at __init_, by the operand transforms of dense_wq.cc):
 *   data    per N-tile of kTile = 16 columns, K-contiguous: for each k, the 16 columns' codes —
 *           8-bit: 16 bytes (unsigned; a signed int8 weight is stored + 128 with zero point 128);
 *           4-bit: for each pair of k (k even), 16 bytes, column c's byte holding k in its low
 *           nibble and k + 1 in its high one: one 16-byte load widens to 16 lanes of two codes,
 *           separated by an and and a shift (half the unpacking work of nibbles along N).
 *   scales  per tile, per block: 16 float32 (fp16 scales widened once; columns past N: 0).
 *   zeros   per tile, per block: 16 float32 zero points (only with explicit zero points; else
 *           one constant, 2^(bits-1) for unsigned codes).
 * The sum over one block accumulates x * (q - z) (q - z is exact in float32), then adds
 * s * block-sum to the row's total: one multiply per block and column, not per weight.
 *
 * VNNI (not done: this project's test machine has none): llama.cpp and MLAS quantize the
 * activations per call to int8 and use VPDPBUSD on the codes, 4 multiply-adds per lane and
 * instruction; a `kAvx512Vnni` micro-kernel would add that path behind the same selection.
 */
#ifndef BYOC_HETERO_KERNELS_DENSE_WQ_H_
#define BYOC_HETERO_KERNELS_DENSE_WQ_H_

#include <cstdint>
#include <string>

#include "simd_isa.h"

namespace byoc_hetero {
namespace wq {

constexpr int64_t kTile = 16;  // columns per packed tile (one AVX-512 vector, two AVX2 ones)
constexpr int kMaxRows = 4;    // rows one micro-kernel call keeps in registers

/*! \brief The micro-kernel implementations (simd_isa.h), chosen when a kernel is built: the best of the
 *         CPU capped by BYOC_HETERO_WQ_ISA (avx512 | avx2 | generic | auto). */
using Isa = SimdIsa;
constexpr const char* kIsaVariable = "BYOC_HETERO_WQ_ISA";

/*! \brief What one micro-kernel call computes: rows [r0, r0 + rows) of tile t. */
struct TileJob {
  const float* x;        // data row r0 (row stride k)
  const uint8_t* codes;  // tile t's codes
  const float* scales;   // tile t's scales [blocks][16]
  const float* zeros;    // tile t's zero points [blocks][16], or null: zero for every code
  float zero;
  int64_t k, block, rows;
  float* out;            // rows x 16 floats, row stride 16
};

/*! \brief One micro-kernel per (ISA, bits): out = sum over blocks of s * sum_k x * (q - z). */
using TileFn = void (*)(const TileJob& job);
TileFn FindTileFn(Isa isa, int bits);

}  // namespace wq
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_DENSE_WQ_H_
