/*!
 * \file kernels/kv_attention_micro.cc
 * \brief kv_attention's per-row attention (kv_attention.h): the head_dim dot products of the scores,
 *        exp of the shifted scores and the weighted sum of the value rows, in AVX-512 (16 lanes, the
 *        head_dim tail masked), AVX2 + FMA (8 lanes, a scalar tail) and generic C++.  Each ISA's
 *        functions carry their own target attribute, so the extension builds for any x86-64;
 *        SelectSimdIsa("BYOC_HETERO_KV_ISA") picks at run time (simd_isa.h).  The exp of the shifted scores and
 *        their sum are softmax_exp.h's, the same bits on every ISA (exactly 0 at and below ln(FLT_MIN), never a
 *        denormal; a NaN or +inf score makes the sum NaN, so the row's output is NaN, as IEEE arithmetic has it).
 *        Until session 16 each ISA had its own: the vector ones clamped at -87.3 (1.2e-38 for any lower score,
 *        and a NaN score became that), the scalar ones std::exp (denormals; NaN kept).
 *        The blocked form of a prefill (BlockJob, AVX-512 only): tiles of query vectors against the keys
 *        transposed in blocks of 16, so that a key or value row loaded once serves 8 or 4 vectors, where
 *        the per-row form loads every key and value row again for every query row.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#endif

// GCC 12 warns "'__Y' is used uninitialized" inside avx512fintrin.h's _mm512_reduce_add_ps (the undefined
// source of its unmasked extracts): a false positive of the headers, not of this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cmath>
#include "kv_attention.h"
#include "softmax_exp.h"

namespace byoc_hetero {
namespace kv {

namespace {

/*! \brief The maximum of scores[first..last]: the shift of the softmax. */
float MaxOf(const float* w, int64_t first, int64_t last) {
  float top = -INFINITY;
  for (int64_t j = first; j <= last; ++j) top = std::max(top, w[j]);
  return top;
}

// ---- generic C++ (OpenMP simd: SSE2 on any x86-64) -------------------------------------------------

void RowGeneric(const RowJob& j) {
  const int64_t d = j.dim;
  for (int64_t k = j.first; k <= j.last; ++k) {
    const float* kr = j.keys + k * d;
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t e = 0; e < d; ++e) dot += j.q[e] * kr[e];
    j.scores[k] = dot * j.scale;
  }
  const float top = MaxOf(j.scores, j.first, j.last);
  const float sum = softmax_exp::ExpSumGeneric(j.scores + j.first, j.last - j.first + 1, top);
  std::fill(j.out, j.out + d, 0.f);
  for (int64_t k = j.first; k <= j.last; ++k) {
    const float p = j.scores[k];
    const float* vr = j.values + k * d;
#pragma omp simd
    for (int64_t e = 0; e < d; ++e) j.out[e] += p * vr[e];
  }
  const float inv = 1.f / sum;
  for (int64_t e = 0; e < d; ++e) j.out[e] *= inv;
  if (j.stats != nullptr) {
    j.stats[0] = top;
    j.stats[1] = sum;
  }
}

#if defined(__x86_64__)
// ---- AVX-512F: 16 lanes, the head_dim tail masked -------------------------------------------------

/*! \brief Lane i of the result: the sum of a[i]'s 16 lanes (a transpose-add tree: 15 adds for 16 sums,
 *         where one _mm512_reduce_add_ps per vector is a dependent chain of its own). */
__attribute__((target("avx512f"))) inline __m512 Sum16(const __m512 (&a)[16]) {
  __m512 pairs[8];  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] of vectors 2i, 2i + 1
  for (int i = 0; i < 8; ++i) {
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  }
  __m512 quads[4];  // per 128-bit lane: the lane's sums of vectors 4i .. 4i + 3
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(pairs[2 * i]), y = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // the four 128-bit lanes summed: lanes 0 + 1 and 2 + 3, then those two
  __m512 halves[2];
  for (int i = 0; i < 2; ++i) {
    halves[i] = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(halves[0], halves[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(halves[0], halves[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/*! \brief The mask of the 16 lanes from offset \p e of a row of \p d floats (0 past its end). */
inline __mmask16 LanesFrom(int64_t e, int64_t d) {
  if (e + 16 <= d) return static_cast<__mmask16>(0xFFFF);
  return e < d ? static_cast<__mmask16>((1u << (d - e)) - 1u) : static_cast<__mmask16>(0);
}

/*! \brief scores[k] = scale * q . keys[k] for k in [first, last]: 16 keys at a time, each its own
 *         accumulator (independent FMAs, not one dependent chain per key), summed by Sum16. */
__attribute__((target("avx512f"))) void Scores512(const RowJob& j) {
  const int64_t d = j.dim;
  const __m512 scale = _mm512_set1_ps(j.scale);
  int64_t k = j.first;
  for (; k + 16 <= j.last + 1; k += 16) {
    __m512 acc[16];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (int64_t e = 0; e < d; e += 16) {
      const __mmask16 m = LanesFrom(e, d);
      const __m512 q = _mm512_maskz_loadu_ps(m, j.q + e);
      const float* kr = j.keys + k * d + e;
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(q, _mm512_maskz_loadu_ps(m, kr + i * d), acc[i]);
    }
    _mm512_storeu_ps(j.scores + k, _mm512_mul_ps(Sum16(acc), scale));
  }
  for (; k <= j.last; ++k) {
    const float* kr = j.keys + k * d;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t e = 0; e < d; e += 16) {
      const __mmask16 m = LanesFrom(e, d);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, j.q + e), _mm512_maskz_loadu_ps(m, kr + e), acc);
    }
    j.scores[k] = _mm512_reduce_add_ps(acc) * j.scale;
  }
}

/*! \brief out = inv * sum_k p[k] * values[k]: 64 output lanes at a time, two keys per step into
 *         accumulators of their own (eight independent FMA chains). */
__attribute__((target("avx512f"))) void WeightedValues512(const RowJob& j, float inv) {
  const int64_t d = j.dim;
  for (int64_t e0 = 0; e0 < d; e0 += 64) {
    __mmask16 m[4];
    for (int v = 0; v < 4; ++v) m[v] = LanesFrom(e0 + 16 * v, d);
    __m512 even[4], odd[4];
    for (int v = 0; v < 4; ++v) even[v] = odd[v] = _mm512_setzero_ps();
    int64_t r = j.first;
    for (; r + 1 <= j.last; r += 2) {
      const __m512 p0 = _mm512_set1_ps(j.scores[r]), p1 = _mm512_set1_ps(j.scores[r + 1]);
      const float* v0 = j.values + r * d + e0;
      for (int v = 0; v < 4; ++v) {
        even[v] = _mm512_fmadd_ps(p0, _mm512_maskz_loadu_ps(m[v], v0 + 16 * v), even[v]);
        odd[v] = _mm512_fmadd_ps(p1, _mm512_maskz_loadu_ps(m[v], v0 + d + 16 * v), odd[v]);
      }
    }
    if (r <= j.last) {
      const __m512 p0 = _mm512_set1_ps(j.scores[r]);
      for (int v = 0; v < 4; ++v) {
        even[v] = _mm512_fmadd_ps(p0, _mm512_maskz_loadu_ps(m[v], j.values + r * d + e0 + 16 * v), even[v]);
      }
    }
    const __m512 scale = _mm512_set1_ps(inv);
    for (int v = 0; v < 4; ++v) {
      _mm512_mask_storeu_ps(j.out + e0 + 16 * v, m[v], _mm512_mul_ps(_mm512_add_ps(even[v], odd[v]), scale));
    }
  }
}

/*! \brief The maximum of w[0..n) (n >= 1; a NaN is passed over, as MaxOf does). */
__attribute__((target("avx512f"))) float Max512(const float* w, int64_t n) {
  __m512 top = _mm512_set1_ps(-INFINITY);
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) top = _mm512_max_ps(_mm512_loadu_ps(w + k), top);
  float best = _mm512_reduce_max_ps(top);
  for (; k < n; ++k) best = std::max(best, w[k]);
  return best;
}

/*! \brief w[0..n) = exp(w - max w) in place (n >= 1); returns their sum, and in \p max_out (where given) max w. */
__attribute__((target("avx512f"))) float ExpSpan512(float* w, int64_t n, float* max_out = nullptr) {
  const float shift = Max512(w, n);
  if (max_out != nullptr) *max_out = shift;
  return softmax_exp::ExpSum512(w, n, shift);
}

__attribute__((target("avx512f"))) void Row512(const RowJob& j) {
  Scores512(j);
  float top = 0.f;
  const float sum = ExpSpan512(j.scores + j.first, j.last - j.first + 1, &top);
  WeightedValues512(j, 1.f / sum);
  if (j.stats != nullptr) {
    j.stats[0] = top;
    j.stats[1] = sum;
  }
}

// ---- AVX-512F, the blocked form of many rows (BlockJob) ---------------------------------------------

constexpr int kScoreRows = 8;  // query vectors per score tile: 8 accumulators, one key row load for all
constexpr int kValueRows = 4;  // query vectors per value tile: 4 x 4 accumulators of 64 output lanes
static_assert(kMaxKeyBlocks == 3, "kScoreTiles below has a row of tiles per key block count");

/*! \brief s[r * stride + 16 * b + i] = scale * q_r . key i of block b, for R vectors (q_r at q + r * d) and KB
 *         consecutive transposed key blocks (kt: element e of block b's 16 keys at kt + (b * d + e) * 16): R x KB
 *         accumulators, each element step KB key loads and R broadcasts for R * KB FMAs (KB = 1: 9 loads per
 *         8 FMAs, bound by the loads where the CPU loads two vectors a cycle; KB = 3: 11 per 24). */
template <int R, int KB>
__attribute__((target("avx512f"))) void ScoreTile(const float* q, int64_t d, const float* kt, float scale, float* s,
                                                  int64_t stride) {
  __m512 acc[R][KB];
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < KB; ++b) acc[r][b] = _mm512_setzero_ps();
  }
  const int64_t block = kKeyBlock * d;
  for (int64_t e = 0; e < d; ++e) {
    __m512 k[KB];
    for (int b = 0; b < KB; ++b) k[b] = _mm512_loadu_ps(kt + b * block + e * kKeyBlock);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 qe = _mm512_set1_ps(q[r * d + e]);
      for (int b = 0; b < KB; ++b) acc[r][b] = _mm512_fmadd_ps(qe, k[b], acc[r][b]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < KB; ++b) _mm512_storeu_ps(s + r * stride + b * kKeyBlock, _mm512_mul_ps(acc[r][b], sc));
  }
}

/*! \brief out[r] = inv[r] * sum over keys j in [j0, j1] of p[r * stride + j - j0] * value row j, for R
 *         vectors: 64 output lanes at a time, each value row loaded once for the R vectors. */
template <int R>
__attribute__((target("avx512f"))) void ValueTile(const float* p, int64_t stride, const float* values, int64_t d,
                                                  int64_t j0, int64_t j1, const float* inv, float* const* out) {
  for (int64_t e0 = 0; e0 < d; e0 += 64) {
    __mmask16 m[4];
    for (int w = 0; w < 4; ++w) m[w] = LanesFrom(e0 + 16 * w, d);
    __m512 acc[R][4];
    for (int r = 0; r < R; ++r) {
      for (int w = 0; w < 4; ++w) acc[r][w] = _mm512_setzero_ps();
    }
    for (int64_t j = j0; j <= j1; ++j) {
      const float* vr = values + j * d + e0;
      __m512 v[4];
      for (int w = 0; w < 4; ++w) v[w] = _mm512_maskz_loadu_ps(m[w], vr + 16 * w);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 pr = _mm512_set1_ps(p[r * stride + (j - j0)]);
        for (int w = 0; w < 4; ++w) acc[r][w] = _mm512_fmadd_ps(pr, v[w], acc[r][w]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512 sc = _mm512_set1_ps(inv[r]);
      for (int w = 0; w < 4; ++w) _mm512_mask_storeu_ps(out[r] + e0 + 16 * w, m[w], _mm512_mul_ps(acc[r][w], sc));
    }
  }
}

using ScoreTileFn = void (*)(const float*, int64_t, const float*, float, float*, int64_t);
using ValueTileFn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, const float*,
                             float* const*);
/*! \brief kScoreTiles[KB - 1][R - 1]: the score tile of R vectors by KB key blocks. */
constexpr ScoreTileFn kScoreTiles[kMaxKeyBlocks][kScoreRows] = {
    {ScoreTile<1, 1>, ScoreTile<2, 1>, ScoreTile<3, 1>, ScoreTile<4, 1>, ScoreTile<5, 1>, ScoreTile<6, 1>,
     ScoreTile<7, 1>, ScoreTile<8, 1>},
    {ScoreTile<1, 2>, ScoreTile<2, 2>, ScoreTile<3, 2>, ScoreTile<4, 2>, ScoreTile<5, 2>, ScoreTile<6, 2>,
     ScoreTile<7, 2>, ScoreTile<8, 2>},
    {ScoreTile<1, 3>, ScoreTile<2, 3>, ScoreTile<3, 3>, ScoreTile<4, 3>, ScoreTile<5, 3>, ScoreTile<6, 3>,
     ScoreTile<7, 3>, ScoreTile<8, 3>}};
constexpr ValueTileFn kValueTiles[kValueRows] = {ValueTile<1>, ValueTile<2>, ValueTile<3>, ValueTile<4>};

/*! \brief The scores of every vector over the key blocks of its tile's span (a vector's own keys among them:
 *         first and last are non-decreasing), kScoreRows vectors by up to j.key_blocks key blocks at a time. */
__attribute__((target("avx512f"))) void BlockScores512(const BlockJob& j, int64_t base, int64_t stride) {
  const int64_t widest = std::clamp<int64_t>(j.key_blocks, 1, kMaxKeyBlocks);
  for (int64_t i0 = 0; i0 < j.count; i0 += kScoreRows) {
    const int r = static_cast<int>(std::min<int64_t>(kScoreRows, j.count - i0));
    const int64_t b0 = j.first[i0] / kKeyBlock, b1 = j.last[i0 + r - 1] / kKeyBlock;
    for (int64_t kb = b0; kb <= b1;) {
      const int n = static_cast<int>(std::min<int64_t>(widest, b1 - kb + 1));
      kScoreTiles[n - 1][r - 1](j.q + i0 * j.dim, j.dim, j.kt + kb * kKeyBlock * j.dim, j.scale,
                                j.scores + i0 * stride + kb * kKeyBlock - base, stride);
      kb += n;
    }
  }
}

/*! \brief Each vector's softmax over its own keys (exp of the shifted scores, 0 at the other keys of its
 *         value tile's span), then the value tiles, kValueRows vectors at a time. */
__attribute__((target("avx512f"))) void Block512(const BlockJob& j) {
  const int64_t base = j.first[0] / kKeyBlock * kKeyBlock, stride = BlockScoreStride(j);
  BlockScores512(j, base, stride);
  for (int64_t i0 = 0; i0 < j.count; i0 += kValueRows) {
    const int r = static_cast<int>(std::min<int64_t>(kValueRows, j.count - i0));
    const int64_t g0 = j.first[i0], g1 = j.last[i0 + r - 1];  // the tile's key span
    float inv[kValueRows];
    for (int k = 0; k < r; ++k) {
      float* row = j.scores + (i0 + k) * stride + (g0 - base);  // key g0 at row[0]
      const int64_t f = j.first[i0 + k] - g0, l = j.last[i0 + k] - g0;
      inv[k] = 1.f / ExpSpan512(row + f, l - f + 1);
      std::fill(row, row + f, 0.f);
      std::fill(row + l + 1, row + (g1 - g0) + 1, 0.f);
    }
    kValueTiles[r - 1](j.scores + i0 * stride + (g0 - base), stride, j.values, j.dim, g0, g1, inv, j.out + i0);
  }
}

// ---- AVX2 + FMA: 8 lanes, a scalar tail ---------------------------------------------------------

__attribute__((target("avx2,fma"))) inline float Sum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/*! \brief Lane i of the result: the sum of a[i]'s 8 lanes (a horizontal-add tree: 8 sums in 7 instructions' depth
 *         of 3, where a Sum256 per key is a dependent chain of its own). */
__attribute__((target("avx2,fma"))) inline __m256 Sum8(const __m256 (&a)[8]) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);  // per 128-bit lane: that half's sums
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/*! \brief scores[k] = scale * q . keys[k] for k in [first, last]: 8 keys at a time, each its own accumulator
 *         (independent FMAs), summed by Sum8; the head_dim tail (d % 8) in scalars. */
__attribute__((target("avx2,fma"))) void Scores256(const RowJob& j) {
  const int64_t d = j.dim, full = d / 8 * 8;
  const __m256 scale = _mm256_set1_ps(j.scale);
  int64_t k = j.first;
  for (; k + 8 <= j.last + 1; k += 8) {
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    const float* kr = j.keys + k * d;
    for (int64_t e = 0; e < full; e += 8) {
      const __m256 q = _mm256_loadu_ps(j.q + e);
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(q, _mm256_loadu_ps(kr + i * d + e), acc[i]);
    }
    __m256 dots = Sum8(acc);
    if (full < d) {
      alignas(32) float tail[8] = {};
      for (int i = 0; i < 8; ++i)
        for (int64_t e = full; e < d; ++e) tail[i] += j.q[e] * kr[i * d + e];
      dots = _mm256_add_ps(dots, _mm256_load_ps(tail));
    }
    _mm256_storeu_ps(j.scores + k, _mm256_mul_ps(dots, scale));
  }
  for (; k <= j.last; ++k) {
    const float* kr = j.keys + k * d;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t e = 0; e < full; e += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(j.q + e), _mm256_loadu_ps(kr + e), acc);
    float dot = Sum256(acc);
    for (int64_t e = full; e < d; ++e) dot += j.q[e] * kr[e];
    j.scores[k] = dot * j.scale;
  }
}

/*! \brief out[e0, e0 + 8V) = inv * sum_k p[k] * values[k][e0, e0 + 8V): two keys per step into accumulators of their
 *         own (2V independent FMA chains, where one chain per 8 lanes waited on each FMA's latency). */
template <int V>
__attribute__((target("avx2,fma"))) void ValueLanes256(const RowJob& j, int64_t e0, __m256 scale) {
  const int64_t d = j.dim;
  __m256 even[V], odd[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) even[v] = odd[v] = _mm256_setzero_ps();
  int64_t r = j.first;
  for (; r + 1 <= j.last; r += 2) {
    const __m256 p0 = _mm256_set1_ps(j.scores[r]), p1 = _mm256_set1_ps(j.scores[r + 1]);
    const float* v0 = j.values + r * d + e0;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      even[v] = _mm256_fmadd_ps(p0, _mm256_loadu_ps(v0 + 8 * v), even[v]);
      odd[v] = _mm256_fmadd_ps(p1, _mm256_loadu_ps(v0 + d + 8 * v), odd[v]);
    }
  }
  if (r <= j.last) {
    const __m256 p0 = _mm256_set1_ps(j.scores[r]);
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) even[v] = _mm256_fmadd_ps(p0, _mm256_loadu_ps(j.values + r * d + e0 + 8 * v), even[v]);
  }
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) _mm256_storeu_ps(j.out + e0 + 8 * v, _mm256_mul_ps(_mm256_add_ps(even[v], odd[v]), scale));
}

/*! \brief out = inv * sum_k p[k] * values[k]: 32 output lanes at a time (ValueLanes256), then 8 at a time, then the
 *         head_dim tail (d % 8) in scalars. */
__attribute__((target("avx2,fma"))) void WeightedValues256(const RowJob& j, float inv) {
  const int64_t d = j.dim, full = d / 8 * 8;
  const __m256 scale = _mm256_set1_ps(inv);
  int64_t e0 = 0;
  for (; e0 + 32 <= full; e0 += 32) ValueLanes256<4>(j, e0, scale);
  for (; e0 < full; e0 += 8) ValueLanes256<1>(j, e0, scale);
  for (int64_t e = full; e < d; ++e) {
    float acc = 0.f;
    for (int64_t r = j.first; r <= j.last; ++r) acc += j.scores[r] * j.values[r * d + e];
    j.out[e] = acc * inv;
  }
}

__attribute__((target("avx2,fma"))) void Row256(const RowJob& j) {
  Scores256(j);
  const float top = MaxOf(j.scores, j.first, j.last);
  const float sum = softmax_exp::ExpSum256(j.scores + j.first, j.last - j.first + 1, top);
  WeightedValues256(j, 1.f / sum);
  if (j.stats != nullptr) {
    j.stats[0] = top;
    j.stats[1] = sum;
  }
}
#endif

}  // namespace

RowFn FindRowFn(SimdIsa isa) {
#if defined(__x86_64__)
  if (isa == SimdIsa::kAvx512) return Row512;
  if (isa == SimdIsa::kAvx2) return Row256;
#endif
  return RowGeneric;
}

BlockFn FindBlockFn(SimdIsa isa) {
#if defined(__x86_64__)
  if (isa == SimdIsa::kAvx512) return Block512;
#endif
  return nullptr;
}

}  // namespace kv
}  // namespace byoc_hetero
