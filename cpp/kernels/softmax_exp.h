/*!
 * \file kernels/softmax_exp.h
 * \brief The softmax's exp of shifted scores (x - row max <= 0) and its row sum, in AVX-512F (16
 *        lanes), AVX2 + FMA (8 lanes) and portable C++, giving the same bits on every ISA.
 *
 * exp(x) for x <= 0, exactly 0 at and below ln(FLT_MIN) = -87.3365 (oneDNN's exp zeroes below
 * it; at its float itself, 0xc2aeac50, exp is 1.17549e-38, just under FLT_MIN, so 0 here too;
 * -inf included), so that no probability is a denormal.  x = n ln2 + r, |r| <= ln2/2, in one fma
 * (ln2's float rounding error, 1.9e-9, times |n| <= 126 moves r by at most 2.4e-7, and by at most
 * 2e-8 where n >= -10, the terms that carry a row's sum); exp(r) by a degree-5 polynomial fitted
 * for the least maximum relative error on [-ln2/2, ln2/2] (1.1e-7, 1.7e-7 evaluated in float);
 * times 2^n (n >= -126 wherever x > ln(FLT_MIN): a normal float).  Checked once over every float
 * in [-110, 0] and -inf: the three forms agree bit for bit, no result is a denormal, the relative
 * error against double exp is at most 4.0e-7 (at -87.04, where n ln2's error is largest), 0
 * exactly at and below the cut.
 *
 * Why one helper: the attention kernel's non-AVX-512 path used std::exp, which returns denormals
 * down to -103.9 (9.96e-39 where the AVX-512 path gave 0, under ONEDNN_MAX_CPU_ISA=AVX2), and
 * kv_attention's vector exps clamped at -87.3 (1.2e-38 for any lower score, a NaN score included)
 * while its scalar ones used std::exp: a denormal is a cross-ISA difference and a slow operand of
 * the P @ V product after it, a clamped NaN a finite answer from NaN input.
 *
 * NaN in, NaN out (the vector forms' max takes x as its second operand, which vmaxps returns for a
 * NaN; the mask keeps an unordered lane): a caller that does not handle a NaN score itself (the
 * kv_attention rows) gets a NaN sum, as std::exp gives, not a probability.
 *
 * Same bits: every form runs the same operations in the same order (fma where the vector forms
 * fma; max as vmaxps has it, c > x ? c : x), and ExpSum adds the terms into the same 32 lanes (two
 * sums of 16, the tail into the first) reduced by the same tree (Reduce16), so a row's
 * probabilities and their sum are identical on AVX-512, AVX2 and generic for every input but NaN
 * (whose payload may differ); tests/test_ops_attention.py checks the attention kernel's output bit
 * for bit across BYOC_HETERO_ATTENTION_ISA.  The portable form fuses its fma on a CPU with FMA (the
 * instruction, ExpSumFused) and rounds through double on one without (Fma), where libm's fmaf is
 * software and no vector form runs to agree with.
 */
#ifndef BYOC_HETERO_KERNELS_SOFTMAX_EXP_H_
#define BYOC_HETERO_KERNELS_SOFTMAX_EXP_H_

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

namespace byoc_hetero {
namespace softmax_exp {

constexpr float kFloor = -88.f;              // x clamped here first (-inf included): n stays >= -127
constexpr float kCut = -87.33654475f;        // ln(FLT_MIN), oneDNN's 0xc2aeac50: at and below it, 0
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147182f;
constexpr float kRound = 12582912.f;         // 1.5 * 2^23: y + kRound - kRound rounds y to an integer
constexpr float kPoly[6] = {8.312469522e-03f, 4.189000217e-02f, 1.666711457e-01f,
                            4.999923257e-01f, 1.f, 1.f};  // Horner, highest degree first

/*! \brief The float 2^n for an integer-valued n in [-126, 127] (0 for n = -127, masked by callers). */
inline float Pow2(float n) {
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

/*! \brief fma(a, b, c) of the portable form: the fused one where \p kFused (the instruction where the caller is
 *         compiled for FMA, else libm's fmaf), or else in double (a * b exact, one rounding to double, one to
 *         float: within one float rounding of the fused one).  The double form is for CPUs without FMA, where
 *         libm's fmaf is emulated in software (~10x std::exp's time) and no vector form runs to agree with. */
template <bool kFused>
__attribute__((always_inline)) inline float Fma(float a, float b, float c) {
  if constexpr (kFused) {
    return std::fma(a, b, c);
  } else {
    return static_cast<float>(static_cast<double>(a) * b + c);
  }
}

/*! \brief exp(x) for x <= 0, 0 at and below kCut: the portable form of ExpNonPositive16 / 8 (the same bits
 *         with \p kFused). */
template <bool kFused>
__attribute__((always_inline)) inline float ExpNonPositiveScalar(float x) {
  if (std::isnan(x)) return x;
  const float c = kFloor > x ? kFloor : x;
  const float n = Fma<kFused>(c, kLog2e, kRound) - kRound;
  const float r = Fma<kFused>(-n, kLn2, c);
  float p = kPoly[0];
  for (int i = 1; i < 6; ++i) p = Fma<kFused>(p, r, kPoly[i]);
  return x > kCut ? p * Pow2(n) : 0.f;  // x <= kCut: 0
}

/*! \brief ExpNonPositiveScalar with the fused fma: the vector forms' bits. */
inline float ExpNonPositive1(float x) { return ExpNonPositiveScalar<true>(x); }

/*! \brief The sum of 16 lanes in _mm512_reduce_add_ps's tree: lanes i + 8, then i + 4, i + 2, i + 1. */
inline float Reduce16(const float (&s)[16]) {
  float a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = s[i + 8] + s[i];
  for (int i = 0; i < 4; ++i) b[i] = a[i + 4] + a[i];
  const float c0 = b[0] + b[2], c1 = b[1] + b[3];
  return c0 + c1;
}

/*! \brief x[0..n) = exp(x - max) in place, returns their sum (n >= 0): the portable form (ExpSumGeneric). */
template <bool kFused>
__attribute__((always_inline)) inline float ExpSumScalar(float* x, int64_t n, float max) {
  float sum0[16] = {}, sum1[16] = {};
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    for (int l = 0; l < 16; ++l) {
      sum0[l] += (x[j + l] = ExpNonPositiveScalar<kFused>(x[j + l] - max));
      sum1[l] += (x[j + 16 + l] = ExpNonPositiveScalar<kFused>(x[j + 16 + l] - max));
    }
  }
  for (; j < n; j += 16) {
    for (int l = 0; l < 16 && j + l < n; ++l) sum0[l] += (x[j + l] = ExpNonPositiveScalar<kFused>(x[j + l] - max));
  }
  float s[16];
  for (int l = 0; l < 16; ++l) s[l] = sum0[l] + sum1[l];
  return Reduce16(s);
}

#if defined(__x86_64__)
/*! \brief ExpSumScalar with the fma instruction compiled in (CPUs with FMA). */
__attribute__((target("fma"))) inline float ExpSumFused(float* x, int64_t n, float max) {
  return ExpSumScalar<true>(x, n, max);
}
#endif

/*! \brief x[0..n) = exp(x - max) in place, returns their sum (n >= 0), in portable C++: the vector forms' bits
 *         on a CPU with FMA (every CPU with AVX2), within float rounding of them on one without. */
inline float ExpSumGeneric(float* x, int64_t n, float max) {
#if defined(__x86_64__)
  static const bool fused = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("fma") != 0;
  }();
  return fused ? ExpSumFused(x, n, max) : ExpSumScalar<false>(x, n, max);
#else
  return ExpSumScalar<true>(x, n, max);
#endif
}

#if defined(__x86_64__)
/*! \brief exp(x) for x <= 0, 0 at and below kCut, 16 lanes: 2^n by scalef (p * 2^n exactly
 *         rounded, as Pow2's product) zero-masked at and below kCut, 12 vector operations per 16 scores. */
__attribute__((target("avx512f"))) inline __m512 ExpNonPositive16(__m512 x) {
  const __m512 clamped = _mm512_max_ps(_mm512_set1_ps(kFloor), x);  // a NaN x stays NaN
  const __m512 round = _mm512_set1_ps(kRound);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(clamped, _mm512_set1_ps(kLog2e), round), round);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2), clamped);
  __m512 p = _mm512_set1_ps(kPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kPoly[i]));
  const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kCut), _CMP_NLE_UQ);  // x > kCut or NaN
  return _mm512_maskz_scalef_ps(keep, p, n);
}

/*! \brief The sum of a vector's 16 lanes in Reduce16's tree (GCC's _mm512_reduce_add_ps, written
 *         out so that it does not depend on the compiler's header). */
__attribute__((target("avx512f"))) inline float Reduce512(__m512 v) {
  const __m256 a = _mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)),
                                 _mm512_castps512_ps256(v));
  const __m128 b = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));  // lanes 0, 1: b0 + b2, b1 + b3
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

/*! \brief ExpSumGeneric in AVX-512F: whole vectors two at a time into two sums (two independent
 *         chains), the tail masked into the first. */
__attribute__((target("avx512f"))) inline float ExpSum512(float* x, int64_t n, float max) {
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  const __m512 mx = _mm512_set1_ps(max);
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 e0 = ExpNonPositive16(_mm512_sub_ps(_mm512_loadu_ps(x + j), mx));
    const __m512 e1 = ExpNonPositive16(_mm512_sub_ps(_mm512_loadu_ps(x + j + 16), mx));
    _mm512_storeu_ps(x + j, e0);
    _mm512_storeu_ps(x + j + 16, e1);
    sum0 = _mm512_add_ps(sum0, e0);
    sum1 = _mm512_add_ps(sum1, e1);
  }
  for (; j < n; j += 16) {
    const __mmask16 live = n - j >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512 e = ExpNonPositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, x + j), mx));
    _mm512_mask_storeu_ps(x + j, live, e);
    sum0 = _mm512_mask_add_ps(sum0, live, sum0, e);
  }
  return Reduce512(_mm512_add_ps(sum0, sum1));
}

/*! \brief ExpNonPositive16 in 8 lanes of AVX2 + FMA: 2^n from its exponent bits, the mask an and. */
__attribute__((target("avx2,fma"))) inline __m256 ExpNonPositive8(__m256 x) {
  const __m256 clamped = _mm256_max_ps(_mm256_set1_ps(kFloor), x);  // a NaN x stays NaN
  const __m256 round = _mm256_set1_ps(kRound);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(clamped, _mm256_set1_ps(kLog2e), round), round);
  const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2), clamped);
  __m256 p = _mm256_set1_ps(kPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kPoly[i]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(kCut), _CMP_NLE_UQ);  // x > kCut or NaN
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep);
}

/*! \brief The AVX2 lane mask of the first \p live (0-8) lanes. */
__attribute__((target("avx2"))) inline __m256i Live8(int64_t live) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(live < 8 ? live : 8)), lane);
}

/*! \brief ExpSumGeneric in AVX2 + FMA: each 16 lanes as a low and a high vector of 8, the tail
 *         masked (maskload / maskstore) into the first sums. */
__attribute__((target("avx2,fma"))) inline float ExpSum256(float* x, int64_t n, float max) {
  __m256 s0lo = _mm256_setzero_ps(), s0hi = s0lo, s1lo = s0lo, s1hi = s0lo;
  const __m256 mx = _mm256_set1_ps(max);
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m256 e0 = ExpNonPositive8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mx));
    const __m256 e1 = ExpNonPositive8(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), mx));
    const __m256 e2 = ExpNonPositive8(_mm256_sub_ps(_mm256_loadu_ps(x + j + 16), mx));
    const __m256 e3 = ExpNonPositive8(_mm256_sub_ps(_mm256_loadu_ps(x + j + 24), mx));
    _mm256_storeu_ps(x + j, e0);
    _mm256_storeu_ps(x + j + 8, e1);
    _mm256_storeu_ps(x + j + 16, e2);
    _mm256_storeu_ps(x + j + 24, e3);
    s0lo = _mm256_add_ps(s0lo, e0);
    s0hi = _mm256_add_ps(s0hi, e1);
    s1lo = _mm256_add_ps(s1lo, e2);
    s1hi = _mm256_add_ps(s1hi, e3);
  }
  for (; j < n; j += 16) {
    const __m256i mlo = Live8(n - j), mhi = Live8(n - j - 8);
    // dead lanes: the exp of 0 - max, zeroed by the and before the store and the sum
    const __m256 elo = _mm256_and_ps(ExpNonPositive8(_mm256_sub_ps(_mm256_maskload_ps(x + j, mlo), mx)),
                                     _mm256_castsi256_ps(mlo));
    const __m256 ehi = _mm256_and_ps(ExpNonPositive8(_mm256_sub_ps(_mm256_maskload_ps(x + j + 8, mhi), mx)),
                                     _mm256_castsi256_ps(mhi));
    _mm256_maskstore_ps(x + j, mlo, elo);
    _mm256_maskstore_ps(x + j + 8, mhi, ehi);
    s0lo = _mm256_add_ps(s0lo, elo);
    s0hi = _mm256_add_ps(s0hi, ehi);
  }
  // Reduce16 of the 16 lanes sum0 + sum1: (hi + lo), then its 128-bit halves, then pairs
  const __m256 a = _mm256_add_ps(_mm256_add_ps(s0hi, s1hi), _mm256_add_ps(s0lo, s1lo));
  const __m128 b = _mm_add_ps(_mm256_extractf128_ps(a, 1), _mm256_castps256_ps128(a));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
#endif  // __x86_64__

}  // namespace softmax_exp
}  // namespace byoc_hetero

#endif  // BYOC_HETERO_KERNELS_SOFTMAX_EXP_H_
