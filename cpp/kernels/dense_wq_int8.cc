/*!
 * \file kernels/dense_wq_int8.cc
 * \brief The int8-activation micro-kernels of dense_wq (dense_wq.h): the data rows quantized per
 *        block of 32 along K, integer dot products with the weight codes in the quad layout, one
 *        float multiply per 32 k and column.  AVX-512 VNNI (VPDPBUSD), AVX-512BW, AVX-VNNI (VPDPBUSD on
 *        256 bits) and AVX2 (VPMADDUBSW + VPMADDWD) and portable C++, each with its own target attribute; the choice is
 *        made at run time (SelectIntDot).
 */
#include <immintrin.h>

// GCC 12's "'__Y' may be used uninitialized" inside avx512fintrin.h: a false positive of the headers
// (as in dense_wq_micro.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <tvm/ffi/error.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "dense_wq.h"
#include "env_switch.h"

namespace byoc_hetero {
namespace wq {

namespace {

constexpr int64_t kQuadBytes = 64;  // one quad of a tile: 16 columns x 4 bytes

/*! \brief 4 activation codes as one 32-bit lane value. */
inline int32_t Load4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// ---- AVX-512BW, with or without VNNI: one 16-lane int32 accumulator per row ---------------------
// One target for both (VNNI's instruction is used only where Vnni is true; the BW kernels are
// checked for it by tests/test_weight_only.py running them on a CPU without VNNI).

#define WQ_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

/*! \brief acc[r] += sum over one activation block (32 k) of x * (code - bias), 8-bit codes: the BW form
 *         computes w * x with w = code - 128 (|w| unsigned times x with w's sign), the VNNI one code * x. */
template <int R, bool Vnni>
WQ_AVX512_TARGET inline const uint8_t* Dot512x8(const uint8_t* q, const int8_t* x, int64_t ldx, int64_t pf,
                                                __m512i* acc) {
  const __m512i ones = _mm512_set1_epi16(1), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int g = 0; g < kActBlock / 4; ++g, q += kQuadBytes) {
    if (pf != 0) _mm_prefetch(reinterpret_cast<const char*>(q + pf), _MM_HINT_T0);
    const __m512i w = _mm512_loadu_si512(q);
    if constexpr (Vnni) {
      const __m512i u = _mm512_xor_si512(w, flip);
      for (int r = 0; r < R; ++r) acc[r] = _mm512_dpbusd_epi32(acc[r], u, _mm512_set1_epi32(Load4(x + r * ldx + 4 * g)));
    } else {
      const __m512i aw = _mm512_abs_epi8(w);
      const __mmask64 neg = _mm512_movepi8_mask(w);
      for (int r = 0; r < R; ++r) {
        const __m512i xb = _mm512_set1_epi32(Load4(x + r * ldx + 4 * g));
        const __m512i sx = _mm512_mask_sub_epi8(xb, neg, _mm512_setzero_si512(), xb);
        acc[r] = _mm512_add_epi32(acc[r], _mm512_madd_epi16(_mm512_maddubs_epi16(aw, sx), ones));
      }
    }
  }
  return q;
}

/*! \brief The same for 4-bit codes (unsigned, 0..15): the BW form sums the block's 8 pair products
 *         per 16-bit lane first (at most 8 * 2 * 15 * 127 < 2^15), then widens once. */
template <int R, bool Vnni>
WQ_AVX512_TARGET inline const uint8_t* Dot512x4(const uint8_t* q, const int8_t* x, int64_t ldx, int64_t pf,
                                                __m512i* acc) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  __m512i p16[R];
  for (int r = 0; r < R; ++r) p16[r] = _mm512_setzero_si512();
  for (int g = 0; g < kActBlock / 8; ++g, q += kQuadBytes) {
    if (pf != 0) _mm_prefetch(reinterpret_cast<const char*>(q + pf), _MM_HINT_T0);
    const __m512i w = _mm512_loadu_si512(q);
    const __m512i lo = _mm512_and_si512(w, low), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
    for (int r = 0; r < R; ++r) {
      const __m512i x0 = _mm512_set1_epi32(Load4(x + r * ldx + 8 * g));
      const __m512i x1 = _mm512_set1_epi32(Load4(x + r * ldx + 8 * g + 4));
      if constexpr (Vnni) {
        acc[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[r], lo, x0), hi, x1);
      } else {
        p16[r] = _mm512_add_epi16(p16[r], _mm512_add_epi16(_mm512_maddubs_epi16(lo, x0), _mm512_maddubs_epi16(hi, x1)));
      }
    }
  }
  if constexpr (!Vnni) {
    for (int r = 0; r < R; ++r) acc[r] = _mm512_add_epi32(acc[r], _mm512_madd_epi16(p16[r], _mm512_set1_epi16(1)));
  }
  return q;
}

/*! \brief Block b's 16 column scales: float16 widened in the register, or float32. */
WQ_AVX512_TARGET inline __m512 Scales512(const QTileJob& j, int64_t b) {
  if (j.half_scales != nullptr) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(j.half_scales + b * kTile)));
  }
  return _mm512_loadu_ps(j.scales + b * kTile);
}

template <int Bits, int R, bool Vnni>
WQ_AVX512_TARGET void Tile512Q(const QTileJob& j) {
  __m512 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
  const uint8_t* q = j.codes;
  const int64_t per = j.block / kActBlock, xblocks = j.k / kActBlock;
  const float bias = Bits == 8 && !Vnni ? 128.f : 0.f;  // the BW form's codes are code - 128
  for (int64_t b = 0; b < j.k / j.block; ++b) {
    const __m512 z = _mm512_sub_ps(j.zeros != nullptr ? _mm512_loadu_ps(j.zeros + b * kTile) : _mm512_set1_ps(j.zero),
                                   _mm512_set1_ps(bias));
    const __m512 s = Scales512(j, b);
    for (int64_t a = b * per; a < (b + 1) * per; ++a) {
      __m512i acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_si512();
      q = Bits == 8 ? Dot512x8<R, Vnni>(q, j.xq + a * kActBlock, j.k, j.prefetch, acc)
                    : Dot512x4<R, Vnni>(q, j.xq + a * kActBlock, j.k, j.prefetch, acc);
      for (int r = 0; r < R; ++r) {  // total += s * sx * (acc - z * sum q_x)
        const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r]), _mm512_set1_ps(j.xs[r * xblocks + a]));
        total[r] = _mm512_fmadd_ps(_mm512_fnmadd_ps(z, _mm512_set1_ps(j.xss[r * xblocks + a]), v), s, total[r]);
        if (j.offsets != nullptr) {  // + o * sum x (the block's activations as quantized)
          total[r] = _mm512_fmadd_ps(_mm512_loadu_ps(j.offsets + b * kTile), _mm512_set1_ps(j.xss[r * xblocks + a]),
                                     total[r]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(j.out + r * kTile, total[r]);
}

/*! \brief Tile512Q for weight blocks of one activation block (kActBlock k: llama.cpp's Q8_0 / Q4_0 block) without
 *         zero points or offsets (FindBlock32Fn): one loop over the blocks, the zero point a constant, the scales'
 *         form fixed at compile time (\p Scales: float32 or float16 tiles of their own, or float16 inside the codes'
 *         stream, dense_wq.h's inline layout), float16 widened from memory by VCVTPH2PS; the same float operations in
 *         the same order as Tile512Q, so its results bit for bit. */
template <int Bits, int R, bool Vnni, ScaleForm Scales>
WQ_AVX512_TARGET void Tile512Q32(const QTileJob& j) {
  __m512 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
  const uint8_t* q = j.codes;
  const int64_t blocks = j.k / kActBlock;
  const __m512 z = _mm512_set1_ps(j.zero - (Bits == 8 && !Vnni ? 128.f : 0.f));  // small integers: exact
  const uint16_t* line = nullptr;  // the inline layout: the scale line of blocks a and a + 1 (a even)
  for (int64_t a = 0; a < blocks; ++a) {
    if (Scales == ScaleForm::kInline && a % 2 == 0) {
      line = reinterpret_cast<const uint16_t*>(q);
      q += kInlineLineBytes;
    }
    __m512i acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_si512();
    q = Bits == 8 ? Dot512x8<R, Vnni>(q, j.xq + a * kActBlock, j.k, j.prefetch, acc)
                  : Dot512x4<R, Vnni>(q, j.xq + a * kActBlock, j.k, j.prefetch, acc);
    const uint16_t* halves = Scales == ScaleForm::kInline ? line + (a % 2) * kTile : j.half_scales + a * kTile;
    const __m512 s = Scales == ScaleForm::kFloat ? _mm512_loadu_ps(j.scales + a * kTile)
                                                 : _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(halves)));
    for (int r = 0; r < R; ++r) {
      const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r]), _mm512_set1_ps(j.xs[r * blocks + a]));
      total[r] = _mm512_fmadd_ps(_mm512_fnmadd_ps(z, _mm512_set1_ps(j.xss[r * blocks + a]), v), s, total[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(j.out + r * kTile, total[r]);
}

// ---- AVX2: two 8-lane int32 accumulators per row (columns 0-7, 8-15) ----------------------------

// AVX-VNNI (VEX vpdpbusd on 256 bits: Alder Lake and later, Zen 5) is used only where Vnni is true, as above.
#define WQ_AVX2_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))  // every AVX2 CPU has F16C

/*! \brief Columns 8h..8h+7 of block b's scales: float16 widened in the register, or float32. */
WQ_AVX2_TARGET inline __m256 Scales256(const QTileJob& j, int64_t b, int h) {
  if (j.half_scales != nullptr) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(j.half_scales + b * kTile + 8 * h)));
  }
  return _mm256_loadu_ps(j.scales + b * kTile + 8 * h);
}

/*! \brief Dot512x8's AVX2 form, per half of the tile's 16 columns: w * x with w = code - 128 (|w| times x with
 *         w's sign), or with AVX-VNNI code * x in one instruction. */
template <int R, bool Vnni>
WQ_AVX2_TARGET inline const uint8_t* Dot256x8(const uint8_t* q, const int8_t* x, int64_t ldx, int64_t pf,
                                              __m256i (*acc)[2]) {
  const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int g = 0; g < kActBlock / 4; ++g, q += kQuadBytes) {
    if (pf != 0) _mm_prefetch(reinterpret_cast<const char*>(q + pf), _MM_HINT_T0);
    for (int h = 0; h < 2; ++h) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * h));
      if constexpr (Vnni) {
        const __m256i u = _mm256_xor_si256(w, flip);
        for (int r = 0; r < R; ++r) {
          acc[r][h] = _mm256_dpbusd_avx_epi32(acc[r][h], u, _mm256_set1_epi32(Load4(x + r * ldx + 4 * g)));
        }
      } else {
        const __m256i aw = _mm256_abs_epi8(w);
        for (int r = 0; r < R; ++r) {
          const __m256i sx = _mm256_sign_epi8(_mm256_set1_epi32(Load4(x + r * ldx + 4 * g)), w);
          acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones));
        }
      }
    }
  }
  return q;
}

/*! \brief Dot512x4's AVX2 form (the 16-bit pair sums widened once a block, or AVX-VNNI's 32-bit sums). */
template <int R, bool Vnni>
WQ_AVX2_TARGET inline const uint8_t* Dot256x4(const uint8_t* q, const int8_t* x, int64_t ldx, int64_t pf,
                                              __m256i (*acc)[2]) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  __m256i p16[R][2];
  for (int r = 0; r < R; ++r) p16[r][0] = p16[r][1] = _mm256_setzero_si256();
  for (int g = 0; g < kActBlock / 8; ++g, q += kQuadBytes) {
    if (pf != 0) _mm_prefetch(reinterpret_cast<const char*>(q + pf), _MM_HINT_T0);
    for (int h = 0; h < 2; ++h) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * h));
      const __m256i lo = _mm256_and_si256(w, low), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
      for (int r = 0; r < R; ++r) {
        const __m256i x0 = _mm256_set1_epi32(Load4(x + r * ldx + 8 * g));
        const __m256i x1 = _mm256_set1_epi32(Load4(x + r * ldx + 8 * g + 4));
        if constexpr (Vnni) {
          acc[r][h] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc[r][h], lo, x0), hi, x1);
        } else {
          p16[r][h] = _mm256_add_epi16(p16[r][h],
                                       _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1)));
        }
      }
    }
  }
  if constexpr (!Vnni) {
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < 2; ++h) acc[r][h] = _mm256_madd_epi16(p16[r][h], _mm256_set1_epi16(1));
  }
  return q;
}

template <int Bits, int R, bool Vnni>
WQ_AVX2_TARGET void Tile256Q(const QTileJob& j) {
  __m256 total[R][2];
  for (int r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm256_setzero_ps();
  const uint8_t* q = j.codes;
  const int64_t per = j.block / kActBlock, xblocks = j.k / kActBlock;
  const __m256 bias = _mm256_set1_ps(Bits == 8 && !Vnni ? 128.f : 0.f);  // the non-VNNI form's codes are code - 128
  for (int64_t b = 0; b < j.k / j.block; ++b) {
    __m256 z[2], s[2];
    for (int h = 0; h < 2; ++h) {
      z[h] = _mm256_sub_ps(j.zeros != nullptr ? _mm256_loadu_ps(j.zeros + b * kTile + 8 * h) : _mm256_set1_ps(j.zero), bias);
      s[h] = Scales256(j, b, h);
    }
    for (int64_t a = b * per; a < (b + 1) * per; ++a) {
      __m256i acc[R][2];
      for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
      q = Bits == 8 ? Dot256x8<R, Vnni>(q, j.xq + a * kActBlock, j.k, j.prefetch, acc)
                    : Dot256x4<R, Vnni>(q, j.xq + a * kActBlock, j.k, j.prefetch, acc);
      for (int r = 0; r < R; ++r) {
        const __m256 sx = _mm256_set1_ps(j.xs[r * xblocks + a]), sxs = _mm256_set1_ps(j.xss[r * xblocks + a]);
        for (int h = 0; h < 2; ++h) {
          const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][h]), sx);
          total[r][h] = _mm256_fmadd_ps(_mm256_fnmadd_ps(z[h], sxs, v), s[h], total[r][h]);
          if (j.offsets != nullptr) {
            total[r][h] = _mm256_fmadd_ps(_mm256_loadu_ps(j.offsets + b * kTile + 8 * h), sxs, total[r][h]);
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(j.out + r * kTile, total[r][0]);
    _mm256_storeu_ps(j.out + r * kTile + 8, total[r][1]);
  }
}

/*! \brief Tile256Q for weight blocks of one activation block without zero points or offsets (as Tile512Q32): its
 *         results bit for bit. */
template <int Bits, int R, bool Vnni, ScaleForm Scales>
WQ_AVX2_TARGET void Tile256Q32(const QTileJob& j) {
  static_assert(Scales != ScaleForm::kInline, "the inline layout is read by the AVX-512 kernels only");
  constexpr bool Half = Scales == ScaleForm::kHalf;
  __m256 total[R][2];
  for (int r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm256_setzero_ps();
  const uint8_t* q = j.codes;
  const int64_t blocks = j.k / kActBlock;
  const __m256 z = _mm256_set1_ps(j.zero - (Bits == 8 && !Vnni ? 128.f : 0.f));
  for (int64_t a = 0; a < blocks; ++a) {
    __m256i acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    q = Bits == 8 ? Dot256x8<R, Vnni>(q, j.xq + a * kActBlock, j.k, j.prefetch, acc)
                  : Dot256x4<R, Vnni>(q, j.xq + a * kActBlock, j.k, j.prefetch, acc);
    __m256 s[2];
    for (int h = 0; h < 2; ++h) {
      s[h] = Half ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(j.half_scales + a * kTile + 8 * h)))
                  : _mm256_loadu_ps(j.scales + a * kTile + 8 * h);
    }
    for (int r = 0; r < R; ++r) {
      const __m256 sx = _mm256_set1_ps(j.xs[r * blocks + a]), sxs = _mm256_set1_ps(j.xss[r * blocks + a]);
      for (int h = 0; h < 2; ++h) {
        const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][h]), sx);
        total[r][h] = _mm256_fmadd_ps(_mm256_fnmadd_ps(z, sxs, v), s[h], total[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(j.out + r * kTile, total[r][0]);
    _mm256_storeu_ps(j.out + r * kTile + 8, total[r][1]);
  }
}

// ---- portable C++: the quad layout read code by code --------------------------------------------

/*! \brief The unsigned code of column c at k (0 <= k < K) in a tile of the quad layout. */
template <int Bits>
int QuadCode(const uint8_t* tile, int64_t k, int c) {
  if constexpr (Bits == 8) return tile[(k / 4) * kQuadBytes + c * 4 + k % 4] ^ 0x80;
  return (tile[(k / 8) * kQuadBytes + c * 4 + k % 4] >> (4 * ((k % 8) / 4))) & 0x0F;
}

template <int Bits>
void TileGenericQ(const QTileJob& j) {
  const int64_t xblocks = j.k / kActBlock;
  for (int64_t r = 0; r < j.rows; ++r) {
    float total[kTile] = {};
    for (int64_t a = 0; a < xblocks; ++a) {
      const int64_t b = a * kActBlock / j.block;
      int32_t acc[kTile] = {};
      for (int64_t k = a * kActBlock; k < (a + 1) * kActBlock; ++k)
        for (int c = 0; c < kTile; ++c) acc[c] += j.xq[r * j.k + k] * QuadCode<Bits>(j.codes, k, c);
      for (int c = 0; c < kTile; ++c) {
        const float z = j.zeros != nullptr ? j.zeros[b * kTile + c] : j.zero;
        const float s = j.half_scales != nullptr ? HalfToFloat(j.half_scales[b * kTile + c]) : j.scales[b * kTile + c];
        total[c] += s * (static_cast<float>(acc[c]) * j.xs[r * xblocks + a] - z * j.xss[r * xblocks + a]);
        if (j.offsets != nullptr) total[c] += j.offsets[b * kTile + c] * j.xss[r * xblocks + a];
      }
    }
    std::copy(total, total + kTile, j.out + r * kTile);
  }
}

/*! \brief Dispatches a job's row count (1..kMaxRows) to the block-of-kActBlock kernel instantiated for it (as
 *         ByRows512 / ByRows256 do for the general ones). */
template <int Bits, bool Vnni, ScaleForm Scales>
void ByRows512x32(const QTileJob& j) {
  switch (j.rows) {
    case 1: return Tile512Q32<Bits, 1, Vnni, Scales>(j);
    case 2: return Tile512Q32<Bits, 2, Vnni, Scales>(j);
    case 3: return Tile512Q32<Bits, 3, Vnni, Scales>(j);
    default: return Tile512Q32<Bits, 4, Vnni, Scales>(j);
  }
}
template <int Bits, bool Vnni, ScaleForm Scales>
void ByRows256x32(const QTileJob& j) {
  switch (j.rows) {
    case 1: return Tile256Q32<Bits, 1, Vnni, Scales>(j);
    case 2: return Tile256Q32<Bits, 2, Vnni, Scales>(j);
    case 3: return Tile256Q32<Bits, 3, Vnni, Scales>(j);
    default: return Tile256Q32<Bits, 4, Vnni, Scales>(j);
  }
}
/*! \brief One ISA's block-of-32 kernel for \p bits and \p scales (the AVX2 ones: not inline, null). */
template <bool Avx512, bool Vnni, int Bits>
QTileFn Block32For(ScaleForm scales) {
  if constexpr (Avx512) {
    switch (scales) {
      case ScaleForm::kFloat: return ByRows512x32<Bits, Vnni, ScaleForm::kFloat>;
      case ScaleForm::kHalf: return ByRows512x32<Bits, Vnni, ScaleForm::kHalf>;
      default: return ByRows512x32<Bits, Vnni, ScaleForm::kInline>;
    }
  } else {
    switch (scales) {
      case ScaleForm::kFloat: return ByRows256x32<Bits, Vnni, ScaleForm::kFloat>;
      case ScaleForm::kHalf: return ByRows256x32<Bits, Vnni, ScaleForm::kHalf>;
      default: return nullptr;
    }
  }
}
template <bool Avx512, bool Vnni>
QTileFn Block32Of(int bits, ScaleForm scales) {
  return bits == 8 ? Block32For<Avx512, Vnni, 8>(scales) : Block32For<Avx512, Vnni, 4>(scales);
}

template <int Bits, bool Vnni>
void ByRows512(const QTileJob& j) {
  switch (j.rows) {
    case 1: return Tile512Q<Bits, 1, Vnni>(j);
    case 2: return Tile512Q<Bits, 2, Vnni>(j);
    case 3: return Tile512Q<Bits, 3, Vnni>(j);
    default: return Tile512Q<Bits, 4, Vnni>(j);
  }
}
template <int Bits, bool Vnni>
void ByRows256(const QTileJob& j) {
  switch (j.rows) {
    case 1: return Tile256Q<Bits, 1, Vnni>(j);
    case 2: return Tile256Q<Bits, 2, Vnni>(j);
    case 3: return Tile256Q<Bits, 3, Vnni>(j);
    default: return Tile256Q<Bits, 4, Vnni>(j);
  }
}

bool CpuHas(const char* feature) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (std::strcmp(feature, "avx512bw") == 0) return __builtin_cpu_supports("avx512bw");
  if (std::strcmp(feature, "avx512vnni") == 0) return __builtin_cpu_supports("avx512vnni");
  if (std::strcmp(feature, "avxvnni") == 0) return __builtin_cpu_supports("avxvnni");
#endif
  return false;
}

// ---- the activations' quantization (QuantizeRows), one block of kActBlock at a time ---------------

/*! \brief 127 / max |x| of a block, 0 where that is no finite number (a block of zeros, or of values so small,
 *         below 127 / FLT_MAX, that it overflows): the block's codes are then 0. */
inline float Inverse127(float amax) {
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  return inv <= std::numeric_limits<float>::max() ? inv : 0.f;
}

/*! \brief One block: codes round-half-even(x * 127 / max |x|), *scale = max |x| / 127, *scaled_sum = scale * sum of
 *         codes; a NaN or infinity in the block makes the scale NaN (so the outputs NaN, as the float path's). */
void QuantizeBlock(const float* src, int8_t* dst, float* scale, float* scaled_sum) {
  // round half to even without a libm call: adding and subtracting 1.5 * 2^23 rounds |v| < 2^22 to an
  // integer in the default rounding mode (the file is built without fast-math, so nothing reassociates)
  constexpr float kMagic = 12582912.f;
  float amax = 0.f, probe = 0.f;  // probe: NaN when the block holds a NaN or an infinity
  for (int64_t i = 0; i < kActBlock; ++i) {
    amax = std::max(amax, std::fabs(src[i]));
    probe += src[i] * 0.f;
  }
  const bool finite = probe == 0.f;
  const float inv = finite ? Inverse127(amax) : 0.f;
  int32_t sum = 0;
  for (int64_t i = 0; i < kActBlock; ++i) {
    const int32_t v = static_cast<int32_t>((src[i] * inv + kMagic) - kMagic);
    dst[i] = static_cast<int8_t>(v);
    sum += v;
  }
  *scale = finite ? amax / 127.f : NAN;
  *scaled_sum = *scale * static_cast<float>(sum);
}

/*! \brief QuantizeBlock in AVX-512 registers, the same bytes and floats (max |x| and the code sum are exact in any
 *         order; VCVTPS2DQ rounds half to even as the magic constant does); a block with a NaN or an infinity goes
 *         to QuantizeBlock.  (The scalar loops do not vectorize: their float max and sum are ordered reductions.) */
WQ_AVX512_TARGET void QuantizeBlock512(const float* src, int8_t* dst, float* scale, float* scaled_sum) {
  static_assert(kActBlock == 32, "two AVX-512 vectors a block");
  const __m512 v0 = _mm512_loadu_ps(src), v1 = _mm512_loadu_ps(src + 16), zero = _mm512_setzero_ps();
  const __mmask16 bad = _mm512_cmp_ps_mask(_mm512_mul_ps(v0, zero), zero, _CMP_NEQ_UQ) |
                        _mm512_cmp_ps_mask(_mm512_mul_ps(v1, zero), zero, _CMP_NEQ_UQ);
  if (bad != 0) return QuantizeBlock(src, dst, scale, scaled_sum);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const __m512 inv = _mm512_set1_ps(Inverse127(amax));
  const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm512_cvtepi32_epi8(q1));
  *scale = amax / 127.f;
  *scaled_sum = *scale * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
}

/*! \brief QuantizeBlock in AVX2 registers (as QuantizeBlock512, four vectors a block). */
WQ_AVX2_TARGET void QuantizeBlock256(const float* src, int8_t* dst, float* scale, float* scaled_sum) {
  const __m256 zero = _mm256_setzero_ps(), abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 v[4], m = zero;
  int bad = 0;
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(src + 8 * i);
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(_mm256_mul_ps(v[i], zero), zero, _CMP_NEQ_UQ));
    m = _mm256_max_ps(m, _mm256_and_ps(v[i], abs_mask));
  }
  if (bad != 0) return QuantizeBlock(src, dst, scale, scaled_sum);
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
  const __m256 inv = _mm256_set1_ps(Inverse127(amax));
  __m256i q[4], sum = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
    sum = _mm256_add_epi32(sum, q[i]);
  }
  // |codes| <= 127: the saturating packs are exact; they interleave 128-bit lanes, which the permute undoes
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  *scale = amax / 127.f;
  *scaled_sum = *scale * static_cast<float>(_mm_cvtsi128_si32(s4));
}

}  // namespace

const char* IntDotName(IntDot dot) {
  switch (dot) {
    case IntDot::kAvx512Vnni: return "avx512 vnni";
    case IntDot::kAvx512Bw: return "avx512bw";
    case IntDot::kAvx2Vnni: return "avx2 vnni";
    case IntDot::kAvx2: return "avx2";
    case IntDot::kGeneric: return "generic";
    default: return "none";
  }
}

/*! \brief BYOC_HETERO_WQ_VNNI: auto (or unset) lets SelectIntDot take VNNI where the CPU has it, off (or 0) never. */
bool VnniAllowed() {
  const char* env = std::getenv(kVnniVariable);
  const std::string mode = env == nullptr || *env == '\0' ? "auto" : env;
  if (mode != "auto" && mode != "off" && mode != "0") {
    TVM_FFI_THROW(ValueError) << kVnniVariable << " must be auto, off or 0, got '" << mode << "'";
  }
  return mode == "auto";
}

IntDot SelectIntDot(Isa isa, int64_t block) {
  const char* env = std::getenv(kActVariable);
  const std::string mode = env == nullptr || *env == '\0' ? "auto" : env;
  if (mode != "auto" && mode != "int8" && mode != "f32") {
    TVM_FFI_THROW(ValueError) << kActVariable << " must be auto, int8 or f32, got '" << mode << "'";
  }
  if (mode == "f32" || block % kActBlock != 0) return IntDot::kNone;
  const bool vnni = VnniAllowed();
  if (isa == Isa::kAvx512 && CpuHas("avx512bw")) {
    return vnni && CpuHas("avx512vnni") ? IntDot::kAvx512Vnni : IntDot::kAvx512Bw;
  }
  if (isa == Isa::kAvx512 || isa == Isa::kAvx2) {  // every AVX-512F CPU has AVX2
    return vnni && CpuHas("avxvnni") ? IntDot::kAvx2Vnni : IntDot::kAvx2;
  }
  return IntDot::kGeneric;
}

int64_t PrefetchBytes() {
  const char* env = std::getenv(kPrefetchVariable);
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  if (*end != '\0' || v < 0 || v > 65536 || v % 64 != 0) {
    TVM_FFI_THROW(ValueError) << kPrefetchVariable << " must be a multiple of 64 from 0 to 65536 (bytes), got '" << env
                              << "'";
  }
  return v;
}

PanelForm PanelsAsked() {
  const char* env = std::getenv(kPanelVariable);
  const std::string form = env == nullptr || *env == '\0' ? "int-fused" : env;
  PanelForm asked = PanelForm::kNone;
  if (form == "1" || form == "float") {
    asked = PanelForm::kFloat;
  } else if (form == "int") {
    asked = PanelForm::kInt;
  } else if (form == "int-fused") {
    asked = PanelForm::kIntFused;
  } else if (form != "0") {
    TVM_FFI_THROW(ValueError) << kPanelVariable << " must be 0, 1 (or float), int or int-fused, got '" << form << "'";
  }
  const char* act = std::getenv(kActVariable);
  const bool act_auto = act == nullptr || *act == '\0' || std::string(act) == "auto";
  return act_auto ? asked : PanelForm::kNone;
}

QTileFn FindQTileFn(IntDot dot, int bits) {
  switch (dot) {
    case IntDot::kAvx512Vnni: return bits == 8 ? ByRows512<8, true> : ByRows512<4, true>;
    case IntDot::kAvx512Bw: return bits == 8 ? ByRows512<8, false> : ByRows512<4, false>;
    case IntDot::kAvx2Vnni: return bits == 8 ? ByRows256<8, true> : ByRows256<4, true>;
    case IntDot::kAvx2: return bits == 8 ? ByRows256<8, false> : ByRows256<4, false>;
    default: return bits == 8 ? TileGenericQ<8> : TileGenericQ<4>;
  }
}

bool Block32Asked() { return EnvSwitch(kBlock32Variable, "on", "off", true); }

QTileFn FindBlock32Fn(IntDot dot, int bits, ScaleForm scales) {
  switch (dot) {
    case IntDot::kAvx512Vnni: return Block32Of<true, true>(bits, scales);
    case IntDot::kAvx512Bw: return Block32Of<true, false>(bits, scales);
    case IntDot::kAvx2Vnni: return Block32Of<false, true>(bits, scales);
    case IntDot::kAvx2: return Block32Of<false, false>(bits, scales);
    default: return nullptr;
  }
}

void QuantizeRows(const float* x, int64_t rows, int64_t k, int8_t* xq, float* xs, float* xss, IntDot dot) {
  const int64_t xblocks = k / kActBlock;
  const bool avx512 = dot == IntDot::kAvx512Vnni || dot == IntDot::kAvx512Bw;
  const bool avx2 = dot == IntDot::kAvx2Vnni || dot == IntDot::kAvx2;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t a = 0; a < xblocks; ++a) {
      const int64_t i = r * k + a * kActBlock, b = r * xblocks + a;
      if (avx512) {
        QuantizeBlock512(x + i, xq + i, xs + b, xss + b);
      } else if (avx2) {
        QuantizeBlock256(x + i, xq + i, xs + b, xss + b);
      } else {
        QuantizeBlock(x + i, xq + i, xs + b, xss + b);
      }
    }
  }
}

}  // namespace wq
}  // namespace byoc_hetero
