/*!
 * \file kernels/dense_wq.h
 * \brief Weight-only quantized dense (node `dense_wq`): the packed layout the kernel streams and
 *        its micro-kernels, one per ISA (AVX-512F, AVX2 + FMA, portable C++), chosen at run time.
 *
 * y[M, N] = x[M, K] @ dequant(W)[K, N] (+ bias), float32 activations, weights of 8 or 4 bits:
 *   dequant(W)[k, n] = (q[n, k] - z[n, b]) * s[n, b] (+ o[n, b]),  b = k / block
 * The optional offset o (llama.cpp's Q4_1 / Q5_1 / K-quants, whose codes start at 0: z = 0) adds
 * o * sum(x over the block) per block and column: one multiply-add per block, not per weight.
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
 *           one constant, 2^(bits-1) for unsigned codes, 0 with offsets).
 *   offsets per tile, per block: 16 float32 (only with offsets).
 * (By default, BYOC_HETERO_WQ_BLOCK32=on, blocks of 32 with float16 scales keep them inside the quad layout's codes
 * instead where the integer kernels are AVX-512 ones: the inline layout below.)
 * The sum over one block accumulates x * (q - z) (q - z is exact in float32), then adds
 * s * block-sum to the row's total: one multiply per block and column, not per weight.
 *
 * int8 activations (the default where the block is a multiple of kActBlock; BYOC_HETERO_WQ_ACT =
 * auto | int8 | f32): as llama.cpp's Q8_0 activations and MLAS, each call quantizes the data rows per
 * block of 32 along K (symmetric: scale = max |x| / 127, q = round-half-even(x * 127 / max |x|)),
 * and the micro-kernels take integer dot products of those codes with the weight codes, one float
 * multiply per 32 k and column: sum_k x q_w ~ sx * (sum_k q_x q_w - z * sum_k q_x).  Its layout (the
 * "quad" layout) puts 4 consecutive k of a column in one 32-bit lane, what VPMADDUBSW + VPMADDWD
 * (AVX-512BW, AVX2) and VPDPBUSD (AVX-512 VNNI, AVX-VNNI) multiply and add:
 *   8-bit: per 4 k, 64 bytes, byte c * 4 + i = code(k + i, c) - 128 (signed; the BW / AVX2 kernels
 *          multiply |w| by x with w's sign, < 2^15 for the 16-bit pair sums; VNNI flips it back
 *          to the unsigned code);
 *   4-bit: per 8 k, 64 bytes, byte c * 4 + i = code(k + i, c) | code(k + 4 + i, c) << 4.
 * Its scales stay float16 where the node's are (GGUF's Q8_0 / Q4_0, MatMulNBits' fp16 scales): per tile,
 * per block, 16 halves, widened in registers (VCVTPH2PS), 2 bytes per block and column instead of 4: a
 * 4-bit block of 32 reads 18 bytes, as llama.cpp's Q4_0 block does, not 20.
 * The float path (float32 activations, the layouts above) stays as the exact reference.
 */
#ifndef BYOC_HETERO_KERNELS_DENSE_WQ_H_
#define BYOC_HETERO_KERNELS_DENSE_WQ_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "simd_isa.h"

namespace byoc_hetero {

struct KernelContext;

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
  const float* offsets = nullptr;  // tile t's offsets [blocks][16], or null: none
  const float* x_sums = nullptr;   // with offsets: each data row's block sums [rows][blocks] (made once a call)
};

/*! \brief One micro-kernel per (ISA, bits): out = sum over blocks of s * sum_k x * (q - z) (+ o * sum_k x). */
using TileFn = void (*)(const TileJob& job);
TileFn FindTileFn(Isa isa, int bits);

// ---- int8 activations ---------------------------------------------------------------------------

constexpr int64_t kActBlock = 32;  // k per activation scale (llama.cpp's Q8_0 block)
constexpr const char* kActVariable = "BYOC_HETERO_WQ_ACT";

/*! \brief The integer dot-product implementations; kNone: float32 activations (TileFn). */
enum class IntDot { kNone, kAvx512Vnni, kAvx512Bw, kAvx2Vnni, kAvx2, kGeneric };
const char* IntDotName(IntDot dot);
/*! \brief BYOC_HETERO_WQ_VNNI = auto | off (or 0): off keeps the VPMADDUBSW kernels (AVX-512BW, AVX2) on a VNNI CPU, so that
 *         a VNNI machine runs and tests them too; read when a kernel is built. */
constexpr const char* kVnniVariable = "BYOC_HETERO_WQ_VNNI";
/*! \brief The integer kernel for \p isa on this CPU (AVX-512: VNNI where present, else BW; AVX2: AVX-VNNI where
 *         present, else AVX2), or kNone when BYOC_HETERO_WQ_ACT says f32 or \p block is not a multiple of
 *         kActBlock; another value of either variable is a ValueError naming it. */
IntDot SelectIntDot(Isa isa, int64_t block);
/*! \brief BYOC_HETERO_WQ_PREFETCH: how far ahead along a thread's codes (bytes, a multiple of 64 up to 64 KiB) the
 *         integer kernels ask for each cache line of codes with a software prefetch; 0 or unset: none, the
 *         hardware prefetchers alone (the default until a quiet A/B shows otherwise: bench/WEIGHT_ONLY.md).
 *         Threads take contiguous runs of tiles, so the line ahead past a tile's end is the next tile's.
 *         Read when a kernel is built; another value is a ValueError naming the variable. */
constexpr const char* kPrefetchVariable = "BYOC_HETERO_WQ_PREFETCH";
int64_t PrefetchBytes();
/*! \brief The form a call of many rows (kPanelMinRows or more, quad layout, an AVX-512 integer kernel) runs:
 *         kNone: the integer tile kernels (QTileFn) as at any rows; kFloat: panels dequantized to float32
 *         (PanelFns); kInt: the integer panel GEMM (QPanelFn), the rows quantized by one thread, the epilogue in
 *         scalar C++ after each call; kIntFused: the same kernel with the epilogue written by the kernel
 *         (QPanelOut), its results kInt's bit for bit.  Chosen by BYOC_HETERO_WQ_PANELS = 0 | 1 or float | int |
 *         int-fused (or unset), read when a plan is made; BYOC_HETERO_WQ_ACT other than unset or auto keeps kNone;
 *         another value of the variable is a ValueError naming it.  kIntFused is the default: quiet A/B, Zen 5,
 *         Qwen2.5-0.5B prefill, 2 threads, 1.17-1.28x kInt at 128 and 1024 rows, int8 and int4 (bench/GENERATE.md,
 *         session 15 end), kInt itself 1.14-1.26x the tile kernels (session 14 end); kFloat stays opt-in
 *         (0.68-1.05x on session 13's loaded Skylake). */
enum class PanelForm { kNone, kFloat, kInt, kIntFused };
constexpr const char* kPanelVariable = "BYOC_HETERO_WQ_PANELS";
PanelForm PanelsAsked();

/*! \brief What one integer micro-kernel call computes: rows [r0, r0 + rows) of tile t, quad layout. */
struct QTileJob {
  const int8_t* xq;      // row r0's activation codes (row stride k)
  const float* xs;       // row r0's scale per activation block (row stride k / kActBlock)
  const float* xss;      // row r0's scale * sum of codes per activation block (same strides)
  const uint8_t* codes;  // tile t's codes (quad layout)
  const float* scales;   // tile t's scales [blocks][16]
  const float* zeros;    // tile t's zero points [blocks][16], or null: zero for every code
  float zero;            // the unsigned code's zero point (8-bit signed weights: 128)
  int64_t k, block, rows;
  float* out;            // rows x 16 floats, row stride 16
  const uint16_t* half_scales = nullptr;  // when set: tile t's scales as float16 [blocks][16] (scales unused)
  const float* offsets = nullptr;         // tile t's offsets [blocks][16] (+ o * xss per block), or null
  int64_t prefetch = 0;                   // bytes ahead of the codes read to prefetch (a multiple of 64), 0: none
};
using QTileFn = void (*)(const QTileJob& job);
QTileFn FindQTileFn(IntDot dot, int bits);
/*! \brief BYOC_HETERO_WQ_BLOCK32 = on | off (unset: on; quiet A/B, Zen 5, Qwen2.5-0.5B decode at 2 threads,
 *         interleaved: int8 g32 1.09x, int4 1.02x `off`'s tokens/s, bench/GENERATE.md session 17 end): whether
 *         the integer tile kernels of a node whose weight blocks are one activation block (block = kActBlock:
 *         llama.cpp's Q8_0 / Q4_0, from_hf's group_size=32) without zero points or offsets run FindBlock32Fn's
 *         kernels; read when a kernel is built; another value is a ValueError naming the variable. */
constexpr const char* kBlock32Variable = "BYOC_HETERO_WQ_BLOCK32";
bool Block32Asked();
/*! \brief Where the integer kernels read a tile's scales: float32 or float16 tiles of their own (QTileJob::scales,
 *         half_scales), or float16 inside the codes (kInline, the inline layout below). */
enum class ScaleForm { kFloat, kHalf, kInline };
/*! \brief The inline layout (BYOC_HETERO_WQ_BLOCK32=on, 8- or 4-bit codes in blocks of kActBlock, float16 scales, no
 *         zero points or offsets, the AVX-512 integer kernels): each tile's quad-layout codes with the scales in the
 *         same stream, as llama.cpp's block_q8_0 / block_q4_0 keep each block's scale beside its codes, per pair of
 *         blocks (b, b + 1) one 64-byte line of their 2 x 16 float16 scales (the second half zero where b is the last
 *         block), then block b's codes (512 bytes at 8 bits, 256 at 4), then block b + 1's: one sequential stream a
 *         thread, every load 64-byte aligned.  A tile is k * 2 * bits + ceil(blocks / 2) * 64 bytes. */
constexpr int64_t kInlineLineBytes = 64;
inline int64_t InlineTileBytes(int64_t k, int bits) {
  return k * 2 * bits + (k / kActBlock + 1) / 2 * kInlineLineBytes;
}
/*! \brief The tile kernels of \p dot (AVX-512 or AVX2 ones; else null; kInline: AVX-512 only) for weight blocks of
 *         kActBlock without zero points or offsets, their scales as \p scales says: one loop over the blocks with the
 *         zero point and the scales' form fixed, the general kernels' float operations in their order (their results
 *         bit for bit). */
QTileFn FindBlock32Fn(IntDot dot, int bits, ScaleForm scales);

// ---- many rows: panels of codes dequantized, float32 products (dense_wq_panel.cc) -----------------

/*! \brief Rows from which a call with the quad layout on AVX-512 (PanelsAsked) runs panels instead of the
 *         integer kernels: a prefill's rows.  Per panel of kPanelTiles tiles, the codes
 *         are dequantized into a float32 [K][32] scratch once a call (K x 32 weights, 1 / M of the
 *         products), and the rows multiply it kPanelRows at a time as float32 (24 accumulators: the
 *         FMA-bound shape of a float GEMM on AVX-512), with the exact, unquantized activations. */
constexpr int64_t kPanelMinRows = 16;
constexpr int64_t kPanelTiles = 2;
constexpr int64_t kPanelWidth = kPanelTiles * kTile;
constexpr int kPanelRows = 12;

/*! \brief One tile of the quad layout and its per-block values, dequantized as (code - z) * s + o. */
struct QuadTile {
  const uint8_t* codes;          // the tile's codes (quad layout)
  const float* scales;           // [blocks][16] float32, or null: half_scales
  const uint16_t* half_scales;   // [blocks][16] float16 bits (used when scales is null)
  const float* zeros;            // [blocks][16], or null: zero for every code
  float zero;
  const float* offsets;          // [blocks][16], or null: none
  int64_t k, block;
};

/*! \brief y[r][c] = bias[c] + sum_k x[r][k] * w[k][c] for rows < rows and columns c < cols (<= kPanelWidth). */
struct PanelJob {
  const float* x;     // row r at x + r * k
  const float* w;     // [k][kPanelWidth] dequantized weights
  const float* bias;  // cols floats, or null
  float* y;           // row r at y + r * ldy
  int64_t k, ldy, rows, cols;
};

/*! \brief The panel form's two functions: one tile dequantized into w (row stride kPanelWidth), and the
 *         float32 products of up to kPanelRows rows; null where the CPU has no AVX-512F. */
struct PanelFns {
  void (*dequantize)(const QuadTile& tile, float* w) = nullptr;
  void (*multiply)(const PanelJob& job) = nullptr;
};
PanelFns FindPanelFns(int bits);

// ---- many rows: the integer panel GEMM (dense_wq_qpanel.cc) -------------------------------------------

/*! \brief Rows one call of the integer panel kernel keeps in registers: with kPanelTiles tiles, 12 int32
 *         accumulators (one activation block's integer sums) and 12 float32 totals.  The tile kernels hold one
 *         tile x 4 rows: 4 dependent VPDPBUSD chains, one weight vector per 4 products; the panel holds 12
 *         chains, and each weight vector (and each broadcast activation word) feeds 6 (2) products. */
constexpr int kQPanelRows = 6;

/*! \brief The epilogue of kIntFused's panel calls, y = ((x W + bias) * gate) + residual, each where the node has
 *         it, in the float32 operations (and order) of the tile kernels' scalar epilogue: their results bit for bit;
 *         written by the kernel row by row (plain AVX-512 stores, the panel's last partial tile masked). */
struct QPanelOut {
  float* y;             // row r0, the panel's first column (row stride ldy); holds the residual with residual
  const float* bias;    // the panel's first column's bias, or null
  const float* gate;    // row r0, the panel's first column of the gate (row stride ldy), or null
  int64_t ldy, cols;    // the output's row stride (N); the panel's columns (1..kPanelWidth)
  bool residual;
};

/*! \brief What one integer panel call computes: rows [r0, r0 + rows) of tiles t0 and t0 + second (second 0:
 *         the panel's last tile is t0, computed twice, the copy unused), the same sums in the same float
 *         operations as QTileFn's (the results are bit for bit the tile kernels'; per-channel weights: see
 *         FindQPanelFn's fold). */
struct QPanelJob {
  const int8_t* xq;      // row r0's activation codes (row stride k)
  const float* xs;       // row r0's scale per activation block (row stride k / kActBlock)
  const float* xss;      // row r0's scale * sum of codes per activation block (same strides)
  const uint8_t* codes;  // tile t0's codes (quad layout); tile t0 + second at + second * k * 2 * bits (a tile's bytes)
  const float* scales;   // tile t0's scales [blocks][16] (null: half_scales); the next tile's at + blocks * 16
  const uint16_t* half_scales;  // tile t0's float16 scales, or null
  const float* zeros;    // tile t0's zero points [blocks][16], or null: zero for every code
  float zero;
  const float* offsets;  // tile t0's offsets [blocks][16], or null
  int64_t k, block, rows, second;
  float* out;            // [kPanelTiles][kQPanelRows][16]: tile i's row r at out + (i * kQPanelRows + r) * 16
  const QPanelOut* direct = nullptr;  // kIntFused: the kernel writes the epilogue into the output (else out)
};
using QPanelFn = void (*)(const QPanelJob& job);

/*! \brief The panel kernel of \p dot (an AVX-512 one: VNNI or BW) for \p bits, else null.  \p fold (one weight
 *         block, no offsets: per-channel weights): the scale and zero point applied once after the sum over K
 *         (one FMA per activation block and column instead of three; the same sums, rounded in another order). */
QPanelFn FindQPanelFn(IntDot dot, int bits, bool fold);
/*! \brief The panel kernel (not folded) of \p dot (AVX-512 VNNI or BW, else null) for \p bits codes in the inline
 *         layout (FindBlock32Fn's kInline): QPanelJob::codes is tile t0's start, the next tile InlineTileBytes(k, bits)
 *         on; scales, half_scales, zeros and offsets unused; the results FindQPanelFn's on the same codes and scales
 *         bit for bit. */
QPanelFn FindInlineQPanelFn(IntDot dot, int bits);

/*! \brief IEEE half -> float, exactly (subnormals, infinities and NaN included). */
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  float value;
  if (exp == 0) {
    value = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
  } else if (exp == 31) {
    value = mant == 0 ? INFINITY : NAN;
  } else {
    value = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  bits |= sign;
  std::memcpy(&value, &bits, sizeof(bits));
  return value;
}

/*! \brief Node input \p k of \p ctx holds one value per row and block: [n, blocks], or [n, blocks, 1] (the
 *         shape the Relax form broadcasts, which the partition may have folded a reshape into); else a
 *         ValueError naming \p name (dense_wq's and take_wq's scales, zero points and offsets). */
void ExpectPerBlock(const KernelContext& ctx, size_t k, const char* name, int64_t n, int64_t blocks);

/*! \brief The code layout's attrs, which dense_wq and take_wq both read (bits, block, has_zero_point, has_offset),
 *  into \p s; failures name the attr. A template on the reader so that this header needs no kernel API. */
template <typename Reader, typename Shape>
void ReadCodeAttrs(Reader& attrs, Shape* s) {
  s->bits = static_cast<int>(attrs.Int("bits", 0));
  if (s->bits != 4 && s->bits != 8) attrs.Fail("bits", "expected 4 or 8, got " + std::to_string(s->bits));
  s->block = attrs.Int("block", 0);
  s->has_zero_point = attrs.Flag("has_zero_point", false);
  s->has_offset = attrs.Flag("has_offset", false);
  if (s->has_zero_point && s->has_offset) attrs.Fail("has_offset", "expected zero points or offsets, not both");
}

/*! \brief Quantizes \p rows rows of \p x [rows, k] per kActBlock: codes, scales, scale * code sums; in the registers
 *         of \p dot's ISA (AVX-512 or AVX2; the same bytes and floats as the portable loops, kGeneric). */
void QuantizeRows(const float* x, int64_t rows, int64_t k, int8_t* xq, float* xs, float* xss,
                  IntDot dot = IntDot::kGeneric);

}  // namespace wq
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_DENSE_WQ_H_
