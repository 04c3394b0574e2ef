/*!
 * \file kernels/dense_wq_panel.cc
 * \brief dense_wq's panel form for many rows (dense_wq.h, kPanelMinRows): a panel of kPanelTiles tiles
 *        of the quad layout dequantized into a float32 [K][32] scratch, then float32 products of
 *        kPanelRows rows at a time against it.  The integer kernels re-read and widen every code for
 *        every 4 rows and, without VNNI, take about as many instructions per multiply-add as a float
 *        FMA; at a prefill's rows the dequantization is 1 / M of the work and the products run as a
 *        float GEMM's register tile (12 rows x 32 columns: 24 accumulators, 2 weight loads and 12
 *        broadcasts per 24 FMAs).  AVX-512F, with its own target attributes (the extension builds for
 *        any x86-64; dense_wq.cc asks for it only where the int8-activation kernel is an AVX-512 one).
 */
#include <immintrin.h>

// GCC 12's "'__Y' may be used uninitialized" inside avx512fintrin.h: a false positive of the headers
// (as in dense_wq_micro.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstdint>

#include "dense_wq.h"

namespace byoc_hetero {
namespace wq {

namespace {

/*! \brief The mask of the first \p n of 16 lanes (n <= 0: none). */
inline __mmask16 FirstLanes(int64_t n) {
  if (n >= 16) return static_cast<__mmask16>(0xFFFF);
  return n > 0 ? static_cast<__mmask16>((1u << n) - 1u) : static_cast<__mmask16>(0);
}

/*! \brief w[k * kPanelWidth + c] = (code(k, c) - z) * s + o for the tile's 16 columns: 8-bit quads hold
 *         4 k per 32-bit lane (code - 128, signed bytes), 4-bit quads 8 k (k + i low nibble, k + 4 + i high). */
template <int Bits>
__attribute__((target("avx512f"))) void DequantizeQuad512(const QuadTile& t, float* w) {
  constexpr int64_t kPerQuad = Bits == 8 ? 4 : 8;
  const uint8_t* q = t.codes;
  const int64_t blocks = t.k / t.block;
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 s = t.scales != nullptr
                         ? _mm512_loadu_ps(t.scales + b * kTile)
                         : _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.half_scales + b * kTile)));
    const __m512 z = t.zeros != nullptr ? _mm512_loadu_ps(t.zeros + b * kTile) : _mm512_set1_ps(t.zero);
    const __m512 o = t.offsets != nullptr ? _mm512_loadu_ps(t.offsets + b * kTile) : _mm512_setzero_ps();
    for (int64_t k = b * t.block; k < (b + 1) * t.block; k += kPerQuad, q += 64) {
      const __m512i v = _mm512_loadu_si512(q);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        if constexpr (Bits == 8) {
          const __m512i c = _mm512_srav_epi32(_mm512_sllv_epi32(v, _mm512_set1_epi32(24 - 8 * i)), _mm512_set1_epi32(24));
          const __m512 code = _mm512_add_ps(_mm512_cvtepi32_ps(c), _mm512_set1_ps(128.f));
          _mm512_storeu_ps(w + (k + i) * kPanelWidth, _mm512_fmadd_ps(_mm512_sub_ps(code, z), s, o));
        } else {
          const __m512i nib = _mm512_set1_epi32(0x0F);
          const __m512i lo = _mm512_and_si512(_mm512_srlv_epi32(v, _mm512_set1_epi32(8 * i)), nib);
          const __m512i hi = _mm512_and_si512(_mm512_srlv_epi32(v, _mm512_set1_epi32(8 * i + 4)), nib);
          _mm512_storeu_ps(w + (k + i) * kPanelWidth, _mm512_fmadd_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(lo), z), s, o));
          _mm512_storeu_ps(w + (k + 4 + i) * kPanelWidth,
                           _mm512_fmadd_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(hi), z), s, o));
        }
      }
    }
  }
}

/*! \brief Rows [r0, r0 + R) of the job: the sum over k in one accumulator per row and 16 columns, then
 *         the bias; columns past cols masked (m0, m1). */
template <int R>
__attribute__((target("avx512f"))) void PanelTile512(const PanelJob& j, int64_t r0, __mmask16 m0, __mmask16 m1) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const float* x = j.x + r0 * j.k;
  for (int64_t kk = 0; kk < j.k; ++kk) {
    const __m512 w0 = _mm512_loadu_ps(j.w + kk * kPanelWidth), w1 = _mm512_loadu_ps(j.w + kk * kPanelWidth + kTile);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * j.k + kk]);
      acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
    }
  }
  const __m512 b0 = j.bias != nullptr ? _mm512_maskz_loadu_ps(m0, j.bias) : _mm512_setzero_ps();
  const __m512 b1 = j.bias != nullptr ? _mm512_maskz_loadu_ps(m1, j.bias + kTile) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r) {
    float* y = j.y + (r0 + r) * j.ldy;
    _mm512_mask_storeu_ps(y, m0, _mm512_add_ps(acc[r][0], b0));
    _mm512_mask_storeu_ps(y + kTile, m1, _mm512_add_ps(acc[r][1], b1));
  }
}

using PanelTileFn = void (*)(const PanelJob&, int64_t, __mmask16, __mmask16);
constexpr PanelTileFn kPanelTails[kPanelRows - 1] = {PanelTile512<1>, PanelTile512<2>, PanelTile512<3>, PanelTile512<4>,
                                                     PanelTile512<5>, PanelTile512<6>, PanelTile512<7>, PanelTile512<8>,
                                                     PanelTile512<9>, PanelTile512<10>, PanelTile512<11>};

/*! \brief Every row of the job, kPanelRows at a time (a shorter last tile). */
__attribute__((target("avx512f"))) void Multiply512(const PanelJob& j) {
  const __mmask16 m0 = FirstLanes(j.cols), m1 = FirstLanes(j.cols - kTile);
  int64_t r0 = 0;
  for (; r0 + kPanelRows <= j.rows; r0 += kPanelRows) PanelTile512<kPanelRows>(j, r0, m0, m1);
  if (r0 < j.rows) kPanelTails[j.rows - r0 - 1](j, r0, m0, m1);
}

}  // namespace

PanelFns FindPanelFns(int bits) {
  PanelFns fns;
  if (!__builtin_cpu_supports("avx512f")) return fns;
  fns.dequantize = bits == 8 ? DequantizeQuad512<8> : DequantizeQuad512<4>;
  fns.multiply = Multiply512;
  return fns;
}

}  // namespace wq
}  // namespace byoc_hetero
