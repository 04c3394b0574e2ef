/*!
 * \file kernels/dense_wq_micro.cc
 * \brief The micro-kernels of dense_wq (dense_wq.h): one tile of 16 columns times up to kMaxRows
 *        rows, codes unpacked to float32 in registers.  Each ISA's functions carry their own
 *        target attribute, so the extension is built for any x86-64 and SelectIsa picks at run time.
 */
#include <immintrin.h>

// GCC 12 warns "'__Y' may be used uninitialized" inside avx512fintrin.h's widening intrinsics (the
// undefined source of their unmasked forms): a false positive of the headers, not of this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstdlib>
#include <string>

#include <tvm/ffi/error.h>
#include "dense_wq.h"

namespace byoc_hetero {
namespace wq {

namespace {

/*! \brief k values one 16-byte step of a tile holds: one (8-bit) or a pair (4-bit, k low nibble, k + 1 high). */
template <int Bits>
constexpr int kPerStep = Bits == 8 ? 1 : 2;
constexpr int64_t kStepBytes = kTile;

// ---- AVX-512F: one 16-float vector per tile row ------------------------------------------------

/*! \brief The codes of one step as floats minus the zero point: w[g] for k + g. */
template <int Bits>
__attribute__((target("avx512f"))) inline void Codes512(const uint8_t* p, __m512 z, __m512* w) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  if constexpr (Bits == 8) {
    w[0] = _mm512_sub_ps(_mm512_cvtepi32_ps(v), z);
  } else {
    w[0] = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(0x0F))), z);
    w[1] = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), z);
  }
}

template <int Bits, int R>
__attribute__((target("avx512f"))) void Tile512(const TileJob& j) {
  constexpr int G = kPerStep<Bits>, S = 4 / G;  // S steps a loop: 4 k, 4 independent accumulators a row
  __m512 total[R];
  for (int r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
  const uint8_t* q = j.codes;
  const int64_t blocks = j.k / j.block;
  for (int64_t b = 0; b < blocks; ++b) {
    const __m512 z = j.zeros != nullptr ? _mm512_loadu_ps(j.zeros + b * kTile) : _mm512_set1_ps(j.zero);
    __m512 acc[R][4];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_setzero_ps();
    const float* x = j.x + b * j.block;
    int64_t kk = 0;
    for (; kk + 4 <= j.block; kk += 4, q += S * kStepBytes) {
      __m512 w[4];
#pragma GCC unroll 4
      for (int st = 0; st < S; ++st) Codes512<Bits>(q + st * kStepBytes, z, w + st * G);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * j.k + kk + u]), w[u], acc[r][u]);
    }
    for (; kk < j.block; kk += G, q += kStepBytes) {  // a block's tail (blocks hold whole steps)
      __m512 w[G];
      Codes512<Bits>(q, z, w);
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < G; ++g) acc[r][g] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * j.k + kk + g]), w[g], acc[r][g]);
    }
    const __m512 s = _mm512_loadu_ps(j.scales + b * kTile);
    for (int r = 0; r < R; ++r) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
      total[r] = _mm512_fmadd_ps(sum, s, total[r]);
    }
    if (j.offsets != nullptr) {
      const __m512 o = _mm512_loadu_ps(j.offsets + b * kTile);
      for (int r = 0; r < R; ++r) {
        total[r] = _mm512_fmadd_ps(_mm512_set1_ps(j.x_sums[r * (j.k / j.block) + b]), o, total[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(j.out + r * kTile, total[r]);
}

// ---- AVX2 + FMA: two 8-float vectors per tile row -----------------------------------------------

/*! \brief The codes of one step as floats minus the zero point: w[g][half] for k + g. */
template <int Bits>
__attribute__((target("avx2,fma"))) inline void Codes256(const uint8_t* p, __m256 z0, __m256 z1, __m256 (*w)[2]) {
  const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
  if constexpr (Bits == 8) {
    w[0][0] = _mm256_sub_ps(_mm256_cvtepi32_ps(v0), z0);
    w[0][1] = _mm256_sub_ps(_mm256_cvtepi32_ps(v1), z1);
  } else {
    const __m256i mask = _mm256_set1_epi32(0x0F);
    w[0][0] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, mask)), z0);
    w[0][1] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, mask)), z1);
    w[1][0] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), z0);
    w[1][1] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)), z1);
  }
}

/*! \brief acc[r][u] += x[r * ldx + u] * w[u] for the G k of one step (two halves each). */
template <int G, int R>
__attribute__((target("avx2,fma"))) inline void Fma256(const float* x, int64_t ldx, const __m256 (*w)[2],
                                                     __m256 (*acc)[2][2]) {
  for (int r = 0; r < R; ++r) {
    for (int g = 0; g < G; ++g) {
      const __m256 xv = _mm256_set1_ps(x[r * ldx + g]);
      acc[r][g][0] = _mm256_fmadd_ps(xv, w[g][0], acc[r][g][0]);
      acc[r][g][1] = _mm256_fmadd_ps(xv, w[g][1], acc[r][g][1]);
    }
  }
}

template <int Bits, int R>
__attribute__((target("avx2,fma"))) void Tile256(const TileJob& j) {
  constexpr int G = kPerStep<Bits>;  // 16 registers: R x 2 x 2 accumulators with R <= 4 (8-bit: 2 k a loop)
  __m256 total[R][2];
  for (int r = 0; r < R; ++r) total[r][0] = total[r][1] = _mm256_setzero_ps();
  const uint8_t* q = j.codes;
  const int64_t blocks = j.k / j.block;
  for (int64_t b = 0; b < blocks; ++b) {
    __m256 z0 = _mm256_set1_ps(j.zero), z1 = z0;
    if (j.zeros != nullptr) {
      z0 = _mm256_loadu_ps(j.zeros + b * kTile);
      z1 = _mm256_loadu_ps(j.zeros + b * kTile + 8);
    }
    __m256 acc[R][2][2];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < 2; ++u) acc[r][u][0] = acc[r][u][1] = _mm256_setzero_ps();
    const float* x = j.x + b * j.block;
    int64_t kk = 0;
    __m256 w[2][2];
    if constexpr (G == 1) {
      for (; kk + 2 <= j.block; kk += 2, q += 2 * kStepBytes) {  // two k into the two accumulator sets
        __m256 w1[2][2];
        Codes256<Bits>(q, z0, z1, w);
        Codes256<Bits>(q + kStepBytes, z0, z1, w1);
        w[1][0] = w1[0][0];
        w[1][1] = w1[0][1];
        Fma256<2, R>(x + kk, j.k, w, acc);
      }
    }
    for (; kk < j.block; kk += G, q += kStepBytes) {
      Codes256<Bits>(q, z0, z1, w);
      Fma256<G, R>(x + kk, j.k, w, acc);
    }
    const __m256 s0 = _mm256_loadu_ps(j.scales + b * kTile), s1 = _mm256_loadu_ps(j.scales + b * kTile + 8);
    for (int r = 0; r < R; ++r) {
      total[r][0] = _mm256_fmadd_ps(_mm256_add_ps(acc[r][0][0], acc[r][1][0]), s0, total[r][0]);
      total[r][1] = _mm256_fmadd_ps(_mm256_add_ps(acc[r][0][1], acc[r][1][1]), s1, total[r][1]);
    }
    if (j.offsets != nullptr) {
      const __m256 o0 = _mm256_loadu_ps(j.offsets + b * kTile), o1 = _mm256_loadu_ps(j.offsets + b * kTile + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 xs = _mm256_set1_ps(j.x_sums[r * (j.k / j.block) + b]);
        total[r][0] = _mm256_fmadd_ps(xs, o0, total[r][0]);
        total[r][1] = _mm256_fmadd_ps(xs, o1, total[r][1]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(j.out + r * kTile, total[r][0]);
    _mm256_storeu_ps(j.out + r * kTile + 8, total[r][1]);
  }
}

// ---- portable C++ (any x86-64: SSE2 baseline, whatever the compiler vectorizes) -----------------

template <int Bits, int R>
void TileGeneric(const TileJob& j) {
  constexpr int G = kPerStep<Bits>;
  float total[R][kTile] = {};
  const uint8_t* q = j.codes;
  for (int64_t b = 0; b < j.k / j.block; ++b) {
    float acc[R][kTile] = {};
    for (int64_t kk = 0; kk < j.block; kk += G, q += kStepBytes) {
      for (int g = 0; g < G; ++g) {
        float w[kTile];
        for (int c = 0; c < kTile; ++c) {
          const int code = Bits == 8 ? q[c] : (q[c] >> (4 * g)) & 0x0F;
          w[c] = static_cast<float>(code) - (j.zeros != nullptr ? j.zeros[b * kTile + c] : j.zero);
        }
        for (int r = 0; r < R; ++r) {
          const float xv = j.x[r * j.k + b * j.block + kk + g];
          for (int c = 0; c < kTile; ++c) acc[r][c] += xv * w[c];
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const float xs = j.offsets != nullptr ? j.x_sums[r * (j.k / j.block) + b] : 0.f;
      for (int c = 0; c < kTile; ++c) {
        const float offset = j.offsets != nullptr ? xs * j.offsets[b * kTile + c] : 0.f;
        total[r][c] += acc[r][c] * j.scales[b * kTile + c] + offset;
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kTile; ++c) j.out[r * kTile + c] = total[r][c];
}

/*! \brief Dispatches a job's row count (1..kMaxRows) to the kernel instantiated for it. */
template <template <int, int> class K, int Bits>
void ByRows(const TileJob& j) {
  switch (j.rows) {
    case 1:
      return K<Bits, 1>::Run(j);
    case 2:
      return K<Bits, 2>::Run(j);
    case 3:
      return K<Bits, 3>::Run(j);
    default:
      return K<Bits, 4>::Run(j);
  }
}
template <int Bits, int R>
struct Avx512K {
  static void Run(const TileJob& j) { Tile512<Bits, R>(j); }
};
template <int Bits, int R>
struct Avx2K {
  static void Run(const TileJob& j) { Tile256<Bits, R>(j); }
};
template <int Bits, int R>
struct GenericK {
  static void Run(const TileJob& j) { TileGeneric<Bits, R>(j); }
};

}  // namespace

TileFn FindTileFn(Isa isa, int bits) {
  switch (isa) {
    case Isa::kAvx512:
      return bits == 8 ? ByRows<Avx512K, 8> : ByRows<Avx512K, 4>;
    case Isa::kAvx2:
      return bits == 8 ? ByRows<Avx2K, 8> : ByRows<Avx2K, 4>;
    default:
      return bits == 8 ? ByRows<GenericK, 8> : ByRows<GenericK, 4>;
  }
}

}  // namespace wq
}  // namespace byoc_hetero
